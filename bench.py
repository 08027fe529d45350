"""
Training throughput and parameters of every block, side by side: the paper's "15% faster,
15% fewer parameters", measured on your machine.

    python bench.py                                   # CPU: a CPU-sized model; CUDA: the paper's
    python bench.py --preset paper --blocks pre_ln,sas_p,sas_p:norm=none   # block:flag=value: a switch
    python bench.py --import my_blocks.py --blocks pre_ln,mine             # a block of your own
    python bench.py --preset gpt2 --seq_len 1024,2048  # GPT-2 small; a sequence-length sweep
    python bench.py --json bench.json                 # also write the rows for machines
    python bench.py --objective mlm                   # encoders: bidirectional, MLM loss (SPEC §7)

All models live in one process and their steps are interleaved (one step of each block per
round), so drift and noise hit every block alike: a block's speed against Pre-LN is the median
over rounds of their two step times' ratio in the same round, with its quartiles.
A step is a full training step: forward, backward, the optimizer's step (AdamW, or Muon with an
arm's :optimizer=muon), zero_grad. With --compile every model
and its attention sub-block are compiled whole (one graph each, no recompilation per step).
"""

import argparse
import datetime
import json
import platform
import statistics
import time
import traceback
from dataclasses import fields, replace
from pathlib import Path

import torch

from simple_gpt import BLOCKS, GPT, NORMS, GPTConfig
from common import (Masking, add_import_flag, autocast_dtype, configure_optimizers, device_peak, flag_type,
                    flops_per_token, import_blocks, sync, tune_device)
from train_config import CHOICES, MODEL_FIELDS, TrainConfig

PRESETS = {  # shape and a batch that fits; any of it can be overridden by flags
    "cpu": dict(n_layer=6, n_head=4, n_embd=128, seq_len="128", batch_size=16),
    "paper": dict(n_layer=18, n_head=12, n_embd=768, seq_len="128", batch_size=32),  # SPEC §4
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, seq_len="1024", batch_size=8),
}


# the flags an arm of a comparison may set (parse_arm): a block's switches, not the shape or the run
ARM_FLAGS = (*(k for k in MODEL_FIELDS if k not in ("block", "n_layer", "n_head", "n_embd", "block_size")), "schedule",
             "optimizer")


def parse_arm(spec, prog):
    """An arm of a comparison (bench.py's --blocks, and reproduce.py's): 'block[:flag=value]...',
    e.g. sas:alpha_ff=0 or sas_p:norm=none (sas_p:none for short), with train.py's flag names
    and values; (block, {flag: value}), checked as train.py checks --block and its switches."""
    block, *switches = spec.split(":")
    if block not in BLOCKS:
        raise SystemExit(f"{prog}: error: unknown block {block!r} in {spec!r}; valid: {', '.join(BLOCKS)} "
                         "(a block of your own: --import FILE)")
    flags, kinds = {}, {f.name: flag_type(f) for f in fields(TrainConfig)}
    for switch in switches:
        key, _, text = switch.partition("=")
        key, text = ("norm", key) if not text and key in NORMS else (key, text)
        if key in getattr(BLOCKS[block], "settings", {}):
            raise SystemExit(f"{prog}: error: {switch!r} in {spec!r}: a block's own setting is not an arm's switch; "
                             "give it its value as the default in its class (a variant: another class)")
        if key not in ARM_FLAGS or not text:
            raise SystemExit(f"{prog}: error: {switch!r} in {spec!r} is not flag=value with one of train.py's "
                             f"flags {', '.join(ARM_FLAGS)}")
        kind, choices = kinds[key], CHOICES.get(key)
        try:
            value = {"true": True, "false": False}[text.lower()] if kind is bool else kind(text)
        except (KeyError, ValueError):
            raise SystemExit(f"{prog}: error: {switch!r} in {spec!r}: {text!r} is not a {kind.__name__}") from None
        if choices is not None and value not in choices:
            raise SystemExit(f"{prog}: error: {switch!r} in {spec!r}: valid values {', '.join(choices)}")
        flags[key] = value
    try:
        config = GPTConfig(block=block, **{k: v for k, v in flags.items() if k in MODEL_FIELDS})
    except ValueError as e:  # a switch the block does not have
        raise SystemExit(f"{prog}: error: {spec!r}: {e}") from None
    try:  # run once at a tiny shape: a block that fails does so now, not hours into a comparison
        idx = torch.zeros(1, 8, dtype=torch.long)
        with torch.random.fork_rng(devices=[]):  # the caller's random state as it was
            GPT(replace(config, n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32))(idx, idx)[1].backward()
    except Exception as e:
        torch_dir = Path(torch.__file__).parent
        where = [f for f in traceback.extract_tb(e.__traceback__) if torch_dir not in Path(f.filename).parents]
        at = f", {where[-1].filename}:{where[-1].lineno}" if where else ""
        raise SystemExit(f"{prog}: error: {spec!r} fails at a tiny shape (2 x 16, T 8){at}: {type(e).__name__}: {e}") from None
    return block, flags


def parse_args(argv=None):
    import_blocks(argv, "bench.py")
    p = argparse.ArgumentParser(prog="bench.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_import_flag(p)
    p.add_argument("--preset", choices=list(PRESETS), help="model shape (default: paper on CUDA, cpu otherwise)")
    p.add_argument("--blocks", default=",".join(BLOCKS),
                   help="comma-separated blocks, each optionally with switches as block:flag=value "
                        "(train.py's flags, e.g. sas_p:norm=none, sas:alpha_ff=0; sas_p:none for short) "
                        "(default: all, with --norm)")
    p.add_argument("--norm", default="rmsnorm", choices=NORMS, help="norm of every block (default: rmsnorm)")
    for name in ("n_layer", "n_head", "n_embd", "batch_size"):
        p.add_argument(f"--{name}", type=int, help="override the preset")
    p.add_argument("--seq_len", help="comma-separated sequence lengths, e.g. 128,256,512 (override the preset)")
    p.add_argument("--objective", choices=["clm", "mlm"], default="clm",
                   help="clm: causal, loss at every position; mlm: bidirectional, loss and output head at the "
                        f"{100 * TrainConfig.mask_prob:.0f}%% masked positions only (default: %(default)s)")
    p.add_argument("--vocab_size", type=int, default=50304, help="default: GPT-2's, padded (%(default)s)")
    p.add_argument("--steps", type=int, default=6, help="timed steps per block (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per block first (default: %(default)s)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", help="comma-separated autocast dtypes, every block timed in each, side by side "
                   "(float32, bfloat16, float16; default: as train.py picks it, beside float32 where that is bfloat16)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, help="torch.compile (default: on CUDA only)")
    p.add_argument("--json", help="also write the result rows to this file")
    args = p.parse_args(argv)
    cuda = torch.device(args.device).type == "cuda"
    for key, value in PRESETS[args.preset or ("paper" if cuda else "cpu")].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.dtype:
        args.dtypes = args.dtype.split(",")
        if not set(args.dtypes) <= {"float32", "bfloat16", "float16"}:
            raise SystemExit(f"bench.py: error: --dtype {args.dtype}: valid dtypes are float32, bfloat16, float16")
        args.why = "as asked"
    else:
        dtype, args.why = autocast_dtype(args.device)
        args.dtypes = ["float32", dtype] if dtype == "bfloat16" and not cuda else [dtype]
    if "float16" in args.dtypes and not cuda:
        raise SystemExit("bench.py: error: --dtype float16 needs CUDA (its loss scaler)")
    args.compile = cuda if args.compile is None else args.compile
    args.runs = {name: parse_arm(name, "bench.py") for name in args.blocks.split(",")}
    if "pre_ln" not in args.runs:
        p.error("--blocks must include pre_ln, the baseline")
    if any("schedule" in flags for _, flags in args.runs.values()):
        p.error("a step's time has no schedule: drop :schedule= from --blocks")
    if args.steps < 1 or args.warmup < (1 if args.compile else 0):
        p.error(f"--steps {args.steps} must be >= 1 and --warmup {args.warmup} >= " + (
            "1 with --compile (the first step compiles)" if args.compile else "0"))
    args.seq_len = [int(t) for t in str(args.seq_len).split(",")]
    for T in args.seq_len:
        for name, (block, flags) in args.runs.items():
            try:  # the model's own checks (shape, switches) before anything is timed
                GPTConfig(block=block, **shape_of(args, T), **arm_switches(args, flags))
            except ValueError as e:
                raise SystemExit(f"bench.py: error: {name}: {e}") from None
    return args


def shape_of(args, T):
    return dict(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=T, vocab_size=args.vocab_size,
                causal=args.objective == "clm")


def arm_switches(args, flags):
    return {"norm": args.norm, **{k: v for k, v in flags.items() if k in MODEL_FIELDS}}


def state_bytes(model, optimizers):
    """Memory a model keeps between steps: weights and the optimizers' state (gradients are freed)."""
    tensors = [*model.parameters(), *(t for o in optimizers for s in o.state.values() for t in s.values() if torch.is_tensor(t))]
    return sum(t.numel() * t.element_size() for t in tensors)


class Bench:
    """One block's model, optimizer and batch, and its step and attention timings."""

    def __init__(self, args, block, flags, T, dtype):
        cfg = GPTConfig(block=block, **shape_of(args, T), **arm_switches(args, flags))
        torch.manual_seed(0)
        device_type = torch.device(args.device).type
        self.model = GPT(cfg).to(args.device)
        self.optimizers = configure_optimizers(self.model, 0.1, 1e-3, (0.9, 0.999), device_type, flags.get("optimizer", "adamw"),
                                               muon_dtype=torch.bfloat16 if dtype == "bfloat16" else torch.float32)  # as train.py
        self.scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")  # as train.py
        self.attn = getattr(self.model.transformer.h[-1], "attn", None)  # a later layer: SAS's plain shaped attention
        compile = (lambda m: torch.compile(m, dynamic=False)) if args.compile else (lambda m: m)
        self.step_fn, self.attn_fn = compile(self.model), self.attn and compile(self.attn)
        self.x = torch.randint(0, cfg.vocab_size - 1, (args.batch_size, T), device=args.device)
        self.targets, self.positions, self.predicted = self.x, None, 1.0  # clm: every position
        if args.objective == "mlm":  # the vocabulary's last id stands in for the mask token
            masking = Masking(TrainConfig.mask_prob, T, mask_token=cfg.vocab_size - 1, n_tokens=cfg.vocab_size - 1)
            self.positions, put = (t.to(args.device) for t in masking.draw((args.batch_size,), None))
            self.x, self.targets = Masking.apply(self.x, self.positions, put)
            self.predicted = masking.k / T
        self.h = torch.randn(args.batch_size, T, cfg.n_embd, device=args.device, requires_grad=True)
        self.autocast = torch.autocast(device_type, dtype=getattr(torch, dtype), enabled=dtype != "float32")
        self.device, self.step_times, self.attn_times, self.peak_mem = args.device, [], [], 0

    def step(self, timed):
        cuda = torch.device(self.device).type == "cuda"
        sync(self.device)
        if cuda:  # this model's memory: its step's peak above what is resident, plus its own state
            torch.cuda.reset_peak_memory_stats(self.device)
            resident = torch.cuda.memory_allocated(self.device)
        t0 = time.perf_counter()
        with self.autocast:
            _, loss = self.step_fn(self.x, self.targets, positions=self.positions)
        self.scaler.scale(loss).backward()
        for optimizer in self.optimizers:
            self.scaler.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
        self.scaler.update()
        sync(self.device)
        if timed:
            self.step_times.append(time.perf_counter() - t0)
            if cuda:
                step_peak = torch.cuda.max_memory_allocated(self.device) - resident
                self.peak_mem = max(self.peak_mem, step_peak + state_bytes(self.model, self.optimizers))
        if self.attn is None:  # a block of one's own without an attn
            return
        t0 = time.perf_counter()  # the attention sub-block alone, forward and backward
        with self.autocast:
            out = self.attn_fn(self.h)
        out.float().sum().backward()
        sync(self.device)
        if timed:
            self.attn_times.append(time.perf_counter() - t0)
        self.model.zero_grad(set_to_none=True)  # keep these gradients out of the next step
        self.h.grad = None


def measure(args, runs, T, dtype):
    """Time every run's model at sequence length T in dtype, steps interleaved; {name: Bench}."""
    if args.compile:
        # a fresh compile cache per length: each model adds an entry to the shared GPT.forward,
        # and past the limit torch runs the rest uncompiled
        torch.compiler.reset()
        config = torch._dynamo.config  # recompile_limit was cache_size_limit before torch 2.7
        limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        setattr(config, limit, max(getattr(config, limit), 2 * len(runs)))
    benches = {name: Bench(args, block, flags, T, dtype) for name, (block, flags) in runs.items()}
    order = list(benches.values())
    for i in range(args.warmup + args.steps):
        for bench in order[i % len(order):] + order[:i % len(order)]:  # interleaved, rotating
            bench.step(timed=i >= args.warmup)
    return benches


def rows_of(args, benches, T, dtype, peak, base="pre_ln"):
    """The result rows of one length's and dtype's measurements; the bench named base is the baseline.
    A block's speed against it: the median over rounds of base's step time over the block's in the
    same round, and that ratio's quartiles."""
    base = benches[base]
    median_ms = lambda times: 1000 * statistics.median(times) if times else None
    rows = []
    for name, bench in benches.items():
        m = bench.model
        ratios = [b / t for b, t in zip(base.step_times, bench.step_times)]
        speed = statistics.median(ratios)
        quartiles = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [speed] * 3
        tps = args.batch_size * T / statistics.median(bench.step_times)
        ideal = flops_per_token(base.model, T, base.predicted) / flops_per_token(m, T, bench.predicted)
        attn_ms, base_attn_ms = median_ms(bench.attn_times), median_ms(base.attn_times)
        rows.append(dict(
            block=name, seq_len=T, dtype=dtype, params=m.num_params(), params_non_emb=m.num_params(non_embedding=True),
            params_vs_pre_ln=m.num_params() / base.model.num_params(),
            non_emb_vs_pre_ln=m.num_params(non_embedding=True) / base.model.num_params(non_embedding=True),
            tokens_per_s=tps, speed_vs_pre_ln=speed, speed_quartiles=[quartiles[0], quartiles[2]], flop_ideal=ideal,
            measured_vs_ideal=speed / ideal, step_s=bench.step_times, attn_ms=attn_ms,
            attn_vs_pre_ln=attn_ms / base_attn_ms if attn_ms and base_attn_ms else None,
            mfu=flops_per_token(m, T, bench.predicted) * tps / peak if peak else None,
            peak_mem_gib=bench.peak_mem / 2**30 if bench.peak_mem else None))
    return rows


def run(args, runs=None, base="pre_ln"):
    """Rows of measurements for runs: {name: (block, {switch: value})}, default those of --blocks; the run
    named base is the baseline. One length's models are freed before the next length's."""
    tune_device(args.device)
    runs = runs or args.runs
    rows = []
    for T in args.seq_len:
        for dtype in args.dtypes:
            rows += rows_of(args, measure(args, runs, T, dtype), T, dtype, device_peak(args.device, dtype), base)
            if torch.device(args.device).type == "cuda":
                torch.cuda.empty_cache()
    for row in rows:  # each block's speed in a dtype against its own in the first dtype
        first = next(r for r in rows if (r["block"], r["seq_len"]) == (row["block"], row["seq_len"]))
        row["speed_vs_first_dtype"] = row["tokens_per_s"] / first["tokens_per_s"]
    return rows


def print_table(rows, args):
    print(f"device {args.device} ({torch.cuda.get_device_name(args.device) if 'cuda' in args.device else 'CPU'}), "
          f"torch {torch.__version__}, dtype {' and '.join(args.dtypes)} ({args.why}), compile {args.compile} | "
          f"{args.n_layer} x {args.n_embd}, "
          f"{args.n_head} heads, batch {args.batch_size}, vocab {args.vocab_size}, norm {args.norm}, {args.objective} | "
          f"{args.steps} interleaved rounds")
    first = args.dtypes[0]
    cols = ["block", "T", "dtype", "params", "non-emb", "vs pre_ln", "tok/s", f"speed vs {first}", "speed vs pre_ln",
            "FLOP ideal", "measured/ideal", "attn ms", "attn vs pre_ln", "mfu", "mem GiB"]
    lines = [[r["block"], r["seq_len"], r["dtype"], f"{r['params'] / 1e6:.2f}M", f"{r['params_non_emb'] / 1e6:.2f}M",
              f"{r['params_vs_pre_ln']:.3f} / {r['non_emb_vs_pre_ln']:.3f}", f"{r['tokens_per_s']:,.0f}",
              f"{r['speed_vs_first_dtype']:.2f}",
              f"{r['speed_vs_pre_ln']:.3f} ({r['speed_quartiles'][0]:.2f}-{r['speed_quartiles'][1]:.2f})", f"{r['flop_ideal']:.3f}",
              f"{r['measured_vs_ideal']:.3f}",
              "n/a" if r["attn_ms"] is None else f"{r['attn_ms']:.2f}",
              "n/a" if r["attn_vs_pre_ln"] is None else f"{r['attn_vs_pre_ln']:.2f}",
              "n/a" if r["mfu"] is None else f"{r['mfu']:.0%}",
              "n/a" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.1f}"] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *lines)]
    for line in [cols, ["-" * w for w in widths], *lines]:
        print(" | ".join(str(x).ljust(w) for x, w in zip(line, widths)))
    if "bfloat16" not in args.dtypes and args.why != "as asked" and "cuda" not in args.device:
        print(f"bfloat16 not timed: {args.why} (--dtype float32,bfloat16 times it anyway)")
    print("vs pre_ln: total / non-embedding parameters. speed vs pre_ln: the median over rounds of pre_ln's step time "
          f"over the block's in the same round (quartiles). speed vs {first}: the block's own in {first}, timed in a pass "
          "of its own. FLOP ideal: pre_ln's training FLOPs per token over the block's. attn: the attention sub-block of "
          "the last layer alone, forward + backward. mem: the model's own peak (weights, optimizer state, its step's "
          "activations).")


def main(argv=None):
    args = parse_args(argv)
    rows = run(args)
    print_table(rows, args)
    if args.json:  # with what a number needs to be quoted: the device, the threads, torch, the day
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), device=device_name(args.device), threads=torch.get_num_threads(),
                           torch=torch.__version__, date=datetime.date.today().isoformat(), rows=rows), f, indent=2)
    return rows


def device_name(device):
    """The GPU's name, or the CPU's model (Linux's /proc/cpuinfo) and its bf16 support."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return platform.processor() or platform.machine()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "CPU")
    return model + (", AVX512-BF16" if "avx512_bf16" in info else ", no native bf16")


if __name__ == "__main__":
    main()
