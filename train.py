"""
Train a GPT built from any block of "Simplifying Transformer Blocks", nanoGPT style.

    python train.py --block sas_p                    # CUDA: the paper's run; CPU: ~11 minutes
    python train.py --block pre_ln --n_layer 8       # every model flag mirrors GPTConfig
    python train.py --block sas_p --resume           # continue an interrupted run
    python train.py --block sas_p --sample           # print text from the run's checkpoint
    torchrun --nproc_per_node=8 train.py --block sas_p          # data parallel (DDP)

Defaults follow the paper (SPEC §4): AdamW (0.9, 0.999), weight decay 0.1 on matrices only,
lr 1e-3, linear warmup over 5% of the steps then linear decay to 0, grad clip 1.0, T = 128.
On CUDA the shape, batch and length are the paper's (18 x 768, 128 sequences, 40K steps); on
CPU a small model that learns visibly within 15 minutes on 2 cores.
Each evaluation appends to <out_dir>/log.jsonl and rewrites <out_dir>/ckpt.pt atomically.
"""

import argparse
import ctypes
import json
import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import prepare_data
from simple_gpt import BLOCKS, GPT, NORMS, GPTConfig


def arg(default, help, kind=None, choices=None):
    """A TrainConfig field that parse_args turns into --name with this help."""
    return field(default=default, metadata=dict(help=help, type=kind or type(default), choices=choices))


@dataclass
class TrainConfig:
    # model: the fields of GPTConfig (vocab_size comes from the dataset)
    block: str = arg("sas_p", "transformer block", choices=list(BLOCKS))
    norm: str = arg("rmsnorm", "normalisation inside blocks", choices=list(NORMS))
    n_layer: int = arg(None, "layers (default: 18 on CUDA, 6 on CPU)", int)
    n_head: int = arg(None, "attention heads (default: 12 on CUDA, 4 on CPU)", int)
    n_embd: int = arg(None, "width d (default: 768 on CUDA, 128 on CPU)", int)
    block_size: int = arg(128, "context length T (the paper's 128)")
    beta_ff: float = arg(None, "initial MLP gain of SAS/SAS-P/V-SkipInit (default: 0.1*sqrt(18/n_layer))", float)
    # data and output
    dataset: str = arg(prepare_data.DEFAULT_DATASET, "dataset folder under --data_dir, made by prepare_data.py")
    data_dir: str = arg("data", "parent folder of datasets")
    out_dir: str = arg(None, "checkpoint and log.jsonl folder (default: out/<block>, out/<block>_<norm> for other norms)", str)
    # optimisation
    batch_size: int = arg(None, "sequences per micro-step (default: 32 on CUDA, 16 on CPU)", int)
    grad_accum: int = arg(None, "micro-steps per step, over all processes (default: 4 on CUDA, 1 on CPU)", int)
    max_iters: int = arg(None, "optimizer steps (default: 40000 on CUDA, 800 on CPU)", int)
    lr: float = arg(1e-3, "peak learning rate (the paper's 1e-3; it used 3e-4 for V-SkipInit at depth 18)")
    warmup_frac: float = arg(0.05, "fraction of steps of linear warmup; then linear decay to 0")
    weight_decay: float = arg(0.1, "AdamW weight decay on matrices and embeddings (not gains or norms)")
    beta1: float = arg(0.9, "AdamW beta1")
    beta2: float = arg(0.999, "AdamW beta2")
    grad_clip: float = arg(1.0, "clip the gradient norm to this (0: off)")
    # evaluation and logging
    eval_interval: int = arg(None, "steps between evaluations and checkpoints (default: 1000 on CUDA, 100 on CPU)", int)
    eval_tokens: int = arg(None, "fixed validation budget, the same tokens at every eval (default: 2^20 on CUDA, 2^15 on CPU)", int)
    log_interval: int = arg(10, "steps between log lines")
    # system
    device: str = arg("auto", "auto picks cuda > mps > cpu", choices=["auto", "cuda", "mps", "cpu"])
    dtype: str = arg("auto", "autocast dtype; auto: bfloat16 on CUDA where supported, else float32",
                     choices=["auto", "float32", "bfloat16", "float16"])
    compile: bool = arg(None, "torch.compile the model (default: on for CUDA only; no gain measured on CPU)", bool)
    seed: int = arg(1337, "seed of the weights and of the batch order")
    resume: bool = arg(False, "continue the run in --out_dir from its checkpoint")
    # sampling
    sample: bool = arg(False, "print text sampled from --out_dir's checkpoint and exit")
    prompt: str = arg("def ", "prompt for sampling")
    sample_tokens: int = arg(200, "tokens to sample")


PAPER_RUN = dict(n_layer=18, n_head=12, n_embd=768, batch_size=32, grad_accum=4, max_iters=40_000,
                 eval_interval=1000, eval_tokens=2**20)
CPU_RUN = dict(n_layer=6, n_head=4, n_embd=128, batch_size=16, grad_accum=1, max_iters=800,
               eval_interval=100, eval_tokens=2**15)
MODEL_FIELDS = ("block", "norm", "n_layer", "n_head", "n_embd", "block_size", "beta_ff")

# dense bf16 tensor-core peak FLOP/s by device name, for MFU; first match wins
PEAK_FLOPS = [("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12),
              ("L40S", 362e12), ("L4", 121e12), ("A10", 125e12), ("4090", 165e12),
              ("3090", 71e12), ("V100", 125e12), ("T4", 65e12)]


DIVERGED = "diverged:"  # starts the error of a run stopped by a non-finite loss (reproduce.py looks for it)


def fail(message):
    raise SystemExit(f"train: error: {message}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="train.py", usage="%(prog)s [--block NAME] [--flag VALUE ...] (see --help)",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in fields(TrainConfig):
        kind, shown = f.metadata["type"], "" if f.default is None else f" (default: {f.default})"
        if kind is bool:
            p.add_argument(f"--{f.name}", action=argparse.BooleanOptionalAction, default=f.default,
                           help=f.metadata["help"] + shown)
        else:
            p.add_argument(f"--{f.name}", type=kind, default=f.default, choices=f.metadata["choices"],
                           help=f.metadata["help"] + shown)
    return TrainConfig(**vars(p.parse_args(argv)))


def tune_cpu_allocator():
    """glibc hands the large (B, T, vocab) logits back to the OS after every step and maps them
    afresh on the next; keeping them in the heap made CPU steps ~1/3 faster and less noisy.
    (Setting MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ before Python starts does the same.)"""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    libc.mallopt(M_MMAP_THRESHOLD, 2**31 - 1)
    libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)


def peak_flops(device):
    if torch.device(device).type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_FLOPS if key in name), None)


def learned_gains(model):
    """Every trainable gain of the paper, one value per layer (per-head gains averaged): the
    trajectories of Fig. 4. value_* are the first layer's W^V = alpha_V I + beta_V dW."""
    gains = {}
    for name, p in model.named_parameters():
        *path, leaf = name.split(".")
        if leaf in ("alpha", "beta", "gamma", "beta_sa", "alpha_ff", "beta_ff"):
            key = f"value_{leaf}" if path[-1] == "c_v" else leaf
            gains.setdefault(key, []).append(round(p.detach().float().mean().item(), 5))
    if "value_alpha" in gains:
        gains["value_beta_over_alpha"] = [round(b / a, 5) for a, b in zip(gains["value_alpha"], gains["value_beta"])]
    return gains


# ----------------------------------------------------------------------------- data

def load_dataset(cfg, master):
    """Check data/<dataset> and return (meta, {split: path}); the default corpus is prepared
    on first use."""
    folder = Path(cfg.data_dir) / cfg.dataset
    if not (folder / "meta.json").exists():
        if cfg.dataset != prepare_data.DEFAULT_DATASET:
            fail(f"dataset {folder} is not prepared; run: python prepare_data.py --input YOUR_FILES "
                 f"--name {cfg.dataset} --data_dir {cfg.data_dir}")
        if master:
            print(f"train: {folder} not found, preparing the default corpus (Python's standard library)")
            prepare_data.main(["--data_dir", cfg.data_dir])
        if dist.is_initialized():
            dist.barrier()
    meta = json.loads((folder / "meta.json").read_text())
    paths = {split: folder / f"{split}.bin" for split in ("train", "val")}
    for path in paths.values():
        if not path.exists():
            fail(f"{path} is missing; rerun prepare_data.py for {folder}")
        size = path.stat().st_size
        if size % 2:
            fail(f"{path} is corrupt: {size} bytes is not a whole number of uint16 tokens")
        if size // 2 < cfg.block_size + 1:
            fail(f"{path} holds {size // 2} tokens, fewer than one sequence of block_size + 1")
        top = int(np.memmap(path, dtype=np.uint16, mode="r").max())
        if top >= meta["vocab_size"]:
            fail(f"{path} is corrupt: token id {top} >= vocab_size {meta['vocab_size']} of meta.json")
    return meta, paths


def get_batch(path, offsets, T, device):
    data = np.memmap(path, dtype=np.uint16, mode="r")  # a fresh memmap per batch: no memory growth
    seqs = torch.from_numpy(np.stack([data[o:o + T + 1] for o in offsets]).astype(np.int64))
    x, y = seqs[:, :-1], seqs[:, 1:]
    if torch.device(device).type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


# ----------------------------------------------------------------------------- checkpoints

def save_checkpoint(path, state):
    """Atomic: a crash while writing leaves the previous checkpoint intact."""
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path, device):
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as e:
        fail(f"cannot read checkpoint {path} ({type(e).__name__}: {str(e).splitlines()[0][:160]})")


def check_same_model(ckpt, model_config, path):
    saved = ckpt["model_config"]
    diff = [f"{k}={saved.get(k)!r} (flags say {v!r})" for k, v in asdict(model_config).items() if saved.get(k) != v]
    if diff:
        fail(f"checkpoint {path} is of another model: {', '.join(diff)}; "
             "pass the same model flags, or another --out_dir for a new run")


# ----------------------------------------------------------------------------- setup

def setup_device(cfg):
    """Returns (device, ddp rank, world size), starting the process group under torchrun."""
    want_cuda = cfg.device in ("auto", "cuda") and torch.cuda.is_available()
    if cfg.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda, but torch sees no CUDA device")
    if "RANK" in os.environ:  # torchrun
        dist.init_process_group(backend="nccl" if want_cuda else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        if want_cuda:
            local = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(local)
            return f"cuda:{local}", rank, world
        return "cpu", rank, world
    if want_cuda:
        return "cuda", 0, 1
    if cfg.device in ("auto", "mps") and torch.backends.mps.is_available():
        return "mps", 0, 1
    if cfg.device == "mps":
        fail("--device mps, but torch sees no MPS device")
    return "cpu", 0, 1


def resolve(cfg, device_type):
    """Fill the device-dependent defaults and return (cfg, reasons) for the start-up banner."""
    run = PAPER_RUN if device_type == "cuda" else CPU_RUN
    unset = [k for k in run if getattr(cfg, k) is None]
    cfg = replace(cfg, **{k: run[k] for k in unset})
    why = {"defaults": "" if not unset else
           f" | {'the paper run' if run is PAPER_RUN else 'CPU-sized'} defaults for {', '.join(unset)}"}
    if cfg.dtype == "auto":
        bf16 = device_type == "cuda" and torch.cuda.is_bf16_supported()
        cfg = replace(cfg, dtype="bfloat16" if bf16 else "float32")
        why["dtype"] = "bf16 autocast on this GPU" if bf16 else "no bf16 autocast chosen off CUDA"
    if cfg.compile is None:
        cfg = replace(cfg, compile=device_type == "cuda")
        why["compile"] = "default on CUDA" if cfg.compile else "off: no gain measured on CPU"
    if cfg.out_dir is None:
        cfg = replace(cfg, out_dir=f"out/{cfg.block}" + ("" if cfg.norm == "rmsnorm" else f"_{cfg.norm}"))
    return cfg, why


def validate(cfg, world):
    for name in ("batch_size", "grad_accum", "max_iters", "eval_interval", "log_interval", "eval_tokens"):
        if getattr(cfg, name) < 1:
            fail(f"--{name} must be >= 1")
    if cfg.grad_accum % world:
        fail(f"--grad_accum {cfg.grad_accum} must be a multiple of the {world} processes")
    if cfg.eval_tokens < cfg.block_size:
        fail(f"--eval_tokens {cfg.eval_tokens} is less than one sequence of {cfg.block_size}")
    if cfg.dtype == "float16" and not cfg.device.startswith("cuda"):
        fail("--dtype float16 needs CUDA (its loss scaler); use bfloat16 or float32")


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


def eval_offsets(n_tokens, cfg):
    """The same validation sequences at every eval, spread evenly over val.bin."""
    n_seq = min(cfg.eval_tokens // cfg.block_size, (n_tokens - 1) // cfg.block_size)
    return np.linspace(0, n_tokens - cfg.block_size - 1, n_seq).astype(np.int64)


def human(n):
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else f"{n:.0f}"


# ----------------------------------------------------------------------------- training

def train(cfg):
    device, rank, world = setup_device(cfg)
    master = rank == 0
    device_type = torch.device(device).type
    cfg, why = resolve(replace(cfg, device=device), device_type)
    validate(cfg, world)
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 for any fp32 matmul left
        torch.backends.cudnn.allow_tf32 = True
    elif device_type == "cpu":
        tune_cpu_allocator()
    meta, paths = load_dataset(cfg, master)
    out = make_out_dir(cfg)
    ckpt_path, log_path = out / "ckpt.pt", out / "log.jsonl"

    vocab = (meta["vocab_size"] + 63) // 64 * 64  # padded to a multiple of 64 for faster matmuls
    try:
        model_config = GPTConfig(vocab_size=vocab, **{k: getattr(cfg, k) for k in MODEL_FIELDS})
    except ValueError as e:
        fail(str(e))
    ckpt = None
    if cfg.resume:
        if not ckpt_path.exists():
            fail(f"--resume: no checkpoint {ckpt_path}; drop --resume to start a new run")
        ckpt = load_checkpoint(ckpt_path, device)
        check_same_model(ckpt, model_config, ckpt_path)
    elif ckpt_path.exists():
        fail(f"{out} already holds a run; --resume continues it, or choose another --out_dir")

    torch.manual_seed(cfg.seed)
    model = GPT(model_config).to(device)
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.lr, (cfg.beta1, cfg.beta2), device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=cfg.dtype == "float16")
    data_rng = torch.Generator().manual_seed(cfg.seed)  # the batch order; same on every rank
    it, elapsed, loss_sum, loss_count = 0, 0.0, torch.zeros((), device=device), 0
    if master and not ckpt:
        log_path.write_text("")  # a new run, a new log
    if ckpt:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        data_rng.set_state(ckpt["data_rng"].cpu())  # map_location moved it to the device
        torch.set_rng_state(ckpt["torch_rng"].cpu())
        it, elapsed, loss_count = ckpt["iter"], ckpt["elapsed_s"], ckpt["loss_count"]
        loss_sum = torch.tensor(ckpt["loss_sum"], device=device)
        if master:  # drop log records past the checkpoint: they will be made again
            records = [line for line in log_path.read_text().splitlines() if json.loads(line)["iter"] <= it] \
                if log_path.exists() else []
            log_path.write_text("".join(r + "\n" for r in records))
    raw_model = model
    if cfg.compile:
        model = torch.compile(model)
    if world > 1:
        model = DDP(model, device_ids=[torch.device(device).index] if device_type == "cuda" else None)
    autocast = (torch.autocast(device_type, dtype=getattr(torch, cfg.dtype))
                if cfg.dtype != "float32" else nullcontext())

    micro_steps = cfg.grad_accum // world
    tokens_per_iter = cfg.batch_size * cfg.grad_accum * cfg.block_size
    all_val_offsets = eval_offsets(int(meta["val_tokens"]), cfg)
    val_offsets = all_val_offsets[rank::world]  # each rank evaluates its share
    n_train = int(meta["train_tokens"])
    warmup = max(1, int(cfg.warmup_frac * cfg.max_iters))
    peak = peak_flops(device)
    flops_per_iter = raw_model.flops_per_token(cfg.block_size) * tokens_per_iter

    def lr_at(step):
        if step < warmup:
            return cfg.lr * (step + 1) / warmup
        return cfg.lr * (cfg.max_iters - step) / max(1, cfg.max_iters - warmup)

    @torch.no_grad()
    def evaluate():
        loss_sum, n_seq = torch.zeros((), device=device), 0
        for i in range(0, len(val_offsets), cfg.batch_size):
            x, y = get_batch(paths["val"], val_offsets[i:i + cfg.batch_size], cfg.block_size, device)
            with autocast:
                loss_sum += raw_model(x, y)[1].float() * len(x)
            n_seq += len(x)
        total = torch.stack([loss_sum, torch.tensor(float(n_seq), device=device)])
        if world > 1:
            dist.all_reduce(total)
        return (total[0] / total[1]).item()

    def checkpoint():
        save_checkpoint(ckpt_path, dict(
            model=raw_model.state_dict(), optimizer=optimizer.state_dict(), scaler=scaler.state_dict(),
            iter=it, elapsed_s=elapsed, loss_sum=loss_sum.item(), loss_count=loss_count,
            data_rng=data_rng.get_state(), torch_rng=torch.get_rng_state(),
            config=asdict(cfg), model_config=asdict(model_config), tokenizer=meta["tokenizer"]))

    stop = {"asked": False}

    def on_signal(signum, frame):
        if stop["asked"]:
            raise KeyboardInterrupt
        stop["asked"] = True
        if master:
            print("\ntrain: stopping after this step to save a checkpoint (again to abort)", flush=True)

    previous_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    def should_stop():
        """Was Ctrl-C pressed? Under DDP the ranks agree at log steps, where they sync anyway."""
        if world == 1:
            return stop["asked"]
        if it % cfg.log_interval:
            return False
        flag = torch.tensor(float(stop["asked"]), device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    if master:
        n_params = raw_model.num_params()
        print(f"device: {device}" + (f" x {world} processes" if world > 1 else "") + f" | dtype: {cfg.dtype} "
              f"({why.get('dtype', 'as asked')}) | compile: {cfg.compile} ({why.get('compile', 'as asked')})")
        print(f"model: {cfg.block}, norm {cfg.norm}, {cfg.n_layer} x {cfg.n_embd}, {cfg.n_head} heads, "
              f"T {cfg.block_size}, vocab {vocab} ({meta['tokenizer']}): {human(n_params)} parameters "
              f"({human(raw_model.num_params(non_embedding=True))} without embeddings){why['defaults']}")
        print(f"data: {cfg.dataset}, {human(n_train)} train tokens | {tokens_per_iter:,} tokens per step "
              f"({cfg.batch_size} x {cfg.block_size} x {cfg.grad_accum} accumulated) | {cfg.max_iters} steps "
              f"| eval every {cfg.eval_interval} on {len(all_val_offsets) * cfg.block_size:,} "
              f"val tokens | out: {out}" + (f" | resuming at iter {it}" if ckpt else ""))

    resumed_at = it if ckpt else None
    t_lap, it_lap, dt_avg = time.perf_counter(), it, None
    try:
        while True:
            if (it % cfg.eval_interval == 0 or it == cfg.max_iters) and it != resumed_at:
                val_loss = evaluate()
                if world > 1:
                    dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)
                train_loss = loss_sum.item() / loss_count if loss_count else None
                if not math.isfinite(val_loss) or (train_loss is not None and not math.isfinite(train_loss)):
                    fail(f"{DIVERGED} loss is not finite at iter {it} (val {val_loss}); the last good checkpoint "
                         f"stays in {ckpt_path}; try a lower --lr")
                if master:
                    record = dict(iter=it, train_loss=train_loss, val_loss=val_loss, elapsed_s=round(elapsed, 3),
                                  tokens=it * tokens_per_iter, lr=lr_at(min(it, cfg.max_iters - 1)),
                                  gains=learned_gains(raw_model))
                    with open(log_path, "a") as f:
                        f.write(json.dumps(record) + "\n")
                    print(f"eval {it}: val loss {val_loss:.4f}"
                          + (f" | train loss {train_loss:.4f}" if train_loss is not None else ""), flush=True)
                loss_sum, loss_count = torch.zeros((), device=device), 0
                if master:
                    checkpoint()
                t_lap, it_lap = time.perf_counter(), it  # evaluation time is not training time
            if it == cfg.max_iters:
                break
            if should_stop():
                elapsed += time.perf_counter() - t_lap
                if master:
                    checkpoint()
                    print(f"train: saved {ckpt_path} at iter {it}; continue with --resume")
                break

            lr = lr_at(it)
            for group in optimizer.param_groups:
                group["lr"] = lr
            offsets = torch.randint(0, n_train - cfg.block_size - 1, (cfg.grad_accum, cfg.batch_size),
                                    generator=data_rng).numpy()
            loss_acc = torch.zeros((), device=device)
            for micro, batch_offsets in enumerate(offsets[rank::world]):
                x, y = get_batch(paths["train"], batch_offsets, cfg.block_size, device)
                if world > 1:  # all-reduce gradients on the last micro-step only
                    model.require_backward_grad_sync = micro == micro_steps - 1
                with autocast:
                    _, loss = model(x, y)
                scaler.scale(loss / micro_steps).backward()
                loss_acc += loss.detach() / micro_steps
            if cfg.grad_clip > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            loss_sum += loss_acc  # stays on the device: no wait for the GPU in most steps
            loss_count += 1
            it += 1
            if it % cfg.log_interval and it % cfg.eval_interval and it < cfg.max_iters:
                continue
            if world > 1:
                dist.all_reduce(loss_acc, op=dist.ReduceOp.AVG)
            step_loss = loss_acc.item()  # waits for the device, so the clock below is true
            now = time.perf_counter()
            dt = (now - t_lap) / (it - it_lap)  # per step, since the last lap
            elapsed, t_lap, it_lap = elapsed + now - t_lap, now, it
            if not math.isfinite(step_loss):
                fail(f"{DIVERGED} loss is {step_loss} at iter {it}; the last good checkpoint stays in {ckpt_path}; "
                     "try a lower --lr")
            dt_avg = dt if dt_avg is None else 0.8 * dt_avg + 0.2 * dt
            if master and (it % cfg.log_interval == 0 or it == cfg.max_iters):
                mfu = f" | mfu {flops_per_iter / world / dt_avg / peak:.0%}" if peak else ""
                eta = int(dt_avg * (cfg.max_iters - it))
                print(f"iter {it}/{cfg.max_iters} | loss {step_loss:.4f} | lr {lr:.1e} | {dt * 1000:.0f} ms | "
                      f"{human(tokens_per_iter / dt)} tok/s{mfu} | eta {eta // 60}m{eta % 60:02d}s", flush=True)
        if world > 1:
            dist.barrier()  # no rank leaves while another still talks to it
    finally:
        for s, handler in previous_handlers.items():
            signal.signal(s, handler)
        if dist.is_initialized():
            dist.destroy_process_group()
    if master and it == cfg.max_iters:
        print(f"train: done in {elapsed:.0f} s of training; log: {log_path}")
        print("sample:\n" + sample_text(raw_model, meta["tokenizer"], cfg.prompt, 100, device))
    return raw_model


def sample_text(model, tokenizer_name, prompt, n_tokens, device):
    tokenizer = prepare_data.load_tokenizer(tokenizer_name)
    prompt_ids = tokenizer.encode_batch([prompt])[0] if prompt else np.array([tokenizer.eot])
    ids = torch.tensor(prompt_ids.astype(np.int64), device=device)[None]
    model.eval()
    torch.manual_seed(0)
    out = model.generate(ids[:, -model.config.block_size:], n_tokens, temperature=0.8, top_k=200)
    return tokenizer.decode(out[0].tolist())


def sample(cfg):
    device = "cuda" if cfg.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu"
    cfg, _ = resolve(cfg, torch.device(device).type)
    ckpt_path = Path(cfg.out_dir) / "ckpt.pt"
    if not ckpt_path.exists():
        fail(f"no checkpoint {ckpt_path} to sample from; train first, or pass --out_dir")
    ckpt = load_checkpoint(ckpt_path, device)
    model = GPT(GPTConfig(**ckpt["model_config"])).to(device)
    model.load_state_dict(ckpt["model"])
    print(sample_text(model, ckpt["tokenizer"], cfg.prompt, cfg.sample_tokens, device))


def main(argv=None):
    cfg = parse_args(argv)
    return sample(cfg) if cfg.sample else train(cfg)


if __name__ == "__main__":
    main()
