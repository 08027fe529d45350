"""
May the study's new cells train in bf16 (1.5-1.9x faster steps on CPUs with native bf16)? The GPT
comparison's cell trained in bf16 at its float32 tuned rates, on its seeds. The rule, written
before it ran (bf16_check): yes if every shaped block's paired gap to pre_ln in bf16, seed by seed,
lies within 1 point of the range of its float32 gaps.
"""

from reproduction import plan
from reproduction.tables import finals, losses, paired_gaps, regime_rows, spread

EXPERIMENT = dict(
    objective="clm",
    flags={},
    tuned=("pre_ln", "sas", "sas_p"),
    rates=dict(pre_ln=(2e-3,), sas=(4e-3,), sas_p=(2e-3,)),
    run_flags=(("dtype", "bfloat16"),),
    scales={"default": dict(n_layer=6, n_head=4, n_embd=256, warmup_frac=0.2, tokens="bpe", steps=(800,))})


def tables(runs, exp, results):
    regime = [r for r in results["runs"] if r["experiment"] == "regime"]
    return [("bf16 check", bf16_check, bf16_check(runs, regime, exp))]


def figures(plt, runs, exp, results):
    """A table only."""
    return {}


def bf16_check(runs, regime, exp):
    """bf16's check: each shaped block's paired gap to pre_ln in bf16 (the comparison's cell at its
    float32 tuned rates), seed by seed, against the range of its float32 gaps in that cell. The rule,
    written before the check ran: bf16 keeps the verdict if every bf16 gap lies within 1 point of
    the float32 range; then the study's new cells may train in bf16, each cell's dtype said."""
    spec = exp["scales"]["default"]
    cell = plan.Cell(spec["n_layer"], spec["n_head"], spec["n_embd"], spec["steps"][-1], warmup_frac=spec["warmup_frac"],
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
