"""
Committed rows made before runs recorded their resolved settings, migrated to the reuse check's
records from the commit that made them: a row whose code.json holds a probe gets its settings as
that commit's train.py resolves them (resolve.py, run in the commit's tree) and today's probe
(PROBE, PROBED) made there, once that tree has given back the probe the row recorded (its numbers:
every number of the log, at the probe of the time): a commit that does not reproduce them did not
make the row. Nothing is retrained. Runs that land from a clone of an older commit are migrated so.

    python -m reproduction.migrate COMMIT --experiment NAME [--results assets/results.json]
"""

import argparse
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from common import read_records
from reproduction import plan, protocol, report
from reproduction.protocol import run_of

# the probe as rows made before recorded it: every number of its log, at this shape, length and rate
RECORDED_PROBE = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=4, max_iters=8, eval_interval=4,
                      log_interval=4, eval_tokens=512, lr=1e-2, seed=1337)


def recorded_hash(run):
    """The hash of run's flags rows made before recorded (their "settings"): where today's plan gives
    the row's run other flags than the row's were, it is not that run."""
    flags = {k: str(v) for k, v in run.settings().items() if k != "out_dir"}
    return hashlib.sha1(json.dumps(flags, sort_keys=True).encode()).hexdigest()[:12]


def tree_of(commit, folder):
    """commit's files, extracted into folder, and its full hash."""
    archive, full = (subprocess.run(["git", *args, commit], capture_output=True, cwd=Path(__file__).resolve().parents[1])
                     for args in (["archive"], ["rev-parse"]))
    if archive.returncode or full.returncode:
        raise SystemExit(f"migrate: error: no commit {commit} here ({archive.stderr.decode().strip()[:200]})")
    tarfile.open(fileobj=io.BytesIO(archive.stdout)).extractall(folder, filter="data")
    return folder, full.stdout.decode().strip()


def logged(tree, settings):
    """The log records of tree's train.py run with settings (its flags)."""
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, "train.py", *plan.argv_of({**settings, "out_dir": out})], cwd=tree,
                              capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{done.stderr[-1500:]}migrate: train.py of the commit failed on a probe (above)")
        return read_records(Path(out) / "log.jsonl")


def migrate(rows, commit):
    """Each row with a probe and no resolved settings, given them and today's probe from commit's
    code (in place); SystemExit where commit does not give back a row's recorded probe."""
    todo = [row for row in rows if "probe" in row.get("code", {}) and not isinstance(row["code"].get("settings"), dict)]
    if not todo:
        return 0
    data = protocol.probe_text().resolve()
    if wrong := [row["name"] for row in todo if row["code"]["settings"] != recorded_hash(run_of(row))]:
        raise SystemExit(f"migrate: error: {len(wrong)} rows (first: {wrong[0]}) recorded other flags than today's plan "
                         "gives their run: migrate them with the plan of their time")
    with tempfile.TemporaryDirectory() as folder:
        tree, commit = tree_of(commit, folder)
        resolved = subprocess.run([sys.executable, str(Path(__file__).with_name("resolve.py").resolve())], cwd=tree,
                                  input=json.dumps([run_of(row).argv() for row in todo]), capture_output=True, text=True)
        if resolved.returncode:
            raise SystemExit(f"{resolved.stderr[-1500:]}migrate: resolving the rows' settings with {commit}'s code failed (above)")
        probes = {}  # by the settings probed: rows that differ only in what a probe sets share one
        for row, settings in zip(todo, json.loads(resolved.stdout)):
            run = run_of(row)
            old = {**run.settings(), **RECORDED_PROBE, "dataset": "text", "data_dir": str(data), "out_dir": None}
            if (old_key := json.dumps(old, sort_keys=True, default=str)) not in probes:
                probes[old_key] = protocol.numbers(logged(tree, old), keys=None)
            if not protocol.same_numbers(row["code"]["probe"], probes[old_key]):
                raise SystemExit(f"migrate: {commit}'s code does not give back the probe {row['name']} recorded: it did not make it")
            key = json.dumps(protocol.probe_settings(run, data), sort_keys=True, default=str)
            if key not in probes:
                probes[key] = protocol.numbers(logged(tree, protocol.probe_settings(run, data)))
            row["code"].update(settings=settings, probe=probes[key], commit=commit)
    return len(todo)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m reproduction.migrate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("commit", help="the commit whose code made the rows (a clone of it trained them)")
    p.add_argument("--experiment", required=True, help="the experiment whose rows it made")
    p.add_argument("--results", default="assets/results.json", help="the results.json (default: %(default)s)")
    args = p.parse_args(argv)
    path = Path(args.results)
    results = protocol.read_results(path)
    experiment = results.get("experiments", {}).get(args.experiment, {})
    rows = [r for r in results.get("runs", []) if r["experiment"] == args.experiment] + experiment.get("so_far", [])
    n = migrate(rows, args.commit)
    path.with_suffix(".tmp").write_text(json.dumps(results, indent=1))
    path.with_suffix(".tmp").replace(path)
    report.write_report(results, path.parent)  # its count of the runs that can stand in for themselves moved
    print(f"migrate: {n} of {len(rows)} rows of {args.experiment} in {path} migrated from {args.commit}; "
          f"{path.parent / 'REPORT.md'} written again")


if __name__ == "__main__":
    main()
