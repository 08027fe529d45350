"""bench.py: its table, every model compiled whole, encoders timed with sparse prediction."""

import json
import re

import pytest
import torch

import bench
from simple_gpt import GPT, GPTConfig


# ----------------------------------------------------------------------------- bench.py

def test_bench_smoke(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rows = bench.main(["--blocks", "pre_ln,sas_p", "--n_layer", "2", "--n_head", "2", "--n_embd", "32",
                       "--batch_size", "2", "--seq_len", "16,32", "--vocab_size", "64", "--steps", "2",
                       "--warmup", "1", "--dtype", "float32", "--json", str(out)])  # one dtype on any CPU
    assert [(r["block"], r["seq_len"]) for r in rows] == [("pre_ln", 16), ("sas_p", 16), ("pre_ln", 32), ("sas_p", 32)]
    pre, sas_p = rows[0], rows[1]
    assert pre["speed_vs_pre_ln"] == 1.0 and sas_p["tokens_per_s"] > 0 and sas_p["attn_ms"] > 0
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
