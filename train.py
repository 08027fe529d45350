"""
Train a GPT built from any block of "Simplifying Transformer Blocks", nanoGPT style.

    python train.py --block sas_p                    # CUDA: the paper's run; CPU: ~15 minutes
    python train.py --block pre_ln --n_layer 8       # every model flag mirrors GPTConfig
    python train.py --block sas_p --resume           # continue an interrupted run
    python train.py --block sas_p --objective mlm    # the paper's encoder: masked language modelling
    torchrun --nproc_per_node=8 train.py --block sas_p          # data parallel (DDP)
    python train.py --block sas --alpha_ff 0         # an ablation of the paper (SPEC §8)

Defaults follow the paper (SPEC §4): AdamW (0.9, 0.999), weight decay 0.1 on matrices only,
lr 1e-3, linear warmup over 5% of the steps then linear decay to 0, grad clip 1.0, T = 128; on
CUDA its shape, batch and length (18 x 768, 128 sequences, 40K steps, split over torchrun's
processes), on CPU a small model that learns visibly within 15 minutes on 2 cores.
Each evaluation appends to <out_dir>/log.jsonl (losses, gains, token similarity and each layer's
outlier features; at the end the loss with int8 inputs to every linear layer) and rewrites
<out_dir>/ckpt.pt atomically. --resume continues a run with the settings it started with.
"""

import argparse
import json
import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import prepare_data
from common import (Masking, add_import_flag, autocast_dtype, configure_optimizers, device_peak, import_blocks,
                    load_checkpoint, load_weights, tune_cpu_allocator)
from diagnostics import int8_inputs, learned_gains, mean_cosine, outlier_stats, residual_streams
from sample import sample_text
from simple_gpt import ATTENTIONS, BLOCKS, GPT, NORMS, GPTConfig


def arg(default, help, kind=None, choices=None):
    """A TrainConfig field that parse_args turns into --name with this help."""
    return field(default=default, metadata=dict(help=help, type=kind or type(default), choices=choices))


@dataclass
class TrainConfig:
    # model: the fields of GPTConfig (vocab_size comes from the dataset)
    block: str = arg("sas_p", "transformer block", choices=BLOCKS)  # the dict itself: a block registered later counts
    norm: str = arg("rmsnorm", "normalisation inside blocks", choices=list(NORMS))
    n_layer: int = arg(None, "layers (default: 18 on CUDA, 6 on CPU)", int)
    n_head: int = arg(None, "attention heads (default: 12 on CUDA, 4 on CPU)", int)
    n_embd: int = arg(None, "width d (default: 768 on CUDA, 128 on CPU)", int)
    block_size: int = arg(128, "context length T (the paper's 128)")
    beta_ff: float = arg(None, "initial MLP gain of SAS/SAS-P/V-SkipInit (default: 0.1*sqrt(18/n_layer))", float)
    objective: str = arg("clm", "clm: next-token prediction (the paper's GPT); mlm: masked language modelling "
                         "with bidirectional attention (the paper's BERT)", choices=["clm", "mlm"])
    mask_prob: float = arg(0.25, "mlm: fraction of positions masked (the paper's Crammed BERT: 0.25; BERT: 0.15)")
    # the paper's ablations (SPEC §8), each one switch away from a block; the defaults are the paper's blocks
    mlp_ratio: int = arg(4, "MLP hidden width / n_embd (Fig. 6's depth runs: 2)")
    mlp_slope: float = arg(0.0, "negative slope of the MLP's ReLU; > 0: leaky ReLU (Fig. 25)")
    alpha_ff: float = arg(1.0, "initial MLP skip gain of SAS/V-SkipInit (trainable); 0: no MLP skip (Fig. 25)")
    attention: str = arg("shaped", "shaped (Eq. 5), or skipinit: alpha I + beta A, beta from 0, no C (Eq. 4; "
                         "Fig. 13)", choices=list(ATTENTIONS))
    first_value: bool = arg(True, "SAS/SAS-P's trainable first-layer value; --no-first_value: W^V = I there too (Fig. 24)")
    vp: str = arg(None, "every layer's W^V and W^P per Eq. 6, W = W_init + vp_beta dW, dW trainable from 0, "
                  "on this fixed W_init (Figs. 3, 4, 23)", str, choices=["identity", "orthogonal"])
    vp_beta: float = arg(0.0, "--vp's beta: fixed, or the initial value with --vp_trainable")
    vp_trainable: bool = arg(False, "--vp's alpha and beta trainable, from 1 and --vp_beta (Fig. 4)")
    # attention logits and the OP block (arXiv 2405.19279)
    qk_norm: str = arg(None, "rmsnorm: RMSNorm of each head's queries and keys (QK-norm); none (the default; op: rmsnorm, "
                       "its own)", str, choices=["rmsnorm", "none"])
    logit_cap: float = arg(0.0, "> 0: soft-cap attention logits to C * tanh(logits / C), with C this; 0: off")
    op_beta: float = arg(None, "initial gain of both of op's residual branches (default: 0.2*sqrt(12/n_layer))", float)
    op_trainable: bool = arg(False, "op's residual gains trainable")
    # data and output
    dataset: str = arg(prepare_data.DEFAULT_DATASET, "dataset folder under --data_dir, made by prepare_data.py")
    data_dir: str = arg("data", "parent folder of datasets")
    out_dir: str = arg(None, "checkpoint and log.jsonl folder (default: out/<block>, then _<norm> for other norms, _mlm for mlm)", str)
    # optimisation
    batch_size: int = arg(None, "sequences per micro-step (default: 32 on CUDA, 16 on CPU)", int)
    grad_accum: int = arg(None, "micro-steps per step, over all processes (default: 4 on CUDA, 1 on CPU)", int)
    max_iters: int = arg(None, "optimizer steps (default: 40000 on CUDA, 800 on CPU)", int)
    lr: float = arg(None, "peak learning rate (default: the paper's 1e-3; a GPT on CPU: the block's rate tuned by "
                    "the reproduction, CPU_GPT_LR; the paper used 3e-4 for V-SkipInit at depth 18)", float)
    warmup_frac: float = arg(None, "fraction of steps of linear warmup, then decay to 0 (default: the paper's 0.05; "
                             "a GPT on CPU: 0.2, the reproduction's finding; the paper's BERT: 0.75)", float)
    schedule: str = arg("linear", "the decay after warmup: linear (the paper's) or cosine (Fig. 12)",
                        choices=["linear", "cosine"])
    optimizer: str = arg("adamw", "adamw (the paper's), or muon: Muon on the blocks' weight matrices, its rate --lr "
                         "scaled to AdamW's update size, and AdamW on the rest (embeddings, norms, gains)",
                         choices=["adamw", "muon"])
    weight_decay: float = arg(0.1, "weight decay on matrices and embeddings (not gains or norms)")
    beta1: float = arg(0.9, "AdamW beta1")
    beta2: float = arg(0.999, "AdamW beta2 (the paper's BERT: 0.98)")
    grad_clip: float = arg(1.0, "clip the gradient norm to this (0: off; the paper's BERT: 0.5)")
    # evaluation and logging
    eval_interval: int = arg(None, "steps between evaluations and checkpoints (default: 1000 on CUDA, 100 on CPU)", int)
    eval_tokens: int = arg(None, "fixed validation budget, the same tokens at every eval (default: 2^20 on CUDA, 2^15 on CPU)", int)
    log_interval: int = arg(10, "steps between log lines")
    # system
    device: str = arg("auto", "auto picks cuda > mps > cpu", choices=["auto", "cuda", "mps", "cpu"])
    dtype: str = arg("auto", "autocast dtype; auto: bfloat16 on GPUs with bf16 tensor cores (compute capability "
                     "8.0+), float16 on older ones; elsewhere bfloat16 where a bf16 matmul is measured to be clearly "
                     "faster than float32, else float32", choices=["auto", "float32", "bfloat16", "float16"])
    compile: bool = arg(None, "torch.compile the model (default: on for CUDA only; no gain measured on CPU)", bool)
    seed: int = arg(1337, "seed of the weights and of the batch order")
    resume: bool = arg(False, "continue the run in --out_dir from its checkpoint")
    imports: tuple = field(default=(), repr=False)  # --import FILE: run first (import_blocks)
    given: tuple = field(default=(), repr=False)  # the flags given on the command line (not a flag)


PAPER_RUN = dict(n_layer=18, n_head=12, n_embd=768, batch_size=32, grad_accum=4, max_iters=40_000,
                 eval_interval=1000, eval_tokens=2**20, lr=1e-3, warmup_frac=0.05)  # 32 x 4: the paper's 128 a step
CPU_RUN = dict(n_layer=6, n_head=4, n_embd=128, batch_size=16, grad_accum=1, max_iters=800,
               eval_interval=100, eval_tokens=2**15, lr=1e-3, warmup_frac=0.05)
# A GPT on CPU trains as a cell of the reproduction's factor study (README: Reproduction; GPT-2
# tokens, this shape and length): its 20% warmup and each block's rate tuned there (a block it did
# not tune keeps the paper's 1e-3). It measured no encoder.
CPU_GPT_WARMUP, CPU_GPT_LR = 0.2, dict(pre_ln=2e-3, sas=4e-3, sas_p=4e-3)
MODEL_FIELDS = tuple(f.name for f in fields(GPTConfig) if f.name not in ("vocab_size", "causal"))
# the settings that decide a run's numbers; --resume refuses to change them
RUN_FIELDS = (*MODEL_FIELDS, "objective", "mask_prob", "dataset", "batch_size", "grad_accum", "max_iters", "lr",
              "warmup_frac", "schedule", "optimizer", "weight_decay", "beta1", "beta2", "grad_clip", "eval_tokens", "seed")

OPTIMIZER_BANNER = {"adamw": "AdamW", "muon": "Muon on the blocks' matrices at that rate scaled to AdamW's update size, "
                                       "AdamW on the rest"}  # for the banner
# A run has stalled when its val loss, STALL_AFTER steps past 2 x warmup (or at its end), is above STALL_LEVEL x
# the unigram level (the best loss without context). Every run that trained here had left it by then.
STALL_AFTER, STALL_LEVEL = 50, 0.98


def fail(message):
    raise SystemExit(f"train: error: {message}")


def parser():
    p = argparse.ArgumentParser(prog="train.py", usage="%(prog)s [--block NAME] [--flag VALUE ...] (see --help)",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_import_flag(p)
    for f in fields(TrainConfig):
        if "help" not in f.metadata:
            continue
        kind, shown = f.metadata["type"], "" if f.default is None else f" (default: {f.default})"
        help = (f.metadata["help"] + shown).replace("%", "%%")
        if kind is bool:  # default None: parse_args tells a flag given from one left out
            p.add_argument(f"--{f.name}", action=argparse.BooleanOptionalAction, default=None, help=help)
        else:
            p.add_argument(f"--{f.name}", type=kind, default=None, choices=f.metadata["choices"], help=help)
    return p


def parse_args(argv=None):
    import_blocks(argv, "train.py")
    given = {k: v for k, v in vars(parser().parse_args(argv)).items() if v is not None}
    return TrainConfig(**given, given=tuple(given))


# ----------------------------------------------------------------------------- data

def load_dataset(cfg, master):
    """Check data/<dataset> and return (meta, {split: path}); the default corpus is prepared
    on first use."""
    folder = Path(cfg.data_dir) / cfg.dataset
    again = {prepare_data.DEFAULT_DATASET: f"python prepare_data.py --data_dir {cfg.data_dir}",
             prepare_data.BYTES_DATASET: f"python prepare_data.py --tokenizer bytes --name {cfg.dataset} --data_dir {cfg.data_dir}",
             }.get(cfg.dataset, f"python prepare_data.py --input YOUR_FILES --name {cfg.dataset} --data_dir {cfg.data_dir}")
    if cfg.dataset == prepare_data.DEFAULT_DATASET and prepare_data.prepared(folder / "meta.json") is None:
        if master:  # missing, or cut short
            print(f"train: {folder} not prepared, preparing the default corpus (Python's standard library)")
            prepare_data.main(["--data_dir", cfg.data_dir])
        if dist.is_initialized():
            dist.barrier()
    if not (folder / "meta.json").exists():
        fail(f"dataset {folder} is not prepared; run: {again}")
    try:
        return prepare_data.open_prepared(folder, cfg.block_size)
    except ValueError as e:
        fail(f"{e}; prepare the dataset again with the prepare_data.py command that made it, e.g.: {again}")


def to_device(t, device):
    """On CUDA a pinned, asynchronous copy (contiguous first): the CPU goes on queueing work."""
    if torch.device(device).type == "cuda":
        return t.contiguous().pin_memory().to(device, non_blocking=True)
    return t.to(device)


def get_batch(path, offsets, T, device):
    """Inputs and next-token targets of the sequences at offsets: two views of one copy."""
    seqs = to_device(torch.from_numpy(prepare_data.sequences(path, offsets, T)), device)
    return seqs[:, :-1], seqs[:, 1:]


# ----------------------------------------------------------------------------- checkpoints

def read_records(log_path):
    """The records of a log.jsonl ([] if none), less a last line cut short (a crash, or being written)."""
    lines = log_path.read_text().splitlines() if log_path.exists() else []
    records = []
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:
                raise
    return records


def save_checkpoint(path, state):
    """Atomic: a crash while writing leaves the previous checkpoint intact."""
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def continued(cfg, saved, path):
    """A resumed run's settings: those it started with (saved) where no flag is given; a flag that would
    change the run (RUN_FIELDS) is refused. Device, dtype and compile are chosen afresh (another machine)."""
    default = lambda k: getattr(TrainConfig, k)  # settings a checkpoint of an older version lacks
    changed = [f"{k}={saved.get(k, default(k))!r} (flags say {getattr(cfg, k)!r})" for k in RUN_FIELDS
               if k in cfg.given and getattr(cfg, k) != saved.get(k, default(k))]
    if changed:
        fail(f"checkpoint {path} was trained with {', '.join(changed)}; --resume continues a run as it began: "
             "drop these flags, or choose another --out_dir for a new run")
    kept = [k for k in (*RUN_FIELDS, "eval_interval", "log_interval") if k in saved and k not in cfg.given]
    return replace(cfg, **{k: saved[k] for k in kept})


# ----------------------------------------------------------------------------- setup

def setup_device(cfg):
    """Returns (device, ddp rank, world size), starting the process group under torchrun."""
    want_cuda = cfg.device in ("auto", "cuda") and torch.cuda.is_available()
    if cfg.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda, but torch sees no CUDA device")
    if "RANK" in os.environ:  # torchrun
        if want_cuda:  # each process its GPU, told to NCCL (else it guesses one from the rank)
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)
            dist.init_process_group(backend="nccl", device_id=device)
            return str(device), dist.get_rank(), dist.get_world_size()
        dist.init_process_group(backend="gloo")
        return "cpu", dist.get_rank(), dist.get_world_size()
    if want_cuda:
        return "cuda", 0, 1
    if cfg.device in ("auto", "mps") and torch.backends.mps.is_available():
        return "mps", 0, 1
    if cfg.device == "mps":
        fail("--device mps, but torch sees no MPS device")
    return "cpu", 0, 1


def split_batch(batch_size, grad_accum, run, world):
    """(batch_size, grad_accum), those not given: the default's micro-steps rounded up to a multiple of
    the processes, and the batch that keeps its global batch (CUDA: 32 x 4 on 1, 2 or 4, 16 x 8 on 8)."""
    if grad_accum is None:
        grad_accum = world * math.ceil(run["grad_accum"] / world)
    if batch_size is None:
        batch_size = max(1, run["batch_size"] * run["grad_accum"] // grad_accum)
    return batch_size, grad_accum


def resolve(cfg, device, world=1):
    """Fill the device-dependent defaults and return (cfg, reasons) for the start-up banner."""
    device_type = torch.device(device).type
    run = PAPER_RUN if device_type == "cuda" else CPU_RUN
    gpt_on_cpu = run is CPU_RUN and cfg.objective == "clm"
    if gpt_on_cpu:
        run = {**CPU_RUN, "warmup_frac": CPU_GPT_WARMUP, "lr": CPU_GPT_LR.get(cfg.block, CPU_RUN["lr"])}
    unset = [k for k in run if getattr(cfg, k) is None]
    batch_size, grad_accum = split_batch(cfg.batch_size, cfg.grad_accum, run, world)
    cfg = replace(cfg, **{**{k: run[k] for k in unset}, "batch_size": batch_size, "grad_accum": grad_accum})
    why = {"defaults": "" if not unset else
           f" | {'the paper run' if run is PAPER_RUN else 'CPU-sized'} defaults for {', '.join(unset)}"}
    found = []  # the defaults that come from the factor study, for the banner
    if gpt_on_cpu and "warmup_frac" in unset:
        found.append(f"warmup {cfg.warmup_frac:.0%}")
    if gpt_on_cpu and "lr" in unset and cfg.block in CPU_GPT_LR:
        found.append(f"lr {cfg.lr:g} for {cfg.block}")
    if found:
        why["defaults"] += f" ({', '.join(found)}: the reproduction's finding, README: Reproduction)"
    if gpt_on_cpu and "lr" in unset and cfg.block not in CPU_GPT_LR:
        why["defaults"] += (f" | lr {cfg.lr:g}: the paper's, as {cfg.block} has no rate tuned on CPU (to tune it as "
                            f"the others were: python reproduce.py --blocks pre_ln,{cfg.block})")
    target = run["batch_size"] * run["grad_accum"]
    if cfg.batch_size * cfg.grad_accum != target and {"batch_size", "grad_accum"} & set(unset):
        why["batch"] = (f" (not the default {target}: it does not split over {world} processes)" if "batch_size" in unset
                        else f" (not the default {target}: --batch_size {cfg.batch_size} keeps the default micro-steps)")
    if cfg.dtype == "auto":
        dtype, why["dtype"] = autocast_dtype(device)
        cfg = replace(cfg, dtype=dtype)
    if cfg.compile is None:
        cfg = replace(cfg, compile=device_type == "cuda")
        why["compile"] = "default on CUDA" if cfg.compile else "off: no gain measured on CPU"
    return replace(cfg, out_dir=out_dir(cfg)), why


def out_dir(cfg):
    """--out_dir, by default out/<block>, then _<norm> for other norms and _mlm for mlm."""
    if cfg.out_dir is not None:
        return cfg.out_dir
    norm = "" if cfg.norm == "rmsnorm" else f"_{cfg.norm}"
    return f"out/{cfg.block}{norm}" + ("_mlm" if cfg.objective == "mlm" else "")


def validate(cfg, world):
    if cfg.block not in BLOCKS:  # e.g. a checkpoint of a block of one's own, resumed without its --import
        fail(f"unknown block {cfg.block!r}; valid: {', '.join(BLOCKS)} (a block of your own: --import FILE)")
    for name in ("batch_size", "grad_accum", "max_iters", "eval_interval", "log_interval", "eval_tokens"):
        if getattr(cfg, name) < 1:
            fail(f"--{name} must be >= 1")
    if cfg.grad_accum % world:
        fail(f"--grad_accum {cfg.grad_accum} must be a multiple of the {world} processes")
    if cfg.eval_tokens < cfg.block_size:
        fail(f"--eval_tokens {cfg.eval_tokens} is less than one sequence of {cfg.block_size}")
    if not 0 <= cfg.warmup_frac <= 1:
        fail(f"--warmup_frac {cfg.warmup_frac} must be between 0 and 1")
    if not 0 < cfg.mask_prob < 1:
        fail(f"--mask_prob {cfg.mask_prob} must be between 0 and 1 (exclusive)")
    if not cfg.lr > 0:
        fail(f"--lr {cfg.lr} must be > 0")
    if not (0 <= cfg.beta1 < 1 and 0 <= cfg.beta2 < 1):
        fail(f"--beta1 {cfg.beta1} and --beta2 {cfg.beta2} must be in [0, 1)")
    if cfg.weight_decay < 0 or cfg.grad_clip < 0:
        fail("--weight_decay and --grad_clip must be >= 0")
    if cfg.optimizer == "muon" and not hasattr(torch.optim, "Muon"):
        fail(f"--optimizer muon needs torch.optim.Muon (torch 2.9 or later); this is torch {torch.__version__}")
    if cfg.dtype == "float16" and not cfg.device.startswith("cuda"):
        fail("--dtype float16 needs CUDA (its loss scaler); use bfloat16 or float32")
    try:  # the model's own checks (shape, switches), before anything is written
        GPTConfig(**{k: getattr(cfg, k) for k in MODEL_FIELDS})
    except ValueError as e:
        fail(str(e))


def make_out_dir(cfg):
    out = Path(cfg.out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write_test_{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        fail(f"cannot write to --out_dir {out}: {e.strerror}")
    return out


def padded_vocab(n_tokens, mlm):
    """The model's vocabulary: the tokenizer's n_tokens, MLM's mask token (the first id past them),
    padded to a multiple of 64 (faster matmuls)."""
    return (n_tokens + mlm + 63) // 64 * 64


def warmup_steps(warmup_frac, max_iters):
    return max(1, int(warmup_frac * max_iters))


def human(n):
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else f"{n:.0f}"


# ----------------------------------------------------------------------------- training

class Trainer:
    """One run: __init__ sets it up (device, data, model, optimizer, checkpoint); run() is the loop."""

    def __init__(self, cfg):
        device, self.rank, self.world = setup_device(cfg)
        self.master, self.device = self.rank == 0, device
        device_type = torch.device(device).type
        cfg = replace(cfg, device=device, out_dir=out_dir(cfg))
        self.ckpt_path, self.log_path = Path(cfg.out_dir) / "ckpt.pt", Path(cfg.out_dir) / "log.jsonl"
        if cfg.resume and not self.ckpt_path.exists():
            fail(f"--resume: no checkpoint {self.ckpt_path}; drop --resume to start a new run")
        ckpt = load_checkpoint(self.ckpt_path, device, "train") if cfg.resume else None
        if ckpt:
            cfg = continued(cfg, ckpt["config"], self.ckpt_path)
            saved = ckpt["config"]
            if cfg.dtype == "auto" and torch.device(saved["device"]).type == device_type and saved["dtype"] != "float16":
                cfg = replace(cfg, dtype=saved["dtype"])  # the same kind of device: as the run began, not re-measured
        cfg, self.why = resolve(cfg, device, self.world)
        validate(cfg, self.world)
        if not cfg.resume and self.ckpt_path.exists():
            fail(f"{self.ckpt_path.parent} already holds a run; --resume continues it, or choose another --out_dir")
        self.cfg = cfg
        if device_type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True  # TF32 for any fp32 matmul left
            torch.backends.cudnn.allow_tf32 = True
        elif device_type == "cpu":
            tune_cpu_allocator()
        self.meta, self.paths = load_dataset(cfg, self.master)
        self.tokenizer = self.closing_sample_tokenizer()
        self.build_model(ckpt)
        make_out_dir(cfg)
        self.it, self.elapsed, self.loss_sum, self.loss_count = 0, 0.0, torch.zeros((), device=device), 0
        self.stalled_at = None  # the iter the user was told the run stalled at
        if ckpt:
            self.restore(ckpt)
        elif self.master:
            self.log_path.write_text("")  # a new run, a new log
        self.resumed_at = self.it if ckpt else None
        self.plan_steps_and_evaluations()
        self.stop_asked = False

    def build_model(self, ckpt):
        """The model (compiled, wrapped in DDP under torchrun), its optimizer, loss scaler and autocast."""
        cfg, device_type = self.cfg, torch.device(self.device).type
        mlm = cfg.objective == "mlm"
        n_tokens = self.meta["vocab_size"]
        self.masking = Masking(cfg.mask_prob, cfg.block_size, n_tokens, n_tokens) if mlm else None  # mask: id n_tokens
        self.model_config = GPTConfig(vocab_size=padded_vocab(n_tokens, mlm), causal=not mlm, **{k: getattr(cfg, k) for k in MODEL_FIELDS})
        if ckpt and {**asdict(self.model_config), **ckpt["model_config"]} != asdict(self.model_config):
            fail(f"checkpoint {self.ckpt_path} holds another model than {cfg.dataset} makes: "
                 f"{ckpt['model_config']} (the dataset's vocabulary changed?)")
        torch.manual_seed(cfg.seed)
        try:
            self.raw_model = GPT(self.model_config).to(self.device)
        except ValueError as e:  # e.g. qk_norm for a block of one's own without attention
            fail(str(e))
        self.optimizers = configure_optimizers(self.raw_model, cfg.weight_decay, cfg.lr, (cfg.beta1, cfg.beta2), device_type,
                                                              cfg.optimizer)
        self.scaler = torch.amp.GradScaler(device_type, enabled=cfg.dtype == "float16")
        self.data_rng = torch.Generator().manual_seed(cfg.seed)  # batches and masks; the same on every rank
        # static shapes: evaluation (through it too) ends in a shorter batch, which would make the
        # training graph dynamic-shaped; so that batch compiles a graph of its own, once
        self.compiled = torch.compile(self.raw_model, dynamic=False) if cfg.compile else self.raw_model
        self.model = self.compiled
        if self.world > 1:
            self.model = DDP(self.compiled, device_ids=[torch.device(self.device).index] if device_type == "cuda" else None)
        self.autocast = (torch.autocast(device_type, dtype=getattr(torch, cfg.dtype))
                         if cfg.dtype != "float32" else nullcontext())

    def plan_steps_and_evaluations(self):
        """Tokens and FLOPs per step, the warmup, and the fixed validation sequences (and masks)."""
        cfg = self.cfg
        self.tokens_per_iter = cfg.batch_size * cfg.grad_accum * cfg.block_size
        self.n_train = int(self.meta["train_tokens"])
        self.warmup = warmup_steps(cfg.warmup_frac, cfg.max_iters)
        self.all_val_offsets = prepare_data.spread_offsets(int(self.meta["val_tokens"]), cfg.eval_tokens // cfg.block_size,
                                                           cfg.block_size)
        self.val_offsets = self.all_val_offsets[self.rank::self.world]  # each rank evaluates its share
        self.val_masks = None  # MLM: the same masks at every evaluation, so evaluations compare
        if self.masking:
            masks = self.masking.draw((len(self.all_val_offsets),), torch.Generator().manual_seed(cfg.seed))
            self.val_masks = tuple(to_device(t[self.rank::self.world], self.device) for t in masks)
        self.unigram = prepare_data.unigram_level(self.paths["val"], self.all_val_offsets, cfg.block_size)
        self.peak = device_peak(self.device, cfg.dtype)
        predicted = self.masking.k / cfg.block_size if self.masking else 1.0
        self.flops_per_iter = self.raw_model.flops_per_token(cfg.block_size, predicted) * self.tokens_per_iter

    def closing_sample_tokenizer(self):
        """The tokenizer the sample at the end needs, checked now rather than after the run;
        None (with a warning) if it cannot load here, e.g. GPT-2's offline without its files."""
        try:
            return prepare_data.load_tokenizer(self.meta["tokenizer"])
        except SystemExit as e:
            if self.master:
                print(f"train: warning: the run will end without a sample: {e}", file=sys.stderr)
            return None

    def restore(self, ckpt):
        load_weights(self.raw_model, ckpt, self.ckpt_path, "train")
        states = ckpt["optimizers"] if "optimizers" in ckpt else [ckpt["optimizer"]]  # a checkpoint of an older version
        for optimizer, state in zip(self.optimizers, states, strict=True):
            optimizer.load_state_dict(state)
        if self.cfg.dtype == "float16" == ckpt["config"]["dtype"]:  # else a fresh scaler, or none
            self.scaler.load_state_dict(ckpt["scaler"])
        self.data_rng.set_state(ckpt["data_rng"].cpu())  # map_location moved it to the device
        torch.set_rng_state(ckpt["torch_rng"].cpu())
        self.it, self.elapsed, self.loss_count = ckpt["iter"], ckpt["elapsed_s"], ckpt["loss_count"]
        self.loss_sum = torch.tensor(ckpt["loss_sum"], device=self.device)
        if self.master:  # drop log records past the checkpoint: they will be made again
            records = [r for r in read_records(self.log_path) if r["iter"] <= self.it]
            self.log_path.write_text("".join(json.dumps(r) + "\n" for r in records))
            self.stalled_at = next((r["iter"] for r in records if r.get("stalled")), None)  # warned already

    def save(self):
        save_checkpoint(self.ckpt_path, dict(
            model=self.raw_model.state_dict(), optimizers=[o.state_dict() for o in self.optimizers],
            scaler=self.scaler.state_dict(),
            iter=self.it, elapsed_s=self.elapsed, loss_sum=self.loss_sum.item(), loss_count=self.loss_count,
            data_rng=self.data_rng.get_state(), torch_rng=torch.get_rng_state(), config=asdict(self.cfg),
            model_config=asdict(self.model_config), tokenizer=self.meta["tokenizer"]))

    def lr_at(self, step):
        """Linear warmup over warmup_frac of the steps, then decay to 0: linear, or cosine (Fig. 12)."""
        cfg = self.cfg
        if step < self.warmup:
            return cfg.lr * (step + 1) / self.warmup
        left = max(0.0, (cfg.max_iters - step) / max(1, cfg.max_iters - self.warmup))  # 1 -> 0
        return cfg.lr * (left if cfg.schedule == "linear" else 0.5 * (1 - math.cos(math.pi * left)))

    def batch(self, split, offsets, masks=None):
        """Model inputs (idx, targets, positions) of the sequences at offsets: every next token
        (clm), or the tokens hidden by masks, (positions, put) on the device, at positions (mlm)."""
        x, y = get_batch(self.paths[split], offsets, self.cfg.block_size, self.device)
        if masks is None:
            return x, y, None
        x, targets = Masking.apply(x, *masks)
        return x, targets, masks[0]

    def train_step(self):
        """One optimizer step: this rank's share of grad_accum micro-batches, then clip and step.
        Returns the step's mean loss, left on the device."""
        cfg = self.cfg
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = self.lr_at(self.it)
        offsets = torch.randint(0, self.n_train - cfg.block_size - 1, (cfg.grad_accum, cfg.batch_size),
                                generator=self.data_rng).numpy()
        masks = None
        if self.masking:  # the whole step's masks, in one copy to the device
            masks = tuple(to_device(t, self.device) for t in self.masking.draw((cfg.grad_accum, cfg.batch_size), self.data_rng))
        micro_steps = cfg.grad_accum // self.world
        loss_acc = torch.zeros((), device=self.device)
        for micro, row in enumerate(range(self.rank, cfg.grad_accum, self.world)):
            x, y, positions = self.batch("train", offsets[row], None if masks is None else (masks[0][row], masks[1][row]))
            if self.world > 1:  # all-reduce gradients on the last micro-step only
                self.model.require_backward_grad_sync = micro == micro_steps - 1
            with self.autocast:
                _, loss = self.model(x, y, positions=positions)
            self.scaler.scale(loss / micro_steps).backward()
            loss_acc += loss.detach() / micro_steps
        for optimizer in self.optimizers:
            self.scaler.unscale_(optimizer)  # float16's loss scale off the gradients (else a no-op)
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), cfg.grad_clip)
        # float16: an overflow anywhere skips the whole step, for every optimizer alike
        overflow = self.scaler.is_enabled() and not all(p.grad.isfinite().all() for p in self.raw_model.parameters()
                                                        if p.grad is not None)
        for optimizer in self.optimizers:
            if not overflow:
                self.scaler.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
        self.scaler.update()
        self.loss_sum += loss_acc  # stays on the device: no wait for the GPU in most steps
        self.loss_count += 1
        self.it += 1
        return loss_acc

    @torch.no_grad()
    def diagnostics(self):
        """From one forward pass on the first validation sequences: the mean cosine similarity of the
        last block's tokens (near 1: rank collapse) and each layer's outlier_stats."""
        x, _, _ = self.batch("val", self.all_val_offsets[:self.cfg.batch_size])
        with self.autocast:
            streams, attention_inputs = residual_streams(self.raw_model, x)
            return round(mean_cosine(streams[-1]), 4), outlier_stats(self.raw_model, streams, attention_inputs)

    def evaluate(self):
        """The run's validation loss, of the model as it trains (compiled, where it is)."""
        return self.val_loss(self.compiled)

    @torch.no_grad()
    def val_loss(self, model):
        """Mean loss of model on the fixed validation sequences (and masks), over all ranks."""
        B = self.cfg.batch_size
        loss_sum, n_seq = torch.zeros((), device=self.device), 0
        for i in range(0, len(self.val_offsets), B):
            masks = None if self.val_masks is None else tuple(t[i:i + B] for t in self.val_masks)
            x, y, positions = self.batch("val", self.val_offsets[i:i + B], masks)
            with self.autocast:
                loss_sum += model(x, y, positions=positions)[1].float() * len(x)
            n_seq += len(x)
        total = torch.stack([loss_sum, torch.tensor(float(n_seq), device=self.device)])
        if self.world > 1:
            dist.all_reduce(total)
        return (total[0] / total[1]).item()

    def evaluate_and_save(self):
        """Evaluate, append a record to log.jsonl, checkpoint."""
        val_loss = self.evaluate()
        if self.world > 1:
            dist.all_reduce(self.loss_sum, op=dist.ReduceOp.AVG)
        train_loss = self.loss_sum.item() / self.loss_count if self.loss_count else None
        if not math.isfinite(val_loss) or (train_loss is not None and not math.isfinite(train_loss)):
            self.diverged(f"loss is not finite (val {val_loss})")
        stall_check = max(STALL_AFTER, min(2 * self.warmup + STALL_AFTER, self.cfg.max_iters))  # from this iter on
        stalled = self.it >= stall_check and val_loss > STALL_LEVEL * self.unigram
        extra = {}
        if self.it >= self.cfg.max_iters:  # the last evaluation: the loss int8 inference would have
            with int8_inputs(self.raw_model):  # (hooks: the raw model, not the compiled one)
                extra["val_loss_int8"] = self.val_loss(self.raw_model)
        if self.master:
            similarity, outliers = self.diagnostics()
            record = dict(iter=self.it, train_loss=train_loss, val_loss=val_loss, **extra, elapsed_s=round(self.elapsed, 3),
                          tokens=self.it * self.tokens_per_iter, lr=self.lr_at(min(self.it, self.cfg.max_iters - 1)),
                          stalled=stalled, similarity=similarity, outliers=outliers, gains=learned_gains(self.raw_model))
            with open(self.log_path, "a") as f:
                f.write(json.dumps(record) + "\n")
            print(f"eval {self.it}: val loss {val_loss:.4f}"
                  + (f" | train loss {train_loss:.4f}" if train_loss is not None else "")
                  + (f" | int8 {extra['val_loss_int8']:.4f}" if extra else ""), flush=True)
            if stalled and self.stalled_at is None:
                self.stalled_at = self.it
                print(f"train: warning: the run has stalled: at iter {self.it} its val loss is still at the unigram "
                      f"level {self.unigram:.3f} (token frequencies alone, no context), and its tokens look alike "
                      f"(similarity {record['similarity']:.3f}). Skipless blocks do this at too high a learning rate "
                      "for a short warmup (README: 'When a run stalls'): try a lower --lr or a longer --warmup_frac. "
                      "Training goes on; Ctrl-C saves a checkpoint.", flush=True)
        self.loss_sum, self.loss_count = torch.zeros((), device=self.device), 0
        if self.master:
            self.save()
        self.t_lap, self.it_lap = time.perf_counter(), self.it  # evaluation time is not training time

    def diverged(self, what):
        """Stops a run whose loss or weights are not finite; its last log record says so."""
        if self.master:
            with open(self.log_path, "a") as f:
                f.write(json.dumps(dict(iter=self.it, diverged=True)) + "\n")
        fail(f"diverged: {what} at iter {self.it}; the last good checkpoint stays in {self.ckpt_path}; try a lower --lr")

    def first_step_apart(self, loss_acc):
        """The first step compiles and warms the allocator: timed apart, it skews no step time or ETA."""
        loss_acc.item()  # waits for the device
        now = time.perf_counter()
        self.first_step_s, self.t_lap, self.it_lap = now - self.t_lap, now, self.it
        if self.master and self.cfg.compile:
            print(f"compile: the first step took {self.first_step_s:.1f} s (compiling); "
                  "timings leave it out", flush=True)

    def log_step(self, loss_acc):
        """At log and eval steps: wait for the device, clock the steps since the last lap, print."""
        cfg = self.cfg
        if self.world > 1:
            dist.all_reduce(loss_acc, op=dist.ReduceOp.AVG)
        step_loss = loss_acc.item()  # waits for the device, so the clock below is true
        if not math.isfinite(step_loss):
            self.diverged(f"loss is {step_loss}")
        now, steps = time.perf_counter(), self.it - self.it_lap
        if steps:  # else only the first step ran since the last lap, timed apart
            dt = (now - self.t_lap) / steps  # per step, since the last lap
            self.elapsed, self.t_lap, self.it_lap = self.elapsed + now - self.t_lap, now, self.it
            self.dt_avg = dt if self.dt_avg is None else 0.8 * self.dt_avg + 0.2 * dt
        if self.master and (self.it % cfg.log_interval == 0 or self.it == cfg.max_iters):
            if steps:
                mfu = f" | mfu {self.flops_per_iter / self.world / self.dt_avg / self.peak:.0%}" if self.peak else ""
                eta = int(self.dt_avg * (cfg.max_iters - self.it))
                timing = (f"{dt * 1000:.0f} ms | {human(self.tokens_per_iter / dt)} tok/s{mfu} | "
                          f"eta {eta // 60}m{eta % 60:02d}s")
            else:
                timing = f"{self.first_step_s * 1000:.0f} ms (first step)"
            print(f"iter {self.it}/{cfg.max_iters} | loss {step_loss:.4f} | lr {self.lr_at(self.it - 1):.1e} | {timing}",
                  flush=True)

    def on_signal(self, signum, frame):
        if self.stop_asked:
            raise KeyboardInterrupt
        self.stop_asked = True
        if self.master:
            print("\ntrain: stopping after this step to save a checkpoint (again to abort)", flush=True)

    def should_stop(self):
        """Was Ctrl-C pressed? Under DDP the ranks agree at log steps, where they sync anyway."""
        if self.world == 1:
            return self.stop_asked
        if self.it % self.cfg.log_interval:
            return False
        flag = torch.tensor(float(self.stop_asked), device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def print_banner(self):
        cfg, meta, model = self.cfg, self.meta, self.raw_model
        objective = ("next-token prediction" if not self.masking else
                     f"masked LM, bidirectional, {self.masking.k} of {cfg.block_size} positions masked")
        print(f"device: {self.device}" + (f" x {self.world} processes" if self.world > 1 else "")
              + f" | dtype: {cfg.dtype} ({self.why.get('dtype', 'as asked')}) | compile: {cfg.compile} "
              f"({self.why.get('compile', 'as asked')})")
        print(f"model: {cfg.block}, norm {cfg.norm}, {cfg.n_layer} x {cfg.n_embd}, {cfg.n_head} heads, "
              f"T {cfg.block_size}, vocab {self.model_config.vocab_size} ({meta['tokenizer']}): "
              f"{human(model.num_params())} parameters ({human(model.num_params(non_embedding=True))} without "
              f"embeddings) | {objective}{self.why['defaults']}")
        print(f"data: {cfg.dataset}, {human(self.n_train)} train tokens | {self.tokens_per_iter:,} tokens per step: "
              f"{cfg.batch_size * cfg.grad_accum} sequences{self.why.get('batch', '')} ({cfg.batch_size} x "
              f"{cfg.block_size} x {cfg.grad_accum} accumulated) | {cfg.max_iters} steps ({self.warmup} of warmup "
              f"to lr {cfg.lr:g}, {OPTIMIZER_BANNER[cfg.optimizer]}) "
              f"| eval every {cfg.eval_interval} on {len(self.all_val_offsets) * cfg.block_size:,} "
              f"val tokens | out: {self.log_path.parent}" + (f" | resuming at iter {self.it}" if self.resumed_at is not None else ""))

    def run(self):
        """The loop: evaluate and save at eval steps, stop when done or asked, else train a step."""
        cfg = self.cfg
        previous_handlers = {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        if self.master:
            self.print_banner()
        self.t_lap, self.it_lap, self.dt_avg, first = time.perf_counter(), self.it, None, self.it
        if self.master and self.it >= cfg.max_iters:
            print(f"train: the run in {self.log_path.parent} is finished (iter {self.it} of {cfg.max_iters}); "
                  "nothing to do")
        try:
            while True:
                if (self.it % cfg.eval_interval == 0 or self.it >= cfg.max_iters) and self.it != self.resumed_at:
                    self.evaluate_and_save()
                if self.it >= cfg.max_iters:
                    break
                if self.should_stop():
                    self.elapsed += time.perf_counter() - self.t_lap
                    if not all(p.isfinite().all() for p in self.raw_model.parameters()):  # a NaN since the last log
                        self.diverged("the weights are not finite")
                    if self.master:
                        self.save()
                        print(f"train: saved {self.ckpt_path} at iter {self.it}; continue with --resume")
                    break
                loss = self.train_step()
                if self.it == first + 1:
                    self.first_step_apart(loss)
                if self.it % cfg.log_interval == 0 or self.it % cfg.eval_interval == 0 or self.it == cfg.max_iters:
                    self.log_step(loss)
            if self.world > 1:
                dist.barrier()  # no rank leaves while another still talks to it
        finally:
            for s, handler in previous_handlers.items():
                signal.signal(s, handler)
            if dist.is_initialized():
                dist.destroy_process_group()
        if self.master and self.it == cfg.max_iters and self.resumed_at != cfg.max_iters:
            print(f"train: done in {self.elapsed:.0f} s of training; log: {self.log_path}")
            if self.tokenizer:
                self.closing_sample()
        return self.raw_model

    def closing_sample(self):
        """A short sample (an encoder fills in sample.py's default prompt), and how to make more."""
        try:
            text = sample_text(self.raw_model, self.tokenizer, None, 100, self.device)
        except SystemExit as e:  # e.g. that prompt is longer than a tiny block_size
            return print(f"train: no sample: {e}")
        more = "".join(f" --import {f}" for f in self.cfg.imports)
        print(f"sample:\n{text}\n(more: python sample.py {self.cfg.out_dir}{more})")


def train(cfg):
    return Trainer(cfg).run()


def main(argv=None):
    return train(parse_args(argv))


if __name__ == "__main__":
    main()
