"""
The paper's claims tested the paper's way, every verdict with its noise: each block's learning
rate tuned alike, the tuned runs repeated over seeds and compared seed by seed (same batches), then
the paper's argument, ablation by ablation (SPEC §8). The method: assets/REPORT.md, "How it is
run"; the tuning in detail: reproduction/protocol.py; each experiment's question and its rule,
written before its runs: its module in reproduction/experiments/ (below).

    python reproduce.py                       # GPT (next-token), BPE, 3 seeds: ~10 hours on 2 CPU cores
    python reproduce.py --experiment path     # the paper's path, Figs. 3, 4, 6, 12, 13, 23-25: ~2.2 hours (*)
    python reproduce.py --experiment mlm      # the encoder (BERT's masked LM)
    python reproduce.py --experiment outliers # outlier features: OP, QK-norm, SAS-P with and without norms
    python reproduce.py --experiment muon     # the optimizer: each block with AdamW and with Muon (*)
    python reproduce.py --experiment muon_rates  # Muon with its two rates tuned together, W^Q, W^K apart (*)
    python reproduce.py --quick               # the GPT comparison smaller (--quick: 2 seeds, assets/quick/): ~20 minutes (*)
    python reproduce.py --seeds 1             # one seed: an anecdote, cheaply
    python reproduce.py --scale large         # on bytes, and 3,200 steps around the 800-step rate
    python reproduce.py --report              # tables and figures from the runs finished so far
    python reproduce.py --replay sas,sas_p    # their committed final runs trained again, losses compared

(*) as two processes, one per core: run `OMP_NUM_THREADS=1 python reproduce.py ...` twice; they
share out/repro/ through locks, never train one run twice, and share the runs of one arm.

Interrupt it at any time: rerunning resumes the unfinished run and skips the finished ones.
Each run it trains prints one line: how many of the experiment's runs (an estimate) are done,
the run, its final validation loss, and the minutes left at this process's pace so far; train.py's
own lines go to the run's train.log in its out/repro/ folder (--verbose: to the terminal too).

Figures need matplotlib (pip install matplotlib); without it the tables are still written.
"""

import argparse
import datetime
import hashlib
import json
import platform
import re
from pathlib import Path

import torch

import common
from reproduction import figures, measure, plan, protocol, report, tables
from reproduction.experiments import MODULES


def step_times(name, results, exp, timed):
    """Seconds per step of exp's configs at each timed key: those results.json holds for every one of
    them in this experiment's rows (bench.py timed them on idle cores once), else bench.py's now,
    every config interleaved; and whether bench.py ran now."""
    configs, held = [*exp["tuned"], *exp.get("shared_lr", {})], {}
    for r in results.get("runs", []) + results.get("experiments", {}).get(name, {}).get("so_far", []):
        if r["experiment"] == name and r.get("seconds_per_step"):
            key = r["n_layer"], r["n_head"], r["n_embd"], r["batch_size"], plan.tokens_of(r["tokens"])[2], r["block_size"]
            held.setdefault(key, {}).setdefault(r["config"], r["seconds_per_step"])
    step_s, timed_now = {}, False
    for key in sorted(timed):
        if all(config in held.get(key, {}) for config in configs):
            step_s[key] = held[key]
        else:
            print(f"reproduce: timing every config with bench.py (interleaved steps) at {key}", flush=True)
            step_s[key], timed_now = measure.step_seconds(exp["objective"], key, configs), True
    return step_s, timed_now


def measurements(name, runs, shape, held):
    """What an experiment's module measures beside its runs (its measurements(), if it has one);
    where that cannot be made now (e.g. --report without the data), the last ones, and a line."""
    measure_it = getattr(MODULES.get(name), "measurements", None)  # --blocks' compare experiment has no module
    try:
        return measure_it(runs, shape, held) if measure_it else {}
    except SystemExit as e:  # train.py's errors
        print(f"reproduce: {name}'s measurements beside its runs not made now ({e}); kept the last ones")
        return held or {}


def write_results(name, scale, seed_list, rows, left_out, assets):
    """Write results.json (this experiment's rows replace its old ones), the tables and the figures,
    each run with its config's seconds per step; left_out: what of the experiment is not finished yet."""
    exp = plan.EXPERIMENTS[name]
    shape, flags, steps_list = plan.scale_points(name, scale)
    timed = ({measure.timed_key(c.run("pre_ln")) for c in plan.cells(scale, name)} if shape is None else
             set() if name == "path" or "rates" in exp else {measure.timed_key(plan.Run(exp["objective"], "pre_ln", **shape, steps=0, lr=0, flags=flags))})
    path = assets / "results.json"
    with protocol.claimed(assets / "results.json.lock", wait=True):  # one report at a time: timed on idle cores
        results = protocol.read_results(path)
        if results.get("format") != 3:  # none yet, or an older format: start afresh
            results = dict(format=3, experiments={}, runs=[])
        step_s, timed_now = step_times(name, results, exp, timed)
        runs = tables.result_rows(name, [row for row in rows if row[1] != "so far"], step_s, seed_list[0])
        so_far = tables.result_rows(name, [row for row in rows if row[1] == "so far"], step_s, seed_list[0])
        device = "cuda" if torch.cuda.is_available() else "cpu"
        measured = results["experiments"].get(name, {}).get("measured")  # where its step times were timed
        if timed_now or measured is None:
            measured = dict(date=datetime.date.today().isoformat(), torch=torch.__version__, machine=platform.machine(),
                            threads=torch.get_num_threads(), device=device)
        held = results["experiments"].get(name, {}).get("measurements")  # what it measures beside its runs
        results["experiments"][name] = dict(
            scale=scale, shape=shape, regime=dict(flags or ()), steps=steps_list, seeds=seed_list, grid=plan.GRID,
            top_k=plan.TOP_K, training=plan.TRAINING, measured=measured, unfinished=left_out, so_far=so_far,
            measurements=measurements(name, runs, shape, held))
        results["runs"] = [r for r in results["runs"] if r["experiment"] != name] + runs
        made = report.tables(results)  # before writing: a table that cannot be made must not leave a file that cannot
        assets.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".tmp").write_text(json.dumps(results, indent=1))
        path.with_suffix(".tmp").replace(path)
        report.figures(name, results, assets)  # within the lock: a process reporting at once cannot leave them older
        report.write_report(results, assets)
    for table_experiment, title, markdown in made:
        if table_experiment == name:
            print(f"\n{markdown}")
    reused = sum(bool((protocol.read_log(run) or [{}])[-1].get("restored")) for run, role, _ in rows if role != "so far")
    if reused:
        print(f"\nreproduce: {reused} of these {len(runs)} runs were taken from a committed results.json, not trained here. "
              "Trained again on the machine that made them, with as many threads, runs ended bit for bit the same; "
              "with other threads 0.2-0.5% apart (5% near the edge of stability). Elsewhere each is a fair sample of "
              "its run, not a copy")
    minutes = sum(r["steps"] * r["seconds_per_step"] for r in runs if r["seconds_per_step"]) / 60
    print(f"\nreproduce: {len(runs)} runs" + (f", {minutes:.0f} minutes of training at bench.py's speeds" if minutes else "")
          + f"; tables from {path} in {assets / 'REPORT.md'}, figures in {assets}/")
    if left_out:
        print("reproduce: left out, not finished yet: " + "; ".join(left_out))


def replay(name, scale, configs):
    """--replay: the committed final runs of configs, each trained again and compared, one line each."""
    path = (Path("assets") if scale == "default" else Path("assets") / scale) / "results.json"
    finals = [r for r in protocol.read_results(path).get("runs", []) if r["experiment"] == name and r["role"] == "final"]
    rows = [r for r in finals if r["config"] in configs]
    if not rows:
        raise SystemExit(f"reproduce: error: {path} has no final run of {', '.join(configs)} in --experiment {name} "
                         f"(it has: {', '.join(sorted({r['config'] for r in finals})) or 'none'})")
    for row in sorted(rows, key=lambda r: (plan.seeds(10).index(r["seed"]), r["config"], r["steps"], r["n_layer"])):
        now = protocol.replay(row)
        same = ("bit for bit" if now == row["val_loss"] else "diverged" if now is None else "trained, not diverged"
                if row["val_loss"] is None else f"{100 * (now / row['val_loss'] - 1):+.3f}%")
        print(f"reproduce: {row['name']} ({row['n_layer']}x{row['n_embd']}, {row['steps']} steps, made with "
              f"{row.get('code', {}).get('threads', '?')} thread(s)): committed {row['val_loss']!r}, now {now!r}: {same}", flush=True)


def experiment_list():
    """--help's list of the experiments, each with its question: its module docstring's first sentence
    (where that runs long, up to its colon)."""
    lines = ["experiments (--experiment NAME):"]
    for name, module in MODULES.items():
        first = re.match(r"(.+?[.?])(\s|$)", " ".join(module.__doc__.split()))[1]
        lines.append(f"  {name:14} {first if len(first) <= 150 else first.split(':')[0]}")
    return "\n".join(lines)


def parse_args(argv=None):
    imported = common.import_blocks(argv, "reproduce.py")
    p = argparse.ArgumentParser(prog="reproduce.py", description=__doc__, epilog=experiment_list(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_import_flag(p)
    p.add_argument("--blocks", help="your comparison: comma-separated arms, the first the reference, each a block "
                   "as train.py's --block takes it, optionally with switches as block:flag=value (e.g. "
                   "pre_ln,sas_p,sas:alpha_ff=0,mine); tuned and seeded as the GPT comparison, written to "
                   "out/compare/")
    p.add_argument("--plot", nargs="+", metavar="RUN_DIR", help="train nothing: draw these train.py runs' log.jsonl "
                   "side by side (loss per step and per second, gains) into --plot_out")
    p.add_argument("--plot_out", default="runs.png", help="--plot's figure (default: %(default)s)")
    p.add_argument("--experiment", choices=list(plan.EXPERIMENTS),
                   help="one of those listed below, a module of reproduction/experiments/ (default: clm, the GPT "
                        "comparison)", metavar="NAME")
    p.add_argument("--scale", choices=["quick", "default", "large"], default="default",
                   help="model and run lengths (default: %(default)s)")
    p.add_argument("--quick", action="store_const", dest="scale", const="quick", help="same as --scale quick")
    p.add_argument("--seeds", type=int, help="seeds of every final run (default: 3, 2 with --quick)")
    p.add_argument("--reuse_results", action="store_true",
                   help="take the runs the committed results.json files (assets/) hold instead of training them "
                        "again, when their logs are gone, where this code computes what the code that made them did "
                        "with the same settings and data: how a long experiment goes on in a fresh clone")
    p.add_argument("--report", action="store_true",
                   help="train nothing: the tables and figures from the finished runs (while runs go on "
                        "elsewhere), each config's seconds a step from bench.py (once per shape); they replace the "
                        "experiment's in assets/ (the committed report: assets/REPORT.md)")
    p.add_argument("--replay", metavar="CONFIGS", help="train nothing new: train these configs' (comma-separated) "
                   "committed final runs of the experiment again, first seed first, and compare each final loss with "
                   "the committed one (bit for bit on the kind of CPU, and with the threads, that made it)")
    p.add_argument("--verbose", action="store_true",
                   help="train.py's per-step lines on the terminal too (they are always in each run's train.log); "
                        "without it, one line per run trained")
    args = p.parse_args(argv)
    if args.seeds is not None and args.seeds < 1:
        p.error(f"--seeds {args.seeds} must be >= 1")
    args.seeds = args.seeds or (2 if args.scale == "quick" else 3)
    if args.blocks and args.experiment:
        p.error("--blocks is a comparison of its own, in the GPT comparison's regime: drop --experiment")
    args.experiment = plan.register_arms(args.blocks, imported, args.imports or []) if args.blocks else args.experiment or "clm"
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.plot:
        return figures.plot_runs(args.plot, args.plot_out)
    if args.replay:
        return replay(args.experiment, args.scale, args.replay.split(","))
    shape = plan.scale_points(args.experiment, args.scale)[0]  # a scale the experiment lacks: a clear error now
    for kind in [] if args.report else sorted({c.tokens for c in plan.cells(args.scale, args.experiment)} if shape is None else {shape["tokens"]}):
        protocol.prepare_tokens(kind)
    seed_list = plan.seeds(args.seeds)
    protocol.PROGRESS = protocol.Progress(protocol.planned_runs(args.experiment, args.scale, len(seed_list)), args.verbose)
    if not args.report:
        print(f"reproduce: {args.experiment}, scale {args.scale}, {len(seed_list)} seeds: about {protocol.PROGRESS.total} runs "
              "(those finished or reused are skipped); a line as each run ends", flush=True)
    if args.reuse_results:
        print(f"reproduce: from assets/: {protocol.reuse_results(sorted(Path('assets').glob('**/results.json')))[1]}")
    elif args.scale == "quick" and not args.report and args.experiment in ("clm", "compare"):  # the quick runs committed
        protocol.reuse_baselines(Path("assets/quick/results.json"))
    try:
        left, met = not args.report, None
        while left and met != len(protocol.PROGRESS.met):  # what no other process (sharing out/) is training
            met = len(protocol.PROGRESS.met)
            try:
                left = protocol.experiment(args.experiment, args.scale, seed_list, train_it=True)[1]
            except protocol.Unfinished:
                left = True
        if left:  # then, nothing else left, what the others are training: the report needs it
            protocol.experiment(args.experiment, args.scale, seed_list, train_it="wait")
        # then what is on disk: with it, what another process sharing out/ trained meanwhile
        rows, left_out = protocol.experiment(args.experiment, args.scale, seed_list, train_it=False)
    except protocol.Unfinished as e:
        raise SystemExit(f"reproduce: error: nothing to report yet, {e} not finished; run without --report to train")
    except KeyboardInterrupt:
        raise SystemExit("reproduce: interrupted; run it again to resume")
    if args.experiment == "compare":  # a comparison of one's own: never over the committed assets/
        arms = plan.EXPERIMENTS["compare"]["tuned"]
        name = "_vs_".join(arms) if len("_vs_".join(arms)) <= 120 else (  # a folder name's length is bounded
            f"{arms[0]}_vs_{len(arms) - 1}_arms_{hashlib.sha1(','.join(arms).encode()).hexdigest()[:8]}")
        assets = Path("out/compare") / f"{args.scale}_{name}"
    else:
        assets = Path("assets") if args.scale == "default" else Path("assets") / args.scale
    write_results(args.experiment, args.scale, seed_list, rows, left_out, assets)


if __name__ == "__main__":
    main()
