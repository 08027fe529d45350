"""
What the scripts share: --import (a file of your own blocks, run before the flags are parsed),
a flag's type, writing and reading a run's checkpoint (each failing in one line that names the
script) and reading its log; and what train.py and bench.py share: the device (its dtype, peak
FLOP/s, clock), a model's optimizers (AdamW, Muon) and FLOPs, and the encoder's masking.
"""

import argparse
import ctypes
import importlib.util
import json
import math
import os
import re
import sys
import time
import traceback
import typing
import zlib
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from simple_gpt import BLOCKS, GPT, Attention, GPTConfig


def import_blocks(argv, prog):
    """Runs argv's --import FILEs before the flags are parsed, so --block can name the blocks they register
    (BLOCKS["mine"] = Mine); returns {block: file}. A file that fails is one line: its error, and where."""
    pre = argparse.ArgumentParser(prog=prog, add_help=False)
    pre.add_argument("--import", dest="imports", action="append", default=[], metavar="FILE")
    added = {}
    for path in pre.parse_known_args(sys.argv[1:] if argv is None else argv)[0].imports:
        file = Path(path).expanduser().resolve()
        if not file.is_file():
            raise SystemExit(f"{prog}: error: --import {path}: not a file")
        name = f"imported_{file.stem}_{zlib.crc32(str(file).encode()):08x}"  # two files of one name stay apart
        spec = importlib.util.spec_from_file_location(name, file)
        module, before = importlib.util.module_from_spec(spec), dict(BLOCKS)
        sys.modules[spec.name] = module  # as an import would: inspect and pickle find it
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            frames = [f.lineno for f in traceback.extract_tb(e.__traceback__) if Path(f.filename) == file]
            line = e.lineno if isinstance(e, SyntaxError) else frames[-1] if frames else None
            raise SystemExit(f"{prog}: error: --import {path} failed" + (f" at line {line}" if line else "")
                             + f": {type(e).__name__}: {e}") from None
        added.update({block: str(file) for block, cls in BLOCKS.items() if before.get(block) is not cls})
    return added


def flag_type(f):
    """The type of a dataclass field's flag: int for `int`, float for `float | None`."""
    return next(t for t in typing.get_args(f.type) or (f.type,) if t is not type(None))


def add_import_flag(p):
    p.add_argument("--import", dest="imports", action="append", metavar="FILE",
                   help="a Python file to run first, e.g. one that registers a block of your own "
                        "(BLOCKS['mine'] = Mine; README: 'Hacking a variant'); repeatable")


def load_checkpoint(path, device, prog):
    """A checkpoint train.py wrote, or one line saying why it cannot be read."""
    path = Path(path)
    if not path.exists():
        raise SystemExit(f"{prog}: error: no checkpoint {path}; train first (python train.py --block ...), "
                         "or name a run's folder")
    if path.stat().st_size == 0:
        raise SystemExit(f"{prog}: error: checkpoint {path} is empty (the disk was full when it was written?)")
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as e:
        first_line = (str(e).splitlines() or [""])[0][:160]
        raise SystemExit(f"{prog}: error: cannot read checkpoint {path} ({type(e).__name__}: {first_line})") from None


def save_checkpoint(path, state):
    """Atomic: a crash while writing leaves the previous checkpoint intact."""
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


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


def load_weights(model, ckpt, path, prog):
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:  # e.g. saved by an older version whose modules were named otherwise
        raise SystemExit(f"{prog}: error: checkpoint {path} does not fit this version of the model "
                         f"({str(e).splitlines()[0][:120]})") from None


def load_model(run_dir, device, prog):
    """(the trained model of a run's folder, its checkpoint), in eval mode."""
    path = Path(run_dir) / "ckpt.pt"
    ckpt = load_checkpoint(path, device, prog)
    if ckpt["model_config"]["block"] not in BLOCKS:
        raise SystemExit(f"{prog}: error: {path} holds a block of your own, {ckpt['model_config']['block']!r}: "
                         "add --import FILE, the file that registers it")
    try:
        model = GPT(GPTConfig(**ckpt["model_config"])).to(device)
    except (TypeError, ValueError) as e:  # saved by a version whose model had other settings
        raise SystemExit(f"{prog}: error: checkpoint {path} does not fit this version of the model ({e})") from None
    load_weights(model, ckpt, path, prog)
    return model.eval(), ckpt


def configure_optimizers(model, weight_decay, lr, betas, device_type, optimizer="adamw", muon_lr=None,
                         muon_dtype=torch.bfloat16, emb_lr=None, emb_weight_decay=None):
    """A model's optimizers, a list that together step every parameter once, in named parameter
    groups, each with its peak rate ("peak": the schedule scales it). adamw: the paper's AdamW (§4),
    fused on CUDA: the embeddings (wte, which is the tied head, and wpe) at emb_lr (default lr) with
    decay emb_weight_decay (default weight_decay), the matrices at lr with decay, gains and norms at
    lr without. muon: Muon at muon_lr (default lr) on the blocks' weight matrices, W^Q and W^K apart,
    its Newton-Schulz steps in muon_dtype, and AdamW on the rest, as Muon's users split them."""
    params = [p for p in model.parameters() if p.requires_grad]
    embeddings = {id(model.transformer.wte.weight), id(model.transformer.wpe.weight)}
    decay = {id(m.weight) for m in model.modules() if isinstance(m, (nn.Linear, nn.Embedding))}
    muon = {id(m.weight) for m in model.transformer.h.modules() if isinstance(m, nn.Linear)} if optimizer == "muon" else set()
    fused_qk = {id(m.c_qk.weight) for m in model.modules() if isinstance(m, Attention)}  # (2d, d): W^Q over W^K

    def groups(*specs):  # (name, ids, peak, more settings), the empty ones left out
        return [{"name": name, "params": [p for p in params if id(p) in ids], "lr": peak, "peak": peak, **more}
                for name, ids, peak, more in specs if ids & {id(p) for p in params}]

    emb_decay = weight_decay if emb_weight_decay is None else emb_weight_decay
    optimizers = [torch.optim.AdamW(groups(
        ("embeddings", embeddings, emb_lr or lr, dict(weight_decay=emb_decay)),
        ("matrices", decay - embeddings - muon, lr, dict(weight_decay=weight_decay)),
        ("gains and norms", {id(p) for p in params} - decay, lr, dict(weight_decay=0.0))),
        lr=lr, betas=betas, eps=1e-8, fused=device_type == "cuda")]
    if muon:
        optimizers.insert(0, Muon(groups(("matrices", muon - fused_qk, muon_lr or lr, {}),
                                         ("W^Q, W^K", muon & fused_qk, muon_lr or lr, dict(split=2))),
                                  lr=muon_lr or lr, weight_decay=weight_decay, dtype=muon_dtype))
    return optimizers


def regrouped(state, optimizer):
    """A saved optimizer state in optimizer's groups, with their settings (a resume has checked that
    they are the run's): a checkpoint written before the embeddings had a group of their own holds
    the same parameters in the same order, in fewer groups."""
    saved = [i for group in state["param_groups"] for i in group["params"]]
    sizes = [len(group["params"]) for group in optimizer.param_groups]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return dict(state=state["state"], param_groups=[{**group, "params": saved[start:start + size]}
                                                    for group, start, size in zip(optimizer.param_groups, starts, sizes)])


class Muon(torch.optim.Optimizer):
    """Muon (Keller Jordan, 2024) as torch.optim.Muon computes it: Nesterov momentum, the update
    orthogonalised (Newton-Schulz), its rate scaled by 0.2 sqrt(max(rows, cols)) to AdamW's update
    size (Moonlight's match_rms_adamw, so that its rates read as AdamW's), decoupled weight decay.
    A group's split: its parameters each store that many matrices, stacked by rows (W^Q over W^K in
    c_qk), each orthogonalised apart, as if stored apart. dtype: Newton-Schulz's, bf16 as its users
    run it; train.py's float32 runs take float32, as a device without native bf16 would emulate it
    (on an AVX2 CPU float32 is 23x faster: 0.19 s a step at 6 x 128, not 4.3)."""

    def __init__(self, params, lr, weight_decay, momentum=0.95, dtype=torch.bfloat16):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, split=1))
        self.dtype = dtype

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in (p for p in group["params"] if p.grad is not None):
                if "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)
                buf = self.state[p]["momentum_buffer"]
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum)  # Nesterov: the gradient, then the momentum, ahead
                p.mul_(1 - lr * group["weight_decay"])
                for w, u in zip(p.chunk(group["split"]), update.chunk(group["split"])):
                    w.add_(orthogonalised(u, self.dtype), alpha=-lr * 0.2 * math.sqrt(max(u.shape)))


def orthogonalised(g, dtype=torch.bfloat16, steps=5, eps=1e-7):
    """g = U S V^T taken towards U V^T by 5 quintic Newton-Schulz steps in dtype (Muon's: its
    coefficients leave the singular values in about 0.7-1.2, which trains as well as exactly 1)."""
    x = g.to(dtype)
    wide = g.size(0) <= g.size(1)
    x = x if wide else x.T
    x = x / x.norm().clamp(min=eps)  # every singular value <= 1
    for _ in range(steps):  # x <- a x + (b X + c X^2) x, X = x x^T
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=-4.7750, alpha=2.0315), x, beta=3.4445)
    return (x if wide else x.T).to(g.dtype)


def flops_per_token(model, seq_len, predicted=1.0):
    """Training FLOPs per token (forward + backward): 6 per weight of every matmul the block really
    has (so SAS's removed V and P are not counted) and of the LM head at the fraction `predicted` of
    positions it runs at, 4 per weight of a fixed matrix (Eq. 6's orthogonal W_init), plus
    attention's Q K^T and A V, 12 * L * d * T (PaLM's estimate): the model's FLOPs. Shaped
    attention's C V is a running mean, O(d) a token; simple_gpt.centre runs it as a T x T product,
    4 T d a token and layer more (at the paper's shape SAS-P's FLOP ideal would be 1.130, not 1.139;
    at GPT-2 small's T 1024, 1.054, not 1.105)."""
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    fixed = sum(m.W_init.numel() for m in model.modules() if getattr(m, "W_init", None) is not None)  # Eq. 6's: no gradient
    head = model.lm_head.weight.numel()
    return 6 * (matmul - head + predicted * head) + 4 * fixed + 12 * model.config.n_layer * model.config.n_embd * seq_len


class Masking:
    """BERT's masking for masked language modelling (SPEC §7). Exactly round(prob * T) positions
    of each sequence are chosen, as BERT's own data pipeline does (a fixed count keeps every batch
    one shape: no host sync, nothing for torch.compile to re-trace); of those, 80% become the mask
    token, 10% a random token and 10% stay. The loss is taken at the chosen positions only."""

    def __init__(self, prob, T, mask_token, n_tokens):
        self.k, self.T = max(1, round(prob * T)), T
        self.mask_token, self.n_tokens = mask_token, n_tokens  # random tokens are ids < n_tokens

    def draw(self, shape, generator):
        """Masks for sequences of leading shape: positions (*shape, k) and the token to put at
        each (-1: keep the token)."""
        positions = torch.rand(*shape, self.T, generator=generator).argsort(dim=-1)[..., :self.k]
        kind = torch.rand(*shape, self.k, generator=generator)
        random = torch.randint(0, self.n_tokens, (*shape, self.k), generator=generator)
        put = torch.where(kind < 0.8, self.mask_token, torch.where(kind < 0.9, random, -1))
        return positions, put

    @staticmethod
    def apply(x, positions, put):
        """(x with the masks applied, targets: the original tokens at positions)."""
        targets = x.gather(1, positions)
        return x.scatter(1, positions, torch.where(put >= 0, put, targets)), targets


# ----------------------------------------------------------------------------- the device

# dense bf16/fp16 tensor-core peak FLOP/s by device name (whole words), for MFU; first match wins
PEAK_FLOPS = [("H100 NVL", 835e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("H200 NVL", 835e12),
              ("H200", 989e12), ("GH200", 989e12), ("B200", 2250e12), ("A100", 312e12), ("A40", 150e12),
              ("A10", 125e12), ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12), ("RTX A6000", 155e12),
              ("4090", 165e12), ("3090", 71e12), ("V100", 125e12), ("T4", 65e12)]


def tune_device(device):
    """What train.py and bench.py set up alike: TF32 for any fp32 matmul left on CUDA; on CPU,
    tune_cpu_allocator."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif torch.device(device).type == "cpu":
        tune_cpu_allocator()


def tune_cpu_allocator(libc=None):
    """glibc hands the large (B, T, vocab) logits back to the OS after every step and maps them
    afresh on the next; keeping them in the heap made CPU steps ~1/3 faster and less noisy. An
    older glibc caps the mmap threshold at 32 MiB: there no allocation is mapped at all."""
    if libc is None:
        if not sys.platform.startswith("linux"):
            return
        try:
            libc = ctypes.CDLL("libc.so.6")
        except OSError:  # not glibc
            return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
    if not libc.mallopt(M_MMAP_THRESHOLD, 2**31 - 1):  # refused: the threshold stays where it was
        libc.mallopt(M_MMAP_MAX, 0)
    libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)


def peak_flops(name, capability, dtype):
    """The tensor-core peak FLOP/s of a GPU by its name, for MFU; None if the name is unknown or
    dtype does not run on tensor cores there (float32; bf16 below compute capability 8.0)."""
    if dtype not in ("bfloat16", "float16") or (dtype == "bfloat16" and capability < (8, 0)):
        return None
    return next((flops for key, flops in PEAK_FLOPS if re.search(rf"\b{key}\b", name)), None)


def device_peak(device, dtype):
    if torch.device(device).type != "cuda":
        return None
    return peak_flops(torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device), dtype)


def sync(device):
    """Wait for the device's queued work (a no-op on CPU), so that a clock around it is true."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def bf16_speedup(device, n=256):
    """How many times faster an n x n bf16 matmul runs than a float32 one on device: above 1 where
    the hardware does bf16 (AVX512-BF16 or AMX CPUs, Apple's GPUs), far below where it is emulated."""
    a = torch.randn(n, n, device=device)

    def seconds(x, budget):  # the best of up to 20 tries: a busy machine or a cold start only adds time
        best, spent = math.inf, 0.0
        for i in range(20):
            sync(device)
            start = time.perf_counter()
            x @ x
            sync(device)
            took = time.perf_counter() - start
            best, spent = min(best, took), spent + took
            if i >= 3 and spent > budget:
                break
        return best

    try:
        return seconds(a, budget=math.inf) / seconds(a.bfloat16(), budget=0.1)
    except RuntimeError:  # a device with no bf16 matmul at all (MPS before macOS 14)
        return 0.0


BF16_CLEARLY = 1.5  # native bf16 matmuls run ~2x float32 (AVX512-BF16: 1.86-2.13 measured), emulated ones far below 1


def autocast_dtype(device):
    """(dtype, why). On CUDA: bf16 from compute capability 8.0 (A100, H100, RTX 30xx on); float16
    with a loss scaler on 7.x (V100, T4), where bf16 runs emulated though is_bf16_supported() says
    True. Elsewhere: bf16 where a bf16 matmul is measured to be clearly faster (bf16_speedup; all
    processes of a run agree on the slowest's), else float32."""
    if torch.device(device).type != "cuda":
        speedup = torch.tensor(bf16_speedup(device))
        if dist.is_initialized():
            dist.all_reduce(speedup, op=dist.ReduceOp.MIN)
        measured = f"a bf16 matmul runs {speedup.item():.2g}x as fast as float32 here"
        return ("bfloat16", measured) if speedup >= BF16_CLEARLY else ("float32", measured)
    major, minor = torch.cuda.get_device_capability(device)
    if major >= 8:
        return "bfloat16", f"bf16 tensor cores, compute capability {major}.{minor}"
    if major == 7:
        return "float16", f"compute capability {major}.{minor} has no bf16 tensor cores: float16 with a loss scaler"
    return "float32", f"compute capability {major}.{minor} has no tensor cores"
