"""
How do tokens favour the shaped blocks? Both start as the identity map (nearly: SAS's MLP branch is
down-weighted, not 0), the model as its embedding and output head; Pre-LN adds its random
sub-blocks' outputs to the stream from the first step. pre_ln_zero is Pre-LN started as the
identity (reproduction/zero_init.py), tuned alike in --quick's cell (4K tokens: the shaped blocks
ahead on every seed) and in the bytes cell of that shape (6 x 128, 800 steps: behind on every
seed); the others are the factor study's runs. The rule, written before any pre_ln_zero run
(identity_verdict): starting as the identity is how the shaped blocks lead on tokens if pre_ln_zero
is ahead of pre_ln on every seed there and closes at least half of SAS's lead; and it is why the
tokens matter if, besides, on bytes it gains at most half as much (its mean gap there at least
half its mean gap on tokens).
"""

import statistics

from reproduction import plan
from reproduction.plan import QUICK_CANDIDATES
from reproduction.tables import gap_text, paired_gaps, regime_rows, regime_sweeps, spread

EXPERIMENT = dict(
    objective="clm",
    flags={},
    tuned=("pre_ln", "sas", "sas_p", "pre_ln_zero"),
    scales={"default": dict(cells=[QUICK_CANDIDATES[0], dict(n_layer=6, n_head=4, n_embd=128, steps=800, warmup_frac=0.2)])})


def tables(runs, exp, results):
    return [("identity", identity_table, identity_table(runs, exp)),
            ("identity sweeps", regime_sweeps, regime_sweeps(runs, exp))]



def identity_table(runs, exp):
    """Starting as the identity: Pre-LN with its output matrices zero at init (pre_ln_zero), SAS and
    SAS-P, each against Pre-LN seed by seed, in a cell of tokens and a cell of bytes: each one's
    tuned rate and paired gap (mean, min to max over seeds); then the rule's verdict."""
    cells = plan.cells("default", "identity")
    by_cell = regime_rows(runs, exp)
    lines = ["| cell | pre_ln lr | " + " | ".join(f"{c}: lr, paired gap" for c in exp["tuned"][1:]) + " |",
             "|---|---|" + "---|" * (len(exp["tuned"]) - 1)]
    for cell in cells:
        configs = by_cell.get(cell, {})
        if "pre_ln" not in configs:
            lines.append(f"| {cell.label} | not finished |" + " |" * (len(exp["tuned"]) - 1))
            continue
        gaps = [f"{configs[c][0]['lr']:g}, {gap_text(configs[c], configs['pre_ln'])}" if c in configs else "not finished"
                for c in exp["tuned"][1:]]
        lines.append(f"| {cell.label} | {configs['pre_ln'][0]['lr']:g} | " + " | ".join(gaps) + " |")
    tokens, byte = (by_cell.get(c, {}) for c in sorted(cells, key=lambda c: c.tokens == "bytes"))
    return "\n".join(lines) + "\n\n" + identity_verdict(tokens, byte)


def identity_verdict(tokens, byte):
    """The rule, written before any pre_ln_zero run: starting as the identity is how the shaped
    blocks lead on tokens if pre_ln_zero is ahead of pre_ln on every seed in the cell of tokens and
    its mean gap is at most half SAS's (it closes at least half of SAS's lead); and it is why the
    tokens matter if, besides, it gains at most half as much on bytes (its mean gap there at least
    half its mean gap on tokens). A stall or a divergence leaves no verdict."""
    arms = [cell.get(c) for cell in (tokens, byte) for c in ("pre_ln", "sas", "pre_ln_zero")]
    if not all(arms):
        return "Starting as the identity: not finished."
    if any(r["status"] != "trained" for rs in arms for r in rs):
        return "Starting as the identity: no verdict (a run stalled or diverged)."
    gaps = lambda cell, config: paired_gaps(cell[config], cell["pre_ln"])
    zero, sas, on_bytes = gaps(tokens, "pre_ln_zero"), gaps(tokens, "sas"), gaps(byte, "pre_ln_zero")
    if max(sas) >= 0:
        return "Starting as the identity: SAS does not lead on tokens on every seed, so there is no lead to explain."
    closes = statistics.fmean(zero) / statistics.fmean(sas)  # the share of SAS's lead pre_ln_zero has
    head = (f"On tokens pre_ln_zero is {spread(zero, '{:+.1f}%')} against pre_ln, SAS {statistics.fmean(sas):+.1f}%; "
            f"on bytes pre_ln_zero is {spread(on_bytes, '{:+.1f}%')}. ")
    if max(zero) >= 0 or closes < 0.5:
        why = "not ahead on every seed" if max(zero) >= 0 else f"it closes {closes:.0%} of SAS's lead, under half"
        return head + f"Starting as the identity is not how the shaped blocks lead on tokens ({why})."
    tokens_matter = statistics.fmean(on_bytes) >= statistics.fmean(zero) / 2
    return head + (f"Starting as the identity is how the shaped blocks lead on tokens (it closes {closes:.0%} of SAS's "
                   "lead), and " + ("why the tokens matter: on bytes it gains at most half as much." if tokens_matter
                                    else "not why the tokens matter: on bytes it gains more than half as much."))
