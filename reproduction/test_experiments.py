"""Each experiment's rule and tables (reproduction/experiments/), on made-up rows: what it decides
from the runs it is given, and the runs it asks for."""

import json
import math
import statistics

import numpy as np
import pytest
import torch

import reproduce
import train_config
from conftest import committed
from reproduction import experiments, measure, plan, protocol, report, tables
from reproduction.experiments.muon_rates import SHAPED
from reproduction.plan import cell_of
from reproduction.test_reproduction import Outcome, a_run, bowl
from simple_gpt import BLOCKS, GPT, GPTConfig


@pytest.fixture(autouse=True)
def blocks_as_they_were():
    """A block a test's runs import (pre_ln_zero) leaves BLOCKS with the test: no later test sees it."""
    before = dict(BLOCKS)
    yield
    BLOCKS.clear()
    BLOCKS.update(before)


def regime_row(cell, config, seed, status="trained", loss=2.0):
    run = cell.run(config)
    return dict(n_layer=run.n_layer, n_head=run.n_head, n_embd=run.n_embd, steps=run.steps, flags=dict(run.flags),
                batch_size=cell.batch_size, tokens=cell.tokens, block_size=cell.block_size, config=config, seed=seed,
                role="final", status=status, lr=1e-3, val_loss=loss, seconds_per_step=0.1, params=10**6)


def test_the_muon_rules_compare_each_block_to_pre_ln_under_its_own_optimizer(tmp_path):
    """A shaped block keeps its verdict under Muon if its gap to Pre-LN with Muon is on the side its
    gap with AdamW is, on every seed; Pre-LN with Muon ahead of Pre-LN with AdamW is the sanity check."""
    exp, cell = plan.EXPERIMENTS["muon"], plan.Cell(6, 4, 128, 400, warmup_frac=0.2, tokens="bpe4096")
    loss = dict(pre_ln=2.8, sas=2.6, sas_p=2.65, pre_ln_muon=2.7, sas_muon=2.6, sas_p_muon=2.8)
    rows = lambda: [regime_row(cell, config, seed, loss=loss[config] * (1 + 0.01 * k)) for config in exp["tuned"]
                    for k, seed in enumerate((1337, 1, 2))]  # each seed's batches as hard for every arm
    table = experiments.muon.muon_table(rows(), exp)
    assert "| sas | -7.1% (-7.1% to -7.1%) | -3.7% (-3.7% to -3.7%) | yes |" in table
    assert "| sas_p | -5.4% (-5.4% to -5.4%) | +3.7% (+3.7% to +3.7%) | no: behind on every seed |" in table
    assert "Muon set up well: ahead on every seed" in table
    loss["pre_ln_muon"] = 2.9  # Muon worse than AdamW for Pre-LN: suspect, whatever the blocks do
    assert "Muon suspect (behind on every seed)" in experiments.muon.muon_table(rows(), exp)
    assert "| sas | not finished |" in experiments.muon.muon_table([r for r in rows() if r["config"] != "sas_muon"], exp)
    loss.update(pre_ln_muon=2.7, sas_muon=2.69)  # -0.4%: within 2% is still a side, that of every seed
    assert "| sas | -7.1% (-7.1% to -7.1%) | -0.4% (-0.4% to -0.4%) | yes |" in experiments.muon.muon_table(rows(), exp)
    varied = [dict(r, val_loss=2.9) if (r["config"], r["seed"]) == ("sas", 2) else r for r in rows()]
    assert "| sas | -4.2% (-7.1% to +1.5%) | -0.4% (-0.4% to -0.4%) | no verdict to keep: the sign varies by seed |" in (
        experiments.muon.muon_table(varied, exp))
    diverged = [dict(r, val_loss=None, status="diverged") if (r["config"], r["seed"]) == ("pre_ln_muon", 1) else r
                for r in rows()]
    table = experiments.muon.muon_table(diverged, exp)
    assert "| n/a: pre_ln_muon diverged |" not in table and "no: n/a: pre_ln_muon diverged |" in table  # never a "yes"
    assert "Muon suspect (n/a: pre_ln_muon diverged)" in table
    gains = [[0, {}], [400, dict(beta_ff=[0.1, 0.3], alpha=[1.0, 0.8], value_beta_over_alpha=[0.5])]]
    logged = [dict(r, gains=gains) if (r["config"], r["seed"]) == ("sas_p_muon", 1337) else r for r in rows()]
    assert "| beta_ff 0.2, alpha 0.9 |" in experiments.muon.muon_table(logged, exp)  # the mean over layers, Fig. 4's gains apart
    logged = [dict(r, experiment="muon", curve=[[0, 10.0], [400, r["val_loss"]]]) for r in rows()]
    assert ("muon", "muon", experiments.muon.muon_table(rows(), exp)) in report.tables(dict(runs=logged))
    report.write_report(dict(runs=logged, experiments={}), tmp_path)  # in the report, with its caption
    assert "## muon: muon\n\nThe optimizer as a factor" in (tmp_path / "REPORT.md").read_text()
    pytest.importorskip("matplotlib")
    report.figures("muon", dict(runs=logged), tmp_path)  # each block with AdamW, and beside it with Muon
    assert (tmp_path / "muon_val_loss.png").stat().st_size > 0 and (tmp_path / "muon_lr_sweep.png").exists()


def test_the_durability_rule_asks_for_the_lead_on_every_seed_at_4x_the_length(tmp_path):
    """The lead holds if a shaped block is ahead on every seed at the longer length; it grows (shrinks)
    if its gap there is below (above) the shorter one's on every seed. Its shorter runs are the
    factor study's in --quick's cell."""
    exp = plan.EXPERIMENTS["durability"]
    shape, flags, steps = plan.scale_points("durability", "default")
    quick = plan.Cell(**plan.QUICK_CANDIDATES[0])
    assert quick.run("sas").folder == plan.Run("clm", "sas", **shape, steps=steps[0], lr=1e-3, flags=flags).folder
    assert steps == (400, 1600) and quick.steps == 400
    loss = {(400, "pre_ln"): 3.0, (400, "sas"): 2.85, (400, "sas_p"): 2.9,
            (1600, "pre_ln"): 2.5, (1600, "sas"): 2.3, (1600, "sas_p"): 2.45}
    rows = lambda: [regime_row(plan.Cell(6, 4, 128, n, warmup_frac=0.2, tokens="bpe4096"), config, seed,
                               loss=loss[n, config] * (1 + 0.01 * k))
                    for n in (400, 1600) for config in exp["tuned"] for k, seed in enumerate((1337, 1, 2))]
    table = experiments.durability.durability_table(rows(), exp)
    assert "| sas | -5.0% (-5.0% to -5.0%) | -8.0% (-8.0% to -8.0%) | -5.0% then -8.0%, " in table
    assert table.count("holds and grows") == 1 and "| sas_p | -3.3% (-3.3% to -3.3%) | -2.0%" in table
    assert "| holds and shrinks |" in table
    loss[1600, "sas_p"] = 2.55  # behind at 1,600 steps
    assert "| does not hold: behind on every seed |" in experiments.durability.durability_table(rows(), exp)
    varied = [dict(r, val_loss=2.75) if (r["config"], r["seed"], r["steps"]) == ("sas", 2, 400) else r for r in rows()]
    assert "| sas | -6.7% (-10.1% to -5.0%) | -8.0% (-8.0% to -8.0%) |" in experiments.durability.durability_table(varied, exp)
    assert "-10.1% then -8.0%, -5.0% then -8.0% | holds, about its size |" in experiments.durability.durability_table(varied, exp)
    unfinished = [r for r in rows() if (r["config"], r["steps"]) != ("sas", 1600) or r["seed"] == 1337]
    assert "| sas | not finished |" in experiments.durability.durability_table(unfinished, exp)
    diverged = [dict(r, val_loss=None, status="diverged") if (r["config"], r["seed"], r["steps"]) == ("pre_ln", 1, 1600)
                else r for r in rows()]
    assert experiments.durability.durability_table(diverged, exp).count("n/a: a run diverged") == 2  # never a verdict
    logged = [dict(r, experiment="durability", curve=[[0, 10.0], [r["steps"], r["val_loss"]]]) for r in rows()]
    report.write_report(dict(runs=logged, experiments={}), tmp_path)  # in the report, with its caption
    assert "## durability: durability\n\nThe lead at 4x the length" in (tmp_path / "REPORT.md").read_text()


def test_pre_ln_zero_is_pre_ln_started_as_the_identity_and_its_runs_import_it(monkeypatch, tmp_path):
    run = plan.cells("default", "identity")[0].run("pre_ln_zero")
    assert run.argv()[run.argv().index("--import") + 1] == "reproduction/zero_init.py"
    assert run.model_config().block == "pre_ln_zero"  # the report's process registers it from the run's --import
    torch.manual_seed(0)
    model = GPT(GPTConfig(block="pre_ln_zero", n_layer=2, n_head=2, n_embd=32, vocab_size=64, block_size=16))
    x = torch.randn(2, 8, 32)
    assert all(torch.equal(block(x), x) for block in model.transformer.h)  # adds nothing to the stream at init
    model(torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8)))[1].backward()
    assert model.transformer.h[0].attn.c_proj.weight.grad.abs().sum() > 0  # and trains from there
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in GPT(GPTConfig(block="pre_ln", n_layer=2, n_head=2, n_embd=32, vocab_size=64, block_size=16)).parameters())
    train_config.TrainConfig(**{k: v for k, v in run.settings().items() if k != "import"})  # every other setting is train.py's
    monkeypatch.setattr(plan, "OUT", tmp_path)  # its locks
    monkeypatch.setattr(protocol, "outcome", bowl(0.004))
    rows, left_out = protocol.experiment("identity", "default", plan.seeds(3), train_it=True)
    final = {(run.config, run.tokens, run.steps, run.seed) for run, role, _ in rows if role == "final"}
    assert left_out == [] and final == {(c, tokens, steps, seed) for c in plan.EXPERIMENTS["identity"]["tuned"]
                                        for tokens, steps in (("bpe4096", 400), ("bytes", 800)) for seed in (1337, 1, 2)}


def test_the_identity_rule_asks_pre_ln_zero_for_half_of_sass_lead_on_tokens_and_less_on_bytes(tmp_path):
    """Starting as the identity is how the shaped blocks lead on tokens if pre_ln_zero is ahead of
    pre_ln on every seed there and closes half of SAS's lead; why the tokens matter if, besides, it
    gains at most half as much on bytes."""
    exp = plan.EXPERIMENTS["identity"]
    tokens, byte = plan.cells("default", "identity")
    gaps = {tokens: dict(sas=-0.06, sas_p=-0.05, pre_ln_zero=-0.04), byte: dict(sas=0.01, sas_p=0.06, pre_ln_zero=-0.01)}
    per_seed = lambda gap: gap if isinstance(gap, tuple) else (gap,) * 3
    rows = lambda: [regime_row(c, config, seed, loss=2.0 * (1 + per_seed(gaps[c].get(config, 0))[k]))
                    for c in gaps for config in exp["tuned"] for k, seed in enumerate((1337, 1, 2))]
    table = experiments.identity.identity_table(rows(), exp)
    assert f"| {tokens.label} | 0.001 | 0.001, -6.0% (-6.0% to -6.0%) | 0.001, -5.0%" in table
    assert table.endswith("it closes 67% of SAS's lead), and why the tokens matter: on bytes it gains at most half as much.")
    gaps[byte]["pre_ln_zero"] = -0.03
    assert experiments.identity.identity_table(rows(), exp).endswith("not why the tokens matter: on bytes it gains more than half as much.")
    gaps[tokens]["pre_ln_zero"] = -0.02  # a third of SAS's lead
    assert experiments.identity.identity_table(rows(), exp).endswith("is not how the shaped blocks lead on tokens (it closes 33% of SAS's lead, under half).")
    gaps[tokens]["pre_ln_zero"] = (-0.06, -0.05, 0.01)  # half on average, but behind on a seed
    assert experiments.identity.identity_table(rows(), exp).endswith("(not ahead on every seed).")
    assert experiments.identity.identity_table([r for r in rows() if r["config"] != "pre_ln_zero"], exp).endswith("not finished.")
    gaps[tokens]["sas"] = (-0.06, -0.05, 0.01)
    assert experiments.identity.identity_table(rows(), exp).endswith("there is no lead to explain.")
    stalled = [dict(r, status="stalled") if (r["config"], r["seed"], r["tokens"]) == ("pre_ln_zero", 2, "bytes") else r for r in rows()]
    assert experiments.identity.identity_table(stalled, exp).endswith("no verdict (a run stalled or diverged).")
    logged = [dict(r, experiment="identity", curve=[[0, 10.0], [r["steps"], r["val_loss"]]], lr_curve=None) for r in rows()]
    report.write_report(dict(runs=logged, experiments={}), tmp_path)  # in the report, with its caption
    assert "## identity: identity\n\nStarting as the identity: Pre-LN with its output" in (tmp_path / "REPORT.md").read_text()


def test_the_rule_picks_the_most_paper_like_regime_that_trains_never_the_best_gap():
    Cell = plan.Cell
    deep_5, deep_20 = Cell(12, 4, 128, 200), Cell(12, 4, 128, 200, warmup_frac=0.2)
    wide_5, wide_20 = Cell(6, 4, 256, 200), Cell(6, 4, 256, 200, warmup_frac=0.2)
    deep_20_long, batch_64 = Cell(12, 4, 128, 800, warmup_frac=0.2), Cell(12, 4, 128, 200, 64, 0.2)
    exp = plan.EXPERIMENTS["regime"]
    # sas far behind in the wide cells, level in the deep ones: gaps play no part
    rows = lambda cells, stalled=(): [regime_row(c, config, seed, "stalled" if (c, config, seed) in stalled else "trained",
                                                 2.5 if config == "sas" and c.n_embd == 256 else 2.0)
                                      for c in cells for config in exp["tuned"] for seed in (1337, 1, 2)]
    every = [deep_5, deep_20, wide_5, wide_20, deep_20_long, batch_64]
    assert experiments.regime.chosen_regime(rows(every), exp)[0] == [wide_20]
    assert experiments.regime.chosen_regime(rows(every, {(wide_20, "sas_p", 2)}), exp)[0] == [wide_5]  # a stall rules it out
    assert experiments.regime.chosen_regime(rows(every, {(wide_20, "pre_ln", 1), (wide_5, "sas", 1)}), exp)[0] == [
        deep_20, deep_20_long]  # a regime holds every length it ran at
    assert experiments.regime.chosen_regime(rows(every, {(deep_20_long, "sas", 2), (wide_20, "sas", 1), (wide_5, "sas", 1)}),
                                            exp)[0] == [deep_5]  # ... and a stall at one length rules out all of it
    assert experiments.regime.chosen_regime(rows([deep_5, batch_64], {(deep_5, "sas", 1)}), exp)[0] is None  # batch 64: no candidate
    assert experiments.regime.chosen_regime(rows([deep_5, wide_20])[:-1], exp)[0] == [deep_5]  # wide_20 lacks a seed: unfinished
    # the paper's tokens rank first: a BPE regime at the main job's d_k 32 before bytes at the paper's proportions
    bpe, bpe_wide = Cell(6, 4, 128, 200, warmup_frac=0.2, tokens="bpe"), Cell(6, 4, 256, 200, warmup_frac=0.2, tokens="bpe")
    assert experiments.regime.chosen_regime(rows(every + [bpe]), exp)[0] == [bpe]
    assert experiments.regime.chosen_regime(rows(every + [bpe, bpe_wide]), exp)[0] == [bpe_wide]  # then the proportions
    assert experiments.regime.chosen_regime(rows(every + [bpe], {(bpe, "sas", 1)}), exp)[0] == [wide_20]  # and it must train
    short = Cell(6, 4, 256, 200, warmup_frac=0.2, tokens="bpe", block_size=64)  # a control of the text covered
    assert experiments.regime.chosen_regime(rows([short, deep_5]), exp)[0] == [deep_5]


def test_the_vocabulary_table_has_every_vocabulary_of_the_comparisons_cell_finished_or_not():
    """The comparison's cell by vocabulary, 257 to 50K, and at T 64: the finished ones with their
    gaps, the study's others said to be unfinished; the embedding's share from the model itself."""
    Cell, exp = plan.Cell, plan.EXPERIMENTS["regime"]
    bpe, byte = (Cell(6, 4, 256, 800, warmup_frac=0.2, tokens=tokens) for tokens in ("bpe", "bytes"))
    loss = dict(pre_ln=2.5, sas=2.4, sas_p=2.6)
    rows = [regime_row(c, config, seed, loss=loss[config]) for c in (bpe, byte) for config in exp["tuned"]
            for seed in (1337, 1, 2)]
    table, verdicts = experiments.regime.vocabulary_table(rows, exp).split("\n\n")
    table = table.splitlines()[2:]
    assert [line.split(" | ")[1] for line in table] == ["320", "4,160", "16,448", "50,304", "50,304"]
    assert table[0].startswith(f"| {byte.label} | 320 | 2% | 0.001 | 0.001, -4.0% (-4.0% to -4.0%) | 0.001, +4.0%")
    assert table[3].startswith(f"| {bpe.label} | 50,304 | 73% | 0.001 |")
    assert "T 64" in table[4] and all(line.endswith("| not finished | not finished | not finished |") for line in table[1:3])
    assert verdicts == "The text a sequence covers or the vocabulary: not finished."


def test_the_control_says_whether_a_gap_follows_the_vocabulary_or_the_text_covered():
    """Full BPE at T 64 (bytes' text, BPE's vocabulary): on full BPE's side of the midpoint between
    bytes' and full BPE's gaps on every seed, the vocabulary; on bytes' side, the text; else neither."""
    Cell, exp = plan.Cell, plan.EXPERIMENTS["regime"]
    byte, bpe, short = (Cell(6, 4, 256, 800, warmup_frac=0.2, tokens=t, block_size=T) for t, T in (("bytes", 128), ("bpe", 128), ("bpe", 64)))
    gaps = {byte: dict(sas=0.10, sas_p=0.12), bpe: dict(sas=-0.08, sas_p=-0.06), short: dict(sas=-0.05, sas_p=0.08)}
    per_seed = lambda gap: gap if isinstance(gap, tuple) else (gap,) * 3
    rows = lambda: [regime_row(c, config, seed, loss=2.0 * (1 + per_seed(gaps[c].get(config, 0))[k]))
                    for c in gaps for config in exp["tuned"] for k, seed in enumerate((1337, 1, 2))]
    lines = experiments.regime.vocabulary_table(rows(), exp).splitlines()[-2:]
    assert lines[0].startswith("sas at T 64 on full BPE: -5.0%") and "midpoint +1.0%" in lines[0]
    assert lines[0].endswith("its gap follows the vocabulary.")
    assert lines[1].endswith("its gap follows the text a sequence covers.")
    gaps[short]["sas"] = (-0.03, -0.02, 0.02)  # on full BPE's side on average, but not on the last seed
    assert experiments.regime.vocabulary_table(rows(), exp).splitlines()[-2].endswith("its gap follows neither cleanly.")
    stalled = [dict(r, status="stalled") if (r["config"], r["seed"], r["block_size"]) == ("sas", 2, 64) else r for r in rows()]
    assert experiments.regime.vocabulary_table(stalled, exp).splitlines()[-2].endswith("no verdict (a run stalled or diverged).")


def test_the_quick_rule_takes_the_cheapest_candidate_that_ranks_blocks_as_the_comparison(monkeypatch):
    """--quick's regime: the first candidate (cheapest first) whose shaped blocks are on the side of
    pre_ln that the comparison's are, on every seed, every tuned rate trained; else none."""
    Cell, exp = plan.Cell, plan.EXPERIMENTS["regime"]
    comparison = Cell(6, 4, 256, 800, warmup_frac=0.2, tokens="bpe")
    cheap, dear = (dict(n_layer=6, n_head=4, n_embd=128, steps=steps, warmup_frac=0.2, tokens="bpe4096") for steps in (400, 800))
    monkeypatch.setattr(plan, "QUICK_CANDIDATES", [cheap, dear])
    gaps = {comparison: dict(sas=-0.08, sas_p=-0.05), Cell(**cheap): dict(sas=-0.02, sas_p=0.03),
            Cell(**dear): dict(sas=-0.03, sas_p=-0.01)}
    rows = lambda cells, stalled=(): [regime_row(c, config, seed, "stalled" if (c, config, seed) in stalled else "trained",
                                                 2.0 * (1 + gaps[c].get(config, 0) + 0.001 * seed))
                                      for c in cells for config in exp["tuned"] for seed in (1337, 1, 2)]
    every = list(gaps)
    assert experiments.regime.quick_regime(rows(every), exp)[0] == Cell(**dear)  # the cheap one has sas_p behind
    gaps[Cell(**cheap)]["sas_p"] = -0.001
    assert experiments.regime.quick_regime(rows(every), exp)[0] == Cell(**cheap)  # within 2% still counts: the side on every seed
    assert experiments.regime.quick_regime(rows(every, {(Cell(**cheap), "pre_ln", 2)}), exp)[0] == Cell(**dear)  # a stall: no verdict
    assert experiments.regime.quick_regime(rows(every)[:-1], exp)[0] == Cell(**cheap)  # dear unfinished: cheap still decides
    gaps[Cell(**cheap)]["sas_p"] = 0.03
    cheap_short = [r for r in rows(every) if (cell_of(r), r["seed"]) != (Cell(**cheap), 2)]
    assert experiments.regime.quick_regime(cheap_short, exp)[0] is None  # cheap unfinished: dear may not be chosen yet
    gaps[Cell(**cheap)]["sas_p"] = -0.001
    none, why = experiments.regime.quick_regime(rows(every[:2])[:-1], exp)
    assert none is None and "not finished" in why
    gaps[comparison]["sas_p"] = 0.05  # the comparison's own verdict is the target, whichever it is
    assert experiments.regime.quick_regime(rows(every), exp)[0] is None


def test_the_regime_tables_count_stalls_and_gaps_per_cell():
    exp, Cell = plan.EXPERIMENTS["regime"], plan.Cell
    deep, wide = Cell(12, 4, 128, 200), Cell(6, 4, 256, 200, warmup_frac=0.2)
    runs = [regime_row(c, config, seed, "stalled" if (c, config, seed) == (deep, "sas", 2) else "trained",
                       2.0 * (1 + 0.01 * (1337, 1, 2).index(seed)) if config == "sas" else 2.0)
            for c in (deep, wide) for config in exp["tuned"] for seed in (1337, 1, 2)]
    runs.append(dict(regime_row(wide, "sas_p", 1337, "stalled", 3.27), role="sweep", lr=8e-3))
    for r in runs:  # only the wide cell's logs have entropy and kurtosis; sas tuned to twice pre_ln's rate
        if r["n_embd"] == 256:
            r.update(entropy=[3.0, 3.88 if r["config"] == "sas_p" else 2.0], kurtosis=[[200, [1.0, 2.0]]],
                     lr=2e-3 if r["config"] == "sas" else r["lr"])
    runs.append(dict(regime_row(wide, "sas", 1337, "stalled", 3.27), role="sweep", lr=1e-3, entropy=[3.88, 3.88]))
    mid = Cell(6, 4, 128, 200, warmup_frac=0.2)  # a cell under way: sas finished, pre_ln not
    runs += [dict(regime_row(mid, "sas", seed), entropy=[3.0, 3.0]) for seed in (1337, 1, 2)]
    job = Cell(6, 4, 128, 800, warmup_frac=0.2, tokens="bpe")  # the main job's: pre_ln on 2 seeds, sas on 1
    runs += [dict(regime_row(job, config, seed, loss=2.5 + seed / 1e4), curve=[[i * 100, 9 - i] for i in range(9)])
             for config, seed in (("pre_ln", 1), ("pre_ln", 1337), ("sas", 1337))]
    made = {title: markdown for _, title, markdown in report.tables(dict(runs=[dict(r, experiment="regime")
                                                                                 for r in runs]))}
    assert set(made) == {"regime map", "regime choice", "regime", "vocabulary", "regime attention", "main job", "regime sweeps"}
    assert made["main job"].splitlines()[2:] == ["| `pre_ln` (lr 0.001) | 9.00 | 8.00 | 7.00 | 5.00 | **2.6337 / 2.5001** |"]
    assert made["regime attention"].splitlines()[2:] == [  # the deep cell logged none: no row
        f"| {wide.label} | pre_ln | 0.001 | 2.50 (2.50 to 2.50) | 1.50 (1.50 to 1.50) | 2.0000, 2.50 |",
        f"| {wide.label} | sas | 0.002 | 2.50 (2.50 to 2.50) | 1.50 (1.50 to 1.50) | 3.2700 stalled, 3.88 |",
        f"| {wide.label} | sas_p | 0.001 | 3.44 (3.44 to 3.44) | 1.50 (1.50 to 1.50) | 2.0000, 3.44 |",
        f"| {mid.label} | sas | 0.001 | 3.00 (3.00 to 3.00) | not logged | pre_ln not tuned yet |"]
    rows = made["regime map"].splitlines()[2:]
    assert rows[0].startswith(f"| {deep.label} | 0.001 | 0.001, +1.0% (+0.0% to +2.0%), 1 of 3 / 1 of 3 |")
    assert rows[1].endswith("| 0.001, +0.0% (+0.0% to +0.0%), 0 of 3 / 1 of 4 |")
    assert made["regime choice"].startswith(f"The rule's choice: {wide.label}")
    assert "| 6x256 (d_k 64), 16 x 200 steps, warmup 20% = 40 steps | sas_p | 0.001 |" in made["regime"]


def test_bf16s_rule_keeps_the_verdict_only_within_a_point_of_float32s_range():
    """bf16's check, its rule written before it ran: every shaped block's bf16 paired gap, seed by
    seed, within 1 point of its float32 range in the comparison's cell; else the study stays float32."""
    exp = plan.EXPERIMENTS["bf16"]
    cell = plan.Cell(6, 4, 256, 800, warmup_frac=0.2, tokens="bpe")
    float32 = {"pre_ln": 0.0, "sas": -0.088, "sas_p": -0.059}
    regime = [dict(regime_row(cell, c, seed, loss=2.5 * (1 + gap + 0.01 * i)), lr=exp["rates"][c][0])
              for c, gap in float32.items() for i, seed in enumerate((1337, 1, 2))]
    bf16 = lambda gaps: [dict(regime_row(cell, c, seed, loss=2.5 * (1 + gap + 0.01 * i)), experiment="bf16",
                              dtype="bfloat16", lr=exp["rates"][c][0]) for c, gap in gaps.items()
                         for i, seed in enumerate((1337, 1, 2))]
    table = experiments.bf16.bf16_check(bf16({"pre_ln": 0.0, "sas": -0.09, "sas_p": -0.05}), regime, exp)
    assert table.endswith("bf16 keeps the verdict: the study's new cells may train in bf16.")
    assert "| sas_p | 0.002 (0.002 tuned) |" in table
    assert "float32 one, seed by seed: pre_ln +0.0%, +0.0%, +0.0%; sas -0.2%, -0.2%, -0.2%; sas_p +0.9%, +0.9%, +1.0%." in table
    regime = [dict(r, lr=1e-3) if r["config"] == "sas" else r for r in regime]  # float32 tuned sas elsewhere
    assert experiments.bf16.bf16_check(bf16({"pre_ln": 0.0, "sas": -0.09, "sas_p": -0.05}), regime, exp).endswith("stays float32.")
    table = experiments.bf16.bf16_check(bf16({"pre_ln": 0.0, "sas": -0.09, "sas_p": -0.02}), regime, exp)
    assert table.endswith("the study stays float32.") and "| no |" in table


@pytest.mark.parametrize("name,tuned_on", [("bf16", ("bpe",)), ("rows", ("bpe4096", "bpe16384"))])
def test_a_fixed_rate_check_runs_at_the_rates_tuned_where_it_is_compared(name, tuned_on):
    """bf16's at the comparison's float32 tuned rates; rows' at those of the 4K and 16K cells of its shape."""
    results = committed("assets/results.json")
    if results is None:
        pytest.skip("no assets/results.json committed")
    rows = tables.regime_rows([r for r in json.loads(results)["runs"] if r["experiment"] == "regime"], plan.EXPERIMENTS["regime"])
    spec = plan.EXPERIMENTS[name]["scales"]["default"]
    cell = lambda tokens: plan.Cell(spec["n_layer"], spec["n_head"], spec["n_embd"], spec["steps"][-1],
                                    warmup_frac=spec["warmup_frac"], tokens=tokens)
    for config, lrs in plan.EXPERIMENTS[name]["rates"].items():
        assert set(lrs) == {rows[cell(tokens)][config][0]["lr"] for tokens in tuned_on}


def test_bf16s_check_runs_in_bf16():
    spec = plan.EXPERIMENTS["bf16"]["scales"]["default"]
    run = plan.Run("clm", "sas", **{k: spec[k] for k in ("n_layer", "n_head", "n_embd", "tokens")}, steps=800, lr=4e-3,
                   flags=(("dtype", "bfloat16"), ("warmup_frac", 0.2)))
    assert run.argv()[run.argv().index("--dtype") + 1] == "bfloat16" and "dtypebfloat16" in run.name


def test_bf16s_check_takes_every_free_run_before_waiting(monkeypatch, tmp_path):
    monkeypatch.setattr(plan, "OUT", tmp_path)
    busy, order = {("sas", 2)}, []  # a run another process is training

    def outcome(run, train_it):
        if (run.config, run.seed) in busy and train_it != "wait":
            raise protocol.Unfinished(run.folder)
        order.append((run.config, run.seed))
        return Outcome(2.5, "trained")
    monkeypatch.setattr(protocol, "outcome", outcome)
    free = [(c, s) for c in ("pre_ln", "sas", "sas_p") for s in plan.seeds(3) if (c, s) != ("sas", 2)]
    rows, left_out = protocol.experiment("bf16", "default", plan.seeds(3), train_it=True)  # the training pass
    assert order == free and len(rows) == 6 and len(left_out) == 1
    rows, left_out = protocol.experiment("bf16", "default", plan.seeds(3), train_it="wait")  # nothing else left
    assert ("sas", 2) in order and len(rows) == 9 and left_out == []


def test_the_rows_rule_asks_how_much_of_the_vocabularys_move_the_rows_alone_make():
    """rows' check, its rule written before it ran: for each shaped block, the share of its gap's move
    from the 4K to the 16K cell that 4K tokens with 16K rows make; 3/4 or more for both: the rows,
    1/4 or less for both: the tokens, else neither cleanly."""
    exp = plan.EXPERIMENTS["rows"]
    few, many = (plan.Cell(6, 4, 256, 800, warmup_frac=0.2, tokens=t) for t in ("bpe4096", "bpe16384"))
    cell_rows = lambda cell, gaps, **more: [dict(regime_row(cell, c, seed, loss=2.5 * (1 + gap + 0.002 * i)), **more)
                                            for c, gap in gaps.items() for i, seed in enumerate((1337, 1, 2))]
    regime = cell_rows(few, {"pre_ln": 0, "sas": -0.02, "sas_p": -0.02}) + cell_rows(many, {"pre_ln": 0, "sas": -0.06, "sas_p": -0.05})
    check = lambda sas, sas_p: cell_rows(few, {"pre_ln": 0, "sas": sas, "sas_p": sas_p}, experiment="rows", tokens="bpe4096_rows16384")
    table = experiments.rows.rows_table(check(-0.055, -0.045), regime, exp)
    assert "| sas | -5.5% (-5.5% to -5.5%) at 0.001 | -2.0% (-2.0% to -2.0%) at 0.001 | -6.0% (-6.0% to -6.0%) at 0.001 |" in table
    assert "in the BPE-4K cell, seed by seed: pre_ln +0.0% (+0.0% to +0.0%); sas -3.6% (-3.6% to -3.6%);" in table
    assert table.endswith("The rows alone make sas 88%; sas_p 83% of the move: the lead follows the rows, the vocabulary's size to the model.")
    assert experiments.rows.rows_table(check(-0.03, -0.02), regime, exp).endswith(
        "sas 25%; sas_p 0% of the move: the lead follows the tokens themselves, not the vocabulary's size to the model.")
    assert experiments.rows.rows_table(check(-0.05, -0.04), regime, exp).endswith("sas 75%; sas_p 67% of the move: neither cleanly.")
    stalled = [dict(r, status="stalled") if r["config"] == "sas" else r for r in check(-0.05, -0.04)]
    assert experiments.rows.rows_table(stalled, regime, exp).endswith("no verdict (a run stalled or diverged).")
    unmoved = cell_rows(few, {"pre_ln": 0, "sas": -0.02, "sas_p": -0.02}) + cell_rows(many, {"pre_ln": 0, "sas": -0.01, "sas_p": -0.05})
    assert experiments.rows.rows_table(check(-0.05, -0.04), unmoved, exp).endswith("(sas's gap does not move towards a lead with the vocabulary).")
    assert experiments.rows.rows_table([], regime, exp).endswith("not finished.")


def test_a_fixed_rate_check_takes_the_rate_with_the_better_mean(monkeypatch, tmp_path):
    monkeypatch.setattr(plan, "OUT", tmp_path)
    monkeypatch.setattr(protocol, "outcome", lambda run, train_it: Outcome(2.5 + 10 * abs(run.lr - 8e-3) + 0.01 * run.seed, "trained"))
    rows, left_out = protocol.experiment("rows", "default", plan.seeds(3), train_it=True)
    roles = {(r.config, r.lr): {role} for r, role, _ in rows}
    assert len(rows) == 12 and not left_out and protocol.planned_runs("rows", "default", 3) == 12
    assert roles == {("pre_ln", 2e-3): {"final"}, ("sas", 4e-3): {"sweep"}, ("sas", 8e-3): {"final"}, ("sas_p", 4e-3): {"final"}}


def test_rows_tokens_are_their_tokens_under_a_larger_vocabulary(monkeypatch, tmp_path):
    """bpe4096_rows16384: 4K-BPE's token files, linked, and a meta.json saying 16K-BPE's vocabulary,
    so train.py gives the model the 16K cell's rows."""
    monkeypatch.chdir(tmp_path)
    base = tmp_path / "data" / plan.tokens_of("bpe4096")[0]
    base.mkdir(parents=True)
    for split in ("train.bin", "val.bin"):
        np.arange(10, dtype=np.uint16).tofile(base / split)
    meta = dict(tokenizer="gpt2_4096", vocab_size=4097, train_tokens=10, val_tokens=10, source="test")
    (base / "meta.json").write_text(json.dumps(meta))
    protocol.prepare_tokens("bpe4096_rows16384")
    rows = tmp_path / "data" / plan.tokens_of("bpe4096_rows16384")[0]
    assert json.loads((rows / "meta.json").read_text()) == dict(meta, vocab_size=16385)
    assert all((rows / split).read_bytes() == (base / split).read_bytes() for split in ("train.bin", "val.bin"))
    assert plan.tokens_of("bpe4096_rows16384")[2] == plan.tokens_of("bpe16384")[2] == 16448  # 16K rows and end-of-text, padded
    protocol.prepare_tokens("bpe4096_rows16384")  # prepared: nothing to do
    assert plan.Cell(6, 4, 256, 800, tokens="bpe4096_rows16384").label.startswith("BPE-4K with 16K rows 6x256")


def test_shaped_attention_leaves_the_identity_it_starts_as_with_either_optimizer(corpus, tmp_path, monkeypatch):
    """At step 0 A = I (W_Q = 0) and A's softmax part is C, whose causal row i has entropy log i;
    then each optimizer moves it off (the identity start's measurement, measure.identity_start)."""
    monkeypatch.setattr(plan, "OUT", tmp_path)
    monkeypatch.setattr(plan, "DATASET", "tiny")
    monkeypatch.setattr(plan, "TRAINING", dict(plan.TRAINING, block_size=32, eval_tokens=512, data_dir=str(corpus)))
    entropy_of_c = statistics.fmean(math.log(i) for i in range(1, 33))
    for run in (a_run("sas_p").again(lr=1e-2), a_run("sas_muon", flags=(("muon_lr", 1e-2),)).again(lr=1e-2)):
        trajectory = measure.identity_start(run, 3, sequences=2)
        assert len(trajectory) == 4 and trajectory[0][0] < 1e-5 and math.isclose(trajectory[0][1], entropy_of_c, rel_tol=1e-4)
        assert trajectory[3][0] > 1e-3 and trajectory[3][1] < trajectory[0][1], (run.config, trajectory)


def test_the_muon_rates_tables_show_each_arms_pairs_and_the_rules_verdict(tmp_path):
    exp, runs = plan.EXPERIMENTS["muon_rates"], []
    loss = dict(pre_ln=2.8, sas=2.6, sas_p=2.65, pre_ln_muon=2.7, sas_muon=2.6, sas_p_muon=2.75)
    for config, base in loss.items():
        for muon_lr, lr, seed, role in [(8e-3, 3.2e-2, 1337, "final"), (8e-3, 3.2e-2, 1, "final"), (1.6e-2, 3.2e-2, 1337, "sweep")]:
            muon = config.endswith("_muon")
            runs.append(dict(config=config, steps=400, role=role, seed=seed, lr=lr if muon else 2e-3, n_layer=6,
                             flags=dict(muon_lr=muon_lr) if muon else {}, status="trained", seconds_per_step=1.0,
                             val_loss=base + 0.01 * seed / 1337 + (0.1 if muon_lr == 1.6e-2 else 0), curve=[[400, base]]))
    titles = {title: markdown for title, _, markdown in experiments.muon_rates.tables(runs, exp, {})}
    assert "| sas | -7.1% (-7.1% to -7.1%) | -3.7% (-3.7% to -3.7%) | yes |" in titles["muon rates"]
    assert "| 0.008 | **2.6100 / 2.6000** |" in titles["pairs"] and "| 0.016 | 2.7100 |" in titles["pairs"]
    assert "| 400 | sas_p_muon | 0.008 / 0.032 |" in titles["tuned"]
    assert titles["identity start"].startswith("Not measured")  # until SAS's and SAS-P's tuning is finished
    for r in runs:
        r["name"] = f"{r['config']}_{r['seed']}_{r['role']}"
    start = dict(runs={c: f"{c}_1337_final" for c in SHAPED}, identity_start={c: [[0.0, 3.9]] * 81 for c in SHAPED})
    titles = {title: markdown for title, _, markdown in experiments.muon_rates.tables(
        runs, exp, dict(experiments=dict(muon_rates=dict(measurements=start))))}
    assert "| sas_p_muon | 0.008 / 0.032 | 0.000 / 3.90 |" in titles["identity start"] and "step 80 |" in titles["identity start"]
    assert experiments.muon_rates.measurements(runs, None, start) is start  # the same tuned runs: kept, not measured again
    assert experiments.muon_rates.measurements([r for r in runs if r["config"] != "sas"], None, None) == {}
    report.write_report(dict(runs=[dict(r, experiment="muon_rates") for r in runs], experiments={}), tmp_path)
    assert "## muon_rates: pairs" in (tmp_path / "REPORT.md").read_text()
    report.figures("muon_rates", dict(runs=[dict(r, experiment="muon_rates") for r in runs]), tmp_path)
    assert (tmp_path / "muon_rates_pairs.png").exists() and (tmp_path / "muon_rates_val_loss.png").exists()


def test_the_embeddings_rate_is_searched_in_each_cell_as_the_rule_says(monkeypatch):
    """emb_lr: the main cell's grid of pairs (an --emb_lr equal to --lr is the one-rate run), then each
    block's best pair's decay control; the headline cell (bf16) with the carried embeddings' rate,
    body first, then the embeddings; the bytes cell at the one-rate body rate and the carried one."""
    from reproduction.experiments.emb_lr import BYTES, HEADLINE, MAIN, ONE_RATE, run_in, search

    def bowl2(run, train_it):  # best at body 0.004, embeddings 0.032, wherever it runs
        emb = dict(run.flags).get("emb_lr", run.lr)
        return Outcome(2 + math.log2(run.lr / 0.004) ** 2 + 0.5 * math.log2(emb / 0.032) ** 2 + run.seed * 1e-6, "trained")

    weighed = []
    monkeypatch.setattr(protocol, "outcome", bowl2)
    monkeypatch.setattr(protocol, "weights", lambda run, train_it: weighed.append(run.name))
    rows, left_out = search("default", plan.seeds(3), True)
    assert not left_out
    assert weighed[:2] == ["pre_ln_lr0.002_warmup_frac0.2_s1337", "pre_ln_lr0.004_emb_lr0.032_warmup_frac0.2_s1337"]
    assert len(weighed) == 6  # for the loss by token frequency: each block's one-rate run and best pair, first seed

    def runs(cell, config, roles=("sweep", "final"), seeds=(1337,)):  # {(body rate, embeddings' rate, seed): run}
        folder = run_in(cell, config).folder.parent
        return {(r.lr, dict(r.flags).get("emb_lr", r.lr), r.seed): r for r, role, _ in rows
                if r.folder.parent == folder and r.config == config and role in roles and r.seed in seeds}

    pairs = lambda found: {(lr, emb) for lr, emb, _ in found}

    # Pre-LN (one-rate best 0.002): its grid, both axes grown past the edge its best sat on
    assert pairs(runs(MAIN, "pre_ln")) == {(lr, emb) for lr in (1e-3, 2e-3, 4e-3, 8e-3) for emb in (2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2)}
    assert pairs(runs(MAIN, "sas")) == {(lr, emb) for lr in (2e-3, 4e-3, 8e-3) for emb in (4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2)}
    assert runs(MAIN, "pre_ln")[2e-3, 2e-3, 1337].name == "pre_ln_lr0.002_warmup_frac0.2_s1337"  # the committed one-rate run's
    assert set(runs(MAIN, "sas", ("final",), plan.seeds(3))) == {(4e-3, 3.2e-2, seed) for seed in (1337, 1, 2)}
    (control,) = runs(MAIN, "pre_ln", ("control",)).values()
    assert (control.lr, dict(control.flags)["emb_lr"], dict(control.flags)["emb_weight_decay"]) == (0.004, 0.032, 0.1 * 0.004 / 0.032)
    # the headline cell, in bf16: the body at the carried 0.032 (grown past 0.004), then the embeddings at its best
    assert pairs(runs(HEADLINE, "pre_ln")) == {(lr, 0.032) for lr in (1e-3, 2e-3, 4e-3, 8e-3)} | {(4e-3, emb) for emb in (1.6e-2, 6.4e-2)}
    assert all(dict(r.flags)["dtype"] == "bfloat16" for r in runs(HEADLINE, "sas", ("sweep", "check", "final"), plan.seeds(3)).values())
    assert set(runs(HEADLINE, "sas", ("final",), plan.seeds(3))) == {(4e-3, 3.2e-2, seed) for seed in (1337, 1, 2)}
    # the bytes cell: each block's one-rate body rate with the carried embeddings' rate, every seed
    for config in ("pre_ln", "sas", "sas_p"):
        assert set(runs(BYTES, config, ("sweep", "check", "final", "control"), plan.seeds(3))) == {
            (ONE_RATE[BYTES][config], 0.032, seed) for seed in (1337, 1, 2)}


def emb_lr_row(config, seed, loss, lr, emb, role="final", experiment="emb_lr", cell=None, **flags):
    """A row of cell (the main job's) at a pair of rates (one rate where they are equal)."""
    from reproduction.experiments.emb_lr import MAIN
    made = regime_row(cell or MAIN, config, seed, loss=loss)
    made.update(role=role, lr=lr, experiment=experiment)
    made["flags"].update({"emb_lr": emb} if emb != lr else {}, **flags)
    return made


def test_an_unfinished_embeddings_rate_search_reports_its_finished_pairs_as_grids():
    """While its arms train, the report shows each block's finished pairs, in every cell, as the
    finished search's grid, each loss with its seed (no pair bold: none is chosen yet)."""
    from reproduction.experiments.emb_lr import BYTES, HEADLINE

    rows = [emb_lr_row("pre_ln", 1337, loss, 1e-3, emb, "so far") for emb, loss in ((2e-3, 2.64), (8e-3, 2.46))]
    rows += [emb_lr_row("pre_ln", 1337, 2.67, 2e-3, 2e-3, "so far"), emb_lr_row("sas", 1337, 2.42, 2e-3, 1.6e-2, "so far")]
    rows += [emb_lr_row("sas_p", seed, loss, 2e-3, 1.6e-2, "so far", cell=cell)  # the bytes cell's later seeds first
             for cell, seed, loss in ((HEADLINE, 1337, 2.3), (BYTES, 1, 1.1), (BYTES, 2, 1.2))]
    table = report.so_far_table(rows)
    assert "pre_ln, the main job's" in table and "| lr | emb_lr 0.002 | emb_lr 0.008 |" in table
    assert "| 0.001 | 2.6400 (s1337) | 2.4600 (s1337) |" in table and "| 0.002 | 2.6700 (s1337) |  |" in table
    assert "sas, the main job's" in table and "| 0.002 | 2.4200 (s1337) |" in table and "**" not in table
    assert "sas_p, the headline's" in table and "| 0.002 | 2.3000 (s1337) |" in table
    assert "sas_p, bytes" in table and "| 0.002 | 1.1000 (s1) / 1.2000 (s2) |" in table


def test_the_embeddings_rate_verdict_compares_best_pairs_seed_by_seed_beside_the_one_rate_gap():
    """A shaped block leads with two rates if below Pre-LN (each at its best pair) on every seed,
    level if the sign varies; beside it the one-rate gap and the rate's share; a best pair on an
    edge of its search says so; the decay control against the best pair and one rate."""
    from reproduction.experiments.emb_lr import tables

    row = emb_lr_row
    seeds, one = plan.seeds(3), dict(pre_ln=2.6, sas=2.45, sas_p=2.45)  # one rate: the shaped blocks 5.8% ahead
    two = dict(pre_ln=(2.45, 2.46, 2.44), sas=(2.401, 2.4108, 2.3912), sas_p=(2.4598, 2.4403, 2.4498))
    best = dict(pre_ln=(4e-3, 3.2e-2), sas=(4e-3, 1.6e-2), sas_p=(8e-3, 1.6e-2))
    curve = [[step, 9 - step / 100] for step in range(0, 801, 100)]
    runs = [dict(row(c, seed, loss, *best[c]), curve=curve) for c in two for seed, loss in zip(seeds, two[c])]
    runs += [row("pre_ln", 1337, 2.5, lr, emb, "sweep") for lr, emb in ((2e-3, 3.2e-2), (4e-3, 1.6e-2))]  # pre_ln's best on 2 edges
    runs += [row("sas", 1337, 2.5, lr, emb, "sweep") for lr, emb in ((2e-3, 1.6e-2), (8e-3, 1.6e-2), (4e-3, 8e-3), (4e-3, 3.2e-2))]
    runs.append(row("pre_ln", 1337, 2.5, 4e-3, 3.2e-2, "control", emb_weight_decay=0.0125))
    results = dict(runs=runs + [row(c, seed, one[c], 2e-3, 2e-3, experiment="regime") for c in one for seed in seeds])
    made = {title: markdown for title, _, markdown in tables([r for r in runs], plan.EXPERIMENTS["emb_lr"], results)}
    lines = {line.split(" | ")[1]: line for line in made["verdict"].splitlines() if line.startswith("| the main job's")}
    assert "| 0.004 / 0.032 (on the body and embeddings edge) | -5.8% (-6.2% to -5.4%) |" in lines["pre_ln"]
    assert "| 0.004 / 0.016 | " in lines["sas"] and "-2.0%, -2.0%, -2.0% | -2.0% (-2.0% to -2.0%) | leads | +3.8 of -5.8 points |" in lines["sas"]
    assert "| +0.4%, -0.8%, +0.4% |" in lines["sas_p"] and "| level (the sign varies by seed) |" in lines["sas_p"]
    assert made["verdict"].count("not finished") == 6  # the headline's and the bytes cell's arms
    assert "| pre_ln | 0.004 / 0.032 | 2.4500 | 2.5000 (0.0125) | 2.6000 | 67% |" in made["decay control"]
    assert "**2.4500 / 2.4600 / 2.4400**" in made["pairs"] and "| 0.002 |  | 2.5000 |" in made["pairs"]
    # two rates train every block better only if each best pair is below its one-rate run on every seed
    assert made["verdict"].endswith("takes the pairs): no.")  # sas_p's first seed is not
    runs = [dict(r, val_loss=r["val_loss"] - 0.01 * (r["config"] == "sas_p")) for r in runs]
    made = {title: markdown for title, _, markdown in tables(runs, plan.EXPERIMENTS["emb_lr"], results)}
    assert made["verdict"].endswith("takes the pairs): yes.")
    assert made["main job, two rates"].splitlines()[2:] == [
        "| `pre_ln` (lr 0.004, emb_lr 0.032) | 9.00 | 8.00 | 7.00 | 5.00 | **2.4500 / 2.4600** |",
        "| `sas` (lr 0.004, emb_lr 0.016) | 9.00 | 8.00 | 7.00 | 5.00 | **2.4010 / 2.4108** |",
        "| `sas_p` (lr 0.008, emb_lr 0.016) | 9.00 | 8.00 | 7.00 | 5.00 | **2.4498 / 2.4303** |"]
    made = {title: markdown for title, _, markdown in tables([r for r in runs if r["config"] != "sas"],
                                                             plan.EXPERIMENTS["emb_lr"], results)}
    assert made["verdict"].endswith("takes the pairs): not decided yet.")  # sas's search unfinished


def test_the_loss_by_token_frequency_table_shows_each_blocks_two_runs_and_the_gaps_per_bucket(monkeypatch, tmp_path):
    from reproduction.experiments import emb_lr
    buckets = lambda *losses: [[1, 100, 0.6, losses[0]], [101, 50304, 0.4, losses[1]]]
    measured = dict(runs={}, by_frequency={"pre_ln one rate": buckets(2.0, 4.0), "pre_ln two rates": buckets(2.0, 3.6),
                                           "sas one rate": buckets(1.9, 3.6), "sas two rates": buckets(1.9, 3.42),
                                           "sas_p one rate": buckets(2.0, 3.8), "sas_p two rates": buckets(2.0, 3.6)})
    table = emb_lr.frequency_table(measured)
    assert "| 101 to 50,304 | 40.0% | 4.000 / 3.600 | 3.600 / 3.420 | 3.800 / 3.600 | -10.0% / -5.0% | -5.0% / +0.0% |" in table
    assert emb_lr.frequency_table({}).startswith("Not measured yet")
    monkeypatch.setattr(plan, "OUT", tmp_path)  # no weights trained: the last measurements stay
    row = lambda config, rates, role: dict(regime_row(emb_lr.MAIN, config, 1337), name=protocol.at_rates(
        emb_lr.run_in(emb_lr.MAIN, config), rates).name, role=role, lr=rates[0][1], experiment="emb_lr", objective="clm",
        flags={"warmup_frac": 0.2, **({"emb_lr": rates[1][1]} if rates[1][1] != rates[0][1] else {})})
    runs = [row(c, (("lr", r), ("emb_lr", r)), "sweep") for c, r in emb_lr.ONE_RATE[emb_lr.MAIN].items()]
    runs += [row(c, (("lr", r), ("emb_lr", 8 * r)), "final") for c, r in emb_lr.ONE_RATE[emb_lr.MAIN].items()]
    assert emb_lr.measurements(runs, None, measured) is measured
    kept = dict(measured, runs={"sas": {"one rate": "sas_lr0.004_warmup_frac0.2_s1337", "two rates": "sas_lr0.004_emb_lr0.032_warmup_frac0.2_s1337"}})
    assert emb_lr.measurements([r for r in runs if r["config"] == "sas"], None, kept) is kept  # the same runs: not measured again


def test_the_outliers_experiment_reports_kurtosis_at_tuned_and_shared_rates_and_the_rescue(monkeypatch, tmp_path):
    """Every arm tuned (loss a bowl around 2e-3), and at the shared 1e-3; kurtosis grows with the
    rate and peaks mid-run; the rescued run stalled without QK-norm. The tables say so, number
    by number, and the rows go back to logs (--reuse_results) with their kurtosis and entropy."""
    monkeypatch.setattr(plan, "OUT", tmp_path / "out")
    shape = dict(n_layer=2, n_head=2, n_embd=32)
    monkeypatch.setitem(plan.EXPERIMENTS["outliers"]["scales"], "quick", dict(
        **shape, warmup_frac=0.2, steps=(10,), eval_interval=5, rescue=dict(shape, n_layer=3, steps=10, runs=[("sas_p", 8e-3, 1337)])))

    def trained(run):
        stalled = run.config == "sas_p" and run.n_layer == 3
        loss = 4.0 if stalled else 2.0 + math.log2(run.lr / 2e-3) ** 2 / 10 + (run.seed != 1337) / 1e3
        k = 1000 * run.lr * (1 + run.config.endswith("qknorm"))  # per layer: k and 2k at the end, 3k mid-run
        records = [dict(iter=0, val_loss=5.0, similarity=0.1, gains={}, outliers=dict(kurtosis=[1.0, 1.0])),
                   dict(iter=5, val_loss=3.0, similarity=0.1, gains={}, outliers=dict(kurtosis=[k, 3 * k])),
                   dict(iter=10, val_loss=loss, similarity=0.1, gains={}, outliers=dict(kurtosis=[k, 2 * k], entropy=[k, 1.0]),
                        val_loss_int8=loss * 1.01, stalled=stalled)]
        run.folder.mkdir(parents=True, exist_ok=True)
        (run.folder / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return protocol.finished(run)

    monkeypatch.setattr(protocol, "train_run", trained)
    monkeypatch.setattr(measure, "step_seconds", lambda objective, timed, configs: {c: 0.1 for c in configs})
    monkeypatch.setattr(report, "figures", lambda name, results, assets: None)
    seeds = plan.seeds(2)
    protocol.experiment("outliers", "quick", seeds, train_it=True)
    rows, left_out = protocol.experiment("outliers", "quick", seeds, train_it=False)
    assert not left_out
    reproduce.write_results("outliers", "quick", seeds, rows, left_out, tmp_path / "assets")
    report_text = (tmp_path / "assets" / "REPORT.md").read_text()
    assert ("| 10 | op | 0.002 | 2.0005 (2.0000 to 2.0010) | +0.0% (+0.0% to +0.0%) | 4.00 (4.00 to 4.00) "
            "| 6.00 (6.00 to 6.00) | 3.00 (3.00 to 3.00) | 4.00 (4.00 to 4.00) | +1.00% (+1.00% to +1.00%) | 0 of 2 |") in report_text
    assert "| 10 | sas_p_qknorm | 0.001 (shared) | 2.1005 (2.1000 to 2.1010) | +0.0% (+0.0% to +0.0%) | 4.00 (4.00 to 4.00) |" in report_text
    assert "| 3x32, 10 | sas_p | 0.008 | 1337 | 4.0000 stalled | 2.4000 |" in report_text
    results = json.loads((tmp_path / "assets" / "results.json").read_text())
    assert {r["role"] for r in results["runs"]} == {"sweep", "check", "final", "stalled", "rescue"}  # 1e-3: checked
    assert all(r["flags"] == dict(eval_interval=5, warmup_frac=0.2) for r in results["runs"] if r["role"] not in ("stalled", "rescue"))
    assert "| 10 | sas_p | 0.008 |" not in tables.tuned_table(experiments.outliers.tuning_and_rescue(results["runs"])[1], plan.EXPERIMENTS["outliers"])
    assert {r["config"]: r["entropy"] for r in results["runs"] if r["lr"] == 1e-3}["op"] == [1.0, 1.0]  # the last record's
    for f in (tmp_path / "out").glob("*/*/log.jsonl"):  # a fresh clone, --reuse_results: the same rows,
        f.unlink()  # even where another experiment's older row of a run comes first, without its statistics
    older = {k: v for k, v in results["runs"][0].items() if k not in ("kurtosis", "val_loss_int8", "entropy")}
    (tmp_path / "both.json").write_text(json.dumps(dict(runs=[dict(older, experiment="clm"), *results["runs"]])))
    assert protocol.restore_logs([tmp_path / "both.json"]) == len(results["runs"])
    again = tables.result_rows("outliers", protocol.experiment("outliers", "quick", seeds, train_it=False)[0], {}, 1337)
    strip = lambda rs: sorted((r["name"], r["log"], r["kurtosis"], r["entropy"], r["val_loss_int8"], r["val_loss"]) for r in rs)
    assert strip(again) == strip(results["runs"])


def test_the_outlier_table_counts_diverged_runs_and_says_where_kurtosis_was_not_logged():
    def row(config, seed, loss, kurtosis=None, lr=2e-3):
        return dict(config=config, seed=seed, steps=10, role="final", lr=lr, val_loss=loss,
                    status="trained" if loss else "diverged", **({"kurtosis": [[10, kurtosis]]} if kurtosis else {}))
    runs = [row("pre_ln", 1337, 2.0, [3.0, 5.0]), row("pre_ln", 1, 2.2),  # logged before the statistics were
            row("op", 1337, 2.2, [1.0, 2.0]), row("op", 1, None)]  # diverged
    table = experiments.outliers.outlier_table(runs, dict(tuned=("pre_ln", "op")))
    assert "| 10 | pre_ln | 0.002 | 2.1000 (2.0000 to 2.2000) |  | 5.00 (1 of 2) | 5.00 (1 of 2) | 4.00 (1 of 2) |" in table
    assert "| 10 | op | 0.002 | diverged on 1 of 2 | +10.0% | 2.00 | 2.00 | 1.50 | 1.50 | not logged | 1 of 2 (diverged) |" in table
