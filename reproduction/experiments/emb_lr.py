"""
How much of the shaped blocks' lead is their own? Every comparison before this one gave a model one
AdamW rate, and with GPT-2's vocabulary the embedding (wte, tied to the output head, and wpe) is
most of the model (85% of the weights at 6 x 128): it got the rate the blocks' body tolerates. Here
every block is tuned alike over two rates, its body's (--lr) and its embeddings' (--emb_lr), in
three cells of the factor study, Pre-LN, SAS and SAS-P, 20% warmup, each block's one-rate best
rate r (its factor-study tuning in that cell, ONE_RATE) the centre of its search:

- the main job's cell (GPT-2 BPE, 6 x 128, 800 steps, float32): a grid of pairs, body r/2, r, 2r
  by embeddings r, 2r, 4r, 8r, 16r (both absolute), an axis grown by 2x while the best pair sits
  on its edge and trains; the whole grid on the first seed, its 2 best pairs on the second, the
  better mean on the third: the protocol's, on pairs (protocol.tune). A stalled run counts and
  falls back as there.
- the headline's cell (GPT-2 BPE, 6 x 256, 800 steps, in bf16: the bf16 check allows new cells
  there, and its runs are this cell's one-rate runs at r in bf16): the embeddings' rate carried
  from the main cell as an absolute rate (muP's view: an embedding's rate need not shrink with
  width), the body at r/2, r, 2r with it, then the embeddings at half and twice it at the best
  body rate; each stage's axis grown as the grid's; then the protocol's seeds on those pairs.
- the vocabulary study's bytes cell (6 x 256, 800 steps, float32, where the shaped blocks trail):
  each block at r with its carried embeddings' rate, on every seed: does the gap move?
- one control per block in the main cell, first seed, at its best pair: the embeddings' decay
  divided by the rates' ratio (AdamW's decay is decoupled: the same decay per step as one rate),
  so that the report says whether the rate or its decay moved the loss.

A pair whose embeddings' rate equals its body's is the one-rate run, the committed one (made by
earlier code, taken as it is: one setting, one result; the searches run in a clone of b5e5160,
whose --reuse_results restores it). The rule, written before any of its runs
(verdict_table): per cell, a shaped block leads with its embeddings' rate tuned if its paired gap
to Pre-LN, each at its best pair, is below zero on every seed; trails if above on every seed;
else level (the sign varies). Beside it: the one-rate gap (each at its one-rate best, the same
seeds), and the rate's share of the lead, two-rate gap minus one-rate gap (mean, points); the gap
without the first seed, whose grid chose the pairs; a best pair still on an edge of its search. Two
rates train every block better if each block's best pair ends below its one-rate run on every
seed of the main cell; then train.py's CPU preset gives each block its pair (when neither --lr
nor --emb_lr is given).
"""

import statistics
from pathlib import Path

import prepare_data
from common import load_model
from diagnostics import loss_by_frequency
from reproduction import plan, protocol
from reproduction.plan import Cell, cell_of
from reproduction.tables import curve_table, loss_text, pair_grid, paired_gaps, seed_order, spread, verdict
from train_config import TrainConfig

TUNED = ("pre_ln", "sas", "sas_p")
MAIN = Cell(6, 4, 128, 800, warmup_frac=0.2, tokens="bpe")
HEADLINE = Cell(6, 4, 256, 800, warmup_frac=0.2, tokens="bpe")
BYTES = Cell(6, 4, 256, 800, warmup_frac=0.2)
BF16 = (HEADLINE,)  # the cells trained in bf16
# each block's one-rate best rate in each cell: the factor study's tuning (the headline's: the GPT comparison's)
ONE_RATE = {MAIN: dict(pre_ln=2e-3, sas=4e-3, sas_p=4e-3), HEADLINE: dict(pre_ln=2e-3, sas=4e-3, sas_p=2e-3),
            BYTES: dict(pre_ln=1e-3, sas=4e-3, sas_p=2e-3)}
ONE_RATE_RUNS = {MAIN: "regime", HEADLINE: "bf16", BYTES: "regime"}  # the experiment whose final runs are the one-rate arm


def planned(n_seeds):
    """The runs it trains: per block, the main cell's grid and the headline's two stages on the first
    seed, 2 and 1 on the others; the bytes cell on every seed; a control (the rates grown past not counted)."""
    later = n_seeds if n_seeds > 1 else 0  # the 2 best on the second seed, the best on each other
    return len(TUNED) * (15 + later + 1 + 5 + later + n_seeds)


EXPERIMENT = dict(
    objective="clm",
    flags={},
    tuned=TUNED,
    scales={"default": dict(cells=[dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, steps=c.steps,
                                        warmup_frac=c.warmup_frac, tokens=c.tokens) for c in (MAIN, HEADLINE, BYTES)])},
    planned=planned)


def run_in(cell, config):
    run = cell.run(config)
    return run.again(flags=tuple(sorted(run.flags + (("dtype", "bfloat16"),)))) if cell in BF16 else run


def search(scale, seed_list, train_it):
    """Every run of the rule's searches, arm by arm as protocol.experiment's: ([(run, role, outcome)],
    [what is left out]); role sweep, check, final (the best pair), control (its decay), and so far."""
    rows, left_out, best = [], [], {}

    def arm(what, run, grid, train):  # trains it, or leaves it out (its finished runs: so far)
        nonlocal rows
        try:
            found = train()
            rows += found[0] if isinstance(found, tuple) else found
            return found
        except protocol.Unfinished as e:
            left_out.append(f"{what} (from {e})")
            if not train_it:  # a one-rate run beside them is the arm's where it is a pair of its first seed's grid,
                found = protocol.finished_so_far(run, seed_list, grid)  # its axes as grown so far
                pairs = [dict(r.rates) for r, _, _ in found if "emb_lr" in dict(r.flags)]
                axes = [set(rates) | {pair[flag] for pair in pairs} for flag, rates in grid or ()]
                on_grid = lambda r: r.seed == seed_list[0] and all(r.lr in rates for rates in axes)
                rows += [row for row in found if "emb_lr" in dict(row[0].flags) or grid and on_grid(row[0])]

    for config in TUNED:
        r, run = ONE_RATE[MAIN][config], run_in(MAIN, config)
        grid = (("lr", (r / 2, r, 2 * r)), ("emb_lr", tuple(k * r for k in (1, 2, 4, 8, 16))))
        if found := arm(f"the main cell's {config}", run, grid, lambda: protocol.tune(run, seed_list, train_it, grid=grid)):
            best[config] = dict(found[1])
    for config, pair in best.items():
        if pair["emb_lr"] != pair["lr"]:
            control = protocol.at_rates(run_in(MAIN, config), tuple(pair.items()), seed=seed_list[0])
            decay = TrainConfig.weight_decay * pair["lr"] / pair["emb_lr"]
            control = control.again(flags=tuple(sorted(control.flags + (("emb_weight_decay", decay),))))
            arm(f"{config}'s decay control", control, None, lambda: [(control, "control", protocol.outcome(control, train_it))])
    for config, pair in best.items():
        r, run, carried = ONE_RATE[HEADLINE][config], run_in(HEADLINE, config), pair["emb_lr"]
        arm(f"the headline cell's {config}", run, (("lr", ()), ("emb_lr", ())),
            lambda: protocol.tune(run, seed_list, train_it, first=cross(run.again(seed=seed_list[0]), r, carried, train_it)))
    for config, pair in best.items():
        run = protocol.at_rates(run_in(BYTES, config), (("lr", ONE_RATE[BYTES][config]), ("emb_lr", pair["emb_lr"])))
        arm(f"the bytes cell's {config}", run, None,
            lambda: [(r, "final", o) for r, o in protocol.outcomes([run.again(seed=s) for s in seed_list], train_it).items()])
    for config, pair in best.items():  # the weights measurements() reads: the one-rate run's and the best pair's
        for rates_of in ((("lr", ONE_RATE[MAIN][config]), ("emb_lr", ONE_RATE[MAIN][config])), tuple(pair.items())):
            run = protocol.at_rates(run_in(MAIN, config), rates_of, seed=seed_list[0])
            try:
                protocol.weights(run, train_it)
            except protocol.Unfinished:
                left_out.append(f"the weights of {run.name}, for the loss by token frequency")
    if not rows:  # its finished runs are reported, and kept, as they land
        raise protocol.Unfinished(left_out[0])
    return rows, left_out


EXPERIMENT["search"] = search


def cross(run, r, carried, train_it):
    """The headline cell's first seed: the body at r/2, r, 2r with the carried embeddings' rate, then
    the embeddings at half, once and twice it with the best body rate; {pair: outcome}."""
    body = protocol.sweep(run, train_it, (("lr", (r / 2, r, 2 * r)), ("emb_lr", (carried,))))
    lr = dict(min(body, key=lambda p: body[p].loss))["lr"]
    return {**body, **protocol.sweep(run, train_it, (("lr", (lr,)), ("emb_lr", (carried / 2, carried, 2 * carried))))}


# ----------------------------------------------------------------------------- its tables

def tables(runs, exp, results):
    frequency = results.get("experiments", {}).get("emb_lr", {}).get("measurements", {})
    return [("verdict", verdict_table, verdict_table(runs, results)), ("pairs", pairs_table, pairs_table(runs)),
            ("main job, two rates", main_job_table, main_job_table(runs)),
            ("decay control", control_table, control_table(runs, results)),
            ("loss by token frequency", frequency_table, frequency_table(frequency))]


def measurements(runs, shape, held):
    """The validation loss by token frequency (diagnostics.loss_by_frequency, on the validation
    sequences train.py evaluates) of each block's one-rate run and best pair in the main cell,
    first seed, from their weights (protocol.weights); kept while those stay the runs measured."""
    first = [r for r in runs if r["seed"] == 1337 and cell_of(r) == MAIN and r["role"] in ("sweep", "final")]
    measured = {config: {"one rate": r["name"] for r in first if r["config"] == config and rates(r) == (ONE_RATE[MAIN][config],) * 2}
                | {"two rates": r["name"] for r in first if r["config"] == config and r["role"] == "final"} for config in TUNED}
    measured = {config: names for config, names in measured.items() if len(names) == 2}
    if held and held.get("runs") == measured or not measured:
        return held or {}
    by_name = {r["name"]: protocol.run_of(r) for r in first}
    folders = {(config, kind): by_name[name].folder / "weights" for config, names in measured.items() for kind, name in names.items()}
    if not all((folder / "ckpt.pt").exists() for folder in folders.values()):
        return held or {}
    settings = next(iter(by_name.values())).settings()
    meta, paths = prepare_data.open_prepared(Path(plan.TRAINING.get("data_dir", "data")) / settings["dataset"], settings["block_size"])
    offsets = prepare_data.spread_offsets(int(meta["val_tokens"]), settings["eval_tokens"] // settings["block_size"], settings["block_size"])
    buckets = {f"{config} {kind}": loss_by_frequency(load_model(folder, "cpu", "reproduce.py")[0], paths, offsets,
                                                     settings["block_size"], n_tokens=meta["vocab_size"])
               for (config, kind), folder in folders.items()}
    reported = {r["name"]: r["val_loss"] for r in first}  # and each retrained run's, as it ended
    retrained = {f"{config} {kind}": [reported[measured[config][kind]], protocol.read_records(folder / "log.jsonl")[-1]["val_loss"]]
                 for (config, kind), folder in folders.items()}
    return dict(runs=measured, by_frequency=buckets, retrained=retrained)


def figures(plt, runs, exp, results):
    """Tables only."""
    return {}


CELL_NAMES = {MAIN: "the main job's: BPE 6 x 128, 800 steps, float32", HEADLINE: "the headline's: BPE 6 x 256, 800 steps, bf16",
              BYTES: "bytes 6 x 256, 800 steps, float32"}


def rates(r):
    """(body rate, embeddings' rate) of a row: a one-rate run's are equal."""
    return r["lr"], r["flags"].get("emb_lr", r["lr"])


def arm(runs, cell, config, role="final"):
    """The rows of config in cell in role, the first seed first."""
    return sorted((r for r in runs if r["config"] == config and r["role"] == role and cell_of(r) == cell),
                  key=lambda r: seed_order(r["seed"]))


def one_rate(results, cell, config):
    """The committed one-rate runs of config in cell (ONE_RATE_RUNS' final runs), by seed."""
    return arm([r for r in results["runs"] if r["experiment"] == ONE_RATE_RUNS[cell]], cell, config)


def edges(runs, cell, config, best):
    """The axes on whose edge best, a pair, sits among the pairs its first seed tried (for the main
    cell its grid's axes; for the headline's, the body's at best's embeddings' rate and back)."""
    tried = [rates(r) for r in runs if r["config"] == config and r["seed"] == 1337 and cell_of(r) == cell
             and r["role"] in ("sweep", "final")]
    axes = [("body", {lr for lr, emb in tried if emb == best[1]}, best[0]), ("embeddings", {emb for lr, emb in tried if lr == best[0]}, best[1])]
    return [name for name, values, value in axes if len(values) > 1 and value in (min(values), max(values))]


def verdict_table(runs, results):
    """The rule's verdict, cell by cell (written before any run: its module's docstring): each block's
    best pair (the body's rate / the embeddings'; a pair on an edge of its search says so), its final
    loss against its own one-rate run, seed by seed; each shaped block's paired gap to Pre-LN with one
    rate and with two (mean, min to max over seeds, then per seed, then without the first seed), the
    verdict on the two-rate gap (leads: below zero on every seed; trails: above; else level), and
    the rate's share of the one-rate gap (two-rate gap minus one-rate gap, points of it)."""
    lines = ["| cell | block | best pair | against its one-rate run | gap to pre_ln, one rate | with two rates | per seed "
             "| without the first seed | verdict | the rate's share |", "|---|---|---|---|---|---|---|---|---|---|"]
    pct = "{:+.1f}%"
    for cell in (MAIN, HEADLINE, BYTES):
        base, base_one = arm(runs, cell, "pre_ln"), one_rate(results, cell, "pre_ln")
        for config in TUNED:
            rs, one = arm(runs, cell, config), one_rate(results, cell, config)
            if not rs:
                lines.append(f"| {CELL_NAMES[cell]} | {config} | not finished | | | | | | | |")
                continue
            best = rates(rs[0])
            on_edge = edges(runs, cell, config, best) if cell != BYTES else []
            pair = f"{best[0]:g} / {best[1]:g}" + (f" (on the {' and '.join(on_edge)} edge)" if on_edge else "")
            own = spread(paired_gaps(rs, one), pct)
            if config == "pre_ln" or not base:
                lines.append(f"| {CELL_NAMES[cell]} | {config} | {pair} | {own} | | {'' if config == 'pre_ln' else 'pre_ln not finished'} | | | | |")
                continue
            two_gaps = paired_gaps(rs, base)
            seeds = {r["seed"] for r in rs} & {b["seed"] for b in base}
            one_gaps = paired_gaps([r for r in one if r["seed"] in seeds], base_one)  # on the seeds of the two-rate gaps
            later = [g for r, g in zip(rs, two_gaps) if r["seed"] != 1337]
            side = verdict(two_gaps).removeprefix("within 2%; ")
            called = {"ahead on every seed": "leads", "behind on every seed": "trails"}.get(side, f"level ({side})")
            share = statistics.fmean(two_gaps) - statistics.fmean(one_gaps) if one_gaps and two_gaps else None
            lines.append(f"| {CELL_NAMES[cell]} | {config} | {pair} | {own} | {spread(one_gaps, pct)} | {spread(two_gaps, pct)} "
                         f"| {', '.join(pct.format(g) for g in two_gaps)} | {spread(later, pct)} | {called} "
                         f"| {'' if share is None else f'{share:+.1f} of {statistics.fmean(one_gaps):+.1f} points'} |")
    said = {None: "not decided yet", True: "yes", False: "no"}[better(runs, results)]
    return "\n".join(lines) + ("\n\nTwo rates train every block better (each block's best pair ends below its one-rate "
                               f"run on every seed of the main job's cell; then train.py's CPU preset takes the pairs): {said}.")


def better(runs, results):
    """The rule's "two rates train every block better": each block's best pair ends below its one-rate
    run on every seed of the main cell (None while a block's search is not finished)."""
    gaps = [paired_gaps(arm(runs, MAIN, config), one_rate(results, MAIN, config)) for config in TUNED]
    return all(g < 0 for gs in gaps for g in gs) if all(gaps) else None


def main_job_table(runs):
    """`python train.py` on CPU with each block's best pair in the main job's cell (train.py's preset
    where two rates train every block better): the val loss along its first seed's run, and the
    final loss of the first two seeds; a block whose two are not run yet is left out."""
    return curve_table({config: arm(runs, MAIN, config) for config in TUNED},
                       lambda r: "lr {:g}, emb_lr {:g}".format(*rates(r)), MAIN.steps)


def pairs_table(runs, cells=(MAIN, HEADLINE), seeds=False):
    """Each block's runs over its pairs, the body's rate (rows) by the embeddings' (columns), in the
    main cell and the headline's: the final validation loss per seed, first seed first (bold: the
    best pair; a pair with both rates equal is the one-rate run; seeds: each loss with its seed)."""
    lines = []
    for cell in cells:
        for config in TUNED:
            rs = [r for r in runs if r["config"] == config and r["role"] in ("sweep", "check", "final", "so far")
                  and cell_of(r) == cell and "emb_weight_decay" not in r["flags"]]
            if rs:
                lines += [f"{config}, {CELL_NAMES[cell]}:", "", pair_grid(rs, rates, "lr", "emb_lr", seeds), ""]
    return "\n".join(lines).rstrip() or "Not run yet."


def so_far(runs):
    """The report's view of the finished runs of a search not finished yet: its grids, each loss
    with its seed, the bytes cell's runs too."""
    return pairs_table(runs, (MAIN, HEADLINE, BYTES), seeds=True)


def control_table(runs, results):
    """Was it the rate or its decay? AdamW's decay is decoupled (a step shrinks a weight by rate x
    decay), so a k times faster embeddings' rate also decays them k times faster. Each block's best
    pair in the main cell, first seed, against the same pair with the embeddings' decay divided by k
    (the decay per step of one rate), and its one-rate run."""
    lines = ["| block | best pair | its final loss | with one rate's decay per step (embeddings' decay) | one rate | "
             "the gain kept with one rate's decay |", "|---|---|---|---|---|---|"]
    for config in TUNED:
        first = [[r for r in rs if r["seed"] == 1337] for rs in (arm(runs, MAIN, config), arm(runs, MAIN, config, "control"),
                                                                   one_rate(results, MAIN, config))]
        if first[0] and len(set(rates(first[0][0]))) == 1:
            lines.append(f"| {config} | {rates(first[0][0])[0]:g}, one rate | {loss_text(first[0][0])} | no control: one rate is best | | |")
            continue
        if not all(first):
            lines.append(f"| {config} | not finished | | | | |")
            continue
        (b,), (c,), (o,) = first
        losses = (o["val_loss"], c["val_loss"], b["val_loss"])
        kept = None if None in losses or o["val_loss"] == b["val_loss"] else (losses[0] - losses[1]) / (losses[0] - losses[2])
        lines.append(f"| {config} | {rates(b)[0]:g} / {rates(b)[1]:g} | {loss_text(b)} | {loss_text(c)} ({c['flags']['emb_weight_decay']:.3g}) "
                     f"| {loss_text(o)} | {'' if kept is None else f'{kept:.0%}'} |")
    return "\n".join(lines)


def frequency_table(measured):
    """Does the lead live in the rare tokens, whose embedding rows get few updates? The validation
    loss by the predicted token's frequency in the training text (tokens ranked by their count,
    bucketed), main cell, first seed: each block's loss with one rate and with its best pair, and
    each shaped block's gap to Pre-LN in each bucket, with one rate and with two."""
    if not measured.get("by_frequency"):
        return "Not measured yet: the weights of each block's one-rate run and best pair are not trained yet."
    got = measured["by_frequency"]
    lines = ["| tokens (by train count, ranks) | share of targets | " + " | ".join(f"{c}: one rate / two" for c in TUNED)
             + " | " + " | ".join(f"{c}'s gap to pre_ln: one rate / two" for c in TUNED[1:]) + " |", "|---|---|" + "---|" * 5]
    loss = lambda key, b: got[key][b][3] if key in got and got[key][b][3] is not None else float("nan")
    for b, (first, last, share, _) in enumerate(got[next(iter(got))]):
        cells = [f"{loss(f'{c} one rate', b):.3f} / {loss(f'{c} two rates', b):.3f}" for c in TUNED]
        gaps = [" / ".join(f"{100 * (loss(f'{c} {k}', b) / loss(f'pre_ln {k}', b) - 1):+.1f}%" for k in ("one rate", "two rates"))
                for c in TUNED[1:]]
        lines.append(f"| {first:,} to {last:,} | {share:.1%} | " + " | ".join(cells + gaps) + " |")
    again = measured.get("retrained", {})  # the weights measured are a run trained again: its loss beside the reported one
    return "\n".join(lines) + ("\n\nThe runs trained again for their weights, each final loss as reported, then as "
                               "trained again: " + "; ".join(f"{key} {a:.4f}, {b:.4f}" for key, (a, b) in again.items()) if again else "")
