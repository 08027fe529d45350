"""
The factor study: does the gap come from the miniature's regime? Each cell is a model shape, run
length, batch, warmup and tokens (plan.Cell), every block tuned in it by the protocol (reproduce.py's
docstring); the order is the order they train in. Cells 1 and 5 are the GPT comparison's. The rule
that chose the comparison's regime (chosen_regime) and --quick's (quick_regime), each written before
any of its cells ran, are in their docstrings.
"""

import functools
import math
import statistics

import train_config
from reproduction import plan
from reproduction.plan import QUICK_CANDIDATES
from reproduction.tables import (curve_table, gap_text, kurtosis_of, logged, loss_text, losses, paired_gaps,
                                 regime_rows, regime_sweeps, seed_order, spread, stalled_count, tuning_runs, verdict)
from simple_gpt import GPT

EXPERIMENT = dict(
    objective="clm",
    flags={},
    tuned=("pre_ln", "sas", "sas_p"),
    scales={
        "quick": dict(cells=[
            dict(n_layer=6, n_head=2, n_embd=64, steps=100, warmup_frac=0.05),
            dict(n_layer=6, n_head=2, n_embd=64, steps=100, warmup_frac=0.2),
            dict(n_layer=3, n_head=2, n_embd=128, steps=100, warmup_frac=0.05),
            dict(n_layer=3, n_head=2, n_embd=128, steps=100, warmup_frac=0.2)]),
        "default": dict(cells=[
            dict(n_layer=12, n_head=4, n_embd=128, steps=200, warmup_frac=0.05),  # a 10-step ramp
            dict(n_layer=12, n_head=4, n_embd=128, steps=200, warmup_frac=0.2),   # 40-step ramp
            dict(n_layer=6, n_head=4, n_embd=256, steps=200, warmup_frac=0.05),   # the paper's d_k 64, width:depth 43
            dict(n_layer=6, n_head=4, n_embd=256, steps=200, warmup_frac=0.2),
            dict(n_layer=12, n_head=4, n_embd=128, steps=800, warmup_frac=0.05),  # a 40-step ramp, 4x longer
            # added once the rule had chosen cell 4's regime: a regime must train in every cell;
            # trained before the two below, as it decides whether the choice stands
            dict(n_layer=6, n_head=4, n_embd=256, steps=800, warmup_frac=0.2),
            dict(n_layer=12, n_head=4, n_embd=128, steps=800, warmup_frac=0.2),   # 160-step ramp
            # the paper's tokens: the main job's shape (6 x 128, d_k 32) and the chosen
            # one on GPT-2 BPE, each beside its bytes twin (6 x 256's are cells 4 and 6)
            dict(n_layer=6, n_head=4, n_embd=128, steps=200, warmup_frac=0.2),
            dict(n_layer=6, n_head=4, n_embd=128, steps=200, warmup_frac=0.2, tokens="bpe"),
            dict(n_layer=6, n_head=4, n_embd=128, steps=800, warmup_frac=0.2),
            dict(n_layer=6, n_head=4, n_embd=256, steps=200, warmup_frac=0.2, tokens="bpe"),
            dict(n_layer=6, n_head=4, n_embd=128, steps=800, warmup_frac=0.2, tokens="bpe"),  # the main job
            dict(n_layer=6, n_head=4, n_embd=256, steps=800, warmup_frac=0.2, tokens="bpe"),
            # the vocabulary as a factor: the comparison's cell (the one above) with GPT-2's BPE
            # cut to its first 4,096 and 16,384 tokens (257 / 4K / 16K / 50K with the bytes and
            # full-BPE cells); and a control for the text a sequence covers, full BPE with T 64
            # (~140 bytes, about what bytes' T 128 covers). The quick regime's first candidate
            # (the second is needed only if the first disagrees with the study: it agreed)
            QUICK_CANDIDATES[0],
            dict(n_layer=6, n_head=4, n_embd=256, steps=800, warmup_frac=0.2, tokens="bpe4096"),
            dict(n_layer=6, n_head=4, n_embd=256, steps=800, warmup_frac=0.2, tokens="bpe16384"),
            dict(n_layer=6, n_head=4, n_embd=256, steps=800, warmup_frac=0.2, tokens="bpe", block_size=64),
            dict(n_layer=12, n_head=4, n_embd=128, steps=200, batch_size=64, warmup_frac=0.2)]),  # 16 x 800's tokens
    })


def tables(runs, exp, results):
    """The map, the rules' choices, the cells' tables and every tuning run."""
    chosen, why = chosen_regime(runs, exp)
    if unfinished := results.get("experiments", {}).get("regime", {}).get("unfinished"):
        why += f"; provisional: {len(unfinished)} arms of the study are not finished"  # may still fail in the cells left
    choice = (f"The rule's choice: {'; '.join(cell.label for cell in chosen)} ({why})." if chosen
              else f"The rule's choice: none yet ({why}).")
    quick, why = quick_regime(runs, exp)
    choice += f" --quick's rule: {quick.label if quick else 'stays where it is'} ({why})."
    made = [("regime", regime_table), ("vocabulary", vocabulary_table), ("regime attention", regime_attention),
            ("main job", main_job_table), ("regime sweeps", regime_sweeps)]
    return [("regime map", regime_map_table, regime_map_table(runs, exp)), ("regime choice", chosen_regime, choice),
            *[(title, maker, maker(runs, exp)) for title, maker in made]]


def figures(plt, runs, exp, results):
    return {"map": regime_figure(plt, runs, exp), "vocabulary": vocabulary_figure(plt, runs, exp)}


def chosen_regime(runs, exp):
    """The rule that picks the reproduction's regime, written down before any cell of the study
    had run, its first criterion before any BPE cell had run: of the regimes
    (a cell's shape, batch, warmup fraction and tokens, at any length) in which every tuned
    config's tuned rate trained on every seed in every cell run, the closest to the paper's
    recipe (SPEC §4): first the paper's kind of tokens, BPE (the tokens are the task: what is
    predicted, what a loss means, and a 50K-token head and embedding beside the blocks; a shape
    is a choice within a task), then the paper's proportions (head width d_k 64 and width :
    depth >= 40), then the longer warmup ramp (the paper's is ~2,000 steps; every miniature's is
    shorter). Only batch-16 regimes at the paper's T 128 are candidates: the comparison at 64
    sequences a step costs 4x per point, past the budget of the 3,200-step point; a cell at
    another T is a control of the text a sequence covers. Never chosen by its gaps.

    Returns (the chosen cells, why), or (None, why) if no regime qualifies."""
    by_cell, regimes = regime_rows(runs, exp), {}
    for cell, configs in by_cell.items():
        regimes.setdefault(cell.regime, []).append(cell)
    n_seeds = max((len(rs) for configs in by_cell.values() for rs in configs.values()), default=0)
    done = {regime: all(len(by_cell[c].get(config, [])) == n_seeds for c in cs for config in exp["tuned"])
            for regime, cs in regimes.items()}  # a regime with a cell not finished is judged once it is
    trains = {regime: done[regime] and all(r["status"] == "trained" for c in cs for rs in by_cell[c].values() for r in rs)
              for regime, cs in regimes.items()}
    candidates = [regime for regime, ok in trains.items()
                  if ok and (regime[3], regime[6]) == (plan.TRAINING["batch_size"], plan.TRAINING["block_size"])]
    unfinished = f" ({sum(not d for d in done.values())} not finished)" if not all(done.values()) else ""
    if not candidates:
        return None, f"no finished batch-16 regime trained at its tuned rates on every seed{unfinished}"
    paper_like = lambda regime: (regime[5] == "bpe", regime[2] // regime[1] == 64 and regime[2] / regime[0] >= 40, regime[4])
    best = max(candidates, key=paper_like)
    return regimes[best], (f"{sum(trains.values())} of {len(regimes)} regimes trained at every tuned rate on every "
                           f"seed{unfinished}; of the batch-16 ones, the closest to the paper's recipe")


def quick_regime(runs, exp):
    """The rule that picks --quick's regime, written down before any of its candidates ran: of
    plan.QUICK_CANDIDATES, cells of the factor study listed cheapest first, the first whose verdict
    for every shaped block (the side of its paired gaps to pre_ln: ahead or behind on every seed)
    is the one the GPT comparison has (the rule's chosen regime at its longest length), with every
    tuned rate trained on every seed. A quick comparison should rank blocks as the study does.

    Returns (the chosen cell, why), or (None, why) if no candidate agrees (yet)."""
    chosen = chosen_regime(runs, exp)[0]
    if not chosen:
        return None, "the comparison's regime is not chosen yet"
    by_cell = regime_rows(runs, exp)
    side = lambda configs, c: verdict(paired_gaps(configs[c], configs["pre_ln"])).removeprefix("within 2%; ")
    reference = by_cell[max(chosen, key=lambda cell: cell.steps)]
    wanted = {c: side(reference, c) for c in exp["tuned"][1:]}
    sides = []
    for spec in plan.QUICK_CANDIDATES:
        cell, configs = plan.Cell(**spec), by_cell.get(plan.Cell(**spec), {})
        if any(len(configs.get(c, [])) < len(reference[c]) for c in exp["tuned"]):  # a cheaper one decides first
            return None, f"{'; '.join(sides + [cell.label + ': not finished'])}"
        got = {c: side(configs, c) if all(r["status"] == "trained" for rs in configs.values() for r in rs) else "n/a"
               for c in wanted}
        sides.append(f"{cell.label}: " + ", ".join(f"{c} {v}" for c, v in got.items()))
        if got == wanted:
            return cell, ("the cheapest candidate with the comparison's verdict, "
                          f"{', '.join(f'{c} {v}' for c, v in wanted.items())}; candidates run: " + "; ".join(sides))
    return None, f"no candidate has the comparison's verdict ({', '.join(f'{c} {v}' for c, v in wanted.items())}): " + "; ".join(sides)


def regime_table(runs, exp):
    """The factor study, cell by cell: each tuned config at its tuned rate, its paired gap to
    pre_ln in that cell, and how often it stalled at the tuned rate and over all its tuning."""
    lines = ["| cell | config | tuned lr | final val loss, mean (min to max) | paired gap to pre_ln, mean (min to max) "
             "| verdict | stalled at the tuned rate | stalled, every tuning run | speed vs pre_ln |",
             "|---|---|---|---|---|---|---|---|---|"]
    for cell, configs in regime_rows(runs, exp).items():
        base = configs.get("pre_ln", [])
        for config in exp["tuned"]:
            rs = configs.get(config)
            if not rs:
                continue
            tuning = tuning_runs(runs, cell, config)
            gaps = paired_gaps(rs, base) if config != "pre_ln" else []
            speed = (base[0]["seconds_per_step"] / rs[0]["seconds_per_step"]
                     if base and base[0]["seconds_per_step"] and rs[0]["seconds_per_step"] else math.nan)
            lines.append(f"| {cell.label} | {config} | {rs[0]['lr']:g} | {spread(losses(rs))} | "
                         f"{spread(gaps, '{:+.1f}%') if gaps else ''} | {verdict(gaps) if gaps else ''} | "
                         f"{stalled_count(rs)} | {stalled_count(tuning)} | {speed:.3f} |")
    return "\n".join(lines)


def regime_map_table(runs, exp):
    """The regime map in numbers: per cell, each shaped block's paired gap to pre_ln at the tuned
    rates (mean, min to max over seeds), and its stalls at the tuned rate and over all its tuning."""
    shaped = [c for c in exp["tuned"] if c != "pre_ln"]
    lines = ["| cell | pre_ln lr | " + " | ".join(f"{c}: lr, paired gap, stalled (tuned rate / all tuning)" for c in shaped)
             + " |", "|---|---|" + "---|" * len(shaped)]
    for cell, configs in regime_rows(runs, exp).items():
        if "pre_ln" not in configs:
            continue
        cells = []
        for config in shaped:
            rs = configs.get(config)
            tuning = tuning_runs(runs, cell, config)
            cells.append("" if not rs else f"{rs[0]['lr']:g}, {gap_text(rs, configs['pre_ln'])}, "
                         f"{stalled_count(rs, kinds=False)} / {stalled_count(tuning, kinds=False)}")
        lines.append(f"| {cell.label} | {configs['pre_ln'][0]['lr']:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def vocabulary_cells(runs, exp, planned=False):
    """{cell: its final runs by config} of the cells that differ from the GPT comparison's longest
    cell in their tokens or T alone (the vocabulary factor and its control), by vocabulary; with
    planned, the study's cells of that kind not finished yet too (no runs)."""
    chosen = chosen_regime(runs, exp)[0]
    if not chosen:
        return {}
    comparison = max(chosen, key=lambda cell: cell.steps)
    same = lambda cell: (cell.n_layer, cell.n_head, cell.n_embd, cell.steps, cell.batch_size, cell.warmup_frac) == (
        comparison.n_layer, comparison.n_head, comparison.n_embd, comparison.steps, comparison.batch_size, comparison.warmup_frac)
    cells = {cell: configs for cell, configs in regime_rows(runs, exp).items() if same(cell) and "pre_ln" in configs}
    if planned:
        cells |= {cell: {} for scale in exp["scales"].values() for cell in map(lambda spec: plan.Cell(**spec), scale.get("cells", ()))
                  if same(cell) and cell not in cells}
    return dict(sorted(cells.items(), key=lambda item: (plan.tokens_of(item[0].tokens)[2], -item[0].block_size)))


@functools.cache
def pre_ln_params(cell):
    return GPT(cell.run("pre_ln").model_config()).num_params()


def vocabulary_table(runs, exp):
    """The vocabulary as a factor: the GPT comparison's cell with bytes, GPT-2's BPE cut to its
    first 4K and 16K tokens, and all of it, and at another T: the vocabulary (padded), the share of
    Pre-LN's parameters in the embedding (tied to the output head), each block's tuned rate and
    the shaped blocks' paired gaps to pre_ln (mean, min to max over seeds); the study's cells not
    finished yet say so."""
    shaped = [c for c in exp["tuned"] if c != "pre_ln"]
    lines = ["| cell | vocabulary | embedding's share of parameters | pre_ln lr | "
             + " | ".join(f"{c}: lr, paired gap" for c in shaped) + " |", "|---|---|---|---|" + "---|" * len(shaped)]
    for cell, configs in vocabulary_cells(runs, exp, planned=True).items():
        vocab = plan.tokens_of(cell.tokens)[2]
        share = vocab * cell.n_embd / pre_ln_params(cell)
        gaps = [f"{configs[c][0]['lr']:g}, {gap_text(configs[c], configs['pre_ln'])}" if c in configs else "not finished"
                for c in shaped]
        rate = f"{configs['pre_ln'][0]['lr']:g}" if configs else "not finished"
        lines.append(f"| {cell.label} | {vocab:,} | {share:.0%} | {rate} | " + " | ".join(gaps) + " |")
    return "\n".join(lines) + "\n\n" + "\n".join(text_or_vocabulary(vocabulary_cells(runs, exp), shaped))


def text_or_vocabulary(cells, shaped):
    """The control's verdict, per shaped block. Bytes at T 128 and full BPE at T 64 cover about the
    same text (~140 bytes) with vocabularies 257 and 50K; full BPE at T 128 has the 50K vocabulary
    and twice the text. The rule, written before the control's finals: the gap follows the
    vocabulary if every seed's gap at T 64 lies on full BPE's side of the midpoint between the mean
    gaps of bytes and of full BPE (both at T 128); the text a sequence covers if on bytes' side on
    every seed; else neither cleanly. A stall or a divergence leaves no verdict."""
    T = plan.TRAINING["block_size"]
    find = lambda tokens, block_size: next((c for c in cells if (c.tokens, c.block_size) == (tokens, block_size)), None)
    byte, full, control = find("bytes", T), find("bpe", T), next((c for c in cells if c.block_size != T), None)
    if not (byte and full and control):
        return ["The text a sequence covers or the vocabulary: not finished."]
    lines = []
    for config in shaped:
        arms = [cells[c].get(config) for c in (byte, full, control)]
        if not all(arms) or any(r["status"] != "trained" for c in (byte, full, control) for r in cells[c]["pre_ln"] + cells[c][config]):
            lines.append(f"{config}, the text covered or the vocabulary: " + ("not finished." if not all(arms) else "no verdict (a run stalled or diverged)."))
            continue
        ends = [statistics.fmean(paired_gaps(rs, cells[c]["pre_ln"])) for rs, c in zip(arms, (byte, full))]
        middle, gaps = sum(ends) / 2, paired_gaps(arms[2], cells[control]["pre_ln"])
        side = lambda g: (g - middle) * (ends[1] - middle) > 0  # on full BPE's side
        verdict = ("the vocabulary" if all(map(side, gaps)) else "the text a sequence covers" if not any(map(side, gaps))
                   else "neither cleanly")
        lines.append(f"{config} at T {control.block_size} on full BPE: {gap_text(arms[2], cells[control]['pre_ln'])} "
                     f"(bytes {ends[0]:+.1f}%, full BPE at T {T} {ends[1]:+.1f}%, midpoint {middle:+.1f}%): its gap follows {verdict}.")
    return lines


def regime_attention(runs, exp):
    """What differs between the blocks' runs in a cell, where their logs have it (newer runs log them):
    each config's softmax attention entropy (mean over layers, at the end; uniform causal
    attention has mean_i ln i, 3.88 at T 128, and 0 is one token) and residual-stream kurtosis
    (mean over layers, at the end) at its tuned rate, mean (min to max) over seeds; and on the
    first seed at pre_ln's tuned rate (its sweep run there): the same rate for every block."""
    lines = ["| cell | config | tuned lr | attention entropy | kurtosis | at pre_ln's rate, first seed: loss, entropy |",
             "|---|---|---|---|---|---|"]
    mean_entropy = lambda r: statistics.fmean(r["entropy"]) if r.get("entropy") and r["val_loss"] is not None else None
    for cell, configs in regime_rows(runs, exp).items():
        base = configs.get(exp["tuned"][0], [])
        first = min(base, key=lambda r: seed_order(r["seed"])) if base else None  # its seed, at its rate
        for config in exp["tuned"]:
            rs = [r for r in configs.get(config, []) if r["val_loss"] is not None]
            if not any(r.get("entropy") for r in rs):
                continue
            shared = [r for r in tuning_runs(runs, cell, config) if first and r["seed"] == first["seed"]
                      and math.isclose(r["lr"], first["lr"])]
            at_shared = ("pre_ln not tuned yet" if not base else "not run" if not shared else
                         f"{loss_text(shared[0])}, {logged([mean_entropy(shared[0])], '{:.2f}')}")
            lines.append(f"| {cell.label} | {config} | {rs[0]['lr']:g} | {logged([mean_entropy(r) for r in rs], '{:.2f}')} "
                         f"| {logged([kurtosis_of(r, 'mean', 'final') for r in rs], '{:.2f}')} | {at_shared} |")
    return "\n".join(lines)


def main_job_table(runs, exp):
    """`python train.py` on CPU as a cell of the study (train.py's CPU run on GPT-2 tokens, which
    takes each tuned block's rate from it): the val loss along the first seed's run at the tuned
    rate, and the final loss of the first two seeds; a block whose two are not run yet is left out."""
    run = train_config.CPU_RUN
    cell = plan.Cell(run["n_layer"], run["n_head"], run["n_embd"], run["max_iters"], run["batch_size"],
                     train_config.CPU_GPT_WARMUP, "bpe")
    configs = regime_rows(runs, exp).get(cell, {})
    return curve_table({config: configs.get(config, []) for config in exp["tuned"]}, lambda r: f"lr {r['lr']:g}", cell.steps)


def regime_figure(plt, runs, exp):
    """The regime map: per cell, a row, the paired gap of each shaped block to pre_ln at the tuned
    rates (mean, bars from min to max over seeds), with its stalls over every tuning run."""
    by_cell = regime_rows(runs, exp)
    chosen, _ = chosen_regime(runs, exp)
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.42 * len(by_cell)))
    configs = [c for c in exp["tuned"] if c != "pre_ln"]
    for k, config in enumerate(configs):
        for y, (cell, at) in enumerate(by_cell.items()):
            gaps = paired_gaps(at.get(config, []), at.get("pre_ln", []))
            if not gaps or any(math.isinf(g) for g in gaps):
                continue
            mean, yk = statistics.fmean(gaps), y + (k - (len(configs) - 1) / 2) * 0.3
            ax.errorbar([mean], [yk], xerr=[[mean - min(gaps)], [max(gaps) - mean]], marker="o", capsize=3,
                        color=plan.COLORS[config], label=config if config not in ax.get_legend_handles_labels()[1] else None)
            ax.plot(gaps, [yk] * len(gaps), "|", ms=6, color=plan.COLORS[config], alpha=0.7)  # each seed
            tuning = tuning_runs(runs, cell, config)
            stalls = sum(r["status"] != "trained" for r in tuning)
            ax.annotate(f"{stalls}/{len(tuning)}", (max(gaps), yk), textcoords="offset points", xytext=(5, -3),
                        fontsize=7, color=plan.COLORS[config])
    ax.axvline(0, color="grey", lw=0.7)
    for x in (2, -2):
        ax.axvline(x, color="grey", lw=0.5, ls=":")
    labels = [cell.label + ("  (chosen)" if chosen and cell in chosen else "") for cell in by_cell]
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()  # the cells in the order they ran, top down
    ax.set(xlabel="final val loss above pre_ln's, same seed (%): left of 0, ahead",
           title="the paired gap to Pre-LN at the tuned rates, cell by cell\n"
                 "(bars and ticks: seeds; n/N: stalled of all tuning runs)")
    ax.legend(loc="lower right")
    return fig


def vocabulary_figure(plt, runs, exp):
    """The vocabulary as a factor: each shaped block's paired gap to pre_ln (mean, bars from min
    to max over seeds) against the vocabulary, in the GPT comparison's cell; a cell at another T
    drawn hollow beside its vocabulary."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    configs = [c for c in exp["tuned"] if c != "pre_ln"]
    for cell, at in vocabulary_cells(runs, exp).items():
        vocab, other_T = plan.tokens_of(cell.tokens)[2], cell.block_size != plan.TRAINING["block_size"]
        for k, config in enumerate(configs):
            gaps = paired_gaps(at.get(config, []), at["pre_ln"])
            if not gaps or any(math.isinf(g) for g in gaps):
                continue
            mean, x = statistics.fmean(gaps), vocab * 1.08 ** (2 * k - 1 + 3 * other_T)
            label = f"{config}, T {cell.block_size}" if other_T else config
            ax.errorbar([x], [mean], yerr=[[mean - min(gaps)], [max(gaps) - mean]], marker="o", capsize=4,
                        mfc="white" if other_T else plan.COLORS[config], color=plan.COLORS[config],
                        label=label if label not in ax.get_legend_handles_labels()[1] else None)
    ax.axhline(0, color="grey", lw=0.7)
    ax.set_xscale("log")
    ticks = sorted({plan.tokens_of(cell.tokens)[2] for cell in vocabulary_cells(runs, exp)})
    ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
    ax.minorticks_off()
    ax.set(xlabel="vocabulary (padded to a multiple of 64)", ylabel="final val loss above pre_ln's, same seed (%)",
           title="the shaped blocks against Pre-LN, by vocabulary\n(6 x 256, 800 steps; bars: the range over 3 seeds)")
    ax.legend()
    return fig
