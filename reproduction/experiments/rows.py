"""
The vocabulary's size to the model, or the tokens themselves? 16K-BPE's tokens differ from 4K-BPE's
(longer, rarer, more of them in use) and the model has 4x the rows of embedding and head. Here:
4K-BPE's tokens with 16K-BPE's rows (the 16K cell's model; the rows no token uses are only pushed
down by the softmax) in the comparison's cell shape, each block at its rates tuned in the 4K and
the 16K cells of that shape (one rate where they agree), the better by mean loss, on 3 seeds. The
rule, written before it ran (rows_verdict): for each shaped block, the share of its gap's move from
the 4K to the 16K cell that the rows alone make; at least 3/4 for both: the rows; at most 1/4 for
both: the tokens; else neither cleanly (3 seeds know a share to about +-1/4).
"""

import statistics

from reproduction import plan
from reproduction.tables import finals, gap_text, losses, paired_gaps, regime_rows, spread

EXPERIMENT = dict(
    objective="clm",
    flags={},
    tuned=("pre_ln", "sas", "sas_p"),
    rates=dict(pre_ln=(2e-3,), sas=(4e-3, 8e-3), sas_p=(4e-3,)),
    scales={"default": dict(n_layer=6, n_head=4, n_embd=256, warmup_frac=0.2, tokens="bpe4096_rows16384", steps=(800,))})


def tables(runs, exp, results):
    regime = [r for r in results["runs"] if r["experiment"] == "regime"]
    return [("rows", rows_table, rows_table(runs, regime, exp))]


def figures(plt, runs, exp, results):
    """A table only."""
    return {}


def rows_table(runs, regime, exp):
    """The vocabulary's size to the model apart from its tokens: each block's paired gap to pre_ln
    with 4K-BPE's tokens and 16K-BPE's rows (the rows check), beside its gap in the factor study's 4K
    and 16K cells of that shape, seed by seed, each at its rate; then the rule's verdict (rows_verdict)."""
    spec = exp["scales"]["default"]
    tokens, _, rows = spec["tokens"].partition("_rows")
    cell = lambda kind: plan.Cell(spec["n_layer"], spec["n_head"], spec["n_embd"], spec["steps"][-1],
                                  warmup_frac=spec["warmup_frac"], tokens=kind)
    by_cell = regime_rows(regime, exp)
    check = {config: finals(runs, spec["steps"][-1], config) for config in exp["tuned"]}
    cells = [check, by_cell.get(cell(tokens), {}), by_cell.get(cell(f"bpe{rows}"), {})]
    few, many = f"BPE-{int(tokens[3:]) // 1024}K", f"BPE-{int(rows) // 1024}K"
    lines = [f"| config | paired gap: {few}'s tokens, {many}'s rows | {few} cell | {many} cell |", "|---|---|---|---|"]
    for config in exp["tuned"]:
        gaps = [(f"{gap_text(c[config], c['pre_ln'])} " if config != "pre_ln" else "") + f"at {c[config][0]['lr']:g}"
                if c.get(config) and c.get("pre_ln") else "not finished" for c in cells]
        lines.append(f"| {config} | " + " | ".join(gaps) + " |")
    not_taken = {}
    for r in runs:
        if r["role"] == "sweep":
            not_taken.setdefault((r["config"], r["lr"]), []).append(r)
    others = "; ".join(f"{config} at {lr:g}: {spread(losses(rs))}" for (config, lr), rs in not_taken.items())
    own = "; ".join(f"{config} {gap_text(check[config], cells[1][config])}" for config in exp["tuned"]
                    if check[config] and cells[1].get(config))
    return ("\n".join(lines) + (f"\n\nFinal losses at the rates not taken (another had the better mean): {others}." if others else "")
            + (f"\n\nEach block's loss with {many}'s rows against its loss in the {few} cell, seed by seed: {own}." if own else "")
            + "\n\n" + rows_verdict(*cells))


def rows_verdict(check, few, many):
    """The rule, written before the rows check ran: for each shaped block, the share of its mean paired
    gap's move from the cell of few tokens (4K) to the cell of many (16K) that the many rows alone make
    (the check: the few tokens, the many rows), to 2 decimals. At least 3/4 for both shaped blocks: the
    lead follows the rows, the vocabulary's size to the model; at most 1/4 for both: the tokens
    themselves; else neither cleanly (3 seeds know a share to about +-1/4). A stall or a divergence
    leaves no verdict, and so does a block whose gap does not move towards a lead."""
    arms = [cell.get(c) for cell in (check, few, many) for c in ("pre_ln", "sas", "sas_p")]
    if not all(arms):
        return "The vocabulary's rows: not finished."
    if any(r["status"] != "trained" for rs in arms for r in rs):
        return "The vocabulary's rows: no verdict (a run stalled or diverged)."
    mean_gap = lambda cell, config: statistics.fmean(paired_gaps(cell[config], cell["pre_ln"]))
    shares = {}
    for config in ("sas", "sas_p"):
        move = mean_gap(many, config) - mean_gap(few, config)
        if move >= 0:
            return f"The vocabulary's rows: no verdict ({config}'s gap does not move towards a lead with the vocabulary)."
        shares[config] = round((mean_gap(check, config) - mean_gap(few, config)) / move, 2) + 0.0  # + 0.0: no -0
    said = f"The rows alone make {'; '.join(f'{config} {share:.0%}' for config, share in shares.items())} of the move"
    if all(share >= 0.75 for share in shares.values()):
        return f"{said}: the lead follows the rows, the vocabulary's size to the model."
    if all(share <= 0.25 for share in shares.values()):
        return f"{said}: the lead follows the tokens themselves, not the vocabulary's size to the model."
    return f"{said}: neither cleanly."
