"""bench.py: its table, every model compiled whole, encoders timed with sparse prediction."""

import json
import re

import pytest
import torch

import bench
import common
from simple_gpt import BLOCKS, GPT, MLP, GPTConfig


# ----------------------------------------------------------------------------- bench.py

def test_bench_smoke(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rows = bench.main(["--blocks", "pre_ln,sas_p", "--n_layer", "2", "--n_head", "2", "--n_embd", "32",
                       "--batch_size", "2", "--seq_len", "16,32", "--vocab_size", "64", "--steps", "3",
                       "--warmup", "1", "--dtype", "float32", "--json", str(out)])  # one dtype on any CPU
    assert [(r["block"], r["seq_len"]) for r in rows] == [("pre_ln", 16), ("sas_p", 16), ("pre_ln", 32), ("sas_p", 32)]
    pre, sas_p = rows[0], rows[1]
    assert pre["speed_vs_pre_ln"] == 1.0 and sas_p["tokens_per_s"] > 0 and sas_p["attn_ms"] > 0
    ratios = sorted(p / s for p, s in zip(pre["step_s"], sas_p["step_s"]))  # round by round: paired
    assert len(ratios) == 3 and sas_p["speed_vs_pre_ln"] == ratios[1]  # their median, not a mean or a ratio of medians
    assert sas_p["speed_quartiles"] == pytest.approx([(ratios[0] + ratios[1]) / 2, (ratios[1] + ratios[2]) / 2])
    assert sas_p["tokens_per_s"] == pytest.approx(2 * 16 / sorted(sas_p["step_s"])[1])
    assert sas_p["params"] == GPT(GPTConfig(block="sas_p", n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)).num_params()
    assert sas_p["params_vs_pre_ln"] < 1 and sas_p["flop_ideal"] > 1
    written = json.loads(out.read_text())  # a source a number can be quoted from: the device, threads, torch, day
    assert written["rows"] == json.loads(json.dumps(rows)) and written["device"] and written["threads"] >= 1
    assert written["torch"] == torch.__version__ and re.fullmatch(r"\d{4}-\d\d-\d\d", written["date"])
    assert "speed vs pre_ln" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--blocks", "sas_p"])  # no baseline


def test_bench_compiles_every_model_whole_at_every_length(monkeypatch):
    """Many models and a second length once ran past Dynamo's recompile limit, and the models
    past it uncompiled; here the limit is small and every frame must still compile whole."""
    from torch._dynamo.utils import counters
    torch.compiler.reset()  # no other test's frames against the small limit
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: real_compile(m, backend="eager", **kw))  # fast, same frames
    counters.clear()
    args = bench.parse_args(["--blocks", "pre_ln,sas_p,sas,parallel,v_skipinit", "--n_layer", "2", "--n_head", "2",
                             "--n_embd", "16", "--batch_size", "2", "--seq_len", "8,16", "--vocab_size", "32",
                             "--steps", "1", "--warmup", "1", "--compile", "--dtype", "float32"])
    # config.patch, not monkeypatch: monkeypatch's undo hides the option from every later compile
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"  # torch < 2.7
    with torch._dynamo.config.patch(**{limit: 2}):
        rows = bench.run(args)
    assert len(rows) == 10 and counters["frames"]["total"] == counters["frames"]["ok"] > 0
    assert not counters["graph_break"] and not counters["unimplemented"], dict(counters["unimplemented"])


def test_bench_times_encoders_with_sparse_prediction():
    args = ["--blocks", "pre_ln,sas_p,sas_p:none", "--n_layer", "2", "--n_head", "2", "--n_embd", "32",
            "--batch_size", "2", "--seq_len", "16", "--vocab_size", "64", "--steps", "1", "--warmup", "1", "--dtype", "float32"]
    clm, mlm = bench.main(args), bench.main(args + ["--objective", "mlm"])
    assert [r["block"] for r in mlm] == ["pre_ln", "sas_p", "sas_p:none"]
    assert mlm[2]["params"] == mlm[1]["params"] - 2 * 32 + 32  # 2 block norms gone, 1 on the embeddings added
    encoder = bench.Bench(bench.parse_args(args + ["--objective", "mlm"]), "sas_p", {}, 16, "float32")
    assert encoder.model.config.causal is False and encoder.positions.shape == (2, 4)
    # the output head runs at 4 of 16 positions, so an encoder step has fewer FLOPs: a higher ideal
    assert mlm[1]["flop_ideal"] > clm[1]["flop_ideal"] > 1 and mlm[1]["tokens_per_s"] > 0


def test_bench_refuses_what_it_cannot_time_and_times_a_block_without_attention(monkeypatch, capsys):
    tiny = ["--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--batch_size", "2", "--seq_len", "8",
            "--vocab_size", "32", "--dtype", "float32"]
    for bad, message in ((["--steps", "0"], "--steps 0 must be >= 1"), (["--compile", "--warmup", "0"], "1 with --compile"),
                         (["--blocks", "pre_ln,sas:schedule=cosine"], "no schedule")):
        with pytest.raises(SystemExit):
            bench.parse_args(["--blocks", "pre_ln,sas", *tiny, *bad])
        assert message in capsys.readouterr().err

    class NoAttention(torch.nn.Module):  # a block of one's own: an MLP alone
        def __init__(self, config, layer):
            super().__init__()
            self.mlp = MLP(config)

        def forward(self, x, cache=None):
            return x + self.mlp(x)

    monkeypatch.setitem(BLOCKS, "mlp_only", NoAttention)
    rows = bench.main(["--blocks", "pre_ln,mlp_only", *tiny, "--steps", "1", "--warmup", "0"])
    assert rows[1]["attn_ms"] is None and rows[1]["tokens_per_s"] > 0


def test_the_cpu_allocator_falls_back_to_no_mmap_where_glibc_refuses_the_threshold():
    class Libc:  # an older glibc: an mmap threshold over 32 MiB is refused
        def __init__(self):
            self.calls = []

        def mallopt(self, option, value):
            self.calls.append((option, value))
            return int(option != -3 or value <= 32 * 2**20)
    old, new = Libc(), Libc()
    common.tune_cpu_allocator(old)
    assert old.calls == [(-3, 2**31 - 1), (-4, 0), (-1, 2**31 - 1)]  # M_MMAP_MAX 0: nothing mapped
    new.mallopt = lambda option, value: new.calls.append((option, value)) or 1
    common.tune_cpu_allocator(new)
    assert new.calls == [(-3, 2**31 - 1), (-1, 2**31 - 1)]
