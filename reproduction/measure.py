"""Measurements beside the runs: seconds per step from bench.py (every block in one process, steps
interleaved: the runs' own clocks ran one after another on a machine whose speed drifts), the
token similarity of each block at init (claim 3), and how fast shaped attention leaves the
identity it starts as."""

import io
import math
import statistics
import tempfile
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import torch

import bench
import train
import train_config
from reproduction import plan
from reproduction.plan import Run, tokens_of
from diagnostics import attention_entropy, attention_layers, residual_streams, token_similarity
from simple_gpt import GPT


def step_seconds(objective, timed, configs):
    """Seconds per training step of each config at a timed_key, from bench.py."""
    n_layer, n_head, n_embd, batch_size, vocab_size, block_size = timed
    args = bench.parse_args(["--blocks", "pre_ln", "--vocab_size", str(vocab_size), "--steps", "20",
                             "--n_layer", str(n_layer), "--n_head", str(n_head), "--n_embd", str(n_embd),
                             "--seq_len", str(block_size), "--batch_size", str(batch_size),
                             "--objective", objective, "--dtype", plan.TRAINING["dtype"]])
    runs = {c: (plan.CONFIGS[c]["block"], {k: v for k, v in plan.CONFIGS[c].items() if k != "block"}) for c in configs}
    rows = bench.run(args, runs=runs, base=configs[0])
    return {r["block"]: batch_size * block_size / r["tokens_per_s"] for r in rows}


def timed_key(run):
    """What a step's time depends on: (n_layer, n_head, n_embd, batch_size, vocab_size, block_size)."""
    settings = run.settings()
    return run.n_layer, run.n_head, run.n_embd, settings["batch_size"], tokens_of(run.tokens)[2], settings["block_size"]


def similarity_at_init(shape):
    """Claim 3: token similarity after each layer at init, on validation text (causal models)."""
    val = np.memmap(Path("data") / tokens_of(shape["tokens"])[0] / "val.bin", dtype=np.uint16, mode="r")
    T = plan.TRAINING["block_size"]
    idx = torch.from_numpy(np.stack([val[i * T:(i + 1) * T] for i in range(8)]).astype(np.int64))
    sims = {}
    for config in ("pre_ln", "parallel", "sas", "sas_p", "sas_p_nonorm", "v_skipinit", "skipless"):
        torch.manual_seed(1337)
        model = GPT(Run("clm", config, **shape, steps=0, lr=0).model_config())
        sims[config] = [round(s, 4) for s in token_similarity(model, idx)]
    return sims


def identity_start(run, steps, sequences=8):
    """How fast shaped attention leaves the identity it starts as (W_Q = 0, so A = I): run's first
    steps, with its own optimizer, rates and schedule; at step 0 and after each, on its first
    validation sequences, [distance, entropy]: ||A - I||_F / ||I||_F, and the entropy of A's
    softmax part (C's at step 0; nats), each the mean over layers, heads and sequences."""
    with tempfile.TemporaryDirectory() as out, redirect_stdout(io.StringIO()):
        trainer = train.Trainer(train_config.parse_args(plan.argv_of({**run.settings(), "out_dir": out})))
        idx = trainer.batch("val", np.arange(sequences) * trainer.cfg.block_size)[0]
        eye = torch.eye(idx.size(1), device=idx.device)
        trajectory = []
        for step in range(steps + 1):
            if step:
                trainer.train_step()
            with torch.no_grad():
                layers, inputs = attention_layers(trainer.raw_model), residual_streams(trainer.raw_model, idx)[1]
                distance = [((a.matrix(*a.queries_keys(x)) - eye).norm(dim=(-2, -1)) / math.sqrt(eye.size(0))).mean().item()
                            for a, x in zip(layers, inputs)]
                entropy = [attention_entropy(a, x).item() for a, x in zip(layers, inputs)]
            trajectory.append([round(statistics.fmean(distance), 5), round(statistics.fmean(entropy), 5)])
    return trajectory
