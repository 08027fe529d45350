"""
Do the simplified blocks grow outlier features (arXiv 2405.19279)? In the GPT comparison's regime on
bytes (6 x 256), every arm tuned as there, and every arm at one shared rate too: larger rates grow
outliers, and the shaped blocks tune higher. An evaluation every 50 steps (16, not 8, points of
kurtosis per run) makes these runs of their own: the comparison's were logged before the
statistics were. The verdicts, written before any of its runs: an arm has fewer (more) outlier
features than pre_ln if its kurtosis (mean over layers, at the end) is below (above) pre_ln's on
every seed, seed by seed, at the tuned and at the shared rate alike (else: the rate decides, not
the block); OP keeps pre_ln's loss if its paired gap is within 2% on every seed; QK-norm rescues a
stalled run if that run with it leaves the unigram level. Whether more outliers go with less
learned per step: the arms ranked by both, a description (5 arms), not a test.

The rescue: does QK-norm save the shaped runs that stalled in the factor study's cell 1 (12 x 128,
200 steps, 5% warmup)? Each again, the same rate and seed, with it.
"""

import statistics

import numpy as np

from reproduction import plan
from reproduction.figures import tuning_figures
from reproduction.plan import SHARED_LR
from reproduction.tables import (at_shared_rate, finals, gap_text, kurtosis_of, logged, loss_text, losses, seed_order,
                                 spread, stalled_count, tuning_tables)

EXPERIMENT = dict(
    objective="clm",
    flags={},
    tuned=("pre_ln", "op", "sas_p", "sas_p_nonorm", "sas_p_qknorm"),
    shared_lr=dict(pre_ln=(-1,), op=(-1,), sas_p=(-1,), sas_p_nonorm=(-1,), sas_p_qknorm=(-1,)),
    scales={
        "quick": dict(n_layer=6, n_head=2, n_embd=64, warmup_frac=0.2, steps=(100,), eval_interval=10,
                      rescue=dict(n_layer=6, n_head=2, n_embd=64, steps=100, runs=[("sas_p", 8e-3, 1337)])),
        "default": dict(n_layer=6, n_head=4, n_embd=256, warmup_frac=0.2, steps=(800,), eval_interval=50,
                        rescue=dict(n_layer=12, n_head=4, n_embd=128, steps=200, runs=[
                            ("sas", 2e-3, 2), ("sas", 8e-3, 1337), ("sas_p", 2e-3, 2), ("sas_p", 8e-3, 1337)])),
    })


def tables(runs, exp, results):
    """Its tables, then the usual ones of its tuning, the rescue's runs apart."""
    rescue, runs = tuning_and_rescue(runs)
    return ([("outliers", outlier_table, outlier_table(runs, exp))]
            + ([("rescue", rescue_table, rescue_table(rescue, exp))] if rescue else []) + tuning_tables(runs, exp))


def figures(plt, runs, exp, results):
    """The tuning's figures (the rescue's runs apart) and the kurtosis along training."""
    runs = tuning_and_rescue(runs)[1]
    steps = max(r["steps"] for r in runs if r["role"] == "final")
    return {**tuning_figures(plt, runs, exp), "kurtosis": kurtosis_figure(plt, runs, exp, steps)}


def tuning_and_rescue(runs):
    """The outliers experiment's rows: (the rescue's, the rest)."""
    return [r for r in runs if r["role"] in ("stalled", "rescue")], [r for r in runs if r["role"] not in ("stalled", "rescue")]


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


def kurtosis_figure(plt, runs, exp, steps):
    """The residual stream's kurtosis over training, averaged over layers (the second paper's kind
    of figure), per arm at its tuned rate and at the shared rate: the mean over seeds, shaded
    from min to max."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, (which, pick) in zip(axes, (("its tuned rate", lambda c: finals(runs, steps, c)),
                                        (f"one shared rate, {SHARED_LR:g}", lambda c: at_shared_rate(runs, steps, c)))):
        for config in exp["tuned"]:
            rs = [r for r in pick(config) if r.get("kurtosis") and r["status"] != "diverged"]
            if not rs:
                continue
            steps_at = [i for i, _ in rs[0]["kurtosis"]]
            values = np.array([[statistics.fmean(ks) for _, ks in r["kurtosis"]] for r in rs])
            ax.plot(steps_at, values.mean(0), color=plan.COLORS[config], label=f"{config} (lr {rs[0]['lr']:g})")
            ax.fill_between(steps_at, values.min(0), values.max(0), color=plan.COLORS[config], alpha=0.2, lw=0)
        ax.set(xlabel="step", yscale="log", title=f"at {which} ({steps} steps; band: seeds)")
        ax.legend(fontsize=8)
    axes[0].set(ylabel="residual stream's kurtosis, mean over layers")
    return fig
