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
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from common import read_records
from reproduction import plan, protocol
from reproduction.protocol import run_of

RECORDED_PROBE = {k: v for k, v in protocol.PROBE.items() if k != "grad_clip"}  # the probe runs recorded before


def tree_of(commit, folder):
    """commit's files, extracted into folder."""
    archive = subprocess.run(["git", "archive", commit], capture_output=True, check=True).stdout
    tarfile.open(fileobj=io.BytesIO(archive)).extractall(folder, filter="data")
    return folder


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
    with tempfile.TemporaryDirectory() as folder:
        tree = tree_of(commit, folder)
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
    print(f"migrate: {n} of {len(rows)} rows of {args.experiment} in {path} migrated from {args.commit}")


if __name__ == "__main__":
    main()
