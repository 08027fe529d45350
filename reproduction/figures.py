"""
What it looks like: the README's figures, from results.json alone (figures), and any train.py
runs side by side (plot_runs, --plot). Needs matplotlib; without it the tables are still written.
"""

import math
import statistics
from pathlib import Path

import numpy as np
import torch

import train
from reproduction import experiments as ex
from reproduction.experiments import PATH_FIGURES, SHARED_LR, arm_flags
from reproduction.tables import (at_shared_rate, chosen_regime, finals, losses, paired_gaps, regime_rows, tuning_and_rescue,
                                 tuning_runs, vocabulary_cells)


def figures(name, results, assets):
    """The README's figures for an experiment, from results.json alone."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("reproduce: matplotlib is not installed (pip install matplotlib); no figures")
        return
    exp = ex.EXPERIMENTS[name]
    runs = [r for r in results["runs"] if r["experiment"] == name]
    if name in ("bf16", "rows", "identity"):  # tables only
        return
    if name == "outliers":
        runs = tuning_and_rescue(runs)[1]
    steps_list = sorted({r["steps"] for r in runs if r["role"] == "final"})
    if name == "regime":
        made = {"map": regime_figure(plt, runs, exp), "vocabulary": vocabulary_figure(plt, runs, exp)}
    elif name == "path":
        made = path_figures(plt, runs, exp, steps_list[-1])
    else:
        what = "next-token" if exp["objective"] == "clm" else "masked-token"
        made = {"lr_sweep": lr_sweep_figure(plt, runs, exp, steps_list, what),
                "val_loss": (optimizer_figure if name == "muon" else curves_figure)(plt, runs, exp, steps_list[-1], what)}
        if len(steps_list) > 1:
            made["gap_vs_scale"] = gap_figure(plt, runs, exp, steps_list)
        if name == "clm":
            made["rank_collapse"] = similarity_figure(plt, results["similarity_at_init"])
            made["gains"] = gains_figure(plt, runs, steps_list)
        if any(r["status"] == "stalled" for r in runs):
            made["stalls"] = stalls_figure(plt, runs, exp)
        if name == "outliers":
            made["kurtosis"] = kurtosis_figure(plt, runs, exp, steps_list[-1])
    prefix = "" if name == "clm" else f"{name}_"
    for figure_name, fig in made.items():
        fig.tight_layout()
        fig.savefig(assets / f"{prefix}{figure_name}.png", dpi=110)
        plt.close(fig)


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
            ax.plot([r["lr"] for r in first], [r["val_loss"] for r in first], marker="o", color=ex.COLORS[config], label=config)
            for r in rs:
                if r["seed"] != 1337 and r["val_loss"] is not None:
                    ax.plot([r["lr"]], [r["val_loss"]], marker=".", ls="", color=ex.COLORS[config])
                if r["status"] != "trained":
                    ax.plot([r["lr"]], [top if r["val_loss"] is None else r["val_loss"]], marker="x", ms=10,
                            color=ex.COLORS[config])
            tuned = finals(runs, steps, config)
            ax.plot([tuned[0]["lr"]], [statistics.fmean(losses(tuned))], marker="*", ms=15, color=ex.COLORS[config])
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
        gaps = [paired_gaps(finals(runs, s, config), finals(runs, s, first)) for s in steps_list]
        means = [statistics.fmean(g) for g in gaps]
        ax.errorbar(steps_list, means, yerr=[[m - min(g) for m, g in zip(means, gaps)], [max(g) - m for m, g in zip(means, gaps)]],
                    marker="o", capsize=4, color=ex.COLORS[config], label=f"{config}, each at its tuned lr")
        shared = [paired_gaps(*[sorted((r for r in runs if r["steps"] == s and r["config"] == c and r["lr"] == SHARED_LR
                                        and not arm_flags(r)), key=lambda r: r["seed"]) for c in (config, first)])
                  for s in steps_list]
        if exp.get("shared_lr") and all(shared):
            ax.plot(steps_list, [statistics.fmean(g) for g in shared], "--", marker="o", color=ex.COLORS[config],
                    label=f"{config}, all at lr 1e-3")
    ax.axhline(0, color="grey", lw=0.5)
    for y in (2, -2):
        ax.axhline(y, color="grey", lw=0.5, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xticks(steps_list, [str(s) for s in steps_list])
    ax.minorticks_off()
    ax.set(xlabel=f"training steps ({ex.TRAINING['batch_size']} x {ex.TRAINING['block_size']} tokens each)",
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
        rs = finals(runs, steps, config)
        label = f"{config} (lr {rs[0]['lr']:g}, {len(rs)} seeds)"
        for ax, scale in ((by_step, 1), (by_time, rs[0]["seconds_per_step"])):
            band(ax, rs, scale, ex.COLORS[config], label)
    by_step.set(xlabel="step", ylabel=f"validation loss ({what}, nats)", title=f"per step, {steps} steps (band: seeds)")
    by_time.set(xlabel="training seconds (steps x bench.py's s/step)", title="per second")
    by_step.legend(fontsize=8)
    return fig


def optimizer_figure(plt, runs, exp, steps, what):
    """The muon experiment's: validation loss per step of each block with AdamW and, beside it,
    with Muon, at the tuned rates, over seeds."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, (optimizer, suffix) in zip(axes, (("AdamW", ""), ("Muon on the blocks' matrices", "_muon"))):
        for block in [c for c in exp["tuned"] if not c.endswith("_muon")]:
            if rs := finals(runs, steps, block + suffix):
                band(ax, rs, 1, ex.COLORS[block], f"{block} (lr {rs[0]['lr']:g}, {len(rs)} seeds)")
        ax.set(xlabel="step", title=f"{optimizer}, {steps} steps (band: seeds)")
        ax.legend(fontsize=8)
    axes[0].set_ylabel(f"validation loss ({what}, nats)")
    return fig


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
            ax.plot(steps_at, values.mean(0), color=ex.COLORS[config], label=f"{config} (lr {rs[0]['lr']:g})")
            ax.fill_between(steps_at, values.min(0), values.max(0), color=ex.COLORS[config], alpha=0.2, lw=0)
        ax.set(xlabel="step", yscale="log", title=f"at {which} ({steps} steps; band: seeds)")
        ax.legend(fontsize=8)
    axes[0].set(ylabel="residual stream's kurtosis, mean over layers")
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


def similarity_figure(plt, similarity):
    """Claim 3: token similarity per layer at init. The shaped blocks' lines coincide (their
    attention is the identity at init, so every layer keeps the embeddings' similarity): each is
    drawn in a style of its own, and the legend says so."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    flats = 0
    for config, s in similarity.items():
        flat = max(s) - min(s) < 0.02  # nothing mixed the tokens: the shaped blocks
        style = dict(marker="osv^"[flats % 4], ms=7, ls="--", markevery=(flats % 4, 4)) if flat else dict(marker="o", ms=3)
        flats += flat  # each flat line marks other layers, so that all of them show
        ax.plot(range(len(s)), s, color=ex.COLORS[config], label=config + (" (flat: attention = I at init)" if flat else ""),
                **style)
    ax.set(xlabel="layer (0: embeddings)", ylabel="mean cosine similarity between tokens", ylim=(-0.02, 1.02),
           title="rank collapse at init: tokens grow alike with depth\nwithout a skip or shaped attention")
    ax.legend(fontsize=8, loc="lower right", bbox_to_anchor=(1.0, 0.06))
    return fig


def gains_figure(plt, runs, steps_list):
    """Claim 6 and the learned gains of the tuned SAS and SAS-P (a seed that logged them), at the
    longest length where both did: a run restored from results.json without its gains has none."""
    logged = lambda r: any(g for _, g in r.get("gains", ()))
    steps = max(s for s in steps_list if all(any(map(logged, finals(runs, s, c))) for c in ("sas", "sas_p")))
    sas_p = next(r for r in finals(runs, steps, "sas_p") if logged(r))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for config in ("sas", "sas_p"):
        r = next(r for r in finals(runs, steps, config) if logged(r))
        axes[0].plot([i for i, _ in r["gains"]], [g["value_beta_over_alpha"][0] for _, g in r["gains"]], label=config)
    axes[0].set(xlabel="step", title="first-layer value: beta_V / alpha_V")
    axes[0].legend()
    end = sas_p["gains"][-1][1]
    for key in ("alpha", "beta", "gamma"):
        axes[1].plot(range(len(end[key])), end[key], marker="o", label=f"{key} (end)")
    axes[1].axhline(1.0, color="grey", lw=0.5)
    axes[1].set(xlabel="layer", title=f"sas_p (lr {sas_p['lr']:g}) shaped-attention gains (init 1)")
    axes[1].legend()
    for layer in range(0, len(end["beta_ff"]), 3):
        axes[2].plot([i for i, _ in sas_p["gains"]], [g["beta_ff"][layer] for _, g in sas_p["gains"]], label=f"layer {layer}")
    axes[2].set(xlabel="step", title="sas_p beta_FF")
    axes[2].legend()
    return fig


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
                        color=ex.COLORS[config], label=config if config not in ax.get_legend_handles_labels()[1] else None)
            ax.plot(gaps, [yk] * len(gaps), "|", ms=6, color=ex.COLORS[config], alpha=0.7)  # each seed
            tuning = tuning_runs(runs, cell, config)
            stalls = sum(r["status"] != "trained" for r in tuning)
            ax.annotate(f"{stalls}/{len(tuning)}", (max(gaps), yk), textcoords="offset points", xytext=(5, -3),
                        fontsize=7, color=ex.COLORS[config])
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
        vocab, other_T = ex.tokens_of(cell.tokens)[2], cell.block_size != ex.TRAINING["block_size"]
        for k, config in enumerate(configs):
            gaps = paired_gaps(at.get(config, []), at["pre_ln"])
            if not gaps or any(math.isinf(g) for g in gaps):
                continue
            mean, x = statistics.fmean(gaps), vocab * 1.08 ** (2 * k - 1 + 3 * other_T)
            label = f"{config}, T {cell.block_size}" if other_T else config
            ax.errorbar([x], [mean], yerr=[[mean - min(gaps)], [max(gaps) - mean]], marker="o", capsize=4,
                        mfc="white" if other_T else ex.COLORS[config], color=ex.COLORS[config],
                        label=label if label not in ax.get_legend_handles_labels()[1] else None)
    ax.axhline(0, color="grey", lw=0.7)
    ax.set_xscale("log")
    ticks = sorted({ex.tokens_of(cell.tokens)[2] for cell in vocabulary_cells(runs, exp)})
    ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
    ax.minorticks_off()
    ax.set(xlabel="vocabulary (padded to a multiple of 64)", ylabel="final val loss above pre_ln's, same seed (%)",
           title="the shaped blocks against Pre-LN, by vocabulary\n(6 x 256, 800 steps; bars: the range over 3 seeds)")
    ax.legend()
    return fig


def path_figures(plt, runs, exp, steps):
    """The paper's path: Fig. 3 (loss against fixed beta), Fig. 4 (trained V/P gains per layer),
    Fig. 25 (the MLP skip) with the small ablations as paired gaps, and Fig. 6 (depth)."""
    main = [r for r in runs if not arm_flags(r)]  # not the depth runs
    depth = [r for r in runs if r["flags"].get("mlp_ratio")]
    made = {"fig3_vp_beta": vp_beta_figure(plt, main, steps),
            "fig4_vp_gains": vp_gains_figure(plt, main, steps),
            "fig25_ablations": ablations_figure(plt, main, steps),
            "fig6_depth": depth_figure(plt, depth, exp, steps) if depth else None}
    return {name: fig for name, fig in made.items() if fig is not None}


def error_bars(groups):
    """Matplotlib's yerr of a mean per group: from each group's min to its max."""
    means = [statistics.fmean(g) for g in groups]
    return means, [[m - min(g) for m, g in zip(means, groups)], [max(g) - m for m, g in zip(means, groups)]]


def vp_beta_figure(plt, main, steps):
    """Fig. 3: final loss against the fixed beta of V and P, per W_init, beside the tuned blocks."""
    fig, ax = plt.subplots(figsize=(6.5, 4.4))
    for w_init, marker in (("identity", "o"), ("orthogonal", "s")):
        betas, groups = [], []
        for beta in (0.0, 0.2, 0.5, 1.0):
            rs = finals(main, steps, f"vp_{w_init}_{beta:g}")
            if rs:
                betas.append(beta)
                groups.append(losses(rs))
        means, yerr = error_bars(groups)
        ax.errorbar(betas, means, yerr=yerr, marker=marker, capsize=4, label=f"V, P = W_init + beta dW, W_init {w_init}")
    for config, style in (("pre_ln", "--"), ("sas", ":"), ("v_skipinit", "-.")):
        rs = finals(main, steps, config)
        ax.axhline(statistics.fmean(losses(rs)), ls=style, color=ex.COLORS[config], label=f"{config} (tuned)")
    ax.set(xlabel="beta of V and P (fixed)", ylabel="final validation loss (nats)",
           title=f"Fig. 3 in miniature: restricting V/P updates ({steps} steps; bars: seeds)")
    ax.legend(fontsize=8)
    return fig


def vp_gains_figure(plt, main, steps):
    """Fig. 4: the trained beta/alpha of V and P per layer over training (first seed); None without it."""
    r = next((r for r in finals(main, steps, "vp_trainable") if "gains" in r), None)
    if r is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for ax, key in zip(axes, ("value_beta_over_alpha", "proj_beta_over_alpha")):
        n = len(r["gains"][0][1][key])
        for layer in range(n):
            ax.plot([i for i, _ in r["gains"]], [g[key][layer] for _, g in r["gains"]],
                    color=plt.cm.viridis(layer / max(1, n - 1)), label=f"layer {layer + 1}" if layer in (0, n - 1) else None)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set(xlabel="step", title=f"Fig. 4 in miniature: {key.split('_')[0]} beta/alpha (init 0.2)")
        ax.legend()
    axes[0].set_ylabel("beta / alpha")
    return fig


def ablations_figure(plt, main, steps):
    """Fig. 25's loss curves (the MLP skip), and every small ablation's paired gap to its reference."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    for config, style in (("sas", "-"), ("sas_p", "-"), ("sas_no_mlp_skip", "--"), ("sas_no_mlp_skip_leaky", ":")):
        rs = finals(main, steps, config)
        if rs:
            band(axes[0], rs, 1, ex.COLORS[config], f"{config} (lr {rs[0]['lr']:g})", style)
    axes[0].set(xlabel="step", ylabel="validation loss (nats)", title="Fig. 25 in miniature: the MLP skip (band: seeds)")
    axes[0].legend(fontsize=8)
    labels, gaps = [], []
    for figure in ("12", "13", "23", "24", "25"):
        configs, reference = PATH_FIGURES[figure]
        for config in configs:
            g = paired_gaps(finals(main, steps, config), finals(main, steps, reference))
            if g and not any(math.isinf(x) for x in g):
                labels.append(f"Fig. {figure}: {config}\nvs {reference}")
                gaps.append(g)
    for i, g in enumerate(gaps):
        axes[1].plot([statistics.fmean(g)], [i], "o", color="C0")
        axes[1].plot([min(g), max(g)], [i, i], "-", color="C0")
    axes[1].axvline(0, color="grey", lw=0.5)
    axes[1].set_yticks(range(len(labels)), labels, fontsize=7)
    axes[1].set(xlabel="final val loss above the reference's, same seed (%)", title="each ablation, paired (line: seeds)")
    return fig


def depth_figure(plt, depth, exp, steps):
    """Fig. 6: each block's final loss at depth L and 4L (the depth runs), each at its tuned rate."""
    fig, ax = plt.subplots(figsize=(6.5, 4.4))
    layers = sorted({r["n_layer"] for r in depth})
    for config in exp["depth"]["configs"]:
        groups = [losses(finals(depth, steps, config, n_layer=L)) for L in layers]
        if all(groups):
            means, yerr = error_bars(groups)
            ax.errorbar(layers, means, yerr=yerr, marker="o", capsize=4, color=ex.COLORS[config], label=config)
    ax.set_xscale("log", base=2)
    ax.set_xticks(layers, [str(L) for L in layers])
    ax.minorticks_off()
    ax.set(xlabel="layers (MLP width 2d)", ylabel="final validation loss (nats)",
           title=f"Fig. 6 in miniature: depth ({steps} steps, width {depth[0]['n_embd']}; bars: seeds)")
    ax.legend()
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
        records = train.read_records(Path(folder) / "log.jsonl")
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
