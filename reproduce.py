"""
The paper in miniature: seven blocks trained alike on 2 CPU cores (about an hour in all), then
the figures and the table of the README's "Reproduction" section.

    python reproduce.py            # train what is missing (resuming interrupted runs), then report
    python reproduce.py --report   # figures and table from the finished runs only

Every run has the same seed, data, steps, learning rate, batch and shape; only the block differs.
The shape is deep and narrow (12 x 128) because the paper's effects are about depth: signal
propagation through many blocks. Tokens are bytes (vocabulary 257): with GPT-2's 50K vocabulary
the output head would be ~3/4 of the matmuls at this width and hide the blocks' speed differences.
Figures need matplotlib (pip install matplotlib); without it the table is still printed.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

import bench
import prepare_data
from simple_gpt import GPT, GPTConfig, token_similarity

RUNS = {  # name: (block, norm)
    "pre_ln": ("pre_ln", "rmsnorm"),
    "parallel": ("parallel", "rmsnorm"),
    "sas": ("sas", "rmsnorm"),
    "sas_p": ("sas_p", "rmsnorm"),
    "sas_p_nonorm": ("sas_p", "none"),
    "v_skipinit": ("v_skipinit", "rmsnorm"),
    "skipless": ("skipless", "rmsnorm"),
}
DATASET = "python_stdlib_bytes"
VOCAB = 320  # bytes and end-of-text (257), padded to a multiple of 64 as train.py does
SHAPE = dict(n_layer=12, n_head=4, n_embd=128, block_size=128)
TRAINING = dict(batch_size=16, max_iters=1200, eval_interval=50, eval_tokens=2**15, lr=1e-3, seed=1337)
OUT, ASSETS = Path("out/repro"), Path("assets")


def flags(settings):
    return [x for k, v in settings.items() for x in (f"--{k}", str(v))]


def train_missing():
    if not (Path("data") / DATASET / "meta.json").exists():
        prepare_data.main(["--tokenizer", "bytes", "--name", DATASET])
    for i, (name, (block, norm)) in enumerate(RUNS.items()):
        out = OUT / name
        records = read_log(name)
        if records and records[-1]["iter"] == TRAINING["max_iters"]:
            print(f"reproduce: {name} is finished")
            continue
        resume = ["--resume"] if (out / "ckpt.pt").exists() else []
        print(f"reproduce: run {i + 1}/{len(RUNS)}: {name}" + (" (resuming)" if resume else ""), flush=True)
        cmd = [sys.executable, "train.py", "--block", block, "--norm", norm, "--dataset", DATASET,
               "--out_dir", str(out), "--log_interval", "50", *flags(SHAPE), *flags(TRAINING), *resume]
        proc = subprocess.Popen(cmd)
        try:
            proc.wait()
        except KeyboardInterrupt:
            proc.wait()  # train.py finishes its step and saves a checkpoint
        records = read_log(name)
        if proc.returncode or not records or records[-1]["iter"] != TRAINING["max_iters"]:
            raise SystemExit(f"reproduce: {name} stopped before iter {TRAINING['max_iters']} "
                             f"(exit code {proc.returncode}); run reproduce.py again to resume")


def read_log(name):
    path = OUT / name / "log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def step_seconds():
    """Seconds per training step of every run at the reproduction's shape, measured by bench.py
    in one process with interleaved steps: fairer than the runs' own clocks, which ran one after
    another on a machine whose speed drifts by ~10%."""
    args = bench.parse_args(["--blocks", "pre_ln", "--vocab_size", str(VOCAB), "--steps", "10",
                             "--n_layer", str(SHAPE["n_layer"]), "--n_head", str(SHAPE["n_head"]),
                             "--n_embd", str(SHAPE["n_embd"]), "--seq_len", str(SHAPE["block_size"]),
                             "--batch_size", str(TRAINING["batch_size"])])
    rows = bench.run(args, runs=RUNS)
    return {r["block"]: TRAINING["batch_size"] * SHAPE["block_size"] / r["tokens_per_s"] for r in rows}


def step_to_reach(records, target):
    """The step at which val loss first reaches target, linear between evals; None if never."""
    for a, b in zip(records, records[1:]):
        if b["val_loss"] <= target:
            frac = (a["val_loss"] - target) / (a["val_loss"] - b["val_loss"]) if a["val_loss"] > target else 0.0
            return a["iter"] + frac * (b["iter"] - a["iter"])
    return None


def table(logs, step_s):
    base = logs["pre_ln"][-1]
    rows = []
    for name, (block, norm) in RUNS.items():
        last = logs[name][-1]
        model = GPT(GPTConfig(block=block, norm=norm, vocab_size=VOCAB, **SHAPE))
        reach = step_to_reach(logs[name], base["val_loss"])
        rows.append(dict(run=name, params=model.num_params(), val_loss=last["val_loss"],
                         loss_vs_pre_ln=last["val_loss"] / base["val_loss"],
                         speed_vs_pre_ln=step_s["pre_ln"] / step_s[name], step_ms=1000 * step_s[name],
                         run_clock_s=last["elapsed_s"],
                         seconds_to_pre_ln_loss=None if reach is None else reach * step_s[name]))
    lines = ["| run | params | final val loss | loss / pre_ln | tokens/s / pre_ln | ms per step "
             "| s to reach pre_ln's final loss |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        reach = "never" if r["seconds_to_pre_ln_loss"] is None else f"{r['seconds_to_pre_ln_loss']:.0f}"
        lines.append(f"| {r['run']} | {r['params'] / 1e6:.3f}M | {r['val_loss']:.4f} | {r['loss_vs_pre_ln']:.3f} "
                     f"| {r['speed_vs_pre_ln']:.3f} | {r['step_ms']:.0f} | {reach} |")
    return rows, "\n".join(lines)


def similarity_at_init():
    """Claim 3: token similarity after each layer at init, on validation text."""
    val = np.memmap(Path("data") / DATASET / "val.bin", dtype=np.uint16, mode="r")
    T = SHAPE["block_size"]
    idx = torch.from_numpy(np.stack([val[i * T:(i + 1) * T] for i in range(8)]).astype(np.int64))
    sims = {}
    for name, (block, norm) in RUNS.items():
        torch.manual_seed(TRAINING["seed"])
        sims[name] = token_similarity(GPT(GPTConfig(block=block, norm=norm, vocab_size=VOCAB, **SHAPE)), idx)
    return sims


def figures(logs, sims, step_s):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("reproduce: matplotlib is not installed (pip install matplotlib); no figures")
        return
    ASSETS.mkdir(exist_ok=True)
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for name, records in logs.items():
        r = records[1:]  # iter 0 (loss ~ln 320) squashes the interesting part
        by_step.plot([x["iter"] for x in r], [x["val_loss"] for x in r], label=name)
        by_time.plot([x["iter"] * step_s[name] for x in r], [x["val_loss"] for x in r], label=name)
    by_step.set(xlabel="step", ylabel="validation loss (bytes)", title="per step")
    by_time.set(xlabel="training seconds (steps x measured s/step, 2 CPU cores)", title="per second")
    by_step.legend()
    fig.tight_layout()
    fig.savefig(ASSETS / "val_loss.png", dpi=110)

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for name, s in sims.items():
        ax.plot(range(len(s)), s, marker="o", ms=3, label=name)
    ax.set(xlabel="layer (0: embeddings)", ylabel="mean cosine similarity between tokens",
           title=f"signal propagation at init, {SHAPE['n_layer']} x {SHAPE['n_embd']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(ASSETS / "rank_collapse.png", dpi=110)

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for name in ("sas", "sas_p", "sas_p_nonorm"):
        r = logs[name]
        axes[0].plot([x["iter"] for x in r], [x["gains"]["value_beta_over_alpha"][0] for x in r], label=name)
    axes[0].set(xlabel="step", title="first-layer value: beta_V / alpha_V")
    axes[0].legend()
    r = logs["sas_p"]
    for key in ("alpha", "beta", "gamma"):
        axes[1].plot(range(SHAPE["n_layer"]), r[-1]["gains"][key], marker="o", label=f"{key} (end)")
    axes[1].axhline(1.0, color="grey", lw=0.5)
    axes[1].set(xlabel="layer", title="sas_p shaped-attention gains, per layer (init 1)")
    axes[1].legend()
    for layer in range(0, SHAPE["n_layer"], 3):
        axes[2].plot([x["iter"] for x in r], [x["gains"]["beta_ff"][layer] for x in r], label=f"layer {layer}")
    axes[2].set(xlabel="step", title="sas_p beta_FF")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(ASSETS / "gains.png", dpi=110)
    print(f"reproduce: figures in {ASSETS}/")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--report", action="store_true", help="only make the figures and table")
    args = p.parse_args(argv)
    if not args.report:
        train_missing()
    logs = {name: read_log(name) for name in RUNS}
    unfinished = [n for n, r in logs.items() if not r or r[-1]["iter"] != TRAINING["max_iters"]]
    if unfinished:
        raise SystemExit(f"reproduce: error: unfinished runs: {', '.join(unfinished)}; run without --report")
    step_s = step_seconds()
    rows, markdown = table(logs, step_s)
    sims = similarity_at_init()
    figures(logs, sims, step_s)
    print(markdown)
    ASSETS.mkdir(exist_ok=True)
    (ASSETS / "results.json").write_text(json.dumps(dict(rows=rows, similarity_at_init=sims), indent=2))


if __name__ == "__main__":
    main()
