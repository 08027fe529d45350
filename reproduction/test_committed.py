"""What is committed agrees with the code: the README's commands parse with their scripts' own
parsers, its numbers quote the committed results.json, the report shows its tables, and the
committed quick baselines were made by this code (a test here fails when an artifact goes stale)."""

import json
import re
import statistics

import pytest
import torch

import conftest
import reproduce
import train_config
from common import flops_per_token
from conftest import REPO, committed, readme_commands
from simple_gpt import GPT, GPTConfig
from reproduction import plan
from reproduction import experiments, protocol, report, tables

SCRIPTS = {**conftest.SCRIPTS, "reproduce.py": reproduce.parse_args}  # the README's scripts, the study's too


# ----------------------------------------------------------------------------- the README's commands

@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_has_a_help(script, capsys):
    with pytest.raises(SystemExit) as e:
        SCRIPTS[script](["--help"])
    assert e.value.code == 0 and "usage:" in capsys.readouterr().out


def test_every_command_in_the_readme_parses(readme_block):
    """The documentation cannot rot unnoticed: each command line parses with its script's own
    argument parser (nothing runs); the README's own block is added, as the README says."""
    commands = readme_commands(SCRIPTS)
    for words in commands:
        script = next(w for w in words if w in SCRIPTS)
        if "--help" not in words:  # it exits 0: test_every_script_has_a_help
            SCRIPTS[script](words[words.index(script) + 1:])  # argparse exits on a flag it does not know
    counted = {s: sum(s in words for words in commands) for s in SCRIPTS}
    assert counted["train.py"] >= 6 and counted["bench.py"] >= 2 and counted["reproduce.py"] >= 3, counted
    assert counted["prepare_data.py"] and counted["diagnostics.py"] and counted["sample.py"], counted
    assert any(words[0] == "torchrun" for words in commands), counted


# ----------------------------------------------------------------------------- the committed results

def test_the_report_and_the_readme_show_the_tables_of_the_committed_results():
    """assets/REPORT.md holds every table made from assets/results.json (the README shows some,
    below), as they are made from it."""
    results = committed("assets/results.json")
    if results is None:
        pytest.skip("no assets/results.json committed")
    results, text, readme = json.loads(results), committed("assets/REPORT.md"), committed("README.md")
    assert text is not None, "assets/REPORT.md is not committed: python reproduce.py --report writes it"
    made = report.tables(results)
    for experiment, title, markdown in made:
        assert markdown in text, f"assets/REPORT.md lacks the {experiment} {title} table made from assets/results.json"
    for experiment in results["experiments"].values():  # and the finished runs of what is not finished
        assert report.so_far_table(experiment.get("so_far", [])) in text or not experiment.get("so_far")
    assert "](assets/REPORT.md)" in readme
    for r in results["runs"]:  # and the losses are the runs' own last evaluation
        assert r["status"] == "diverged" or abs(r["val_loss"] - r["curve"][-1][1]) < 1e-5
        assert r["status"] in ("trained", "stalled", "diverged") and r["seed"] in plan.seeds(10)


def test_one_setting_has_one_run_in_the_committed_results():
    """A run's setting (its arm, shape, tokens, regime, length, rate and seed) has one final loss
    across every committed results.json: experiments that share a setting share its run."""
    finals = {}
    for path in ("assets/results.json", "assets/quick/results.json", "assets/large/results.json"):
        for r in json.loads(committed(path) or '{"runs": []}')["runs"]:
            setting = (r["objective"], r["config"], r.get("tokens", "bytes"), r["n_layer"], r["n_head"], r["n_embd"],
                       r.get("batch_size"), r.get("block_size"), r.get("dtype", "float32"), json.dumps(r["flags"], sort_keys=True),
                       r["steps"], r["lr"], r["seed"])
            finals.setdefault(setting, set()).add(r["val_loss"])
    assert len(finals) > 100  # every run's setting was read
    assert not [setting for setting, losses in finals.items() if len(losses) > 1]


def quote(gaps, ranged=True):
    """Paired gaps as the README quotes them: mean (min..max), in %."""
    return (f"{statistics.fmean(gaps):+.1f}%" + (f" ({min(gaps):+.1f}..{max(gaps):+.1f})" if ranged else "")).replace("+-", "-")


def readme_row(readme, start):
    """The README's table row that begins with start."""
    return readme[readme.index("\n" + start) + 1:].split("\n")[0]


def paragraph(readme, start):
    """The README's paragraph from start (a paragraph's first words, or words within one, wherever its
    lines break) to its end, on one line."""
    found = [p[p.index(start):] for p in (" ".join(p.split("\n")) for p in readme.split("\n\n")) if start in p]
    assert found, f"the README has no paragraph with {start!r}"
    return found[0]


def test_the_readmes_results_quote_the_committed_study():
    """The README's headline and results table quote the paired gaps of the committed results.json:
    the comparison's cell at 800 and 200 steps, and its bytes twin at 800; the why-paragraph that
    cell with each vocabulary (bytes, 4K, 16K, 50K) and with T 64, the rows check and the identity
    experiment; the rows at 4x the length (the 4K cell's durability experiment, the 16K cell's
    durability16k, and the headline's sentence on that one); assets/large/ (--scale large, on bytes,
    with its 3,200-step point) holds its own tables in its report."""
    results = committed("assets/results.json")
    if results is None or "regime" not in json.loads(results)["experiments"]:
        pytest.skip("no factor study committed")
    rows = [r for r in json.loads(results)["runs"] if r["experiment"] == "regime"]
    by_cell, readme = tables.regime_rows(rows, plan.EXPERIMENTS["regime"]), committed("README.md")
    claims = {(800, "bpe"): "| per step, SAS and SAS-P match Pre-LN (GPT)", (200, "bpe"): "| ... in 200-step runs",
              (800, "bytes"): "| ... on bytes"}  # each cell's row of the claims table
    for (steps, tokens), claim in claims.items():
        configs, row = by_cell[plan.Cell(6, 4, 256, steps, warmup_frac=0.2, tokens=tokens)], readme_row(readme, claim)
        for config, name in (("sas", "SAS"), ("sas_p", "SAS-P")):
            gaps = tables.paired_gaps(configs[config], configs["pre_ln"])
            assert f"{name} {quote(gaps)}" in row, (steps, tokens, config, quote(gaps))
    configs, headline = by_cell[plan.Cell(6, 4, 256, 800, warmup_frac=0.2, tokens="bpe")], paragraph(readme, "**Here, on a CPU**")
    below = {config: -statistics.fmean(tables.paired_gaps(configs[config], configs["pre_ln"])) for config in ("sas", "sas_p")}
    assert f"SAS-P ends {below['sas_p']:.1f}% and SAS {below['sas']:.1f}% below Pre-LN" in headline
    why = paragraph(readme, "**Why bytes and tokens disagree")  # the vocabulary's cells
    for tokens, T in (("bytes", 128), ("bpe4096", 128), ("bpe16384", 128), ("bpe", 128), ("bpe", 64)):
        configs = by_cell[plan.Cell(6, 4, 256, 800, warmup_frac=0.2, tokens=tokens, block_size=T)]
        for config in ("sas", "sas_p"):
            gaps = tables.paired_gaps(configs[config], configs["pre_ln"])
            ranged = (tokens, T) not in (("bytes", 128), ("bpe", 128))  # those two the table above ranges
            assert len(gaps) == 3 and quote(gaps, ranged) in why, (tokens, T, config, quote(gaps, ranged))
    identity = [r for r in json.loads(results)["runs"] if r["experiment"] == "identity"]
    cells = tables.regime_rows(identity, plan.EXPERIMENTS["identity"])  # and Pre-LN started as the identity
    assert len(cells) == 2 and all(quote(tables.paired_gaps(configs["pre_ln_zero"], configs["pre_ln"])) in why
                                   for configs in cells.values())
    check = [r for r in json.loads(results)["runs"] if r["experiment"] == "rows"]  # and 4K tokens with 16K's rows
    for config in ("sas", "sas_p"):
        gaps = tables.paired_gaps(tables.finals(check, 800, config), tables.finals(check, 800, "pre_ln"))
        assert len(gaps) == 3 and quote(gaps) in why, (config, quote(gaps))
    for experiment, cell, lengths in (("durability", "4K", (400, 1600)), ("durability16k", "16K", (800, 3200))):  # at 4x the length
        durable = [r for r in json.loads(results)["runs"] if r["experiment"] == experiment]
        row = readme_row(readme, f"| ... at 4x the length | {cell},")
        for config, name in (("sas_p", "SAS-P"), ("sas", "SAS")):
            short, long = (tables.paired_gaps(tables.finals(durable, n, config), tables.finals(durable, n, "pre_ln")) for n in lengths)
            assert len(long) == 3, config
            held = experiments.durability.durability_verdict(short, long).startswith("holds")
            assert f"{name} {quote(long)}, from {quote(short, False)} at {lengths[0]}" in row, (config, quote(long))
            assert f"{name} {'held' if held else 'not'}" in row, config
            if cell == "16K":  # the headline's
                assert f"{quote(long)}, from {quote(short, False)} at 800 steps" in headline, config
            elif config == "sas_p":  # and its 4K clause
                assert held == ("SAS-P fades to level" not in headline), config
    large = committed("assets/large/results.json")
    if large is not None:
        report_text = committed("assets/large/REPORT.md")
        assert all(markdown in report_text for _, _, markdown in report.tables(json.loads(large)))


def test_the_readmes_muon_paragraph_quotes_the_committed_muon_runs():
    """The Muon paragraph (muon_rates: both rates tuned) and its claims row: per shaped block its paired
    gap to Pre-LN with AdamW and with Muon (each against Pre-LN with the same optimizer), at its tuned
    pair (train.py's CPU pair), and the side it falls on; Pre-LN with Muon against with AdamW; the gaps
    with one shared rate (muon)."""
    results = committed("assets/results.json")
    if results is None or "muon_rates" not in json.loads(results)["experiments"]:
        pytest.skip("no Muon experiment committed")
    results, readme = json.loads(results), committed("README.md")
    muon = readme[readme.index("**Under Muon"):readme.index("](assets/muon_rates_pairs.png)")].replace("\n", " ")  # its section
    row = readme_row(readme, "| ... with Muon")
    final = lambda experiment, config: tables.finals([r for r in results["runs"] if r["experiment"] == experiment], 400, config)
    gaps = lambda experiment, config, base: tables.paired_gaps(final(experiment, config), final(experiment, base))
    tuned = {config: final("muon_rates", f"{config}_muon")[0] for config in ("pre_ln", "sas", "sas_p")}  # its pair's first run
    assert train_config.CPU_GPT_MUON == {config: (r["flags"]["muon_lr"], r["lr"]) for config, r in tuned.items()}
    assert f"Pre-LN with it ends {quote(gaps('muon_rates', 'pre_ln_muon', 'pre_ln'))} against Pre-LN with AdamW" in muon
    for config, name in (("sas", "SAS"), ("sas_p", "SAS-P")):
        adamw, both, shared = (gaps(experiment, config + arm, "pre_ln" + arm)
                               for experiment, arm in (("muon_rates", ""), ("muon_rates", "_muon"), ("muon", "_muon")))
        assert len(both) == len(shared) == 3, config
        side = tables.verdict(both).removeprefix("within 2%; ")
        assert f"- {name}: {quote(adamw)} with AdamW, {quote(both)} with Muon at {tables.rate_text(tuned[config])}: {side}." in muon
        assert f"{name} {quote(both)}" in row and f"{name} {quote(shared)}" in muon, config  # one rate for both: muon's


def paper_models(n_layer, n_head, n_embd):
    """Pre-LN and SAS-P at this shape, T 128, GPT-2's vocabulary, on the meta device: counted, no weights."""
    with torch.device("meta"):
        return [GPT(GPTConfig(block=block, n_layer=n_layer, n_head=n_head, n_embd=n_embd)) for block in ("pre_ln", "sas_p")]


def ideal(n_layer, n_head, n_embd):
    """SAS-P's FLOP-ideal speed against Pre-LN's: Pre-LN's FLOPs a token over SAS-P's."""
    pre_ln, sas_p = (flops_per_token(model, 128) for model in paper_models(n_layer, n_head, n_embd))
    return pre_ln / sas_p


def test_the_readmes_speeds_quote_their_sources():
    """Each speed the README quotes is its source's: the main job's minutes, SAS-P's, bf16's and
    Muon's speed from assets/bench/'s table of the main job's shape (the CPU preset's, one thread);
    the comparison's per-second row, its headline's seconds and the study's hours from its committed
    runs (steps x bench.py's seconds a step, clm's with two threads and regime's with one), the FLOP
    ideals and parameter counts from the models."""
    bench, results = committed("assets/bench/cpu_main_job_muon.json"), committed("assets/results.json")
    if bench is None or results is None or "clm" not in json.loads(results)["experiments"]:
        pytest.skip("no bench table or comparison committed")
    bench, results, readme = json.loads(bench), json.loads(results), committed("README.md")
    shape, run = bench["args"], train_config.CPU_RUN
    assert (shape["n_layer"], shape["n_head"], shape["n_embd"], shape["batch_size"], shape["seq_len"], bench["threads"]) == (
        run["n_layer"], run["n_head"], run["n_embd"], run["batch_size"], [train_config.TrainConfig.block_size], 1)
    rows, tokens = {(r["block"], r["dtype"]): r for r in bench["rows"]}, run["batch_size"] * train_config.TrainConfig.block_size
    minutes = {dtype: run["max_iters"] * tokens / rows["sas_p", dtype]["tokens_per_s"] / 60 for dtype in ("float32", "bfloat16")}
    assert (f"the main job: {run['max_iters']} steps, {minutes['float32']:.0f} minutes on one thread in float32 "
            f"({minutes['bfloat16']:.0f} where --dtype auto picks bf16)") in readme
    speed, sas_p, muon = paragraph(readme, "**GPUs and speed.**"), rows["sas_p", "float32"], "pre_ln:optimizer=muon"
    pre_ln_model, sas_p_model = paper_models(18, 12, 768)
    fewer = lambda **kw: 100 * (1 - sas_p_model.num_params(**kw) / pre_ln_model.num_params(**kw))
    assert (f"{ideal(18, 12, 768):.2f}x for SAS-P at the paper's shapes, where it has {fewer():.1f}% fewer parameters, "
            f"{fewer(non_embedding=True):.0f}% outside the embeddings") in speed
    assert bench["device"].split(", ")[-1] in speed  # the CPU's kind
    assert f"SAS-P steps at {sas_p['speed_vs_pre_ln']:.2f}x Pre-LN's speed (its FLOP ideal {sas_p['flop_ideal']:.2f}x" in speed
    assert f"bf16 at {rows['sas_p', 'bfloat16']['speed_vs_first_dtype']:.2f}x float32's" in speed
    assert (f"Pre-LN's Muon step at {rows[muon, 'float32']['speed_vs_pre_ln']:.2f}x its AdamW step's speed in float32, "
            f"{rows[muon, 'bfloat16']['speed_vs_pre_ln']:.2f}x in bf16") in speed
    words = lambda n: {1: "one thread", 2: "two threads"}.get(n, f"{n} threads")
    timed = {}  # the comparison's cell timed by its two experiments: {threads: SAS-P's speed}
    for experiment in ("clm", "regime"):
        runs = [r for r in results["runs"] if r["experiment"] == experiment]
        final = tables.regime_rows(runs, plan.EXPERIMENTS[experiment])[plan.Cell(6, 4, 256, 800, warmup_frac=0.2, tokens="bpe")]
        threads = results["experiments"][experiment]["measured"]["threads"]
        timed[threads] = final["pre_ln"][0]["seconds_per_step"] / final["sas_p"][0]["seconds_per_step"]
        if experiment == "clm":  # the headline's
            reach = {config: f"{int(tables.reach_seconds(final[config], final['pre_ln'])):,}" for config in ("pre_ln", "sas_p")}
            assert (f"in {reach['sas_p']} s against {reach['pre_ln']} s (steps x bench.py's seconds a step, {words(threads)})"
                    in paragraph(readme, "**Here, on a CPU**"))
    quoted = f"{timed[1]:.2f}x with one thread, {timed[2]:.2f}x with two"
    assert f"SAS-P {quoted}." in speed
    assert f"| {quoted} (FLOP ideal {ideal(6, 4, 256):.2f}x)" in readme_row(readme, "| per second, SAS-P about the FLOP ratio faster")
    hours = sum(r["steps"] * r["seconds_per_step"] for r in results["runs"] if r["experiment"] == "clm") / 3600
    assert f"`python reproduce.py` (its committed runs: about {hours:.0f} hours on 2 CPU cores)" in paragraph(readme, "`python reproduce.py` (")


def test_the_readmes_quick_comparison_quotes_the_committed_quick_runs():
    """--quick's paragraph quotes the paired gaps of assets/quick's final runs (its 2 seeds)."""
    results = committed("assets/quick/results.json")
    if results is None:
        pytest.skip("no assets/quick committed")
    finals = {}
    for row in json.loads(results)["runs"]:
        if row["role"] == "final":
            finals.setdefault(row["config"], []).append(row)
    quick = paragraph(committed("README.md"), "`--quick` is its cheapest")
    for config, name in (("sas", "SAS"), ("sas_p", "SAS-P")):
        gaps = tables.paired_gaps(finals[config], finals["pre_ln"])
        quoted = f"{name} ({statistics.fmean(gaps):+.1f}%, {min(gaps):+.1f}..{max(gaps):+.1f})".replace("+-", "-")
        assert quoted in quick, quoted


def test_the_main_job_is_a_cell_of_the_study():
    """Once its cell has every tuned block on two seeds, train.py's CPU rates are the cell's tuned
    rates, and the README's "What you will see" is the table made from it; once emb_lr's rule says
    two rates train every block better, the preset's pairs are its best pairs and the table theirs."""
    results = json.loads(committed("assets/results.json") or '{"runs": []}')
    made = {title: markdown for _, title, markdown in report.tables(results)}
    emb_lr = [r for r in results["runs"] if r["experiment"] == "emb_lr"]
    if emb_lr and experiments.emb_lr.better(emb_lr, results):
        assert made["main job, two rates"] in committed("README.md")
        assert train_config.CPU_GPT_PAIRS == {config: experiments.emb_lr.rates(experiments.emb_lr.arm(
            emb_lr, experiments.emb_lr.MAIN, config)[0]) for config in experiments.emb_lr.TUNED}
        return
    rows = made.get("main job", "").splitlines()[2:]
    if len(rows) < len(plan.EXPERIMENTS["regime"]["tuned"]):
        pytest.skip(f"the main job's cell has {len(rows)} blocks on two seeds")
    assert made["main job"] in committed("README.md")
    assert {re.match(r"\| `(\w+)` \(lr ([^)]+)\)", row).groups() for row in rows} == {
        (block, f"{lr:g}") for block, lr in train_config.CPU_GPT_LR.items()}


def test_the_gpt_comparison_runs_in_the_regime_the_rule_chose():
    """EXPERIMENTS["clm"]'s regime is chosen_regime's choice from the committed factor study, at
    the default scale; quick is quick_regime's (where none is chosen yet, bytes in the chosen warmup
    and batch);
    large stays the record on bytes, a regime that trained (its 3,200-step point on BPE is past the
    budget). While the study has arms left the choice is provisional (a cell still to run may move
    it again), and the comparison may stay in a regime that trained at every tuned rate on every
    seed so far."""
    results = committed("assets/results.json")
    if results is None or "regime" not in json.loads(results)["experiments"]:
        pytest.skip("no factor study committed")
    results = json.loads(results)
    rows = [r for r in results["runs"] if r["experiment"] == "regime"]
    chosen, why = experiments.regime.chosen_regime(rows, plan.EXPERIMENTS["regime"])
    assert chosen, why
    trained = {cell.regime for cell, configs in tables.regime_rows(rows, plan.EXPERIMENTS["regime"]).items()
               if all(r["status"] == "trained" for rs in configs.values() for r in rs)}
    for scale, spec in plan.EXPERIMENTS["clm"]["scales"].items():
        cell = plan.Cell(spec["n_layer"], spec["n_head"], spec["n_embd"], spec["steps"][-1],
                              **{k: spec[k] for k in (*plan.REGIME, "tokens") if k in spec})
        if scale == "quick":
            quick = experiments.regime.quick_regime(rows, plan.EXPERIMENTS["regime"])[0]
            assert (cell.regime == quick.regime and cell.steps == quick.steps) if quick else (
                cell.regime[3:5] == chosen[0].regime[3:5] and cell.tokens == "bytes")
        elif scale == "large" or results["experiments"]["regime"]["unfinished"]:
            assert cell.regime in trained, (scale, cell.label)
        else:
            assert cell.regime == chosen[0].regime, (scale, cell.label, chosen[0].label)


def test_the_readme_has_no_placeholder_left():
    assert not re.findall(r"^[A-Z][A-Z_]{3,}$", (REPO / "README.md").read_text(), re.M)  # a line of its own


def test_every_figure_the_readme_shows_is_in_the_repo():
    figures = re.findall(r"\]\((assets/[^)]+\.png)\)", (REPO / "README.md").read_text())
    assert len(figures) >= 2  # the pattern finds them
    figures += [f"assets/{png}" for png in re.findall(r"\]\(([^)/]+\.png)\)", (REPO / "assets" / "REPORT.md").read_text())]
    for figure in figures:
        assert (REPO / figure).exists(), f"README.md shows {figure}, which is not in the repo"


def test_every_link_into_the_report_names_one_of_its_headings():
    """A README link to assets/REPORT.md#anchor lands on a heading (GitHub's anchor: lower case,
    spaces as hyphens, other punctuation but - and _ dropped)."""
    anchor = lambda heading: re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
    headings = {anchor(h) for h in re.findall(r"^#+ (.+)$", (REPO / "assets" / "REPORT.md").read_text(), re.M)}
    links = re.findall(r"\]\(assets/REPORT\.md#([^)]+)\)", (REPO / "README.md").read_text())
    assert links and headings  # the patterns find them
    assert [link for link in links if link not in headings] == []


def test_every_readme_section_the_code_points_to_is_there():
    """A message or comment saying "README: X" names a heading the README has."""
    headings = set(re.findall(r"^#+ (.+)$", (REPO / "README.md").read_text(), re.M))
    pointers = [(py.name, name) for py in REPO.glob("*.py")
                for name in re.findall(r"""README: ['"]?([A-Z][\w ]*\w)""", py.read_text())]
    assert len(pointers) >= 3  # the pattern finds them
    for path, name in pointers:
        assert name in headings, f"{path} points to the README's section {name!r}, which it does not have"


def test_the_committed_quick_baselines_are_made_by_this_code(tmp_path, monkeypatch):
    """--quick takes assets/quick's runs only where the code now computes what the code that made
    them did, with the same settings (reuse_baselines): a change of a number in the model, the
    trainer or a quick run's settings stales them, and must remake them:
    OMP_NUM_THREADS=1 python reproduce.py --quick, twice. A renamed or moved function does not."""
    results = committed("assets/quick/results.json")
    if results is None:
        pytest.skip("no assets/quick committed")
    monkeypatch.setattr(plan, "OUT", tmp_path)  # the probe's text goes there
    rows, probes = json.loads(results)["runs"], {}
    stale = {row["name"]: [k for k in protocol.stale(row, probes) if k != "data"] for row in rows}  # data: the machine's
    assert not any(stale.values()), {name: what for name, what in stale.items() if what}
    assert len(probes) == len({row["config"] for row in rows})  # a probe per arm, not per run


def test_every_experiment_draws_its_figures_from_the_committed_results(tmp_path):
    """Each experiment's module draws from results.json alone (a report writes them after the tables)."""
    pytest.importorskip("matplotlib")
    results = committed("assets/results.json")
    if results is None:
        pytest.skip("no assets/results.json committed")
    results = json.loads(results)
    for name in results["experiments"]:
        report.figures(name, results, tmp_path)
    assert {"path_fig3_vp_beta.png", "regime_map.png", "val_loss.png", "muon_val_loss.png"} <= {p.name for p in tmp_path.glob("*.png")}


@pytest.mark.filterwarnings("ignore:No artists with labels")  # a figure of Pre-LN's gaps without Pre-LN: no legend
def test_every_experiment_reports_while_an_arm_is_unfinished():
    """A report made while one tuned config's arm is not finished yet (as when a process is still
    training it), for each config in turn, at an experiment's longest length and at every length:
    every table and figure is made, and the other configs' runs at the longest length are in the tables."""
    plt = pytest.importorskip("matplotlib.pyplot")
    results = committed("assets/results.json")
    if results is None:
        pytest.skip("no assets/results.json committed")
    results = json.loads(results)
    for name in results["experiments"]:
        lengths = sorted({r["steps"] for r in results["runs"] if r["experiment"] == name})
        if not lengths:  # no arm finished yet: its finished runs are the report's "so far"
            continue
        shaped = set(plan.EXPERIMENTS[name]["tuned"][1:])  # the first is each table's reference
        for config in plan.EXPERIMENTS[name]["tuned"]:
            for unfinished_at in {lengths[-1]}, set(lengths):
                unfinished = lambda r: r["experiment"] == name and r["config"] == config and r["steps"] in unfinished_at
                kept = [r for r in results["runs"] if r["experiment"] in (name, "regime") and not unfinished(r)]  # rows reads regime's
                markdown = "\n".join(m for _, _, m in report.tables(dict(results, runs=kept), only=name))
                others = {r["config"] for r in kept if r["experiment"] == name and r["steps"] == lengths[-1] and r["role"] == "final"}
                assert all(f"| {other} |" in markdown for other in others & shaped), (name, config, unfinished_at)
                report.drawn(plt, name, dict(results, runs=kept))
                plt.close("all")
