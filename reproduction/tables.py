"""
What it found: results.json's rows (result_rows) and, from them alone, every table of the README
and REPORT.md (tables, write_report): each verdict a paired gap per seed stated against its
spread, and the factor study's rule that chose the regime (chosen_regime).
"""

import functools
import json
import math
import statistics

import train
from reproduction import experiments as ex
from reproduction import protocol
from reproduction.experiments import PATH_FIGURES, SHARED_LR, arm_flags, cell_of
from reproduction.measure import timed_key
from simple_gpt import GPT, switches_of


def step_to_reach(curve, target):
    """The step at which val loss first reaches target, linear between evals; None if never."""
    for (i0, l0), (i1, l1) in zip(curve, curve[1:]):
        if l1 <= target:
            return i0 + ((l0 - target) / (l0 - l1) if l0 > target else 0.0) * (i1 - i0)
    return None


GAIN_KEYS = ("value_beta_over_alpha", "proj_beta_over_alpha", "beta_ff", "beta_sa", "alpha", "beta", "gamma")


def result_rows(name, rows, step_s, first_seed):
    """One JSON-ready dict per run: what it was and how it ended, with its validation curve (and,
    for the first seed's final runs, its learned gains over training); step_s: seconds per step
    of each config, {timed_key: {config: seconds}}, for the shapes and batches timed."""
    out = []
    for run, role, o in rows:
        cfg, records = run.model_config(), [r for r in protocol.read_log(run) if not r.get("diverged")]
        row = dict(
            name=run.name, experiment=name, objective=run.objective, role=role, config=run.config, block=cfg.block,
            norm=cfg.norm, flags=dict(run.flags), n_layer=run.n_layer, n_embd=run.n_embd, n_head=run.n_head,
            steps=run.steps, batch_size=timed_key(run)[3], tokens=run.tokens, block_size=timed_key(run)[5],
            dtype=run.settings()["dtype"], lr=run.lr,
            seed=run.seed, beta_ff=cfg.beta_ff_init if "beta_ff" in switches_of(cfg.block) else None, params=GPT(cfg).num_params(),
            val_loss=None if math.isinf(o.loss) else o.loss, status=o.status,
            seconds_per_step=step_s.get(timed_key(run), {}).get(run.config),
            curve=[[r["iter"], round(r["val_loss"], 5)] for r in records],
            similarity=[[r["iter"], r["similarity"]] for r in records], log=str(run.folder / "log.jsonl"))
        if (run.folder / "code.json").exists():  # what made it, for reuse_baselines
            row["code"] = json.loads((run.folder / "code.json").read_text())
        if any("outliers" in r for r in records):  # logged by newer runs only
            row["kurtosis"] = [[r["iter"], r["outliers"]["kurtosis"]] for r in records if "outliers" in r]
            row["val_loss_int8"] = records[-1].get("val_loss_int8")
            row["entropy"] = records[-1].get("outliers", {}).get("entropy")  # at the end only: the file stays small
        if role == "final" and run.seed == first_seed:
            row["gains"] = [[r["iter"], {k: v for k, v in r["gains"].items() if k in GAIN_KEYS}] for r in records]
        out.append(row)
    return out


# ----------------------------------------------------------------------------- statistics

def finals(runs, steps, config, role="final", n_layer=None, flags=None):
    """The runs of config at steps in role (final: its tuned rate), one per seed, by seed."""
    return sorted((r for r in runs if r["steps"] == steps and r["config"] == config and r["role"] == role
                   and (n_layer is None or r["n_layer"] == n_layer) and (flags is None or r["flags"] == flags)),
                  key=lambda r: r["seed"])


def losses(rs):
    return [math.inf if r["val_loss"] is None else r["val_loss"] for r in rs]


def paired_gaps(rs, base):
    """Per-seed gaps (%) of runs rs to the base runs of the same seeds."""
    base_by_seed = {b["seed"]: b for b in base}
    return [100 * (loss / losses([base_by_seed[r["seed"]]])[0] - 1)
            for r, loss in zip(rs, losses(rs)) if r["seed"] in base_by_seed]


def spread(values, fmt="{:.4f}"):
    """mean (min-max) of values; inf (a diverged run) says so."""
    if not values:
        return "n/a"
    if any(math.isinf(v) for v in values):
        return f"diverged on {sum(math.isinf(v) for v in values)} of {len(values)}"
    mean = fmt.format(statistics.fmean(values))
    return mean if len(values) == 1 else f"{mean} ({fmt.format(min(values))} to {fmt.format(max(values))})"


def verdict(gaps):
    """A gap to the reference stated against its noise: the side it falls on, per seed."""
    if not gaps or any(math.isinf(g) for g in gaps):
        return "n/a"
    if len(gaps) == 1:
        return "one seed"
    side = ("behind on every seed" if min(gaps) > 0 else "ahead on every seed" if max(gaps) < 0
            else "the sign varies by seed")
    return ("within 2%; " if max(abs(g) for g in gaps) <= 2 else "") + side


def stalled_count(rs, kinds=True):
    bad = [r for r in rs if r["status"] != "trained"]
    return f"{len(bad)} of {len(rs)}" + (f" ({', '.join(sorted({r['status'] for r in bad}))})" if bad and kinds else "")


def reach_seconds(rs, base):
    """Paired equal-time view: per seed, seconds until the run reaches the base's final loss."""
    base_by_seed = {b["seed"]: b["curve"][-1][1] for b in base if b["val_loss"]}  # as rounded in the curves
    times = []
    for r in rs:
        reach = step_to_reach(r["curve"], base_by_seed.get(r["seed"]) or -math.inf) if r["val_loss"] else None
        times.append(None if reach is None or r["seconds_per_step"] is None else reach * r["seconds_per_step"])
    got = [t for t in times if t is not None]
    return "never" if not got else f"{statistics.fmean(got):.0f}" + ("" if len(got) == len(times) else f" ({len(got)} of {len(times)} seeds)")


# ----------------------------------------------------------------------------- tables

def gap_text(rs, base):
    return spread(paired_gaps(rs, base), "{:+.1f}%")


def tuned_table(runs, exp):
    """Each tuned config at its tuned rate at every scale point: its spread over seeds, the gap
    to the first config (pre_ln in the reproduction) seed by seed, how often it stalled, and its speed."""
    first = exp["tuned"][0]
    lines = [f"| steps | config | tuned lr | final val loss, mean (min to max) | paired gap to {first}, mean (min to max) "
             f"| verdict | stalled or diverged | s/step | speed vs {first} | s to reach {first}'s final loss |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for steps in sorted({r["steps"] for r in runs if r["role"] == "final"}):
        base = finals(runs, steps, first)
        for config in exp["tuned"]:
            rs = finals(runs, steps, config)
            if not rs:
                continue
            gaps = paired_gaps(rs, base)
            speed = base[0]["seconds_per_step"] / rs[0]["seconds_per_step"] if rs[0]["seconds_per_step"] else math.nan
            lines.append(f"| {steps} | {config} | {rs[0]['lr']:g} | {spread(losses(rs))} | "
                         f"{gap_text(rs, base) if config != first else ''} | {verdict(gaps) if config != first else ''} "
                         f"| {stalled_count(rs)} | {rs[0]['seconds_per_step'] or math.nan:.3f} | {speed:.3f} "
                         f"| {reach_seconds(rs, base)} |")
    return "\n".join(lines)


def loss_text(r):
    if r["status"] == "diverged":  # its val_loss is None
        return "diverged"
    return f"{r['val_loss']:.4f}" + (" stalled" if r["status"] == "stalled" else "")


def sweep_table(runs, exp):
    """Every tuning run, a row per seed: the first seed's sweep, the second's checks, the other
    seeds' final runs (bold: the tuned rate; stalled: the run never left the unigram level)."""
    runs = [r for r in runs if r["role"] in ("sweep", "check", "final") and r["config"] in exp["tuned"]]
    lrs = sorted({r["lr"] for r in runs})
    lines = ["| steps | config | seed | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |",
             "|---|---|---|" + "---|" * len(lrs)]
    for steps in sorted({r["steps"] for r in runs}):
        for config in exp["tuned"]:
            for seed in sorted({r["seed"] for r in runs}, key=seed_order):
                cells = {r["lr"]: r for r in runs if r["steps"] == steps and r["config"] == config and r["seed"] == seed}
                if cells:
                    row = ["" if lr not in cells else f"**{loss_text(cells[lr])}**" if cells[lr]["role"] == "final"
                           else loss_text(cells[lr]) for lr in lrs]
                    lines.append(f"| {steps} | {config} | {seed} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def seed_order(seed):
    return (seed != 1337, seed)


def stall_table(runs, exp):
    """How often each tuned config stalled or diverged, by rate, over every run and seed."""
    runs = [r for r in runs if r["config"] in exp["tuned"] and not arm_flags(r)]
    lines = ["| steps | config | " + " | ".join(f"lr {lr:g}" for lr in sorted({r["lr"] for r in runs})) + " |",
             "|---|---|" + "---|" * len({r["lr"] for r in runs})]
    for steps in sorted({r["steps"] for r in runs}):
        for config in exp["tuned"]:
            cells = []
            for lr in sorted({r["lr"] for r in runs}):
                rs = [r for r in runs if r["steps"] == steps and r["config"] == config and r["lr"] == lr]
                cells.append(f"{sum(r['status'] != 'trained' for r in rs)} of {len(rs)}" if rs else "")
            lines.append(f"| {steps} | {config} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shared_lr_table(runs, exp):
    """Every config at lr 1e-3, the paper's GPT rate, at each scale point it ran at, over seeds;
    the tuned configs' runs at 1e-3 are their sweep's (the first seed, and the second if checked)."""
    lines = ["| steps | config (all at lr 1e-3) | params | final val loss, mean (min to max) "
             "| paired gap to pre_ln at 1e-3 | verdict | stalled or diverged |", "|---|---|---|---|---|---|---|"]
    for steps in sorted({r["steps"] for r in runs if r["role"] == "final"}):
        at = [r for r in runs if r["steps"] == steps and r["lr"] == SHARED_LR and not arm_flags(r)]
        base = sorted((r for r in at if r["config"] == "pre_ln"), key=lambda r: r["seed"])
        for config in [c for c in ex.CONFIGS if any(r["config"] == c for r in at)]:
            rs = sorted((r for r in at if r["config"] == config), key=lambda r: r["seed"])
            gaps = paired_gaps(rs, base)
            lines.append(f"| {steps} | {config} | {rs[0]['params'] / 1e6:.3f}M | {spread(losses(rs))} "
                         f"| {spread(gaps, '{:+.1f}%') if config != 'pre_ln' and gaps else ''} "
                         f"| {verdict(gaps) if config != 'pre_ln' else ''} | {stalled_count(rs)} |")
    return "\n".join(lines)


def path_table(runs, exp):
    """The paper's path, figure by figure: each ablation at its tuned rate, seed by seed against
    its reference at the reference's tuned rate."""
    steps = max(r["steps"] for r in runs if r["role"] == "final")
    main = [r for r in runs if not arm_flags(r)]  # not the depth runs
    lines = ["| figure | config | against | tuned lr | final val loss, mean (min to max) "
             "| paired gap, mean (min to max) | verdict | stalled or diverged |", "|---|---|---|---|---|---|---|---|"]
    for figure, (configs, reference) in PATH_FIGURES.items():
        base = finals(main, steps, reference)
        for config in configs:
            rs = finals(main, steps, config)
            if rs:
                lines.append(f"| {figure} | {config} | {reference} | {rs[0]['lr']:g} | {spread(losses(rs))} "
                             f"| {gap_text(rs, base)} | {verdict(paired_gaps(rs, base))} | {stalled_count(rs)} |")
    return "\n".join(lines)


def depth_table(runs, exp):
    """Fig. 6: every block at depth L and 4L, each at its rate tuned at that depth."""
    depth = [r for r in runs if r["flags"].get("mlp_ratio")]
    layers = sorted({r["n_layer"] for r in depth})
    lines = ["| config | " + " | ".join(f"{L} layers: lr, final val loss" for L in layers)
             + f" | {layers[-1]} vs {layers[0]} layers, paired | gap to pre_ln at {layers[-1]} layers, paired |",
             "|---|" + "---|" * (len(layers) + 2)]
    steps = depth[0]["steps"]
    for config in exp["depth"]["configs"]:
        at = {L: finals(depth, steps, config, n_layer=L) for L in layers}
        if not all(at.values()):
            continue
        base = finals(depth, steps, "pre_ln", n_layer=layers[-1])
        cells = [f"{at[L][0]['lr']:g}, {spread(losses(at[L]))}" for L in layers]
        deeper = spread(paired_gaps(at[layers[-1]], at[layers[0]]), "{:+.1f}%")
        lines.append(f"| {config} | " + " | ".join(cells) + f" | {deeper} | "
                     f"{gap_text(at[layers[-1]], base) if config != 'pre_ln' else ''} |")
    return "\n".join(lines)


def regime_rows(runs, exp):
    """{cell: {config: its final runs}} of the factor study, cells in the order they ran."""
    by_cell = {}
    for r in runs:
        if r["role"] == "final":
            by_cell.setdefault(cell_of(r), {}).setdefault(r["config"], []).append(r)
    return {cell: {c: sorted(rs, key=lambda r: r["seed"]) for c, rs in configs.items()} for cell, configs in by_cell.items()}


def tuning_runs(runs, cell, config):
    """Every run of config's tuning in a cell of the factor study, all roles and seeds."""
    return [r for r in runs if cell_of(r) == cell and r["config"] == config]


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
                  if ok and (regime[3], regime[6]) == (ex.TRAINING["batch_size"], ex.TRAINING["block_size"])]
    unfinished = f" ({sum(not d for d in done.values())} not finished)" if not all(done.values()) else ""
    if not candidates:
        return None, f"no finished batch-16 regime trained at its tuned rates on every seed{unfinished}"
    paper_like = lambda regime: (regime[5] == "bpe", regime[2] // regime[1] == 64 and regime[2] / regime[0] >= 40, regime[4])
    best = max(candidates, key=paper_like)
    return regimes[best], (f"{sum(trains.values())} of {len(regimes)} regimes trained at every tuned rate on every "
                           f"seed{unfinished}; of the batch-16 ones, the closest to the paper's recipe")


def quick_regime(runs, exp):
    """The rule that picks --quick's regime, written down before any of its candidates ran: of
    ex.QUICK_CANDIDATES, cells of the factor study listed cheapest first, the first whose verdict
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
    for spec in ex.QUICK_CANDIDATES:
        cell, configs = ex.Cell(**spec), by_cell.get(ex.Cell(**spec), {})
        if any(len(configs.get(c, [])) < len(reference[c]) for c in exp["tuned"]):  # a cheaper one decides first
            return None, f"{'; '.join(sides + [cell.label + ': not finished'])}"
        got = {c: side(configs, c) if all(r["status"] == "trained" for rs in configs.values() for r in rs) else "n/a"
               for c in wanted}
        sides.append(f"{cell.label}: " + ", ".join(f"{c} {v}" for c, v in got.items()))
        if got == wanted:
            return cell, ("the cheapest candidate with the comparison's verdict, "
                          f"{', '.join(f'{c} {v}' for c, v in wanted.items())}; candidates run: " + "; ".join(sides))
    return None, f"no candidate has the comparison's verdict ({', '.join(f'{c} {v}' for c, v in wanted.items())}): " + "; ".join(sides)


def muon_table(runs, exp):
    """The optimizer as a factor, by the rules written before any Muon run (ex.EXPERIMENTS["muon"]):
    each shaped block's paired gap to Pre-LN with AdamW and with Muon (each against Pre-LN with the
    same optimizer, seed by seed), whether it keeps its verdict under Muon, and its learned gains
    at the end (first seed, mean over layers); then Pre-LN with Muon against Pre-LN with AdamW. A
    pair with a diverged run has no verdict."""
    steps = max(r["steps"] for r in runs)
    lines = ["| block | paired gap to pre_ln, AdamW | paired gap to pre_ln_muon, Muon | keeps its verdict under Muon "
             "| gains at the end, AdamW | gains at the end, Muon |", "|---|---|---|---|---|---|"]

    def side(rs, base):  # ahead or behind on every seed (within 2% too), else why not
        diverged = sorted({r["config"] for r in rs + base if r["val_loss"] is None})
        return f"n/a: {', '.join(diverged)} diverged" if diverged else verdict(paired_gaps(rs, base)).removeprefix("within 2%; ")

    def gains(config):
        logged = [r["gains"][-1][1] for r in finals(runs, steps, config) if r.get("gains")]
        return ", ".join(f"{k} {statistics.fmean(v):.3g}" for k, v in logged[0].items()
                         if k in ("beta_sa", "beta_ff", "alpha", "beta", "gamma") and v) if logged else "not logged"

    for block in [c for c in exp["tuned"] if not c.endswith("_muon")][1:]:
        pairs = [(finals(runs, steps, block), finals(runs, steps, "pre_ln")),
                 (finals(runs, steps, f"{block}_muon"), finals(runs, steps, "pre_ln_muon"))]
        if not all(rs and base for rs, base in pairs):
            lines.append(f"| {block} | not finished | | | | |")
            continue
        adamw, muon = (side(*pair) for pair in pairs)
        keeps = (f"no verdict to keep: {adamw}" if "every seed" not in adamw else
                 "yes" if muon == adamw else f"no: {muon}")
        lines.append(f"| {block} | {gap_text(*pairs[0])} | {gap_text(*pairs[1])} | {keeps} | {gains(block)} | "
                     f"{gains(f'{block}_muon')} |")
    rs, base = finals(runs, steps, "pre_ln_muon"), finals(runs, steps, "pre_ln")
    if not (rs and base):
        return "\n".join(lines) + "\n\nPre-LN with Muon against Pre-LN with AdamW: not finished."
    sane = ("set up well: ahead on every seed" if side(rs, base) == "ahead on every seed" else
            f"suspect ({side(rs, base)}): the comparison under it says little")
    return "\n".join(lines) + f"\n\nPre-LN with Muon against Pre-LN with AdamW, seed by seed: {gap_text(rs, base)}; Muon {sane}."


def durability_table(runs, exp):
    """The lead at 4x the length, by the rule written before any longer run (ex.EXPERIMENTS["durability"]):
    each shaped block's paired gap to Pre-LN at each length (each block at its rate tuned at that
    length), per seed; the lead holds if it is ahead on every seed at the longer length, and then
    grows (shrinks) if its gap there is below (above) the shorter one's on every seed."""
    short, long = (f(r["steps"] for r in runs if r["role"] == "final") for f in (min, max))
    lines = [f"| block | paired gap to pre_ln, {short} steps | {long} steps | per seed, {short} then {long} steps "
             f"| the lead at {long} steps |", "|---|---|---|---|---|"]
    for block in exp["tuned"][1:]:
        pairs = [(finals(runs, steps, block), finals(runs, steps, exp["tuned"][0])) for steps in (short, long)]
        seeds = [[r["seed"] for r in rs + base] for rs, base in pairs]
        if short == long or not all(seeds) or seeds[0] != seeds[1]:
            lines.append(f"| {block} | not finished | | | |")
            continue
        if any(r["val_loss"] is None for rs, base in pairs for r in rs + base):
            lines.append(f"| {block} | | | | n/a: a run diverged |")
            continue
        gaps = [paired_gaps(*pair) for pair in pairs]
        lines.append(f"| {block} | {spread(gaps[0], '{:+.1f}%')} | {spread(gaps[1], '{:+.1f}%')} | "
                     + ", ".join(f"{a:+.1f}% then {b:+.1f}%" for a, b in zip(*gaps)) + f" | {durability_verdict(*gaps)} |")
    return "\n".join(lines)


def durability_verdict(short, long):
    """The rule's words for one block's per-seed gaps (%) at the shorter and at the longer length."""
    side = verdict(long).removeprefix("within 2%; ")
    if side != "ahead on every seed":
        return f"does not hold: {side}"
    return ("holds and grows" if all(b < a for a, b in zip(short, long)) else
            "holds and shrinks" if all(b > a for a, b in zip(short, long)) else "holds, about its size")


def bf16_check(runs, regime, exp):
    """bf16's check: each shaped block's paired gap to pre_ln in bf16 (the comparison's cell at its
    float32 tuned rates), seed by seed, against the range of its float32 gaps in that cell. The rule,
    written before the check ran: bf16 keeps the verdict if every bf16 gap lies within 1 point of
    the float32 range; then the study's new cells may train in bf16, each cell's dtype said."""
    spec = exp["scales"]["default"]
    cell = ex.Cell(spec["n_layer"], spec["n_head"], spec["n_embd"], spec["steps"][-1], warmup_frac=spec["warmup_frac"],
                   tokens=spec["tokens"])
    float32 = regime_rows(regime, exp).get(cell, {})
    lines = ["| config | lr (float32's tuned) | bf16 final val loss | bf16 paired gap, per seed | float32 paired gap "
             "| within 1 point |", "|---|---|---|---|---|---|"]
    rate = lambda rs: rs[0]["lr"] if rs else None
    keeps = rate(finals(runs, cell.steps, "pre_ln")) == rate(float32.get("pre_ln", []))  # pre_ln at its rate too
    for config in exp["tuned"][1:]:
        rs, ref = finals(runs, cell.steps, config), float32.get(config, [])
        gaps, ref_gaps = paired_gaps(rs, finals(runs, cell.steps, "pre_ln")), paired_gaps(ref, float32.get("pre_ln", []))
        inside = (bool(gaps and ref_gaps) and rate(rs) == rate(ref)  # at float32's tuned rate, or no check
                  and all(min(ref_gaps) - 1 <= g <= max(ref_gaps) + 1 for g in gaps))
        keeps &= inside
        lines.append(f"| {config} | {rate(rs):g} ({rate(ref):g} tuned) | {spread(losses(rs))} | "
                     f"{', '.join(f'{g:+.1f}%' for g in gaps)} | {spread(ref_gaps, '{:+.1f}%')} | {'yes' if inside else 'no'} |"
                     if rs and ref else f"| {config} | | not run | | | no |")
    verdict = ("bf16 keeps the verdict: the study's new cells may train in bf16" if keeps else
               "bf16 moves the verdict (or the check is not finished): the study stays float32")
    own = "; ".join(f"{config} {', '.join(f'{g:+.1f}%' for g in gaps)}" for config in exp["tuned"]
                    if (gaps := paired_gaps(finals(runs, cell.steps, config), float32.get(config, []))))
    return "\n".join(lines) + (f"\n\nEach block's bf16 final loss against its float32 one, seed by seed: {own}." if own else "") + f"\n\n{verdict}."


def rows_table(runs, regime, exp):
    """The vocabulary's size to the model apart from its tokens: each block's paired gap to pre_ln
    with 4K-BPE's tokens and 16K-BPE's rows (the rows check), beside its gap in the factor study's 4K
    and 16K cells of that shape, seed by seed, each at its rate; then the rule's verdict (rows_verdict)."""
    spec = exp["scales"]["default"]
    tokens, _, rows = spec["tokens"].partition("_rows")
    cell = lambda kind: ex.Cell(spec["n_layer"], spec["n_head"], spec["n_embd"], spec["steps"][-1],
                                warmup_frac=spec["warmup_frac"], tokens=kind)
    by_cell = regime_rows(regime, exp)
    check = {config: finals(runs, spec["steps"][-1], config) for config in exp["tuned"]}
    cells = [check, by_cell.get(cell(tokens), {}), by_cell.get(cell(f"bpe{rows}"), {})]
    few, many = f"BPE-{int(tokens[3:]) // 1024}K", f"BPE-{int(rows) // 1024}K"
    lines = [f"| config | paired gap: {few}'s tokens, {many}'s rows | {few} cell | {many} cell |", "|---|---|---|---|"]
    for config in exp["tuned"]:
        gaps = [(f"{gap_text(c[config], c['pre_ln'])} " if config != "pre_ln" else "") + f"at {c[config][0]['lr']:g}"
                if c.get(config) and c.get("pre_ln") else "not finished" for c in cells]
        lines.append(f"| {config} | " + " | ".join(gaps) + " |")
    not_taken = {}
    for r in runs:
        if r["role"] == "sweep":
            not_taken.setdefault((r["config"], r["lr"]), []).append(r)
    others = "; ".join(f"{config} at {lr:g}: {spread(losses(rs))}" for (config, lr), rs in not_taken.items())
    own = "; ".join(f"{config} {gap_text(check[config], cells[1][config])}" for config in exp["tuned"]
                    if check[config] and cells[1].get(config))
    return ("\n".join(lines) + (f"\n\nFinal losses at the rates not taken (another had the better mean): {others}." if others else "")
            + (f"\n\nEach block's loss with {many}'s rows against its loss in the {few} cell, seed by seed: {own}." if own else "")
            + "\n\n" + rows_verdict(*cells))


def rows_verdict(check, few, many):
    """The rule, written before the rows check ran: for each shaped block, the share of its mean paired
    gap's move from the cell of few tokens (4K) to the cell of many (16K) that the many rows alone make
    (the check: the few tokens, the many rows), to 2 decimals. At least 3/4 for both shaped blocks: the
    lead follows the rows, the vocabulary's size to the model; at most 1/4 for both: the tokens
    themselves; else neither cleanly (3 seeds know a share to about +-1/4). A stall or a divergence
    leaves no verdict, and so does a block whose gap does not move towards a lead."""
    arms = [cell.get(c) for cell in (check, few, many) for c in ("pre_ln", "sas", "sas_p")]
    if not all(arms):
        return "The vocabulary's rows: not finished."
    if any(r["status"] != "trained" for rs in arms for r in rs):
        return "The vocabulary's rows: no verdict (a run stalled or diverged)."
    mean_gap = lambda cell, config: statistics.fmean(paired_gaps(cell[config], cell["pre_ln"]))
    shares = {}
    for config in ("sas", "sas_p"):
        move = mean_gap(many, config) - mean_gap(few, config)
        if move >= 0:
            return f"The vocabulary's rows: no verdict ({config}'s gap does not move towards a lead with the vocabulary)."
        shares[config] = round((mean_gap(check, config) - mean_gap(few, config)) / move, 2) + 0.0  # + 0.0: no -0
    said = f"The rows alone make {'; '.join(f'{config} {share:.0%}' for config, share in shares.items())} of the move"
    if all(share >= 0.75 for share in shares.values()):
        return f"{said}: the lead follows the rows, the vocabulary's size to the model."
    if all(share <= 0.25 for share in shares.values()):
        return f"{said}: the lead follows the tokens themselves, not the vocabulary's size to the model."
    return f"{said}: neither cleanly."


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
        cells |= {cell: {} for scale in exp["scales"].values() for cell in map(lambda spec: ex.Cell(**spec), scale.get("cells", ()))
                  if same(cell) and cell not in cells}
    return dict(sorted(cells.items(), key=lambda item: (ex.tokens_of(item[0].tokens)[2], -item[0].block_size)))


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
        vocab = ex.tokens_of(cell.tokens)[2]
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
    T = ex.TRAINING["block_size"]
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


def identity_table(runs, exp):
    """Starting as the identity: Pre-LN with its output matrices zero at init (pre_ln_zero), SAS and
    SAS-P, each against Pre-LN seed by seed, in a cell of tokens and a cell of bytes: each one's
    tuned rate and paired gap (mean, min to max over seeds); then the rule's verdict."""
    cells = ex.cells("default", "identity")
    by_cell = regime_rows(runs, exp)
    lines = ["| cell | pre_ln lr | " + " | ".join(f"{c}: lr, paired gap" for c in exp["tuned"][1:]) + " |",
             "|---|---|" + "---|" * (len(exp["tuned"]) - 1)]
    for cell in cells:
        configs = by_cell.get(cell, {})
        if "pre_ln" not in configs:
            lines.append(f"| {cell.label} | not finished |" + " |" * (len(exp["tuned"]) - 1))
            continue
        gaps = [f"{configs[c][0]['lr']:g}, {gap_text(configs[c], configs['pre_ln'])}" if c in configs else "not finished"
                for c in exp["tuned"][1:]]
        lines.append(f"| {cell.label} | {configs['pre_ln'][0]['lr']:g} | " + " | ".join(gaps) + " |")
    tokens, byte = (by_cell.get(c, {}) for c in sorted(cells, key=lambda c: c.tokens == "bytes"))
    return "\n".join(lines) + "\n\n" + identity_verdict(tokens, byte)


def identity_verdict(tokens, byte):
    """The rule, written before any pre_ln_zero run: starting as the identity is how the shaped
    blocks lead on tokens if pre_ln_zero is ahead of pre_ln on every seed in the cell of tokens and
    its mean gap is at most half SAS's (it closes at least half of SAS's lead); and it is why the
    tokens matter if, besides, it gains at most half as much on bytes (its mean gap there at least
    half its mean gap on tokens). A stall or a divergence leaves no verdict."""
    arms = [cell.get(c) for cell in (tokens, byte) for c in ("pre_ln", "sas", "pre_ln_zero")]
    if not all(arms):
        return "Starting as the identity: not finished."
    if any(r["status"] != "trained" for rs in arms for r in rs):
        return "Starting as the identity: no verdict (a run stalled or diverged)."
    gaps = lambda cell, config: paired_gaps(cell[config], cell["pre_ln"])
    zero, sas, on_bytes = gaps(tokens, "pre_ln_zero"), gaps(tokens, "sas"), gaps(byte, "pre_ln_zero")
    if max(sas) >= 0:
        return "Starting as the identity: SAS does not lead on tokens on every seed, so there is no lead to explain."
    closes = statistics.fmean(zero) / statistics.fmean(sas)  # the share of SAS's lead pre_ln_zero has
    head = (f"On tokens pre_ln_zero is {spread(zero, '{:+.1f}%')} against pre_ln, SAS {statistics.fmean(sas):+.1f}%; "
            f"on bytes pre_ln_zero is {spread(on_bytes, '{:+.1f}%')}. ")
    if max(zero) >= 0 or closes < 0.5:
        why = "not ahead on every seed" if max(zero) >= 0 else f"it closes {closes:.0%} of SAS's lead, under half"
        return head + f"Starting as the identity is not how the shaped blocks lead on tokens ({why})."
    tokens_matter = statistics.fmean(on_bytes) >= statistics.fmean(zero) / 2
    return head + (f"Starting as the identity is how the shaped blocks lead on tokens (it closes {closes:.0%} of SAS's "
                   "lead), and " + ("why the tokens matter: on bytes it gains at most half as much." if tokens_matter
                                    else "not why the tokens matter: on bytes it gains more than half as much."))


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
    run = train.CPU_RUN
    cell = ex.Cell(run["n_layer"], run["n_head"], run["n_embd"], run["max_iters"], run["batch_size"],
                   train.CPU_GPT_WARMUP, "bpe")
    configs, shown = regime_rows(runs, exp).get(cell, {}), (0, 100, 200, 400)
    lines = [f"| CPU default, val loss at step | {' | '.join(map(str, shown))} | {cell.steps} (seed 1337 / seed 1) |",
             "|---" * (len(shown) + 2) + "|"]
    for config in exp["tuned"]:
        rs = sorted(configs.get(config, []), key=lambda r: seed_order(r["seed"]))[:2]
        if [r["seed"] for r in rs] != [1337, 1]:
            continue
        curve = dict(rs[0]["curve"])
        lines.append(f"| `{config}` (lr {rs[0]['lr']:g}) | " + " | ".join(f"{curve[step]:.2f}" for step in shown)
                     + " | **" + " / ".join(loss_text(r) for r in rs) + "** |")
    return "\n".join(lines)


def regime_sweeps(runs, exp):
    """Every tuning run, cell by cell, a row per seed (as sweep_table)."""
    return "\n\n".join(f"{cell.label}:\n\n" + sweep_table([r for r in runs if cell_of(r) == cell], exp)
                        for cell in regime_rows(runs, exp))


def tables(results):
    """The README's tables, made from results.json alone: [(experiment, title, markdown)]."""
    out = []
    for name, exp in ex.EXPERIMENTS.items():
        runs = [r for r in results["runs"] if r["experiment"] == name]
        if not runs:
            continue
        if name == "regime":
            chosen, why = chosen_regime(runs, exp)
            unfinished = results.get("experiments", {}).get(name, {}).get("unfinished")
            if unfinished:  # a regime not run in full yet may still fail in the cells left
                why += f"; provisional: {len(unfinished)} arms of the study are not finished"
            choice = (f"The rule's choice: {'; '.join(cell.label for cell in chosen)} ({why})." if chosen
                      else f"The rule's choice: none yet ({why}).")
            quick, why = quick_regime(runs, exp)
            choice += f" --quick's rule: {quick.label if quick else 'stays where it is'} ({why})."
            out += [(name, "regime map", regime_map_table(runs, exp)), (name, "regime choice", choice),
                    (name, "regime", regime_table(runs, exp)), (name, "vocabulary", vocabulary_table(runs, exp)),
                    (name, "regime attention", regime_attention(runs, exp)),
                    (name, "main job", main_job_table(runs, exp)), (name, "regime sweeps", regime_sweeps(runs, exp))]
            continue
        if name in ("bf16", "rows"):  # a check against the factor study's cells
            regime = [r for r in results["runs"] if r["experiment"] == "regime"]
            title = "bf16 check" if name == "bf16" else "rows"
            out += [(name, title, MADE_BY[title](runs, regime, exp))]
            continue
        if name == "identity":
            out += [(name, "identity", identity_table(runs, exp)), (name, "identity sweeps", regime_sweeps(runs, exp))]
            continue
        if name in ("muon", "durability", "durability16k"):  # its verdicts, then the usual tables of its tuning
            out.append((name, name.removesuffix("16k"), MADE_BY[name.removesuffix("16k")](runs, exp)))
        if name == "path":
            out += [(name, "path", path_table(runs, exp))]
            if any(r["flags"].get("mlp_ratio") for r in runs):
                out.append((name, "depth", depth_table(runs, exp)))
            continue
        if name == "outliers":  # its tables, then the usual ones of its tuning, the rescue runs apart
            rescue, runs = tuning_and_rescue(runs)
            out += [(name, "outliers", outlier_table(runs, exp))] + ([(name, "rescue", rescue_table(rescue, exp))] if rescue else [])
        out += [(name, "tuned", tuned_table(runs, exp)), (name, "sweep", sweep_table(runs, exp)),
                (name, "stalls", stall_table(runs, exp))]
        if exp.get("shared_lr"):
            out.append((name, "shared_lr", shared_lr_table(runs, exp)))
    return out


# ----------------------------------------------------------------------------- outlier features

def tuning_and_rescue(runs):
    """The outliers experiment's rows: (the rescue's, the rest)."""
    return [r for r in runs if r["role"] in ("stalled", "rescue")], [r for r in runs if r["role"] not in ("stalled", "rescue")]


def at_shared_rate(runs, steps, config):
    """config's runs at SHARED_LR, one per seed (its sweep's, check's, final's or shared_lr's)."""
    by_seed = {r["seed"]: r for r in runs if r["steps"] == steps and r["config"] == config and r["lr"] == SHARED_LR}
    return [by_seed[seed] for seed in sorted(by_seed)]


def kurtosis_of(r, layers, when):
    """A run's kurtosis at its last evaluation or its peak over them (when: final or peak), of the
    deepest layer or the mean over layers (layers: last or mean); None where its log has none."""
    per_eval = [ks[-1] if layers == "last" else statistics.fmean(ks) for _, ks in r.get("kurtosis", [])]
    return (per_eval[-1] if when == "final" else max(per_eval)) if per_eval else None


def logged(values, fmt):
    """spread() of the values runs logged (None: not logged), saying how many of them did."""
    got = [v for v in values if v is not None]
    return "not logged" if not got else spread(got, fmt) + ("" if len(got) == len(values) else f" ({len(got)} of {len(values)})")


def outlier_table(runs, exp):
    """Outlier features per arm, at its tuned rate and at one rate shared by every arm (1e-3): the
    final loss and its paired gap to pre_ln at that rate; the residual stream's kurtosis (1: every
    neuron alike) after the last block and averaged over blocks, at the end and at its peak over
    training; and how much the loss grows with every linear layer's input fake-quantised to int8.
    Each a mean (min to max) over seeds."""
    lines = ["| steps | config | lr | final val loss | paired gap to pre_ln | kurtosis, last layer, final | and peak "
             "| kurtosis, mean over layers, final | and peak | int8 loss increase | stalled or diverged |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for steps in sorted({r["steps"] for r in runs if r["role"] == "final"}):
        for which, pick in (("tuned", lambda c: finals(runs, steps, c)), ("shared", lambda c: at_shared_rate(runs, steps, c))):
            base = [r for r in pick(exp["tuned"][0]) if r["val_loss"] is not None]
            for config in exp["tuned"]:
                rs = pick(config)
                if not rs:
                    continue
                ended = [r for r in rs if r["val_loss"] is not None]  # not diverged
                kurt = [logged([kurtosis_of(r, layers, when) for r in ended], "{:.2f}")
                        for layers in ("last", "mean") for when in ("final", "peak")]
                int8 = [100 * (r["val_loss_int8"] / r["val_loss"] - 1) if r.get("val_loss_int8") else None for r in ended]
                lines.append(f"| {steps} | {config} | {rs[0]['lr']:g}{' (shared)' if which == 'shared' else ''} "
                             f"| {spread(losses(rs))} | {gap_text(ended, base) if config != exp['tuned'][0] else ''} "
                             f"| {' | '.join(kurt)} | {logged(int8, '{:+.2f}%')} | {stalled_count(rs)} |")
    return "\n".join(lines)


def rescue_table(runs, exp):
    """The rescue: each shaped run that stalled in the factor study's cell 1 (12 x 128, 200 steps, 5% warmup), again with QK-norm (the same
    rate and seed, so the same weights at init and the same batches)."""
    lines = ["| shape, steps | config | lr | seed | as it was | with QK-norm |", "|---|---|---|---|---|---|"]
    by = {role: {(r["config"].removesuffix("_qknorm"), r["lr"], r["seed"]): r for r in runs if r["role"] == role}
          for role in ("stalled", "rescue")}
    for key in sorted(by["stalled"].keys() | by["rescue"].keys(), key=lambda k: (k[0], k[1], seed_order(k[2]))):
        was, cure = by["stalled"].get(key), by["rescue"].get(key)
        r = was or cure
        lines.append(f"| {r['n_layer']}x{r['n_embd']}, {r['steps']} | {key[0]} | {key[1]:g} | {key[2]} "
                     f"| {loss_text(was) if was else 'not run'} | {loss_text(cure) if cure else 'not run'} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- REPORT.md

MADE_BY = {"tuned": tuned_table, "sweep": sweep_table, "stalls": stall_table, "shared_lr": shared_lr_table,
           "path": path_table, "depth": depth_table, "regime": regime_table, "regime map": regime_map_table,
           "regime choice": chosen_regime, "vocabulary": vocabulary_table, "regime attention": regime_attention, "main job": main_job_table,
           "regime sweeps": regime_sweeps, "outliers": outlier_table, "rescue": rescue_table, "bf16 check": bf16_check,
           "muon": muon_table, "durability": durability_table, "rows": rows_table, "identity": identity_table, "identity sweeps": regime_sweeps}  # the maker of each table of tables()


def so_far_table(runs):
    """The finished runs of tuning arms (or scale points) not finished yet, as they ended."""
    lines = ["| point | config | lr | seed | final val loss | status |", "|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: (r["steps"], r["n_layer"], r["n_embd"], str(r["flags"]), r["config"], r["lr"], r["seed"])):
        point = ", ".join([cell_of(r).label if r["objective"] == "clm" else f"{r['n_layer']}x{r['n_embd']}, {r['steps']} steps",
                           *(f"{k} {v:g}" for k, v in arm_flags(r).items())])
        loss = "" if r["val_loss"] is None else f"{r['val_loss']:.4f}"
        lines.append(f"| {point} | {r['config']} | {r['lr']:g} | {r['seed']} | {loss} | {r['status']} |")
    return "\n".join(lines)


METHOD = """## How it is run

The data is Python's standard library, as bytes (a vocabulary of 257), as GPT-2's BPE tokens
(50,257), or as GPT-2's BPE cut to its first N tokens (`prepare_data.py --vocab N`): the same
text. Every run, unless its cell says otherwise: T 128 tokens a sequence, 16 sequences a step,
AdamW (the muon experiment's `_muon` arms: Muon on the blocks' matrices), linear warmup then linear
decay to 0, in float32 on CPU.

**Every block is tuned alike** (the paper tuned each model's peak learning rate on a grid): a
sweep of 1e-3 to 8e-3 on the first seed, grown by factors of 2 while the best rate is at an edge;
its two best rates on a second seed; the better of those on a third (`--quick`: 2 seeds in all). A seed sets the initial
weights and the batch order, the same for every block, so blocks compare **seed by seed**: each
gap is the paired gap to Pre-LN, its mean and range over the seeds. A run that **stalls** (its
validation loss stuck at the unigram level: token frequencies alone) or diverges is counted,
never dropped. Seconds per step come from bench.py (every block in one process, steps
interleaved), not from the runs' own clocks.

**The factor study** (`--experiment regime`) tunes Pre-LN, SAS and SAS-P alike in *cells*, each a
model shape, run length, batch, warmup and vocabulary, varying one factor at a time. **The rule**
(`chosen_regime`), written before any cell ran: of the batch-16, T-128 regimes in which every
tuned rate trained on every seed, the one closest to the paper's recipe: its kind of tokens (BPE)
first, then its proportions (d_k 64, width : depth >= 40), then the longer warmup; never the gaps.
It chose GPT-2 BPE, 6 x 256, 4 heads, 20% warmup: the GPT comparison (`python reproduce.py`) runs
there. `--quick`'s regime has a rule of its own (`quick_regime`), written before its candidates ran.
"""


def write_report(results, assets):
    """REPORT.md beside results.json: the method, every table made from results.json, and the figures."""
    lines = ["# The reproduction's full tables", "",
             "Written by reproduce.py from [results.json](results.json) (every run, with its curve); do not edit.", "",
             METHOD]
    seen = set()
    for experiment, title, markdown in tables(results):
        unfinished = results["experiments"].get(experiment, {}).get("unfinished")
        if unfinished and experiment not in seen:
            lines += [f"*{experiment}, not finished yet:* " + "; ".join(unfinished), ""]
            if so_far := results["experiments"][experiment].get("so_far"):
                lines += [f"*{experiment}, the finished runs of what is not finished* (no verdict until its arm is done):", "",
                          so_far_table(so_far), ""]
        seen.add(experiment)
        caption = " ".join(MADE_BY[title].__doc__.split("\n\n")[0].split())  # the docstring's first paragraph
        lines += [f"## {experiment}: {title}", "", caption, "", markdown, ""]
    lines += ["## Figures", ""] + [f"![{png.stem}]({png.name})" for png in sorted(assets.glob("*.png"))]
    (assets / "REPORT.md.tmp").write_text("\n".join(lines) + "\n")
    (assets / "REPORT.md.tmp").replace(assets / "REPORT.md")
