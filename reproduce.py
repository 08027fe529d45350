"""
The paper's central claim tested the paper's way: every block's learning rate tuned alike, at
more than one scale, per step and per second. Then the figures, the tables of the README's
"Reproduction" section and assets/results.json, every run in it.

    python reproduce.py                  # ~75 min on 2 CPU cores: 12 x 128, tuned at 200 and 800 steps
    python reproduce.py --quick          # ~15 min: the same outputs for a 12 x 64 model (assets/quick/)
    python reproduce.py --scale large    # 800 and 3,200 steps: a GPU, or a free afternoon (assets/large/)
    python reproduce.py --report         # figures and tables from finished runs only

Interrupt it at any time: rerunning resumes the unfinished run and skips finished ones.

How a block is tuned (SPEC §4: the paper tuned each model's peak learning rate on a log grid):
every block trains at every rate of the same grid, GRID, at the very length it is compared at,
since the best rate moves with run length; the grid grows by factors of 2 on a side while a
block's best rate sits at that edge. The block's final run is its best run of the sweep. Every
run has the same seed, so the same initial weights and batches; only block and rate differ.

The model is deep and narrow because the paper's effects are about depth (signal propagation
through many blocks). Tokens are bytes (vocabulary 257): with GPT-2's 50K vocabulary the output
head would be most of the matmuls at this width and hide the blocks' speed differences. Seconds
per step come from bench.py (all blocks in one process, steps interleaved), not the runs' own
clocks, which ran one after another on a machine whose speed drifts.
Figures need matplotlib (pip install matplotlib); without it the tables are still written.
"""

import argparse
import datetime
import json
import math
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass
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
TUNED = ("pre_ln", "sas", "sas_p")  # claim 4's subjects: tuned at every scale point
SHARED_LR = 1e-3  # the paper's rate; every other config runs at it, at the largest scale point
GRID = (1e-3, 2e-3, 4e-3, 8e-3)  # peak learning rates, the same for every block
MAX_EXTRA = 4  # points the grid may grow by, per block and scale point
BETA_FF_FACTORS = (0.5, 2.0)  # SAS-P's initial beta_FF, times the default 0.1 * sqrt(18 / L)
SCALES = {  # the model, and the run lengths (steps) that are the scale points
    "quick": dict(n_layer=12, n_head=2, n_embd=64, steps=(150, 300)),
    "default": dict(n_layer=12, n_head=4, n_embd=128, steps=(200, 800)),
    "large": dict(n_layer=12, n_head=4, n_embd=128, steps=(800, 3200)),
}
DATASET = "python_stdlib_bytes"
VOCAB = 320  # bytes and end-of-text (257), padded to a multiple of 64 as train.py does
TRAINING = dict(block_size=128, batch_size=16, eval_tokens=2**15, seed=1337)
OUT = Path("out/repro")


@dataclass(frozen=True)
class Run:
    config: str  # a key of CONFIGS
    n_layer: int
    n_head: int
    n_embd: int
    steps: int
    lr: float
    beta_ff: float | None = None  # None: the model's default

    @property
    def name(self):
        return f"{self.config}_lr{self.lr:g}" + ("" if self.beta_ff is None else f"_bff{self.beta_ff:g}")

    @property
    def folder(self):
        return OUT / f"{self.n_layer}x{self.n_embd}_{self.steps}steps" / self.name

    def flags(self):
        block, norm = CONFIGS[self.config]
        settings = dict(block=block, norm=norm, n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd,
                        max_iters=self.steps, lr=self.lr, eval_interval=self.steps // 8,
                        log_interval=self.steps // 4, dataset=DATASET, out_dir=self.folder, **TRAINING)
        if self.beta_ff is not None:
            settings["beta_ff"] = self.beta_ff
        return [x for k, v in settings.items() for x in (f"--{k}", str(v))]

    def model_config(self):
        block, norm = CONFIGS[self.config]
        return GPTConfig(block=block, norm=norm, n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd,
                         block_size=TRAINING["block_size"], vocab_size=VOCAB, beta_ff=self.beta_ff)


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
        raise Unfinished(run.name)
    resume = ["--resume"] if (run.folder / "ckpt.pt").exists() else []
    print(f"reproduce: training {run.folder}" + (" (resuming)" if resume else ""), flush=True)
    proc = subprocess.Popen([sys.executable, "train.py", *run.flags(), *resume],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    diverged = False
    try:
        for line in proc.stdout:
            print("  " + line, end="", flush=True)
            diverged |= train.DIVERGED in line
    except KeyboardInterrupt:
        proc.wait()  # train.py finishes its step and saves a checkpoint
        raise SystemExit("reproduce: interrupted; run it again to resume")
    proc.wait()
    if diverged:  # a too-high rate is a result of the sweep, not an error
        (run.folder / "diverged").write_text(json.dumps(dict(lr=run.lr)))
        return math.inf
    records = read_log(run)
    if proc.returncode or not records or records[-1]["iter"] != run.steps:
        raise SystemExit(f"reproduce: {run.folder} stopped early (exit code {proc.returncode}); "
                         "run reproduce.py again to resume")
    (run.folder / "ckpt.pt").unlink()  # 24 MB a run; the log holds what the report needs
    return records[-1]["val_loss"]


def sweep(config, shape, steps, train_it):
    """{lr: final val loss} over GRID, grown by factors of 2 while the best rate is at an edge."""
    lrs, losses = list(GRID), {}
    while True:
        for lr in lrs:
            if lr not in losses:
                losses[lr] = final_loss(Run(config, **shape, steps=steps, lr=lr), train_it)
        best = min(lrs, key=losses.get)
        if len(lrs) == len(GRID) + MAX_EXTRA or math.isinf(losses[best]):
            return losses
        if best == lrs[0]:
            lrs.insert(0, best / 2)
        elif best == lrs[-1]:
            lrs.append(best * 2)
        else:
            return losses


def experiment(scale, train_it):
    """Train (if train_it) and collect every run of a scale: each TUNED block's sweep at every
    scale point; the other configs at the shared rate and SAS-P's beta_FF at its tuned rate, both at
    the largest point. Returns [(run, role, final loss)]."""
    spec = dict(SCALES[scale])
    steps_list = spec.pop("steps")
    rows = []
    for steps in steps_list:
        for config in TUNED:
            losses = sweep(config, spec, steps, train_it)
            best = min(losses, key=losses.get)
            rows += [(Run(config, **spec, steps=steps, lr=lr), "final" if lr == best else "sweep", loss)
                     for lr, loss in sorted(losses.items())]
    longest = steps_list[-1]
    for config in CONFIGS:
        if config not in TUNED:
            run = Run(config, **spec, steps=longest, lr=SHARED_LR)
            rows.append((run, "shared_lr", final_loss(run, train_it)))
    sas_p = next(run for run, role, _ in rows if run.config == "sas_p" and run.steps == longest and role == "final")
    default_beta = sas_p.model_config().beta_ff_init
    for factor in BETA_FF_FACTORS:
        run = Run("sas_p", **spec, steps=longest, lr=sas_p.lr, beta_ff=round(factor * default_beta, 4))
        rows.append((run, "beta_ff", final_loss(run, train_it)))
    return rows


# ----------------------------------------------------------------------------- measurements

def step_seconds(shape):
    """Seconds per training step of every config at this shape, from bench.py."""
    args = bench.parse_args(["--blocks", "pre_ln", "--vocab_size", str(VOCAB), "--steps", "10",
                             "--n_layer", str(shape["n_layer"]), "--n_head", str(shape["n_head"]),
                             "--n_embd", str(shape["n_embd"]), "--seq_len", str(TRAINING["block_size"]),
                             "--batch_size", str(TRAINING["batch_size"])])
    rows = bench.run(args, runs=CONFIGS)
    return {r["block"]: TRAINING["batch_size"] * TRAINING["block_size"] / r["tokens_per_s"] for r in rows}


def similarity_at_init(shape):
    """Claim 3: token similarity after each layer at init, on validation text."""
    val = np.memmap(Path("data") / DATASET / "val.bin", dtype=np.uint16, mode="r")
    T = TRAINING["block_size"]
    idx = torch.from_numpy(np.stack([val[i * T:(i + 1) * T] for i in range(8)]).astype(np.int64))
    sims = {}
    for config in CONFIGS:
        torch.manual_seed(TRAINING["seed"])
        run = Run(config, **shape, steps=0, lr=0)
        sims[config] = [round(s, 4) for s in token_similarity(GPT(run.model_config()), idx)]
    return sims


def step_to_reach(records, target):
    """The step at which val loss first reaches target, linear between evals; None if never."""
    for a, b in zip(records, records[1:]):
        if b["val_loss"] <= target:
            frac = (a["val_loss"] - target) / (a["val_loss"] - b["val_loss"]) if a["val_loss"] > target else 0.0
            return a["iter"] + frac * (b["iter"] - a["iter"])
    return None


def result_rows(rows, step_s):
    """One JSON-ready dict per run: what it was and how it ended."""
    out = []
    for run, role, loss in rows:
        cfg = run.model_config()
        out.append(dict(
            name=run.name, objective="clm", role=role, block=cfg.block, norm=cfg.norm, config=run.config,
            n_layer=run.n_layer, n_embd=run.n_embd, n_head=run.n_head, steps=run.steps,
            batch_size=TRAINING["batch_size"], block_size=TRAINING["block_size"], lr=run.lr,
            beta_ff=cfg.beta_ff_init if cfg.block in ("sas", "sas_p", "v_skipinit") else None,
            params=GPT(cfg).num_params(), val_loss=None if math.isinf(loss) else loss, diverged=math.isinf(loss),
            seconds_per_step=step_s[run.config], log=str(run.folder / "log.jsonl")))
    return out


# ----------------------------------------------------------------------------- tables

def at_shared_lr(r):
    """Is this the config at the paper's shared rate (SAS-P's beta_FF runs aside)?"""
    return r["lr"] == SHARED_LR and r["role"] != "beta_ff"


def gap(loss, base):
    return f"{100 * (loss / base - 1):+.1f}%"


def tuned_table(results):
    """Each TUNED block at its own best rate, at every scale point."""
    runs = results["runs"]
    lines = ["| steps | block | best lr | final val loss | vs pre_ln | at lr 1e-3 | vs pre_ln at 1e-3 "
             "| s/step | speed vs pre_ln | s to reach pre_ln's final loss |", "|---|---|---|---|---|---|---|---|---|---|"]
    for steps in sorted({r["steps"] for r in runs if r["role"] == "final"}):
        final = {r["config"]: r for r in runs if r["role"] == "final" and r["steps"] == steps}
        shared = {r["config"]: r for r in runs if r["steps"] == steps and at_shared_lr(r)}
        base, base_shared = final["pre_ln"], shared["pre_ln"]
        for config in TUNED:
            r = final[config]
            reach = r["seconds_to_pre_ln_loss"]
            lines.append(f"| {steps} | {config} | {r['lr']:g} | {r['val_loss']:.4f} | {gap(r['val_loss'], base['val_loss'])} "
                         f"| {shared[config]['val_loss']:.4f} | {gap(shared[config]['val_loss'], base_shared['val_loss'])} "
                         f"| {r['seconds_per_step']:.3f} | {base['seconds_per_step'] / r['seconds_per_step']:.3f} "
                         f"| {'never' if reach is None else f'{reach:.0f}'} |")
    return "\n".join(lines)


def sweep_table(results):
    """Final val loss of every sweep run: the paper's tuning curves, as numbers."""
    runs = [r for r in results["runs"] if r["role"] in ("sweep", "final")]
    lrs = sorted({r["lr"] for r in runs})
    lines = ["| steps | block | " + " | ".join(f"{lr:g}" for lr in lrs) + " |", "|---|---|" + "---|" * len(lrs)]
    for steps in sorted({r["steps"] for r in runs}):
        for config in TUNED:
            cells = {r["lr"]: r for r in runs if r["steps"] == steps and r["config"] == config}
            row = []
            for lr in lrs:
                r = cells.get(lr)
                text = "" if r is None else "diverged" if r["diverged"] else f"{r['val_loss']:.4f}"
                row.append(f"**{text}**" if r is not None and r["role"] == "final" else text)
            lines.append(f"| {steps} | {config} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def shared_lr_table(results):
    """Every config at lr 1e-3 at the largest scale point: round 1's comparison."""
    steps = max(r["steps"] for r in results["runs"])
    rows = [r for r in results["runs"] if r["steps"] == steps and at_shared_lr(r)]
    rows.sort(key=lambda r: list(CONFIGS).index(r["config"]))
    base = next(r for r in rows if r["config"] == "pre_ln")
    lines = [f"| config ({steps} steps, lr 1e-3) | params | final val loss | vs pre_ln | s/step | speed vs pre_ln |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        loss = "diverged" if r["diverged"] else f"{r['val_loss']:.4f}"
        vs = "" if r["diverged"] else gap(r["val_loss"], base["val_loss"])
        lines.append(f"| {r['config']} | {r['params'] / 1e6:.3f}M | {loss} | {vs} | {r['seconds_per_step']:.3f} "
                     f"| {base['seconds_per_step'] / r['seconds_per_step']:.3f} |")
    return "\n".join(lines)


def beta_ff_table(results):
    steps = max(r["steps"] for r in results["runs"])
    rows = [r for r in results["runs"] if r["steps"] == steps and r["config"] == "sas_p"
            and (r["role"] in ("beta_ff", "final"))]
    rows.sort(key=lambda r: r["beta_ff"])
    base = next(r for r in results["runs"] if r["steps"] == steps and r["config"] == "pre_ln" and r["role"] == "final")
    lines = [f"| sas_p initial beta_FF ({steps} steps, lr {rows[0]['lr']:g}) | final val loss | vs tuned pre_ln |",
             "|---|---|---|"]
    for r in rows:
        loss = "diverged" if r["diverged"] else f"{r['val_loss']:.4f}"
        mark = " (default)" if r["role"] == "final" else ""
        lines.append(f"| {r['beta_ff']:g}{mark} | {loss} | {'' if r['diverged'] else gap(r['val_loss'], base['val_loss'])} |")
    return "\n".join(lines)


def tables(results):
    """The README's tables, made from results.json alone."""
    return [tuned_table(results), sweep_table(results), shared_lr_table(results), beta_ff_table(results)]


# ----------------------------------------------------------------------------- figures

def figures(results, logs, sims, assets):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("reproduce: matplotlib is not installed (pip install matplotlib); no figures")
        return
    runs = results["runs"]
    steps_list = sorted({r["steps"] for r in runs if r["role"] == "final"})
    colors = {config: f"C{i}" for i, config in enumerate(CONFIGS)}

    fig, axes = plt.subplots(1, len(steps_list), figsize=(5.5 * len(steps_list), 4.2), sharey=True, squeeze=False)
    for ax, steps in zip(axes[0], steps_list):
        top = max(r["val_loss"] for r in runs if r["steps"] == steps and r["val_loss"] is not None)
        for config in TUNED:
            rs = sorted((r for r in runs if r["steps"] == steps and r["config"] == config
                         and r["role"] in ("sweep", "final")), key=lambda r: r["lr"])
            ok = [r for r in rs if not r["diverged"]]
            ax.plot([r["lr"] for r in ok], [r["val_loss"] for r in ok], marker="o", color=colors[config], label=config)
            best = next(r for r in rs if r["role"] == "final")
            ax.plot([best["lr"]], [best["val_loss"]], marker="*", ms=14, color=colors[config])
            for r in rs:
                if r["diverged"]:
                    ax.plot([r["lr"]], [top], marker="x", ms=9, color=colors[config])
        ax.set_xscale("log", base=2)
        ax.set(xlabel="peak learning rate", title=f"{steps} steps (star: best; x: diverged)")
    axes[0][0].set_ylabel("final validation loss (nats per byte)")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(assets / "lr_sweep.png", dpi=110)

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for config in TUNED[1:]:
        for role, style in (("final", "-"), ("shared", "--")):
            gaps = []
            for steps in steps_list:
                pick = lambda c: next(r for r in runs if r["steps"] == steps and r["config"] == c and (
                    r["role"] == "final" if role == "final" else at_shared_lr(r)))
                gaps.append(100 * (pick(config)["val_loss"] / pick("pre_ln")["val_loss"] - 1))
            label = f"{config}, {'each tuned' if role == 'final' else 'all at lr 1e-3'}"
            ax.plot(steps_list, gaps, style, marker="o", color=colors[config], label=label)
    ax.axhline(0, color="grey", lw=0.5)
    ax.axhline(2, color="grey", lw=0.5, ls=":")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="training steps (16 x 128 tokens each)", ylabel="final val loss above pre_ln (%)",
           title="the gap to pre_ln against run length")
    ax.legend()
    fig.tight_layout()
    fig.savefig(assets / "gap_vs_scale.png", dpi=110)

    longest = steps_list[-1]
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for r in runs:
        if r["steps"] == longest and (r["role"] == "final" or r["role"] == "shared_lr"):
            recs = logs[r["log"]][1:]  # iter 0 (loss ~ln 320) squashes the interesting part
            style = "-" if r["role"] == "final" else ":"
            label = f"{r['config']} (lr {r['lr']:g}{', tuned' if r['role'] == 'final' else ''})"
            by_step.plot([x["iter"] for x in recs], [x["val_loss"] for x in recs], style, color=colors[r["config"]], label=label)
            by_time.plot([x["iter"] * r["seconds_per_step"] for x in recs], [x["val_loss"] for x in recs], style,
                         color=colors[r["config"]], label=label)
    by_step.set(xlabel="step", ylabel="validation loss (nats per byte)", title=f"per step, {longest} steps")
    by_time.set(xlabel="training seconds (steps x bench.py's s/step)", title="per second")
    by_step.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(assets / "val_loss.png", dpi=110)

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for config, s in sims.items():
        ax.plot(range(len(s)), s, marker="o", ms=3, color=colors[config], label=config)
    ax.set(xlabel="layer (0: embeddings)", ylabel="mean cosine similarity between tokens",
           title="signal propagation at init")
    ax.legend()
    fig.tight_layout()
    fig.savefig(assets / "rank_collapse.png", dpi=110)

    sas_p = next(r for r in runs if r["steps"] == longest and r["config"] == "sas_p" and r["role"] == "final")
    recs = logs[sas_p["log"]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for r in runs:
        if r["steps"] == longest and r["role"] in ("final", "shared_lr") and r["config"] in ("sas", "sas_p", "sas_p_nonorm"):
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
    fig.tight_layout()
    fig.savefig(assets / "gains.png", dpi=110)
    print(f"reproduce: figures in {assets}/")


# ----------------------------------------------------------------------------- main

def report(scale, rows, assets):
    shape = {k: v for k, v in SCALES[scale].items() if k != "steps"}
    print("reproduce: timing every config with bench.py (interleaved steps)", flush=True)
    step_s = step_seconds(shape)
    runs = result_rows(rows, step_s)
    logs = {str(run.folder / "log.jsonl"): read_log(run) for run, _, _ in rows}
    for r in runs:
        r["curve"] = [[x["iter"], round(x["val_loss"], 5)] for x in logs[r["log"]]]
    for steps in {r["steps"] for r in runs}:
        base = next(r for r in runs if r["steps"] == steps and r["config"] == "pre_ln" and r["role"] == "final")
        for r in runs:
            reach = None if r["steps"] != steps or r["diverged"] else step_to_reach(logs[r["log"]], base["val_loss"])
            r["seconds_to_pre_ln_loss"] = None if reach is None else round(reach * r["seconds_per_step"], 1)
    sims = similarity_at_init(shape)
    results = dict(
        scale=scale, shape=shape, steps=SCALES[scale]["steps"], grid=GRID, training=TRAINING, dataset=DATASET,
        measured=dict(date=datetime.date.today().isoformat(), torch=torch.__version__, machine=platform.machine(),
                      cpus=torch.get_num_threads(), device="cpu"),
        runs=runs, similarity_at_init=sims)
    assets.mkdir(parents=True, exist_ok=True)
    (assets / "results.json").write_text(json.dumps(results, indent=1))
    markdown = "\n\n".join(tables(results))
    print(markdown)
    figures(results, logs, sims, assets)
    total = sum(r["curve"][-1][0] * r["seconds_per_step"] for r in runs)
    print(f"reproduce: {len(runs)} runs, {total / 60:.0f} minutes of training at bench.py's speeds; "
          f"results in {assets / 'results.json'}")


def main(argv=None):
    p = argparse.ArgumentParser(prog="reproduce.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=list(SCALES), default="default", help="model and run lengths (default: %(default)s)")
    p.add_argument("--quick", action="store_const", dest="scale", const="quick", help="same as --scale quick")
    p.add_argument("--report", action="store_true", help="only make the figures and tables from finished runs")
    args = p.parse_args(argv)
    if not args.report and not (Path("data") / DATASET / "meta.json").exists():
        prepare_data.main(["--tokenizer", "bytes", "--name", DATASET])
    try:
        rows = experiment(args.scale, train_it=not args.report)
    except Unfinished as e:
        raise SystemExit(f"reproduce: error: run {e} is not finished; run without --report")
    report(args.scale, rows, Path("assets") if args.scale == "default" else Path("assets") / args.scale)


if __name__ == "__main__":
    main()
