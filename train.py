"""
Train a GPT built from any block of "Simplifying Transformer Blocks", nanoGPT style.

    python train.py --block sas_p                    # CUDA: the paper's run; CPU: a small one (README)
    python train.py --block pre_ln --n_layer 8       # every field of GPTConfig is a flag
    python train.py --block sas_p --resume           # continue an interrupted run
    python train.py --block sas_p --objective mlm    # the paper's encoder: masked language modelling
    torchrun --nproc_per_node=8 train.py --block sas_p          # data parallel (DDP)
    python train.py --block sas --alpha_ff 0         # an ablation of the paper (SPEC §8)

A run's settings (train_config.py) are its device's preset, then (--resume) its checkpoint, then the
flags given: on CUDA the paper's run, on CPU a small one that learns visibly in minutes. Each
evaluation appends a record to <out_dir>/log.jsonl (losses, gains, token similarity and each layer's
outlier features; at the end the loss with int8 inputs to every linear layer; a diverged run's last
record says so) and rewrites <out_dir>/ckpt.pt atomically.
"""

import json
import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, fields, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import prepare_data
from common import (Masking, autocast_dtype, configure_optimizers, device_peak, flops_per_token, load_checkpoint,
                    load_weights, read_records, regrouped, save_checkpoint, tune_device)
from train_config import fail, out_dir, padded_vocab, parse_args, settings, warmup_steps
from diagnostics import int8_inputs, learned_gains, stream_stats
from sample import sample_text
from simple_gpt import GPT, GPTConfig

# A run has stalled when its val loss, STALL_AFTER steps past 2 x warmup (or at its end), is above STALL_LEVEL x
# the unigram level (the best loss without context). Every run that trained here had left it by then.
STALL_AFTER, STALL_LEVEL = 50, 0.98


def setup_device(want):
    """Returns (device, ddp rank, world size), starting the process group under torchrun."""
    available = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    if not available.get(want, True):
        fail(f"--device {want}, but torch sees no {want.upper()} device")
    cuda = want in ("auto", "cuda") and available["cuda"]
    if "RANK" in os.environ:  # torchrun
        if cuda:  # each process its GPU, told to NCCL (else it guesses one from the rank)
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)
            dist.init_process_group(backend="nccl", device_id=device)
            return str(device), dist.get_rank(), dist.get_world_size()
        if want == "mps":
            fail("--device mps takes one process: torchrun's processes here would train on the CPU (gloo)")
        dist.init_process_group(backend="gloo")
        return "cpu", dist.get_rank(), dist.get_world_size()
    return "cuda" if cuda else "mps" if want in ("auto", "mps") and available["mps"] else "cpu", 0, 1

# ----------------------------------------------------------------------------- data and logs

def load_dataset(cfg, master):
    """Check data/<dataset> and return (meta, {split: path}); the default corpus is prepared on first use."""
    folder = Path(cfg.data_dir) / cfg.dataset
    again = prepare_data.command_for(cfg.dataset, cfg.data_dir)
    if cfg.dataset == prepare_data.DEFAULT_DATASET and prepare_data.prepared(folder / "meta.json") is None:
        if master:  # missing, or cut short
            print(f"train: {folder} not prepared, preparing the default corpus (Python's standard library)")
            prepare_data.main(["--data_dir", cfg.data_dir])
        if dist.is_initialized():
            dist.barrier()
    if not (folder / "meta.json").exists():
        fail(f"dataset {folder} is not prepared; run: {again}")
    try:
        meta, paths = prepare_data.open_prepared(folder, cfg.block_size)
    except ValueError as e:
        fail(f"{e}; prepare the dataset again with the prepare_data.py command that made it, e.g.: {again}")
    if cfg.dataset == prepare_data.DEFAULT_DATASET and meta["tokenizer"] == "bytes" and master:  # prepared offline
        print(f"train: warning: {folder} holds bytes, not GPT-2 tokens: the CPU preset's rates and the README's numbers "
              f"are for tokens; once tiktoken's GPT-2 files are there, delete {folder} to prepare it again", flush=True)
    return meta, paths


def get_batch(path, offsets, T, device):
    """Inputs and next-token targets of the sequences at offsets: two views of one copy."""
    seqs = to_device(torch.from_numpy(prepare_data.sequences(path, offsets, T)), device)
    return seqs[:, :-1], seqs[:, 1:]


def to_device(t, device):
    """On CUDA a pinned, asynchronous copy (contiguous first): the CPU goes on queueing work."""
    if torch.device(device).type == "cuda":
        return t.contiguous().pin_memory().to(device, non_blocking=True)
    return t.to(device)


def human(n):
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else f"{n:.0f}"

# ----------------------------------------------------------------------------- the run

class Trainer:
    """One run, in the order it happens: set-up (settings, device, data, model, optimizers; a checkpoint
    to resume), one training step, evaluation and its log record, the loop (run)."""

    def __init__(self, given):
        self.device, self.rank, self.world = setup_device(given.get("device", "auto"))
        self.master, device_type = self.rank == 0, torch.device(self.device).type
        self.ckpt_path = Path(out_dir(given)) / "ckpt.pt"
        self.log_path = self.ckpt_path.with_name("log.jsonl")
        if given.get("resume") and not self.ckpt_path.exists():
            fail(f"--resume: no checkpoint {self.ckpt_path}; drop --resume to start a new run")
        ckpt = load_checkpoint(self.ckpt_path, self.device, "train") if given.get("resume") else None
        cfg, self.why = settings(given, self.device, self.world, ckpt and ckpt["config"])
        if cfg.dtype == "auto":  # the one setting the device decides: does it run bf16 fast?
            dtype, self.why["dtype"] = autocast_dtype(self.device)
            cfg = replace(cfg, dtype=dtype)
        if not cfg.resume and self.ckpt_path.exists():
            fail(f"{self.ckpt_path.parent} already holds a run; --resume continues it, or choose another --out_dir")
        tune_device(self.device)
        self.meta, self.paths = load_dataset(cfg, self.master)
        self.tokenizer = self.closing_sample_tokenizer()
        n_tokens, mlm = self.meta["vocab_size"], cfg.objective == "mlm"
        self.cfg = cfg = replace(cfg, vocab_size=padded_vocab(n_tokens, mlm))
        self.model_config = GPTConfig(**{f.name: getattr(cfg, f.name) for f in fields(GPTConfig)})
        if ckpt and {**asdict(self.model_config), **ckpt["model_config"]} != asdict(self.model_config):
            fail(f"checkpoint {self.ckpt_path} holds another model than {cfg.dataset} makes: "
                 f"{ckpt['model_config']} (the dataset's vocabulary changed?)")
        self.masking = Masking(cfg.mask_prob, cfg.block_size, n_tokens, n_tokens) if mlm else None  # mask: id n_tokens
        torch.manual_seed(cfg.seed)
        try:
            self.raw_model = GPT(self.model_config).to(self.device)
        except ValueError as e:  # e.g. qk_norm for a block of one's own without attention
            fail(str(e))
        self.optimizers = configure_optimizers(  # Muon's Newton-Schulz in bf16 where the run is (else emulated: slow)
            self.raw_model, cfg.weight_decay, cfg.lr, (cfg.beta1, cfg.beta2), device_type, cfg.optimizer, cfg.muon_lr,
            muon_dtype=torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32, emb_lr=cfg.emb_lr,
            emb_weight_decay=cfg.emb_weight_decay)
        self.scaler = torch.amp.GradScaler(device_type, enabled=cfg.dtype == "float16")
        self.data_rng = torch.Generator().manual_seed(cfg.seed)  # batches and masks; the same on every rank
        # static shapes: evaluation (through it too) ends in a shorter batch, which would make the
        # training graph dynamic-shaped; so that batch compiles a graph of its own, once
        self.model = self.compiled = torch.compile(self.raw_model, dynamic=False) if cfg.compile else self.raw_model
        if self.world > 1:
            self.model = DDP(self.compiled, device_ids=[torch.device(self.device).index] if device_type == "cuda" else None)
        self.autocast = torch.autocast(device_type, dtype=getattr(torch, cfg.dtype)) if cfg.dtype != "float32" else nullcontext()
        try:
            self.ckpt_path.parent.mkdir(parents=True, exist_ok=True)
            (self.ckpt_path.parent / f".write_test_{os.getpid()}").touch()
            (self.ckpt_path.parent / f".write_test_{os.getpid()}").unlink()
        except OSError as e:
            fail(f"cannot write to --out_dir {cfg.out_dir}: {e.strerror}")
        self.it, self.elapsed, self.loss_sum, self.loss_count, self.stalled_at = 0, 0.0, torch.zeros((), device=self.device), 0, None
        if ckpt:
            self.restore(ckpt)
        elif self.master:
            self.log_path.write_text("")  # a new run, a new log
        self.resumed_at, self.stop_asked = self.it if ckpt else None, False
        self.plan_steps_and_evaluations()

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
        self.flops_per_iter = flops_per_token(self.raw_model, cfg.block_size, predicted) * self.tokens_per_iter

    def closing_sample_tokenizer(self):
        """The tokenizer the sample at the end needs, checked now rather than after the run;
        None (with a warning) if it cannot load here, e.g. GPT-2's offline without its files."""
        try:
            return prepare_data.load_tokenizer(self.meta["tokenizer"])
        except SystemExit as e:
            if self.master:
                print(f"train: warning: the run will end without a sample: {e}", file=sys.stderr)

    def restore(self, ckpt):
        load_weights(self.raw_model, ckpt, self.ckpt_path, "train")
        states = ckpt["optimizers"] if "optimizers" in ckpt else [ckpt["optimizer"]]  # a checkpoint of an older version
        for optimizer, state in zip(self.optimizers, states, strict=True):
            optimizer.load_state_dict(regrouped(state, optimizer))
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

    def lr_at(self, step, peak=None):
        """Linear warmup over warmup_frac of the steps to peak (a parameter group's; by default --lr),
        then decay to 0: linear, or cosine (Fig. 12)."""
        cfg, peak = self.cfg, self.cfg.lr if peak is None else peak
        if step < self.warmup:
            return peak * (step + 1) / self.warmup
        left = max(0.0, (cfg.max_iters - step) / max(1, cfg.max_iters - self.warmup))  # 1 -> 0
        return peak * (left if cfg.schedule == "linear" else 0.5 * (1 - math.cos(math.pi * left)))

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
        for group in (group for optimizer in self.optimizers for group in optimizer.param_groups):
            group["lr"] = self.lr_at(self.it, group["peak"])  # each group on the schedule, from its own peak
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
        if self.world > 1:  # a sum, then the mean: an older torch's gloo (CPU) has no AVG
            dist.all_reduce(self.loss_sum)
            self.loss_sum /= self.world
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
            x = self.batch("val", self.all_val_offsets[:self.cfg.batch_size])[0]  # the first validation sequences
            with self.autocast:
                similarity, outliers = stream_stats(self.raw_model, x)
            record = dict(iter=self.it, train_loss=train_loss, val_loss=val_loss, **extra, elapsed_s=round(self.elapsed, 3),
                          tokens=self.it * self.tokens_per_iter, lr=self.lr_at(max(self.it - 1, 0)),
                          stalled=stalled, similarity=similarity, outliers=outliers, gains=learned_gains(self.raw_model))
            with open(self.log_path, "a") as f:
                f.write(json.dumps(record) + "\n")
            print(f"eval {self.it}: val loss {val_loss:.4f}" + (f" | train loss {train_loss:.4f}" if train_loss is not None
                  else "") + (f" | int8 {extra['val_loss_int8']:.4f}" if extra else ""), flush=True)
            if stalled and self.stalled_at is None:
                self.stalled_at = self.it
                print(f"train: warning: the run has stalled: at iter {self.it} its val loss is still at the unigram "
                      f"level {self.unigram:.3f} (token frequencies alone, no context), and its tokens look alike "
                      f"(similarity {similarity:.3f}). Skipless blocks do this at too high a learning rate "
                      "for a short warmup: try a lower --lr or a longer --warmup_frac. "
                      "Training goes on; Ctrl-C saves a checkpoint.", flush=True)
            self.save()
        self.loss_sum, self.loss_count = torch.zeros((), device=self.device), 0
        self.t_lap, self.it_lap = time.perf_counter(), self.it  # evaluation time is not training time

    def diverged(self, what):
        """Stops a run whose loss or weights are not finite; its last log record says so."""
        if self.master:
            with open(self.log_path, "a") as f:
                f.write(json.dumps(dict(iter=self.it, diverged=True)) + "\n")
        fail(f"diverged: {what} at iter {self.it}; the last good checkpoint stays in {self.ckpt_path}; a lower --lr is a "
             "new run (--resume keeps the rate it began with): another --out_dir")

    def log_step(self, loss_acc):
        """At log and eval steps: wait for the device, clock the steps since the last lap, print.
        The first step (compiling, warming the allocator) is timed apart: it skews no step time or ETA."""
        cfg = self.cfg
        if self.world > 1:
            dist.all_reduce(loss_acc)
            loss_acc /= self.world
        step_loss = loss_acc.item()  # waits for the device, so the clock below is true
        if not math.isfinite(step_loss):
            self.diverged(f"loss is {step_loss}")
        now, steps, first = time.perf_counter(), self.it - self.it_lap, self.it == self.first + 1
        if first:
            self.first_step_s, self.t_lap, self.it_lap = now - self.t_lap, now, self.it
            if self.master and cfg.compile:
                print(f"compile: the first step took {self.first_step_s:.1f} s (compiling); timings leave it out", flush=True)
        elif steps:  # per step, since the last lap
            dt = (now - self.t_lap) / steps
            self.elapsed, self.t_lap, self.it_lap = self.elapsed + now - self.t_lap, now, self.it
            self.dt_avg = dt if self.dt_avg is None else 0.8 * self.dt_avg + 0.2 * dt
        if self.master and (self.it % cfg.log_interval == 0 or self.it == cfg.max_iters):
            if first:
                timing = f"{self.first_step_s * 1000:.0f} ms (first step)"
            else:
                mfu = f" | mfu {self.flops_per_iter / self.world / self.dt_avg / self.peak:.0%}" if self.peak else ""
                eta = int(self.dt_avg * (cfg.max_iters - self.it))
                timing = f"{dt * 1000:.0f} ms | {human(self.tokens_per_iter / dt)} tok/s{mfu} | eta {eta // 60}m{eta % 60:02d}s"
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
        cfg, masking, model = self.cfg, self.masking, self.raw_model
        objective = f"masked LM, bidirectional, {masking.k} of {cfg.block_size} positions masked" if masking else \
            "next-token prediction"
        print(f"device: {self.device}" + (f" x {self.world} processes" if self.world > 1 else "")
              + f" | dtype: {cfg.dtype} ({self.why.get('dtype', 'as asked')}) | compile: {cfg.compile} "
              f"({self.why.get('compile', 'as asked')})")
        print(f"model: {cfg.block}, norm {cfg.norm}, {cfg.n_layer} x {cfg.n_embd}, {cfg.n_head} heads, "
              f"T {cfg.block_size}, vocab {cfg.vocab_size} ({self.meta['tokenizer']}): {human(model.num_params())} "
              f"parameters ({human(model.num_params(non_embedding=True))} without embeddings) | {objective}"
              f"{self.why['defaults']}")
        optimizer = "AdamW" if cfg.optimizer == "adamw" else (
            f"AdamW on the embeddings, norms and gains; Muon on the blocks' matrices to lr {cfg.muon_lr:g}, W^Q and "
            f"W^K apart, its update scaled to AdamW's size, Newton-Schulz in {str(self.optimizers[0].dtype).removeprefix('torch.')}")
        emb = next(g for o in self.optimizers for g in o.param_groups if g["name"] == "embeddings")
        embeddings = "" if (emb["peak"], emb["weight_decay"]) == (cfg.lr, cfg.weight_decay) else (
            f", the embeddings (wte, tied to the head, and wpe) to lr {emb['peak']:g} with decay {emb['weight_decay']:g}")
        print(f"data: {cfg.dataset}, {human(self.n_train)} train tokens | {self.tokens_per_iter:,} tokens per step: "
              f"{cfg.batch_size * cfg.grad_accum} sequences{self.why.get('batch', '')} ({cfg.batch_size} x "
              f"{cfg.block_size} x {cfg.grad_accum} accumulated) | {cfg.max_iters} steps ({self.warmup} of warmup "
              f"to lr {cfg.lr:g}{embeddings}, {optimizer}) | eval every {cfg.eval_interval} on {len(self.all_val_offsets) * cfg.block_size:,} "
              f"val tokens | out: {self.log_path.parent}" + (f" | resuming at iter {self.it}" if self.resumed_at is not None else ""))

    def run(self):
        """The loop: evaluate and save at eval steps, stop when done or asked, else train a step."""
        cfg = self.cfg
        previous_handlers = {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        if self.master:
            self.print_banner()
        self.t_lap, self.it_lap, self.dt_avg, self.first = time.perf_counter(), self.it, None, self.it
        if self.master and self.it >= cfg.max_iters:
            print(f"train: the run in {self.log_path.parent} is finished (iter {self.it} of {cfg.max_iters}); nothing to do")
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
                if self.it in (self.first + 1, cfg.max_iters) or self.it % cfg.log_interval == 0 or self.it % cfg.eval_interval == 0:
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


def main(argv=None):
    return Trainer(parse_args(argv, __doc__)).run()


if __name__ == "__main__":
    main()
