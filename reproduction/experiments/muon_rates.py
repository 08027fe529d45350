"""
Muon as its users run it: is the shaped blocks' loss of their lead under Muon (the muon experiment)
theirs, or the one rate it gave both optimizers? Here W^Q and W^K are orthogonalised apart (in
float32, as float32 runs do) and the two rates are tuned alike: the blocks' matrices with Muon at
--muon_lr, everything else (embeddings and the tied head, norms, gains) with AdamW at --lr. In
--quick's cell (GPT-2's first 4,096 tokens, 6 x 128, 400 steps, 20% warmup, float32), Pre-LN, SAS
and SAS-P with Muon, each on one grid of pairs (PAIRS: Muon's rate 4e-3 to 3.2e-2 by factors of 2,
AdamW's 8e-3 to 6.4e-2; the best pairs measured before this grid was set, 8e-3 / 3.2e-2 for Pre-LN
and 1.6e-2 / 3.2e-2 for SAS-P, lie inside it), an axis grown by factors of 2 while the best pair
sits at its edge and trains; the whole grid on the first seed, its 2 best pairs on the second, the
better mean on the third: the protocol's, on pairs. The AdamW arms are the factor study's runs in
this cell, as in muon.

The rule, written before any of its runs, is muon's (muon.muon_table): a shaped block keeps its
AdamW verdict under Muon if its paired gap to Pre-LN with Muon, each at its best pair, falls on the
same side (ahead or behind on every seed); else not, the side it falls on or that the sign varies.
Muon is set up well if Pre-LN with Muon is ahead of Pre-LN with AdamW on every seed, else the
comparison under it says little. How much each block cares about each rate: the pairs' table and
heat maps; what Muon does to the shaped blocks' identity start (W_Q = 0, so A = I at init): how far
A is from I over the warmup, with each optimizer at its tuned rates. Descriptions, not tests.
"""

import math

import numpy as np

from reproduction import measure, protocol
from reproduction.experiments.muon import muon_table, optimizer_figure
from reproduction.figures import lr_sweep_figure
from reproduction.tables import pair_grid, rate_text, tuned_table, tuning_tables
from train_config import warmup_steps

EXPERIMENT = dict(
    objective="clm",
    flags={},
    tuned=("pre_ln", "sas", "sas_p", "pre_ln_muon", "sas_muon", "sas_p_muon"),
    pairs=dict(configs=("pre_ln_muon", "sas_muon", "sas_p_muon"),
               grid=(("muon_lr", (4e-3, 8e-3, 1.6e-2, 3.2e-2)), ("lr", (8e-3, 1.6e-2, 3.2e-2, 6.4e-2)))),
    scales={"default": dict(n_layer=6, n_head=4, n_embd=128, warmup_frac=0.2, tokens="bpe4096", steps=(400,))})


SHAPED = ("sas", "sas_muon", "sas_p", "sas_p_muon")  # the blocks that start as the identity, each optimizer
START = (0, 1, 2, 5, 10, 20, 40, 80)  # the steps identity_table shows (of 400, 80 the warmup's last)


def tables(runs, exp, results):
    """The rule's table, the pairs', every arm's tuned rates, the identity start, and the AdamW arms'
    sweeps and stalls."""
    adamw = [r for r in runs if r["config"] not in exp["pairs"]["configs"]]
    start = results.get("experiments", {}).get("muon_rates", {}).get("measurements", {})
    return [("muon rates", muon_table, muon_table(runs, exp)), ("pairs", pairs_table, pairs_table(runs, exp)),
            ("tuned", tuned_table, tuned_table(runs, exp)), ("identity start", identity_table, identity_table(runs, start)),
            *[made for made in tuning_tables(adamw, dict(exp, tuned=exp["tuned"][:3])) if made[0] != "tuned"]]


def pairs_table(runs, exp):
    """Each Muon arm's runs by its pair of rates, a row per Muon rate, a column per AdamW rate: the
    final validation loss per seed (bold: the tuned pair; stalled: the run never left the unigram
    level)."""
    lines = []
    for config in exp["pairs"]["configs"]:
        rs = [r for r in runs if r["config"] == config and r["role"] in ("sweep", "check", "final")]
        lines += [f"{config}, Muon's rate (rows) by AdamW's (columns), a loss per seed:", "",
                  pair_grid(rs, lambda r: (r["flags"]["muon_lr"], r["lr"]), "muon_lr", "lr"), ""] if rs else [f"{config}: not finished."]
    return "\n".join(lines).rstrip()


def measurements(runs, shape, held):
    """The identity start (measure.identity_start) of SAS and SAS-P, seed 1337, at the tuned AdamW
    rate and at the tuned Muon pair, over the warmup's steps; once all four are tuned, and kept
    while they stay the tuned runs."""
    tuned = {r["config"]: r for r in runs if r["role"] == "final" and r["seed"] == 1337 and r["config"] in SHAPED}
    names = {config: r["name"] for config, r in sorted(tuned.items())}
    if held and held.get("runs") == names:
        return held
    if len(tuned) < len(SHAPED):
        return {}
    settings = protocol.run_of(tuned["sas"]).settings()
    steps = warmup_steps(settings["warmup_frac"], settings["max_iters"])
    return dict(runs=names, identity_start={config: measure.identity_start(protocol.run_of(r), steps)
                                            for config, r in tuned.items()})


def identity_table(runs, start):
    """How fast shaped attention leaves the identity it starts as (W_Q = 0, so A = I at init), with
    each optimizer at its tuned rates, seed 1337: after each step, ||A - I||_F / ||I||_F, then the
    entropy of A's softmax part (nats: C's at step 0, falling as attention sharpens), each a mean
    over layers, heads and 8 validation sequences (measure.identity_start)."""
    named = {r.get("name"): r for r in runs if r["role"] == "final"}
    if not start.get("identity_start") or not set(start["runs"].values()) <= set(named):  # or an arm is unfinished
        return "Not measured: SAS's and SAS-P's tuning, with each optimizer, is not finished."
    trajectories = start["identity_start"]
    steps = [s for s in START if s < len(next(iter(trajectories.values())))]
    lines = ["| block | lr | " + " | ".join(f"step {s}" for s in steps) + " |", "|---|---|" + "---|" * len(steps)]
    for config in SHAPED:
        trajectory = trajectories[config]
        rate = rate_text(named[start["runs"][config]])
        lines.append(f"| {config} | {rate} | " + " | ".join(f"{trajectory[s][0]:.3f} / {trajectory[s][1]:.2f}" for s in steps) + " |")
    return "\n".join(lines)


def figures(plt, runs, exp, results):
    """A heat map of each Muon arm's first-seed losses over the pairs, the AdamW arms' sweeps, and
    each block's curves with AdamW beside those with Muon."""
    steps = max(r["steps"] for r in runs)
    adamw = [r for r in runs if r["config"] not in exp["pairs"]["configs"]]
    return {"pairs": pairs_figure(plt, runs, exp), "lr_sweep": lr_sweep_figure(plt, adamw, dict(exp, tuned=exp["tuned"][:3]), [steps], "next-token"),
            "val_loss": optimizer_figure(plt, runs, exp, steps, "next-token")}


def pairs_figure(plt, runs, exp):
    """Per Muon arm, its first seed's final loss over (Muon's rate, AdamW's rate), written in each
    cell (x: stalled or diverged)."""
    configs = exp["pairs"]["configs"]
    fig, axes = plt.subplots(1, len(configs), figsize=(4.6 * len(configs), 4.2), squeeze=False)
    first = [r for r in runs if r["config"] in configs and r["seed"] == 1337 and r["role"] in ("sweep", "final")]
    losses = [r["val_loss"] for r in first if r["val_loss"] is not None]
    low = min(losses, default=0.0)
    top = min(max(losses, default=1.0), 1.05 * low)  # a colour scale over the best 5%: one bad corner would flatten the rest
    for ax, config in zip(axes[0], configs):
        rs = [r for r in first if r["config"] == config]
        if not rs:
            ax.set_axis_off()
            ax.set_title(f"{config}: not trained yet")
            continue
        muon_lrs, lrs = sorted({r["flags"]["muon_lr"] for r in rs}), sorted({r["lr"] for r in rs})
        grid = np.full((len(muon_lrs), len(lrs)), math.nan)
        for r in rs:
            grid[muon_lrs.index(r["flags"]["muon_lr"]), lrs.index(r["lr"])] = math.nan if r["val_loss"] is None else r["val_loss"]
            label = f"{r['val_loss']:.3f}" if r["status"] == "trained" else "x"
            dark = r["val_loss"] is not None and r["val_loss"] > (low + top) / 2  # viridis_r: high losses are dark
            ax.text(lrs.index(r["lr"]), muon_lrs.index(r["flags"]["muon_lr"]), label, ha="center", va="center", fontsize=8,
                    color="white" if dark else "black")
        image = ax.imshow(grid, origin="lower", cmap="viridis_r", vmin=low, vmax=top)
        ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs])
        ax.set_yticks(range(len(muon_lrs)), [f"{lr:g}" for lr in muon_lrs])
        ax.set(xlabel="AdamW's rate (--lr)", ylabel="Muon's rate (--muon_lr)", title=f"{config}, seed 1337")
        fig.colorbar(image, ax=ax, label="final validation loss")
    return fig
