"""
The paper's claims tested the paper's way, every verdict with its noise: each block's learning
rate tuned alike, the tuned runs repeated over seeds, compared seed by seed (same batches), at
more than one scale point; then the paper's argument, ablation by ablation (SPEC §8).

    python reproduce.py                       # GPT (next-token), 3 seeds: ~2 hours on 2 CPU cores (*)
    python reproduce.py --experiment path     # the paper's path, Figs. 3, 4, 6, 12, 13, 23-25: ~2.2 hours (*)
    python reproduce.py --experiment mlm      # the encoder (BERT's masked LM)
    python reproduce.py --quick               # any of them smaller, 2 seeds (assets/quick/): ~20 minutes (*)
    python reproduce.py --seeds 1             # one seed: round 2's single-seed protocol
    python reproduce.py --scale large         # and 3,200 steps, each block around its 800-step rate (assets/large/)
    python reproduce.py --report              # tables and figures from the runs finished so far

(*) as two processes, one per core: run `OMP_NUM_THREADS=1 python reproduce.py ...` twice; they
share out/repro/ through locks and never train one run twice.

Interrupt it at any time: rerunning resumes the unfinished run and skips the finished ones.

How a block is tuned (SPEC §4: the paper tuned each model's peak learning rate on a log grid),
so that its rate holds beyond one lucky seed:
1. sweep: it trains at every rate of one grid, GRID, the same for every block, on the first
   seed, at the very length it is compared at (the best rate moves with run length); the grid
   grows by factors of 2 on a side while the block's best rate sits at that edge and trains;
2. check: its TOP_K best rates that trained rerun on the second seed (more, until one trains);
3. the rate with the best mean over both among those that trained on both runs on every other
   seed; if it stalls or diverges on one, the next best does, and so on. The tuned rate is the
   first that trains on every seed (if none does, the one that trained on the most); its final
   runs are it on every seed.
A run that diverges (a non-finite loss) or stalls (its validation loss never leaves the
unigram level: train.py's STALL_LEVEL) is a result: recorded, counted in the tables, never
dropped. A seed sets both the initial weights and the batch order, and every block gets the same
seeds, so blocks compare seed by seed on the same batches: the tables give the paired gap to
Pre-LN per seed. Seeds are train.py's default 1337, then 1, 2, 3, ...

The GPT comparison runs in the regime the factor study's rule chose (--experiment regime;
chosen_regime): the paper's head width and width : depth (6 x 256, 4 heads of 64) and a 20%
warmup, batch 16. The path experiment stays in round 3's regime, deep and narrow (12 x 128, 5%
warmup), as its effects are about depth (signal propagation through many blocks). Tokens are
bytes (vocabulary 257): with GPT-2's 50K vocabulary the output head would be most of the
matmuls at these widths and hide the blocks' speed differences.
Seconds per step come from bench.py (every block in one process, steps interleaved), not from the
runs' own clocks, which ran one after another on a machine whose speed drifts.
Figures need matplotlib (pip install matplotlib); without it the tables are still written.
"""

import argparse
import datetime
import hashlib
import json
import math
import platform
import re
import statistics
import subprocess
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np
import torch

import bench
import prepare_data
import train
from simple_gpt import GPT, SHAPED, GPTConfig, token_similarity

CONFIGS = {  # a run's model, as train.py's model flags
    "pre_ln": dict(block="pre_ln"),
    "parallel": dict(block="parallel"),
    "sas": dict(block="sas"),
    "sas_p": dict(block="sas_p"),
    "sas_p_nonorm": dict(block="sas_p", norm="none"),
    "v_skipinit": dict(block="v_skipinit"),
    "skipless": dict(block="skipless"),
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
}
GRID = (1e-3, 2e-3, 4e-3, 8e-3)  # peak learning rates, the same for every block
MAX_EXTRA = 4  # points the grid may grow by, per block and scale point
TOP_K = 2  # rates rerun on the second seed
SHARED_LR = 1e-3  # the paper's GPT rate: round 1 ran every block at it
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
EXPERIMENTS = {
    "clm": dict(
        objective="clm",
        flags={},  # train.py's defaults: the paper's GPT recipe (SPEC §4)
        tuned=("pre_ln", "sas", "sas_p"),  # claim 4's subjects, tuned at every scale point
        # at the shared rate on every seed, at scale points: -1 the largest, 0 the smallest (the
        # failure baselines: their lag shows early, and cheaply); Pre-LN, paired with them
        shared_lr=dict(pre_ln=(0, -1), parallel=(-1,), sas_p_nonorm=(-1,), v_skipinit=(0,), skipless=(0,)),
        # the model, its regime (REGIME) and the run lengths (steps) that are the scale points: the
        # factor study's choice (chosen_regime), 6 x 256, 4 heads of 64, batch 16, 20% warmup;
        # quick keeps round 3's small shape, to stay a few minutes. longer: lengths each block is
        # tuned at on 3 rates around its tuned rate at the longest of steps, its best then on every
        # seed (a 3,200-step run takes ~27 minutes of a core here, 0.5 s a step: the whole grid
        # would be ~9 hours)
        scales={
            "quick": dict(n_layer=6, n_head=2, n_embd=64, warmup_frac=0.2, steps=(100, 200)),
            "default": dict(n_layer=6, n_head=4, n_embd=256, warmup_frac=0.2, steps=(200, 800)),
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
                dict(n_layer=12, n_head=4, n_embd=128, steps=200, warmup_frac=0.05),  # round 3: 10-step ramp
                dict(n_layer=12, n_head=4, n_embd=128, steps=200, warmup_frac=0.2),   # 40-step ramp
                dict(n_layer=6, n_head=4, n_embd=256, steps=200, warmup_frac=0.05),   # the paper's d_k 64, width:depth 43
                dict(n_layer=6, n_head=4, n_embd=256, steps=200, warmup_frac=0.2),
                dict(n_layer=12, n_head=4, n_embd=128, steps=800, warmup_frac=0.05),  # round 3: 40-step ramp, 4x longer
                # added once the rule had chosen cell 4's regime: a regime must train in every cell;
                # trained before the two below, as it decides whether the choice stands
                dict(n_layer=6, n_head=4, n_embd=256, steps=800, warmup_frac=0.2),
                dict(n_layer=12, n_head=4, n_embd=128, steps=800, warmup_frac=0.2),   # 160-step ramp
                # round 5, the paper's tokens: the main job's shape (6 x 128, d_k 32) and the chosen
                # one on GPT-2 BPE, each beside its bytes twin (6 x 256's are cells 4 and 6)
                dict(n_layer=6, n_head=4, n_embd=128, steps=200, warmup_frac=0.2),
                dict(n_layer=6, n_head=4, n_embd=128, steps=200, warmup_frac=0.2, tokens="bpe"),
                dict(n_layer=6, n_head=4, n_embd=128, steps=800, warmup_frac=0.2),
                dict(n_layer=6, n_head=4, n_embd=256, steps=200, warmup_frac=0.2, tokens="bpe"),
                dict(n_layer=6, n_head=4, n_embd=128, steps=800, warmup_frac=0.2, tokens="bpe"),  # the main job
                dict(n_layer=6, n_head=4, n_embd=256, steps=800, warmup_frac=0.2, tokens="bpe"),
                dict(n_layer=12, n_head=4, n_embd=128, steps=200, batch_size=64, warmup_frac=0.2)]),  # 16 x 800's tokens
        }),
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
DATASET = "python_stdlib_bytes"  # the tokens of every run but the factor study's BPE cells
VOCAB = 320  # bytes, end-of-text and MLM's mask token (258), padded to a multiple of 64 as train.py does
BPE_VOCAB = 50304  # GPT-2's BPE (the main job's tokens, prepare_data.py's default) and the mask, padded
TRAINING = dict(block_size=128, batch_size=16, eval_tokens=2**15, warmup_frac=0.05)  # every run's; 5%: the paper's
REGIME = ("batch_size", "warmup_frac")  # the training settings a regime (a Cell, a scale) may change
OUT = Path("out/repro")


def tokens_of(kind):
    """(dataset, vocabulary as train.py pads it) of a run's tokens, bytes or bpe: the same text."""
    return (DATASET, VOCAB) if kind == "bytes" else (prepare_data.DEFAULT_DATASET, BPE_VOCAB)


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
        return "".join(f"_{k}{v:g}" for k, v in self.flags)

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
            settings.update(BERT, **({"beta_ff": BERT_BETA_FF} if CONFIGS[self.config]["block"] in SHAPED else {}))
        return {**settings, **dict(self.flags)}

    def model_config(self):
        s = self.settings()
        return GPTConfig(vocab_size=tokens_of(self.tokens)[1], causal=self.objective == "clm",
                         **{k: s[k] for k in train.MODEL_FIELDS if k in s})

    def again(self, **changes):
        return replace(self, **changes)

    def argv(self):
        """train.py's command line for this run."""
        flags = []
        for k, v in self.settings().items():
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
    return {k: v for k, v in row["flags"].items() if k not in REGIME}


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

    def run(self, config):
        return Run("clm", config, self.n_layer, self.n_head, self.n_embd, self.steps, SHARED_LR,
                   flags=regime_flags(vars(self)), tokens=self.tokens)

    @property
    def warmup_steps(self):
        return max(1, int(self.warmup_frac * self.steps))  # as train.py counts them

    @property
    def regime(self):
        """What the reproduction would take from the cell: all of it but the run length."""
        return (self.n_layer, self.n_head, self.n_embd, self.batch_size, self.warmup_frac, self.tokens)

    @property
    def label(self):
        return (f"{'BPE ' if self.tokens == 'bpe' else ''}{self.n_layer}x{self.n_embd} (d_k {self.n_embd // self.n_head}), "
                f"{self.batch_size} x {self.steps} steps, warmup {self.warmup_frac:.0%} = {self.warmup_steps} steps")


@dataclass(frozen=True)
class Outcome:
    loss: float  # the final validation loss; inf if diverged
    status: str  # trained, stalled or diverged

    @property
    def trained(self):
        return self.status == "trained"


class Unfinished(Exception):
    """A run the report needs has not been trained (--report only reads, or another process has it)."""


@contextmanager
def claimed(path, wait):
    """Holds an exclusive lock on path within the block, so that reproduce.py can run once per core
    (OMP_NUM_THREADS=1) on one out/ folder: a process waits for a run another is training (wait),
    or leaves an arm another has claimed to it (raises Unfinished). No-op where fcntl is missing."""
    try:
        with prepare_data.locked(path, wait):
            yield
    except prepare_data.Locked:  # raised only by taking the lock: a nested one raises Unfinished
        raise Unfinished("another reproduce.py process has it") from None


def restore_logs(results_files):
    """--reuse_results: the runs whose log.jsonl is gone (out/ is not committed) but which these
    results.json files hold (their runs, and the finished runs of what is not finished) get their
    log written back from them (each record marked restored;
    a diverged run its marker), so that a long experiment goes on on another machine, or in a
    fresh clone, instead of training them again. Returns how many were restored."""
    restored = 0
    for path in results_files:
        results = json.loads(Path(path).read_text())
        so_far = [row for e in results.get("experiments", {}).values() for row in e.get("so_far", [])]
        for row in results["runs"] + so_far:
            log = Path(row["log"])
            if log.exists() or (log.parent / "diverged").exists():
                continue
            log.parent.mkdir(parents=True, exist_ok=True)
            if row["status"] == "diverged":
                (log.parent / "diverged").write_text(json.dumps(dict(lr=row["lr"])))
            similarity, gains = dict(row["similarity"]), dict(row.get("gains", []))
            records = [dict(iter=i, val_loss=loss, similarity=similarity.get(i), gains=gains.get(i, {}), stalled=False,
                            restored=str(path)) for i, loss in row["curve"]]
            if row["status"] != "diverged":  # the exact final loss (the curve's is rounded) and status
                records[-1].update(val_loss=row["val_loss"], stalled=row["status"] == "stalled")
            log.write_text("".join(json.dumps(r) + "\n" for r in records))
            restored += 1
    return restored


def read_log(run):
    return train.read_records(run.folder / "log.jsonl")


def finished(run):
    """The outcome of a finished run, else None."""
    if (run.folder / "diverged").exists():
        return Outcome(math.inf, "diverged")
    records = read_log(run)
    if records and records[-1]["iter"] == run.steps:
        return Outcome(records[-1]["val_loss"], "stalled" if records[-1].get("stalled") else "trained")
    return None


def outcome(run, train_it):
    """The run's outcome, training it first if train_it (else Unfinished if it is not done)."""
    done = finished(run)
    if done or not train_it:
        if done is None:
            raise Unfinished(run.folder)
        return done
    with claimed(run.folder / "lock", wait=True):
        return finished(run) or train_run(run)


def train_run(run):
    """Trains run with train.py (resuming it if it has a checkpoint); its outcome."""
    resume = ["--resume"] if (run.folder / "ckpt.pt").exists() else []
    print(f"reproduce: training {run.folder}" + (" (resuming)" if resume else ""), flush=True)
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("train.py")), *run.argv(), *resume],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    diverged = False
    try:
        for line in proc.stdout:
            print("  " + line, end="", flush=True)
            diverged |= train.DIVERGED in line
    except KeyboardInterrupt:
        proc.wait()  # train.py finishes its step and saves a checkpoint
        raise
    proc.wait()
    if diverged:  # a too-high rate is a result of the sweep, not an error
        (run.folder / "diverged").write_text(json.dumps(dict(lr=run.lr)))
    done = finished(run)
    if proc.returncode and not diverged or done is None:
        raise SystemExit(f"reproduce: {run.folder} stopped early (exit code {proc.returncode}); "
                         "run reproduce.py again to resume")
    (run.folder / "ckpt.pt").unlink(missing_ok=True)  # megabytes a run; the log holds what the report needs
    return done


# ----------------------------------------------------------------------------- the protocol

def sweep(run, train_it, grid=None, extra=None):
    """{lr: outcome} of run at every rate of grid (GRID), on its seed; grown by factors of 2, up to
    extra (MAX_EXTRA) more rates, while the best rate is at an edge and trains."""
    grid, extra = grid or GRID, MAX_EXTRA if extra is None else extra
    lrs, results = list(grid), {}
    while True:
        for lr in lrs:
            if lr not in results:
                results[lr] = outcome(run.again(lr=lr), train_it)
        best = min(lrs, key=lambda lr: results[lr].loss)
        if len(lrs) == len(grid) + extra or not results[best].trained:
            return results
        if best == lrs[0]:
            lrs.insert(0, best / 2)
        elif best == lrs[-1]:
            lrs.append(best * 2)
        else:
            return results


def tune(run, seed_list, train_it, grid=None, extra=None, top_k=TOP_K):
    """The protocol of the module docstring for run's config: ([(run, role, outcome)], tuned lr)
    with role sweep (first seed), check (another seed, a rate not kept) or final (the tuned rate,
    every seed)."""
    first = sweep(run.again(seed=seed_list[0]), train_it, grid, extra)
    rows = {(lr, seed_list[0]): o for lr, o in first.items()}

    def trains_on(lr, seeds):  # trains what is missing, up to the first seed it fails on
        for seed in seeds:
            if (lr, seed) not in rows:
                rows[lr, seed] = outcome(run.again(lr=lr, seed=seed), train_it)
            if not rows[lr, seed].trained:
                return False
        return True

    mean = lambda lr: statistics.fmean(o.loss for (r, _), o in rows.items() if r == lr)
    unchecked = sorted((lr for lr in first if first[lr].trained), key=lambda lr: first[lr].loss)
    checked, held, tuned = 0, [], None
    while len(seed_list) > 1:
        while unchecked and (checked < top_k or not held):  # the best rates on the second seed
            lr, checked = unchecked.pop(0), checked + 1
            if trains_on(lr, seed_list[1:2]):
                held.append(lr)
        if not held:
            break
        best = min(held, key=mean)
        if trains_on(best, seed_list[2:]):  # and the best of those that held, on every other seed
            tuned = best
            break
        held.remove(best)  # it failed a seed: the next
    if tuned is None:  # one seed, or no rate trained on every seed: the one that trained on most
        tried = {lr for lr, _ in rows}
        tuned = min(tried, key=lambda lr: (-sum(o.trained for (r, _), o in rows.items() if r == lr), mean(lr)))
    for seed in seed_list:
        if (tuned, seed) not in rows:
            rows[tuned, seed] = outcome(run.again(lr=tuned, seed=seed), train_it)
    role = lambda lr, seed: "final" if lr == tuned else "sweep" if seed == seed_list[0] else "check"
    return [(run.again(lr=lr, seed=seed), role(lr, seed), o) for (lr, seed), o in sorted(rows.items())], tuned


def on_every_seed(run, seed_list, role, train_it):
    return [(run.again(seed=seed), role, outcome(run.again(seed=seed), train_it)) for seed in seed_list]


def experiment(name, scale, seed_list, train_it):
    """Train (if train_it) and collect every run of an experiment. Returns ([(run, role, outcome)],
    [what is left out]): without train_it, what is unfinished is left out (a tuned config's
    whole scale point, unless all of its protocol is done), its finished runs in role "so far"."""
    if name == "regime":
        return regime_experiment(scale, seed_list, train_it)
    exp, spec = EXPERIMENTS[name], EXPERIMENTS[name]["scales"][scale]
    shape, flags, steps_list = scale_points(name, scale)
    base = lambda config, steps: Run(exp["objective"], config, **shape, steps=steps, lr=SHARED_LR, flags=flags)
    rows, left_out, tuned = [], [], {}
    for steps in steps_list:
        point, missing = [], []
        for config in exp["tuned"]:  # arm by arm: a second process takes the next arm
            try:
                narrow = {}
                if steps in spec.get("longer", ()):  # around the rate tuned at the longest of steps
                    if (config, spec["steps"][-1]) not in tuned:
                        raise Unfinished(f"its {spec['steps'][-1]}-step tuning")
                    r = tuned[config, spec["steps"][-1]]
                    narrow = dict(grid=(r / 2, r, 2 * r), extra=1, top_k=1)
                with arm_lock(base(config, steps), train_it):
                    runs, tuned[config, steps] = tune(base(config, steps), seed_list, train_it, **narrow)
                point += runs
            except Unfinished as e:
                missing.append(f"{config} (from {e})")
        if missing:  # a table needs every config of the point: its finished runs are shown apart
            left_out.append(f"the {steps}-step tuning: {'; '.join(missing)}")
            if not train_it:
                rows += [row for config in exp["tuned"] for row in finished_so_far(base(config, steps), seed_list)]
        else:
            rows += point
    longest = steps_list[-1]
    todo = [(base(config, spec["steps"][point]), "shared_lr") for config, points in exp.get("shared_lr", {}).items()
            for point in points]
    for run, role in todo:
        try:
            # e.g. Pre-LN at 1e-3 on the first seed: a sweep run already
            seen = {r for r, role, _ in rows if role != "so far"}
            rows += [row for row in on_every_seed(run, seed_list, role, train_it) if row[0] not in seen]
        except Unfinished as e:
            left_out.append(str(e))  # the run not finished (or another process's arm)
    ablations = [(config, base(config, longest)) for config in exp.get("around", ())]
    if "depth" in exp:
        ablations += depth_runs(exp, scale, longest)
    ablations.sort(key=lambda a: a[0].endswith("_0.5"))  # Fig. 3's middle betas last: every figure first
    for config, run in ablations:  # each on 3 rates around its block's tuned rate, and one past an edge
        block = CONFIGS[config]["block"]
        try:
            if (block, longest) not in tuned:
                raise Unfinished(f"{block}'s tuning")
            r = tuned[block, longest]
            with arm_lock(run, train_it):
                rows += tune(run, seed_list, train_it, grid=(r / 2, r, 2 * r), extra=1, top_k=1)[0]
        except Unfinished as e:
            left_out.append(f"{run.folder.parent.name}: {config} (from {e})")
    if not any(role == "final" for _, role, _ in rows):
        raise Unfinished(left_out[0])
    return rows, left_out


def arm_lock(run, train_it):
    """Held while a process tunes run's arm (its config and flags at its shape and length): a
    second process leaves the arm to it (Unfinished) and goes on to the next."""
    if not train_it:
        return nullcontext()
    return claimed(run.folder.parent / f"{run.config}{run.flag_text}.lock", wait=False)


def finished_so_far(run, seed_list):
    """[(run, "so far", outcome)] for every finished run of run's arm (its config and flags at its
    shape and length, any rate, a seed of seed_list), read from out/: what a report shows of a
    tuning arm, or a scale point, that is not finished yet. No verdict is drawn from them."""
    name = re.compile(re.escape(run.config) + r"_lr([0-9.e+-]+)" + re.escape(run.flag_text) + r"_s(\d+)")
    found = []
    for folder in run.folder.parent.glob(f"{run.config}_lr*"):
        match = name.fullmatch(folder.name)
        r = match and run.again(lr=float(match[1]), seed=int(match[2]))
        if r and r.seed in seed_list and r.folder == folder and (done := finished(r)):
            found.append((r, "so far", done))
    return sorted(found, key=lambda row: (row[0].lr, row[0].seed))


def cells(scale):
    return [Cell(**spec) for spec in EXPERIMENTS["regime"]["scales"][scale]["cells"]]


def cell_of(row):
    """The factor-study cell of a result row."""
    return Cell(row["n_layer"], row["n_head"], row["n_embd"], row["steps"], row["batch_size"],
                row["flags"].get("warmup_frac", TRAINING["warmup_frac"]), row.get("tokens", "bytes"))


def regime_experiment(scale, seed_list, train_it):
    """The factor study: every tuned config tuned in every cell, arm by arm (as experiment())."""
    rows, left_out = [], []
    for cell in cells(scale):
        for config in EXPERIMENTS["regime"]["tuned"]:
            run = cell.run(config)
            try:
                with arm_lock(run, train_it):
                    rows += tune(run, seed_list, train_it)[0]
            except Unfinished as e:
                left_out.append(f"{cell.label}: {config} (from {e})")
                if not train_it:
                    rows += finished_so_far(run, seed_list)
    if not any(role == "final" for _, role, _ in rows):
        raise Unfinished(left_out[0])
    return rows, left_out


def depth_runs(exp, scale, steps):
    """Fig. 6: [(config, run)] of each block at depth L and 4L (MLP 2d, beta_FF scaled as 1/sqrt(L))."""
    spec, runs = {**exp["depth"], **exp["scales"][scale]["depth"]}, []
    for n_layer in spec["layers"]:
        for config in spec["configs"]:
            flags = [("mlp_ratio", spec["mlp_ratio"])]
            if CONFIGS[config]["block"] in SHAPED:
                flags.append(("beta_ff", round(spec["beta_ff_at_18"] * math.sqrt(18 / n_layer), 4)))
            runs.append((config, Run(exp["objective"], config, n_layer, spec["n_head"], spec["n_embd"], steps,
                                     SHARED_LR, flags=tuple(sorted(flags)))))
    return runs


def scale_points(name, scale):
    """(the model's shape, its regime's flags, the run lengths compared) of an experiment at a scale."""
    if scale not in EXPERIMENTS[name]["scales"]:
        raise SystemExit(f"reproduce: error: --experiment {name} has no scale {scale}; "
                         f"valid: {', '.join(EXPERIMENTS[name]['scales'])}")
    if name == "regime":  # a shape, regime and lengths per cell
        return None, None, sorted({cell.steps for cell in cells(scale)})
    spec = EXPERIMENTS[name]["scales"][scale]
    return ({k: spec[k] for k in ("n_layer", "n_head", "n_embd")}, regime_flags(spec),
            (*spec["steps"], *spec.get("longer", ())))


# ----------------------------------------------------------------------------- measurements

def step_seconds(objective, timed, configs):
    """Seconds per training step of each config at a timed_key, from bench.py."""
    n_layer, n_head, n_embd, batch_size, vocab_size = timed
    args = bench.parse_args(["--blocks", "pre_ln", "--vocab_size", str(vocab_size), "--steps", "20",
                             "--n_layer", str(n_layer), "--n_head", str(n_head), "--n_embd", str(n_embd),
                             "--seq_len", str(TRAINING["block_size"]), "--batch_size", str(batch_size),
                             "--objective", objective])
    runs = {c: (CONFIGS[c]["block"], {k: v for k, v in CONFIGS[c].items() if k != "block"}) for c in configs}
    rows = bench.run(args, runs=runs, base=configs[0])
    return {r["block"]: batch_size * TRAINING["block_size"] / r["tokens_per_s"] for r in rows}


def timed_key(run):
    """What a step's time depends on: (n_layer, n_head, n_embd, batch_size, vocab_size)."""
    return run.n_layer, run.n_head, run.n_embd, dict(run.flags).get("batch_size", TRAINING["batch_size"]), tokens_of(run.tokens)[1]


def similarity_at_init(shape):
    """Claim 3: token similarity after each layer at init, on validation text (causal models)."""
    val = np.memmap(Path("data") / DATASET / "val.bin", dtype=np.uint16, mode="r")
    T = TRAINING["block_size"]
    idx = torch.from_numpy(np.stack([val[i * T:(i + 1) * T] for i in range(8)]).astype(np.int64))
    sims = {}
    for config in ("pre_ln", "parallel", "sas", "sas_p", "sas_p_nonorm", "v_skipinit", "skipless"):
        torch.manual_seed(1337)
        model = GPT(Run("clm", config, **shape, steps=0, lr=0).model_config())
        sims[config] = [round(s, 4) for s in token_similarity(model, idx)]
    return sims


def step_to_reach(curve, target):
    """The step at which val loss first reaches target, linear between evals; None if never."""
    for (i0, l0), (i1, l1) in zip(curve, curve[1:]):
        if l1 <= target:
            return i0 + ((l0 - target) / (l0 - l1) if l0 > target else 0.0) * (i1 - i0)
    return None


GAIN_KEYS = ("value_beta_over_alpha", "proj_beta_over_alpha", "beta_ff", "beta_sa", "alpha", "beta", "gamma")


def result_rows(name, rows, step_s, first_seed):
    """One JSON-ready dict per run: what it was and how it ended, with its validation curve (and,
    for the first seed's final runs, its learned gains over training); step_s: seconds per step
    of each config, {timed_key: {config: seconds}}, for the shapes and batches timed."""
    out = []
    for run, role, o in rows:
        cfg, records = run.model_config(), read_log(run)
        row = dict(
            name=run.name, experiment=name, objective=run.objective, role=role, config=run.config, block=cfg.block,
            norm=cfg.norm, flags=dict(run.flags), n_layer=run.n_layer, n_embd=run.n_embd, n_head=run.n_head,
            steps=run.steps, batch_size=timed_key(run)[3], tokens=run.tokens, block_size=TRAINING["block_size"], lr=run.lr,
            seed=run.seed, beta_ff=cfg.beta_ff_init if cfg.block in SHAPED else None, params=GPT(cfg).num_params(),
            val_loss=None if math.isinf(o.loss) else o.loss, status=o.status,
            seconds_per_step=step_s.get(timed_key(run), {}).get(run.config),
            curve=[[r["iter"], round(r["val_loss"], 5)] for r in records],
            similarity=[[r["iter"], r["similarity"]] for r in records], log=str(run.folder / "log.jsonl"))
        if role == "final" and run.seed == first_seed:
            row["gains"] = [[r["iter"], {k: v for k, v in r["gains"].items() if k in GAIN_KEYS}] for r in records]
        out.append(row)
    return out


# ----------------------------------------------------------------------------- statistics

def finals(runs, steps, config, role="final", n_layer=None, flags=None):
    """The runs of config at steps in role (final: its tuned rate), one per seed, by seed."""
    return sorted((r for r in runs if r["steps"] == steps and r["config"] == config and r["role"] == role
                   and (n_layer is None or r["n_layer"] == n_layer) and (flags is None or r["flags"] == flags)),
                  key=lambda r: r["seed"])


def losses(rs):
    return [math.inf if r["val_loss"] is None else r["val_loss"] for r in rs]


def paired_gaps(rs, base):
    """Per-seed gaps (%) of runs rs to the base runs of the same seeds."""
    base_by_seed = {b["seed"]: b for b in base}
    return [100 * (loss / losses([base_by_seed[r["seed"]]])[0] - 1)
            for r, loss in zip(rs, losses(rs)) if r["seed"] in base_by_seed]


def spread(values, fmt="{:.4f}"):
    """mean (min-max) of values; inf (a diverged run) says so."""
    if not values:
        return "n/a"
    if any(math.isinf(v) for v in values):
        return f"diverged on {sum(math.isinf(v) for v in values)} of {len(values)}"
    mean = fmt.format(statistics.fmean(values))
    return mean if len(values) == 1 else f"{mean} ({fmt.format(min(values))} to {fmt.format(max(values))})"


def verdict(gaps):
    """A gap to the reference stated against its noise: the side it falls on, per seed."""
    if not gaps or any(math.isinf(g) for g in gaps):
        return "n/a"
    if len(gaps) == 1:
        return "one seed"
    side = ("behind on every seed" if min(gaps) > 0 else "ahead on every seed" if max(gaps) < 0
            else "the sign varies by seed")
    return ("within 2%; " if max(abs(g) for g in gaps) <= 2 else "") + side


def stalled_count(rs, kinds=True):
    bad = [r for r in rs if r["status"] != "trained"]
    return f"{len(bad)} of {len(rs)}" + (f" ({', '.join(sorted({r['status'] for r in bad}))})" if bad and kinds else "")


def reach_seconds(rs, base):
    """Paired equal-time view: per seed, seconds until the run reaches the base's final loss."""
    base_by_seed = {b["seed"]: b["curve"][-1][1] for b in base if b["val_loss"]}  # as rounded in the curves
    times = []
    for r in rs:
        reach = step_to_reach(r["curve"], base_by_seed.get(r["seed"]) or -math.inf) if r["val_loss"] else None
        times.append(None if reach is None or r["seconds_per_step"] is None else reach * r["seconds_per_step"])
    got = [t for t in times if t is not None]
    return "never" if not got else f"{statistics.fmean(got):.0f}" + ("" if len(got) == len(times) else f" ({len(got)} of {len(times)} seeds)")


# ----------------------------------------------------------------------------- tables

def gap_text(rs, base):
    return spread(paired_gaps(rs, base), "{:+.1f}%")


def tuned_table(runs, exp):
    """Each tuned config at its tuned rate at every scale point: its spread over seeds, the gap
    to the first config (pre_ln in the reproduction) seed by seed, how often it stalled, and its speed."""
    first = exp["tuned"][0]
    lines = [f"| steps | config | tuned lr | final val loss, mean (min to max) | paired gap to {first}, mean (min to max) "
             f"| verdict | stalled or diverged | s/step | speed vs {first} | s to reach {first}'s final loss |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for steps in sorted({r["steps"] for r in runs if r["role"] == "final"}):
        base = finals(runs, steps, first)
        for config in exp["tuned"]:
            rs = finals(runs, steps, config)
            if not rs:
                continue
            gaps = paired_gaps(rs, base)
            speed = base[0]["seconds_per_step"] / rs[0]["seconds_per_step"] if rs[0]["seconds_per_step"] else math.nan
            lines.append(f"| {steps} | {config} | {rs[0]['lr']:g} | {spread(losses(rs))} | "
                         f"{gap_text(rs, base) if config != first else ''} | {verdict(gaps) if config != first else ''} "
                         f"| {stalled_count(rs)} | {rs[0]['seconds_per_step'] or math.nan:.3f} | {speed:.3f} "
                         f"| {reach_seconds(rs, base)} |")
    return "\n".join(lines)


def loss_text(r):
    if r["status"] == "diverged":  # its val_loss is None
        return "diverged"
    return f"{r['val_loss']:.4f}" + (" stalled" if r["status"] == "stalled" else "")


def sweep_table(runs, exp):
    """Every tuning run, a row per seed: the first seed's sweep, the second's checks, the other
    seeds' final runs (bold: the tuned rate; stalled: the run never left the unigram level)."""
    runs = [r for r in runs if r["role"] in ("sweep", "check", "final") and r["config"] in exp["tuned"]]
    lrs = sorted({r["lr"] for r in runs})
    lines = ["| steps | config | seed | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |",
             "|---|---|---|" + "---|" * len(lrs)]
    for steps in sorted({r["steps"] for r in runs}):
        for config in exp["tuned"]:
            for seed in sorted({r["seed"] for r in runs}, key=seed_order):
                cells = {r["lr"]: r for r in runs if r["steps"] == steps and r["config"] == config and r["seed"] == seed}
                if cells:
                    row = ["" if lr not in cells else f"**{loss_text(cells[lr])}**" if cells[lr]["role"] == "final"
                           else loss_text(cells[lr]) for lr in lrs]
                    lines.append(f"| {steps} | {config} | {seed} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def seed_order(seed):
    return (seed != 1337, seed)


def stall_table(runs, exp):
    """How often each tuned config stalled or diverged, by rate, over every run and seed."""
    runs = [r for r in runs if r["config"] in exp["tuned"] and not arm_flags(r)]
    lines = ["| steps | config | " + " | ".join(f"lr {lr:g}" for lr in sorted({r["lr"] for r in runs})) + " |",
             "|---|---|" + "---|" * len({r["lr"] for r in runs})]
    for steps in sorted({r["steps"] for r in runs}):
        for config in exp["tuned"]:
            cells = []
            for lr in sorted({r["lr"] for r in runs}):
                rs = [r for r in runs if r["steps"] == steps and r["config"] == config and r["lr"] == lr]
                cells.append(f"{sum(r['status'] != 'trained' for r in rs)} of {len(rs)}" if rs else "")
            lines.append(f"| {steps} | {config} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shared_lr_table(runs, exp):
    """Every config at lr 1e-3, round 1's comparison, at each scale point it ran at, over seeds;
    the tuned configs' runs at 1e-3 are their sweep's (the first seed, and the second if checked)."""
    lines = ["| steps | config (all at lr 1e-3) | params | final val loss, mean (min to max) "
             "| paired gap to pre_ln at 1e-3 | verdict | stalled or diverged |", "|---|---|---|---|---|---|---|"]
    for steps in sorted({r["steps"] for r in runs if r["role"] == "final"}):
        at = [r for r in runs if r["steps"] == steps and r["lr"] == SHARED_LR and not arm_flags(r)]
        base = sorted((r for r in at if r["config"] == "pre_ln"), key=lambda r: r["seed"])
        for config in [c for c in CONFIGS if any(r["config"] == c for r in at)]:
            rs = sorted((r for r in at if r["config"] == config), key=lambda r: r["seed"])
            gaps = paired_gaps(rs, base)
            lines.append(f"| {steps} | {config} | {rs[0]['params'] / 1e6:.3f}M | {spread(losses(rs))} "
                         f"| {spread(gaps, '{:+.1f}%') if config != 'pre_ln' and gaps else ''} "
                         f"| {verdict(gaps) if config != 'pre_ln' else ''} | {stalled_count(rs)} |")
    return "\n".join(lines)


def path_table(runs, exp):
    """The paper's path, figure by figure: each ablation at its tuned rate, seed by seed against
    its reference at the reference's tuned rate."""
    steps = max(r["steps"] for r in runs if r["role"] == "final")
    main = [r for r in runs if not arm_flags(r)]  # not the depth runs
    lines = ["| figure | config | against | tuned lr | final val loss, mean (min to max) "
             "| paired gap, mean (min to max) | verdict | stalled or diverged |", "|---|---|---|---|---|---|---|---|"]
    for figure, (configs, reference) in PATH_FIGURES.items():
        base = finals(main, steps, reference)
        for config in configs:
            rs = finals(main, steps, config)
            if rs:
                lines.append(f"| {figure} | {config} | {reference} | {rs[0]['lr']:g} | {spread(losses(rs))} "
                             f"| {gap_text(rs, base)} | {verdict(paired_gaps(rs, base))} | {stalled_count(rs)} |")
    return "\n".join(lines)


def depth_table(runs, exp):
    """Fig. 6: every block at depth L and 4L, each at its rate tuned at that depth."""
    depth = [r for r in runs if r["flags"].get("mlp_ratio")]
    layers = sorted({r["n_layer"] for r in depth})
    lines = ["| config | " + " | ".join(f"{L} layers: lr, final val loss" for L in layers)
             + f" | {layers[-1]} vs {layers[0]} layers, paired | gap to pre_ln at {layers[-1]} layers, paired |",
             "|---|" + "---|" * (len(layers) + 2)]
    steps = depth[0]["steps"]
    for config in exp["depth"]["configs"]:
        at = {L: finals(depth, steps, config, n_layer=L) for L in layers}
        if not all(at.values()):
            continue
        base = finals(depth, steps, "pre_ln", n_layer=layers[-1])
        cells = [f"{at[L][0]['lr']:g}, {spread(losses(at[L]))}" for L in layers]
        deeper = spread(paired_gaps(at[layers[-1]], at[layers[0]]), "{:+.1f}%")
        lines.append(f"| {config} | " + " | ".join(cells) + f" | {deeper} | "
                     f"{gap_text(at[layers[-1]], base) if config != 'pre_ln' else ''} |")
    return "\n".join(lines)


def regime_rows(runs, exp):
    """{cell: {config: its final runs}} of the factor study, cells in the order they ran."""
    by_cell = {}
    for r in runs:
        if r["role"] == "final":
            by_cell.setdefault(cell_of(r), {}).setdefault(r["config"], []).append(r)
    return {cell: {c: sorted(rs, key=lambda r: r["seed"]) for c, rs in configs.items()} for cell, configs in by_cell.items()}


def tuning_runs(runs, cell, config):
    """Every run of config's tuning in a cell of the factor study, all roles and seeds."""
    return [r for r in runs if cell_of(r) == cell and r["config"] == config]


def chosen_regime(runs, exp):
    """The rule that picks the reproduction's regime, written down before any cell of the study
    had run (round 4), its first criterion before any BPE cell had run (round 5): of the regimes
    (a cell's shape, batch, warmup fraction and tokens, at any length) in which every tuned
    config's tuned rate trained on every seed in every cell run, the closest to the paper's
    recipe (SPEC §4): first the paper's kind of tokens, BPE (the tokens are the task: what is
    predicted, what a loss means, and a 50K-token head and embedding beside the blocks; a shape
    is a choice within a task), then the paper's proportions (head width d_k 64 and width :
    depth >= 40), then the longer warmup ramp (the paper's is ~2,000 steps; every miniature's is
    shorter). Only batch-16 regimes are candidates: the comparison at 64 sequences a step costs
    4x per point, past the budget of the 3,200-step point. Never chosen by its gaps.

    Returns (the chosen cells, why), or (None, why) if no regime qualifies."""
    by_cell, regimes = regime_rows(runs, exp), {}
    for cell, configs in by_cell.items():
        regimes.setdefault(cell.regime, []).append(cell)
    n_seeds = max((len(rs) for configs in by_cell.values() for rs in configs.values()), default=0)
    done = {regime: all(len(by_cell[c].get(config, [])) == n_seeds for c in cs for config in exp["tuned"])
            for regime, cs in regimes.items()}  # a regime with a cell not finished is judged once it is
    trains = {regime: done[regime] and all(r["status"] == "trained" for c in cs for rs in by_cell[c].values() for r in rs)
              for regime, cs in regimes.items()}
    candidates = [regime for regime, ok in trains.items() if ok and regime[3] == TRAINING["batch_size"]]
    unfinished = f" ({sum(not d for d in done.values())} not finished)" if not all(done.values()) else ""
    if not candidates:
        return None, f"no finished batch-16 regime trained at its tuned rates on every seed{unfinished}"
    paper_like = lambda regime: (regime[5] == "bpe", regime[2] // regime[1] == 64 and regime[2] / regime[0] >= 40, regime[4])
    best = max(candidates, key=paper_like)
    return regimes[best], (f"{sum(trains.values())} of {len(regimes)} regimes trained at every tuned rate on every "
                           f"seed{unfinished}; of the batch-16 ones, the closest to the paper's recipe")


def regime_table(runs, exp):
    """The factor study, cell by cell: each tuned config at its tuned rate, its paired gap to
    pre_ln in that cell, and how often it stalled at the tuned rate and over all its tuning."""
    lines = ["| cell | config | tuned lr | final val loss, mean (min to max) | paired gap to pre_ln, mean (min to max) "
             "| verdict | stalled at the tuned rate | stalled, every tuning run | speed vs pre_ln |",
             "|---|---|---|---|---|---|---|---|---|"]
    for cell, configs in regime_rows(runs, exp).items():
        base = configs.get("pre_ln", [])
        for config in exp["tuned"]:
            rs = configs.get(config)
            if not rs:
                continue
            tuning = tuning_runs(runs, cell, config)
            gaps = paired_gaps(rs, base) if config != "pre_ln" else []
            speed = (base[0]["seconds_per_step"] / rs[0]["seconds_per_step"]
                     if base and base[0]["seconds_per_step"] and rs[0]["seconds_per_step"] else math.nan)
            lines.append(f"| {cell.label} | {config} | {rs[0]['lr']:g} | {spread(losses(rs))} | "
                         f"{spread(gaps, '{:+.1f}%') if gaps else ''} | {verdict(gaps) if gaps else ''} | "
                         f"{stalled_count(rs)} | {stalled_count(tuning)} | {speed:.3f} |")
    return "\n".join(lines)


def regime_map_table(runs, exp):
    """The regime map in numbers: per cell, each shaped block's paired gap to pre_ln at the tuned
    rates (mean, min to max over seeds), and its stalls at the tuned rate and over all its tuning."""
    shaped = [c for c in exp["tuned"] if c != "pre_ln"]
    lines = ["| cell | pre_ln lr | " + " | ".join(f"{c}: lr, paired gap, stalled (tuned rate / all tuning)" for c in shaped)
             + " |", "|---|---|" + "---|" * len(shaped)]
    for cell, configs in regime_rows(runs, exp).items():
        if "pre_ln" not in configs:
            continue
        cells = []
        for config in shaped:
            rs = configs.get(config)
            tuning = tuning_runs(runs, cell, config)
            cells.append("" if not rs else f"{rs[0]['lr']:g}, {gap_text(rs, configs['pre_ln'])}, "
                         f"{stalled_count(rs, kinds=False)} / {stalled_count(tuning, kinds=False)}")
        lines.append(f"| {cell.label} | {configs['pre_ln'][0]['lr']:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def regime_sweeps(runs, exp):
    """Every tuning run of the factor study, cell by cell, a row per seed (as sweep_table)."""
    return "\n\n".join(f"{cell.label}:\n\n" + sweep_table([r for r in runs if cell_of(r) == cell], exp)
                        for cell in regime_rows(runs, exp))


def tables(results):
    """The README's tables, made from results.json alone: [(experiment, title, markdown)]."""
    out = []
    for name, exp in EXPERIMENTS.items():
        runs = [r for r in results["runs"] if r["experiment"] == name]
        if not runs:
            continue
        if name == "regime":
            chosen, why = chosen_regime(runs, exp)
            unfinished = results.get("experiments", {}).get(name, {}).get("unfinished")
            if unfinished:  # a regime not run in full yet may still fail in the cells left
                why += f"; provisional: {len(unfinished)} arms of the study are not finished"
            choice = (f"The rule's choice: {'; '.join(cell.label for cell in chosen)} ({why})." if chosen
                      else f"The rule's choice: none yet ({why}).")
            out += [(name, "regime map", regime_map_table(runs, exp)), (name, "regime choice", choice),
                    (name, "regime", regime_table(runs, exp)),
                    (name, "regime sweeps", regime_sweeps(runs, exp))]
            continue
        if name == "path":
            out += [(name, "path", path_table(runs, exp))]
            if any(r["flags"].get("mlp_ratio") for r in runs):
                out.append((name, "depth", depth_table(runs, exp)))
            continue
        out += [(name, "tuned", tuned_table(runs, exp)), (name, "sweep", sweep_table(runs, exp)),
                (name, "stalls", stall_table(runs, exp))]
        if exp.get("shared_lr"):
            out.append((name, "shared_lr", shared_lr_table(runs, exp)))
    return out


# ----------------------------------------------------------------------------- figures

COLORS = {config: f"C{i % 10}" for i, config in enumerate(CONFIGS)}


def figures(name, results, assets):
    """The README's figures for an experiment, from results.json alone."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("reproduce: matplotlib is not installed (pip install matplotlib); no figures")
        return
    exp = EXPERIMENTS[name]
    runs = [r for r in results["runs"] if r["experiment"] == name]
    steps_list = sorted({r["steps"] for r in runs if r["role"] == "final"})
    if name == "regime":
        made = {"map": regime_figure(plt, runs, exp)}
    elif name == "path":
        made = path_figures(plt, runs, exp, steps_list[-1])
    else:
        what = "next-token" if exp["objective"] == "clm" else "masked-token"
        made = {"lr_sweep": lr_sweep_figure(plt, runs, exp, steps_list, what),
                "val_loss": curves_figure(plt, runs, exp, steps_list[-1], what)}
        if len(steps_list) > 1:
            made["gap_vs_scale"] = gap_figure(plt, runs, exp, steps_list)
        if name == "clm":
            made["rank_collapse"] = similarity_figure(plt, results["similarity_at_init"])
            made["gains"] = gains_figure(plt, runs, steps_list[-1])
        if any(r["status"] == "stalled" for r in runs):
            made["stalls"] = stalls_figure(plt, runs, exp)
    prefix = "" if name == "clm" else f"{name}_"
    for figure_name, fig in made.items():
        fig.tight_layout()
        fig.savefig(assets / f"{prefix}{figure_name}.png", dpi=110)
        plt.close(fig)


def lr_sweep_figure(plt, runs, exp, steps_list, what):
    """The paper's tuning curves: final loss against peak learning rate, one panel per length;
    the first seed's sweep as lines, the other seeds as dots; stalled and diverged runs marked."""
    fig, axes = plt.subplots(1, len(steps_list), figsize=(5.5 * len(steps_list) + 0.5, 4.2), sharey=True, squeeze=False)
    for ax, steps in zip(axes[0], steps_list):
        at = [r for r in runs if r["steps"] == steps and r["role"] in ("sweep", "check", "final")]
        top = max(r["val_loss"] for r in at if r["val_loss"] is not None)
        for config in exp["tuned"]:
            rs = sorted((r for r in at if r["config"] == config), key=lambda r: r["lr"])
            first = [r for r in rs if r["seed"] == 1337 and r["status"] != "diverged"]
            ax.plot([r["lr"] for r in first], [r["val_loss"] for r in first], marker="o", color=COLORS[config], label=config)
            for r in rs:
                if r["seed"] != 1337 and r["val_loss"] is not None:
                    ax.plot([r["lr"]], [r["val_loss"]], marker=".", ls="", color=COLORS[config])
                if r["status"] != "trained":
                    ax.plot([r["lr"]], [top if r["val_loss"] is None else r["val_loss"]], marker="x", ms=10,
                            color=COLORS[config])
            tuned = finals(runs, steps, config)
            ax.plot([tuned[0]["lr"]], [statistics.fmean(losses(tuned))], marker="*", ms=15, color=COLORS[config])
        lrs = sorted({r["lr"] for r in at})
        ax.set_xscale("log", base=2)
        ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs])
        ax.minorticks_off()
        ax.set(xlabel="peak learning rate", title=f"{steps} steps (line: seed 1337; dots: other seeds;\n"
                                                   "star: tuned rate, mean; x: stalled or diverged)")
    axes[0][0].set_ylabel(f"final validation loss ({what}, nats)")
    axes[0][0].legend()
    return fig


def gap_figure(plt, runs, exp, steps_list):
    """The paired gap to the first config's final loss against run length, tuned (mean, min-max bars over
    seeds) and at the shared rate."""
    fig, ax, first = *plt.subplots(figsize=(6.5, 4.4)), exp["tuned"][0]
    for config in exp["tuned"][1:]:
        gaps = [paired_gaps(finals(runs, s, config), finals(runs, s, first)) for s in steps_list]
        means = [statistics.fmean(g) for g in gaps]
        ax.errorbar(steps_list, means, yerr=[[m - min(g) for m, g in zip(means, gaps)], [max(g) - m for m, g in zip(means, gaps)]],
                    marker="o", capsize=4, color=COLORS[config], label=f"{config}, each at its tuned lr")
        shared = [paired_gaps(*[sorted((r for r in runs if r["steps"] == s and r["config"] == c and r["lr"] == SHARED_LR
                                        and not arm_flags(r)), key=lambda r: r["seed"]) for c in (config, first)])
                  for s in steps_list]
        if exp.get("shared_lr") and all(shared):
            ax.plot(steps_list, [statistics.fmean(g) for g in shared], "--", marker="o", color=COLORS[config],
                    label=f"{config}, all at lr 1e-3")
    ax.axhline(0, color="grey", lw=0.5)
    for y in (2, -2):
        ax.axhline(y, color="grey", lw=0.5, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xticks(steps_list, [str(s) for s in steps_list])
    ax.minorticks_off()
    ax.set(xlabel=f"training steps ({TRAINING['batch_size']} x {TRAINING['block_size']} tokens each)",
           ylabel=f"final val loss above {first}'s, same seed (%)", title=f"the gap to {first} against run length (bars: seeds)")
    ax.legend(fontsize=8)
    return fig


def band(ax, rs, scale, color, label, style="-"):
    """A loss curve: the mean over seeds, shaded from min to max."""
    curves = [r["curve"][1:] for r in rs if r["status"] != "diverged"]  # iter 0 (loss ~ln 320) squashes the rest
    if not curves:
        return
    steps = [i * scale for i, _ in curves[0]]
    values = np.array([[loss for _, loss in c] for c in curves])
    ax.plot(steps, values.mean(0), style, color=color, label=label)
    if len(curves) > 1:
        ax.fill_between(steps, values.min(0), values.max(0), color=color, alpha=0.2, lw=0)


def curves_figure(plt, runs, exp, steps, what):
    """Validation loss per step and per second (bench.py's s/step) at the tuned rates, over seeds."""
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for config in exp["tuned"]:
        rs = finals(runs, steps, config)
        label = f"{config} (lr {rs[0]['lr']:g}, {len(rs)} seeds)"
        for ax, scale in ((by_step, 1), (by_time, rs[0]["seconds_per_step"])):
            band(ax, rs, scale, COLORS[config], label)
    by_step.set(xlabel="step", ylabel=f"validation loss ({what}, nats)", title=f"per step, {steps} steps (band: seeds)")
    by_time.set(xlabel="training seconds (steps x bench.py's s/step)", title="per second")
    by_step.legend(fontsize=8)
    return fig


def stalls_figure(plt, runs, exp):
    """What a stall looks like: every run of the tuned configs, validation loss and the token
    similarity of the last block's output over training, stalled runs in red."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5), sharex="col")
    for col, steps in enumerate(sorted({r["steps"] for r in runs if r["role"] == "final"})[:2]):
        for r in runs:
            if r["steps"] == steps and r["config"] in exp["tuned"] and r["status"] != "diverged" and r["similarity"]:
                stalled = r["status"] == "stalled"
                style = dict(color="C3" if stalled else "grey", alpha=0.9 if stalled else 0.35, lw=1.2 if stalled else 0.8)
                axes[0][col].plot(*zip(*r["curve"][1:]), **style)
                axes[1][col].plot(*zip(*r["similarity"]), **style)
        axes[0][col].set(title=f"{steps} steps: every tuning run of {', '.join(exp['tuned'])} (red: stalled)",
                         ylabel="validation loss (nats)")
        axes[1][col].set(xlabel="step", ylabel="token similarity, last block")
    return fig


def similarity_figure(plt, similarity):
    """Claim 3: token similarity per layer at init."""
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for config, s in similarity.items():
        ax.plot(range(len(s)), s, marker="o", ms=3, color=COLORS[config], label=config)
    ax.set(xlabel="layer (0: embeddings)", ylabel="mean cosine similarity between tokens",
           title="signal propagation at init")
    ax.legend()
    return fig


def gains_figure(plt, runs, steps):
    """Claim 6 and the learned gains of the tuned SAS and SAS-P (first seed)."""
    sas_p = next(r for r in finals(runs, steps, "sas_p") if "gains" in r)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for config in ("sas", "sas_p"):
        r = next(r for r in finals(runs, steps, config) if "gains" in r)
        axes[0].plot([i for i, _ in r["gains"]], [g["value_beta_over_alpha"][0] for _, g in r["gains"]], label=config)
    axes[0].set(xlabel="step", title="first-layer value: beta_V / alpha_V")
    axes[0].legend()
    end = sas_p["gains"][-1][1]
    for key in ("alpha", "beta", "gamma"):
        axes[1].plot(range(len(end[key])), end[key], marker="o", label=f"{key} (end)")
    axes[1].axhline(1.0, color="grey", lw=0.5)
    axes[1].set(xlabel="layer", title=f"sas_p (lr {sas_p['lr']:g}) shaped-attention gains (init 1)")
    axes[1].legend()
    for layer in range(0, len(end["beta_ff"]), 3):
        axes[2].plot([i for i, _ in sas_p["gains"]], [g["beta_ff"][layer] for _, g in sas_p["gains"]], label=f"layer {layer}")
    axes[2].set(xlabel="step", title="sas_p beta_FF")
    axes[2].legend()
    return fig


def regime_figure(plt, runs, exp):
    """The regime map: per cell, the paired gap of each shaped block to pre_ln at the tuned rates
    (mean, bars from min to max over seeds), with its stalls over every tuning run."""
    by_cell = regime_rows(runs, exp)
    chosen, _ = chosen_regime(runs, exp)
    fig, ax = plt.subplots(figsize=(11, 5))
    configs = [c for c in exp["tuned"] if c != "pre_ln"]
    for k, config in enumerate(configs):
        for x, (cell, at) in enumerate(by_cell.items()):
            gaps = paired_gaps(at.get(config, []), at.get("pre_ln", []))
            if not gaps or any(math.isinf(g) for g in gaps):
                continue
            mean, xk = statistics.fmean(gaps), x + (k - (len(configs) - 1) / 2) * 0.2
            ax.errorbar([xk], [mean], yerr=[[mean - min(gaps)], [max(gaps) - mean]], marker="o", capsize=4,
                        color=COLORS[config], label=config if config not in ax.get_legend_handles_labels()[1] else None)
            ax.plot([xk + 0.04] * len(gaps), gaps, ".", ms=4, color=COLORS[config], alpha=0.6)  # each seed
            tuning = tuning_runs(runs, cell, config)
            stalls = sum(r["status"] != "trained" for r in tuning)
            ax.annotate(f"{stalls}/{len(tuning)}", (xk, max(gaps)), textcoords="offset points", xytext=(0, 4),
                        ha="center", fontsize=7, color=COLORS[config])
    ax.axhline(0, color="grey", lw=0.5)
    for y in (2, -2):
        ax.axhline(y, color="grey", lw=0.5, ls=":")
    labels = [cell.label.replace(", ", "\n", 1).replace("steps, ", "steps\n") + ("\n(chosen)" if chosen and cell in chosen else "")
              for cell in by_cell]
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set(ylabel="final val loss above pre_ln's, same seed (%)",
           title="where the shaped blocks match Pre-LN: paired gap at the tuned rates (bars and dots: seeds; "
                 "n/N: stalled of all tuning runs)")
    ax.legend()
    return fig


def path_figures(plt, runs, exp, steps):
    """The paper's path: Fig. 3 (loss against fixed beta), Fig. 4 (trained V/P gains per layer),
    Fig. 25 (the MLP skip), Fig. 6 (depth), and the small ablations as paired gaps."""
    main = [r for r in runs if not arm_flags(r)]  # not the depth runs
    made = {}
    fig, ax = plt.subplots(figsize=(6.5, 4.4))  # Fig. 3
    for w_init, marker in (("identity", "o"), ("orthogonal", "s")):
        betas, groups = [], []
        for beta in (0.0, 0.2, 0.5, 1.0):
            rs = finals(main, steps, f"vp_{w_init}_{beta:g}")
            if rs:
                betas.append(beta)
                groups.append(losses(rs))
        means = [statistics.fmean(g) for g in groups]
        ax.errorbar(betas, means, yerr=[[m - min(g) for m, g in zip(means, groups)], [max(g) - m for m, g in zip(means, groups)]],
                    marker=marker, capsize=4, label=f"V, P = W_init + beta dW, W_init {w_init}")
    for config, style in (("pre_ln", "--"), ("sas", ":"), ("v_skipinit", "-.")):
        rs = finals(main, steps, config)
        ax.axhline(statistics.fmean(losses(rs)), ls=style, color=COLORS[config], label=f"{config} (tuned)")
    ax.set(xlabel="beta of V and P (fixed)", ylabel="final validation loss (nats)",
           title=f"Fig. 3 in miniature: restricting V/P updates ({steps} steps; bars: seeds)")
    ax.legend(fontsize=8)
    made["fig3_vp_beta"] = fig

    r = next((r for r in finals(main, steps, "vp_trainable") if "gains" in r), None)
    if r:  # Fig. 4
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
        for ax, key in zip(axes, ("value_beta_over_alpha", "proj_beta_over_alpha")):
            n = len(r["gains"][0][1][key])
            for layer in range(n):
                ax.plot([i for i, _ in r["gains"]], [g[key][layer] for _, g in r["gains"]],
                        color=plt.cm.viridis(layer / max(1, n - 1)), label=f"layer {layer + 1}" if layer in (0, n - 1) else None)
            ax.axhline(0, color="grey", lw=0.5)
            ax.set(xlabel="step", title=f"Fig. 4 in miniature: {key.split('_')[0]} beta/alpha (init 0.2)")
            ax.legend()
        axes[0].set_ylabel("beta / alpha")
        made["fig4_vp_gains"] = fig

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))  # Fig. 25 and the small ablations
    for config, style in (("sas", "-"), ("sas_p", "-"), ("sas_no_mlp_skip", "--"), ("sas_no_mlp_skip_leaky", ":")):
        rs = finals(main, steps, config)
        if rs:
            band(axes[0], rs, 1, COLORS[config], f"{config} (lr {rs[0]['lr']:g})", style)
    axes[0].set(xlabel="step", ylabel="validation loss (nats)", title="Fig. 25 in miniature: the MLP skip (band: seeds)")
    axes[0].legend(fontsize=8)
    labels, gaps = [], []
    for figure in ("12", "13", "23", "24", "25"):
        configs, reference = PATH_FIGURES[figure]
        for config in configs:
            g = paired_gaps(finals(main, steps, config), finals(main, steps, reference))
            if g and not any(math.isinf(x) for x in g):
                labels.append(f"Fig. {figure}: {config}\nvs {reference}")
                gaps.append(g)
    for i, g in enumerate(gaps):
        axes[1].plot([statistics.fmean(g)], [i], "o", color="C0")
        axes[1].plot([min(g), max(g)], [i, i], "-", color="C0")
    axes[1].axvline(0, color="grey", lw=0.5)
    axes[1].set_yticks(range(len(labels)), labels, fontsize=7)
    axes[1].set(xlabel="final val loss above the reference's, same seed (%)", title="each ablation, paired (line: seeds)")
    made["fig25_ablations"] = fig

    depth = [r for r in runs if r["flags"].get("mlp_ratio")]
    if depth:  # Fig. 6
        fig, ax = plt.subplots(figsize=(6.5, 4.4))
        layers = sorted({r["n_layer"] for r in depth})
        for config in exp["depth"]["configs"]:
            groups = [losses(finals(depth, steps, config, n_layer=L)) for L in layers]
            if all(groups):
                means = [statistics.fmean(g) for g in groups]
                ax.errorbar(layers, means, yerr=[[m - min(g) for m, g in zip(means, groups)],
                                                 [max(g) - m for m, g in zip(means, groups)]],
                            marker="o", capsize=4, color=COLORS[config], label=config)
        ax.set_xscale("log", base=2)
        ax.set_xticks(layers, [str(L) for L in layers])
        ax.minorticks_off()
        ax.set(xlabel="layers (MLP width 2d)", ylabel="final validation loss (nats)",
               title=f"Fig. 6 in miniature: depth ({steps} steps, width {depth[0]['n_embd']}; bars: seeds)")
        ax.legend()
        made["fig6_depth"] = fig
    return made


# ----------------------------------------------------------------------------- main

def report(name, scale, seed_list, rows, left_out, assets):
    """Time every config, then write results.json (this experiment's rows replace its old ones),
    the tables and the figures; left_out: what of the experiment is not finished yet."""
    exp = EXPERIMENTS[name]
    shape, flags, steps_list = scale_points(name, scale)
    timed = ({timed_key(c.run("pre_ln")) for c in cells(scale)} if name == "regime" else
             set() if name == "path" else {timed_key(Run(exp["objective"], "pre_ln", **shape, steps=0, lr=0, flags=flags))})
    step_s = {}
    for key in sorted(timed):
        print(f"reproduce: timing every config with bench.py (interleaved steps) at {key}", flush=True)
        step_s[key] = step_seconds(exp["objective"], key, [*exp["tuned"], *exp.get("shared_lr", {})])
    runs = result_rows(name, [row for row in rows if row[1] != "so far"], step_s, seed_list[0])
    so_far = result_rows(name, [row for row in rows if row[1] == "so far"], step_s, seed_list[0])
    path = assets / "results.json"
    with claimed(assets / "results.json.lock", wait=True):  # another process may report at once
        results = json.loads(path.read_text()) if path.exists() else {}
        if results.get("format") != 3:  # none yet, or an older round's format: start afresh
            results = dict(format=3, experiments={}, runs=[])
        device = "cuda" if torch.cuda.is_available() else "cpu"
        results["experiments"][name] = dict(
            scale=scale, shape=shape, regime=dict(flags or ()), steps=steps_list, seeds=seed_list, grid=GRID, top_k=TOP_K, training=TRAINING,
            dataset=DATASET, measured=dict(date=datetime.date.today().isoformat(), torch=torch.__version__,
                                           machine=platform.machine(), threads=torch.get_num_threads(), device=device),
            unfinished=left_out, so_far=so_far)
        results["runs"] = [r for r in results["runs"] if r["experiment"] != name] + runs
        if name == "clm":
            results["similarity_at_init"] = similarity_at_init(shape)
        made = tables(results)  # before writing: a table that cannot be made must not leave a file that cannot
        assets.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".tmp").write_text(json.dumps(results, indent=1))
        path.with_suffix(".tmp").replace(path)
        figures(name, results, assets)  # within the lock: a process reporting at once cannot leave them older
        write_report(results, assets)
    for table_experiment, title, markdown in made:
        if table_experiment == name:
            print(f"\n{markdown}")
    minutes = sum(r["steps"] * r["seconds_per_step"] for r in runs if r["seconds_per_step"]) / 60
    print(f"\nreproduce: {len(runs)} runs" + (f", {minutes:.0f} minutes of training at bench.py's speeds" if minutes else "")
          + f"; tables from {path} in {assets / 'REPORT.md'}, figures in {assets}/")
    if left_out:
        print("reproduce: left out, not finished yet: " + "; ".join(left_out))


MADE_BY = {"tuned": tuned_table, "sweep": sweep_table, "stalls": stall_table, "shared_lr": shared_lr_table,
           "path": path_table, "depth": depth_table, "regime": regime_table, "regime map": regime_map_table,
           "regime choice": chosen_regime, "regime sweeps": regime_sweeps}  # the maker of each table of tables()


def so_far_table(runs):
    """The finished runs of tuning arms (or scale points) not finished yet, as they ended."""
    lines = ["| point | config | lr | seed | final val loss | status |", "|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: (r["steps"], r["n_layer"], r["n_embd"], str(r["flags"]), r["config"], r["lr"], r["seed"])):
        point = ", ".join([cell_of(r).label if r["objective"] == "clm" else f"{r['n_layer']}x{r['n_embd']}, {r['steps']} steps",
                           *(f"{k} {v:g}" for k, v in arm_flags(r).items())])
        loss = "" if r["val_loss"] is None else f"{r['val_loss']:.4f}"
        lines.append(f"| {point} | {r['config']} | {r['lr']:g} | {r['seed']} | {loss} | {r['status']} |")
    return "\n".join(lines)


def write_report(results, assets):
    """REPORT.md beside results.json: every table made from it, and the figures beside it."""
    lines = ["# The reproduction's full tables", "",
             "Written by reproduce.py from [results.json](results.json) (every run, with its curve); do not edit.", ""]
    seen = set()
    for experiment, title, markdown in tables(results):
        unfinished = results["experiments"].get(experiment, {}).get("unfinished")
        if unfinished and experiment not in seen:
            lines += [f"*{experiment}, not finished yet:* " + "; ".join(unfinished), ""]
            if so_far := results["experiments"][experiment].get("so_far"):
                lines += [f"*{experiment}, the finished runs of what is not finished* (no verdict until its arm is done):", "",
                          so_far_table(so_far), ""]
        seen.add(experiment)
        caption = " ".join(MADE_BY[title].__doc__.split("\n\n")[0].split())  # the docstring's first paragraph
        lines += [f"## {experiment}: {title}", "", caption, "", markdown, ""]
    lines += ["## Figures", ""] + [f"![{png.stem}]({png.name})" for png in sorted(assets.glob("*.png"))]
    (assets / "REPORT.md.tmp").write_text("\n".join(lines) + "\n")
    (assets / "REPORT.md.tmp").replace(assets / "REPORT.md")


def plot_runs(folders, out):
    """Any train.py runs side by side (--plot): validation loss per step and per training second,
    and the learned gains (mean over layers) per step."""
    logs = {}
    for folder in dict.fromkeys(str(Path(f)) for f in folders):  # each once
        records = train.read_records(Path(folder) / "log.jsonl")
        if not records:
            raise SystemExit(f"reproduce: error: --plot {folder}: no log.jsonl with evaluations in it "
                             "(the --out_dir of a train.py run that has evaluated at least once)")
        logs[folder] = records
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("reproduce: error: --plot needs matplotlib (pip install matplotlib)") from None
    fig, (by_step, by_time, gains) = plt.subplots(1, 3, figsize=(17, 4.6))
    styles = dict(beta_ff="-", beta_sa="--", alpha_ff=":", alpha="-.", beta=(0, (1, 3)), gamma=(0, (5, 5)))
    for i, (folder, records) in enumerate(logs.items()):
        color, later = f"C{i % 10}", records[1:] or records  # iter 0 squashes the rest
        by_step.plot([r["iter"] for r in later], [r["val_loss"] for r in later], color=color, label=folder)
        timed = [r for r in later if "elapsed_s" in r]  # logs of older versions lack it
        by_time.plot([r["elapsed_s"] for r in timed], [r["val_loss"] for r in timed], color=color, label=folder)
        for key, style in styles.items():
            if key in records[0].get("gains", {}):
                gains.plot([r["iter"] for r in records], [statistics.fmean(r["gains"][key]) for r in records],
                           ls=style, color=color, label=f"{Path(folder).name}: {key}")
    by_step.set(xlabel="step", ylabel="validation loss (nats)", title="per step")
    by_time.set(xlabel="training seconds (the runs' own clocks)", title="per second")
    gains.set(xlabel="step", title="learned gains, mean over layers")
    by_step.legend(fontsize=8)
    if gains.lines:
        gains.legend(fontsize=7)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"reproduce: {len(logs)} runs plotted in {out}")


def register_arms(specs, imported, import_files):
    """--blocks: an entry of CONFIGS for each arm ('block[:flag=value]...', train.parse_arm), and
    the compare experiment that tunes them as the GPT comparison tunes its blocks; its name. An
    arm with the settings of a config of the reproduction is that config (the same runs). An arm
    whose block an --import file registered runs on a snapshot of the --import files, named by
    their hash: an edit, even mid-comparison, never mixes into its runs, and makes new ones."""
    defaults = {f.name: f.default for f in fields(train.TrainConfig)}
    keys, snapshots = [], ()
    for spec in (s.strip() for s in specs.split(",")):
        block, flags = train.parse_arm(spec, "reproduce.py")
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


def parse_args(argv=None):
    imported = train.import_blocks(argv, "reproduce.py")
    p = argparse.ArgumentParser(prog="reproduce.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_import_flag(p)
    p.add_argument("--blocks", help="your comparison: comma-separated arms, the first the reference, each a block "
                   "as train.py's --block takes it, optionally with switches as block:flag=value (e.g. "
                   "pre_ln,sas_p,sas:alpha_ff=0,mine); tuned and seeded as the GPT comparison, written to "
                   "out/compare/")
    p.add_argument("--plot", nargs="+", metavar="RUN_DIR", help="train nothing: draw these train.py runs' log.jsonl "
                   "side by side (loss per step and per second, gains) into --plot_out")
    p.add_argument("--plot_out", default="runs.png", help="--plot's figure (default: %(default)s)")
    p.add_argument("--experiment", choices=list(EXPERIMENTS),
                   help="clm: the GPT comparison; mlm: the encoder's; path: the paper's ablations; regime: the "
                        "factor study (warmup, shape, batch) (default: clm)")
    p.add_argument("--scale", choices=["quick", "default", "large"], default="default",
                   help="model and run lengths (default: %(default)s)")
    p.add_argument("--quick", action="store_const", dest="scale", const="quick", help="same as --scale quick")
    p.add_argument("--seeds", type=int, help="seeds of every final run (default: 3, 2 with --quick)")
    p.add_argument("--reuse_results", action="store_true",
                   help="take the runs the committed results.json files (assets/) hold instead of training them "
                        "again, when their logs are gone: how a long experiment goes on in a fresh clone")
    p.add_argument("--report", action="store_true",
                   help="train nothing: the tables and figures from the finished runs (while runs go on "
                        "elsewhere), with every config timed by bench.py")
    args = p.parse_args(argv)
    args.seeds = args.seeds or (2 if args.scale == "quick" else 3)
    if args.seeds < 1:
        p.error("--seeds must be >= 1")
    if args.blocks and args.experiment:
        p.error("--blocks is a comparison of its own, in the GPT comparison's regime: drop --experiment")
    args.experiment = register_arms(args.blocks, imported, args.imports or []) if args.blocks else args.experiment or "clm"
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.plot:
        return plot_runs(args.plot, args.plot_out)
    scale_points(args.experiment, args.scale)  # a scale the experiment lacks: a clear error now
    for kind in [] if args.report else sorted({c.tokens for c in cells(args.scale)} if args.experiment == "regime" else {"bytes"}):
        dataset, tokenizer = tokens_of(kind)[0], "bytes" if kind == "bytes" else "gpt2"
        if (prepare_data.prepared(Path("data") / dataset / "meta.json") or {}).get("tokenizer") != tokenizer:
            prepare_data.main(["--tokenizer", tokenizer, "--name", dataset])  # missing, broken, or other tokens
    seed_list = seeds(args.seeds)
    if args.reuse_results:
        print(f"reproduce: {restore_logs(sorted(Path('assets').glob('**/results.json')))} runs taken from assets/")
    try:
        if not args.report:
            experiment(args.experiment, args.scale, seed_list, train_it=True)
        # then what is on disk: with it, what another process sharing out/ trained meanwhile
        rows, left_out = experiment(args.experiment, args.scale, seed_list, train_it=False)
    except Unfinished as e:
        raise SystemExit(f"reproduce: error: nothing to report yet, {e} not finished; run without --report to train")
    except KeyboardInterrupt:
        raise SystemExit("reproduce: interrupted; run it again to resume")
    if args.experiment == "compare":  # a comparison of one's own: never over the committed assets/
        arms = EXPERIMENTS["compare"]["tuned"]
        name = "_vs_".join(arms) if len("_vs_".join(arms)) <= 120 else (  # a folder name's length is bounded
            f"{arms[0]}_vs_{len(arms) - 1}_arms_{hashlib.sha1(','.join(arms).encode()).hexdigest()[:8]}")
        assets = Path("out/compare") / f"{args.scale}_{name}"
    else:
        assets = Path("assets") if args.scale == "default" else Path("assets") / args.scale
    report(args.experiment, args.scale, seed_list, rows, left_out, assets)


if __name__ == "__main__":
    main()
