"""reproduce.py and reproduction/: the tuning protocol on fake outcomes, the report, the locks,
tiny real runs end to end, --blocks (each experiment's own rule: test_experiments.py)."""

import ast
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch

import bench
import prepare_data
import reproduce
import train
import train_config
from conftest import MY_BLOCK, REPO, tiny_run
from reproduction import experiments, measure, plan, protocol, report, tables
from simple_gpt import BLOCKS

# ----------------------------------------------------------------------------- reproduce.py

SHAPE = dict(n_layer=2, n_head=2, n_embd=32)


Outcome = protocol.Outcome


def a_run(config="sas_p", steps=10, **more):
    return plan.Run("clm", config, **SHAPE, steps=steps, lr=1e-3, **more)


def bowl(best, stalls=()):
    """Fake outcomes: loss a parabola in log2(lr) around best; (lr, seed) in stalls stall."""
    def outcome(run, train_it):
        if (run.lr, run.seed) in stalls:
            return Outcome(3.27, "stalled")
        return Outcome(2 + math.log2(run.lr / best) ** 2 + 1 / run.steps + run.seed * 1e-6, "trained")
    return outcome


def test_sweep_grows_the_grid_while_the_best_rate_is_at_an_edge(monkeypatch):
    for best in (0.016, 0.00025):  # above the grid, below it
        monkeypatch.setattr(protocol, "outcome", bowl(best))
        results = protocol.sweep(a_run(), train_it=True)
        grid = list(plan.GRID)
        grown = [grid[-1] * 2, grid[-1] * 4] if best > grid[-1] else [grid[0] / 2, grid[0] / 4, grid[0] / 8]
        assert sorted(results) == sorted(grid + grown)  # one step past the best, to see it is one
        assert min(results, key=lambda lr: results[lr].loss) == pytest.approx(best)
    monkeypatch.setattr(protocol, "outcome", lambda run, train_it: Outcome(-run.lr, "trained"))  # better without end
    assert len(protocol.sweep(a_run(), train_it=True)) == len(plan.GRID) + plan.MAX_EXTRA


def test_an_ablations_grid_grows_once_and_never_past_a_rate_that_does_not_train(monkeypatch):
    monkeypatch.setattr(protocol, "outcome", bowl(0.016))
    assert sorted(protocol.sweep(a_run(), train_it=True, grid=(0.001, 0.002, 0.004), extra=1)) == [
        0.001, 0.002, 0.004, 0.008]
    monkeypatch.setattr(protocol, "outcome", bowl(0.016, stalls={(lr, 1337) for lr in (0.001, 0.002, 0.004)}))
    assert sorted(protocol.sweep(a_run(), train_it=True, grid=(0.001, 0.002, 0.004))) == [0.001, 0.002, 0.004]


def test_a_tuned_rate_must_train_on_every_checked_seed(monkeypatch):
    """The first seed's best two rates stall on the second seed: the next, which trains on both,
    is the tuned rate, and its final runs cover every seed; the stalled runs stay in the rows."""
    monkeypatch.setattr(protocol, "outcome", bowl(0.004, stalls={(0.004, 1), (0.002, 1)}))
    rows, tuned = protocol.tune(a_run(), plan.seeds(3), train_it=True)
    assert tuned == 0.008
    roles = {(run.lr, run.seed): (role, o.status) for run, role, o in rows}
    assert roles[0.004, 1337] == ("sweep", "trained") and roles[0.004, 1] == ("check", "stalled")
    assert {seed for (lr, seed), (role, _) in roles.items() if role == "final"} == {1337, 1, 2}
    assert {lr for (lr, seed) in roles if seed == 1} == {0.004, 0.002, 0.008}  # the best two, then on until one held
    assert [lr for (lr, seed) in roles if seed == 2] == [0.008]
    monkeypatch.setattr(protocol, "outcome", bowl(0.004, stalls={(0.004, 1)}))
    rows, tuned = protocol.tune(a_run(), plan.seeds(3), train_it=True)
    assert tuned == 0.002 and {run.lr for run, _, _ in rows if run.seed == 1} == {0.004, 0.002}  # TOP_K checked


def test_a_tuned_rate_that_stalls_on_a_later_seed_gives_way_to_the_next(monkeypatch):
    monkeypatch.setattr(protocol, "outcome", bowl(0.004, stalls={(0.004, 2)}))
    rows, tuned = protocol.tune(a_run(), plan.seeds(4), train_it=True)
    roles = {(run.lr, run.seed): (role, o.status) for run, role, o in rows}
    assert tuned == 0.002 and roles[0.004, 2] == ("check", "stalled") and (0.004, 3) not in roles
    assert {seed for (lr, seed), (role, _) in roles.items() if role == "final"} == {1337, 1, 2, 3}
    monkeypatch.setattr(protocol, "outcome", bowl(0.004, stalls={(lr, 2) for lr in plan.GRID}))
    rows, tuned = protocol.tune(a_run(), plan.seeds(3), train_it=True)  # no rate trains on every seed
    assert tuned == 0.004 and sum(o.status == "stalled" for run, _, o in rows if run.lr == tuned) == 1


def test_one_seed_is_the_plain_sweep(monkeypatch):
    monkeypatch.setattr(protocol, "outcome", bowl(0.002))
    rows, tuned = protocol.tune(a_run(), plan.seeds(1), train_it=True)
    assert tuned == 0.002 and {run.seed for run, _, _ in rows} == {1337}
    assert sorted(run.lr for run, _, _ in rows) == list(plan.GRID)


def test_experiment_tunes_every_block_at_every_scale_point_on_every_seed(monkeypatch, tmp_path):
    monkeypatch.setattr(plan, "OUT", tmp_path)  # its locks
    monkeypatch.setitem(plan.EXPERIMENTS["clm"]["scales"], "quick", dict(**SHAPE, warmup_frac=0.2, steps=(10, 40)))
    monkeypatch.setattr(protocol, "outcome", bowl(0.004))
    seeds = plan.seeds(2)
    rows, left_out = protocol.experiment("clm", "quick", seeds, train_it=True)
    assert left_out == []
    final = {(run.config, run.steps, run.seed): run.lr for run, role, _ in rows if role == "final"}
    assert final == {(c, s, seed): 0.004 for c in plan.EXPERIMENTS["clm"]["tuned"] for s in (10, 40) for seed in seeds}
    assert {run.flags for run, _, _ in rows} == {(("warmup_frac", 0.2),)}  # every run in the scale's regime
    shared = {(run.config, run.steps, run.seed) for run, role, _ in rows if role == "shared_lr"}
    points = {-1: 40, 0: 10}
    assert shared == {(c, points[p], seed) for c, ps in plan.EXPERIMENTS["clm"]["shared_lr"].items()
                      for p in ps for seed in seeds} - {("pre_ln", 10, 1337), ("pre_ln", 40, 1337)}  # sweep runs already
    assert len(rows) == len({run for run, _, _ in rows})  # each run once


def test_a_reproduction_run_names_its_warmup_whatever_train_py_defaults_to():
    """train.py's CPU default is the study's 20%: a run of the factor study's 5% cells must still get 5%."""
    assert "--warmup_frac" in a_run().argv() and a_run().settings()["warmup_frac"] == 0.05
    assert plan.Cell(**SHAPE, steps=10, warmup_frac=0.2).run("sas").settings()["warmup_frac"] == 0.2
    assert plan.Run("mlm", "sas", **SHAPE, steps=10, lr=1e-3).settings()["warmup_frac"] == 0.75  # BERT's


def test_a_longer_point_tunes_each_block_around_its_rate_at_the_longest_of_steps(monkeypatch, tmp_path):
    monkeypatch.setattr(plan, "OUT", tmp_path)  # its locks
    spec = dict(**SHAPE, steps=(10, 40), longer=(160,))
    monkeypatch.setitem(plan.EXPERIMENTS["clm"]["scales"], "quick", spec)
    best = dict(pre_ln=0.002, sas=0.004, sas_p=0.008)  # where each block's bowl is; at 160 steps half of it
    monkeypatch.setattr(protocol, "outcome", lambda run, train_it: bowl(
        best.get(run.config, 0.002) / (2 if run.steps == 160 else 1))(run, train_it))
    rows, left_out = protocol.experiment("clm", "quick", plan.seeds(3), train_it=True)
    assert left_out == []
    for config, r in best.items():
        at = [(run.lr, run.seed, role) for run, role, _ in rows if run.config == config and run.steps == 160]
        assert sorted(lr for lr, seed, _ in at if seed == 1337) == [r / 4, r / 2, r, 2 * r]  # grown once past an edge
        assert {lr for lr, seed, role in at if role == "final"} == {r / 2}
        assert len(at) == 4 + 2  # the best on the other two seeds: top_k 1

    def sas_at_40_unfinished(run, train_it):
        if run.steps == 40 and run.config == "sas":
            raise protocol.Unfinished(run.folder)
        return bowl(0.002)(run, train_it)

    monkeypatch.setattr(protocol, "outcome", sas_at_40_unfinished)
    rows, left_out = protocol.experiment("clm", "quick", plan.seeds(3), train_it=False)
    final = lambda config: {run.steps for run, role, _ in rows if role == "final" and run.config == config}
    assert final("sas") == {10} and final("pre_ln") == final("sas_p") == {10, 40, 160}  # arm by arm
    assert "the 160-step tuning: sas (from its 40-step tuning)" in left_out


def test_the_factor_study_tunes_every_block_in_every_cell(monkeypatch, tmp_path):
    monkeypatch.setattr(plan, "OUT", tmp_path)  # its locks
    monkeypatch.setattr(protocol, "outcome", bowl(0.004))
    rows, left_out = protocol.experiment("regime", "quick", plan.seeds(2), train_it=True)
    cells = plan.cells("quick")
    assert left_out == [] and len(cells) == 4
    final = {(run.config, run.n_embd, run.steps, dict(run.flags).get("warmup_frac", 0.05), run.seed)
             for run, role, _ in rows if role == "final"}
    assert final == {(c, cell.n_embd, cell.steps, cell.warmup_frac, seed) for c in ("pre_ln", "sas", "sas_p")
                     for cell in cells for seed in (1337, 1)}
    paper_warmup = cells[0].run("sas")  # a cell with train.py's defaults: the GPT comparison's very runs
    assert not paper_warmup.flags and paper_warmup == plan.Run("clm", "sas", 6, 2, 64, 100, 1e-3)
    longer = cells[1].run("sas")
    assert longer.flags == (("warmup_frac", 0.2),) and longer.settings()["warmup_frac"] == 0.2
    assert cells[1].warmup_steps == 20 and "warmup 20% = 20 steps" in cells[1].label
    bpe = plan.Cell(6, 4, 128, 200, tokens="bpe").run("sas")  # the paper's tokens: the main job's data, apart
    assert bpe.settings()["dataset"] == prepare_data.DEFAULT_DATASET and bpe.model_config().vocab_size == 50304
    assert bpe.folder.parent.name == "bpe_6x128_200steps" and bpe.name == bpe.again(tokens="bytes").name
    assert plan.Cell(6, 4, 128, 200, tokens="bpe").label.startswith("BPE 6x128")


def test_a_run_reaches_its_own_final_loss_at_its_last_step():
    run = dict(seed=1, val_loss=2.1234567, curve=[[0, 5.0], [100, 2.5], [200, 2.12346]], seconds_per_step=0.5)
    assert tables.reach_seconds([run], [run]) == "100"  # the curve's loss is rounded above the exact one
    faster = dict(run, curve=[[0, 5.0], [100, 2.0], [200, 1.9]], val_loss=1.9, seconds_per_step=0.25)
    assert tables.reach_seconds([faster], [run]) == f"{0.25 * 100 * (5 - 2.12346) / 3:.0f}"


@pytest.mark.skipif(prepare_data.fcntl is None, reason="no file locks on this platform")
def test_two_processes_share_the_path_and_never_train_one_run_twice(tmp_path):
    lock = tmp_path / "run" / "lock"
    with protocol.claimed(lock, wait=False):  # another process's hold: a second open file
        with pytest.raises(protocol.Unfinished, match="another reproduce.py"):
            with protocol.claimed(lock, wait=False):
                pass
    with protocol.claimed(lock, wait=False):  # released: free again
        pass


def test_two_processes_share_an_arms_runs_and_wait_only_when_nothing_else_is_left(monkeypatch):
    """Tuning, a process trains the runs nobody is training and leaves the arm (Unfinished) where
    it needs another's: in the sweep, the second seed's checks, the other seeds; with nothing else
    left ("wait"), it trains the free ones first and waits for the others' last."""
    run, trained, busy = a_run(), [], set()  # busy: (lr, seed) another process is training

    def outcome(run, train_it):
        if (run.lr, run.seed) in busy and train_it != "wait":
            raise protocol.Unfinished(run.folder)
        trained.append((run.lr, run.seed))  # trained, or waited for
        return bowl(0.0025)(run, train_it)  # 0.002 the best rate, then 0.004, 0.001, 0.008
    monkeypatch.setattr(protocol, "outcome", outcome)
    busy.update({(0.001, 1337), (0.004, 1337)})
    with pytest.raises(protocol.Unfinished):
        protocol.tune(run, plan.seeds(3), True)
    assert trained == [(0.002, 1337), (0.008, 1337)]
    trained.clear()
    busy = {(0.002, 1)}  # the sweep done, the other checks its best rate on the second seed
    with pytest.raises(protocol.Unfinished):
        protocol.tune(run, plan.seeds(3), True)
    assert [lr for lr, seed in trained if seed == 1] == [0.004]  # the next best
    trained.clear()
    busy = {(0.002, 2)}  # the tuned rate on the third seed
    with pytest.raises(protocol.Unfinished):
        protocol.tune(run, plan.seeds(3), True)
    assert (0.002, 2) not in trained
    trained.clear()
    busy = {(0.001, 1337), (0.004, 1337)}
    protocol.tune(run, plan.seeds(3), "wait")
    assert trained[:4] == [(0.002, 1337), (0.008, 1337), (0.001, 1337), (0.004, 1337)]


@pytest.mark.skipif(prepare_data.fcntl is None, reason="no file locks on this platform")
def test_a_process_done_with_its_arms_waits_for_the_others_before_its_report(monkeypatch, tmp_path, capsys):
    """Two processes ending at once each found a run the other was training and both left without
    a report; now what the training passes left is waited for (train_it "wait"), then reported."""
    monkeypatch.setattr(plan, "OUT", tmp_path / "out")
    fake_training(monkeypatch)
    monkeypatch.setitem(plan.EXPERIMENTS["clm"]["scales"], "quick", dict(**SHAPE, warmup_frac=0.2, steps=(10,)))
    run = plan.Run("clm", "sas", **SHAPE, steps=10, lr=1e-3, flags=(("warmup_frac", 0.2),))
    monkeypatch.setattr(reproduce, "write_results", lambda name, scale, seeds, rows, left_out, assets: print(f"report: {left_out}"))
    monkeypatch.setattr(prepare_data, "prepared", lambda meta: dict(tokenizer="bytes"))  # no data to prepare
    monkeypatch.setattr(protocol, "reuse_baselines", lambda path: 0)  # nor committed runs to take
    held, waits = threading.Event(), threading.Event()
    real_lock = prepare_data.locked

    def locked(path, wait=True, waiting=None):
        if wait and waiting:
            waits.set()  # about to wait: the other process may end its arm
        return real_lock(path, wait, waiting)
    monkeypatch.setattr(prepare_data, "locked", locked)

    def other_process():  # trains sas's first run until this process waits for it, as a second process would
        with protocol.claimed(run.folder / "lock", wait=False):
            held.set()
            waits.wait(5)
            time.sleep(0.3)
    other = threading.Thread(target=other_process)
    other.start()
    held.wait(5)
    reproduce.main(["--quick", "--seeds", "2"])
    other.join()
    out = capsys.readouterr().out
    assert "reproduce: waiting for the other process to finish 2x32_10steps sas_lr0.001_warmup_frac0.2_s1337" in out
    assert out.rstrip().endswith("report: []")  # every arm in the report


def test_the_path_tunes_each_ablation_around_its_blocks_rate(monkeypatch, tmp_path):
    monkeypatch.setattr(plan, "OUT", tmp_path)  # its locks
    exp = plan.EXPERIMENTS["path"]
    monkeypatch.setitem(exp["scales"], "quick", dict(**SHAPE, steps=(10,), depth=dict(n_embd=16, n_head=2, layers=(2, 8))))
    monkeypatch.setattr(protocol, "outcome", bowl(0.004))
    rows, left_out = protocol.experiment("path", "quick", plan.seeds(2), train_it=True)
    assert left_out == []
    for config in exp["around"]:  # 3 rates around the block's 0.004 on the first seed, its best on both
        lrs = sorted(run.lr for run, _, _ in rows if run.config == config and run.seed == 1337 and not run.flags)
        assert lrs == [0.002, 0.004, 0.008], config
        assert [run.lr for run, _, _ in rows if run.config == config and run.seed == 1] == [0.004]  # top_k 1
        assert {run.seed for run, role, _ in rows if run.config == config and role == "final"} == {1337, 1}
    depth = {(run.config, run.n_layer) for run, _, _ in rows if run.flags}
    assert depth == {(c, L) for c in exp["depth"]["configs"] for L in (2, 8)}
    sas_deep = next(run for run, _, _ in rows if run.config == "sas" and run.n_layer == 8)
    assert dict(sas_deep.flags) == dict(mlp_ratio=2, beta_ff=round(0.2 * math.sqrt(18 / 8), 4))
    assert sas_deep.model_config().mlp_ratio == 2 and sas_deep.model_config().beta_ff_init == pytest.approx(0.3)
    by_name = {run.config: run for run, _, _ in rows}
    assert by_name["vp_trainable"].model_config().vp_trainable and "--vp_trainable" in by_name["vp_trainable"].argv()
    assert "--no-first_value" in by_name["sas_p_fixed_first_value"].argv()
    assert by_name["sas_p_cosine"].settings()["schedule"] == "cosine"


def test_a_report_leaves_out_what_is_unfinished(monkeypatch):
    monkeypatch.setitem(plan.EXPERIMENTS["clm"]["scales"], "quick", dict(**SHAPE, steps=(10, 40)))
    unfinished = {(40, "sas"), (10, "v_skipinit")}
    trained = bowl(0.002)

    def outcome(run, train_it):
        if (run.steps, run.config) in unfinished:
            raise protocol.Unfinished(run.folder)
        return trained(run, train_it)

    monkeypatch.setattr(protocol, "outcome", outcome)
    seeds = plan.seeds(2)
    rows, left_out = protocol.experiment("clm", "quick", seeds, train_it=False)
    tuned = set(plan.EXPERIMENTS["clm"]["tuned"])
    at_40 = {run.config for run, role, _ in rows if role in ("sweep", "final") and run.steps == 40}
    assert at_40 == tuned - {"sas"}  # the 40-step point without sas's arm
    shared = {(run.config, run.steps) for run, role, _ in rows if role == "shared_lr" and run.config != "pre_ln"}
    assert shared == {("parallel", 40), ("sas_p_nonorm", 40), ("skipless", 10)}
    assert len(left_out) == 2 and "40-step tuning" in left_out[0] and "v_skipinit" in left_out[1]

    def read_log(run):
        o = outcome(run, False)
        return [dict(iter=0, val_loss=5.0, similarity=0.1, gains={}),
                dict(iter=run.steps, val_loss=o.loss, similarity=0.5, gains={})]

    monkeypatch.setattr(protocol, "read_log", read_log)
    runs = tables.result_rows("clm", rows, {(*SHAPE.values(), 16, plan.tokens_of("bytes")[2], 128): {config: 0.1 for config in plan.CONFIGS}}, 1337)
    assert all(r["seconds_per_step"] == 0.1 for r in runs)
    titles = [title for _, title, _ in report.tables(dict(runs=runs))]
    assert titles == ["tuned", "sweep", "stalls", "shared_lr"]
    unfinished |= {(steps, config) for steps in (10, 40) for config in tuned}
    with pytest.raises(protocol.Unfinished):  # no arm finished: nothing to report
        protocol.experiment("clm", "quick", seeds, train_it=False)


def fake_training(monkeypatch):
    """train_run writes a finished log (loss a bowl around lr 0.002) instead of training; returns
    trained(run, loss), which writes one by hand."""
    def trained(run, loss=None):
        loss = bowl(0.002)(run, True).loss if loss is None else loss
        run.folder.mkdir(parents=True, exist_ok=True)
        records = [dict(iter=0, val_loss=5.0, similarity=0.1, gains={}), dict(iter=run.steps, val_loss=loss, similarity=0.5, gains={})]
        (run.folder / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return Outcome(loss, "trained")

    monkeypatch.setattr(protocol, "train_run", trained)
    monkeypatch.setattr(measure, "step_seconds", lambda objective, timed, configs: {c: 0.1 for c in configs})
    monkeypatch.setattr(measure, "similarity_at_init", lambda shape: {})
    monkeypatch.setattr(report, "figures", lambda name, results, assets: None)
    return trained


def test_a_report_shows_the_finished_runs_of_a_point_not_finished(monkeypatch, tmp_path):
    """An arm lands in parts: its finished runs go to the report apart, never into a table."""
    monkeypatch.setattr(plan, "OUT", tmp_path / "out")
    trained, seeds = fake_training(monkeypatch), plan.seeds(2)
    quick = dict(**SHAPE, warmup_frac=0.2, steps=(10,))
    monkeypatch.setitem(plan.EXPERIMENTS["clm"]["scales"], "quick", quick)
    protocol.experiment("clm", "quick", seeds, train_it=True)  # the 10-step point, whole
    monkeypatch.setitem(plan.EXPERIMENTS["clm"]["scales"], "quick", dict(quick, steps=(10, 40)))
    at_40 = plan.Run("clm", "sas", **SHAPE, steps=40, lr=1e-3, flags=(("warmup_frac", 0.2),))
    for run in (at_40.again(lr=0.002), at_40.again(lr=0.004, seed=1), at_40.again(config="sas_p", lr=0.004),
                at_40.again(config="pre_ln"), at_40.again(config="pre_ln", seed=1),  # Pre-LN at 1e-3: shared-rate runs too
                at_40.again(flags=(), lr=0.004), at_40.again(flags=(("batch_size", 64), ("warmup_frac", 0.2))),  # other regimes
                at_40.again(lr=0.004, seed=5)):  # a seed the report does not have
        trained(run, 2.5)
    (at_40.folder / "ckpt.pt").parent.mkdir(parents=True)  # started, not finished
    rows, left_out = protocol.experiment("clm", "quick", seeds, train_it=False)
    assert "the 40-step tuning" in left_out[0]
    reproduce.write_results("clm", "quick", seeds, rows, left_out, tmp_path / "assets")

    results = json.loads((tmp_path / "assets" / "results.json").read_text())
    so_far = {(r["config"], r["lr"], r["seed"]) for r in results["experiments"]["clm"]["so_far"]}
    assert so_far == {("sas", 0.002, 1337), ("sas", 0.004, 1), ("sas_p", 0.004, 1337), ("pre_ln", 0.001, 1337), ("pre_ln", 0.001, 1)}
    assert {r["role"] for r in results["runs"]} == {"sweep", "check", "final", "shared_lr"}
    assert {(r["config"], r["seed"]) for r in results["runs"] if r["steps"] == 40} == {("pre_ln", 1337), ("pre_ln", 1)}
    assert all(r["role"] == "shared_lr" for r in results["runs"] if r["steps"] == 40)  # in no tuning table
    report_text = (tmp_path / "assets" / "REPORT.md").read_text()
    assert "| 2x32 (d_k 16), 16 x 40 steps, warmup 20% = 8 steps | sas | 0.004 | 1 | 2.5000 | trained |" in report_text
    assert report.so_far_table(results["experiments"]["clm"]["so_far"]) in report_text

    for f in (tmp_path / "out").glob("*/*/log.jsonl"):  # a fresh clone: --reuse_results brings them back
        f.unlink()
    assert protocol.restore_logs([tmp_path / "assets" / "results.json"]) == len(results["runs"]) + len(so_far) - 2
    assert protocol.experiment("clm", "quick", seeds, train_it=False)[0] == rows


def test_a_report_shows_the_finished_runs_of_a_cell_not_finished(monkeypatch, tmp_path):
    monkeypatch.setattr(plan, "OUT", tmp_path / "out")
    trained, seeds = fake_training(monkeypatch), plan.seeds(2)
    done, started = dict(**SHAPE, steps=10), dict(**SHAPE, steps=10, warmup_frac=0.2)
    monkeypatch.setitem(plan.EXPERIMENTS["regime"]["scales"], "quick", dict(cells=[done]))
    protocol.experiment("regime", "quick", seeds, train_it=True)
    monkeypatch.setitem(plan.EXPERIMENTS["regime"]["scales"], "quick", dict(cells=[done, started]))
    trained(plan.Cell(**started).run("sas").again(lr=0.004))
    rows, left_out = protocol.experiment("regime", "quick", seeds, train_it=False)
    assert [(run.config, run.lr, dict(run.flags)) for run, role, _ in rows if role == "so far"] == [("sas", 0.004, dict(warmup_frac=0.2))]
    assert len(left_out) == 3 and all("warmup 20%" in what for what in left_out)
    assert {run.steps for run, role, _ in rows if role == "final"} == {10} and not any(run.flags for run, role, _ in rows if role != "so far")


def test_a_committed_run_replays_bit_for_bit(corpus, tmp_path, monkeypatch):
    """--replay: a run trained again from its results.json row ends where it did, to the last bit
    (this machine, these threads); a diverged one diverges again."""
    monkeypatch.setattr(plan, "OUT", tmp_path)
    monkeypatch.setattr(plan, "DATASET", "tiny")
    monkeypatch.setattr(plan, "TRAINING", dict(plan.TRAINING, block_size=32, eval_tokens=512, data_dir=str(corpus)))
    runs = [a_run(config, steps=8) for config in ("pre_ln", "sas")] + [a_run(steps=8).again(lr=math.inf)]
    rows = tables.result_rows("clm", [(run, "final", protocol.outcome(run, train_it=True)) for run in runs], {}, 1337)
    assert [protocol.replay(row) for row in rows] == [rows[0]["val_loss"], rows[1]["val_loss"], None]
    assert rows[0]["val_loss"] != rows[1]["val_loss"]


def test_a_diverged_run_is_recorded_not_fatal(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(plan, "OUT", tmp_path)
    monkeypatch.setattr(plan, "DATASET", "tiny")
    monkeypatch.setattr(plan, "TRAINING", dict(plan.TRAINING, block_size=32, eval_tokens=512, data_dir=str(corpus)))
    fine, diverging = (a_run(steps=8).again(lr=lr) for lr in (1e-3, math.inf))
    assert protocol.outcome(fine, train_it=True).status == "trained"
    assert not (fine.folder / "ckpt.pt").exists() and protocol.read_log(fine)[-1]["iter"] == 8
    assert protocol.outcome(diverging, train_it=True) == Outcome(math.inf, "diverged")
    assert protocol.read_log(diverging)[-1]["diverged"] is True  # the outcome is the log's, not a marker on stdout
    monkeypatch.setattr(subprocess, "Popen", None)  # finished and diverged runs are not trained again
    assert protocol.outcome(diverging, train_it=True).status == "diverged"
    assert protocol.outcome(fine, train_it=False).loss == protocol.read_log(fine)[-1]["val_loss"]
    with pytest.raises(protocol.Unfinished):
        protocol.outcome(a_run("sas", steps=8), train_it=False)
    rows = tables.result_rows("clm", [(run, "sweep", protocol.outcome(run, train_it=False)) for run in (fine, diverging)], {}, 1337)
    table = tables.sweep_table(rows, dict(tuned=(fine.config,)))  # a diverged run is a cell of its tuning table
    assert table.endswith(f"| {rows[0]['val_loss']:.4f} | diverged |")


def test_the_time_left_is_from_the_runs_trained_from_their_start():
    """A resumed run trains only its remainder: its time estimates the rest only until a whole run has."""
    progress, done = protocol.Progress(total=4), Outcome(2.0, "trained")
    assert progress.line(a_run(), done, 600, resumed=True).endswith("| ~30 min left")  # 3 runs of 10 min
    assert progress.line(a_run(seed=1), done, 60).endswith("| ~2 min left")  # 2 of 1 min, not of 5.5


def test_a_trained_run_is_one_line_its_steps_in_its_train_log(corpus, tmp_path, monkeypatch, capsys):
    """Without --verbose a trained run prints one line (how many runs of an estimate, the run, how it
    ended, the time left) and train.py's per-step lines go to the run's train.log only; a finished
    run met again prints nothing; with --verbose the per-step lines are on the terminal too."""
    monkeypatch.setattr(plan, "OUT", tmp_path)
    monkeypatch.setattr(plan, "DATASET", "tiny")
    monkeypatch.setattr(plan, "TRAINING", dict(plan.TRAINING, block_size=32, eval_tokens=512, data_dir=str(corpus)))
    monkeypatch.setattr(protocol, "PROGRESS", protocol.Progress(total=3))
    fine, diverging = (a_run(steps=8).again(lr=lr) for lr in (1e-3, math.inf))
    loss = protocol.outcome(fine, train_it=True).loss
    out = capsys.readouterr().out
    assert re.fullmatch(rf"reproduce: \[1/3\] 2x32_8steps sas_p lr 0.001 seed 1337: {loss:.4f} \| ~\d+ min left\n", out), out
    assert json.loads((fine.folder / "code.json").read_text()) == dict(
        data=protocol.data_fingerprint("tiny"), settings=protocol.settings_of(fine), probe=protocol.probe(fine),
        threads=torch.get_num_threads())
    log = (fine.folder / "train.log").read_text()
    assert "eval 8: val loss" in log and "iter 8/8 | loss" in log  # train.py's per-step lines: in the folder
    protocol.outcome(fine, train_it=True)  # finished: read, not trained, not printed
    assert capsys.readouterr().out == "" and protocol.PROGRESS.met == {fine.folder} and len(protocol.PROGRESS.seconds) == 1
    monkeypatch.setattr(protocol.PROGRESS, "verbose", True)
    protocol.outcome(diverging, train_it=True)
    out = capsys.readouterr().out
    assert out.startswith(f"reproduce: training {diverging.folder}\n") and "  train: error: diverged: " in out
    assert out.splitlines()[-1].startswith("reproduce: [2/3] 2x32_8steps sas_p lr inf seed 1337: diverged | ~")
    assert "train: error: diverged: " in (diverging.folder / "train.log").read_text()
    assert protocol.planned_runs("clm", "default", 3) == 3 * 2 * (4 + 2 + 1) + 2 * 2 + 4 * 3  # tuned arms, shared rate

def test_runs_taken_from_results_json_are_finished_runs_again(corpus, tmp_path, monkeypatch):
    """--reuse_results: a results.json row stands in for its run once its log is gone, with the
    same outcome and the same row when reported again; nothing is trained."""
    monkeypatch.setattr(plan, "OUT", tmp_path / "out")
    monkeypatch.setattr(plan, "DATASET", "tiny")
    monkeypatch.setattr(plan, "TRAINING", dict(plan.TRAINING, block_size=32, eval_tokens=512, data_dir=str(corpus)))
    fine, diverging = (a_run(steps=8).again(lr=lr) for lr in (1e-3, math.inf))
    rows = [(run, "final", protocol.outcome(run, train_it=True)) for run in (fine, diverging)]
    results = tmp_path / "results.json"
    results.write_text(json.dumps(dict(runs=tables.result_rows("clm", rows, {}, 1337))))
    before = json.loads(results.read_text())["runs"]
    for run in (fine, diverging):
        for f in run.folder.iterdir():
            f.unlink()
    assert protocol.restore_logs([results]) == 2 and protocol.restore_logs([results]) == 0
    monkeypatch.setattr(subprocess, "Popen", None)  # nothing is trained
    again = [(run, "final", protocol.outcome(run, train_it=True)) for run in (fine, diverging)]
    assert [o for _, _, o in again] == [o for _, _, o in rows]
    assert tables.result_rows("clm", again, {}, 1337) == before


def test_gaps_are_paired_by_seed_and_verdicts_follow_the_spread():
    base = [dict(seed=s, val_loss=v) for s, v in ((1337, 2.0), (1, 2.2), (2, 1.9))]
    rs = [dict(seed=s, val_loss=v) for s, v in ((1337, 2.02), (1, 2.244), (2, None))]
    gaps = tables.paired_gaps(rs, base)
    assert gaps[:2] == pytest.approx([1.0, 2.0]) and math.isinf(gaps[2])
    assert tables.verdict([1.0, 1.5, 0.2]) == "within 2%; behind on every seed"
    assert tables.verdict([-3.0, -0.5]) == "ahead on every seed"
    assert tables.verdict([-1.0, 2.5]) == "the sign varies by seed"
    assert tables.verdict([1.0]) == "one seed"
    assert tables.spread([1.0, 2.0, 4.5]) == "2.5000 (1.0000 to 4.5000)"
    assert tables.spread([1.0, math.inf]) == "diverged on 1 of 2"


# ----------------------------------------------------------------------------- your block against the paper's

@pytest.fixture
def fresh_arms(monkeypatch, tmp_path):
    """The reproduction's registries (plan.py's) as they are, restored after the test
    (--blocks adds to them); OUT (its snapshots of --import files) in tmp_path."""
    for name in ("CONFIGS", "COLORS", "EXPERIMENTS"):
        monkeypatch.setattr(plan, name, dict(getattr(plan, name)))
    monkeypatch.setattr(plan, "OUT", tmp_path / "out" / "repro")


def test_import_registers_a_block_for_every_script(my_block, fresh_arms):
    assert train_config.parse_args(["--import", my_block, "--block", "mine"])["block"] == "mine"
    assert bench.parse_args(["--import", my_block, "--blocks", "pre_ln,mine:norm=layernorm"]).runs["mine:norm=layernorm"] == (
        "mine", {"norm": "layernorm"})
    args = reproduce.parse_args(["--import", my_block, "--blocks", "pre_ln,mine", "--quick"])
    assert args.experiment == "compare"
    first, arm = plan.EXPERIMENTS["compare"]["tuned"]
    assert first == "pre_ln" and re.fullmatch(r"mine-[0-9a-f]{8}", arm)  # the file's hash: changed code, new runs
    run = plan.Run("clm", arm, 2, 2, 16, 10, 1e-3)
    copy = Path(run.argv()[run.argv().index("--import") + 1])
    assert copy != Path(my_block) and copy.read_text() == MY_BLOCK and run.model_config().block == "mine"
    Path(my_block).write_text(MY_BLOCK + "\n# edited while the comparison runs\n")
    assert copy.read_text() == MY_BLOCK  # the runs import the snapshot: an edit never mixes into them
    reproduce.parse_args(["--import", my_block, "--blocks", "pre_ln,mine", "--quick"])
    assert plan.EXPERIMENTS["compare"]["tuned"][1] != arm  # the edited file: another arm, new runs


@pytest.mark.parametrize("spec, error", [
    ("sass", r"unknown block 'sass' in 'sass'; valid: pre_ln, .*sas_p.*--import FILE"),
    ("sas:alpha=0", r"'alpha=0' in 'sas:alpha=0' is not flag=value with one of train.py's flags .*alpha_ff"),
    ("sas:lr=1e-3", r"is not flag=value"),  # the protocol's to tune, not an arm's
    ("sas:n_layer=3", r"is not flag=value"),  # the scale's
    ("sas:alpha_ff=zero", r"'zero' is not a float"),
    ("sas:norm=batchnorm", r"valid values rmsnorm, layernorm, none"),
    ("pre_ln:alpha_ff=0", r"'pre_ln:alpha_ff=0': alpha_ff applies to v_skipinit, sas, not to pre_ln")])
def test_a_bad_arm_is_one_line(spec, error, fresh_arms):
    with pytest.raises(SystemExit, match=error):
        bench.parse_arm(spec, "test")
    with pytest.raises(SystemExit, match=error):
        reproduce.parse_args(["--blocks", f"pre_ln,{spec}"])


def test_a_hackers_mistake_stops_before_any_run(fresh_arms, tmp_path, capsys, request):
    """A block that fails at a tiny shape (where, in its file), a file that registers no such block,
    --seeds 0: each one line, before anything trains."""
    request.addfinalizer(lambda: BLOCKS.pop("broken", None))  # the block the file registers goes with the test
    broken = tmp_path / "broken.py"
    broken.write_text("from torch import nn\nfrom simple_gpt import BLOCKS\n\n\nclass Broken(nn.Module):\n"
                      "    def __init__(self, config, layer):\n        super().__init__()\n"
                      "        self.proj = nn.Linear(config.n_embd, 3)\n\n    def forward(self, x, cache=None):\n"
                      "        return x + self.proj(x)\n\n\nBLOCKS['broken'] = Broken\n")
    with pytest.raises(SystemExit, match=rf"'broken' fails at a tiny shape \(2 x 16, T 8\), {broken}:11: RuntimeError"):
        reproduce.parse_args(["--import", str(broken), "--blocks", "pre_ln,broken", "--quick"])
    with pytest.raises(SystemExit, match=rf"--import {broken} registered no block 'mine' \(it registered: broken\)"):
        reproduce.parse_args(["--import", str(broken), "--blocks", "pre_ln,mine"])
    with pytest.raises(SystemExit):
        reproduce.parse_args(["--seeds", "0"])
    assert "--seeds 0 must be >= 1" in capsys.readouterr().err


def test_blocks_needs_two_different_arms(fresh_arms, capsys):
    with pytest.raises(SystemExit, match="two arms or more"):
        reproduce.parse_args(["--blocks", "sas_p"])
    for twice in ("sas,sas", "sas_p:none,sas_p:norm=none", "sas:alpha_ff=0,sas:alpha_ff=0.0", "sas_p,sas_p:norm=rmsnorm"):
        with pytest.raises(SystemExit, match="two arms with the settings of"):
            reproduce.parse_args(["--blocks", twice])
    with pytest.raises(SystemExit):
        reproduce.parse_args(["--blocks", "pre_ln,sas", "--experiment", "path"])
    assert "drop --experiment" in capsys.readouterr().err
    assert reproduce.parse_args([]).experiment == "clm"


def test_an_arm_with_a_reproduction_configs_settings_is_that_config(fresh_arms):
    reproduce.parse_args(["--blocks", "pre_ln, sas_p:none,sas:alpha_ff=0,sas:alpha_ff=0.5:mlp_slope=0.2"])
    assert plan.EXPERIMENTS["compare"]["tuned"] == ("pre_ln", "sas_p_nonorm", "sas_no_mlp_skip",
                                                        "sas_alpha_ff0.5_mlp_slope0.2")


def test_any_first_arm_is_the_baseline_of_the_timing(fresh_arms):
    reproduce.parse_args(["--blocks", "sas_p,sas:alpha_ff=0"])
    arms = list(plan.EXPERIMENTS["compare"]["tuned"])
    step_s = measure.step_seconds("clm", (1, 2, 16, 2, plan.tokens_of("bytes")[2], 32), arms)
    assert set(step_s) == set(arms) and all(s > 0 for s in step_s.values())


def test_a_tiny_comparison_writes_its_table_and_figure_and_resumes(corpus, tmp_path, monkeypatch, capsys, fresh_arms):
    """Two arms through the whole protocol, as `reproduce.py --quick --blocks pre_ln,sas:alpha_ff=0`
    runs it (tiny shapes, two rates, one seed): a table and a figure in out/compare/, nothing in
    assets/; run again, it trains nothing."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(plan, "OUT", tmp_path / "out" / "repro")
    monkeypatch.setattr(plan, "DATASET", "tiny")
    monkeypatch.setattr(plan, "TRAINING", dict(plan.TRAINING, block_size=32, eval_tokens=512, data_dir=str(corpus)))
    monkeypatch.setattr(plan, "GRID", (1e-3, 4e-3))
    monkeypatch.setattr(plan, "MAX_EXTRA", 0)
    monkeypatch.setitem(plan.EXPERIMENTS["clm"]["scales"], "quick", dict(n_layer=2, n_head=2, n_embd=16, steps=(8,)))
    argv = ["--quick", "--seeds", "1", "--blocks", "pre_ln,sas:alpha_ff=0"]
    reproduce.main(argv)
    folder = tmp_path / "out" / "compare" / "quick_pre_ln_vs_sas_no_mlp_skip"  # the reproduction's config of it
    report_text = (folder / "REPORT.md").read_text()
    assert "| 8 | sas_no_mlp_skip |" in report_text and "paired gap to pre_ln" in report_text and "s to reach pre_ln's final loss" in report_text
    runs = json.loads((folder / "results.json").read_text())["runs"]
    assert {(r["config"], r["lr"]) for r in runs} == {(c, lr) for c in ("pre_ln", "sas_no_mlp_skip") for lr in (1e-3, 4e-3)}
    assert all(r["seconds_per_step"] > 0 for r in runs)  # bench.py timed each arm, with its switch
    assert not (tmp_path / "assets").exists()
    pytest.importorskip("matplotlib")
    assert (folder / "compare_val_loss.png").stat().st_size > 0 and "compare_val_loss.png" in report_text
    out = capsys.readouterr().out  # one line per run trained, train.py's lines in the runs' train.log
    assert len(re.findall(r"^reproduce: \[\d+/\d+\] 2x16_8steps ", out, re.M)) == 4 and "eval 8:" not in out
    monkeypatch.setattr(subprocess, "Popen", None)  # finished: nothing is trained again
    reproduce.main(argv)
    assert "reproduce: [" not in capsys.readouterr().out


def test_plot_draws_runs_side_by_side(corpus, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    runs = [tmp_path / block for block in ("pre_ln", "sas_p")]
    for run in runs:
        train.main(tiny_run(corpus, run, "--block", run.name))
    out = tmp_path / "side_by_side.png"
    reproduce.main(["--plot", *map(str, runs), "--plot_out", str(out)])
    assert out.stat().st_size > 0 and "2 runs plotted" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match=r"--plot .*empty: no log.jsonl"):
        reproduce.main(["--plot", str(runs[0]), str(tmp_path / "empty")])


def test_a_results_json_that_is_not_json_is_one_line_naming_it(tmp_path):
    cut = tmp_path / "assets" / "results.json"
    cut.parent.mkdir()
    cut.write_text('{"format": 3, "runs": [{"name": "pre_')  # cut by a crash
    with pytest.raises(SystemExit, match=rf"{re.escape(str(cut))} is not JSON .* git checkout -- {re.escape(str(cut))}$"):
        protocol.restore_logs([cut])
    assert protocol.read_results(tmp_path / "none.json") == {}
    older = tmp_path / "older.json"  # written before experiments had measurements(): clm's at the top
    older.write_text(json.dumps(dict(format=3, experiments=dict(clm={}), runs=[], similarity_at_init=dict(pre_ln=[0.5]))))
    assert protocol.read_results(older) == dict(format=3, experiments=dict(clm=dict(measurements=dict(
        similarity_at_init=dict(pre_ln=[0.5])))), runs=[])


def test_measurements_that_cannot_be_made_now_keep_the_last_ones(monkeypatch, capsys):
    """--report without the data (say): an experiment's measurements beside its runs stay as they were."""
    def unprepared(runs, shape, held):
        raise SystemExit("train: error: dataset data/x is not prepared")
    monkeypatch.setattr(experiments.MODULES["muon_rates"], "measurements", unprepared)
    assert reproduce.measurements("muon_rates", [], None, dict(runs={})) == dict(runs={})
    assert "muon_rates's measurements beside its runs not made now (train: error: dataset" in capsys.readouterr().out
    assert reproduce.measurements("compare", [], None, None) == {}  # --blocks' experiment: no module, nothing measured


def test_a_stalled_runs_log_reads_as_stalled_and_reproduce_says_a_bad_import_in_one_line(tmp_path):
    records = [dict(iter=0, val_loss=5.0), dict(iter=100, val_loss=4.9, stalled=True)]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert protocol.finished(types.SimpleNamespace(folder=tmp_path, steps=100)) == protocol.Outcome(4.9, "stalled")
    (tmp_path / "bad.py").write_text("from simple_gpt import BLOCKS\n\nBLOCKS['x'] = undefined_name\n")
    with pytest.raises(SystemExit, match=r"--import .*bad.py failed at line 3: NameError: name 'undefined_name'"):
        reproduce.parse_args(["--import", str(tmp_path / "bad.py")])


# ----------------------------------------------------------------------------- the study as a layer

def test_a_report_keeps_the_step_times_results_json_holds_and_times_only_a_new_shape(monkeypatch):
    """A report beside training would read slow steps: a shape every config of the experiment was timed
    at keeps its times (another experiment's, maybe of other code, are not taken)."""
    timed = []
    monkeypatch.setattr(measure, "step_seconds", lambda objective, key, configs: timed.append(key) or {c: 9.0 for c in configs})
    exp, run = plan.EXPERIMENTS["durability"], a_run("pre_ln", tokens="bpe4096")
    key = measure.timed_key(run)
    shape = dict(n_layer=run.n_layer, n_head=run.n_head, n_embd=run.n_embd, batch_size=key[3], tokens="bpe4096",
                 block_size=key[5])
    row = lambda config, s, experiment="durability": dict(shape, experiment=experiment, config=config, seconds_per_step=s)
    held = dict(runs=[row("pre_ln", 1.5), row("sas", 1.4), row("sas_p", 1.3), row("sas", 7.0), row("sas_p", 5.0, "muon")])
    assert reproduce.step_times("durability", held, exp, {key}) == ({key: {"pre_ln": 1.5, "sas": 1.4, "sas_p": 1.3}}, False)
    assert timed == []
    held["runs"].pop(0)  # a config this experiment never timed there: every config timed again, together
    assert reproduce.step_times("durability", held, exp, {key}) == ({key: {"pre_ln": 9.0, "sas": 9.0, "sas_p": 9.0}}, True)
    assert timed == [key]


def test_an_experiment_is_a_module_and_adding_one_is_adding_a_file(tmp_path):
    """Every module of reproduction/experiments/ is an --experiment with its rule in its docstring; a new
    file is a new experiment, its own tables in the report, registered nowhere else."""
    listed = reproduce.experiment_list()  # --help's, each with its question
    for name, module in experiments.MODULES.items():
        assert plan.EXPERIMENTS[name] is module.EXPERIMENT and len(module.__doc__) > 100, name
        assert re.search(rf"^  {name} +{re.escape(' '.join(module.__doc__.split())[:20])}", listed, re.M), name
    copy = tmp_path / "reproduction"
    subprocess.run(["cp", "-r", str(REPO / "reproduction"), str(copy)], check=True)
    (copy / "experiments" / "mine.py").write_text('"""Mine: a question and its rule."""\n\n'
                                                  'EXPERIMENT = dict(objective="clm", flags={}, tuned=("pre_ln", "sas"), scales={})\n\n\n'
                                                  'def tables(runs, exp, results):\n    return [("mine", tables, f"{len(runs)} runs")]\n')
    code = ("from reproduction import plan, report; print(sorted(plan.EXPERIMENTS['mine']['tuned']), "
            "report.tables(dict(runs=[dict(experiment='mine')] * 3)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"})
    assert out.stdout.strip() == "['pre_ln', 'sas'] [('mine', 'mine', '3 runs')]", out.stderr


def test_the_core_never_imports_the_study():
    """The card's files (the model, the trainer, the data, the benchmark, the sampler) import nothing
    of reproduce.py or reproduction/: the study leans on the core, never the other way."""
    for path in sorted(REPO.glob("*.py")):
        if path.name.startswith(("test_", "reproduce", "conftest")):
            continue
        tree = ast.parse(path.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m for m in imported if m.split(".")[0] in ("reproduction", "reproduce")}, path.name


def test_muons_two_rates_are_tuned_together_on_a_grid_of_pairs_grown_past_its_edges(monkeypatch):
    """Every pair on the first seed, each axis grown by factors of 2 while the best pair is at its
    edge, then the protocol's seeds on pairs; a pair's run trains with --muon_lr and --lr."""
    def bowl2(run, train_it):  # around Muon's 0.032 and AdamW's 0.004: past both edges of the grid
        muon_lr = dict(run.flags)["muon_lr"]
        return Outcome(3 + math.log2(muon_lr / 0.032) ** 2 + 0.5 * math.log2(run.lr / 0.004) ** 2 + 0.01 * run.seed, "trained")

    monkeypatch.setattr(protocol, "outcome", bowl2)
    grid = (("muon_lr", (4e-3, 8e-3, 1.6e-2)), ("lr", (8e-3, 1.6e-2)))
    rows, tuned = protocol.tune(a_run("sas_p_muon"), plan.seeds(3), True, grid=grid)
    assert tuned == (("muon_lr", 0.032), ("lr", 0.004))
    first = {(dict(r.flags)["muon_lr"], r.lr) for r, role, _ in rows if r.seed == 1337}
    assert first == {(m, lr) for m in (4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2) for lr in (2e-3, 4e-3, 8e-3, 1.6e-2)}
    finals = [r for r, role, _ in rows if role == "final"]
    assert [r.seed for r in finals] == [1, 2, 1337] and {(dict(r.flags)["muon_lr"], r.lr) for r in finals} == {(0.032, 0.004)}
    assert len([role for _, role, _ in rows if role == "check"]) == 1  # the second best pair, on the second seed
    settings = protocol.at_rates(a_run("sas_p_muon"), tuned).settings()
    assert (settings["muon_lr"], settings["lr"], settings["optimizer"]) == (0.032, 0.004, "muon")
    exp = plan.EXPERIMENTS["muon_rates"]  # its arms' grid: the same for every Muon arm, counted in its estimate
    assert set(exp["pairs"]["configs"]) <= set(exp["tuned"]) and protocol.planned_runs("muon_rates", "default", 3) == 3 * 19 + 3 * 7


def test_an_unfinished_pair_search_shows_a_one_rate_run_on_its_axes_as_grown(monkeypatch, tmp_path):
    """emb_lr's so-far rows: every finished pair, and a one-rate run where it is a pair of the first
    seed's grid, its axes grown by the pairs finished (SAS's body past 8e-3: 1.6e-2), no other."""
    from reproduction.experiments import emb_lr
    monkeypatch.setattr(plan, "OUT", tmp_path)
    run = emb_lr.run_in(emb_lr.MAIN, "sas")
    pairs = [(1.6e-2, 8e-3), (8e-3, 3.2e-2)]
    for r in [protocol.at_rates(run, (("lr", lr), ("emb_lr", emb))) for lr, emb in pairs] + [
            run.again(lr=lr) for lr in (1.6e-2, 3.2e-2)]:  # one rate at the grown 1.6e-2, and at 3.2e-2: off the body's axis
        r.folder.mkdir(parents=True)
        (r.folder / "log.jsonl").write_text(json.dumps(dict(iter=r.steps, val_loss=2.5)) + "\n")
    rows, left_out = emb_lr.search("default", plan.seeds(3), False)
    shown = sorted((r.lr, dict(r.flags).get("emb_lr", r.lr)) for r, role, _ in rows)
    assert shown == [(8e-3, 3.2e-2), (1.6e-2, 8e-3), (1.6e-2, 1.6e-2)] and {role for _, role, _ in rows} == {"so far"}


def test_the_finished_runs_of_a_pair_arm_not_finished_are_its_pairs_only(monkeypatch, tmp_path):
    """A Muon arm tuned on pairs shows its pairs' finished runs, never the single-rate runs beside
    them in the same folder (the muon experiment's), and a single-rate arm the other way round."""
    monkeypatch.setattr(plan, "OUT", tmp_path)
    run = a_run("sas_p_muon", steps=10, flags=(("warmup_frac", 0.2),))
    grid = plan.EXPERIMENTS["muon_rates"]["pairs"]["grid"]
    pair, single = protocol.at_rates(run, (("muon_lr", 0.008), ("lr", 0.032))), run.again(lr=0.008, seed=1)
    assert pair.name == "sas_p_muon_lr0.008_adamw_lr0.032_warmup_frac0.2_s1337"  # each rate after its optimizer's name
    for r in (pair, single):
        r.folder.mkdir(parents=True)
        (r.folder / "log.jsonl").write_text(json.dumps(dict(iter=10, val_loss=2.5)) + "\n")
    assert [r for r, _, _ in protocol.finished_so_far(run, plan.seeds(2), grid)] == [pair]
    assert [r for r, _, _ in protocol.finished_so_far(run, plan.seeds(2))] == [single]
