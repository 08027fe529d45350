"""
Do the shaped blocks keep up under Muon? The paper's argument leans on Adam (SPEC §2, Eq. 6):
Pre-LN, SAS and SAS-P with AdamW and with Muon, every arm tuned alike, in --quick's regime (its
verdicts are the GPT comparison's, at a fraction of its cost); the AdamW arms are the factor
study's runs in that cell. The rules, written before any Muon run (muon_table): a shaped block
keeps its verdict under Muon if its paired gap to Pre-LN with Muon falls on the side (ahead or
behind on every seed) its gap with AdamW does; Muon is set up well if Pre-LN with Muon is ahead of
Pre-LN with AdamW on every seed, else the comparison under it says little; the learned gains are
described, not tested.

Its committed runs had one rate for both optimizers (--muon_lr = --lr), and Muon orthogonalised
W^Q and W^K as one (2d, d) matrix, in bf16 (train.py now takes them apart, and a float32 run's
Newton-Schulz runs in float32): they are that setting's runs, not what train.py's Muon computes now.
"""

import statistics

from reproduction import plan
from reproduction.figures import band, tuning_figures
from reproduction.tables import finals, gap_text, paired_gaps, rate_text, tuning_tables, verdict

EXPERIMENT = dict(
    objective="clm",
    flags={},
    tuned=("pre_ln", "sas", "sas_p", "pre_ln_muon", "sas_muon", "sas_p_muon"),
    scales={"default": dict(n_layer=6, n_head=4, n_embd=128, warmup_frac=0.2, tokens="bpe4096", steps=(400,))})


def tables(runs, exp, results):
    return [("muon", muon_table, muon_table(runs, exp)), *tuning_tables(runs, exp)]


def figures(plt, runs, exp, results):
    """The tuning's figures, each block's curves with AdamW beside those with Muon."""
    return tuning_figures(plt, runs, exp, curves=optimizer_figure)


def muon_table(runs, exp):
    """The optimizer as a factor, by the rules written before any Muon run (its module's docstring):
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


def optimizer_figure(plt, runs, exp, steps, what):
    """The muon experiment's: validation loss per step of each block with AdamW and, beside it,
    with Muon, at the tuned rates, over seeds."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, (optimizer, suffix) in zip(axes, (("AdamW", ""), ("Muon on the blocks' matrices", "_muon"))):
        for block in [c for c in exp["tuned"] if not c.endswith("_muon")]:
            if rs := finals(runs, steps, block + suffix):
                band(ax, rs, 1, plan.COLORS[block], f"{block} (lr {rate_text(rs[0])}, {len(rs)} seeds)")
        ax.set(xlabel="step", title=f"{optimizer}, {steps} steps (band: seeds)")
        ax.legend(fontsize=8)
    axes[0].set_ylabel(f"validation loss ({what}, nats)")
    return fig
