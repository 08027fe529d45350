"""
Does the shaped blocks' lead on tokens hold at 4x the length? In --quick's regime (its verdicts are
the GPT comparison's): the factor study's 400-step runs there, and 1,600 steps with each block
tuned there on 3 rates around its 400-step rate, its best on every seed; float32 as those (bf16 is
1.04-1.09x faster here: a 4K head is small). The rule, written before any 1,600-step run
(durability_table): a shaped block's lead holds if it is ahead of Pre-LN on every seed at 1,600
steps; besides, it grows (shrinks) if its gap there is below (above) its 400-step gap on every
seed, else it keeps about its size.
"""

from reproduction.tables import finals, paired_gaps, spread, tuning_tables, verdict

EXPERIMENT = dict(
    objective="clm",
    flags={},
    tuned=("pre_ln", "sas", "sas_p"),
    scales={"default": dict(n_layer=6, n_head=4, n_embd=128, warmup_frac=0.2, tokens="bpe4096", steps=(400,),
                            longer=(1600,))})


def tables(runs, exp, results):
    return [("durability", durability_table, durability_table(runs, exp)), *tuning_tables(runs, exp)]


def durability_table(runs, exp):
    """The lead at 4x the length, by the rule written before any longer run (its module's docstring):
    each shaped block's paired gap to Pre-LN at each length (each block at its rate tuned at that
    length), per seed; the lead holds if it is ahead on every seed at the longer length, and then
    grows (shrinks) if its gap there is below (above) the shorter one's on every seed."""
    short, long = (f(r["steps"] for r in runs if r["role"] == "final") for f in (min, max))
    lines = [f"| block | paired gap to pre_ln, {short} steps | {long} steps | per seed, {short} then {long} steps "
             f"| the lead at {long} steps |", "|---|---|---|---|---|"]
    for block in exp["tuned"][1:]:
        pairs = [(finals(runs, steps, block), finals(runs, steps, exp["tuned"][0])) for steps in (short, long)]
        seeds = [[r["seed"] for r in rs + base] for rs, base in pairs]
        if short == long or not all(seeds) or seeds[0] != seeds[1]:
            lines.append(f"| {block} | not finished | | | |")
            continue
        if any(r["val_loss"] is None for rs, base in pairs for r in rs + base):
            lines.append(f"| {block} | | | | n/a: a run diverged |")
            continue
        gaps = [paired_gaps(*pair) for pair in pairs]
        lines.append(f"| {block} | {spread(gaps[0], '{:+.1f}%')} | {spread(gaps[1], '{:+.1f}%')} | "
                     + ", ".join(f"{a:+.1f}% then {b:+.1f}%" for a, b in zip(*gaps)) + f" | {durability_verdict(*gaps)} |")
    return "\n".join(lines)


def durability_verdict(short, long):
    """The rule's words for one block's per-seed gaps (%) at the shorter and at the longer length."""
    side = verdict(long).removeprefix("within 2%; ")
    if side != "ahead on every seed":
        return f"does not hold: {side}"
    return ("holds and grows" if all(b < a for a, b in zip(short, long)) else
            "holds and shrinks" if all(b > a for a, b in zip(short, long)) else "holds, about its size")
