"""Reuse that cannot be fooled: a committed run stands in for training it again only where
everything that made it is what train.py resolves today (its settings, the data, the probe's
numbers), and a run made by earlier code is migrated from the commit that made it, or reported and
never reused."""

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import reproduce
import simple_gpt
import train
import train_config
from conftest import REPO, tiny_run
from reproduction import migrate, plan, protocol, resolve
from reproduction.test_reproduction import SHAPE, a_run, fake_training

def test_the_probe_sees_what_the_code_computes_not_how_it_is_written(monkeypatch, tmp_path):
    """A refactor (here: the MLP's forward rewritten, an equivalent function) leaves the probe's
    numbers as they were; a change of one number (the initial weights, a block's default gain)
    moves them, and only for the blocks it touches; so do kernels' last bits, but within the
    tolerance (ATEN_CPU_CAPABILITY=default: another machine's vector kernels)."""
    monkeypatch.setattr(plan, "OUT", tmp_path)
    run = lambda config: plan.Run("clm", config, **SHAPE, steps=10, lr=1e-3, flags=(("warmup_frac", 0.2),))
    before = {config: protocol.probe(run(config)) for config in ("pre_ln", "sas_p")}
    same = lambda: {config: protocol.same_numbers(before[config], protocol.probe(run(config))) for config in before}
    with monkeypatch.context() as m:
        m.setattr(simple_gpt.MLP, "forward", lambda self, x: self.c_proj(self.act(x @ self.c_fc.weight.T)))
        assert same() == dict(pre_ln=True, sas_p=True)
    with monkeypatch.context() as m:
        init = simple_gpt.GPT._init_weights
        m.setattr(simple_gpt.GPT, "_init_weights", lambda self, module: (init(self, module), module.weight.data.mul_(1.005)
                                                                          if isinstance(module, nn.Linear) else None))
        assert same() == dict(pre_ln=False, sas_p=False)
    with monkeypatch.context() as m:
        m.setattr(simple_gpt.GPTConfig, "beta_ff_init", property(lambda self: 0.11 * math.sqrt(18 / self.n_layer)))
        assert same() == dict(pre_ln=True, sas_p=False)  # Pre-LN has no beta_FF
    other_isa = subprocess.run([sys.executable, "-c", "import json, sys; from reproduction import plan, protocol; "
                                f"plan.OUT = plan.Path(sys.argv[1]); print(json.dumps(protocol.probe(plan.Run('clm', 'sas_p', **{SHAPE!r}, "
                                "steps=10, lr=1e-3, flags=(('warmup_frac', 0.2),)))))", str(tmp_path)],
                               capture_output=True, text=True, cwd=REPO, check=True,
                               env=dict(os.environ, ATEN_CPU_CAPABILITY="default", MKL_ENABLE_INSTRUCTIONS="SSE4_2"))
    assert protocol.same_numbers(before["sas_p"], json.loads(other_isa.stdout))


def test_quick_runs_are_reused_while_the_code_that_made_them_is_unchanged(monkeypatch, tmp_path, capsys):
    """The hacker's loop: assets/quick's runs stand in for the named blocks' runs where the code
    and data that made each (its code.json) are these; else one line says what changed."""
    monkeypatch.setattr(plan, "OUT", tmp_path / "out")
    fake = fake_training(monkeypatch)
    monkeypatch.setattr(protocol, "train_run", lambda run: (protocol.record_code(run), fake(run))[1])
    monkeypatch.setitem(plan.EXPERIMENTS["clm"]["scales"], "quick", dict(**SHAPE, warmup_frac=0.2, steps=(10,)))
    seeds = plan.seeds(2)
    rows, left_out = protocol.experiment("clm", "quick", seeds, train_it=True)
    reproduce.write_results("clm", "quick", seeds, rows, left_out, tmp_path / "assets")
    results = tmp_path / "assets" / "results.json"
    assert all(set(row["code"]) == {"data", "settings", "probe", "threads"} for row in json.loads(results.read_text())["runs"])
    for f in (tmp_path / "out").glob("*/*/log.jsonl"):  # a fresh clone
        f.unlink()
    monkeypatch.setattr(protocol, "train_run", None)  # nothing trains
    assert protocol.reuse_baselines(results) == len(rows)
    assert capsys.readouterr().out.endswith(f"reproduce: from {results}: {len(rows)} runs taken; only the runs they lack "
                                            "train here\n")
    assert protocol.experiment("clm", "quick", seeds, train_it=True)[0] == rows
    capsys.readouterr()
    reproduce.write_results("clm", "quick", seeds, rows, left_out, tmp_path / "again")
    assert f"{len(rows)} of these {len(rows)} runs were taken from a committed results.json, not trained here" in capsys.readouterr().out

    for f in (tmp_path / "out").glob("*/*/log.jsonl"):
        f.unlink()
    with monkeypatch.context() as m:  # a default changed: the runs of blocks with a beta_FF compute other numbers
        m.setattr(simple_gpt.GPTConfig, "beta_ff_init", property(lambda self: 0.11 * math.sqrt(18 / self.n_layer)))
        moved = sum("beta_ff" in simple_gpt.switches_of(plan.CONFIGS[run.config]["block"]) for run, _, _ in rows)
        assert 0 < moved < len(rows) and protocol.reuse_baselines(results) == len(rows) - moved
        assert capsys.readouterr().out == (f"reproduce: from {results}: {len(rows) - moved} runs taken; {moved} not taken "
                                           "(what the code computes); only the runs they lack train here\n")
    for f in (tmp_path / "out").glob("*/*/log.jsonl"):
        f.unlink()
    monkeypatch.setattr(plan, "TRAINING", dict(plan.TRAINING, eval_tokens=2**14))  # another run, of the same name
    assert protocol.reuse_baselines(results) == 0
    assert f"0 runs taken; {len(rows)} not taken (settings: eval_tokens)" in capsys.readouterr().out
    assert protocol.reuse_baselines(tmp_path / "none.json") == 0  # none committed: nothing to say
    assert capsys.readouterr().out == ""


def committed_row(run):
    """run's results.json row as a run trained now would leave it, its code.json made, not trained."""
    run.folder.mkdir(parents=True, exist_ok=True)
    protocol.record_code(run)
    return dict(name=run.name, objective=run.objective, config=run.config, n_layer=run.n_layer, n_head=run.n_head,
                n_embd=run.n_embd, steps=run.steps, lr=run.lr, seed=run.seed, flags=dict(run.flags), tokens=run.tokens,
                code=json.loads((run.folder / "code.json").read_text()))


def changed_default(m, **defaults):
    """TrainConfig with other defaults, as an edit of train_config.py would leave it."""
    fields = [(name, train_config.TrainConfig.__dataclass_fields__[name].type, value) for name, value in defaults.items()]
    m.setattr(train_config, "TrainConfig", dataclasses.make_dataclass("TrainConfig", fields, bases=(train_config.TrainConfig,)))


@pytest.fixture
def tiny_study(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(plan, "OUT", tmp_path)
    monkeypatch.setattr(plan, "DATASET", "tiny")
    monkeypatch.setattr(plan, "TRAINING", dict(plan.TRAINING, block_size=32, eval_tokens=512, data_dir=str(corpus)))


def test_a_baseline_is_dropped_by_any_change_of_what_makes_its_run_and_kept_by_a_logging_change(tiny_study, corpus, tmp_path,
                                                                                                monkeypatch):
    """The hacker's changes, one at a time: an init (the probe), a default or a trainer's constant
    (its resolved settings) drop the runs they touch; a field added to the log keeps them all."""
    rows = {config: committed_row(a_run(config, steps=8, flags=(("warmup_frac", 0.2),))) for config in ("pre_ln", "sas_p")}
    stale = lambda: {config: protocol.stale(row, {}) for config, row in rows.items()}
    assert stale() == dict(pre_ln=[], sas_p=[])
    with monkeypatch.context() as m:  # beta_FF's initial 0.1 -> 0.102: the blocks that have one
        m.setattr(simple_gpt.GPTConfig, "beta_ff_init", property(lambda self: 0.102 * math.sqrt(18 / self.n_layer)))
        assert stale() == dict(pre_ln=[], sas_p=["what the code computes"])
    for change in (dict(beta2=0.95), dict(grad_clip=0.1)):
        with monkeypatch.context() as m:
            changed_default(m, **change)
            assert stale() == {config: [f"settings: {next(iter(change))}"] for config in rows}
    with monkeypatch.context() as m:
        m.setattr(train, "STALL_LEVEL", 0.10)
        assert stale() == {config: ["settings: STALL_LEVEL"] for config in rows}
    with monkeypatch.context() as m:  # pure logging: one more field in every record
        m.setattr(train, "json", types.SimpleNamespace(dumps=lambda r: json.dumps({**r, "note": 1.5}), loads=json.loads))
        assert stale() == dict(pre_ln=[], sas_p=[])
        train.main(tiny_run(corpus, tmp_path / "logged"))
        assert all(r["note"] == 1.5 for r in protocol.read_records(tmp_path / "logged" / "log.jsonl"))


def test_every_default_a_run_does_not_set_is_in_its_record(tiny_study, monkeypatch):
    """Whatever TrainConfig default an edit changes, the runs that take it are dropped; a default a
    run overrides (its flags, the CPU preset) keeps them."""
    run = a_run("sas_p", steps=8, flags=(("warmup_frac", 0.2),))
    # compile: the device decides; block_settings: what a block of one's own declares, none of the paper's
    row, given = committed_row(run), {*run.settings(), *train_config.CPU_RUN, "causal", "compile", "block_settings"}
    another = dict(norm="layernorm", beta_ff=0.5, mlp_ratio=2, mlp_slope=0.2, alpha_ff=0.5, attention="skipinit",
                   first_value=False, vp="identity", vp_beta=0.5, vp_trainable=True, qk_norm="rmsnorm", logit_cap=30.0,
                   op_beta=0.5, op_trainable=True, objective="mlm", mask_prob=0.15, schedule="cosine", optimizer="muon",
                   muon_lr=1e-2, emb_lr=1e-2, weight_decay=0.05, emb_weight_decay=0.05, beta1=0.8, beta2=0.95,
                   grad_clip=0.5)
    computed = {f.name for f in dataclasses.fields(train_config.TrainConfig)} - set(resolve.NOT_COMPUTED)
    assert set(another) == computed - given  # every default a run takes, changed below
    for name, value in another.items():
        with monkeypatch.context() as m:
            changed_default(m, **{name: value})
            assert protocol.stale(row, {}), name
    for name in sorted(computed & given - {"causal", "dataset", "block_settings"}):  # the run's own value holds
        with monkeypatch.context() as m:
            default = train_config.TrainConfig.__dataclass_fields__[name].default
            changed_default(m, **{name: default * 2 if isinstance(default, (int, float)) and default else "other"})
            assert protocol.stale(row, {}) == [], name


def test_the_probes_clipping_binds_on_some_steps_only(tiny_study, monkeypatch):
    """Clipping that binds on every step is a uniform rescale AdamW ignores: the probe's clip sits
    inside its gradients' norms, so that a change to clipping moves its numbers."""
    norms, clip = [], torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, limit: norms.append(clip(params, limit).item()))
    for config in ("pre_ln", "sas_p", "pre_ln_muon"):
        norms.clear()
        protocol.probe(a_run(config, flags=(("warmup_frac", 0.2),)))
        assert min(norms) < protocol.PROBE["grad_clip"] < max(norms), (config, norms)


def test_a_probed_row_is_migrated_from_the_commit_that_made_it_and_only_by_it(tiny_study):
    """A row the code before resolved settings made (a hash of its flags, every number of its probe's
    log) is reused by nothing, until migrated from its commit: its settings as that commit resolves
    them, today's probe made there; a commit that does not give back its probe did not make it."""
    run = a_run("sas_p", steps=8, flags=(("warmup_frac", 0.2),))
    row = committed_row(run)
    with tempfile.TemporaryDirectory() as out:
        train.main(plan.argv_of({**run.settings(), **migrate.RECORDED_PROBE, "dataset": "text",
                                 "data_dir": str(protocol.probe_text()), "out_dir": out}))
        recorded = protocol.numbers(protocol.read_records(Path(out) / "log.jsonl"), keys=None)
    old = dict(row, code=dict(row["code"], settings=migrate.recorded_hash(run), probe=recorded))
    assert protocol.stale(old, {}) == ["made by earlier code"]
    forged, other = (dict(old, code=dict(old["code"], **change)) for change in (
        dict(probe=[n + 1 for n in recorded]), dict(settings=migrate.recorded_hash(run.again(seed=2)))))
    assert migrate.migrate([old], "HEAD") == 1 and migrate.migrate([old], "HEAD") == 0  # once
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert old["code"] == dict(row["code"], commit=head) and protocol.stale(old, {}) == []
    with pytest.raises(SystemExit, match="does not give back the probe .* recorded: it did not make it"):
        migrate.migrate([forged], "HEAD")
    with pytest.raises(SystemExit, match="recorded other flags than today's plan gives their run"):
        migrate.migrate([other], "HEAD")
    with pytest.raises(SystemExit, match="^migrate: error: no commit nowhere here"):
        migrate.migrate([dict(old, code=dict(other["code"], settings=migrate.recorded_hash(run)))], "nowhere")


def test_migrating_writes_the_report_again(tmp_path, capsys):
    """The report counts the runs that recorded what made them: a migration moves that count."""
    results = tmp_path / "results.json"
    results.write_text(json.dumps(dict(format=3, experiments=dict(clm={}), runs=[dict(experiment="none", code={})])))
    migrate.main(["HEAD", "--experiment", "clm", "--results", str(results)])
    assert "0 of these 1 runs recorded what made them" in (tmp_path / "REPORT.md").read_text()
    assert capsys.readouterr().out.endswith(f"{tmp_path / 'REPORT.md'} written again\n")


def test_reuse_results_restores_only_the_runs_the_reuse_check_accepts(tiny_study, tmp_path):
    run = a_run("sas_p", steps=8, flags=(("warmup_frac", 0.2),))
    checked, earlier = committed_row(run), dict(committed_row(run.again(seed=1)), code={"train.py": "b09d2df46f08"})
    for row in (checked, earlier):
        row.update(experiment="clm", role="final", status="trained", val_loss=2.5, curve=[[8, 2.5]],
                   log=str(protocol.run_of(row).folder / "log.jsonl"))
    (tmp_path / "results.json").write_text(json.dumps(dict(runs=[checked, earlier])))
    assert protocol.reuse_results([tmp_path / "results.json"]) == (1, "1 runs taken; 1 not taken (made by earlier code)")
    assert protocol.finished(run) and not protocol.finished(run.again(seed=1))
