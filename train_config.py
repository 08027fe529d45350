"""
A training run's settings: TrainConfig (GPTConfig's fields and the run's, each field's comment its
flag's --help), the presets a run starts from, and settings(), which resolves them once: the
device's preset, then a resumed run's checkpoint, then the flags given (but --dtype auto, which the
device decides).

On CUDA the preset is the paper's run (SPEC §4), TrainConfig's defaults: AdamW (0.9, 0.999), weight
decay 0.1 on matrices only, lr 1e-3, linear warmup over 5% of the steps then linear decay to 0, grad
clip 1.0, 18 x 768, T = 128, 128 sequences a step (split over torchrun's processes), 40K steps. On
CPU it is CPU_RUN, a 6 x 128 model that learns visibly in minutes.
"""

import argparse
import inspect
import math
import re
from dataclasses import MISSING, dataclass, fields

import torch

import prepare_data
from common import add_import_flag, flag_type, import_blocks
from simple_gpt import ATTENTIONS, BLOCKS, NORMS, QK_NORMS, VPS, GPTConfig


@dataclass
class TrainConfig(GPTConfig):
    """A run: its model (GPTConfig's fields; vocab_size and causal follow the dataset and objective)
    and how it trains. The defaults are the paper's run; each field's comment is its flag's help."""

    objective: str = "clm"  # clm: next-token prediction (the paper's GPT); mlm: masked language modelling with bidirectional attention (the paper's BERT)
    mask_prob: float = 0.25  # mlm: fraction of positions masked (the paper's Crammed BERT: 0.25; BERT: 0.15)
    dataset: str = prepare_data.DEFAULT_DATASET  # dataset folder under --data_dir, made by prepare_data.py
    data_dir: str = "data"  # parent folder of datasets
    out_dir: str | None = None  # checkpoint and log.jsonl folder (default: out/<block>, then _<norm> for other norms, _mlm for mlm)
    batch_size: int = 32  # sequences per micro-step
    grad_accum: int = 4  # micro-steps per step, over all processes
    max_iters: int = 40_000  # optimizer steps
    lr: float = 1e-3  # peak learning rate (the paper's; 3e-4 for V-SkipInit at depth 18; with --optimizer muon, AdamW's); a GPT on CPU: its block's rate tuned by the reproduction, CPU_GPT_LR (with Muon: CPU_GPT_MUON's)
    warmup_frac: float = 0.05  # fraction of steps of linear warmup, then decay to 0 (the paper's BERT: 0.75); a GPT on CPU: 0.2, the reproduction's finding
    schedule: str = "linear"  # the decay after warmup: linear (the paper's) or cosine (Fig. 12)
    optimizer: str = "adamw"  # adamw (the paper's), or muon: Muon on the blocks' weight matrices (W^Q and W^K apart) at --muon_lr, AdamW on the rest (embeddings and the tied head at --emb_lr; norms, gains at --lr)
    muon_lr: float | None = None  # --optimizer muon: the matrices' peak rate, Muon's update scaled to AdamW's size so that it reads as an AdamW rate (default: --lr; a GPT on CPU given neither: its block's pair tuned by the reproduction, CPU_GPT_MUON)
    emb_lr: float | None = None  # peak rate of the token and position embeddings (wte, which is the tied output head, and wpe), with AdamW and with --optimizer muon (default: --lr)
    weight_decay: float = 0.1  # weight decay on matrices and embeddings (not gains or norms; the embeddings': --emb_weight_decay)
    emb_weight_decay: float | None = None  # the embeddings' weight decay (default: --weight_decay); AdamW's decay is decoupled, so a rate k times higher also decays k times faster
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.999  # AdamW beta2 (the paper's BERT: 0.98)
    grad_clip: float = 1.0  # clip the gradient norm to this (0: off; the paper's BERT: 0.5)
    eval_interval: int = 1000  # steps between evaluations and checkpoints
    eval_tokens: int = 2**20  # fixed validation budget, the same tokens at every eval
    log_interval: int = 10  # steps between log lines
    device: str = "auto"  # auto picks cuda > mps > cpu
    dtype: str = "auto"  # autocast dtype; auto: bfloat16 on GPUs with bf16 tensor cores (compute capability 8.0+), float16 on older ones; elsewhere bfloat16 where a bf16 matmul is measured to be clearly faster than float32, else float32
    compile: bool | None = None  # torch.compile the model (default: on for CUDA only; no gain measured on CPU)
    seed: int = 1337  # seed of the weights and of the batch order
    resume: bool = False  # continue the run in --out_dir from its checkpoint
    imports: tuple = ()  # --import's files (a flag of its own): run first, they register blocks

    def __post_init__(self):
        super().__post_init__()  # the model's own checks (shape, switches)
        for name in ("batch_size", "grad_accum", "max_iters", "eval_interval", "log_interval", "eval_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1")
        checks = [(self.eval_tokens >= self.block_size, f"--eval_tokens {self.eval_tokens} is less than one "
                                                        f"sequence of {self.block_size}"),
                  (0 <= self.warmup_frac <= 1, f"--warmup_frac {self.warmup_frac} must be between 0 and 1"),
                  (0 < self.mask_prob < 1, f"--mask_prob {self.mask_prob} must be between 0 and 1 (exclusive)"),
                  (self.lr > 0, f"--lr {self.lr} must be > 0"),
                  (self.muon_lr is None or self.muon_lr > 0, f"--muon_lr {self.muon_lr} must be > 0"),
                  (self.emb_lr is None or self.emb_lr > 0, f"--emb_lr {self.emb_lr} must be > 0"),
                  (self.muon_lr is None or self.optimizer == "muon", "--muon_lr is Muon's rate: give --optimizer muon too"),
                  (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, f"--beta1 {self.beta1} and --beta2 {self.beta2} "
                                                                "must be in [0, 1)"),
                  (min(self.weight_decay, self.grad_clip, self.emb_weight_decay or 0) >= 0,
                   "--weight_decay, --emb_weight_decay and --grad_clip must be >= 0")]
        if failed := [message for ok, message in checks if not ok]:
            raise ValueError(failed[0])


NOT_FLAGS = ("vocab_size", "causal", "imports", "block_settings")  # block_settings: each a flag of its own
MODEL_FIELDS = tuple(f.name for f in fields(GPTConfig) if f.name not in NOT_FLAGS)
# the valid values of a flag (BLOCKS itself, so that a block registered later counts)
CHOICES = dict(block=BLOCKS, norm=NORMS, attention=ATTENTIONS, vp=VPS, qk_norm=QK_NORMS,
               objective=("clm", "mlm"), schedule=("linear", "cosine"), optimizer=("adamw", "muon"),
               device=("auto", "cuda", "mps", "cpu"), dtype=("auto", "float32", "bfloat16", "float16"))
# The CPU's preset; on CUDA these fields keep TrainConfig's defaults, the paper's run (32 x 4: its 128
# sequences a step). A GPT on CPU trains as a cell of the reproduction's factor study (README:
# Reproduction; GPT-2 tokens, this shape and length): its 20% warmup and each block's rate tuned there
# (a block it did not tune keeps the paper's 1e-3). It measured no encoder.
CPU_RUN = dict(n_layer=6, n_head=4, n_embd=128, batch_size=16, grad_accum=1, max_iters=800,
               eval_interval=100, eval_tokens=2**15, lr=1e-3, warmup_frac=0.05)
PAPER_RUN = {k: getattr(TrainConfig, k) for k in CPU_RUN}
CPU_GPT_WARMUP, CPU_GPT_LR = 0.2, dict(pre_ln=2e-3, sas=4e-3, sas_p=4e-3)
# with --optimizer muon and neither rate given: each block's pair (--muon_lr, --lr), tuned in --quick's cell (README: Reproduction)
CPU_GPT_MUON = dict(pre_ln=(8e-3, 3.2e-2), sas=(3.2e-2, 3.2e-2), sas_p=(1.6e-2, 3.2e-2))
# the settings that decide a run's numbers; --resume refuses to change them
RUN_FIELDS = (*MODEL_FIELDS, "block_settings", "objective", "mask_prob", "dataset", "batch_size", "grad_accum",
              "max_iters", "lr", "warmup_frac", "schedule", "optimizer", "muon_lr", "emb_lr", "weight_decay",
              "emb_weight_decay", "beta1", "beta2", "grad_clip", "eval_tokens", "seed")


def fail(message):
    raise SystemExit(f"train: error: {message}")


class Parser(argparse.ArgumentParser):
    def error(self, message):
        """An unknown --block may be one of your own, whose file was not given."""
        super().error(message + (" (a block of your own: --import FILE)" if message.startswith("argument --block") else ""))


def parser(description=None):
    p = Parser(prog="train.py", usage="%(prog)s [--block NAME] [--flag VALUE ...] (see --help)",
               description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_import_flag(p)
    helps = field_helps(TrainConfig)
    for f in fields(TrainConfig):
        if f.name not in NOT_FLAGS:
            default = "" if f.default is None else f" (default: {f.default}" + (
                f"; on CPU: {CPU_RUN[f.name]}" if f.name in CPU_RUN and CPU_RUN[f.name] != f.default else "") + ")"
            help = helps.get(f.name, f"{f.name.replace('_', ' ')} (a setting without help: give its field a comment)")
            kind, help = flag_type(f), (help + default).replace("%", "%%")
            if kind is bool:  # every default None: the flags given are those not None
                p.add_argument(f"--{f.name}", action=argparse.BooleanOptionalAction, help=help)
            else:
                p.add_argument(f"--{f.name}", type=kind, choices=CHOICES.get(f.name), help=help)
    flags = {f.name for f in fields(TrainConfig)}
    for name, (default, help, blocks) in block_settings().items():  # a block of one's own's (--import)
        if name in flags:
            fail(f"{', '.join(blocks)}'s setting {name!r} is named as a flag of train.py: rename it")
        if default is None:
            fail(f"{', '.join(blocks)}'s setting {name!r} has no default: give it one of its type")
        help = f"{help} ({', '.join(blocks)}'s setting; default: {default})".replace("%", "%%")
        kind = dict(action=argparse.BooleanOptionalAction) if type(default) is bool else dict(type=type(default))
        try:
            p.add_argument(f"--{name}", help=help, **kind)
        except argparse.ArgumentError:  # --help, --import
            fail(f"{', '.join(blocks)}'s setting {name!r} is named as a flag of train.py: rename it")
    return p


def block_settings():
    """{name: (default, help, [the blocks that declare it])}: the settings blocks declare (a class's settings)."""
    found = {}
    for block, cls in BLOCKS.items():
        for name, (default, help) in getattr(cls, "settings", {}).items():
            found.setdefault(name, (default, help, []))[2].append(block)
    return found


def field_helps(config_class):
    """{field: its help}, the comment after each field where config_class and its bases define it."""
    comment = r"^    (\w+): [^=\n]+= [^\n]*?  # (.*)$"
    helps = {}
    for cls in reversed(config_class.__mro__[:-1]):
        try:
            helps.update(re.findall(comment, inspect.getsource(cls), re.M))
        except (OSError, TypeError):  # a class made at run time has no source
            pass
    return helps


def parse_args(argv=None, description=None):
    """The flags given, {name: value} (--import's files run first: --block may name their blocks);
    description: --help's text above the flags."""
    import_blocks(argv, "train.py")
    return {k: v for k, v in vars(parser(description).parse_args(argv)).items() if v is not None}


def settings(given, device, world=1, saved=None):
    """The run's settings, resolved here alone, in this order: TrainConfig's defaults, the device's
    preset (the paper's run on CUDA, CPU_RUN or cpu_gpt_run), a resumed run's checkpoint (saved),
    the flags given; then what follows from them (Muon's rate from --lr, the batch split over the
    processes, compile on CUDA). Returns (TrainConfig, the reasons for its defaults, for the banner).
    A pure function: what the device and the data decide, --dtype auto and the vocabulary, the
    trainer fills in (common.autocast_dtype, the dataset's meta.json); --emb_lr and --emb_weight_decay
    unset stay None, the embeddings' group then at --lr and --weight_decay (common.configure_optimizers)."""
    device_type = torch.device(device).type
    if own := {k: given[k] for k in block_settings() if k in given}:  # a block's own settings: one field of the model's
        given = {k: v for k, v in given.items() if k not in own}
        given["block_settings"] = {**(saved or {}).get("block_settings", {}), **own}
    chosen = {**(resumed(given, saved, device_type) if saved is not None else {}), **given}
    block, objective = chosen.get("block", TrainConfig.block), chosen.get("objective", TrainConfig.objective)
    if block not in BLOCKS:  # e.g. a checkpoint of a block of one's own, resumed without its --import
        fail(f"unknown block {block!r}; valid: {', '.join(BLOCKS)} (a block of your own: --import FILE)")
    gpt_on_cpu = device_type != "cuda" and objective == "clm"
    run = PAPER_RUN if device_type == "cuda" else cpu_gpt_run(block, chosen) if gpt_on_cpu else CPU_RUN
    unset = [k for k in run if k not in chosen]
    values = {**{k: run[k] for k in unset}, **chosen, "device": device, "causal": objective == "clm"}
    if "grad_accum" not in chosen:  # the preset's micro-steps, rounded up to a multiple of the processes
        values["grad_accum"] = world * math.ceil(run["grad_accum"] / world)
    if "batch_size" not in chosen:  # and the batch that keeps its global batch (CUDA: 16 x 8 on 8)
        values["batch_size"] = max(1, run["batch_size"] * run["grad_accum"] // values["grad_accum"])
    why = {"defaults": "" if not unset else
           f" | {'the paper run' if run is PAPER_RUN else 'CPU-sized'} defaults for {', '.join(unset)}"}
    found = [f"warmup {values['warmup_frac']:.0%}"] if gpt_on_cpu and "warmup_frac" in unset else []
    if gpt_on_cpu and "lr" in unset and block in CPU_GPT_LR:
        found.append(f"muon_lr {values['muon_lr']:g}, lr {values['lr']:g} for {block} with Muon" if "muon_lr" in run
                     else f"lr {values['lr']:g} for {block}")
    if found:
        why["defaults"] += f" ({', '.join(found)}: the reproduction's finding, README: Reproduction)"
    if gpt_on_cpu and "lr" in unset and block not in CPU_GPT_LR:
        why["defaults"] += (f" | lr {values['lr']:g}: the paper's, as {block} has no rate tuned on CPU (to tune it as "
                            f"the others were: python reproduce.py --blocks pre_ln,{block})")
    target = run["batch_size"] * run["grad_accum"]
    if values["batch_size"] * values["grad_accum"] != target and {"batch_size", "grad_accum"} & set(unset):
        micro = ("the default micro-steps" if values["grad_accum"] == run["grad_accum"] else f"{values['grad_accum']} "
                 f"micro-steps, the default {run['grad_accum']} rounded up to a multiple of the {world} processes")
        why["batch"] = (f" (not the default {target}: it does not split over {world} processes)" if "batch_size" in unset
                        else f" (not the default {target}: --batch_size {values['batch_size']} with {micro})")
    if values.get("optimizer") == "muon" and values.get("muon_lr") is None:  # one rate for both
        values["muon_lr"] = values["lr"]
    if values.get("compile") is None:
        values["compile"] = device_type == "cuda"
        why["compile"] = "default on CUDA" if values["compile"] else "off: the default off CUDA (no gain measured on CPU)"
    values["out_dir"] = out_dir(given)
    try:
        cfg = TrainConfig(**values)
    except ValueError as e:
        fail(str(e))
    if cfg.grad_accum % world:
        fail(f"--grad_accum {cfg.grad_accum} must be a multiple of the {world} processes" + (
            "; it is the checkpoint's: resume on a number of processes that divides it" if "grad_accum" not in given else ""))
    if cfg.dtype == "float16" and device_type != "cuda":
        fail("--dtype float16 needs CUDA (its loss scaler); use bfloat16 or float32")
    return cfg, why


def resumed(given, saved, device_type):
    """What a resumed run keeps of its checkpoint's settings (saved): a flag that would change the run
    is refused; device and compile are chosen afresh, and the dtype where the device's kind changed."""
    if saved.get("optimizer") == "muon" and "muon_lr" not in saved:
        fail(f"the checkpoint in {out_dir(given)} was trained by a Muon that orthogonalised W^Q and W^K as one "
             "matrix; this one takes them apart: start a new run (another --out_dir)")
    default = {f.name: f.default if f.default is not MISSING else f.default_factory() for f in fields(TrainConfig)}
    was = {k: saved.get(k, default[k]) for k in RUN_FIELDS}  # older versions lacked some
    if changed := [f"{k}={was[k]!r} (flags say {given[k]!r})" for k in RUN_FIELDS if k in given and given[k] != was[k]]:
        fail(f"the checkpoint in {out_dir(given)} was trained with {', '.join(changed)}; --resume continues a "
             "run as it began: drop these flags, or choose another --out_dir for a new run")
    kept = {k: saved[k] for k in (*RUN_FIELDS, "eval_interval", "log_interval") if k in saved and k not in given}
    same_kind = torch.device(saved["device"]).type == device_type  # of device: the dtype the run began with
    if given.get("dtype", "auto") == "auto" and same_kind:
        kept["dtype"] = saved["dtype"]
    return kept


def cpu_gpt_run(block, chosen):
    """CPU_RUN as the reproduction found a GPT trains best: 20% warmup and the block's tuned rate (with
    --optimizer muon and neither rate chosen, its tuned pair)."""
    run = {**CPU_RUN, "warmup_frac": CPU_GPT_WARMUP, "lr": CPU_GPT_LR.get(block, CPU_RUN["lr"])}
    if chosen.get("optimizer") == "muon" and block in CPU_GPT_MUON and not {"lr", "muon_lr"} & set(chosen):
        run["muon_lr"], run["lr"] = CPU_GPT_MUON[block]
    return run


def out_dir(flags):
    """--out_dir, by default out/<block>, then _<norm> for other norms and _mlm for mlm."""
    if flags.get("out_dir") is not None:
        return flags["out_dir"]
    norm = flags.get("norm", TrainConfig.norm)
    return (f"out/{flags.get('block', TrainConfig.block)}" + ("" if norm == "rmsnorm" else f"_{norm}")
            + ("_mlm" if flags.get("objective") == "mlm" else ""))


def padded_vocab(n_tokens, mlm):
    """The model's vocabulary: the tokenizer's n_tokens, MLM's mask token (the first id past them),
    padded to a multiple of 64 (faster matmuls)."""
    return (n_tokens + mlm + 63) // 64 * 64


def warmup_steps(warmup_frac, max_iters):
    return max(1, int(warmup_frac * max_iters))

