"""
Do the simplified blocks keep up as encoders (the paper's Table 1, but V-SkipInit)? Masked language
modelling with bidirectional attention in the paper's Crammed-BERT recipe as far as train.py has it
(SPEC §7), every block tuned as in clm and compared with Pre-LN seed by seed, by the same verdict.
"""

from reproduction.plan import BERT

EXPERIMENT = dict(
    objective="mlm",
    flags=BERT,
    tuned=("pre_ln", "parallel", "sas", "sas_p", "sas_p_nonorm"),
    scales={
        "quick": dict(n_layer=12, n_head=2, n_embd=64, steps=(150,)),
        "default": dict(n_layer=12, n_head=2, n_embd=64, steps=(600,)),
        "large": dict(n_layer=12, n_head=4, n_embd=128, steps=(2000,)),
    })
