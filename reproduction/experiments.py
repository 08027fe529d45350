"""
What is run: every config (CONFIGS), experiment (EXPERIMENTS) and its scale points, the settings
every run shares (TRAINING, DATASET, GRID), and a run (Run) or a factor-study cell (Cell) as
train.py's flags and an out/repro/ folder. The --blocks registry (register_arms) adds its arms
here too: the registries live in this module alone, so that every module sees the same dicts
(the others read them as ex.CONFIGS, ex.TRAINING, ..., at call time).
"""

import hashlib
from dataclasses import dataclass, fields, replace
from pathlib import Path

import bench
import prepare_data
import train
from simple_gpt import BLOCKS, GPTConfig, switches_of

CONFIGS = {  # a run's model, as train.py's model flags
    "pre_ln": dict(block="pre_ln"),
    "parallel": dict(block="parallel"),
    "sas": dict(block="sas"),
    "sas_p": dict(block="sas_p"),
    "sas_p_nonorm": dict(block="sas_p", norm="none"),
    "v_skipinit": dict(block="v_skipinit"),
    "skipless": dict(block="skipless"),
    # the authors' next paper (arXiv 2405.19279): the OP block, and QK-norm on the shaped blocks
    "op": dict(block="op"),
    "sas_qknorm": dict(block="sas", qk_norm="rmsnorm"),
    "sas_p_qknorm": dict(block="sas_p", qk_norm="rmsnorm"),
    # the paper's path (SPEC §8): Fig. 3, V and P of every layer per Eq. 6, beta fixed
    **{f"vp_{w}_{beta:g}": dict(block="v_skipinit", vp=w, vp_beta=beta)
       for w in ("identity", "orthogonal") for beta in (0.0, 0.2, 0.5, 1.0)},
    "vp_trainable": dict(block="v_skipinit", vp="identity", vp_beta=0.2, vp_trainable=True),  # Fig. 4
    "sas_no_mlp_skip": dict(block="sas", alpha_ff=0.0),  # Fig. 25
    "sas_no_mlp_skip_leaky": dict(block="sas", alpha_ff=0.0, mlp_slope=0.2),  # Fig. 25
    "sas_p_cosine": dict(block="sas_p", schedule="cosine"),  # Fig. 12
    "sas_p_eq4": dict(block="sas_p", attention="skipinit"),  # Fig. 13
    "pre_ln_identity_vp": dict(block="pre_ln", vp="identity"),  # Fig. 23
    "sas_p_fixed_first_value": dict(block="sas_p", first_value=False),  # Fig. 24
    # the optimizer as a factor: Muon on the blocks' weight matrices, AdamW on the rest
    **{f"{block}_muon": dict(block=block, optimizer="muon") for block in ("pre_ln", "sas", "sas_p")},
    # starting as the identity as a factor: Pre-LN with its output matrices zero at init, a block of one's own
    "pre_ln_zero": {"block": "pre_ln_zero", "import": ("reproduction/zero_init.py",)},
}
GRID = (1e-3, 2e-3, 4e-3, 8e-3)  # peak learning rates, the same for every block
MAX_EXTRA = 4  # points the grid may grow by, per block and scale point
TOP_K = 2  # rates rerun on the second seed
SHARED_LR = 1e-3  # the paper's GPT rate: every block's shared-rate runs
BERT = dict(objective="mlm", mask_prob=0.25, beta1=0.9, beta2=0.98, grad_clip=0.5, warmup_frac=0.75)
BERT_BETA_FF = 0.05  # the paper's BERT's initial beta_FF, for the blocks that have one
PATH_FIGURES = {  # the paper's figure: (its configs, the reference each is compared with, seed by seed)
    "3": ([c for c in CONFIGS if c.startswith("vp_") and c != "vp_trainable"], "v_skipinit"),
    "4": (["vp_trainable"], "vp_identity_0.2"),
    "25": (["sas_no_mlp_skip", "sas_no_mlp_skip_leaky"], "sas"),
    "12": (["sas_p_cosine"], "sas_p"),
    "13": (["sas_p_eq4"], "sas_p"),
    "23": (["pre_ln_identity_vp"], "pre_ln"),
    "24": (["sas_p_fixed_first_value"], "sas_p"),
}
# --quick's regime, chosen by a rule written before any of these ran (tables.quick_regime): the
# first of them, cheapest first (steps x bench.py's seconds per step), whose verdict for SAS and
# SAS-P agrees with the GPT comparison's; each a cell of the factor study (3 seeds), run in order
# until one agrees
QUICK_CANDIDATES = [
    dict(n_layer=6, n_head=4, n_embd=128, steps=400, warmup_frac=0.2, tokens="bpe4096"),  # ~0.42 s a step here
    dict(n_layer=6, n_head=4, n_embd=128, steps=800, warmup_frac=0.2, tokens="bpe4096"),
]
EXPERIMENTS = {
    "clm": dict(
        objective="clm",
        flags={},  # train.py's defaults: the paper's GPT recipe (SPEC §4)
        tuned=("pre_ln", "sas", "sas_p"),  # claim 4's subjects, tuned at every scale point
        # at the shared rate on every seed, at scale points: -1 the largest, 0 the smallest (the
        # failure baselines: their lag shows early, and cheaply); Pre-LN, paired with them
        shared_lr=dict(pre_ln=(0, -1), parallel=(-1,), sas_p_nonorm=(-1,), v_skipinit=(0,), skipless=(0,)),
        # the model, its tokens, its regime (REGIME) and the run lengths (steps) that are the scale
        # points: the factor study's choice (chosen_regime), GPT-2 BPE, 6 x 256, 4 heads of 64,
        # batch 16, 20% warmup; quick, the choice of its own rule (quick_regime): GPT-2's first
        # 4,096 tokens, 6 x 128, 400 steps, where SAS and SAS-P are ahead on every seed, as here.
        # longer: lengths each block is tuned at on 3 rates around its tuned rate at the longest of
        # steps, its best then on every seed. large is the record on bytes (a 3,200-step run
        # took ~27 minutes of a core); on BPE one takes ~1 hour of 2 cores, its 15 runs ~15 hours
        scales={
            "quick": dict(n_layer=6, n_head=4, n_embd=128, warmup_frac=0.2, tokens="bpe4096", steps=(400,)),
            "default": dict(n_layer=6, n_head=4, n_embd=256, warmup_frac=0.2, tokens="bpe", steps=(200, 800)),
            "large": dict(n_layer=6, n_head=4, n_embd=256, warmup_frac=0.2, steps=(200, 800), longer=(3200,)),
        }),
    "mlm": dict(
        objective="mlm",
        flags=BERT,  # the paper's Crammed-BERT recipe as far as train.py has it (SPEC §7)
        tuned=("pre_ln", "parallel", "sas", "sas_p", "sas_p_nonorm"),  # the paper's Table 1 but V-SkipInit
        scales={
            "quick": dict(n_layer=12, n_head=2, n_embd=64, steps=(150,)),
            "default": dict(n_layer=12, n_head=2, n_embd=64, steps=(600,)),
            "large": dict(n_layer=12, n_head=4, n_embd=128, steps=(2000,)),
        }),
    "regime": dict(
        objective="clm",
        flags={},
        tuned=("pre_ln", "sas", "sas_p"),
        # the factor study: does the gap come from the miniature's regime? Each cell is a model
        # shape, run length, batch, warmup and tokens (Cell), every block tuned in it by the protocol
        # above; the order is the order they train in. Cells 1 and 5 are the GPT comparison's.
        scales={
            "quick": dict(cells=[
                dict(n_layer=6, n_head=2, n_embd=64, steps=100, warmup_frac=0.05),
                dict(n_layer=6, n_head=2, n_embd=64, steps=100, warmup_frac=0.2),
                dict(n_layer=3, n_head=2, n_embd=128, steps=100, warmup_frac=0.05),
                dict(n_layer=3, n_head=2, n_embd=128, steps=100, warmup_frac=0.2)]),
            "default": dict(cells=[
                dict(n_layer=12, n_head=4, n_embd=128, steps=200, warmup_frac=0.05),  # a 10-step ramp
                dict(n_layer=12, n_head=4, n_embd=128, steps=200, warmup_frac=0.2),   # 40-step ramp
                dict(n_layer=6, n_head=4, n_embd=256, steps=200, warmup_frac=0.05),   # the paper's d_k 64, width:depth 43
                dict(n_layer=6, n_head=4, n_embd=256, steps=200, warmup_frac=0.2),
                dict(n_layer=12, n_head=4, n_embd=128, steps=800, warmup_frac=0.05),  # a 40-step ramp, 4x longer
                # added once the rule had chosen cell 4's regime: a regime must train in every cell;
                # trained before the two below, as it decides whether the choice stands
                dict(n_layer=6, n_head=4, n_embd=256, steps=800, warmup_frac=0.2),
                dict(n_layer=12, n_head=4, n_embd=128, steps=800, warmup_frac=0.2),   # 160-step ramp
                # the paper's tokens: the main job's shape (6 x 128, d_k 32) and the chosen
                # one on GPT-2 BPE, each beside its bytes twin (6 x 256's are cells 4 and 6)
                dict(n_layer=6, n_head=4, n_embd=128, steps=200, warmup_frac=0.2),
                dict(n_layer=6, n_head=4, n_embd=128, steps=200, warmup_frac=0.2, tokens="bpe"),
                dict(n_layer=6, n_head=4, n_embd=128, steps=800, warmup_frac=0.2),
                dict(n_layer=6, n_head=4, n_embd=256, steps=200, warmup_frac=0.2, tokens="bpe"),
                dict(n_layer=6, n_head=4, n_embd=128, steps=800, warmup_frac=0.2, tokens="bpe"),  # the main job
                dict(n_layer=6, n_head=4, n_embd=256, steps=800, warmup_frac=0.2, tokens="bpe"),
                # the vocabulary as a factor: the comparison's cell (the one above) with GPT-2's BPE
                # cut to its first 4,096 and 16,384 tokens (257 / 4K / 16K / 50K with the bytes and
                # full-BPE cells); and a control for the text a sequence covers, full BPE with T 64
                # (~140 bytes, about what bytes' T 128 covers). The quick regime's first candidate
                # (the second is needed only if the first disagrees with the study: it agreed)
                QUICK_CANDIDATES[0],
                dict(n_layer=6, n_head=4, n_embd=256, steps=800, warmup_frac=0.2, tokens="bpe4096"),
                dict(n_layer=6, n_head=4, n_embd=256, steps=800, warmup_frac=0.2, tokens="bpe16384"),
                dict(n_layer=6, n_head=4, n_embd=256, steps=800, warmup_frac=0.2, tokens="bpe", block_size=64),
                dict(n_layer=12, n_head=4, n_embd=128, steps=200, batch_size=64, warmup_frac=0.2)]),  # 16 x 800's tokens
        }),
    "outliers": dict(
        objective="clm",
        flags={},
        # do the simplified blocks grow outlier features (arXiv 2405.19279)? In the GPT comparison's
        # regime on bytes (6 x 256), every arm tuned as there, and every arm at one shared
        # rate too: larger rates grow outliers, and the shaped blocks tune higher. An evaluation every 50 steps (16, not 8, points
        # of kurtosis per run) makes these runs of their own: the comparison's were logged before
        # the statistics were. The verdicts, written before any of its runs: an arm has fewer (more)
        # outlier features than pre_ln if its kurtosis (mean over layers, at the end) is below
        # (above) pre_ln's on every seed, seed by seed, at the tuned and at the shared rate alike
        # (else: the rate decides, not the block); OP keeps pre_ln's loss if its paired gap is within
        # 2% on every seed; QK-norm rescues a stalled run if that run with it leaves the unigram
        # level. Whether more outliers go with less learned per step: the arms ranked by both, a
        # description (5 arms), not a test
        tuned=("pre_ln", "op", "sas_p", "sas_p_nonorm", "sas_p_qknorm"),
        shared_lr=dict(pre_ln=(-1,), op=(-1,), sas_p=(-1,), sas_p_nonorm=(-1,), sas_p_qknorm=(-1,)),
        # rescue: does QK-norm save the shaped runs that stalled in the factor study's cell 1 (12 x 128, 200
        # steps, 5% warmup)? Each again, the same rate and seed, with it
        scales={
            "quick": dict(n_layer=6, n_head=2, n_embd=64, warmup_frac=0.2, steps=(100,), eval_interval=10,
                          rescue=dict(n_layer=6, n_head=2, n_embd=64, steps=100, runs=[("sas_p", 8e-3, 1337)])),
            "default": dict(n_layer=6, n_head=4, n_embd=256, warmup_frac=0.2, steps=(800,), eval_interval=50,
                            rescue=dict(n_layer=12, n_head=4, n_embd=128, steps=200, runs=[
                                ("sas", 2e-3, 2), ("sas", 8e-3, 1337), ("sas_p", 2e-3, 2), ("sas_p", 8e-3, 1337)])),
        }),
    "bf16": dict(
        objective="clm",
        flags={},
        tuned=("pre_ln", "sas", "sas_p"),
        # may the study's new cells train in bf16 (1.5-1.9x faster steps on CPUs with native bf16)?
        # The GPT comparison's cell trained in bf16 at its float32 tuned rates, on its seeds. The
        # rule, written before it ran (tables.bf16_check): yes if every shaped block's paired gap
        # to pre_ln in bf16, seed by seed, lies within 1 point of the range of its float32 gaps
        rates=dict(pre_ln=(2e-3,), sas=(4e-3,), sas_p=(2e-3,)),
        run_flags=(("dtype", "bfloat16"),),
        scales={"default": dict(n_layer=6, n_head=4, n_embd=256, warmup_frac=0.2, tokens="bpe", steps=(800,))}),
    "rows": dict(
        objective="clm",
        flags={},
        tuned=("pre_ln", "sas", "sas_p"),
        # the vocabulary's size to the model, or the tokens themselves? 16K-BPE's tokens differ from
        # 4K-BPE's (longer, rarer, more of them in use) and the model has 4x the rows of embedding
        # and head. Here: 4K-BPE's tokens with 16K-BPE's rows (the 16K cell's model; the rows no
        # token uses are only pushed down by the softmax) in the comparison's cell shape, each block
        # at its rates tuned in the 4K and the 16K cells of that shape (one rate where they agree),
        # the better by mean loss, on 3 seeds. The rule, written before it ran (tables.rows_verdict):
        # for each shaped block, the share of its gap's move from the 4K to the 16K cell that the
        # rows alone make; at least 3/4 for both: the rows; at most 1/4 for both: the tokens; else
        # neither cleanly (3 seeds know a share to about +-1/4)
        rates=dict(pre_ln=(2e-3,), sas=(4e-3, 8e-3), sas_p=(4e-3,)),
        scales={"default": dict(n_layer=6, n_head=4, n_embd=256, warmup_frac=0.2, tokens="bpe4096_rows16384", steps=(800,))}),
    "muon": dict(
        objective="clm",
        flags={},
        # do the shaped blocks keep up under Muon? The paper's argument leans on Adam (SPEC §2, Eq. 6):
        # Pre-LN, SAS and SAS-P with AdamW and with Muon, every arm tuned alike, in --quick's
        # regime (its verdicts are the GPT comparison's, at a fraction of its cost); the AdamW arms
        # are the factor study's runs in that cell. The rules, written before any Muon run
        # (tables.muon_table): a shaped block keeps its verdict under Muon if its paired gap to
        # Pre-LN with Muon falls on the side (ahead or behind on every seed) its gap with AdamW
        # does; Muon is set up well if Pre-LN with Muon is ahead of Pre-LN with AdamW on every
        # seed, else the comparison under it says little; the learned gains are described, not tested
        tuned=("pre_ln", "sas", "sas_p", "pre_ln_muon", "sas_muon", "sas_p_muon"),
        scales={"default": dict(n_layer=6, n_head=4, n_embd=128, warmup_frac=0.2, tokens="bpe4096", steps=(400,))}),
    "identity": dict(
        objective="clm",
        flags={},
        # how do tokens favour the shaped blocks? Both start as the identity map (nearly: SAS's MLP
        # branch is down-weighted, not 0), the model as its embedding and output head; Pre-LN adds its random sub-blocks' outputs
        # to the stream from the first step. pre_ln_zero is Pre-LN started as the identity
        # (reproduction/zero_init.py), tuned alike in --quick's cell (4K tokens: the shaped blocks
        # ahead on every seed) and in the bytes cell of that shape (6 x 128, 800 steps: behind on
        # every seed); the others are the factor study's runs. The rule, written before any
        # pre_ln_zero run (tables.identity_verdict): starting as the identity is how the shaped
        # blocks lead on tokens if pre_ln_zero is ahead of pre_ln on every seed there and closes
        # at least half of SAS's lead; and it is why the tokens matter if, besides, on bytes it
        # gains at most half as much (its mean gap there at least half its mean gap on tokens)
        tuned=("pre_ln", "sas", "sas_p", "pre_ln_zero"),
        scales={"default": dict(cells=[QUICK_CANDIDATES[0], dict(n_layer=6, n_head=4, n_embd=128, steps=800, warmup_frac=0.2)])}),
    "durability": dict(
        objective="clm",
        flags={},
        tuned=("pre_ln", "sas", "sas_p"),
        # does the shaped blocks' lead on tokens hold at 4x the length? In --quick's regime (its
        # verdicts are the GPT comparison's): the factor study's 400-step runs there, and 1,600 steps
        # with each block tuned there on 3 rates around its 400-step rate, its best on every seed;
        # float32 as those (bf16 is 1.04-1.09x faster here: a 4K head is small). The rule, written
        # before any 1,600-step run (tables.durability_table): a shaped block's lead holds if it is
        # ahead of Pre-LN on every seed at 1,600 steps; besides, it grows (shrinks) if its gap there
        # is below (above) its 400-step gap on every seed, else it keeps about its size
        scales={"default": dict(n_layer=6, n_head=4, n_embd=128, warmup_frac=0.2, tokens="bpe4096", steps=(400,),
                                longer=(1600,))}),
    "durability16k": dict(
        objective="clm",
        flags={},
        tuned=("pre_ln", "sas_p", "sas"),  # the headline's blocks first
        # does the headline's lead hold at 4x its length? The comparison's cell with GPT-2's BPE cut
        # to its first 16,384 tokens (the full BPE's cell needs native bf16 to afford 3,200 steps;
        # here both shaped blocks lead on every seed at 800 steps, as with full BPE): the factor
        # study's 800-step runs there, and 3,200 steps with each block tuned on 3 rates around its
        # 800-step rate, its best on every seed; float32 as the 800-step runs. The rule, durability's,
        # written before any 3,200-step run (tables.durability_table)
        scales={"default": dict(n_layer=6, n_head=4, n_embd=256, warmup_frac=0.2, tokens="bpe16384", steps=(800,),
                                longer=(3200,))}),
    "path": dict(
        objective="clm",
        flags={},
        # the references, tuned as in clm (at 12 x 128, 200 steps: the factor study's cell 1)
        tuned=("pre_ln", "sas", "sas_p", "v_skipinit"),
        # each ablation is tuned on 3 rates around its block's tuned rate (a full grid per
        # ablation does not fit), one more past an edge, its best rechecked on a second seed
        # (top_k 1), then every seed
        around=[config for configs, _ in PATH_FIGURES.values() for config in configs],
        # Fig. 6: depth L and 4L, MLP width 2d, beta_FF 0.2 at 18 layers scaled as 1/sqrt(L)
        depth=dict(configs=("pre_ln", "sas", "sas_p", "v_skipinit"), mlp_ratio=2, beta_ff_at_18=0.2),
        scales={
            "quick": dict(n_layer=6, n_head=2, n_embd=64, steps=(80,), depth=dict(n_embd=32, n_head=2, layers=(2, 8))),
            "default": dict(n_layer=12, n_head=4, n_embd=128, steps=(200,), depth=dict(n_embd=64, n_head=2, layers=(3, 12))),
        }),
}
DATASET = prepare_data.BYTES_DATASET  # the tokens of every run but the BPE ones (the GPT comparison, BPE cells)
# every run's; 5% warmup: the paper's; float32: bf16 only once its check cell says it keeps the verdict
TRAINING = dict(block_size=128, batch_size=16, eval_tokens=2**15, warmup_frac=0.05, dtype="float32")
REGIME = ("batch_size", "block_size", "warmup_frac")  # the training settings a regime (a Cell, a scale) may change
NOT_ARM = (*REGIME, "eval_interval")  # flags that set a run's regime or its logging, not its arm
OUT = Path("out/repro")
COLORS = {config: f"C{i % 10}" for i, config in enumerate(CONFIGS)}  # a config's colour in every figure


def tokens_of(kind):
    """(dataset, tokenizer, vocabulary as train.py pads it) of a run's tokens, all of the same text:
    bytes, bpe (GPT-2's, the main job's), bpeN (GPT-2's first N tokens, prepare_data.py --vocab N)
    or bpeN_rowsM (bpeN's tokens, the model's embedding and head with bpeM's rows: the vocabulary's
    size apart from its tokens; protocol.prepare_tokens). The vocabulary is a GPT's: the tokens and
    end-of-text (an encoder's mask token, on bytes, falls in the same padding)."""
    if kind == "bytes":
        return DATASET, "bytes", train.padded_vocab(257, mlm=False)
    kind, _, rows = kind.partition("_rows")
    n = kind.removeprefix("bpe")
    padded = train.padded_vocab(int(rows or n or prepare_data.GPT2_RANKS) + 1, mlm=False)
    dataset = prepare_data.DEFAULT_DATASET + (f"_bpe{n}" if n else "") + (f"_rows{rows}" if rows else "")
    return dataset, f"gpt2_{n}" if n else "gpt2", padded


def seeds(n):
    """The first n seeds: train.py's default, then 1, 2, 3, ..."""
    return (1337, *range(1, n))[:n]


@dataclass(frozen=True)
class Run:
    objective: str  # clm or mlm
    config: str  # a key of CONFIGS
    n_layer: int
    n_head: int
    n_embd: int
    steps: int
    lr: float
    seed: int = 1337
    flags: tuple = ()  # more of train.py's flags, as sorted (name, value) pairs
    tokens: str = "bytes"  # or bpe (the factor study's BPE cells)

    @property
    def flag_text(self):
        return "".join(f"_{k}{v:g}" if isinstance(v, (int, float)) else f"_{k}{v}" for k, v in self.flags)

    @property
    def name(self):
        return f"{self.config}_lr{self.lr:g}{self.flag_text}_s{self.seed}"

    @property
    def folder(self):
        prefix = ("" if self.objective == "clm" else f"{self.objective}_") + ("" if self.tokens == "bytes" else f"{self.tokens}_")
        return OUT / f"{prefix}{self.n_layer}x{self.n_embd}_{self.steps}steps" / self.name

    def settings(self):
        """train.py's flags for this run, as a dict."""
        settings = dict(**CONFIGS[self.config], n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd,
                        max_iters=self.steps, lr=self.lr, seed=self.seed, eval_interval=self.steps // 8,
                        log_interval=self.steps // 4, dataset=tokens_of(self.tokens)[0], out_dir=self.folder, **TRAINING)
        if self.objective == "mlm":
            settings.update(BERT, **({"beta_ff": BERT_BETA_FF} if "beta_ff" in switches_of(CONFIGS[self.config]["block"]) else {}))
        return {**settings, **dict(self.flags)}

    def model_config(self):
        s = self.settings()
        if s["block"] not in BLOCKS:  # a block of one's own (e.g. pre_ln_zero): its --import files register it
            train.import_blocks([w for f in s.get("import", ()) for w in ("--import", f)], "reproduce.py")
        return GPTConfig(vocab_size=tokens_of(self.tokens)[2], causal=self.objective == "clm",
                         **{k: s[k] for k in train.MODEL_FIELDS if k in s})

    def again(self, **changes):
        return replace(self, **changes)

    def argv(self):
        """train.py's command line for this run."""
        return argv_of(self.settings())


def argv_of(settings):
    """train.py's command line for a dict of its flags."""
    flags = []
    for k, v in settings.items():
        if isinstance(v, bool):
            flags.append(f"--{k}" if v else f"--no-{k}")
        else:  # a tuple: the flag once per value (--import)
            flags += [word for value in (v if isinstance(v, tuple) else (v,)) for word in (f"--{k}", str(value))]
    return flags


def regime_flags(spec):
    """The flags of a run in a regime: the settings of REGIME that spec (a dict) changes."""
    return tuple((k, spec[k]) for k in REGIME if spec.get(k, TRAINING[k]) != TRAINING[k])


def arm_flags(row):
    """A result row's flags but its regime's: those that make it another arm (e.g. Fig. 6's depth runs)."""
    return {k: v for k, v in row["flags"].items() if k not in NOT_ARM}


@dataclass(frozen=True)
class Cell:
    """A cell of the factor study (--experiment regime): a model shape, run length, batch and
    warmup, and tokens. Its runs are the GPT comparison's runs where it differs from them in nothing."""
    n_layer: int
    n_head: int
    n_embd: int
    steps: int
    batch_size: int = TRAINING["batch_size"]
    warmup_frac: float = TRAINING["warmup_frac"]
    tokens: str = "bytes"
    block_size: int = TRAINING["block_size"]

    def run(self, config):
        return Run("clm", config, self.n_layer, self.n_head, self.n_embd, self.steps, SHARED_LR,
                   flags=regime_flags(vars(self)), tokens=self.tokens)

    @property
    def warmup_steps(self):
        return train.warmup_steps(self.warmup_frac, self.steps)

    @property
    def regime(self):
        """What the reproduction would take from the cell: all of it but the run length."""
        return (self.n_layer, self.n_head, self.n_embd, self.batch_size, self.warmup_frac, self.tokens, self.block_size)

    @property
    def label(self):
        kind, _, rows = self.tokens.partition("_rows")
        tokens = ("" if kind == "bytes" else "BPE " if kind == "bpe" else f"BPE-{int(kind[3:]) // 1024}K ") + (
            f"with {int(rows) // 1024}K rows " if rows else "")
        T = "" if self.block_size == TRAINING["block_size"] else f", T {self.block_size}"
        return (f"{tokens}{self.n_layer}x{self.n_embd} (d_k {self.n_embd // self.n_head}){T}, "
                f"{self.batch_size} x {self.steps} steps, warmup {self.warmup_frac:.0%} = {self.warmup_steps} steps")


def cells(scale, name="regime"):
    """The cells of an experiment made of cells (the factor study's, or another's) at a scale."""
    return [Cell(**spec) for spec in EXPERIMENTS[name]["scales"][scale]["cells"]]


def cell_of(row):
    """The factor-study cell of a result row."""
    return Cell(row["n_layer"], row["n_head"], row["n_embd"], row["steps"], row["batch_size"],
                row["flags"].get("warmup_frac", TRAINING["warmup_frac"]), row.get("tokens", "bytes"), row.get("block_size", TRAINING["block_size"]))


def scale_points(name, scale):
    """(the model's shape and tokens, its regime's flags, the run lengths compared) of an experiment at a scale."""
    if scale not in EXPERIMENTS[name]["scales"]:
        raise SystemExit(f"reproduce: error: --experiment {name} has no scale {scale}; "
                         f"valid: {', '.join(EXPERIMENTS[name]['scales'])}")
    if "cells" in EXPERIMENTS[name]["scales"][scale]:  # a shape, regime and lengths per cell
        return None, None, sorted({cell.steps for cell in cells(scale, name)})
    spec = EXPERIMENTS[name]["scales"][scale]
    logging = (("eval_interval", spec["eval_interval"]),) if "eval_interval" in spec else ()
    return ({k: spec[k] for k in ("n_layer", "n_head", "n_embd")} | {"tokens": spec.get("tokens", "bytes")},
            tuple(sorted(regime_flags(spec) + logging)), (*spec["steps"], *spec.get("longer", ())))


# ----------------------------------------------------------------------------- --blocks: your arms

def register_arms(specs, imported, import_files):
    """--blocks: an entry of CONFIGS for each arm ('block[:flag=value]...', bench.parse_arm), and
    the compare experiment that tunes them as the GPT comparison tunes its blocks; its name. An
    arm with the settings of a config of the reproduction is that config (the same runs). An arm
    whose block an --import file registered runs on a snapshot of the --import files, named by
    their hash: an edit, even mid-comparison, never mixes into its runs, and makes new ones."""
    defaults = {f.name: f.default for f in fields(train.TrainConfig)}
    keys, snapshots = [], ()
    for spec in (s.strip() for s in specs.split(",")):
        block, flags = bench.parse_arm(spec, "reproduce.py")
        settings = dict(block=block, **{k: v for k, v in sorted(flags.items()) if v != defaults[k]})
        key = next((k for k, v in CONFIGS.items() if v == settings), None)
        if key is None:
            key = block + "".join(f"_{k}{v:g}" if isinstance(v, float) else f"_{k}{v}" for k, v in settings.items()
                                  if k != "block")
        if block in imported:
            snapshots = snapshots or snapshot(import_files)
            key += "-" + snapshots[0].parent.name
            settings["import"] = tuple(map(str, snapshots))  # train.py's --import, for the runs
        if key in keys:
            raise SystemExit(f"reproduce: error: --blocks has two arms with the settings of {spec}")
        CONFIGS[key], COLORS[key] = settings, f"C{len(keys) % 10}"
        keys.append(key)
    if len(keys) < 2:
        raise SystemExit("reproduce: error: --blocks needs two arms or more: the first is the one compared against")
    EXPERIMENTS["compare"] = dict(EXPERIMENTS["clm"], tuned=tuple(keys), shared_lr={})
    return "compare"


def snapshot(files):
    """Copies of the --import files in OUT/imports/<hash of them all>/, for the runs to import."""
    contents = [Path(f).read_bytes() for f in files]
    folder = OUT / "imports" / hashlib.sha1(b"\0".join(contents)).hexdigest()[:8]
    folder.mkdir(parents=True, exist_ok=True)
    copies = []
    for i, (f, content) in enumerate(zip(files, contents)):
        copies.append(folder / f"{i}_{Path(f).name}")
        if not copies[-1].exists():
            copies[-1].write_bytes(content)
    return tuple(c.resolve() for c in copies)
