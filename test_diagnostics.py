"""diagnostics.py and outlier features (arXiv 2405.19279) on tiny models: the statistics every run
logs, int8 evaluation, the attention picture; the OP block, QK-norm and logit capping on every block."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import bench
import diagnostics
import prepare_data
import train
from conftest import tiny_run
from diagnostics import fake_int8, int8_inputs, kurtosis, outlier_stats, residual_streams
from simple_gpt import BLOCKS, GPT, MLP, Attention, GPTConfig, KVCache, ShapedAttention, SkipInitAttention

REPO = Path(__file__).resolve().parent


def tiny(block="op", **overrides):
    return GPTConfig(**{**dict(block=block, n_layer=3, n_head=2, n_embd=16, block_size=12, vocab_size=37), **overrides})


def model_of(block="op", seed=0, perturb=0.0, **overrides):
    torch.manual_seed(seed)
    model = GPT(tiny(block, **overrides))
    with torch.no_grad():  # off the initial values, so W_Q = 0 and unit gains hide nothing
        for p in model.parameters():
            p.add_(perturb * torch.randn_like(p))
    return model


def tokens(cfg, B=2, seed=1):
    return torch.randint(0, cfg.vocab_size, (B, cfg.block_size), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- the OP block

@pytest.mark.parametrize("switches", [{}, dict(op_trainable=True), dict(norm="none"), dict(qk_norm="none", mlp_ratio=2)])
def test_op_parameter_count_equals_closed_form(switches):
    """Pre-LN's 12 d^2 a layer (Q, K, V, P and a 4d MLP) with no block norm, QK-norm's weights
    on each head's queries and keys (2 d_k), and the two gains if trainable; outside the blocks,
    the final norm (and, with norm none, the embeddings' LayerNorm as every block has it)."""
    model = model_of(**switches)
    cfg = model.config
    d, L, hs = cfg.n_embd, cfg.n_layer, cfg.n_embd // cfg.n_head
    per_layer = 4 * d * d + 2 * cfg.mlp_ratio * d * d + (0 if cfg.qk_norm == "none" else 2 * hs) + 2 * cfg.op_trainable
    outer = 2 * d if cfg.norm == "none" else d
    assert model.num_params() == (cfg.vocab_size + cfg.block_size) * d + outer + L * per_layer


def test_op_forward_is_its_equation_with_depth_scaled_gains():
    model = model_of(perturb=0.3)
    block, L = model.transformer.h[1], model.config.n_layer
    assert block.beta_sa == block.beta_ff == pytest.approx(0.2 * math.sqrt(12 / L))  # op.yaml's 0.2 at 12 layers
    assert model_of(n_layer=12).transformer.h[0].beta_ff == pytest.approx(0.2)
    assert not any(isinstance(m, (nn.RMSNorm, nn.LayerNorm)) for m in block.modules() if m not in (block.attn.ln_q, block.attn.ln_k))
    assert isinstance(block.attn.ln_q, nn.RMSNorm) and "beta_ff" not in dict(model.named_parameters())  # fixed gains
    x = torch.randn(2, 7, model.config.n_embd)
    h = x + block.beta_sa * block.attn(x)
    torch.testing.assert_close(block(x), h + block.beta_ff * block.mlp(h))
    assert "transformer.h.0.beta_ff" in dict(model_of(op_trainable=True, op_beta=0.5).named_parameters())


# ----------------------------------------------------------------------------- QK-norm and logit capping

def test_qk_norm_and_logit_cap_are_config_switches_a_block_must_have(monkeypatch):
    for block in BLOCKS:
        tiny(block, qk_norm="rmsnorm", logit_cap=30.0)
    with pytest.raises(ValueError, match="valid: rmsnorm, none"):
        tiny("pre_ln", qk_norm="layernorm")
    with pytest.raises(ValueError, match="must be >= 0"):
        tiny("pre_ln", logit_cap=-1.0)
    with pytest.raises(ValueError, match="op_beta applies to op, not to sas"):
        tiny("sas", op_beta=0.3)
    # a block of one's own that says nothing takes the switches that act on attention, and no other
    class Mine(nn.Module):
        def __init__(self, config, layer):
            super().__init__()
            self.attn = Attention(config, value=nn.Identity(), proj=nn.Identity())

        def forward(self, x, cache=None):
            return x + self.attn(x, cache)

    monkeypatch.setitem(BLOCKS, "mine", Mine)
    assert GPT(tiny("mine", qk_norm="rmsnorm")).transformer.h[0].attn.ln_q.__class__ is nn.RMSNorm
    assert bench.parse_arm("mine:qk_norm=rmsnorm:logit_cap=30", "bench.py") == ("mine", dict(qk_norm="rmsnorm", logit_cap=30.0))
    with pytest.raises(SystemExit, match="beta_ff applies to v_skipinit, sas, sas_p, not to mine"):
        bench.parse_arm("mine:beta_ff=0.5", "bench.py")

    class Mixer(nn.Module):  # no attention: nothing for qk_norm to act on
        def __init__(self, config, layer):
            super().__init__()
            self.mlp = MLP(config)

        def forward(self, x, cache=None):
            return x + self.mlp(x)

    monkeypatch.setitem(BLOCKS, "mixer", Mixer)
    with pytest.raises(ValueError, match="act on simple_gpt's Attention, which mixer does not use"):
        GPT(tiny("mixer", logit_cap=30.0))


def rms_norm(t, weight):
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + torch.finfo(t.dtype).eps) * weight


def naive_attention(attn, x, causal):
    """Eqs. 2-5 with T x T matrices, QK-norm and the cap written out."""
    B, T, C = x.shape
    H = attn.n_head
    heads = lambda t: t.view(B, T, H, C // H).transpose(1, 2)
    q, k = (heads(t) for t in attn.c_qk(x).chunk(2, dim=2))
    if isinstance(attn.ln_q, nn.RMSNorm):
        q, k = rms_norm(q, attn.ln_q.weight), rms_norm(k, attn.ln_k.weight)
    logits = q @ k.transpose(-2, -1) / math.sqrt(C // H)
    if attn.logit_cap:
        logits = attn.logit_cap * torch.tanh(logits / attn.logit_cap)
    mask = torch.zeros(T, T).masked_fill(torch.ones(T, T).triu(1).bool(), -math.inf) if causal else torch.zeros(T, T)
    A = torch.softmax(logits + mask, dim=-1)
    if isinstance(attn, ShapedAttention):
        A = attn.alpha * torch.eye(T) + attn.beta * A - attn.gamma * torch.softmax(mask, dim=-1)
    elif isinstance(attn, SkipInitAttention):
        A = attn.alpha * torch.eye(T) + attn.beta * A
    return attn.c_proj((A @ heads(attn.c_v(x))).transpose(1, 2).reshape(B, T, C))


ATTENTION_SWITCHES = [("pre_ln", dict(qk_norm="rmsnorm")), ("pre_ln", dict(logit_cap=2.0)), ("op", {}),
                      ("op", dict(logit_cap=2.0)), ("sas", dict(qk_norm="rmsnorm", logit_cap=2.0)),
                      ("v_skipinit", dict(logit_cap=2.0)), ("sas_p", dict(attention="skipinit", logit_cap=2.0))]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block,switches", ATTENTION_SWITCHES)
def test_fast_attention_equals_the_naive_formula(block, switches, causal):
    model = model_of(block, perturb=0.5, causal=causal, **switches)
    x = torch.randn(2, model.config.block_size, model.config.n_embd)
    for layer in model.transformer.h:
        torch.testing.assert_close(layer.attn(x), naive_attention(layer.attn, x, causal), rtol=1e-5, atol=1e-5)
    if switches.get("logit_cap"):  # the cap bites: without it the output differs
        attn = model.transformer.h[1].attn
        capped, attn.logit_cap = attn(x), 0.0
        assert not torch.allclose(capped, attn(x), atol=1e-3)


@pytest.mark.parametrize("block,switches", ATTENTION_SWITCHES)
def test_causality_and_the_kv_cache_with_qk_norm_and_logit_cap(block, switches):
    model = model_of(block, perturb=0.3, **switches).eval()
    idx = tokens(model.config)
    changed = idx.clone()
    changed[:, 6] = (changed[:, 6] + 1) % model.config.vocab_size
    before, after = model(idx)[0], model(changed)[0]
    assert torch.equal(before[:, :6], after[:, :6]) and not torch.allclose(before[:, 6:], after[:, 6:])
    caches = [KVCache() for _ in model.transformer.h]
    model(idx[:, :-1], caches=caches)  # normed keys are cached; the newest query sees them all
    torch.testing.assert_close(model(idx[:, -1:], caches=caches)[0][:, -1], before[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block,switches", [("op", dict(logit_cap=2.0)), ("sas_p", dict(qk_norm="rmsnorm", logit_cap=2.0))])
def test_the_switches_compile_without_graph_breaks(block, switches):
    model = model_of(block, **switches)
    idx = tokens(model.config)
    compiled = torch.compile(model, backend="eager", fullgraph=True)  # fullgraph: a break raises
    torch.testing.assert_close(compiled(idx)[0], model(idx)[0])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block", ["sas", "sas_p"])
def test_shaped_attention_is_still_the_identity_at_init_with_qk_norm(block, causal):
    """RMSNorm of the zero query is exactly 0 (0 / sqrt(0 + eps)), so the logits are 0, softmax = C
    and A = alpha I + beta C - gamma C = I."""
    model = model_of(block, causal=causal, qk_norm="rmsnorm")
    x = torch.randn(2, model.config.block_size, model.config.n_embd)
    for layer in model.transformer.h:
        q, k = layer.attn.queries_keys(x)
        assert torch.equal(q, torch.zeros_like(q)) and k.pow(2).mean(-1).sub(1).abs().max() < 1e-3
        torch.testing.assert_close(layer.attn(x), layer.attn.c_v(x), rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- the statistics

def test_kurtosis_of_one_outlier_neuron_is_its_closed_form():
    """d neurons of mean square 1 but one of k^2: Kurt = d ((d - 1) + k^4) / ((d - 1) + k^2)^2."""
    n, d, k = 64, 8, 5.0
    h = torch.randint(0, 2, (n, d), generator=torch.Generator().manual_seed(0)).float() * 2 - 1  # +-1
    h[:, 3] *= k
    assert kurtosis(h).item() == pytest.approx(d * ((d - 1) + k**4) / ((d - 1) + k**2) ** 2, rel=1e-6)
    assert kurtosis(h.view(4, 16, d)).item() == pytest.approx(kurtosis(h).item())  # tokens of any batch shape
    assert kurtosis(torch.ones(n, d)).item() == pytest.approx(1.0)


def test_kurtosis_and_max_median_on_streams_of_known_answer():
    """Kurtosis: 1 when every neuron has the same power, d when one has it all; max/median: each
    token's largest |h| over its median, averaged over the tokens."""
    d = 8
    assert kurtosis(torch.ones(3, 5, d)).item() == pytest.approx(1)
    assert kurtosis(torch.zeros(3, 5, d).index_fill(-1, torch.tensor([2]), 4.0)).item() == pytest.approx(d)
    h = torch.ones(2, d).index_put((torch.tensor([0, 1]), torch.tensor([3, 5])), torch.tensor([6.0, -2.0]))
    assert diagnostics.max_median_ratio(h).item() == pytest.approx((6 + 2) / 2)


def test_outlier_stats_at_init_have_one_value_per_layer_and_uniform_attention():
    """Shaped attention starts with W_Q = 0: the softmax is uniform over each query's prefix, so
    its entropy is mean_i log i over the positions i = 1..T. Centring over the width ignores a
    shift shared by every neuron."""
    model = model_of("sas_p", n_layer=4)
    idx = tokens(model.config)
    stats = outlier_stats(model, *residual_streams(model, idx))
    T = model.config.block_size
    assert set(stats) == {"kurtosis", "max_median", "entropy"} and all(len(v) == 4 for v in stats.values())
    assert stats["entropy"] == pytest.approx([sum(math.log(i) for i in range(1, T + 1)) / T] * 4, abs=1e-4)
    assert all(k >= 1 for k in stats["kurtosis"]) and all(r >= 1 for r in stats["max_median"])
    streams, inputs = residual_streams(model, idx)
    shifted = outlier_stats(model, [s + 3.0 for s in streams], inputs)
    assert shifted["kurtosis"] == pytest.approx(stats["kurtosis"], abs=1e-3)


def test_fake_int8_is_the_identity_on_its_grid_and_int8_loss_is_close_to_float():
    grid = torch.arange(-127, 128).float() * 0.01
    assert torch.equal(fake_int8(grid), grid)
    model = model_of("pre_ln", perturb=0.1).eval()
    idx, targets = tokens(model.config), tokens(model.config, seed=2)
    loss = model(idx, targets)[1].item()
    with int8_inputs(model):
        loss_int8 = model(idx, targets)[1].item()
    assert loss_int8 != loss and abs(loss_int8 - loss) < 0.02 * loss
    assert model(idx, targets)[1].item() == loss  # the hooks are gone


# ----------------------------------------------------------------------------- in training

@pytest.fixture(scope="module")
def byte_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    (root / "corpus.txt").write_text("\n".join((REPO / f).read_text() for f in ("simple_gpt.py", "train.py")) * 2)
    prepare_data.main(["--input", str(root / "corpus.txt"), "--name", "tiny", "--data_dir", str(root), "--tokenizer", "bytes"])
    return root


@pytest.mark.parametrize("block,flags", [("pre_ln", []), ("op", []), ("sas_p", ["--qk_norm", "rmsnorm"])])
def test_a_run_logs_outlier_features_per_layer_and_learns(byte_corpus, tmp_path, block, flags):
    out = tmp_path / "run"
    train.main(["--dataset", "tiny", "--data_dir", str(byte_corpus), "--out_dir", str(out), "--block", block, *flags,
                "--n_layer", "2", "--n_head", "2", "--n_embd", "32", "--block_size", "32", "--batch_size", "8",
                "--max_iters", "20", "--eval_interval", "10", "--eval_tokens", "512", "--lr", "3e-3"])
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in records] == [0, 10, 20] and records[-1]["val_loss"] < records[0]["val_loss"] - 0.5
    for r in records:
        assert all(len(v) == 2 and all(math.isfinite(x) for x in v) for v in r["outliers"].values()), r["outliers"]
    assert records[-1]["outliers"] != records[0]["outliers"]
    assert "val_loss_int8" in records[-1] and not any("val_loss_int8" in r for r in records[:-1])
    assert abs(records[-1]["val_loss_int8"] - records[-1]["val_loss"]) < 0.05


def test_the_attention_picture_shows_the_identity_at_init_and_a_trained_run(corpus, tmp_path):
    pytest.importorskip("matplotlib")
    train.main(tiny_run(corpus, tmp_path / "run", "--max_iters", "3"))
    model, ckpt = diagnostics.load_model(tmp_path / "run", "cpu", "test")
    torch.manual_seed(ckpt["config"]["seed"])
    at_init = GPT(GPTConfig(**ckpt["model_config"]))
    idx = torch.randint(0, 257, (1, 10))
    for A in diagnostics.attention_matrices(at_init, idx):  # sas_p at init: every head's A is I
        torch.testing.assert_close(A, torch.eye(10).expand_as(A), rtol=0, atol=1e-6)
    assert not torch.allclose(diagnostics.attention_matrices(model, idx)[1], torch.eye(10))
    diagnostics.main([str(tmp_path / "run"), "--tokens", "10", "--out", str(tmp_path / "a.png")])
    assert (tmp_path / "a.png").stat().st_size > 10_000
    with pytest.raises(SystemExit, match="--head 3: .* has heads 1 to 2"):
        diagnostics.main([str(tmp_path / "run"), "--head", "3"])


def test_the_loss_by_token_frequency_adds_up_to_the_validation_loss(corpus):
    """Buckets of tokens ranked by their train count: their shares of the targets add to 1, their mean
    losses weighted by those shares to the model's loss on the same sequences; the most frequent
    bucket holds the most frequent token."""
    meta, paths = prepare_data.open_prepared(corpus / "tiny", 16)
    model = model_of("sas_p", perturb=0.3, vocab_size=64 * ((meta["vocab_size"] + 63) // 64), block_size=16).eval()
    offsets = prepare_data.spread_offsets(meta["val_tokens"], 10, 16)
    buckets = diagnostics.loss_by_frequency(model, paths, offsets, 16, edges=(4, 20), batch_size=3)
    assert [(first, last) for first, last, _, _ in buckets] == [(1, 4), (5, 20), (21, model.config.vocab_size)]
    tokens = diagnostics.loss_by_frequency(model, paths, offsets, 16, edges=(4, 20), n_tokens=meta["vocab_size"])
    assert tokens[-1][1] == meta["vocab_size"] and [b[2:] for b in tokens] == [b[2:] for b in buckets]  # padding never a target
    assert sum(share for _, _, share, _ in buckets) == pytest.approx(1)
    seqs = torch.from_numpy(prepare_data.sequences(paths["val"], offsets, 16))
    with torch.no_grad():
        whole = model(seqs[:, :-1], seqs[:, 1:])[1].item()
    assert sum(share * loss for _, _, share, loss in buckets if loss is not None) == pytest.approx(whole, rel=1e-5)
    train = torch.from_numpy(np.memmap(paths["train"], dtype=np.uint16, mode="r").astype(np.int64))
    top = train.bincount().argmax()  # the most frequent token: a target in the first bucket only
    assert (seqs[:, 1:] == top).any() and buckets[0][2] >= (seqs[:, 1:] == top).float().mean().item()
    with pytest.raises(ValueError, match="an encoder"):
        diagnostics.loss_by_frequency(model_of("sas_p", causal=False, vocab_size=model.config.vocab_size), paths, offsets, 16)
