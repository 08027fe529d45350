"""
What it found: results.json's rows (result_rows), the statistics every verdict uses (a paired gap
per seed stated against its spread), and the tables every experiment's tuning has (tuning_tables),
which the experiments' modules build on.
"""

import json
import math
import statistics

from reproduction import plan, protocol
from reproduction.measure import timed_key
from reproduction.plan import SHARED_LR, arm_flags, cell_of
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

def tuning_tables(runs, exp):
    """The tables of an experiment's tuning: [(title, maker, markdown)]."""
    made = [("tuned", tuned_table), ("sweep", sweep_table), ("stalls", stall_table)]
    made += [("shared_lr", shared_lr_table)] if exp.get("shared_lr") else []
    return [(title, maker, maker(runs, exp)) for title, maker in made]


def rate_text(r):
    """A run's peak rate, or its pair: Muon's / AdamW's, or the body's with the embeddings'."""
    if "muon_lr" in r["flags"]:
        return f"{r['flags']['muon_lr']:g} / {r['lr']:g}"
    return f"{r['lr']:g}, embeddings {r['flags']['emb_lr']:g}" if "emb_lr" in r["flags"] else f"{r['lr']:g}"


def gap_text(rs, base):
    return spread(paired_gaps(rs, base), "{:+.1f}%") if base else "its reference not finished"


def tuned_table(runs, exp):
    """Each tuned config at its tuned rate at every scale point: its spread over seeds, the gap
    to the first config (pre_ln in the reproduction) seed by seed, how often it stalled, and its speed."""
    first = exp["tuned"][0]
    lines = [f"| steps | config | tuned lr | final val loss, mean (min to max) | paired gap to {first}, mean (min to max) "
             f"| verdict | stalled or diverged | s/step | speed vs {first} | s to reach {first}'s final loss |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for steps in sorted({r["steps"] for r in runs if r["role"] == "final"}):
        base = finals(runs, steps, first)  # none while its arm is unfinished
        for config in exp["tuned"]:
            rs = finals(runs, steps, config)
            if not rs:
                continue
            gaps, s = paired_gaps(rs, base), rs[0]["seconds_per_step"]
            speed = base[0]["seconds_per_step"] / s if base and s else math.nan
            lines.append(f"| {steps} | {config} | {rate_text(rs[0])} | {spread(losses(rs))} | "
                         f"{gap_text(rs, base) if config != first else ''} | {verdict(gaps) if config != first else ''} "
                         f"| {stalled_count(rs)} | {s or math.nan:.3f} | {speed:.3f} | {reach_seconds(rs, base) if base else 'n/a'} |")
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


def pair_grid(rs, rates, row_name, column_name, seeds=False):
    """One arm's runs over a pair of rates (rates(row): its row's rate and its column's), a final
    validation loss per seed in each cell, the first seed first (seeds: each loss with its seed, s1337;
    bold: the tuned pair; stalled: it never left the unigram level)."""
    rows, columns = (sorted({rates(r)[i] for r in rs}) for i in (0, 1))
    lines = [f"| {row_name} | " + " | ".join(f"{column_name} {c:g}" for c in columns) + " |", "|---|" + "---|" * len(columns)]
    for row in rows:
        cells = []
        for column in columns:
            at = sorted((r for r in rs if rates(r) == (row, column)), key=lambda r: seed_order(r["seed"]))
            text = " / ".join(loss_text(r) + (f" (s{r['seed']})" if seeds else "") for r in at)
            cells.append(f"**{text}**" if at and at[0]["role"] == "final" else text)
        lines.append(f"| {row:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def curve_table(by_config, rate_label, steps, shown=(0, 100, 200, 400)):
    """`python train.py`'s run on CPU as the README shows it: per config (by_config: its final runs), the
    val loss along its first seed's run, and the final loss of the first two seeds (rate_label(row):
    its rates); a config whose two are not run yet is left out."""
    lines = [f"| CPU default, val loss at step | {' | '.join(map(str, shown))} | {steps} (seed 1337 / seed 1) |",
             "|---" * (len(shown) + 2) + "|"]
    for config, rs in by_config.items():
        rs = sorted(rs, key=lambda r: seed_order(r["seed"]))[:2]
        if [r["seed"] for r in rs] == [1337, 1]:
            curve = dict(rs[0]["curve"])
            lines.append(f"| `{config}` ({rate_label(rs[0])}) | " + " | ".join(f"{curve[step]:.2f}" for step in shown)
                         + " | **" + " / ".join(loss_text(r) for r in rs) + "** |")
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
        for config in [c for c in plan.CONFIGS if any(r["config"] == c for r in at)]:
            rs = sorted((r for r in at if r["config"] == config), key=lambda r: r["seed"])
            gaps = paired_gaps(rs, base)
            lines.append(f"| {steps} | {config} | {rs[0]['params'] / 1e6:.3f}M | {spread(losses(rs))} "
                         f"| {spread(gaps, '{:+.1f}%') if config != 'pre_ln' and gaps else ''} "
                         f"| {verdict(gaps) if config != 'pre_ln' else ''} | {stalled_count(rs)} |")
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


def regime_sweeps(runs, exp):
    """Every tuning run, cell by cell, a row per seed (as sweep_table)."""
    return "\n\n".join(f"{cell.label}:\n\n" + sweep_table([r for r in runs if cell_of(r) == cell], exp)
                        for cell in regime_rows(runs, exp))


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
