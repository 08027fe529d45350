"""
Does the headline's lead hold at 4x its length? The comparison's cell with GPT-2's BPE cut to its
first 16,384 tokens (the full BPE's cell needs native bf16 to afford 3,200 steps; here both shaped
blocks lead on every seed at 800 steps, as with full BPE): the factor study's 800-step runs there,
and 3,200 steps with each block tuned on 3 rates around its 800-step rate, its best on every seed;
float32 as the 800-step runs. The rule, durability's, written before any 3,200-step run
(durability.durability_table).
"""

from reproduction.experiments import durability

EXPERIMENT = dict(
    objective="clm",
    flags={},
    tuned=("pre_ln", "sas_p", "sas"),  # the headline's blocks first
    scales={"default": dict(n_layer=6, n_head=4, n_embd=256, warmup_frac=0.2, tokens="bpe16384", steps=(800,),
                            longer=(3200,))})
tables = durability.tables  # its rule is durability's, and so are its tables
