"""
The GPT comparison (claim 4, `python reproduce.py`): Pre-LN, SAS and SAS-P, each tuned at every
scale point, next-token prediction in the paper's GPT recipe (train.py's defaults, SPEC §4); and at
one shared rate on every seed, at scale points (-1 the largest, 0 the smallest), the failure
baselines (their lag shows early, and cheaply), each paired with Pre-LN.

Its scales are the model, its tokens, its regime (plan.REGIME) and the run lengths (steps) that are
the scale points. default: the factor study's choice (regime.chosen_regime), GPT-2 BPE, 6 x 256,
4 heads of 64, batch 16, 20% warmup. quick: the choice of its own rule (regime.quick_regime):
GPT-2's first 4,096 tokens, 6 x 128, 400 steps, where SAS and SAS-P are ahead on every seed, as in
default. longer: lengths each block is tuned at on 3 rates around its tuned rate at the longest of
steps, its best then on every seed. large is the record on bytes (a 3,200-step run took ~27
minutes of a core); on BPE one takes ~1 hour of 2 cores, its 15 runs ~15 hours.
"""

from reproduction import measure, plan
from reproduction.figures import tuning_figures
from reproduction.tables import finals

EXPERIMENT = dict(
    objective="clm",
    flags={},
    tuned=("pre_ln", "sas", "sas_p"),
    shared_lr=dict(pre_ln=(0, -1), parallel=(-1,), sas_p_nonorm=(-1,), v_skipinit=(0,), skipless=(0,)),
    scales={
        "quick": dict(n_layer=6, n_head=4, n_embd=128, warmup_frac=0.2, tokens="bpe4096", steps=(400,)),
        "default": dict(n_layer=6, n_head=4, n_embd=256, warmup_frac=0.2, tokens="bpe", steps=(200, 800)),
        "large": dict(n_layer=6, n_head=4, n_embd=256, warmup_frac=0.2, steps=(200, 800), longer=(3200,)),
    })


def measurements(runs, shape, held):
    """Claim 3: each block's token similarity by layer at init, on this experiment's tokens and shape."""
    return {"similarity_at_init": measure.similarity_at_init(shape)}


def figures(plt, runs, exp, results):
    """The tuning's figures, the token similarity at init and the learned gains."""
    steps_list = sorted({r["steps"] for r in runs if r["role"] == "final"})
    similarity = results["experiments"]["clm"]["measurements"]["similarity_at_init"]
    made = {**tuning_figures(plt, runs, exp), "rank_collapse": similarity_figure(plt, similarity),
            "gains": gains_figure(plt, runs, steps_list)}
    return {name: fig for name, fig in made.items() if fig is not None}


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
        ax.plot(range(len(s)), s, color=plan.COLORS[config], label=config + (" (flat: attention = I at init)" if flat else ""),
                **style)
    ax.set(xlabel="layer (0: embeddings)", ylabel="mean cosine similarity between tokens", ylim=(-0.02, 1.02),
           title="rank collapse at init: tokens grow alike with depth\nwithout a skip or shaped attention")
    ax.legend(fontsize=8, loc="lower right", bbox_to_anchor=(1.0, 0.06))
    return fig


def gains_figure(plt, runs, steps_list):
    """Claim 6 and the learned gains of the tuned SAS and SAS-P (a seed that logged them), at the
    longest length where both did (a run restored from results.json without its gains has none);
    None where they have not."""
    logged = lambda r: any(g for _, g in r.get("gains", ()))
    steps = max((s for s in steps_list if all(any(map(logged, finals(runs, s, c))) for c in ("sas", "sas_p"))), default=None)
    if steps is None:
        return None
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
