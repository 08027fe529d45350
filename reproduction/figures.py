"""
What it looks like: the figures every experiment's tuning has (tuning_figures), the drawing helpers
the experiments' own figures share, and any train.py runs side by side (plot_runs, --plot). Needs
matplotlib; without it the tables are still written.
"""

import statistics
from pathlib import Path

import numpy as np
import torch

from common import read_records
from reproduction import plan
from reproduction.plan import SHARED_LR, arm_flags
from reproduction.tables import finals, losses, paired_gaps


def tuning_figures(plt, runs, exp, curves=None):
    """{name: figure} of an experiment's tuning: final loss against rate, the loss curves at the longest
    length (curves: another figure of them), the gap against length if it has two, its stalls."""
    steps_list = sorted({r["steps"] for r in runs if r["role"] == "final"})
    what = "next-token" if exp["objective"] == "clm" else "masked-token"
    made = {"lr_sweep": lr_sweep_figure(plt, runs, exp, steps_list, what),
            "val_loss": (curves or curves_figure)(plt, runs, exp, steps_list[-1], what)}
    if len(steps_list) > 1:
        made["gap_vs_scale"] = gap_figure(plt, runs, exp, steps_list)
    if any(r["status"] == "stalled" for r in runs):
        made["stalls"] = stalls_figure(plt, runs, exp)
    return made


def lr_sweep_figure(plt, runs, exp, steps_list, what):
    """The paper's tuning curves: final loss against peak learning rate, one panel per length;
    the first seed's sweep as lines, the other seeds as dots; stalled and diverged runs marked."""
    fig, axes = plt.subplots(1, len(steps_list), figsize=(5.5 * len(steps_list) + 0.5, 4.2), sharey=True, squeeze=False)
    for ax, steps in zip(axes[0], steps_list):
        at = [r for r in runs if r["steps"] == steps and r["role"] in ("sweep", "check", "final")]
        top = max(r["val_loss"] for r in at if r["val_loss"] is not None)
        for config in exp["tuned"]:
            rs = sorted((r for r in at if r["config"] == config), key=lambda r: r["lr"])
            first = [r for r in rs if r["seed"] == 1337 and r["status"] != "diverged"]
            ax.plot([r["lr"] for r in first], [r["val_loss"] for r in first], marker="o", color=plan.COLORS[config], label=config)
            for r in rs:
                if r["seed"] != 1337 and r["val_loss"] is not None:
                    ax.plot([r["lr"]], [r["val_loss"]], marker=".", ls="", color=plan.COLORS[config])
                if r["status"] != "trained":
                    ax.plot([r["lr"]], [top if r["val_loss"] is None else r["val_loss"]], marker="x", ms=10,
                            color=plan.COLORS[config])
            if tuned := finals(runs, steps, config):  # none while its arm is unfinished
                ax.plot([tuned[0]["lr"]], [statistics.fmean(losses(tuned))], marker="*", ms=15, color=plan.COLORS[config])
        lrs = sorted({r["lr"] for r in at})
        ax.set_xscale("log", base=2)
        ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs])
        ax.minorticks_off()
        ax.set(xlabel="peak learning rate", title=f"{steps} steps (line: seed 1337; dots: other seeds;\n"
                                                   "star: tuned rate, mean; x: stalled or diverged)")
    axes[0][0].set_ylabel(f"final validation loss ({what}, nats)")
    axes[0][0].legend()
    return fig


def gap_figure(plt, runs, exp, steps_list):
    """The paired gap to the first config's final loss against run length, tuned (mean, min-max bars over
    seeds) and at the shared rate."""
    fig, ax, first = *plt.subplots(figsize=(6.5, 4.4)), exp["tuned"][0]
    for config in exp["tuned"][1:]:
        at = [(s, g) for s in steps_list if (g := paired_gaps(finals(runs, s, config), finals(runs, s, first)))]
        if not at:  # its arms unfinished
            continue
        lengths, gaps = zip(*at)
        means = [statistics.fmean(g) for g in gaps]
        ax.errorbar(lengths, means, yerr=[[m - min(g) for m, g in zip(means, gaps)], [max(g) - m for m, g in zip(means, gaps)]],
                    marker="o", capsize=4, color=plan.COLORS[config], label=f"{config}, each at its tuned lr")
        shared = [paired_gaps(*[sorted((r for r in runs if r["steps"] == s and r["config"] == c and r["lr"] == SHARED_LR
                                        and not arm_flags(r)), key=lambda r: r["seed"]) for c in (config, first)])
                  for s in steps_list]
        if exp.get("shared_lr") and all(shared):
            ax.plot(steps_list, [statistics.fmean(g) for g in shared], "--", marker="o", color=plan.COLORS[config],
                    label=f"{config}, all at lr 1e-3")
    ax.axhline(0, color="grey", lw=0.5)
    for y in (2, -2):
        ax.axhline(y, color="grey", lw=0.5, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xticks(steps_list, [str(s) for s in steps_list])
    ax.minorticks_off()
    ax.set(xlabel=f"training steps ({plan.TRAINING['batch_size']} x {plan.TRAINING['block_size']} tokens each)",
           ylabel=f"final val loss above {first}'s, same seed (%)", title=f"the gap to {first} against run length (bars: seeds)")
    ax.legend(fontsize=8)
    return fig


def band(ax, rs, scale, color, label, style="-"):
    """A loss curve: the mean over seeds, shaded from min to max."""
    curves = [r["curve"][1:] for r in rs if r["status"] != "diverged"]  # iter 0 (loss ~ln 320) squashes the rest
    if not curves:
        return
    steps = [i * scale for i, _ in curves[0]]
    values = np.array([[loss for _, loss in c] for c in curves])
    ax.plot(steps, values.mean(0), style, color=color, label=label)
    if len(curves) > 1:
        ax.fill_between(steps, values.min(0), values.max(0), color=color, alpha=0.2, lw=0)


def curves_figure(plt, runs, exp, steps, what):
    """Validation loss per step and per second (bench.py's s/step) at the tuned rates, over seeds."""
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for config in exp["tuned"]:
        if not (rs := finals(runs, steps, config)):  # its arm unfinished
            continue
        label = f"{config} (lr {rs[0]['lr']:g}, {len(rs)} seeds)"
        for ax, scale in ((by_step, 1), (by_time, rs[0]["seconds_per_step"])):
            band(ax, rs, scale, plan.COLORS[config], label)
    by_step.set(xlabel="step", ylabel=f"validation loss ({what}, nats)", title=f"per step, {steps} steps (band: seeds)")
    by_time.set(xlabel="training seconds (steps x bench.py's s/step)", title="per second")
    by_step.legend(fontsize=8)
    return fig


def stalls_figure(plt, runs, exp):
    """What a stall looks like: every run of the tuned configs, validation loss and the token
    similarity of the last block's output over training, stalled runs in red."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5), sharex="col")
    for col, steps in enumerate(sorted({r["steps"] for r in runs if r["role"] == "final"})[:2]):
        for r in runs:
            if r["steps"] == steps and r["config"] in exp["tuned"] and r["status"] != "diverged" and r["similarity"]:
                stalled = r["status"] == "stalled"
                style = dict(color="C3" if stalled else "grey", alpha=0.9 if stalled else 0.35, lw=1.2 if stalled else 0.8)
                axes[0][col].plot(*zip(*r["curve"][1:]), **style)
                axes[1][col].plot(*zip(*r["similarity"]), **style)
        axes[0][col].set(title=f"{steps} steps: every tuning run of {', '.join(exp['tuned'])} (red: stalled)",
                         ylabel="validation loss (nats)")
        axes[1][col].set(xlabel="step", ylabel="token similarity, last block")
    return fig


# ----------------------------------------------------------------------------- --plot

def run_rate(folder):
    """The peak learning rate a train.py run trained at, from its checkpoint (None without one)."""
    path = Path(folder) / "ckpt.pt"
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)["config"]["lr"]
    except Exception:  # unreadable: the plot goes on without it
        return None


def plot_runs(folders, out):
    """Any train.py runs side by side (--plot): validation loss per step and per training second,
    and the learned gains (mean over layers) per step."""
    logs = {}
    for folder in dict.fromkeys(str(Path(f)) for f in folders):  # each once
        records = read_records(Path(folder) / "log.jsonl")
        if not records:
            raise SystemExit(f"reproduce: error: --plot {folder}: no log.jsonl with evaluations in it "
                             "(the --out_dir of a train.py run that has evaluated at least once)")
        logs[folder] = records
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("reproduce: error: --plot needs matplotlib (pip install matplotlib)") from None
    fig, (by_step, by_time, gains) = plt.subplots(1, 3, figsize=(17, 4.6))
    styles = dict(beta_ff="-", beta_sa="--", alpha_ff=":", alpha="-.", beta=(0, (1, 3)), gamma=(0, (5, 5)))
    for i, (folder, records) in enumerate(logs.items()):
        color, later = f"C{i % 10}", records[1:] or records  # iter 0 squashes the rest
        label = f"{folder} (lr {lr:g})" if (lr := run_rate(folder)) else folder
        by_step.plot([r["iter"] for r in later], [r["val_loss"] for r in later], color=color, label=label)
        timed = [r for r in later if "elapsed_s" in r]  # logs of older versions lack it
        by_time.plot([r["elapsed_s"] for r in timed], [r["val_loss"] for r in timed], color=color, label=folder)
        for key, style in styles.items():
            if key in records[0].get("gains", {}):
                gains.plot([r["iter"] for r in records], [statistics.fmean(r["gains"][key]) for r in records],
                           ls=style, color=color, label=f"{Path(folder).name}: {key}")
    by_step.set(xlabel="step", ylabel="validation loss (nats)", title="per step")
    by_time.set(xlabel="training seconds (the runs' own clocks)", title="per second")
    gains.set(xlabel="step", title="learned gains, mean over layers")
    by_step.legend(fontsize=8)
    if gains.lines:
        gains.legend(fontsize=7)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"reproduce: {len(logs)} runs plotted in {out}")
