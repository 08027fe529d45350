"""
The paper's claims tested the paper's way: every block's learning rate tuned alike, at more than
one scale, per step and per second; then the figures, the README's tables and
assets/results.json, with every run in it.

    python reproduce.py                    # GPT (next-token): ~75 min on 2 CPU cores
    python reproduce.py --objective mlm    # the encoder (BERT's masked LM): ~30 min
    python reproduce.py --quick            # either, smaller, ~15 min (written to assets/quick/)
    python reproduce.py --scale large      # longer runs: a GPU, or ~4.5 hours on 2 CPU cores (assets/large/)
    python reproduce.py --report           # figures and tables from the runs finished so far

Interrupt it at any time: rerunning resumes the unfinished run and skips the finished ones.

How a block is tuned (SPEC §4: the paper tuned each model's peak learning rate on a log grid):
it trains at every rate of one grid, GRID, the same for every block, at the very length it is
compared at, since the best rate moves with run length; the grid grows by factors of 2 on a side
while the block's best rate sits at that edge. The block's final run is its best run of the
sweep. All runs share the seed, so the initial weights and the batches; only block and rate differ.

The models are deep and narrow because the paper's effects are about depth (signal propagation
through many blocks). Tokens are bytes (vocabulary 257): with GPT-2's 50K vocabulary the output
head would be most of the matmuls at these widths and hide the blocks' speed differences.
Seconds per step come from bench.py (every block in one process, steps interleaved), not from the
runs' own clocks, which ran one after another on a machine whose speed drifts.
Figures need matplotlib (pip install matplotlib); without it the tables are still written.
"""

import argparse
import datetime
import json
import math
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import bench
import prepare_data
import train
from simple_gpt import GPT, GPTConfig, token_similarity

CONFIGS = {  # a run's model: (block, norm)
    "pre_ln": ("pre_ln", "rmsnorm"),
    "parallel": ("parallel", "rmsnorm"),
    "sas": ("sas", "rmsnorm"),
    "sas_p": ("sas_p", "rmsnorm"),
    "sas_p_nonorm": ("sas_p", "none"),
    "v_skipinit": ("v_skipinit", "rmsnorm"),
    "skipless": ("skipless", "rmsnorm"),
}
GRID = (1e-3, 2e-3, 4e-3, 8e-3)  # peak learning rates, the same for every block
MAX_EXTRA = 4  # points the grid may grow by, per block and scale point
SHARED_LR = 1e-3  # the paper's GPT rate: round 1 ran every block at it
BERT = dict(objective="mlm", mask_prob=0.25, beta1=0.9, beta2=0.98, grad_clip=0.5, warmup_frac=0.75, beta_ff=0.05)
EXPERIMENTS = {
    "clm": dict(
        flags={},  # train.py's defaults: the paper's GPT recipe (SPEC §4)
        tuned=("pre_ln", "sas", "sas_p"),  # claim 4's subjects, tuned at every scale point
        # the rest at the shared rate, at a scale point: -1 the largest, 0 the smallest (the
        # failure baselines: their lag shows early, and cheaply)
        shared_lr_only=dict(parallel=-1, sas_p_nonorm=-1, v_skipinit=0, skipless=0),
        beta_ff_factors=(0.5, 2.0),  # SAS-P's initial beta_FF times its default, at its tuned rate
        scales={  # the model, and the run lengths (steps) that are the scale points
            "quick": dict(n_layer=12, n_head=2, n_embd=64, steps=(150, 300)),
            "default": dict(n_layer=12, n_head=4, n_embd=128, steps=(200, 800)),
            "large": dict(n_layer=12, n_head=4, n_embd=128, steps=(800, 3200)),
        }),
    "mlm": dict(
        flags=BERT,  # the paper's Crammed-BERT recipe as far as train.py has it (SPEC §7)
        tuned=("pre_ln", "parallel", "sas", "sas_p", "sas_p_nonorm"),  # the paper's Table 1 but V-SkipInit
        shared_lr_only={},
        beta_ff_factors=(),
        scales={
            "quick": dict(n_layer=12, n_head=2, n_embd=64, steps=(150,)),
            "default": dict(n_layer=12, n_head=2, n_embd=64, steps=(600,)),
            "large": dict(n_layer=12, n_head=4, n_embd=128, steps=(2000,)),
        }),
}
DATASET = "python_stdlib_bytes"
VOCAB = 320  # bytes, end-of-text and MLM's mask token (258), padded to a multiple of 64 as train.py does
TRAINING = dict(block_size=128, batch_size=16, eval_tokens=2**15, seed=1337)
OUT = Path("out/repro")


@dataclass(frozen=True)
class Run:
    objective: str  # clm or mlm
    config: str  # a key of CONFIGS
    n_layer: int
    n_head: int
    n_embd: int
    steps: int
    lr: float
    beta_ff: float | None = None  # None: the objective's recipe, else the model's default

    @property
    def name(self):
        return f"{self.config}_lr{self.lr:g}" + ("" if self.beta_ff is None else f"_bff{self.beta_ff:g}")

    @property
    def folder(self):
        prefix = "" if self.objective == "clm" else f"{self.objective}_"
        return OUT / f"{prefix}{self.n_layer}x{self.n_embd}_{self.steps}steps" / self.name

    def settings(self):
        """train.py's flags for this run, as a dict."""
        block, norm = CONFIGS[self.config]
        settings = dict(block=block, norm=norm, n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd,
                        max_iters=self.steps, lr=self.lr, eval_interval=self.steps // 8, log_interval=self.steps // 4,
                        dataset=DATASET, out_dir=self.folder, **TRAINING, **EXPERIMENTS[self.objective]["flags"])
        if self.beta_ff is not None:
            settings["beta_ff"] = self.beta_ff
        return settings

    def model_config(self):
        s = self.settings()
        return GPTConfig(block=s["block"], norm=s["norm"], n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd,
                         block_size=TRAINING["block_size"], vocab_size=VOCAB, beta_ff=s.get("beta_ff"),
                         causal=self.objective == "clm")


def scale_points(objective, scale):
    """(the model's shape, the run lengths compared) of an experiment at a scale."""
    spec = dict(EXPERIMENTS[objective]["scales"][scale])
    return spec, spec.pop("steps")


class Unfinished(Exception):
    """A run the report needs has not been trained (--report only reads)."""


def read_log(run):
    path = run.folder / "log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def final_loss(run, train_it):
    """The run's final validation loss (inf if it diverged), training it first if train_it."""
    if (run.folder / "diverged").exists():
        return math.inf
    records = read_log(run)
    if records and records[-1]["iter"] == run.steps:
        return records[-1]["val_loss"]
    if not train_it:
        raise Unfinished(run.folder)
    resume = ["--resume"] if (run.folder / "ckpt.pt").exists() else []
    print(f"reproduce: training {run.folder}" + (" (resuming)" if resume else ""), flush=True)
    flags = [x for k, v in run.settings().items() for x in (f"--{k}", str(v))]
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("train.py")), *flags, *resume],
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
        return math.inf
    records = read_log(run)
    if proc.returncode or not records or records[-1]["iter"] != run.steps:
        raise SystemExit(f"reproduce: {run.folder} stopped early (exit code {proc.returncode}); "
                         "run reproduce.py again to resume")
    (run.folder / "ckpt.pt").unlink()  # megabytes a run; the log holds what the report needs
    return records[-1]["val_loss"]


def sweep(objective, config, shape, steps, train_it):
    """{lr: final val loss} over GRID, grown by factors of 2 while the best rate is at an edge."""
    lrs, losses = list(GRID), {}
    while True:
        for lr in lrs:
            if lr not in losses:
                losses[lr] = final_loss(Run(objective, config, **shape, steps=steps, lr=lr), train_it)
        best = min(lrs, key=losses.get)
        if len(lrs) == len(GRID) + MAX_EXTRA or math.isinf(losses[best]):
            return losses
        if best == lrs[0]:
            lrs.insert(0, best / 2)
        elif best == lrs[-1]:
            lrs.append(best * 2)
        else:
            return losses


def experiment(objective, scale, train_it):
    """Train (if train_it) and collect every run of an experiment: each tuned config's sweep at
    every scale point, the other configs at the shared rate, and at the largest point SAS-P's
    beta_FF at its tuned rate. Returns ([(run, role, final loss)], [what is left out]): without
    train_it, what is unfinished is left out (a scale point whole, unless all its sweeps are done)."""
    exp = EXPERIMENTS[objective]
    shape, steps_list = scale_points(objective, scale)
    rows, left_out = [], []
    for steps in steps_list:
        point = []
        try:
            for config in exp["tuned"]:
                losses = sweep(objective, config, shape, steps, train_it)
                best = min(losses, key=losses.get)
                point += [(Run(objective, config, **shape, steps=steps, lr=lr), "final" if lr == best else "sweep", loss)
                          for lr, loss in sorted(losses.items())]
            rows += point
        except Unfinished as e:
            left_out.append(f"the {steps}-step sweeps (from {e})")
    longest = steps_list[-1]
    others = [(Run(objective, config, **shape, steps=steps_list[point], lr=SHARED_LR), "shared_lr")
              for config, point in exp["shared_lr_only"].items()]
    sas_p = next((run for run, role, _ in rows if run.config == "sas_p" and run.steps == longest and role == "final"), None)
    if sas_p and exp["beta_ff_factors"]:  # (while its sweep is unfinished, SAS-P's rate is unknown)
        others += [(Run(objective, "sas_p", **shape, steps=longest, lr=sas_p.lr,
                        beta_ff=round(factor * sas_p.model_config().beta_ff_init, 4)), "beta_ff")
                   for factor in exp["beta_ff_factors"]]
    for run, role in others:
        try:
            rows.append((run, role, final_loss(run, train_it)))
        except Unfinished:
            left_out.append(str(run.folder))
    if not any(role == "final" for _, role, _ in rows):
        raise Unfinished(left_out[0])
    return rows, left_out


# ----------------------------------------------------------------------------- measurements

def step_seconds(objective, shape, configs):
    """Seconds per training step of each config at this shape, from bench.py."""
    args = bench.parse_args(["--blocks", "pre_ln", "--vocab_size", str(VOCAB), "--steps", "20",
                             "--n_layer", str(shape["n_layer"]), "--n_head", str(shape["n_head"]),
                             "--n_embd", str(shape["n_embd"]), "--seq_len", str(TRAINING["block_size"]),
                             "--batch_size", str(TRAINING["batch_size"]), "--objective", objective])
    rows = bench.run(args, runs={config: CONFIGS[config] for config in configs})
    return {r["block"]: TRAINING["batch_size"] * TRAINING["block_size"] / r["tokens_per_s"] for r in rows}


def similarity_at_init(shape):
    """Claim 3: token similarity after each layer at init, on validation text (causal models)."""
    val = np.memmap(Path("data") / DATASET / "val.bin", dtype=np.uint16, mode="r")
    T = TRAINING["block_size"]
    idx = torch.from_numpy(np.stack([val[i * T:(i + 1) * T] for i in range(8)]).astype(np.int64))
    sims = {}
    for config in CONFIGS:
        torch.manual_seed(TRAINING["seed"])
        model = GPT(Run("clm", config, **shape, steps=0, lr=0).model_config())
        sims[config] = [round(s, 4) for s in token_similarity(model, idx)]
    return sims


def step_to_reach(curve, target):
    """The step at which val loss first reaches target, linear between evals; None if never."""
    for (i0, l0), (i1, l1) in zip(curve, curve[1:]):
        if l1 <= target:
            return i0 + ((l0 - target) / (l0 - l1) if l0 > target else 0.0) * (i1 - i0)
    return None


def result_rows(objective, rows, step_s):
    """One JSON-ready dict per run: what it was and how it ended, with its validation curve."""
    out = []
    for run, role, loss in rows:
        cfg = run.model_config()
        curve = [[r["iter"], round(r["val_loss"], 5)] for r in read_log(run)]
        out.append(dict(
            name=run.name, objective=objective, role=role, config=run.config, block=cfg.block, norm=cfg.norm,
            n_layer=run.n_layer, n_embd=run.n_embd, n_head=run.n_head, steps=run.steps,
            batch_size=TRAINING["batch_size"], block_size=TRAINING["block_size"], lr=run.lr,
            beta_ff=cfg.beta_ff_init if cfg.block in ("sas", "sas_p", "v_skipinit") else None,
            params=GPT(cfg).num_params(), val_loss=None if math.isinf(loss) else loss, diverged=math.isinf(loss),
            seconds_per_step=round(step_s[run.config], 5), curve=curve, log=str(run.folder / "log.jsonl")))
    pre_ln = {r["steps"]: r["val_loss"] for r in out if r["config"] == "pre_ln" and r["role"] == "final"}
    for r in out:  # the equal-time view: how long until pre_ln's tuned final loss
        reach = None if r["diverged"] or r["steps"] not in pre_ln else step_to_reach(r["curve"], pre_ln[r["steps"]])
        r["seconds_to_pre_ln_loss"] = None if reach is None else round(reach * r["seconds_per_step"], 1)
    return out


# ----------------------------------------------------------------------------- tables

def pick(runs, steps, config, tuned=True):
    """The run of config at steps: its tuned final run, or (tuned=False) the one at SHARED_LR."""
    return next(r for r in runs if r["steps"] == steps and r["config"] == config and (
        r["role"] == "final" if tuned else r["lr"] == SHARED_LR and r["role"] != "beta_ff"))


def gap(loss, base):
    return f"{100 * (loss / base - 1):+.1f}%"


def loss_text(r):
    return "diverged" if r["diverged"] else f"{r['val_loss']:.4f}"


def tuned_table(runs, exp):
    """Each tuned config at its own best rate, at every scale point, and at the shared rate."""
    lines = ["| steps | config | best lr | final val loss | vs pre_ln | at lr 1e-3 | vs pre_ln at 1e-3 "
             "| s/step | speed vs pre_ln | s to reach pre_ln's final loss |", "|---|---|---|---|---|---|---|---|---|---|"]
    for steps in sorted({r["steps"] for r in runs if r["role"] == "final"}):
        base, base_shared = pick(runs, steps, "pre_ln"), pick(runs, steps, "pre_ln", tuned=False)
        for config in exp["tuned"]:
            r, shared = pick(runs, steps, config), pick(runs, steps, config, tuned=False)
            reach = r["seconds_to_pre_ln_loss"]
            lines.append(f"| {steps} | {config} | {r['lr']:g} | {r['val_loss']:.4f} | {gap(r['val_loss'], base['val_loss'])} "
                         f"| {loss_text(shared)} | {'' if shared['diverged'] else gap(shared['val_loss'], base_shared['val_loss'])} "
                         f"| {r['seconds_per_step']:.3f} | {base['seconds_per_step'] / r['seconds_per_step']:.3f} "
                         f"| {'never' if reach is None else f'{reach:.0f}'} |")
    return "\n".join(lines)


def sweep_table(runs, exp):
    """Final val loss of every sweep run (bold: the config's best): the tuning curves as numbers."""
    runs = [r for r in runs if r["role"] in ("sweep", "final")]
    lrs = sorted({r["lr"] for r in runs})
    lines = ["| steps | config | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |", "|---|---|" + "---|" * len(lrs)]
    for steps in sorted({r["steps"] for r in runs}):
        for config in exp["tuned"]:
            cells = {r["lr"]: r for r in runs if r["steps"] == steps and r["config"] == config}
            row = ["" if lr not in cells else f"**{loss_text(cells[lr])}**" if cells[lr]["role"] == "final"
                   else loss_text(cells[lr]) for lr in lrs]
            lines.append(f"| {steps} | {config} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def shared_lr_table(runs, exp):
    """Every config at lr 1e-3, round 1's comparison, at each scale point it ran at."""
    lines = ["| steps | config (all at lr 1e-3) | params | final val loss | vs pre_ln | s/step | speed vs pre_ln |",
             "|---|---|---|---|---|---|---|"]
    for steps in sorted({r["steps"] for r in runs if r["role"] == "final"}):
        rows = sorted((r for r in runs if r["steps"] == steps and r["lr"] == SHARED_LR and r["role"] != "beta_ff"),
                      key=lambda r: list(CONFIGS).index(r["config"]))
        base = pick(runs, steps, "pre_ln", tuned=False)
        for r in rows:
            lines.append(f"| {steps} | {r['config']} | {r['params'] / 1e6:.3f}M | {loss_text(r)} "
                         f"| {'' if r['diverged'] else gap(r['val_loss'], base['val_loss'])} | {r['seconds_per_step']:.3f} "
                         f"| {base['seconds_per_step'] / r['seconds_per_step']:.3f} |")
    return "\n".join(lines)


def beta_ff_table(runs, exp):
    """SAS-P's initial beta_FF around its default, at SAS-P's tuned rate (the rate is not re-tuned)."""
    steps = max(r["steps"] for r in runs)
    final = pick(runs, steps, "sas_p")
    rows = sorted([final] + [r for r in runs if r["steps"] == steps and r["role"] == "beta_ff"], key=lambda r: r["beta_ff"])
    base = pick(runs, steps, "pre_ln")
    lines = [f"| sas_p initial beta_FF ({steps} steps, lr {final['lr']:g}) | final val loss | vs tuned pre_ln |",
             "|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['beta_ff']:.3g}{' (default)' if r is final else ''} | {loss_text(r)} "
                     f"| {'' if r['diverged'] else gap(r['val_loss'], base['val_loss'])} |")
    return "\n".join(lines)


def tables(results):
    """The README's tables, made from results.json alone: [(objective, title, markdown)]."""
    out = []
    for objective, exp in EXPERIMENTS.items():
        runs = [r for r in results["runs"] if r["objective"] == objective]
        if not runs:
            continue
        out += [(objective, "tuned", tuned_table(runs, exp)), (objective, "sweep", sweep_table(runs, exp))]
        if exp["shared_lr_only"]:
            out.append((objective, "shared_lr", shared_lr_table(runs, exp)))
        if any(r["role"] == "beta_ff" for r in runs):
            out.append((objective, "beta_ff", beta_ff_table(runs, exp)))
    return out


# ----------------------------------------------------------------------------- figures

COLORS = {config: f"C{i}" for i, config in enumerate(CONFIGS)}


def figures(objective, results, assets, logs):
    """The README's figures for an experiment, from results.json (and the gains from the logs)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("reproduce: matplotlib is not installed (pip install matplotlib); no figures")
        return
    exp = EXPERIMENTS[objective]
    runs = [r for r in results["runs"] if r["objective"] == objective]
    steps_list = sorted({r["steps"] for r in runs if r["role"] == "final"})
    prefix = "" if objective == "clm" else f"{objective}_"
    what = "next-token" if objective == "clm" else "masked-token"
    made = {"lr_sweep": lr_sweep_figure(plt, runs, exp, steps_list, what),
            "val_loss": curves_figure(plt, runs, steps_list[-1], what)}
    if len(steps_list) > 1:
        made["gap_vs_scale"] = gap_figure(plt, runs, exp, steps_list)
    if objective == "clm":
        made["rank_collapse"] = similarity_figure(plt, results["similarity_at_init"])
        made["gains"] = gains_figure(plt, runs, steps_list[-1], logs)
    for name, fig in made.items():
        fig.tight_layout()
        fig.savefig(assets / f"{prefix}{name}.png", dpi=110)
        plt.close(fig)


def lr_sweep_figure(plt, runs, exp, steps_list, what):
    """The paper's tuning curves: final loss against peak learning rate, one panel per length."""
    fig, axes = plt.subplots(1, len(steps_list), figsize=(5.5 * len(steps_list) + 0.5, 4.2), sharey=True, squeeze=False)
    for ax, steps in zip(axes[0], steps_list):
        top = max(r["val_loss"] for r in runs if r["steps"] == steps and r["val_loss"] is not None)
        for config in exp["tuned"]:
            rs = sorted((r for r in runs if r["steps"] == steps and r["config"] == config
                         and r["role"] in ("sweep", "final")), key=lambda r: r["lr"])
            ok = [r for r in rs if not r["diverged"]]
            ax.plot([r["lr"] for r in ok], [r["val_loss"] for r in ok], marker="o", color=COLORS[config], label=config)
            best = pick(runs, steps, config)
            ax.plot([best["lr"]], [best["val_loss"]], marker="*", ms=15, color=COLORS[config])
            for r in rs:
                if r["diverged"]:
                    ax.plot([r["lr"]], [top], marker="x", ms=9, color=COLORS[config])
        ax.set_xscale("log", base=2)
        lrs = sorted({r["lr"] for r in runs if r["steps"] == steps and r["role"] in ("sweep", "final")})
        ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs])
        ax.minorticks_off()
        ax.set(xlabel="peak learning rate", title=f"{steps} steps (star: best; x: diverged)")
    axes[0][0].set_ylabel(f"final validation loss ({what}, nats)")
    axes[0][0].legend()
    return fig


def gap_figure(plt, runs, exp, steps_list):
    """The gap to pre_ln's final loss against run length, tuned and at the shared rate."""
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for config in exp["tuned"][1:]:
        for tuned, style in ((True, "-"), (False, "--")):
            gaps = [100 * (pick(runs, s, config, tuned)["val_loss"] / pick(runs, s, "pre_ln", tuned)["val_loss"] - 1)
                    for s in steps_list]
            label = f"{config}, {'each at its tuned lr' if tuned else 'all at lr 1e-3'}"
            ax.plot(steps_list, gaps, style, marker="o", color=COLORS[config], label=label)
    ax.axhline(0, color="grey", lw=0.5)
    ax.axhline(2, color="grey", lw=0.5, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xticks(steps_list, [str(s) for s in steps_list])
    ax.minorticks_off()
    ax.set(xlabel=f"training steps ({TRAINING['batch_size']} x {TRAINING['block_size']} tokens each)",
           ylabel="final val loss above pre_ln's (%)", title="the gap to pre_ln against run length")
    ax.legend()
    return fig


def curves_figure(plt, runs, steps, what):
    """Validation loss per step and per second (bench.py's s/step) of the final and shared-rate runs."""
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for r in runs:
        if r["steps"] == steps and r["role"] in ("final", "shared_lr") and not r["diverged"]:
            curve = r["curve"][1:]  # iter 0 (loss ~ln 320) squashes the interesting part
            style = "-" if r["role"] == "final" else ":"
            label = f"{r['config']} (lr {r['lr']:g}{', tuned' if r['role'] == 'final' else ''})"
            for ax, scale in ((by_step, 1), (by_time, r["seconds_per_step"])):
                ax.plot([i * scale for i, _ in curve], [loss for _, loss in curve], style, color=COLORS[r["config"]],
                        label=label)
    by_step.set(xlabel="step", ylabel=f"validation loss ({what}, nats)", title=f"per step, {steps} steps")
    by_time.set(xlabel="training seconds (steps x bench.py's s/step, 2 CPU cores)", title="per second")
    by_step.legend(fontsize=8)
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


def gains_figure(plt, runs, steps, logs):
    """Claim 6 and the learned gains: first-layer value, shaped-attention gains, beta_FF."""
    sas_p = pick(runs, steps, "sas_p")
    recs = logs[sas_p["log"]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for r in runs:
        if r["steps"] == steps and r["role"] in ("final", "shared_lr") and r["config"] in ("sas", "sas_p", "sas_p_nonorm"):
            rr = logs[r["log"]]
            axes[0].plot([x["iter"] for x in rr], [x["gains"]["value_beta_over_alpha"][0] for x in rr], label=r["config"])
    axes[0].set(xlabel="step", title="first-layer value: beta_V / alpha_V")
    axes[0].legend()
    for key in ("alpha", "beta", "gamma"):
        axes[1].plot(range(len(recs[-1]["gains"][key])), recs[-1]["gains"][key], marker="o", label=f"{key} (end)")
    axes[1].axhline(1.0, color="grey", lw=0.5)
    axes[1].set(xlabel="layer", title=f"sas_p (lr {sas_p['lr']:g}) shaped-attention gains (init 1)")
    axes[1].legend()
    for layer in range(0, len(recs[-1]["gains"]["beta_ff"]), 3):
        axes[2].plot([x["iter"] for x in recs], [x["gains"]["beta_ff"][layer] for x in recs], label=f"layer {layer}")
    axes[2].set(xlabel="step", title="sas_p beta_FF")
    axes[2].legend()
    return fig


# ----------------------------------------------------------------------------- main

def report(objective, scale, rows, left_out, assets):
    """Time every config, then write results.json (this experiment's rows replace its old ones),
    the tables and the figures; left_out: what of the experiment is not finished yet."""
    exp = EXPERIMENTS[objective]
    shape, steps_list = scale_points(objective, scale)
    print("reproduce: timing every config with bench.py (interleaved steps)", flush=True)
    runs = result_rows(objective, rows, step_seconds(objective, shape, [*exp["tuned"], *exp["shared_lr_only"]]))
    path = assets / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    if "experiments" not in results:  # none yet, or round 1's format: start afresh
        results = dict(experiments={}, runs=[])
    results["experiments"][objective] = dict(
        scale=scale, shape=shape, steps=steps_list, grid=GRID, training=TRAINING,
        flags=exp["flags"], dataset=DATASET, measured=dict(
            date=datetime.date.today().isoformat(), torch=torch.__version__, machine=platform.machine(),
            threads=torch.get_num_threads(), device="cpu"),
        unfinished=left_out)
    results["runs"] = [r for r in results["runs"] if r["objective"] != objective] + runs
    if objective == "clm":
        results["similarity_at_init"] = similarity_at_init(shape)
    assets.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    for table_objective, title, markdown in tables(results):
        if table_objective == objective:
            print(f"\n{markdown}")
    figures(objective, results, assets, {str(run.folder / "log.jsonl"): read_log(run) for run, _, _ in rows})
    minutes = sum(r["steps"] * r["seconds_per_step"] for r in runs) / 60
    print(f"\nreproduce: {len(runs)} runs, {minutes:.0f} minutes of training at bench.py's speeds; "
          f"tables and figures from {path}, figures in {assets}/")
    if left_out:
        print("reproduce: left out, not finished yet: " + "; ".join(left_out))


def main(argv=None):
    p = argparse.ArgumentParser(prog="reproduce.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--objective", choices=list(EXPERIMENTS), default="clm",
                   help="clm: the GPT comparison; mlm: the encoder's (default: %(default)s)")
    p.add_argument("--scale", choices=["quick", "default", "large"], default="default",
                   help="model and run lengths (default: %(default)s)")
    p.add_argument("--quick", action="store_const", dest="scale", const="quick", help="same as --scale quick")
    p.add_argument("--report", action="store_true",
                   help="only make the figures and tables, from the finished runs (while runs go on elsewhere)")
    args = p.parse_args(argv)
    if not args.report and not (Path("data") / DATASET / "meta.json").exists():
        prepare_data.main(["--tokenizer", "bytes", "--name", DATASET])
    try:
        rows, left_out = experiment(args.objective, args.scale, train_it=not args.report)
    except Unfinished as e:
        raise SystemExit(f"reproduce: error: nothing to report yet, {e} not finished; run without --report to train")
    except KeyboardInterrupt:
        raise SystemExit("reproduce: interrupted; run it again to resume")
    report(args.objective, args.scale, rows, left_out, Path("assets") if args.scale == "default" else Path("assets") / args.scale)


if __name__ == "__main__":
    main()
