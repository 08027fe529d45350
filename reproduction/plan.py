"""
What is run: every config (CONFIGS), the experiments' registry (EXPERIMENTS, each one's spec from its
module in experiments/) and their scale points, the settings every run shares (TRAINING, DATASET,
GRID), and a run (Run) or a factor-study cell (Cell) as train.py's flags and an out/repro/ folder. The --blocks registry (register_arms) adds its arms
here too: the registries live in this module alone, so that every module sees the same dicts
(the others read them as plan.CONFIGS, plan.TRAINING, ..., at call time).
"""

import hashlib
from dataclasses import dataclass, fields, replace
from pathlib import Path

import bench
import common
import prepare_data
import train_config
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
# --quick's regime, chosen by a rule written before any of these ran (experiments/regime.py: quick_regime): the
# first of them, cheapest first (steps x bench.py's seconds per step), whose verdict for SAS and
# SAS-P agrees with the GPT comparison's; each a cell of the factor study (3 seeds), run in order
# until one agrees
QUICK_CANDIDATES = [
    dict(n_layer=6, n_head=4, n_embd=128, steps=400, warmup_frac=0.2, tokens="bpe4096"),  # ~0.42 s a step here
    dict(n_layer=6, n_head=4, n_embd=128, steps=800, warmup_frac=0.2, tokens="bpe4096"),
]
# every experiment's spec, by name: reproduction/experiments/'s modules fill it when the package loads
# (their EXPERIMENT), --blocks adds compare
EXPERIMENTS = {}
DATASET = prepare_data.BYTES_DATASET  # the tokens of every run but the BPE ones (the GPT comparison, BPE cells)
# every run's; 5% warmup: the paper's; float32: bf16 only once its check cell says it keeps the verdict
TRAINING = dict(block_size=128, batch_size=16, eval_tokens=2**15, warmup_frac=0.05, dtype="float32")
REGIME = ("batch_size", "block_size", "warmup_frac")  # the training settings a regime (a Cell, a scale) may change
NOT_ARM = (*REGIME, "eval_interval", "muon_lr", "emb_lr")  # flags of a run's regime, logging or tuned rates, not its arm
OUT = Path("out/repro")
COLORS = {config: f"C{i % 10}" for i, config in enumerate(CONFIGS)}  # a config's colour in every figure


def tokens_of(kind):
    """(dataset, tokenizer, vocabulary as train.py pads it) of a run's tokens, all of the same text:
    bytes, bpe (GPT-2's, the main job's), bpeN (GPT-2's first N tokens, prepare_data.py --vocab N)
    or bpeN_rowsM (bpeN's tokens, the model's embedding and head with bpeM's rows: the vocabulary's
    size apart from its tokens; protocol.prepare_tokens). The vocabulary is a GPT's: the tokens and
    end-of-text (an encoder's mask token, on bytes, falls in the same padding)."""
    if kind == "bytes":
        return DATASET, "bytes", train_config.padded_vocab(257, mlm=False)
    kind, _, rows = kind.partition("_rows")
    n = kind.removeprefix("bpe")
    padded = train_config.padded_vocab(int(rows or n or prepare_data.GPT2_RANKS) + 1, mlm=False)
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
        """The flags, as a name shows them; the rates of a pair are in rates."""
        return "".join(f"_{k}{v:g}" if isinstance(v, (int, float)) else f"_{k}{v}" for k, v in self.flags
                       if k not in ("muon_lr", "emb_lr"))

    @property
    def rates(self):
        """[("lr", 0.004)]; a Muon pair's (a run with a muon_lr flag) [("lr", Muon's), ("adamw_lr", AdamW's)],
        so that a name reads each rate after its optimizer's: sas_p_muon_lr0.008_adamw_lr0.032; with the
        embeddings' rate apart, [("lr", 0.004), ("emb_lr", 0.032)]."""
        flags = dict(self.flags)
        if "muon_lr" in flags:
            return [("lr", flags["muon_lr"]), ("adamw_lr", self.lr)]
        return [("lr", self.lr)] + ([("emb_lr", flags["emb_lr"])] if "emb_lr" in flags else [])

    @property
    def name(self):
        return f"{self.config}_{'_'.join(f'{k}{v:g}' for k, v in self.rates)}{self.flag_text}_s{self.seed}"

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
            common.import_blocks([w for f in s.get("import", ()) for w in ("--import", f)], "reproduce.py")
        return GPTConfig(vocab_size=tokens_of(self.tokens)[2], causal=self.objective == "clm",
                         **{k: s[k] for k in train_config.MODEL_FIELDS if k in s})

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
        return train_config.warmup_steps(self.warmup_frac, self.steps)

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
    defaults = {f.name: f.default for f in fields(train_config.TrainConfig)}
    keys, snapshots = [], ()
    for spec in (s.strip() for s in specs.split(",")):
        if import_files and (named := spec.split(":")[0]) not in BLOCKS:
            raise SystemExit(f"reproduce: error: --import {', '.join(import_files)} registered no block "
                             f"{named!r} (it registered: {', '.join(imported) or 'none'})")
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
