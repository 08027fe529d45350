"""
The paper's path from Pre-LN to SAS-P, figure by figure: each ablation against the reference it is
compared with, seed by seed (PATH_FIGURES). The references are tuned as in clm (at 12 x 128, 200
steps: the factor study's cell 1); each ablation is tuned on 3 rates around its block's tuned rate
(a full grid per ablation does not fit), one more past an edge, its best rechecked on a second seed
(top_k 1), then every seed. Fig. 6: depth L and 4L, MLP width 2d, beta_FF 0.2 at 18 layers scaled
as 1/sqrt(L).
"""

import math
import statistics

from reproduction import plan
from reproduction.figures import band
from reproduction.plan import CONFIGS, arm_flags
from reproduction.tables import finals, gap_text, losses, paired_gaps, spread, stalled_count, verdict

PATH_FIGURES = {  # the paper's figure: (its configs, the reference each is compared with, seed by seed)
    "3": ([c for c in CONFIGS if c.startswith("vp_") and c != "vp_trainable"], "v_skipinit"),
    "4": (["vp_trainable"], "vp_identity_0.2"),
    "25": (["sas_no_mlp_skip", "sas_no_mlp_skip_leaky"], "sas"),
    "12": (["sas_p_cosine"], "sas_p"),
    "13": (["sas_p_eq4"], "sas_p"),
    "23": (["pre_ln_identity_vp"], "pre_ln"),
    "24": (["sas_p_fixed_first_value"], "sas_p"),
}
EXPERIMENT = dict(
    objective="clm",
    flags={},
    tuned=("pre_ln", "sas", "sas_p", "v_skipinit"),
    around=[config for configs, _ in PATH_FIGURES.values() for config in configs],
    depth=dict(configs=("pre_ln", "sas", "sas_p", "v_skipinit"), mlp_ratio=2, beta_ff_at_18=0.2),
    scales={
        "quick": dict(n_layer=6, n_head=2, n_embd=64, steps=(80,), depth=dict(n_embd=32, n_head=2, layers=(2, 8))),
        "default": dict(n_layer=12, n_head=4, n_embd=128, steps=(200,), depth=dict(n_embd=64, n_head=2, layers=(3, 12))),
    })


def tables(runs, exp, results):
    """The path's table, and the depth's where its runs are in."""
    made = [("path", path_table, path_table(runs, exp))]
    if any(r["flags"].get("mlp_ratio") for r in runs):
        made.append(("depth", depth_table, depth_table(runs, exp)))
    return made


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


def figures(plt, runs, exp, results):
    """The paper's path: Fig. 3 (loss against fixed beta), Fig. 4 (trained V/P gains per layer),
    Fig. 25 (the MLP skip) with the small ablations as paired gaps, and Fig. 6 (depth)."""
    steps = max(r["steps"] for r in runs if r["role"] == "final")
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
        if rs := finals(main, steps, config):  # none while its arm is unfinished
            ax.axhline(statistics.fmean(losses(rs)), ls=style, color=plan.COLORS[config], label=f"{config} (tuned)")
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
            band(axes[0], rs, 1, plan.COLORS[config], f"{config} (lr {rs[0]['lr']:g})", style)
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
            ax.errorbar(layers, means, yerr=yerr, marker="o", capsize=4, color=plan.COLORS[config], label=config)
    ax.set_xscale("log", base=2)
    ax.set_xticks(layers, [str(L) for L in layers])
    ax.minorticks_off()
    ax.set(xlabel="layers (MLP width 2d)", ylabel="final validation loss (nats)",
           title=f"Fig. 6 in miniature: depth ({steps} steps, width {depth[0]['n_embd']}; bars: seeds)")
    ax.legend()
    return fig
