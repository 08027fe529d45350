"""
How it is run: the tuning protocol (sweep, tune), an experiment's runs arm by arm (experiment,
cell_experiment), and a run trained with train.py or read back from its log (outcome,
train_run), under the locks that let two processes share out/repro/.

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

A committed run stands in for training it again (--reuse_results, --quick's baselines)
only where the code computes what the code that made it did, with the settings it resolved and
the same data (stale); runs made before runs recorded those are reported, never reused.

Seconds per step come from bench.py (every block in one process, steps interleaved), not from the
runs' own clocks, which ran one after another on a machine whose speed drifts; a shape is timed
once, and later reports keep the times results.json holds (else a report beside training reads slow).
"""

import io
import itertools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

import torch

import prepare_data
import train
from common import read_records
from reproduction import plan, resolve
from reproduction.plan import SHARED_LR, TOP_K, Run, cells, scale_points
from simple_gpt import switches_of


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
def claimed(path, wait, waiting=None):
    """Holds an exclusive lock on path within the block, so that reproduce.py can run once per core
    (OMP_NUM_THREADS=1) on one out/ folder: a process waits for a run another is training (wait;
    saying waiting first), or finds a run another has claimed (raises Unfinished). No-op
    where fcntl is missing."""
    try:
        with prepare_data.locked(path, wait, waiting):
            yield
    except prepare_data.Locked:  # raised only by taking the lock: a nested one raises Unfinished
        raise Unfinished("another reproduce.py process has it") from None


def read_results(path):
    """A results.json as a dict ({} if there is none); one that is not JSON (a crash or a bad
    merge can cut it) ends in one line that names it and how to restore it."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        results = json.loads(path.read_text())
    except ValueError:
        raise SystemExit(f"reproduce: error: {path} is not JSON (cut by a crash or a merge?); "
                         f"restore the committed one with: git checkout -- {path}") from None
    if "similarity_at_init" in results:  # written before experiments had measurements(): clm's, at the top
        results["experiments"]["clm"]["measurements"] = {"similarity_at_init": results.pop("similarity_at_init")}
    return results


def restore_logs(results_files, keep=lambda row: True):
    """--reuse_results: the runs whose log.jsonl is gone (out/ is not committed) but which these
    results.json files hold (their runs, and the finished runs of what is not finished; those
    keep(row) accepts) get their log written back from them (each record marked restored; a
    diverged run's last record saying so; its code.json: what made it), so that a long experiment
    goes on on another machine, or in a fresh clone, instead of training them again. Returns how
    many were restored."""
    rows = []
    for path in results_files:
        results = read_results(path)
        so_far = [row for e in results.get("experiments", {}).values() for row in e.get("so_far", [])]
        rows += [(path, row) for row in results.get("runs", []) + so_far if keep(row)]
    restored = 0
    # a run two experiments share: the row with its outlier statistics first (an older lacks them)
    for path, row in sorted(rows, key=lambda path_row: ("kurtosis" not in path_row[1], not path_row[1].get("entropy"))):
        log = Path(row["log"])
        if log.exists():
            continue
        log.parent.mkdir(parents=True, exist_ok=True)
        if row.get("code"):
            (log.parent / "code.json").write_text(json.dumps(row["code"]))
        similarity, gains, kurtosis = (dict(row.get(k, [])) for k in ("similarity", "gains", "kurtosis"))
        records = [dict(iter=i, val_loss=loss, similarity=similarity.get(i), gains=gains.get(i, {}), stalled=False,
                        restored=str(path), **({"outliers": dict(kurtosis=kurtosis[i])} if i in kurtosis else {}))
                   for i, loss in row["curve"]]
        if row["status"] != "diverged":  # the exact final loss (the curve's is rounded) and status
            records[-1].update(val_loss=row["val_loss"], stalled=row["status"] == "stalled",
                               **({"val_loss_int8": row["val_loss_int8"]} if row.get("val_loss_int8") else {}))
        if row.get("entropy"):  # logged at every evaluation, kept at the last
            records[-1].setdefault("outliers", {})["entropy"] = row["entropy"]
        if row["status"] == "diverged":
            records.append(dict(iter=records[-1]["iter"], diverged=True))
        log.write_text("".join(json.dumps(r) + "\n" for r in records))
        restored += 1
    return restored


def reuse_results(paths):
    """--reuse_results (and --quick's baselines): the runs of these results.json files whose logs
    are gone, written back (restore_logs) where the reuse check accepts them (stale); returns how
    many, and a line saying so and why the others are not taken."""
    probes, why = {}, {}

    def accepted(row):
        if Path(row["log"]).exists():  # there: nothing to write back
            return False
        key = row["name"], row["log"]
        if key not in why:
            why[key] = stale(row, probes)
        return not why[key]

    taken = restore_logs(paths, accepted)
    reasons = sorted({reason for what in why.values() for reason in what})
    left = sum(bool(what) for what in why.values())
    return taken, f"{taken} runs taken" + (f"; {left} not taken ({'; '.join(reasons)})" if left else "")


def prepare_tokens(kind):
    """The dataset of a run's tokens (plan.tokens_of), prepared where it is missing, broken or of other
    tokens. bpeN_rowsM is bpeN's dataset (its token files linked) under a meta.json that claims bpeM's
    vocabulary: train.py gives the model bpeM's rows, of which only bpeN's are ever tokens."""
    dataset, tokenizer, _ = plan.tokens_of(kind)
    folder = Path(plan.TRAINING.get("data_dir", "data")) / dataset
    tokens, _, rows = kind.partition("_rows")
    if not rows:
        if (prepare_data.prepared(folder / "meta.json") or {}).get("tokenizer") != tokenizer:
            vocab = ["--vocab", tokenizer.removeprefix("gpt2_")] if tokenizer.startswith("gpt2_") else []
            prepare_data.main(["--tokenizer", "bytes" if kind == "bytes" else "gpt2", *vocab, "--name", dataset])
        return
    prepare_tokens(tokens)
    base = folder.with_name(plan.tokens_of(tokens)[0])
    meta = dict(prepare_data.prepared(base / "meta.json"), vocab_size=int(rows) + 1)  # + end-of-text, as bpeM's
    splits = ("train.bin", "val.bin")
    if prepare_data.prepared(folder / "meta.json") == meta and all((folder / split).exists() for split in splits):
        return
    folder.mkdir(parents=True, exist_ok=True)
    for split in (*splits, "meta.json"):  # each made apart and moved in (another process may too); meta.json last
        tmp = folder / f"{split}.tmp{os.getpid()}"
        if split == "meta.json":
            tmp.write_text(json.dumps(meta))
        else:
            tmp.symlink_to(os.path.relpath(base / split, folder))
        tmp.replace(folder / split)


# What decides a run's numbers: its data, its settings as train.py resolves them (resolve.py), and
# what the code does with them. The probe runs train.py with a run's settings at a tiny shape and
# length (PROBE, the rate and the rates a pair tunes apart left to it), on a small text of its
# own, and keeps the numbers of its log the report reads (PROBED). A refactor that renames or
# moves code changes none of them; a change of one number (an init, the schedule) does, and a
# field only added to the log does not. Not the protocol, which decides which runs it asks for.
PROBE = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=4, max_iters=8, eval_interval=4,
             log_interval=4, eval_tokens=512, lr=1e-2, seed=1337,  # a high rate: every setting moves the loss
             grad_clip=1.7)  # the probes' gradient norms run 1.0 to 2.3: clipping binds on some steps (a uniform scale AdamW ignores)
PROBE_TEXT = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(2000))
PROBED = ("iter", "train_loss", "val_loss", "val_loss_int8", "stalled", "diverged", "similarity", "gains", "outliers")
# relative, and absolute near 0: AVX2 and AVX-512 kernels differ in the last bits, which can flip
# the 4th decimal train.py logs some numbers to (measured: 7e-5); scaling the initial weights by
# 1.005 moves them by 7e-3 or more
PROBE_TOLERANCE = 1e-3


def probe_settings(run, data):
    """train.py's flags for run's probe: its settings at PROBE's shape, length and rate (a rate a pair
    tunes apart, --muon_lr or --emb_lr, at its ratio to --lr), on PROBE_TEXT prepared in data."""
    settings = run.settings()
    apart = {k: PROBE["lr"] * float(f"{settings[k] / settings['lr']:.6g}") for k in ("muon_lr", "emb_lr") if k in settings}
    return {**settings, **PROBE, **apart, "dataset": "text", "data_dir": str(data)}


def probe_text():
    """The folder holding PROBE_TEXT, prepared as bytes."""
    data = plan.OUT / "probe"
    if not prepare_data.prepared(data / "text" / "meta.json"):
        data.mkdir(parents=True, exist_ok=True)
        (data / "text.txt").write_text(PROBE_TEXT)
        with redirect_stdout(io.StringIO()):
            prepare_data.main(["--input", str(data / "text.txt"), "--name", "text", "--data_dir", str(data), "--tokenizer", "bytes"])
    return data


def probe(run):
    """What the code does with run's settings (its block, switches, objective, optimizer, schedule
    and dtype) at PROBE's shape and length on PROBE_TEXT: the numbers of train.py's log that PROBED
    names, to 7 digits; a second or two."""
    with tempfile.TemporaryDirectory() as out, redirect_stdout(io.StringIO()):
        train.main(plan.argv_of({**probe_settings(run, probe_text()), "out_dir": out}))
        return numbers(read_records(Path(out) / "log.jsonl"))


def numbers(records, keys=PROBED):
    """The numbers of a log's records under keys (None: all but the clock's), in order."""
    def flat(x):
        if isinstance(x, dict):
            return [n for k, v in sorted(x.items()) for n in flat(v)]
        if isinstance(x, list):
            return [n for v in x for n in flat(v)]
        return [float(f"{x:.7g}")] if isinstance(x, (int, float)) else []  # a bool is an int: stalled counts
    return flat([{k: v for k, v in r.items() if (k in keys if keys else k != "elapsed_s")} for r in records])


def same_numbers(made, now):
    return len(made) == len(now) and all(math.isclose(a, b, rel_tol=PROBE_TOLERANCE, abs_tol=PROBE_TOLERANCE)
                                         for a, b in zip(made, now))


def data_fingerprint(dataset):
    """The prepared dataset as its source, tokenizer and token counts (the default corpus is the
    standard library of the Python that prepared it)."""
    meta = prepare_data.prepared(Path(plan.TRAINING.get("data_dir", "data")) / dataset / "meta.json") or {}
    return " ".join(str(meta.get(k)) for k in ("source", "tokenizer", "train_tokens", "val_tokens"))


def settings_of(run):
    """The run's settings as train.py resolves them: every one that can change what it computes
    (resolve.py); a string if train.py refuses them now, saying why."""
    with redirect_stderr(io.StringIO()) as said:
        try:
            return resolve.resolved(run.argv())
        except SystemExit as e:  # a one-line error, or argparse's (its last line on stderr)
            return "train.py refuses them now: " + (e.code if isinstance(e.code, str) else
                                                     (said.getvalue().strip().splitlines() or ["?"])[-1])


def run_of(row):
    """The Run of a results.json row."""
    return Run(row["objective"], row["config"], row["n_layer"], row["n_head"], row["n_embd"], row["steps"], row["lr"],
               row["seed"], tuple(row["flags"].items()), row.get("tokens", "bytes"))


def probed(run, probes):
    """The probe's numbers for run, from probes (a dict by the settings probed: runs that differ
    only in shape, length, rates or seed share them), made and kept there if missing."""
    key = json.dumps({k: str(v) for k, v in probe_settings(run, "").items() if k != "out_dir"}, sort_keys=True)
    if key not in probes:
        probes[key] = probe(run)
    return probes[key]


PROBED_NOW = {}  # the probes of the runs this process trains


def record_code(run):
    """What makes the run, in its folder (code.json), for the reuse check (stale): its data, its
    resolved settings and the probe's numbers; and the threads it trains with (train.py inherits
    OMP_NUM_THREADS), which move its last bits too."""
    made = dict(data=data_fingerprint(run.settings()["dataset"]), settings=settings_of(run),
                probe=probed(run, PROBED_NOW), threads=torch.get_num_threads())
    (run.folder / "code.json").write_text(json.dumps(made))


def stale(row, probes):
    """Why a committed row may not stand in for its run now ([] if it may): its data, a setting it
    recorded that train.py resolves otherwise now, or what the code computes (the probe, run with
    today's settings; probes: as probed's). A setting it did not record, or one train.py no longer
    has, is judged by the probe: a new one at a neutral value computes the same. A row that recorded
    no resolved settings and no probe was made by earlier code: reported, never reused."""
    made, run = row.get("code", {}), run_of(row)
    if not isinstance(made.get("settings"), dict) or "probe" not in made:
        return ["made by earlier code"]
    if isinstance(now := settings_of(run), str):
        return [f"settings: {now}"]
    changed = sorted(k for k, v in made["settings"].items() if k in now and now[k] != v)
    return ([] if made.get("data") == data_fingerprint(run.settings()["dataset"]) else ["data"]) + (
        [f"settings: {', '.join(changed)}"] if changed else
        [] if same_numbers(made["probe"], probed(run, probes)) else ["what the code computes"])


def reuse_baselines(path):
    """--quick: the committed runs of the named blocks (through the whole protocol) stand in for
    training them again where the reuse check accepts them (reuse_results); one line says how many,
    and why not the others. Returns how many were taken."""
    if not Path(path).exists():
        return 0
    taken, said = reuse_results([path])
    print(f"reproduce: from {path}: {said}" + ("; only the runs they lack train here" if taken else ""))
    return taken


def replay(row):
    """A committed row's run trained again, in a folder of its own that is then removed, with the
    threads this process has: its final loss now (None if it diverged). On the kind of CPU and
    with the threads that made it (row["code"]["threads"]), the same code gives it bit for bit."""
    run = run_of(row)
    prepare_tokens(run.tokens)
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run([sys.executable, str(Path(train.__file__).resolve()), *plan.argv_of({**run.settings(), "out_dir": out})],
                              capture_output=True, text=True)
        records = read_records(Path(out) / "log.jsonl")
    if records and records[-1].get("diverged"):
        return None
    if proc.returncode or not records or records[-1]["iter"] != run.steps:
        raise SystemExit(f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}reproduce: replaying {run.name} failed (above: its output)")
    return records[-1]["val_loss"]


def read_log(run):
    return read_records(run.folder / "log.jsonl")


def finished(run):
    """The outcome of a finished run, else None."""
    records = read_log(run)
    if records and records[-1].get("diverged"):
        return Outcome(math.inf, "diverged")
    if records and records[-1]["iter"] == run.steps:
        return Outcome(records[-1]["val_loss"], "stalled" if records[-1].get("stalled") else "trained")
    return None


def outcome(run, train_it):
    """The run's outcome, training it first if train_it (else Unfinished if it is not done); a run
    another process is training: waited for with train_it "wait", else Unfinished."""
    done = finished(run)
    if train_it:
        PROGRESS.met.add(run.folder)  # trained now or found finished: met
    if done or not train_it:
        if done is None:
            raise Unfinished(run.folder)
        return done
    with claimed(run.folder / "lock", wait=train_it == "wait", waiting=f"reproduce: waiting for the other process to finish "
                 f"{run.folder.parent.name} {run.name}"):
        return finished(run) or train_run(run)


def train_run(run):
    """Trains run with train.py (resuming it if it has a checkpoint), its per-step output into
    the run's train.log (and on the terminal with --verbose); prints its progress line; its outcome."""
    resume = ["--resume"] if (run.folder / "ckpt.pt").exists() else []
    if PROGRESS.verbose:
        print(f"reproduce: training {run.folder}" + (" (resuming)" if resume else ""), flush=True)
    run.folder.mkdir(parents=True, exist_ok=True)
    if not resume:
        record_code(run)
    start = time.monotonic()
    with open(run.folder / "train.log", "a", buffering=1) as log:  # a resumed run's output after its start's
        proc = subprocess.Popen([sys.executable, str(Path(train.__file__).resolve()), *run.argv(), *resume],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            for line in proc.stdout:
                log.write(line)
                if PROGRESS.verbose:
                    print("  " + line, end="", flush=True)
        except KeyboardInterrupt:
            proc.wait()  # train.py finishes its step and saves a checkpoint
            raise
        proc.wait()
    done = finished(run)  # a diverged run (a too-high rate) is a result of the sweep, not an error
    if done is None or proc.returncode and done.status != "diverged":
        end = "".join((run.folder / "train.log").read_text().splitlines(keepends=True)[-8:])  # its error, if any
        raise SystemExit(f"{end}reproduce: {run.folder} stopped early (exit code {proc.returncode}; above: the end "
                         "of its train.log); run reproduce.py again to resume")
    (run.folder / "ckpt.pt").unlink(missing_ok=True)  # megabytes a run; the log holds what the report needs
    print(PROGRESS.line(run, done, time.monotonic() - start, resumed=bool(resume)), flush=True)
    return done


def weights(run, train_it):
    """The folder of run's weights at its end (run.folder / "weights", its ckpt.pt), trained again
    there where missing, for a measurement that needs them: the same setting, so the run keeps its
    one result, its log; without train_it, Unfinished where they are missing."""
    folder = run.folder / "weights"
    if (read_records(folder / "log.jsonl") or [{}])[-1].get("iter") == run.steps:
        return folder
    if not train_it:
        raise Unfinished(folder)
    with claimed(run.folder / "weights.lock", wait=train_it == "wait"):
        if (read_records(folder / "log.jsonl") or [{}])[-1].get("iter") != run.steps:  # another process's meanwhile
            resume = ["--resume"] if (folder / "ckpt.pt").exists() else []
            with open(run.folder / "weights.log", "a") as log:
                subprocess.run([sys.executable, str(Path(train.__file__).resolve()),
                                *plan.argv_of({**run.settings(), "out_dir": folder}), *resume], stdout=log, stderr=log)
            if (read_records(folder / "log.jsonl") or [{}])[-1].get("iter") != run.steps:
                raise SystemExit(f"reproduce: training {folder} again stopped early (its output: {run.folder / 'weights.log'})")
    return folder


@dataclass
class Progress:
    """The one line a trained run prints, e.g.
        reproduce: [12/38] 6x256_200steps sas_p lr 0.004 seed 1: 3.1416 | ~9 min left
    the runs of the experiment this process has met (trained, or found finished: counted, not
    timed) of an estimate of all of them (planned_runs), where the run is, how it ended, and the
    minutes left: the runs not met yet times the mean wall time of the runs this process trained
    from their start (a resumed run's remainder counts only until one has). Estimates: the grid
    may grow past the plan, and with two processes sharing out/ the other's runs count as left
    until met."""
    total: int = 0  # planned_runs' estimate, grown to the runs met if they are more
    verbose: bool = False  # --verbose: train.py's per-step lines on the terminal too
    met: set = field(default_factory=set)  # the folders of the runs met
    seconds: list = field(default_factory=list)  # (resumed, wall time) of each run trained

    def line(self, run, done, seconds, resumed=False):
        self.met.add(run.folder)
        self.seconds.append((resumed, seconds))
        whole = [s for was_resumed, s in self.seconds if not was_resumed] or [s for _, s in self.seconds]
        n, total = len(self.met), max(self.total, len(self.met))
        left = (total - n) * statistics.fmean(whole) / 60
        ended = "diverged" if done.status == "diverged" else f"{done.loss:.4f}" + (" stalled" if done.status == "stalled" else "")
        return (f"reproduce: [{n}/{total}] {run.folder.parent.name} {run.config}{run.flag_text} {' '.join(f'{k} {v:g}' for k, v in run.rates)} seed {run.seed}: "
                f"{ended}{' (resumed)' if resumed else ''} | ~{left:.0f} min left")


PROGRESS = Progress()  # main() gives it the experiment's estimate and --verbose


def planned_runs(name, scale, n_seeds):
    """The progress line's estimate of the runs an experiment has: a tuned arm is its grid on the
    first seed, its TOP_K best rates on the second and the tuned rate on every other seed,
    len(GRID) + TOP_K + n_seeds - 2 runs; an arm tuned around a rate (a longer point, an
    ablation) 3 + 1 + n_seeds - 2 (top_k 1), and one tuned on a grid of pairs of rates (pairs) that
    grid's size in place of len(GRID); a shared-rate entry one run a seed (but a tuned
    config's first seed: a run of its sweep). Not counted: the rates a grid grows by, and the
    checks past a rate that failed one."""
    arm = lambda grid, top_k: grid + (top_k + n_seeds - 2 if n_seeds > 1 else 0)
    exp = plan.EXPERIMENTS[name]
    if "planned" in exp:  # a search of its own: its own estimate
        return exp["planned"](n_seeds)
    if "cells" in exp["scales"][scale]:
        return len(cells(scale, name)) * len(exp["tuned"]) * arm(len(plan.GRID), TOP_K)
    if "rates" in exp:
        return sum(map(len, exp["rates"].values())) * n_seeds
    spec, steps_list, pairs = exp["scales"][scale], scale_points(name, scale)[2], exp.get("pairs", {})
    tuning = sum(arm(3, 1) if steps in spec.get("longer", ()) else
                 arm(math.prod(len(values) for _, values in pairs["grid"]), TOP_K) if config in pairs.get("configs", ()) else
                 arm(len(plan.GRID), TOP_K) for config in exp["tuned"] for steps in steps_list)
    shared = sum(n_seeds - (config in exp["tuned"]) for config, points in exp.get("shared_lr", {}).items() for _ in points)
    ablations = len(exp.get("around", ())) + (len(exp["depth"]["configs"]) * len(spec["depth"]["layers"]) if "depth" in exp else 0)
    rescue = 2 * len(spec.get("rescue", {}).get("runs", ()))  # each stalled run, and it with QK-norm
    return tuning + shared + ablations * arm(3, 1) + rescue


# ----------------------------------------------------------------------------- the protocol

def at_rates(run, rates, **changes):
    """run at rates: a peak learning rate (--lr), or a pair, ((flag, rate), (flag, rate)): --muon_lr
    and --lr, or --lr and --emb_lr (an --emb_lr equal to --lr is the one-rate run: no flag)."""
    if not isinstance(rates, tuple):
        return run.again(lr=rates, **changes)
    flags = {**dict(run.flags), **dict(rates)}
    lr = flags.pop("lr")
    if flags.get("emb_lr") == lr:
        del flags["emb_lr"]
    return run.again(lr=lr, flags=tuple(sorted(flags.items())), **changes)


def sweep(run, train_it, grid=None, extra=None):
    """{rates: outcome} of run at every point of grid (GRID), on its seed: a grid of rates, or of
    pairs (an axis per flag, ((flag, rates), (flag, rates))); grown by factors of 2 on an axis of
    more than one rate, up to extra (MAX_EXTRA) more on it, while the best point is at its edge and trains."""
    grid, extra = grid or plan.GRID, plan.MAX_EXTRA if extra is None else extra
    pairs = isinstance(grid[0], tuple)
    names, firsts = zip(*grid) if pairs else ((None,), (grid,))
    axes = [list(axis) for axis in firsts]
    point = lambda values: tuple(zip(names, values)) if pairs else values[0]
    results = {}
    while True:
        points = [point(values) for values in itertools.product(*axes)]
        todo = {at_rates(run, p): p for p in points if p not in results}
        results.update({todo[r]: o for r, o in outcomes(list(todo), train_it).items()})
        best = min(points, key=lambda p: results[p].loss)
        if not results[best].trained:
            return results
        grown = False
        for axis, first, value in zip(axes, firsts, [v for _, v in best] if pairs else [best]):
            if 1 < len(first) and len(axis) < len(first) + extra and value in (axis[0], axis[-1]):
                axis.insert(0, value / 2) if value == axis[0] else axis.append(value * 2)
                grown = True
        if not grown:
            return results


def tune(run, seed_list, train_it, grid=None, extra=None, top_k=TOP_K, first=None):
    """The protocol of the module docstring for run's config: ([(run, role, outcome)], tuned rates)
    with role sweep (first seed), check (another seed, rates not kept) or final (the tuned rates,
    every seed); rates a learning rate, or a pair (a grid of pairs: sweep); first: the first seed's
    {rates: outcome} where a search other than sweep made them. train_it True: where it
    needs a run another process is training, Unfinished (the
    process goes on to what else is left); "wait": it waits for it."""
    first = first or sweep(run.again(seed=seed_list[0]), train_it, grid, extra)
    rows = {(lr, seed_list[0]): o for lr, o in first.items()}

    def trains_on(lr, seeds):  # trains what is missing, up to the first seed it fails on
        for seed in seeds:
            if (lr, seed) not in rows:
                rows[lr, seed] = outcome(at_rates(run, lr, seed=seed), train_it)
            if not rows[lr, seed].trained:
                return False
        return True

    mean = lambda lr: statistics.fmean(o.loss for (r, _), o in rows.items() if r == lr)
    unchecked = sorted((lr for lr in first if first[lr].trained), key=lambda lr: first[lr].loss)
    checked, held, tuned = 0, [], None
    if len(seed_list) > 1:  # the TOP_K best are rerun whatever they give: as one batch, which two processes share
        second = {lr: at_rates(run, lr, seed=seed_list[1]) for lr in unchecked[:top_k]}
        done = outcomes(list(second.values()), train_it)
        rows.update({(lr, seed_list[1]): done[r] for lr, r in second.items()})
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
            rows[tuned, seed] = outcome(at_rates(run, tuned, seed=seed), train_it)
    role = lambda lr, seed: "final" if lr == tuned else "sweep" if seed == seed_list[0] else "check"
    return [(at_rates(run, lr, seed=seed), role(lr, seed), o) for (lr, seed), o in sorted(rows.items())], tuned


def outcomes(runs, train_it):
    """{run: outcome} of runs, those another process is training last, so that two processes take
    different runs rather than one waiting for the other: waited for with train_it "wait", else
    Unfinished."""
    done = {}
    for r in runs if train_it else ():
        try:
            done[r] = outcome(r, True)  # not waited for
        except Unfinished:
            pass
    return {r: done[r] if r in done else outcome(r, train_it) for r in runs}


def experiment(name, scale, seed_list, train_it):
    """Train (if train_it) and collect every run of an experiment. Returns ([(run, role, outcome)],
    [what is left out]): without train_it, a tuning arm (a config at one scale point) not finished is
    left out, its finished runs in role "so far"."""
    if "search" in plan.EXPERIMENTS[name]:  # a search of its own, from the protocol's parts
        return plan.EXPERIMENTS[name]["search"](scale, seed_list, train_it)
    if "cells" in plan.EXPERIMENTS[name]["scales"][scale]:
        return cell_experiment(name, scale, seed_list, train_it)
    if "rates" in plan.EXPERIMENTS[name]:
        return fixed_rate_experiment(name, scale, seed_list, train_it)
    exp, spec = plan.EXPERIMENTS[name], plan.EXPERIMENTS[name]["scales"][scale]
    shape, flags, steps_list = scale_points(name, scale)
    pairs = exp.get("pairs", {}).get("configs", ())  # the arms tuned on pairs of rates
    base = lambda config, steps: Run(exp["objective"], config, **shape, steps=steps, lr=SHARED_LR, flags=flags)
    rows, left_out, tuned = [], [], {}
    for steps in steps_list:
        missing = []
        for config in exp["tuned"]:  # arm by arm: where an arm needs another process's run, the next
            try:
                narrow = {}
                if config in pairs:  # Muon's rate and AdamW's, tuned together on one grid at every length
                    narrow = dict(grid=exp["pairs"]["grid"])
                elif steps in spec.get("longer", ()):  # around the rate tuned at the longest of steps
                    if (config, spec["steps"][-1]) not in tuned:
                        raise Unfinished(f"its {spec['steps'][-1]}-step tuning")
                    r = tuned[config, spec["steps"][-1]]
                    narrow = dict(grid=(r / 2, r, 2 * r), extra=1, top_k=1)
                runs, tuned[config, steps] = tune(base(config, steps), seed_list, train_it, **narrow)
                rows += runs
            except Unfinished as e:
                missing.append(f"{config} (from {e})")
                if not train_it:  # its finished runs are shown apart, without a verdict
                    rows += finished_so_far(base(config, steps), seed_list, config in pairs and exp["pairs"]["grid"])
        if missing:
            left_out.append(f"the {steps}-step tuning: {'; '.join(missing)}")
    todo = [(base(config, spec["steps"][point]), "shared_lr") for config, points in exp.get("shared_lr", {}).items()
            for point in points]
    for run, role in todo:
        try:
            # e.g. Pre-LN at 1e-3 on the first seed: a sweep run already
            seen = {r for r, role, _ in rows if role != "so far"}
            every_seed = outcomes([run.again(seed=seed) for seed in seed_list], train_it)
            rows += [(r, role, o) for r, o in every_seed.items() if r not in seen]
        except Unfinished as e:
            left_out.append(str(e))  # the run not finished (or another process's)
    longest = steps_list[-1]
    at_longest = {config: r for (config, steps), r in tuned.items() if steps == longest}
    rows += ablation_runs(exp, scale, base, longest, at_longest, seed_list, train_it, left_out)
    rows += rescue_runs(spec.get("rescue"), train_it, left_out)
    if not any(role == "final" for _, role, _ in rows):
        raise Unfinished(left_out[0])
    return rows, left_out


def ablation_runs(exp, scale, base, longest, tuned, seed_list, train_it, left_out):
    """The path's ablations ("around") and depth runs at the longest length, each on 3 rates around
    its block's rate tuned there (tuned: {block: rate}), one more past an edge; [(run, role, outcome)]."""
    rows, ablations = [], [(config, base(config, longest)) for config in exp.get("around", ())]
    if "depth" in exp:
        ablations += depth_runs(exp, scale, longest)
    ablations.sort(key=lambda a: a[0].endswith("_0.5"))  # Fig. 3's middle betas last: every figure first
    for config, run in ablations:
        block = plan.CONFIGS[config]["block"]
        try:
            if block not in tuned:
                raise Unfinished(f"{block}'s tuning")
            r = tuned[block]
            rows += tune(run, seed_list, train_it, grid=(r / 2, r, 2 * r), extra=1, top_k=1)[0]
        except Unfinished as e:
            left_out.append(f"{run.folder.parent.name}: {config} (from {e})")
    return rows


def rescue_runs(spec, train_it, left_out):
    """The outliers experiment's rescue: each stalled run of spec again, its rate and seed, with
    QK-norm; [(run, role, outcome)], role "stalled" for the run as it was, "rescue" for it with QK-norm."""
    rows = []
    for config, lr, seed in spec["runs"] if spec else ():
        shape = {k: spec[k] for k in ("n_layer", "n_head", "n_embd")}
        for role, arm in (("stalled", config), ("rescue", f"{config}_qknorm")):
            run = Run("clm", arm, **shape, steps=spec["steps"], lr=lr, seed=seed)
            try:
                rows.append((run, role, outcome(run, train_it)))
            except Unfinished as e:
                left_out.append(f"the rescue: {e}")
    return rows


def finished_so_far(run, seed_list, grid=None):
    """[(run, "so far", outcome)] for every finished run of run's arm (its config and flags at its
    shape and length, any rate, or pair of rates on grid's axes, a seed of seed_list), read from out/:
    what a report shows of a tuning arm that is not finished yet. No verdict is drawn from them."""
    name = re.compile(re.escape(run.config) + r"_lr([0-9.e+-]+)(?:_(?:adamw_lr|emb_lr)([0-9.e+-]+))?.*_s(\d+)")
    found = []
    for folder in run.folder.parent.glob(f"{run.config}_lr*"):
        if not (match := name.fullmatch(folder.name)):
            continue
        rates = (float(match[1]), float(match[2] or match[1]))  # in a name, each rate in its grid's order
        r = at_rates(run, tuple(zip((flag for flag, _ in grid), rates)) if grid else rates[0], seed=int(match[3]))
        if r.seed in seed_list and r.folder == folder and (done := finished(r)):  # another arm's: another folder
            found.append((r, "so far", done))
    return sorted(found, key=lambda row: (row[0].lr, row[0].seed))


def cell_experiment(name, scale, seed_list, train_it):
    """An experiment of cells (the factor study's): every tuned config tuned in every cell, arm by
    arm (as experiment())."""
    rows, left_out = [], []
    for cell in cells(scale, name):
        for config in plan.EXPERIMENTS[name]["tuned"]:
            run = cell.run(config)
            try:
                rows += tune(run, seed_list, train_it)[0]
            except Unfinished as e:
                left_out.append(f"{cell.label}: {config} (from {e})")
                if not train_it:
                    rows += finished_so_far(run, seed_list)
    if not any(role == "final" for _, role, _ in rows):
        raise Unfinished(left_out[0])
    return rows, left_out


def fixed_rate_experiment(name, scale, seed_list, train_it):
    """A check at rates tuned elsewhere (bf16's, rows'): each block at each of its rates of the
    experiment's rates, in its cell with its run_flags, on every seed; its final runs are those of
    the rate with the best mean (its other rates' runs: role "sweep")."""
    exp = plan.EXPERIMENTS[name]
    shape, flags, (steps,) = scale_points(name, scale)
    rows, left_out = [], []
    for config, lrs in exp["rates"].items():
        run = Run(exp["objective"], config, **shape, steps=steps, lr=lrs[0], flags=tuple(sorted(flags + exp.get("run_flags", ()))))
        try:
            by_lr = {lr: outcomes([run.again(lr=lr, seed=seed) for seed in seed_list], train_it) for lr in lrs}
        except Unfinished as e:
            left_out.append(f"{config} (from {e})")
            continue
        best = min(lrs, key=lambda lr: statistics.fmean(o.loss for o in by_lr[lr].values()))
        rows += [(r, "final" if lr == best else "sweep", o) for lr in lrs for r, o in by_lr[lr].items()]
    if not rows:
        raise Unfinished(left_out[0])
    return rows, left_out


def depth_runs(exp, scale, steps):
    """Fig. 6: [(config, run)] of each block at depth L and 4L (MLP 2d, beta_FF scaled as 1/sqrt(L))."""
    spec, runs = {**exp["depth"], **exp["scales"][scale]["depth"]}, []
    for n_layer in spec["layers"]:
        for config in spec["configs"]:
            flags = [("mlp_ratio", spec["mlp_ratio"])]
            if "beta_ff" in switches_of(plan.CONFIGS[config]["block"]):
                flags.append(("beta_ff", round(spec["beta_ff_at_18"] * math.sqrt(18 / n_layer), 4)))
            runs.append((config, Run(exp["objective"], config, n_layer, spec["n_head"], spec["n_embd"], steps,
                                     SHARED_LR, flags=tuple(sorted(flags)))))
    return runs
