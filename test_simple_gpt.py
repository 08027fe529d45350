"""The paper's invariants, tested on tiny models: run with `python -m pytest -q`."""

import json
import math
import os
import re
import signal
import subprocess
import sys
import shlex
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bench
import prepare_data
import reproduce
import train
from simple_gpt import BLOCKS, GPT, NORMS, GPTConfig, ReparamLinear, ShapedAttention, SkipInitAttention, token_similarity

REPO = Path(__file__).resolve().parent
# blocks of your own in every test parametrised over BLOCKS (README: "Hacking a variant"):
# SIMPLE_GPT_IMPORT=my_blocks.py python -m pytest -q -k mine
train.import_blocks([w for f in os.environ.get("SIMPLE_GPT_IMPORT", "").split(os.pathsep) if f for w in ("--import", f)],
                    "test_simple_gpt.py")


def tiny(block="sas_p", norm="rmsnorm", **overrides):
    cfg = dict(block=block, norm=norm, n_layer=3, n_head=2, n_embd=16, block_size=12, vocab_size=37)
    return GPTConfig(**{**cfg, **overrides})


def model_of(block="sas_p", norm="rmsnorm", seed=0, **overrides):
    torch.manual_seed(seed)
    return GPT(tiny(block, norm, **overrides))


@torch.no_grad()
def perturb(model, scale=0.3):
    """Move every parameter off its initial value, so W_Q = 0 and unit gains hide nothing."""
    for p in model.parameters():
        p.add_(scale * torch.randn_like(p))
    return model


def tokens(cfg, B=2, T=None, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (B, T or cfg.block_size), generator=g)


# ----------------------------------------------------------------------------- shapes, loss

@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("block", BLOCKS)
def test_logits_shape_and_initial_loss(block, norm):
    model = model_of(block, norm)
    cfg = model.config
    idx, targets = tokens(cfg, seed=1), tokens(cfg, seed=2)
    logits, loss = model(idx, targets)
    assert logits.shape == (2, cfg.block_size, cfg.vocab_size)
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.1
    assert model(idx)[1] is None


@pytest.mark.parametrize("block", BLOCKS)
def test_causality(block):
    model = perturb(model_of(block)).eval()
    idx = tokens(model.config)
    t = 6
    changed = idx.clone()
    changed[:, t] = (changed[:, t] + 1) % model.config.vocab_size
    before, after = model(idx)[0], model(changed)[0]
    assert torch.equal(before[:, :t], after[:, :t])  # bitwise: the past never sees the future
    assert not torch.allclose(before[:, t:], after[:, t:])


# ----------------------------------------------------------------------------- shaped attention

@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block", ["sas", "sas_p"])
def test_shaped_attention_is_identity_at_init(block, causal):
    model = model_of(block, causal=causal)
    x = torch.randn(2, model.config.block_size, model.config.n_embd)
    for layer in model.transformer.h:  # layer 0 with its value matrix alpha_V I + beta_V dW too
        torch.testing.assert_close(layer.attn(x), x, rtol=0, atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block", BLOCKS)
def test_attention_is_the_identity_at_init_exactly_where_it_is_shaped(block, causal):
    """A = I at init for shaped attention, whatever V and P surround it (V-SkipInit's orthogonal
    ones, SAS's first-layer value); ordinary softmax attention mixes tokens from the start."""
    model = model_of(block, causal=causal)
    x = torch.randn(2, model.config.block_size, model.config.n_embd)
    for layer in model.transformer.h:
        attn = layer.attn
        identity = torch.allclose(attn(x), attn.c_proj(attn.c_v(x)), rtol=0, atol=1e-6)
        assert identity == isinstance(attn, ShapedAttention), (block, type(attn).__name__)


def test_sas_and_sas_p_compute_the_same_function_at_init():
    for norm in NORMS:
        sas_p = model_of("sas_p", norm)
        sas = model_of("sas", norm)
        missing, unexpected = sas.load_state_dict(sas_p.state_dict(), strict=False)
        assert not unexpected and {k.split(".")[-1] for k in missing} <= {"weight", "alpha_ff"}
        idx = tokens(sas.config)
        torch.testing.assert_close(sas(idx)[0], sas_p(idx)[0], rtol=0, atol=1e-5)
        perturb(sas)
        assert not torch.allclose(sas(idx)[0], sas_p(idx)[0], atol=1e-3)


def reference_attention(attn, x, causal):
    """The paper's matrix formulas, T x T matrices and all: Eq. 2-3 for ordinary attention,
    Eq. 5 (alpha I + beta softmax(QK^T/sqrt(d_k) + M) - gamma C) for shaped attention, Eq. 4
    (alpha I + beta softmax(...)) for Value-SkipInit's."""
    B, T, C = x.shape
    H = attn.n_head
    heads = lambda t: t.view(B, T, H, C // H).transpose(1, 2)
    q, k = attn.c_qk(x).chunk(2, dim=2)
    q, k, v = heads(q), heads(k), heads(attn.c_v(x))
    mask = torch.zeros(T, T)
    if causal:
        mask = mask.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
    A = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(C // H) + mask, dim=-1)
    if isinstance(attn, SkipInitAttention):
        A = attn.alpha * torch.eye(T) + attn.beta * A
    elif isinstance(attn, ShapedAttention):
        Cmat = torch.softmax(mask, dim=-1)  # softmax of the mask alone
        A = attn.alpha * torch.eye(T) + attn.beta * A - attn.gamma * Cmat
    y = (A @ v).transpose(1, 2).reshape(B, T, C)
    return attn.c_proj(y)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block,switches", [("pre_ln", {}), ("sas", {}), ("v_skipinit", {}),
                                             ("sas", dict(attention="skipinit")), ("v_skipinit", dict(vp="orthogonal"))])
def test_fast_attention_equals_the_matrix_formula(block, switches, causal):
    model = perturb(model_of(block, causal=causal, **switches))
    x = torch.randn(2, model.config.block_size, model.config.n_embd)
    for layer in model.transformer.h:  # sas layer 0 has the value matrix, later layers do not
        expected = reference_attention(layer.attn, x, causal)
        torch.testing.assert_close(layer.attn(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_rank_collapse_only_without_skip_or_shaping(causal):
    """SPEC §6 claim 3: at init, naive skipless attention makes all tokens alike with depth;
    shaped attention keeps the embeddings' similarity, Pre-LN's skip keeps it far from 1."""
    sims = {}
    for block in ("skipless", "pre_ln", "sas", "sas_p"):
        model = model_of(block, n_layer=12, n_embd=64, n_head=4, block_size=32, causal=causal)
        sims[block] = token_similarity(model, tokens(model.config, B=4))
        assert len(sims[block]) == 13
    assert sims["skipless"][-1] > 0.95
    assert sims["pre_ln"][-1] < 0.5
    for block in ("sas", "sas_p"):
        assert abs(sims[block][-1] - sims[block][0]) < 0.02


# ----------------------------------------------------------------------------- parameters

PAPER_BLOCKS = ("pre_ln", "post_ln", "parallel", "skipless", "v_skipinit", "sas", "sas_p")


def closed_form_params(cfg):
    """SPEC §3: Pre-LN layers have 12 d^2 weights (Q, K, V, P: 4 d^2; MLP: 8 d^2); SAS and
    SAS-P 10 d^2, the first layer's value d^2 once, and 3H per-head gains plus the block gains.
    Norms have d weights (no biases). The ablations (SPEC §8): an MLP of width r d has 2 r d^2;
    Eq. 6's V and P have d^2 each in every layer, plus alpha and beta if trainable; Eq. 4's
    attention has no gamma; alpha_FF = 0 is no parameter; first_value=False drops layer 1's value."""
    d, L, H = cfg.n_embd, cfg.n_layer, cfg.n_head
    n = 0 if cfg.norm == "none" else d  # one block norm
    outer = 2 * d if cfg.norm == "none" else d  # final norm (+ embedding norm without block norms)
    embeddings = cfg.vocab_size * d + cfg.block_size * d
    shaped = cfg.block in ("v_skipinit", "sas", "sas_p")
    norms = {"parallel": n, "sas_p": n}.get(cfg.block, 2 * n)
    gains = (2 if cfg.attention == "skipinit" else 3) * H if shaped else 0
    gains += {"v_skipinit": 2 + (cfg.alpha_ff != 0), "sas": 2 + (cfg.alpha_ff != 0), "sas_p": 2}.get(cfg.block, 0)
    value_proj = 0 if cfg.block in ("sas", "sas_p") else 2 * d * d
    first_value = d * d + 2 if cfg.block in ("sas", "sas_p") and cfg.first_value else 0
    if cfg.vp:
        value_proj, first_value = 2 * d * d + (4 if cfg.vp_trainable else 0), 0
    per_layer = 2 * d * d + value_proj + 2 * cfg.mlp_ratio * d * d + norms + gains
    return embeddings + outer + L * per_layer + first_value


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("block", BLOCKS)
def test_parameter_count_equals_closed_form(block, norm):
    if block not in PAPER_BLOCKS:
        pytest.skip(f"no closed form for {block}: add one to closed_form_params")
    model = model_of(block, norm)
    assert model.num_params() == closed_form_params(model.config)
    cfg = model.config
    assert model.num_params(non_embedding=True) == model.num_params() - (cfg.vocab_size + cfg.block_size) * cfg.n_embd


@pytest.mark.parametrize("block,switches", [
    ("pre_ln", dict(vp="identity")), ("v_skipinit", dict(vp="orthogonal", vp_beta=0.5)),
    ("v_skipinit", dict(vp="identity", vp_beta=0.2, vp_trainable=True)), ("sas", dict(vp="identity", vp_trainable=True, vp_beta=0.2)),
    ("sas", dict(alpha_ff=0.0, mlp_slope=0.2)), ("sas_p", dict(attention="skipinit")), ("sas", dict(first_value=False)),
    ("pre_ln", dict(mlp_ratio=2)), ("sas_p", dict(mlp_ratio=2, norm="none")),
])
def test_parameter_count_of_the_ablations_equals_closed_form(block, switches):
    model = model_of(block, **switches)
    assert model.num_params() == closed_form_params(model.config)


def test_flops_count_only_the_matmuls_a_block_has():
    pre, sas_p = model_of("pre_ln"), model_of("sas_p")
    d, L, T, V = 16, 3, 12, 37
    attention = 12 * L * d * T
    assert pre.flops_per_token() == 6 * (12 * d * d * L + V * d) + attention
    assert sas_p.flops_per_token() == 6 * (10 * d * d * L + d * d + V * d) + attention
    # sparse prediction (MLM): the output head runs at a quarter of the positions
    assert sas_p.flops_per_token(predicted=0.25) == 6 * (10 * d * d * L + d * d + V * d / 4) + attention


def test_no_weight_decay_on_gains_and_norms():
    ablations = [tiny("v_skipinit", vp="identity", vp_beta=0.2, vp_trainable=True), tiny("sas", attention="skipinit")]
    for cfg in [tiny(block) for block in BLOCKS] + ablations:
        model = GPT(cfg)
        opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.999), "cpu")
        name = {id(p): n for n, p in model.named_parameters()}
        decayed = {name[id(p)] for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
        kept = {name[id(p)] for g in opt.param_groups if g["weight_decay"] == 0 for p in g["params"]}
        assert decayed | kept == set(name.values()) and not decayed & kept
        is_gain_or_norm = lambda n: n.split(".")[-1] in ("alpha", "beta", "gamma", "beta_sa", "alpha_ff", "beta_ff") or ".ln_" in n
        assert all(not is_gain_or_norm(n) for n in decayed), decayed
        assert all(is_gain_or_norm(n) for n in kept), kept
        assert "transformer.wte.weight" in decayed


@pytest.mark.parametrize("norm", ["rmsnorm", "none"])
@pytest.mark.parametrize("block", BLOCKS)
def test_gradients_reach_every_parameter(block, norm):
    model = perturb(model_of(block, norm), scale=0.05)
    idx = tokens(model.config)
    model(idx, tokens(model.config, seed=2))[1].backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, n


# ----------------------------------------------------------------------------- generation

@pytest.mark.parametrize("block", BLOCKS)
def test_cached_generation_equals_uncached(block):
    model = perturb(model_of(block), scale=0.2).eval()
    cfg = model.config
    prompt = tokens(cfg, B=2, T=5)
    n_new = cfg.block_size + 4  # past block_size: the context window slides
    torch.manual_seed(0)
    cached = model.generate(prompt, n_new, top_k=1)
    uncached = prompt
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(uncached[:, -cfg.block_size:])[0][:, -1]
            uncached = torch.cat([uncached, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cached, uncached)


def test_generate_samples_with_temperature_and_top_k():
    model = model_of("sas_p").eval()
    torch.manual_seed(0)
    out = model.generate(tokens(model.config, B=3, T=2), 7, temperature=0.8, top_k=5)
    assert out.shape == (3, 9) and out.max() < model.config.vocab_size


# ----------------------------------------------------------------------------- training

@pytest.mark.parametrize("block,norm", [(b, "rmsnorm") for b in BLOCKS] + [("sas_p", "none"), ("sas", "layernorm")])
def test_every_block_learns(block, norm):
    model = model_of(block, norm, n_layer=4, n_embd=32, n_head=4)
    opt = model.configure_optimizers(0.0, 3e-3, (0.9, 0.999), "cpu")
    idx = tokens(model.config, B=4, seed=3)
    x, y = idx[:, :-1], idx[:, 1:]
    first = model(x, y)[1].item()
    for _ in range(40):
        loss = model(x, y)[1]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    # naive skipless falls the least (rank collapse), the others memorise the batch
    assert loss.item() < first - 0.5, (first, loss.item())


@pytest.mark.parametrize("block", BLOCKS)
def test_compiles_without_graph_breaks(block):
    model = model_of(block)
    compiled = torch.compile(model, backend="eager", fullgraph=True)  # fullgraph: a break raises
    idx = tokens(model.config)
    torch.testing.assert_close(compiled(idx)[0], model(idx)[0])


def train_steps_compiled(model, lengths, positions=None):
    """Training steps of torch.compile(model, fullgraph=True) (a graph break raises) at these
    sequence lengths; then the same and a new length again, where a recompilation raises."""
    torch.compiler.reset()
    compiled = torch.compile(model, fullgraph=True)  # inductor, the default: what train.py and bench.py use
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.999), "cpu")

    def step(T):
        idx = tokens(model.config, T=T)
        pos = None if positions is None else positions[:, :T // 2]
        loss = compiled(idx, idx if pos is None else idx.gather(1, pos), positions=pos)[1]
        loss.backward()
        opt.step()
        opt.zero_grad()

    for T in lengths:  # the second length compiles once more, with the length dynamic
        step(T)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for T in (lengths[-1], lengths[0], model.config.block_size):
            step(T)


def test_the_model_compiles_whole_at_two_lengths_and_never_again():
    train_steps_compiled(model_of("sas_p", block_size=16, n_layer=2), lengths=(8, 12))


def test_the_encoder_with_sparse_positions_compiles_whole():
    positions = torch.arange(16).repeat(2, 1)  # the first T/2 positions of each sequence
    train_steps_compiled(model_of("sas_p", block_size=16, n_layer=2, causal=False), lengths=(8, 12), positions=positions)


@pytest.mark.parametrize("block", ["pre_ln", "sas_p", "v_skipinit"])
def test_bf16_autocast_close_to_fp32(block):
    model = perturb(model_of(block), scale=0.05)
    idx, targets = tokens(model.config), tokens(model.config, seed=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(idx, targets)
    assert logits.dtype == torch.bfloat16
    assert abs(loss.item() - model(idx, targets)[1].item()) < 0.05


# ----------------------------------------------------------------------------- the encoder (MLM)

@pytest.mark.parametrize("block", BLOCKS)
def test_bidirectional_models_see_both_ways(block):
    model = perturb(model_of(block, causal=False)).eval()
    idx = tokens(model.config)
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % model.config.vocab_size
    assert not torch.allclose(model(idx)[0][:, 0], model(changed)[0][:, 0])  # the first token sees the last


@pytest.mark.parametrize("block", ["pre_ln", "sas_p"])
def test_sparse_prediction_equals_the_full_logits_at_the_same_positions(block):
    model = perturb(model_of(block, causal=False), scale=0.05)
    idx = tokens(model.config, B=3)
    positions = torch.rand(3, model.config.block_size, generator=torch.Generator().manual_seed(0)).argsort(1)[:, :4]
    targets = tokens(model.config, B=3, T=4, seed=5)
    logits, loss = model(idx, targets, positions=positions)
    full = model(idx)[0][torch.arange(3)[:, None], positions]  # (3, 4, vocab)
    torch.testing.assert_close(logits, full)
    torch.testing.assert_close(loss, F.cross_entropy(full.flatten(0, 1), targets.flatten()))


def test_masking_rate_and_the_80_10_10_split():
    B, T, mask_token, n_tokens = 4000, 128, 300, 257
    masking = train.Masking(0.25, T, mask_token, n_tokens)
    x = torch.randint(0, n_tokens, (B, T), generator=torch.Generator().manual_seed(1))
    positions, put = masking.draw((B,), torch.Generator().manual_seed(0))
    inputs, targets = train.Masking.apply(x, positions, put)
    assert positions.shape == targets.shape == (B, 32)  # 25% of 128, in every sequence
    assert (positions.sort(1).values.diff(dim=1) > 0).all()  # distinct positions
    per_position = torch.bincount(positions.flatten(), minlength=T) / B
    assert (per_position - 0.25).abs().max() < 0.04  # every position alike
    at = inputs.gather(1, positions)
    masked, kept = (at == mask_token).float().mean(), (at == targets).float().mean()
    assert abs(masked - 0.8) < 0.01 and abs(kept - 0.1 - 0.1 / n_tokens) < 0.01  # random tokens hit the original 1/257
    assert abs((put == -1).float().mean() - 0.1) < 0.01 and at.max() <= mask_token
    assert torch.equal(targets, x.gather(1, positions))
    chosen = torch.zeros(B, T, dtype=torch.bool).scatter(1, positions, True)
    assert torch.equal(inputs[~chosen], x[~chosen])  # the unchosen positions are the context, unchanged


def test_masked_loss_ignores_what_is_not_masked():
    """The loss is the cross-entropy at the chosen positions only: a different token elsewhere in
    the original text changes the context, never the targets or the positions scored."""
    masking = train.Masking(0.25, 12, mask_token=36, n_tokens=36)
    x = torch.randint(0, 36, (2, 12), generator=torch.Generator().manual_seed(0))
    positions, put = masking.draw((2,), torch.Generator().manual_seed(1))
    unchosen = [t for t in range(12) if t not in positions[0].tolist()][0]
    changed = x.clone()
    changed[0, unchosen] = (changed[0, unchosen] + 1) % 36
    (inputs, targets), (inputs2, targets2) = train.Masking.apply(x, positions, put), train.Masking.apply(changed, positions, put)
    assert torch.equal(targets, targets2) and (inputs != inputs2).sum() == 1
    model = perturb(model_of("sas_p", causal=False), scale=0.05)
    dense = torch.full((2, 12), -100).scatter(1, positions, targets)  # every position, -100: not scored
    expected = F.cross_entropy(model(inputs)[0].flatten(0, 1), dense.flatten(), ignore_index=-100)
    torch.testing.assert_close(model(inputs, targets, positions=positions)[1], expected)


@pytest.mark.parametrize("block,norm", [(b, "rmsnorm") for b in BLOCKS] + [("sas_p", "none")])
def test_every_block_learns_a_toy_mlm_task(block, norm):
    """Four fixed sequences, fresh masks every step: the model learns to fill them in."""
    model = model_of(block, norm, n_layer=4, n_embd=32, n_head=4, causal=False)
    cfg = model.config
    masking = train.Masking(0.25, cfg.block_size, mask_token=cfg.vocab_size - 1, n_tokens=cfg.vocab_size - 1)
    x = tokens(cfg, B=4, seed=3) % (cfg.vocab_size - 1)
    g = torch.Generator().manual_seed(0)
    held_out = masking.draw((4,), torch.Generator().manual_seed(99))
    held_out_loss = lambda: model(*train.Masking.apply(x, *held_out), positions=held_out[0])[1].item()
    opt = model.configure_optimizers(0.0, 3e-3, (0.9, 0.999), "cpu")
    first = held_out_loss()
    for _ in range(60):
        positions, put = masking.draw((4,), g)
        loss = model(*train.Masking.apply(x, positions, put), positions=positions)[1]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    # naive skipless learns least: bidirectional rank collapse makes every position alike
    assert first - held_out_loss() > (0.25 if block == "skipless" else 1.0), (first, held_out_loss())


def test_generate_refuses_an_encoder():
    with pytest.raises(ValueError, match="needs a causal model"):
        model_of(causal=False).generate(tokens(tiny(), B=1, T=3), 2)


# ----------------------------------------------------------------------------- the paper's ablations (SPEC §8)

def test_eq6_with_beta_fixed_at_zero_and_identity_is_the_identity_even_after_training():
    model = perturb(model_of("pre_ln", vp="identity"))  # Fig. 23: Pre-LN with W^V = W^P = I
    opt = model.configure_optimizers(0.1, 1e-2, (0.9, 0.999), "cpu")
    idx = tokens(model.config)
    for _ in range(2):
        model(idx, tokens(model.config, seed=2))[1].backward()
        opt.step()
        opt.zero_grad()
    x = torch.randn(2, 5, model.config.n_embd)
    for block in model.transformer.h:
        assert isinstance(block.attn.c_v, ReparamLinear) and not block.attn.c_v.beta.requires_grad
        torch.testing.assert_close(block.attn.c_v(x), x, rtol=0, atol=0)
        torch.testing.assert_close(block.attn.c_proj(x), x, rtol=0, atol=0)


def test_an_eq6_step_on_dw_does_not_depend_on_beta_so_w_moves_beta_times_as_far():
    """App. A: with Adam the first step of dW is the same for every beta, so W = W_init + beta dW
    moves as if its learning rate were scaled by beta."""
    x, target, eye = torch.randn(16, 8), torch.randn(16, 8), torch.eye(8)
    steps = {}
    for beta in (0.2, 1.0):
        torch.manual_seed(0)
        layer = ReparamLinear(8, "orthogonal", beta=beta, trainable=False)
        layer.init_paper()  # the same random orthogonal W_init for both
        w_before = layer(eye).detach()
        opt = torch.optim.Adam(layer.parameters(), lr=1e-2)
        (layer(x) - target).pow(2).sum().backward()
        opt.step()
        steps[beta] = layer.dW.weight.detach().clone(), layer(eye).detach() - w_before
    torch.testing.assert_close(steps[0.2][0], steps[1.0][0])
    torch.testing.assert_close(steps[0.2][1], 0.2 * steps[1.0][1])
    assert steps[1.0][1].abs().max() > 1e-3  # it did move


def test_orthogonal_w_init_is_orthogonal_saved_and_never_trained():
    model = model_of("v_skipinit", vp="orthogonal", vp_beta=0.5)
    layers = [m for m in model.modules() if isinstance(m, ReparamLinear)]
    assert len(layers) == 2 * model.config.n_layer
    before = [m.W_init.clone() for m in layers]
    for w in before:
        torch.testing.assert_close(w @ w.T, torch.eye(len(w)), rtol=0, atol=1e-5)
    assert not any("W_init" in name for name, _ in model.named_parameters())
    assert sum("W_init" in key for key in model.state_dict()) == len(layers)  # a checkpoint keeps them
    opt = model.configure_optimizers(0.1, 1e-2, (0.9, 0.999), "cpu")
    model(tokens(model.config), tokens(model.config, seed=2))[1].backward()
    opt.step()
    assert all(torch.equal(m.W_init, w) for m, w in zip(layers, before))
    assert any(m.dW.weight.abs().sum() > 0 for m in layers)  # while dW trains


def test_trainable_eq6_gains_start_at_one_and_beta_and_train():
    model = model_of("v_skipinit", vp="identity", vp_beta=0.2, vp_trainable=True)
    layers = [m for m in model.modules() if isinstance(m, ReparamLinear)]
    assert all(m.alpha.item() == 1.0 and m.beta.item() == pytest.approx(0.2) for m in layers)
    x = torch.randn(2, 5, model.config.n_embd)
    torch.testing.assert_close(layers[0](x), x)  # dW = 0: W = alpha I at init
    model(tokens(model.config), tokens(model.config, seed=2))[1].backward()
    assert all(m.alpha.grad is not None and m.beta.grad is not None for m in layers)


def test_alpha_ff_zero_removes_the_mlp_skip():
    model = perturb(model_of("sas", alpha_ff=0.0))
    block = model.transformer.h[1]
    assert "alpha_ff" not in dict(block.named_parameters())  # nothing can train the skip back
    x = torch.randn(2, 7, model.config.n_embd)
    h = block.beta_sa * block.attn(block.ln_1(x))
    torch.testing.assert_close(block(x), block.beta_ff * block.mlp(block.ln_2(h)))
    assert "alpha_ff" in dict(model_of("sas").transformer.h[1].named_parameters())


def test_leaky_relu_and_mlp_width():
    model = perturb(model_of("sas", mlp_slope=0.2, mlp_ratio=2))
    mlp = model.transformer.h[0].mlp
    assert mlp.c_fc.out_features == 2 * model.config.n_embd
    x = torch.randn(3, model.config.n_embd)
    torch.testing.assert_close(mlp(x), mlp.c_proj(F.leaky_relu(mlp.c_fc(x), 0.2)))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block", ["sas", "sas_p", "v_skipinit"])
def test_eq4_attention_is_the_identity_at_init_without_centring(block, causal):
    model = model_of(block, attention="skipinit", causal=causal)
    x = torch.randn(2, model.config.block_size, model.config.n_embd)
    for layer in model.transformer.h:
        attn = layer.attn
        assert isinstance(attn, SkipInitAttention) and attn.gamma is None and attn.beta.abs().sum() == 0
        torch.testing.assert_close(attn(x), attn.c_proj(attn.c_v(x)), rtol=0, atol=1e-6)


def test_first_layer_value_fixed_to_identity():
    model = model_of("sas_p", first_value=False)
    assert all(isinstance(block.attn.c_v, torch.nn.Identity) for block in model.transformer.h)
    assert isinstance(model_of("sas_p").transformer.h[0].attn.c_v, ReparamLinear)  # the default keeps it


@pytest.mark.parametrize("block,switches,message", [
    ("pre_ln", dict(alpha_ff=0.0), "alpha_ff applies to v_skipinit, sas, not to pre_ln"),
    ("pre_ln", dict(beta_ff=0.1), "beta_ff applies to v_skipinit, sas, sas_p"),
    ("parallel", dict(attention="skipinit"), "attention applies to"),
    ("v_skipinit", dict(first_value=False), "first_value applies to sas, sas_p"),
    ("sas", dict(vp_beta=0.5), "give vp too"),
    ("sas", dict(vp="random"), "valid: identity, orthogonal"),
    ("sas", dict(vp="identity", vp_trainable=True), "vp_trainable needs vp_beta > 0"),
    ("sas", dict(attention="plain"), "valid: shaped, skipinit"),
])
def test_a_switch_the_block_lacks_is_an_error(block, switches, message):
    with pytest.raises(ValueError, match=message):
        tiny(block, **switches)


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("overrides,message", [
    (dict(block="sasp"), "valid: pre_ln, post_ln, parallel, skipless, v_skipinit, sas, sas_p"),
    (dict(norm="batchnorm"), "valid: rmsnorm, layernorm, none"),
    (dict(n_embd=30, n_head=4), "divisible"),
    (dict(n_layer=0), ">= 1"),
])
def test_bad_config_raises_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny(**overrides)


def test_too_long_sequence_raises():
    model = model_of()
    with pytest.raises(ValueError, match="longer than block_size"):
        model(torch.zeros(1, model.config.block_size + 1, dtype=torch.long))


# ============================================================================= data and trainer

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A byte-level dataset made from this repo's own source: no tokenizer files needed."""
    root = tmp_path_factory.mktemp("data")
    text = "\n".join((REPO / f).read_text() for f in ("simple_gpt.py", "train.py", "prepare_data.py"))
    (root / "corpus.txt").write_text(text * 2)
    prepare_data.main(["--input", str(root / "corpus.txt"), "--name", "tiny",
                       "--data_dir", str(root), "--tokenizer", "bytes"])
    return root


def tiny_run(corpus, out_dir, *extra):
    return ["--dataset", "tiny", "--data_dir", str(corpus), "--out_dir", str(out_dir),
            "--block", "sas_p", "--n_layer", "2", "--n_head", "2", "--n_embd", "32", "--block_size", "32",
            "--batch_size", "4", "--max_iters", "6", "--eval_interval", "3", "--eval_tokens", "512",
            "--log_interval", "1", *extra]


def losses_printed(text):
    return {int(i): float(v) for i, v in re.findall(r"iter (\d+)/\d+ \| loss ([\d.]+)", text)}


def log_records(out_dir):
    return [json.loads(line) for line in (Path(out_dir) / "log.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------- prepare_data

def test_prepare_data_writes_a_split_dataset_once(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(60):
        (src / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n")
    args = ["--input", str(src), "--name", "code", "--data_dir", str(tmp_path), "--tokenizer", "bytes"]
    meta = prepare_data.main(args)
    out = tmp_path / "code"
    train_ids = np.fromfile(out / "train.bin", dtype=np.uint16)
    val_ids = np.fromfile(out / "val.bin", dtype=np.uint16)
    assert (len(train_ids), len(val_ids)) == (meta["train_tokens"], meta["val_tokens"])
    assert meta["val_tokens"] > 0 and meta["tokenizer"] == "bytes" and meta["vocab_size"] == 257
    n_val_docs = sum(prepare_data.split_of(p.name) == "val" for p in src.iterdir())  # by path below src
    assert (val_ids == 256).sum() == n_val_docs and (train_ids == 256).sum() == 60 - n_val_docs
    text = prepare_data.Tokenizer("bytes").decode(train_ids.tolist())
    assert "def f" in text and "return x *" in text
    mtime = (out / "train.bin").stat().st_mtime_ns
    prepare_data.main(args)
    assert "already prepared" in capsys.readouterr().out
    assert (out / "train.bin").stat().st_mtime_ns == mtime


def test_prepare_data_leaves_nothing_half_written(tmp_path):
    def documents():
        for i in range(600):
            yield prepare_data.split_of(f"doc{i}"), "x = 1\n" * 10
        raise KeyboardInterrupt  # Ctrl-C mid-way

    with pytest.raises(KeyboardInterrupt):
        prepare_data.prepare(tmp_path / "d", documents(), "test", prepare_data.Tokenizer("bytes"))
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [".prepare.lock"]


@pytest.mark.skipif(prepare_data.fcntl is None, reason="no file locks on this platform")
def test_a_preparation_waits_for_one_in_progress(corpus, tmp_path):
    args = [sys.executable, str(REPO / "prepare_data.py"), "--input", str(corpus / "corpus.txt"), "--name", "race",
            "--data_dir", str(tmp_path), "--tokenizer", "bytes"]
    with prepare_data.locked(tmp_path / "race" / ".prepare.lock"):  # as another process preparing it would
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            pass
        assert proc.poll() is None and not (tmp_path / "race" / "meta.json").exists()  # it waits
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0 and "waiting for another process preparing" in out and "wrote" in out


@pytest.mark.skipif(prepare_data.fcntl is None, reason="no file locks on this platform")
def test_two_preparations_at_once_write_one_whole_dataset(corpus, tmp_path):
    """Two processes preparing one dataset (two reproduce.py on a fresh clone): the second waits
    for the first and finds it prepared; neither fails, no temporary file is left."""
    args = [sys.executable, str(REPO / "prepare_data.py"), "--input", str(corpus / "corpus.txt"), "--name", "race",
            "--data_dir", str(tmp_path), "--tokenizer", "bytes"]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sum("already prepared" in out for out in outs) == 1, outs
    out = tmp_path / "race"
    assert sorted(p.name for p in out.iterdir()) == [".prepare.lock", "meta.json", "train.bin", "val.bin"]
    assert (out / "train.bin").read_bytes() == (corpus / "tiny" / "train.bin").read_bytes()


def test_a_broken_meta_json_of_the_default_corpus_is_prepared_again(tmp_path, monkeypatch):
    folder = tmp_path / prepare_data.DEFAULT_DATASET
    folder.mkdir()
    (folder / "meta.json").write_bytes(b"\xff\xfe not json")
    prepared = []
    monkeypatch.setattr(prepare_data, "main", lambda argv: prepared.append(argv))
    with pytest.raises(SystemExit, match="meta.json is broken"):  # the stand-in prepared nothing
        train.load_dataset(train.TrainConfig(data_dir=str(tmp_path)), master=True)
    assert prepared == [["--data_dir", str(tmp_path)]]


def test_a_broken_meta_json_is_one_line_that_says_how_to_prepare_again(corpus, tmp_path):
    broken = tmp_path / "tiny"
    broken.mkdir()
    for f in ("train.bin", "val.bin"):
        (broken / f).write_bytes((corpus / "tiny" / f).read_bytes())
    (broken / "meta.json").write_text('{"vocab_size": 2')  # cut short
    with pytest.raises(SystemExit, match=r"tiny/meta.json is broken .*prepare_data.py --input YOUR_FILES --name tiny"):
        train.train(train.parse_args(tiny_run(tmp_path, tmp_path / "out")))


def test_tokenizer_falls_back_to_bytes_offline(monkeypatch, capsys):
    import tiktoken

    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    assert prepare_data.load_tokenizer("auto").name == "bytes"
    warning = capsys.readouterr().err
    assert warning.count("\n") == 1 and "TIKTOKEN_CACHE_DIR" in warning
    with pytest.raises(SystemExit, match="TIKTOKEN_CACHE_DIR"):
        prepare_data.load_tokenizer("gpt2")


def test_codeparrot_loading_code_on_a_local_stand_in(tmp_path, monkeypatch):
    calls = []

    def load_dataset(name, split, streaming):
        calls.append((name, split, streaming))
        return [{"content": f"import os\nprint({i})\n"} for i in range(300)]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    meta = prepare_data.main(["--dataset", "codeparrot", "--data_dir", str(tmp_path), "--tokenizer", "bytes"])
    assert calls == [(prepare_data.CODEPARROT, "train", True)]
    assert meta["documents"] == 300 and meta["source"] == f"hf:{prepare_data.CODEPARROT}"
    assert (tmp_path / "codeparrot" / "val.bin").stat().st_size > 0


def test_codeparrot_errors_are_one_line(tmp_path, monkeypatch):
    args = ["--dataset", "codeparrot", "--data_dir", str(tmp_path), "--tokenizer", "bytes"]
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(SystemExit, match="pip install datasets"):
        prepare_data.main(args)

    def unreachable(*args, **kwargs):
        raise ConnectionError("Failed to resolve 'huggingface.co'")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=unreachable))
    with pytest.raises(SystemExit, match="could not read .*ConnectionError"):
        prepare_data.main(args)


# ----------------------------------------------------------------------------- train.py

def test_training_logs_checkpoints_and_samples(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    train.main(tiny_run(corpus, out, "--block", "sas"))
    printed = capsys.readouterr().out
    records = log_records(out)
    assert [r["iter"] for r in records] == [0, 3, 6]
    assert records[-1]["val_loss"] < records[0]["val_loss"]
    assert records[0]["train_loss"] is None and records[-1]["train_loss"] > 0
    gains = records[-1]["gains"]
    assert len(gains["alpha"]) == len(gains["beta_ff"]) == 2 and len(gains["value_beta_over_alpha"]) == 1
    assert all(k in records[-1] for k in ("elapsed_s", "lr", "tokens"))
    assert records[-1]["gains"]["beta_ff"] != records[0]["gains"]["beta_ff"]  # the gains train
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == 6 and not any(k.startswith("_orig_mod") for k in ckpt["model"])
    assert ckpt["model_config"]["block"] == "sas" and isinstance(ckpt["config"], dict)
    assert "sample:" in printed and len(losses_printed(printed)) == 6
    train.main(tiny_run(corpus, out, "--block", "sas", "--sample", "--sample_tokens", "20"))
    assert capsys.readouterr().out.startswith("def ")


def test_mlm_training_logs_and_fills_in_masks(corpus, tmp_path, capsys):
    out = tmp_path / "mlm"
    train.main(tiny_run(corpus, out, "--objective", "mlm", "--max_iters", "30", "--eval_interval", "15", "--lr", "3e-3"))
    printed = capsys.readouterr().out
    records = log_records(out)
    assert "masked LM, bidirectional, 8 of 32 positions masked" in printed
    assert records[-1]["val_loss"] < records[0]["val_loss"] - 1
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["config"]["objective"] == "mlm" and ckpt["model_config"]["causal"] is False
    assert ckpt["model_config"]["vocab_size"] == 320  # 257 bytes + the mask token, padded
    train.main(tiny_run(corpus, out, "--sample", "--prompt", "def [MASK](x): [MASK]"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0][:4] + lines[0][5:10] == "def (x): " and len(lines[0]) == 11  # one byte in each blank
    assert [line.split(":")[0] for line in lines[1:]] == ["[MASK] 1", "[MASK] 2"]
    assert lines[1].count("|") == 4  # the top 5 guesses, with probabilities
    with pytest.raises(SystemExit, match=r"--prompt has no \[MASK\]"):
        train.main(tiny_run(corpus, out, "--sample", "--prompt", "def f(x):"))


@pytest.mark.parametrize("objective", ["clm", "mlm"])
def test_interrupted_and_resumed_run_equals_uninterrupted(corpus, tmp_path, objective):
    args = ["--max_iters", "400", "--eval_interval", "50", "--objective", objective]
    run_py = lambda out, *more: [sys.executable, "train.py", *tiny_run(corpus, out, *args, *more)]
    reference = subprocess.run(run_py(tmp_path / "reference"), cwd=REPO, check=True,
                               capture_output=True, text=True).stdout
    proc = subprocess.Popen(run_py(tmp_path / "run"), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    first = ""
    for line in proc.stdout:
        first += line
        if line.startswith("iter 70/"):
            proc.send_signal(signal.SIGINT)  # Ctrl-C: finish the step, save, exit cleanly
    assert proc.wait() == 0, first
    stopped_at = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)["iter"]
    assert 70 <= stopped_at < 400 and "continue with --resume" in first
    second = subprocess.run(run_py(tmp_path / "run", "--resume"), cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    assert f"resuming at iter {stopped_at}" in second
    assert {**losses_printed(first), **losses_printed(second)} == losses_printed(reference)
    same = lambda records: [{k: r[k] for k in ("iter", "train_loss", "val_loss", "gains")} for r in records]
    assert same(log_records(tmp_path / "run")) == same(log_records(tmp_path / "reference"))


@pytest.mark.parametrize("objective", ["clm", "mlm"])
def test_two_process_ddp_matches_one_process_with_twice_the_accumulation(corpus, tmp_path, objective):
    single = tmp_path / "single"  # mlm: each rank masks its share alike
    subprocess.run([sys.executable, "train.py", *tiny_run(corpus, single, "--grad_accum", "2", "--objective", objective)],
                   cwd=REPO, check=True, capture_output=True)
    ddp = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "train.py", *tiny_run(corpus, ddp, "--objective", objective)],
                            cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "x 2 processes" in result.stdout  # the accumulation rounded up to the processes: 4 x 2 as above
    assert re.search(r"8 sequences \(not the default 16: [^)]*\) \(4 x 32 x 2 accumulated\)", result.stdout)
    for a, b in zip(log_records(single), log_records(ddp), strict=True):
        assert a["iter"] == b["iter"]
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-4)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(corpus, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match="not finite|loss is nan"):
        train.main(tiny_run(corpus, out, "--lr", "inf"))
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == 0 and all(torch.isfinite(t).all() for t in ckpt["model"].values())


@pytest.fixture
def broken_data(corpus, tmp_path):
    """A copy of the tiny dataset, for tests that corrupt it."""
    folder = tmp_path / "broken"
    folder.mkdir()
    for name in ("train.bin", "val.bin", "meta.json"):
        (folder / name).write_bytes((corpus / "tiny" / name).read_bytes())
    return folder


def test_bad_input_gets_a_one_line_error(corpus, tmp_path, broken_data, capsys):
    def error(*args, data_dir=corpus):
        argv = tiny_run(corpus, tmp_path / "out", *args)
        argv[argv.index("--data_dir") + 1] = str(data_dir)
        with pytest.raises(SystemExit) as e:
            train.main(argv)
        message = str(e.value) if isinstance(e.value.code, str) else capsys.readouterr().err
        assert "Traceback" not in message and message.strip().count("\n") <= 1, message
        return message

    assert "invalid choice: 'sasp'" in error("--block", "sasp") and "sas_p" in error("--block", "sasp")
    assert "invalid choice: 'batchnorm'" in error("--norm", "batchnorm")
    assert "divisible" in error("--n_embd", "30", "--n_head", "4")
    assert "is not prepared; run: python prepare_data.py" in error("--dataset", "nothing_here")
    assert "--resume: no checkpoint" in error("--resume")
    assert "cannot write to --out_dir" in error("--out_dir", str(REPO / "train.py" / "sub"))
    assert "--batch_size must be >= 1" in error("--batch_size", "0")
    assert "--lr -1.0 must be > 0" in error("--lr", "-1")
    assert "--beta2 1.5 must be in [0, 1)" in error("--beta2", "1.5")
    assert "--mask_prob 0.0 must be between 0 and 1" in error("--objective", "mlm", "--mask_prob", "0")
    assert "--mask_prob 1.5 must be between 0 and 1" in error("--objective", "mlm", "--mask_prob", "1.5")
    train.main(tiny_run(corpus, tmp_path / "out", "--max_iters", "1"))
    assert "already holds a run" in error()
    assert "trained with n_layer=2 (flags say 3)" in error("--n_layer", "3", "--resume")
    (tmp_path / "out" / "ckpt.pt").write_bytes(b"not a checkpoint")
    assert "cannot read checkpoint" in error("--resume")
    (tmp_path / "out" / "ckpt.pt").unlink()
    with open(broken_data / "val.bin", "ab") as f:
        f.write(b"\x01")  # an odd number of bytes
    assert "not a whole number of uint16" in error("--dataset", "broken", data_dir=broken_data.parent)
    np.full(100, 300, dtype=np.uint16).tofile(broken_data / "val.bin")  # ids >= 257
    assert "token id 300 >= vocab_size 257" in error("--dataset", "broken", data_dir=broken_data.parent)
    (broken_data / "train.bin").unlink()
    assert "train.bin is missing" in error("--dataset", "broken", data_dir=broken_data.parent)


def interrupted_at(monkeypatch, it):
    """Make the next in-process run stop as Ctrl-C would, after step it."""
    monkeypatch.setattr(train.Trainer, "should_stop", lambda self: self.it == it)


def test_a_stop_never_saves_weights_gone_nan_since_the_last_check(corpus, tmp_path, monkeypatch):
    out = tmp_path / "run"

    def stop(self):  # as a NaN between two logged steps would leave them, then Ctrl-C
        if self.it == 4:
            with torch.no_grad():
                next(self.raw_model.parameters()).fill_(math.nan)
        return self.it == 4

    monkeypatch.setattr(train.Trainer, "should_stop", stop)
    with pytest.raises(SystemExit, match="weights are not finite at iter 4"):
        train.main(tiny_run(corpus, out))
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == 3 and all(torch.isfinite(t).all() for t in ckpt["model"].values())


def test_resume_survives_a_log_line_cut_short_by_a_crash(corpus, tmp_path, monkeypatch):
    out = tmp_path / "run"
    interrupted_at(monkeypatch, 4)
    train.main(tiny_run(corpus, out))
    monkeypatch.undo()
    with open(out / "log.jsonl", "a") as f:
        f.write('{"iter": 6, "val_lo')
    train.main(tiny_run(corpus, out, "--resume"))
    assert [r["iter"] for r in log_records(out)] == [0, 3, 6]


def test_resume_refuses_to_change_the_run_and_leaves_the_checkpoint_intact(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    train.main(tiny_run(corpus, out, "--max_iters", "8", "--eval_interval", "4", "--lr", "2e-3"))
    saved, log = (out / "ckpt.pt").read_bytes(), (out / "log.jsonl").read_text()
    for flags, said in [(["--max_iters", "4"], "max_iters=8 (flags say 4)"),  # past the end: once ran on with lr < 0
                        (["--max_iters", "12"], "max_iters=8 (flags say 12)"),
                        (["--batch_size", "8"], "batch_size=4 (flags say 8)"),
                        (["--lr", "1e-3"], "lr=0.002 (flags say 0.001)"),
                        (["--schedule", "cosine"], "schedule='linear' (flags say 'cosine')"),
                        (["--eval_tokens", "1024"], "eval_tokens=512 (flags say 1024)")]:
        with pytest.raises(SystemExit, match=re.escape(said)):
            train.main(tiny_run(corpus, out, "--resume", *flags))
    train.main(tiny_run(corpus, out, "--resume", "--max_iters", "8"))  # finished: nothing to do, nothing written
    assert "is finished (iter 8 of 8); nothing to do" in capsys.readouterr().out
    assert (out / "ckpt.pt").read_bytes() == saved and (out / "log.jsonl").read_text() == log


def test_resume_continues_with_the_settings_it_started_with(corpus, tmp_path, monkeypatch, capsys):
    """As on a run checkpointed on a GPU and resumed on a CPU, whose defaults differ: the flags
    left out come from the checkpoint, not from this machine's defaults."""
    out = tmp_path / "run"
    run = ["--dataset", "tiny", "--data_dir", str(corpus), "--out_dir", str(out), "--n_layer", "2",
           "--n_head", "2", "--n_embd", "32", "--block_size", "32", "--eval_tokens", "512", "--log_interval", "1"]
    interrupted_at(monkeypatch, 3)
    train.main(run + ["--batch_size", "4", "--max_iters", "6", "--eval_interval", "3", "--lr", "3e-3", "--dtype", "bfloat16"])
    monkeypatch.undo()
    capsys.readouterr()
    train.main(run + ["--resume"])  # no --max_iters: the CPU default would be 800
    printed = capsys.readouterr().out
    assert "resuming at iter 3" in printed and "| 6 steps" in printed and "dtype: float32" in printed
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == 6 and ckpt["config"]["lr"] == 3e-3 and ckpt["config"]["batch_size"] == 4
    assert [r["iter"] for r in log_records(out)] == [0, 3, 6]
    assert all(math.isfinite(r["val_loss"]) for r in log_records(out))


def test_a_loss_scaler_state_is_restored_only_into_float16(corpus, tmp_path, monkeypatch):
    """A checkpoint of a float16 run (a GPU before compute capability 8.0) resumed where float16
    is not used: its scaler state is left, instead of failing to load into a disabled scaler."""
    out = tmp_path / "run"
    interrupted_at(monkeypatch, 3)
    train.main(tiny_run(corpus, out))
    monkeypatch.undo()
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    ckpt["config"]["dtype"], ckpt["scaler"] = "float16", dict(scale=1024.0, growth_factor=2.0, backoff_factor=0.5,
                                                             growth_interval=2000, _growth_tracker=3)
    torch.save(ckpt, out / "ckpt.pt")
    train.main(tiny_run(corpus, out, "--resume"))
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter"] == 6


def test_the_schedule_never_goes_negative_and_both_decays_end_at_zero():
    for schedule in ("linear", "cosine"):
        trainer = types.SimpleNamespace(cfg=types.SimpleNamespace(lr=1e-3, max_iters=100, schedule=schedule), warmup=5)
        lr = [train.Trainer.lr_at(trainer, step) for step in range(300)]
        assert lr[4] == pytest.approx(1e-3) and lr[5] == pytest.approx(1e-3) and min(lr) == 0.0
        assert lr[100:] == [0.0] * 200 and all(a >= b for a, b in zip(lr[5:], lr[6:]))
        assert lr[52] == pytest.approx(1e-3 / 2, rel=0.02)  # half way through the decay: half the peak, both
    cosine = types.SimpleNamespace(cfg=types.SimpleNamespace(lr=1.0, max_iters=100, schedule="cosine"), warmup=0)
    assert train.Trainer.lr_at(cosine, 25) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))


@pytest.fixture
def a_gpu(monkeypatch):
    """Stub a CUDA device of the given compute capability, for the code that only asks about it."""
    def stub(capability, name="NVIDIA H100 80GB HBM3"):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    return stub


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_the_cuda_defaults_keep_the_papers_global_batch_over_any_process_count(world, a_gpu):
    a_gpu((9, 0))
    command = next(c for c in readme_commands() if c[0] == "torchrun")
    assert command[:3] == ["torchrun", "--nproc_per_node=8", "train.py"]
    for argv in (command[3:], ["--block", "sas_p", "--grad_accum", "8"]):
        cfg, why = train.resolve(train.parse_args(argv), "cuda", world)
        train.validate(replace(cfg, device="cuda:0"), world)
        assert cfg.batch_size * cfg.grad_accum == 128 and cfg.grad_accum % world == 0, (argv, cfg)
        assert cfg.dtype == "bfloat16" and cfg.compile and cfg.max_iters == 40_000
    assert (cfg.batch_size, cfg.grad_accum) == (16, 8)
    cfg, why = train.resolve(train.parse_args([]), "cuda", 3)  # 128 does not split over 3 processes: says so
    assert (cfg.batch_size, cfg.grad_accum) == (21, 6) and "does not split over 3 processes" in why["batch"]
    cfg, why = train.resolve(train.parse_args(["--batch_size", "16"]), "cuda", 1)  # 64: says so
    assert cfg.grad_accum == 4 and "--batch_size 16 keeps the default micro-steps" in why["batch"]
    assert "batch" not in train.resolve(train.parse_args(["--batch_size", "16", "--grad_accum", "4"]), "cuda", 1)[1]
    with pytest.raises(SystemExit, match="--grad_accum 4 must be a multiple of the 8 processes"):
        train.validate(train.resolve(train.parse_args(["--grad_accum", "4"]), "cuda", 8)[0], 8)


def test_a_gpt_on_cpu_trains_with_the_warmup_and_rates_the_reproduction_found(a_gpu):
    for block, lr in train.CPU_GPT_LR.items():
        cfg, why = train.resolve(train.parse_args(["--block", block]), "cpu")
        assert (cfg.lr, cfg.warmup_frac) == (lr, train.CPU_GPT_WARMUP) and f"lr {lr:g} for {block}" in why["defaults"]
    assert train.CPU_GPT_WARMUP > train.PAPER_RUN["warmup_frac"] and len(set(train.CPU_GPT_LR.values())) > 1
    cfg, why = train.resolve(train.parse_args(["--block", "skipless"]), "cpu")  # not tuned: the paper's rate
    assert (cfg.lr, cfg.warmup_frac) == (1e-3, 0.2) and "(warmup 20%: the reproduction's finding" in why["defaults"]
    cfg, why = train.resolve(train.parse_args(["--lr", "3e-3", "--warmup_frac", "0.1"]), "cpu")  # flags win
    assert (cfg.lr, cfg.warmup_frac) == (3e-3, 0.1) and "finding" not in why["defaults"]
    cfg, why = train.resolve(train.parse_args(["--objective", "mlm"]), "cpu")  # the study measured no encoder
    assert (cfg.lr, cfg.warmup_frac) == (1e-3, 0.05) and "finding" not in why["defaults"]
    a_gpu((9, 0))
    cfg, why = train.resolve(train.parse_args(["--block", "sas_p"]), "cuda")  # the GPU run stays the paper's
    assert (cfg.lr, cfg.warmup_frac) == (1e-3, 0.05) and "finding" not in why["defaults"]


@pytest.mark.parametrize("capability,dtype", [((6, 1), "float32"), ((7, 0), "float16"), ((7, 5), "float16"),
                                              ((8, 0), "bfloat16"), ((8, 9), "bfloat16"), ((9, 0), "bfloat16")])
def test_autocast_dtype_by_compute_capability(capability, dtype, a_gpu):
    a_gpu(capability)
    chosen, why = train.autocast_dtype("cuda")
    assert chosen == dtype and f"{capability[0]}.{capability[1]}" in why
    assert train.resolve(train.parse_args([]), "cuda")[0].dtype == dtype
    assert bench.parse_args(["--device", "cuda"]).dtype == dtype
    assert train.autocast_dtype("cpu")[0] == "float32"


def test_gpu_names_find_their_tensor_core_peak():
    names = {  # torch.cuda.get_device_name of real cards: dense bf16/fp16 peak FLOP/s
        "NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H100 PCIe": 756e12, "NVIDIA H100 NVL": 835e12,
        "NVIDIA H200": 989e12, "NVIDIA GH200 480GB": 989e12, "NVIDIA A100-SXM4-80GB": 312e12,
        "NVIDIA A100-PCIE-40GB": 312e12, "NVIDIA A100 80GB PCIe": 312e12, "NVIDIA L4": 121e12,
        "NVIDIA L40": 181e12, "NVIDIA L40S": 362e12, "NVIDIA A10": 125e12, "NVIDIA A40": 150e12,
        "NVIDIA GeForce RTX 4090": 165e12, "NVIDIA GeForce RTX 3090": 71e12, "NVIDIA RTX A6000": 155e12,
        "Tesla V100-SXM2-16GB": 125e12, "Tesla T4": 65e12, "NVIDIA B200": 2250e12,
        "NVIDIA A10G": None, "NVIDIA GeForce GTX 1080": None,  # unknown: no MFU rather than a wrong one
    }
    for name, peak in names.items():
        assert train.peak_flops(name, (8, 0), "bfloat16") == peak, name
    assert train.peak_flops("Tesla T4", (7, 5), "float16") == 65e12
    assert train.peak_flops("Tesla T4", (7, 5), "bfloat16") is None  # emulated: no tensor cores
    assert train.peak_flops("NVIDIA H100 PCIe", (9, 0), "float32") is None


def test_an_offline_run_without_the_tokenizer_ends_without_its_sample(corpus, tmp_path, monkeypatch, capsys):
    """A run on GPT-2 BPE data, offline without tiktoken's files: warned at start-up, trained,
    ended cleanly with no sample (not an error after the work is done)."""
    data = tmp_path / "data"
    (data / "bpe").mkdir(parents=True)
    for name in ("train.bin", "val.bin"):
        (data / "bpe" / name).write_bytes((corpus / "tiny" / name).read_bytes())
    meta = json.loads((corpus / "tiny" / "meta.json").read_text())
    (data / "bpe" / "meta.json").write_text(json.dumps({**meta, "tokenizer": "gpt2"}))
    import tiktoken

    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    argv = tiny_run(corpus, tmp_path / "out")
    argv[argv.index("--dataset") + 1], argv[argv.index("--data_dir") + 1] = "bpe", str(data)
    train.main(argv)
    captured = capsys.readouterr()
    assert "the run will end without a sample" in captured.err and "TIKTOKEN_CACHE_DIR" in captured.err
    assert "train: done" in captured.out and "sample:" not in captured.out


def test_the_first_step_is_timed_apart(corpus, tmp_path, capsys):
    train.main(tiny_run(corpus, tmp_path / "run", "--compile"))
    printed = capsys.readouterr().out
    assert re.search(r"compile: the first step took [\d.]+ s \(compiling\)", printed)
    assert re.search(r"iter 1/6 \| loss [\d.]+ \| lr [\d.e+-]+ \| \d+ ms \(first step\)\n", printed)
    assert re.search(r"iter 2/6 .* tok/s \| eta", printed)


def unigram_entropy(ids):
    p = np.bincount(ids) / len(ids)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def test_the_unigram_level_is_the_entropy_of_the_validation_tokens(corpus):
    path = corpus / "tiny" / "val.bin"
    ids, offsets = np.fromfile(path, dtype=np.uint16), np.array([0, 100, 1000])
    targets = np.concatenate([ids[o + 1:o + 33] for o in offsets])  # the tokens a model predicts
    assert train.unigram_level(path, offsets, 32) == pytest.approx(unigram_entropy(targets))
    assert unigram_entropy(np.array([5] * 8)) == 0 and unigram_entropy(np.arange(4)) == pytest.approx(math.log(4))


def test_a_stalled_run_is_flagged_and_the_user_told_once(corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train.Trainer, "evaluate", lambda self: self.unigram)  # a run that never learns
    out = tmp_path / "run"
    run = tiny_run(corpus, out, "--max_iters", "100", "--eval_interval", "20", "--log_interval", "40",
                   "--warmup_frac", "0.05")
    with monkeypatch.context() as m:
        interrupted_at(m, 70)
        train.main(run)
    assert capsys.readouterr().out.count("train: warning: the run has stalled") == 1
    train.main(run + ["--resume"])  # resumed past the stall: not told again
    assert "the run has stalled" not in capsys.readouterr().out
    records = log_records(out)
    # flagged from STALL_AFTER steps past 2 x warmup (5 steps): iter 60 on
    assert [r["iter"] for r in records if r["stalled"]] == [60, 80, 100]
    assert all(0 <= r["similarity"] <= 1 for r in records)
    assert reproduce.finished(types.SimpleNamespace(folder=out, steps=100)) == reproduce.Outcome(records[-1]["val_loss"], "stalled")


# ----------------------------------------------------------------------------- bench.py

def test_bench_smoke(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rows = bench.main(["--blocks", "pre_ln,sas_p", "--n_layer", "2", "--n_head", "2", "--n_embd", "32",
                       "--batch_size", "2", "--seq_len", "16,32", "--vocab_size", "64", "--steps", "2",
                       "--warmup", "1", "--json", str(out)])
    assert [(r["block"], r["seq_len"]) for r in rows] == [("pre_ln", 16), ("sas_p", 16), ("pre_ln", 32), ("sas_p", 32)]
    pre, sas_p = rows[0], rows[1]
    assert pre["speed_vs_pre_ln"] == 1.0 and sas_p["tokens_per_s"] > 0 and sas_p["attn_ms"] > 0
    assert sas_p["params"] == GPT(GPTConfig(block="sas_p", n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)).num_params()
    assert sas_p["params_vs_pre_ln"] < 1 and sas_p["flop_ideal"] > 1
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(rows))
    assert "speed vs pre_ln" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--blocks", "sas_p"])  # no baseline


def test_bench_compiles_every_model_whole_at_every_length(monkeypatch):
    """Many models and a second length once ran past Dynamo's recompile limit, and the models
    past it uncompiled; here the limit is small and every frame must still compile whole."""
    from torch._dynamo.utils import counters
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: real_compile(m, backend="eager", **kw))  # fast, same frames
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 2)
    counters.clear()
    args = bench.parse_args(["--blocks", "pre_ln,sas_p,sas,parallel,v_skipinit", "--n_layer", "2", "--n_head", "2",
                             "--n_embd", "16", "--batch_size", "2", "--seq_len", "8,16", "--vocab_size", "32",
                             "--steps", "1", "--warmup", "1", "--compile"])
    rows = bench.run(args)
    assert len(rows) == 10 and counters["frames"]["total"] == counters["frames"]["ok"] > 0
    assert not counters["graph_break"] and not counters["unimplemented"], dict(counters["unimplemented"])


def test_bench_times_encoders_with_sparse_prediction():
    args = ["--blocks", "pre_ln,sas_p,sas_p:none", "--n_layer", "2", "--n_head", "2", "--n_embd", "32",
            "--batch_size", "2", "--seq_len", "16", "--vocab_size", "64", "--steps", "1", "--warmup", "1"]
    clm, mlm = bench.main(args), bench.main(args + ["--objective", "mlm"])
    assert [r["block"] for r in mlm] == ["pre_ln", "sas_p", "sas_p:none"]
    assert mlm[2]["params"] == mlm[1]["params"] - 2 * 32 + 32  # 2 block norms gone, 1 on the embeddings added
    encoder = bench.Bench(bench.parse_args(args + ["--objective", "mlm"]), "sas_p", {}, 16)
    assert encoder.model.config.causal is False and encoder.positions.shape == (2, 4)
    # the output head runs at 4 of 16 positions, so an encoder step has fewer FLOPs: a higher ideal
    assert mlm[1]["flop_ideal"] > clm[1]["flop_ideal"] > 1 and mlm[1]["tokens_per_s"] > 0


# ----------------------------------------------------------------------------- the README's commands

SCRIPTS = {"train.py": train.parse_args, "bench.py": bench.parse_args, "reproduce.py": reproduce.parse_args,
           "prepare_data.py": prepare_data.parse_args}


def readme_code(language=None):
    """The bodies of the README's fenced code blocks (of one language)."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", (REPO / "README.md").read_text(), re.S | re.M)
    return [body for lang, body in blocks if language is None or lang == language]


def readme_commands():
    """Every command line of the README that runs a script of this repo, as words: the lines of
    its code blocks, and its inline code spans (which may wrap over lines)."""
    text = (REPO / "README.md").read_text()
    lines = [line.removeprefix("$ ") for block in readme_code() for line in block.replace("\\\n", " ").splitlines()]
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    lines += [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", prose)]
    commands = [shlex.split(line, comments=True) for line in lines if line.startswith(("python ", "torchrun "))]
    return [words for words in commands if any(w in SCRIPTS for w in words)]


@pytest.fixture
def readme_block(tmp_path, monkeypatch):
    """The README's own block file, my_blocks.py, written where the README's commands run and
    imported as --import does; the name of its block."""
    code = next(b for b in readme_code("python") if "BLOCKS[" in b)
    (tmp_path / "my_blocks.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    name = re.search(r'BLOCKS\["(\w+)"\]', code).group(1)
    assert train.import_blocks(["--import", "my_blocks.py"], "test") == {name: str(tmp_path / "my_blocks.py")}
    yield name
    del BLOCKS[name]


def test_the_readmes_own_block_is_picked_up_by_name(readme_block):
    name = readme_block
    assert train.parse_args(["--import", "my_blocks.py", "--block", name]).block == name
    assert name in bench.parse_args(["--import", "my_blocks.py", "--blocks", f"pre_ln,{name}"]).runs
    test_causality(name)
    test_attention_is_the_identity_at_init_exactly_where_it_is_shaped(name, causal=True)
    test_gradients_reach_every_parameter(name, "rmsnorm")
    test_every_block_learns(name, "rmsnorm")


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_has_a_help(script, capsys):
    with pytest.raises(SystemExit) as e:
        SCRIPTS[script](["--help"])
    assert e.value.code == 0 and "usage:" in capsys.readouterr().out


def test_every_command_in_the_readme_parses(readme_block):
    """The documentation cannot rot unnoticed: each command line parses with its script's own
    argument parser (nothing runs); the README's own block is added, as the README says."""
    commands = readme_commands()
    for words in commands:
        script = next(w for w in words if w in SCRIPTS)
        if "--help" not in words:  # it exits 0: test_every_script_has_a_help
            SCRIPTS[script](words[words.index(script) + 1:])  # argparse exits on a flag it does not know
    counted = {s: sum(s in words for words in commands) for s in SCRIPTS}
    assert counted["train.py"] >= 6 and counted["bench.py"] >= 4 and counted["reproduce.py"] >= 5, counted
    assert counted["prepare_data.py"] >= 2 and any(words[0] == "torchrun" for words in commands), counted


# ----------------------------------------------------------------------------- reproduce.py

SHAPE = dict(n_layer=2, n_head=2, n_embd=32)
Outcome = reproduce.Outcome


def a_run(config="sas_p", steps=10, **more):
    return reproduce.Run("clm", config, **SHAPE, steps=steps, lr=1e-3, **more)


def bowl(best, stalls=()):
    """Fake outcomes: loss a parabola in log2(lr) around best; (lr, seed) in stalls stall."""
    def outcome(run, train_it):
        if (run.lr, run.seed) in stalls:
            return Outcome(3.27, "stalled")
        return Outcome(2 + math.log2(run.lr / best) ** 2 + 1 / run.steps + run.seed * 1e-6, "trained")
    return outcome


def test_sweep_grows_the_grid_while_the_best_rate_is_at_an_edge(monkeypatch):
    for best in (0.016, 0.00025):  # above the grid, below it
        monkeypatch.setattr(reproduce, "outcome", bowl(best))
        results = reproduce.sweep(a_run(), train_it=True)
        grid = list(reproduce.GRID)
        grown = [grid[-1] * 2, grid[-1] * 4] if best > grid[-1] else [grid[0] / 2, grid[0] / 4, grid[0] / 8]
        assert sorted(results) == sorted(grid + grown)  # one step past the best, to see it is one
        assert min(results, key=lambda lr: results[lr].loss) == pytest.approx(best)
    monkeypatch.setattr(reproduce, "outcome", lambda run, train_it: Outcome(-run.lr, "trained"))  # better without end
    assert len(reproduce.sweep(a_run(), train_it=True)) == len(reproduce.GRID) + reproduce.MAX_EXTRA


def test_an_ablations_grid_grows_once_and_never_past_a_rate_that_does_not_train(monkeypatch):
    monkeypatch.setattr(reproduce, "outcome", bowl(0.016))
    assert sorted(reproduce.sweep(a_run(), train_it=True, grid=(0.001, 0.002, 0.004), extra=1)) == [
        0.001, 0.002, 0.004, 0.008]
    monkeypatch.setattr(reproduce, "outcome", bowl(0.016, stalls={(lr, 1337) for lr in (0.001, 0.002, 0.004)}))
    assert sorted(reproduce.sweep(a_run(), train_it=True, grid=(0.001, 0.002, 0.004))) == [0.001, 0.002, 0.004]


def test_a_tuned_rate_must_train_on_every_checked_seed(monkeypatch):
    """The first seed's best two rates stall on the second seed: the next, which trains on both,
    is the tuned rate, and its final runs cover every seed; the stalled runs stay in the rows."""
    monkeypatch.setattr(reproduce, "outcome", bowl(0.004, stalls={(0.004, 1), (0.002, 1)}))
    rows, tuned = reproduce.tune(a_run(), reproduce.seeds(3), train_it=True)
    assert tuned == 0.008
    roles = {(run.lr, run.seed): (role, o.status) for run, role, o in rows}
    assert roles[0.004, 1337] == ("sweep", "trained") and roles[0.004, 1] == ("check", "stalled")
    assert {seed for (lr, seed), (role, _) in roles.items() if role == "final"} == {1337, 1, 2}
    assert {lr for (lr, seed) in roles if seed == 1} == {0.004, 0.002, 0.008}  # the best two, then on until one held
    assert [lr for (lr, seed) in roles if seed == 2] == [0.008]
    monkeypatch.setattr(reproduce, "outcome", bowl(0.004, stalls={(0.004, 1)}))
    rows, tuned = reproduce.tune(a_run(), reproduce.seeds(3), train_it=True)
    assert tuned == 0.002 and {run.lr for run, _, _ in rows if run.seed == 1} == {0.004, 0.002}  # TOP_K checked


def test_a_tuned_rate_that_stalls_on_a_later_seed_gives_way_to_the_next(monkeypatch):
    monkeypatch.setattr(reproduce, "outcome", bowl(0.004, stalls={(0.004, 2)}))
    rows, tuned = reproduce.tune(a_run(), reproduce.seeds(4), train_it=True)
    roles = {(run.lr, run.seed): (role, o.status) for run, role, o in rows}
    assert tuned == 0.002 and roles[0.004, 2] == ("check", "stalled") and (0.004, 3) not in roles
    assert {seed for (lr, seed), (role, _) in roles.items() if role == "final"} == {1337, 1, 2, 3}
    monkeypatch.setattr(reproduce, "outcome", bowl(0.004, stalls={(lr, 2) for lr in reproduce.GRID}))
    rows, tuned = reproduce.tune(a_run(), reproduce.seeds(3), train_it=True)  # no rate trains on every seed
    assert tuned == 0.004 and sum(o.status == "stalled" for run, _, o in rows if run.lr == tuned) == 1


def test_one_seed_is_the_plain_sweep(monkeypatch):
    monkeypatch.setattr(reproduce, "outcome", bowl(0.002))
    rows, tuned = reproduce.tune(a_run(), reproduce.seeds(1), train_it=True)
    assert tuned == 0.002 and {run.seed for run, _, _ in rows} == {1337}
    assert sorted(run.lr for run, _, _ in rows) == list(reproduce.GRID)


def test_experiment_tunes_every_block_at_every_scale_point_on_every_seed(monkeypatch, tmp_path):
    monkeypatch.setattr(reproduce, "OUT", tmp_path)  # its locks
    monkeypatch.setitem(reproduce.EXPERIMENTS["clm"]["scales"], "quick", dict(**SHAPE, warmup_frac=0.2, steps=(10, 40)))
    monkeypatch.setattr(reproduce, "outcome", bowl(0.004))
    seeds = reproduce.seeds(2)
    rows, left_out = reproduce.experiment("clm", "quick", seeds, train_it=True)
    assert left_out == []
    final = {(run.config, run.steps, run.seed): run.lr for run, role, _ in rows if role == "final"}
    assert final == {(c, s, seed): 0.004 for c in reproduce.EXPERIMENTS["clm"]["tuned"] for s in (10, 40) for seed in seeds}
    assert {run.flags for run, _, _ in rows} == {(("warmup_frac", 0.2),)}  # every run in the scale's regime
    shared = {(run.config, run.steps, run.seed) for run, role, _ in rows if role == "shared_lr"}
    points = {-1: 40, 0: 10}
    assert shared == {(c, points[p], seed) for c, ps in reproduce.EXPERIMENTS["clm"]["shared_lr"].items()
                      for p in ps for seed in seeds} - {("pre_ln", 10, 1337), ("pre_ln", 40, 1337)}  # sweep runs already
    assert len(rows) == len({run for run, _, _ in rows})  # each run once


def test_a_reproduction_run_names_its_warmup_whatever_train_py_defaults_to():
    """train.py's CPU default is the study's 20%: a run of round 3's regime must still get 5%."""
    assert "--warmup_frac" in a_run().argv() and a_run().settings()["warmup_frac"] == 0.05
    assert reproduce.Cell(**SHAPE, steps=10, warmup_frac=0.2).run("sas").settings()["warmup_frac"] == 0.2
    assert reproduce.Run("mlm", "sas", **SHAPE, steps=10, lr=1e-3).settings()["warmup_frac"] == 0.75  # BERT's


def test_a_longer_point_tunes_each_block_around_its_rate_at_the_longest_of_steps(monkeypatch, tmp_path):
    monkeypatch.setattr(reproduce, "OUT", tmp_path)  # its locks
    spec = dict(**SHAPE, steps=(10, 40), longer=(160,))
    monkeypatch.setitem(reproduce.EXPERIMENTS["clm"]["scales"], "quick", spec)
    best = dict(pre_ln=0.002, sas=0.004, sas_p=0.008)  # where each block's bowl is; at 160 steps half of it
    monkeypatch.setattr(reproduce, "outcome", lambda run, train_it: bowl(
        best.get(run.config, 0.002) / (2 if run.steps == 160 else 1))(run, train_it))
    rows, left_out = reproduce.experiment("clm", "quick", reproduce.seeds(3), train_it=True)
    assert left_out == []
    for config, r in best.items():
        at = [(run.lr, run.seed, role) for run, role, _ in rows if run.config == config and run.steps == 160]
        assert sorted(lr for lr, seed, _ in at if seed == 1337) == [r / 4, r / 2, r, 2 * r]  # grown once past an edge
        assert {lr for lr, seed, role in at if role == "final"} == {r / 2}
        assert len(at) == 4 + 2  # the best on the other two seeds: top_k 1

    def sas_at_40_unfinished(run, train_it):
        if run.steps == 40 and run.config == "sas":
            raise reproduce.Unfinished(run.folder)
        return bowl(0.002)(run, train_it)

    monkeypatch.setattr(reproduce, "outcome", sas_at_40_unfinished)
    rows, left_out = reproduce.experiment("clm", "quick", reproduce.seeds(3), train_it=False)
    assert {run.steps for run, role, _ in rows if role == "final"} == {10}
    assert "the 160-step tuning: sas (from its 40-step tuning)" in left_out


def test_the_factor_study_tunes_every_block_in_every_cell(monkeypatch, tmp_path):
    monkeypatch.setattr(reproduce, "OUT", tmp_path)  # its locks
    monkeypatch.setattr(reproduce, "outcome", bowl(0.004))
    rows, left_out = reproduce.experiment("regime", "quick", reproduce.seeds(2), train_it=True)
    cells = reproduce.cells("quick")
    assert left_out == [] and len(cells) == 4
    final = {(run.config, run.n_embd, run.steps, dict(run.flags).get("warmup_frac", 0.05), run.seed)
             for run, role, _ in rows if role == "final"}
    assert final == {(c, cell.n_embd, cell.steps, cell.warmup_frac, seed) for c in ("pre_ln", "sas", "sas_p")
                     for cell in cells for seed in (1337, 1)}
    paper_warmup = cells[0].run("sas")  # a cell with train.py's defaults: the GPT comparison's very runs
    assert not paper_warmup.flags and paper_warmup == reproduce.Run("clm", "sas", 6, 2, 64, 100, 1e-3)
    longer = cells[1].run("sas")
    assert longer.flags == (("warmup_frac", 0.2),) and longer.settings()["warmup_frac"] == 0.2
    assert cells[1].warmup_steps == 20 and "warmup 20% = 20 steps" in cells[1].label
    bpe = reproduce.Cell(6, 4, 128, 200, tokens="bpe").run("sas")  # the paper's tokens: the main job's data, apart
    assert bpe.settings()["dataset"] == prepare_data.DEFAULT_DATASET and bpe.model_config().vocab_size == 50304
    assert bpe.folder.parent.name == "bpe_6x128_200steps" and bpe.name == bpe.again(tokens="bytes").name
    assert reproduce.Cell(6, 4, 128, 200, tokens="bpe").label.startswith("BPE 6x128")


def regime_row(cell, config, seed, status="trained", loss=2.0):
    run = cell.run(config)
    return dict(n_layer=run.n_layer, n_head=run.n_head, n_embd=run.n_embd, steps=run.steps, flags=dict(run.flags),
                batch_size=cell.batch_size, tokens=cell.tokens, config=config, seed=seed, role="final", status=status, lr=1e-3,
                val_loss=loss, seconds_per_step=0.1)


def test_the_rule_picks_the_most_paper_like_regime_that_trains_never_the_best_gap():
    Cell = reproduce.Cell
    deep_5, deep_20 = Cell(12, 4, 128, 200), Cell(12, 4, 128, 200, warmup_frac=0.2)
    wide_5, wide_20 = Cell(6, 4, 256, 200), Cell(6, 4, 256, 200, warmup_frac=0.2)
    deep_20_long, batch_64 = Cell(12, 4, 128, 800, warmup_frac=0.2), Cell(12, 4, 128, 200, 64, 0.2)
    exp = reproduce.EXPERIMENTS["regime"]
    # sas far behind in the wide cells, level in the deep ones: gaps play no part
    rows = lambda cells, stalled=(): [regime_row(c, config, seed, "stalled" if (c, config, seed) in stalled else "trained",
                                                 2.5 if config == "sas" and c.n_embd == 256 else 2.0)
                                      for c in cells for config in exp["tuned"] for seed in (1337, 1, 2)]
    every = [deep_5, deep_20, wide_5, wide_20, deep_20_long, batch_64]
    assert reproduce.chosen_regime(rows(every), exp)[0] == [wide_20]
    assert reproduce.chosen_regime(rows(every, {(wide_20, "sas_p", 2)}), exp)[0] == [wide_5]  # a stall rules it out
    assert reproduce.chosen_regime(rows(every, {(wide_20, "pre_ln", 1), (wide_5, "sas", 1)}), exp)[0] == [
        deep_20, deep_20_long]  # a regime holds every length it ran at
    assert reproduce.chosen_regime(rows(every, {(deep_20_long, "sas", 2), (wide_20, "sas", 1), (wide_5, "sas", 1)}),
                                   exp)[0] == [deep_5]  # ... and a stall at one length rules out all of it
    assert reproduce.chosen_regime(rows([deep_5, batch_64], {(deep_5, "sas", 1)}), exp)[0] is None  # batch 64: no candidate
    assert reproduce.chosen_regime(rows([deep_5, wide_20])[:-1], exp)[0] == [deep_5]  # wide_20 lacks a seed: unfinished
    # the paper's tokens rank first: a BPE regime at the main job's d_k 32 before bytes at the paper's proportions
    bpe, bpe_wide = Cell(6, 4, 128, 200, warmup_frac=0.2, tokens="bpe"), Cell(6, 4, 256, 200, warmup_frac=0.2, tokens="bpe")
    assert reproduce.chosen_regime(rows(every + [bpe]), exp)[0] == [bpe]
    assert reproduce.chosen_regime(rows(every + [bpe, bpe_wide]), exp)[0] == [bpe_wide]  # then the proportions
    assert reproduce.chosen_regime(rows(every + [bpe], {(bpe, "sas", 1)}), exp)[0] == [wide_20]  # and it must train


def test_the_regime_tables_count_stalls_and_gaps_per_cell():
    exp, Cell = reproduce.EXPERIMENTS["regime"], reproduce.Cell
    deep, wide = Cell(12, 4, 128, 200), Cell(6, 4, 256, 200, warmup_frac=0.2)
    runs = [regime_row(c, config, seed, "stalled" if (c, config, seed) == (deep, "sas", 2) else "trained",
                       2.0 * (1 + 0.01 * (1337, 1, 2).index(seed)) if config == "sas" else 2.0)
            for c in (deep, wide) for config in exp["tuned"] for seed in (1337, 1, 2)]
    runs.append(dict(regime_row(wide, "sas_p", 1337, "stalled", 3.27), role="sweep", lr=8e-3))
    made = {title: markdown for _, title, markdown in reproduce.tables(dict(runs=[dict(r, experiment="regime")
                                                                                 for r in runs]))}
    assert set(made) == {"regime map", "regime choice", "regime", "regime sweeps"}
    rows = made["regime map"].splitlines()[2:]
    assert rows[0].startswith(f"| {deep.label} | 0.001 | 0.001, +1.0% (+0.0% to +2.0%), 1 of 3 / 1 of 3 |")
    assert rows[1].endswith("| 0.001, +0.0% (+0.0% to +0.0%), 0 of 3 / 1 of 4 |")
    assert made["regime choice"].startswith(f"The rule's choice: {wide.label}")
    assert "| 6x256 (d_k 64), 16 x 200 steps, warmup 20% = 40 steps | sas_p | 0.001 |" in made["regime"]


def test_a_run_reaches_its_own_final_loss_at_its_last_step():
    run = dict(seed=1, val_loss=2.1234567, curve=[[0, 5.0], [100, 2.5], [200, 2.12346]], seconds_per_step=0.5)
    assert reproduce.reach_seconds([run], [run]) == "100"  # the curve's loss is rounded above the exact one
    faster = dict(run, curve=[[0, 5.0], [100, 2.0], [200, 1.9]], val_loss=1.9, seconds_per_step=0.25)
    assert reproduce.reach_seconds([faster], [run]) == f"{0.25 * 100 * (5 - 2.12346) / 3:.0f}"


@pytest.mark.skipif(prepare_data.fcntl is None, reason="no file locks on this platform")
def test_two_processes_share_the_path_and_never_train_one_run_twice(tmp_path):
    lock = tmp_path / "arm.lock"
    with reproduce.claimed(lock, wait=False):  # another process's hold: a second open file
        with pytest.raises(reproduce.Unfinished, match="another reproduce.py"):
            with reproduce.claimed(lock, wait=False):
                pass
    with reproduce.claimed(lock, wait=False):  # released: free again
        pass


def test_the_path_tunes_each_ablation_around_its_blocks_rate(monkeypatch, tmp_path):
    monkeypatch.setattr(reproduce, "OUT", tmp_path)  # its locks
    exp = reproduce.EXPERIMENTS["path"]
    monkeypatch.setitem(exp["scales"], "quick", dict(**SHAPE, steps=(10,), depth=dict(n_embd=16, n_head=2, layers=(2, 8))))
    monkeypatch.setattr(reproduce, "outcome", bowl(0.004))
    rows, left_out = reproduce.experiment("path", "quick", reproduce.seeds(2), train_it=True)
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
    monkeypatch.setitem(reproduce.EXPERIMENTS["clm"]["scales"], "quick", dict(**SHAPE, steps=(10, 40)))
    unfinished = {(40, "sas"), (10, "v_skipinit")}
    trained = bowl(0.002)

    def outcome(run, train_it):
        if (run.steps, run.config) in unfinished:
            raise reproduce.Unfinished(run.folder)
        return trained(run, train_it)

    monkeypatch.setattr(reproduce, "outcome", outcome)
    seeds = reproduce.seeds(2)
    rows, left_out = reproduce.experiment("clm", "quick", seeds, train_it=False)
    assert {run.steps for run, role, _ in rows if role in ("sweep", "final")} == {10}  # the 40-step point, whole
    shared = {(run.config, run.steps) for run, role, _ in rows if role == "shared_lr" and run.config != "pre_ln"}
    assert shared == {("parallel", 40), ("sas_p_nonorm", 40), ("skipless", 10)}
    assert len(left_out) == 2 and "40-step tuning" in left_out[0] and "v_skipinit" in left_out[1]

    def read_log(run):
        o = outcome(run, False)
        return [dict(iter=0, val_loss=5.0, similarity=0.1, gains={}),
                dict(iter=run.steps, val_loss=o.loss, similarity=0.5, gains={})]

    monkeypatch.setattr(reproduce, "read_log", read_log)
    runs = reproduce.result_rows("clm", rows, {(*SHAPE.values(), 16, reproduce.VOCAB): {config: 0.1 for config in reproduce.CONFIGS}}, 1337)
    assert all(r["seconds_per_step"] == 0.1 for r in runs)
    titles = [title for _, title, _ in reproduce.tables(dict(runs=runs))]
    assert titles == ["tuned", "sweep", "stalls", "shared_lr"]
    unfinished |= {(10, "pre_ln")}
    with pytest.raises(reproduce.Unfinished):  # no scale point finished: nothing to report
        reproduce.experiment("clm", "quick", seeds, train_it=False)


def fake_training(monkeypatch):
    """train_run writes a finished log (loss a bowl around lr 0.002) instead of training; returns
    trained(run, loss), which writes one by hand."""
    def trained(run, loss=None):
        loss = bowl(0.002)(run, True).loss if loss is None else loss
        run.folder.mkdir(parents=True, exist_ok=True)
        records = [dict(iter=0, val_loss=5.0, similarity=0.1, gains={}), dict(iter=run.steps, val_loss=loss, similarity=0.5, gains={})]
        (run.folder / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return Outcome(loss, "trained")

    monkeypatch.setattr(reproduce, "train_run", trained)
    for name, made in (("step_seconds", lambda objective, timed, configs: {c: 0.1 for c in configs}),
                       ("similarity_at_init", lambda shape: {}), ("figures", lambda name, results, assets: None)):
        monkeypatch.setattr(reproduce, name, made)
    return trained


def test_a_report_shows_the_finished_runs_of_a_point_not_finished(monkeypatch, tmp_path):
    """A long point lands in parts: its finished runs go to the report apart, never into a table."""
    monkeypatch.setattr(reproduce, "OUT", tmp_path / "out")
    trained, seeds = fake_training(monkeypatch), reproduce.seeds(2)
    quick = dict(**SHAPE, warmup_frac=0.2, steps=(10,))
    monkeypatch.setitem(reproduce.EXPERIMENTS["clm"]["scales"], "quick", quick)
    reproduce.experiment("clm", "quick", seeds, train_it=True)  # the 10-step point, whole
    monkeypatch.setitem(reproduce.EXPERIMENTS["clm"]["scales"], "quick", dict(quick, steps=(10, 40)))
    at_40 = reproduce.Run("clm", "sas", **SHAPE, steps=40, lr=1e-3, flags=(("warmup_frac", 0.2),))
    for run in (at_40.again(lr=0.002), at_40.again(lr=0.004, seed=1), at_40.again(config="sas_p", lr=0.004),
                at_40.again(config="pre_ln"), at_40.again(config="pre_ln", seed=1),  # Pre-LN at 1e-3: shared-rate runs too
                at_40.again(flags=(), lr=0.004), at_40.again(flags=(("batch_size", 64), ("warmup_frac", 0.2))),  # other regimes
                at_40.again(lr=0.004, seed=5)):  # a seed the report does not have
        trained(run, 2.5)
    (at_40.folder / "ckpt.pt").parent.mkdir(parents=True)  # started, not finished
    rows, left_out = reproduce.experiment("clm", "quick", seeds, train_it=False)
    assert "the 40-step tuning" in left_out[0]
    reproduce.report("clm", "quick", seeds, rows, left_out, tmp_path / "assets")

    results = json.loads((tmp_path / "assets" / "results.json").read_text())
    so_far = {(r["config"], r["lr"], r["seed"]) for r in results["experiments"]["clm"]["so_far"]}
    assert so_far == {("sas", 0.002, 1337), ("sas", 0.004, 1), ("sas_p", 0.004, 1337), ("pre_ln", 0.001, 1337), ("pre_ln", 0.001, 1)}
    assert {r["role"] for r in results["runs"]} == {"sweep", "check", "final", "shared_lr"}
    assert {(r["config"], r["seed"]) for r in results["runs"] if r["steps"] == 40} == {("pre_ln", 1337), ("pre_ln", 1)}
    assert all(r["role"] == "shared_lr" for r in results["runs"] if r["steps"] == 40)  # in no tuning table
    report = (tmp_path / "assets" / "REPORT.md").read_text()
    assert "| 2x32 (d_k 16), 16 x 40 steps, warmup 20% = 8 steps | sas | 0.004 | 1 | 2.5000 | trained |" in report
    assert reproduce.so_far_table(results["experiments"]["clm"]["so_far"]) in report

    for f in (tmp_path / "out").glob("*/*/log.jsonl"):  # a fresh clone: --reuse_results brings them back
        f.unlink()
    assert reproduce.restore_logs([tmp_path / "assets" / "results.json"]) == len(results["runs"]) + len(so_far) - 2
    assert reproduce.experiment("clm", "quick", seeds, train_it=False)[0] == rows


def test_a_report_shows_the_finished_runs_of_a_cell_not_finished(monkeypatch, tmp_path):
    monkeypatch.setattr(reproduce, "OUT", tmp_path / "out")
    trained, seeds = fake_training(monkeypatch), reproduce.seeds(2)
    done, started = dict(**SHAPE, steps=10), dict(**SHAPE, steps=10, warmup_frac=0.2)
    monkeypatch.setitem(reproduce.EXPERIMENTS["regime"]["scales"], "quick", dict(cells=[done]))
    reproduce.experiment("regime", "quick", seeds, train_it=True)
    monkeypatch.setitem(reproduce.EXPERIMENTS["regime"]["scales"], "quick", dict(cells=[done, started]))
    trained(reproduce.Cell(**started).run("sas").again(lr=0.004))
    rows, left_out = reproduce.experiment("regime", "quick", seeds, train_it=False)
    assert [(run.config, run.lr, dict(run.flags)) for run, role, _ in rows if role == "so far"] == [("sas", 0.004, dict(warmup_frac=0.2))]
    assert len(left_out) == 3 and all("warmup 20%" in what for what in left_out)
    assert {run.steps for run, role, _ in rows if role == "final"} == {10} and not any(run.flags for run, role, _ in rows if role != "so far")


def test_a_diverged_run_is_recorded_not_fatal(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "OUT", tmp_path)
    monkeypatch.setattr(reproduce, "DATASET", "tiny")
    monkeypatch.setattr(reproduce, "TRAINING", dict(reproduce.TRAINING, block_size=32, eval_tokens=512, data_dir=str(corpus)))
    fine, diverging = (a_run(steps=8).again(lr=lr) for lr in (1e-3, math.inf))
    assert reproduce.outcome(fine, train_it=True).status == "trained"
    assert not (fine.folder / "ckpt.pt").exists() and reproduce.read_log(fine)[-1]["iter"] == 8
    assert reproduce.outcome(diverging, train_it=True) == Outcome(math.inf, "diverged")
    assert (diverging.folder / "diverged").exists()
    monkeypatch.setattr(subprocess, "Popen", None)  # finished and diverged runs are not trained again
    assert reproduce.outcome(diverging, train_it=True).status == "diverged"
    assert reproduce.outcome(fine, train_it=False).loss == reproduce.read_log(fine)[-1]["val_loss"]
    with pytest.raises(reproduce.Unfinished):
        reproduce.outcome(a_run("sas", steps=8), train_it=False)
    rows = reproduce.result_rows("clm", [(run, "sweep", reproduce.outcome(run, train_it=False)) for run in (fine, diverging)], {}, 1337)
    table = reproduce.sweep_table(rows, dict(tuned=(fine.config,)))  # a diverged run is a cell of its tuning table
    assert table.endswith(f"| {rows[0]['val_loss']:.4f} | diverged |")


def test_runs_taken_from_results_json_are_finished_runs_again(corpus, tmp_path, monkeypatch):
    """--reuse_results: a results.json row stands in for its run once its log is gone, with the
    same outcome and the same row when reported again; nothing is trained."""
    monkeypatch.setattr(reproduce, "OUT", tmp_path / "out")
    monkeypatch.setattr(reproduce, "DATASET", "tiny")
    monkeypatch.setattr(reproduce, "TRAINING", dict(reproduce.TRAINING, block_size=32, eval_tokens=512, data_dir=str(corpus)))
    fine, diverging = (a_run(steps=8).again(lr=lr) for lr in (1e-3, math.inf))
    rows = [(run, "final", reproduce.outcome(run, train_it=True)) for run in (fine, diverging)]
    results = tmp_path / "results.json"
    results.write_text(json.dumps(dict(runs=reproduce.result_rows("clm", rows, {}, 1337))))
    before = json.loads(results.read_text())["runs"]
    for run in (fine, diverging):
        for f in run.folder.iterdir():
            f.unlink()
    assert reproduce.restore_logs([results]) == 2 and reproduce.restore_logs([results]) == 0
    monkeypatch.setattr(subprocess, "Popen", None)  # nothing is trained
    again = [(run, "final", reproduce.outcome(run, train_it=True)) for run in (fine, diverging)]
    assert [o for _, _, o in again] == [o for _, _, o in rows]
    assert reproduce.result_rows("clm", again, {}, 1337) == before


def test_gaps_are_paired_by_seed_and_verdicts_follow_the_spread():
    base = [dict(seed=s, val_loss=v) for s, v in ((1337, 2.0), (1, 2.2), (2, 1.9))]
    rs = [dict(seed=s, val_loss=v) for s, v in ((1337, 2.02), (1, 2.244), (2, None))]
    gaps = reproduce.paired_gaps(rs, base)
    assert gaps[:2] == pytest.approx([1.0, 2.0]) and math.isinf(gaps[2])
    assert reproduce.verdict([1.0, 1.5, 0.2]) == "within 2%; behind on every seed"
    assert reproduce.verdict([-3.0, -0.5]) == "ahead on every seed"
    assert reproduce.verdict([-1.0, 2.5]) == "the sign varies by seed"
    assert reproduce.verdict([1.0]) == "one seed"
    assert reproduce.spread([1.0, 2.0, 4.5]) == "2.5000 (1.0000 to 4.5000)"
    assert reproduce.spread([1.0, math.inf]) == "diverged on 1 of 2"


def committed(path):
    """The file as committed (rerunning reproduce.py rewrites the working copy); outside a git
    checkout, the file as it is; None if there is none."""
    try:
        in_git = subprocess.run(["git", "rev-parse"], cwd=REPO, capture_output=True).returncode == 0
    except FileNotFoundError:  # no git here
        in_git = False
    if in_git:
        shown = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=REPO, capture_output=True, text=True)
        return shown.stdout if shown.returncode == 0 else None
    return (REPO / path).read_text() if (REPO / path).exists() else None


def test_the_report_and_the_readme_show_the_tables_of_the_committed_results():
    """assets/REPORT.md holds every table made from assets/results.json, and the README the main
    comparison's, as they are made from it."""
    results = committed("assets/results.json")
    if results is None:
        pytest.skip("no assets/results.json committed")
    results, report, readme = json.loads(results), committed("assets/REPORT.md"), committed("README.md")
    assert report is not None, "assets/REPORT.md is not committed: python reproduce.py --report writes it"
    made = reproduce.tables(results)
    for experiment, title, markdown in made:
        assert markdown in report, f"assets/REPORT.md lacks the {experiment} {title} table made from assets/results.json"
    for experiment in results["experiments"].values():  # and the finished runs of what is not finished
        assert reproduce.so_far_table(experiment.get("so_far", [])) in report or not experiment.get("so_far")
    shown = {(experiment, title): markdown for experiment, title, markdown in made}
    assert shown[("clm", "tuned")] in readme, "README.md lacks the GPT comparison's table from assets/results.json"
    if "regime" in results["experiments"]:
        assert shown[("regime", "regime map")] in readme, "README.md lacks the factor study's map from assets/results.json"
    if "mlm" in results["experiments"]:
        assert shown[("mlm", "tuned")] in readme, "README.md lacks the encoder's table from assets/results.json"
    assert "](assets/REPORT.md)" in readme
    for r in results["runs"]:  # and the losses are the runs' own last evaluation
        assert r["status"] == "diverged" or abs(r["val_loss"] - r["curve"][-1][1]) < 1e-5
        assert r["status"] in ("trained", "stalled", "diverged") and r["seed"] in reproduce.seeds(10)


def test_the_readme_shows_the_longer_point_as_committed():
    """assets/large/ (--scale large): its report holds its tables, and the README its longer point:
    the tuned rows once the point is finished, until then the runs finished so far."""
    results = committed("assets/large/results.json")
    if results is None:
        pytest.skip("no assets/large/results.json committed")
    results, report, readme = json.loads(results), committed("assets/large/REPORT.md"), committed("README.md")
    made = {(experiment, title): markdown for experiment, title, markdown in reproduce.tables(results)}
    assert all(markdown in report for markdown in made.values())
    longer = reproduce.EXPERIMENTS["clm"]["scales"]["large"]["longer"]
    rows = [line for line in made[("clm", "tuned")].splitlines() if line.startswith(tuple(f"| {s} |" for s in longer))]
    so_far = results["experiments"]["clm"].get("so_far")
    assert rows or so_far, "neither a finished longer point nor runs of it so far"
    assert all(row in readme for row in rows), "README.md lacks the longer point's rows from assets/large/results.json"
    if so_far and not rows:
        assert reproduce.so_far_table(so_far) in readme and reproduce.so_far_table(so_far) in report


def test_the_gpt_comparison_runs_in_the_regime_the_rule_chose():
    """EXPERIMENTS["clm"]'s regime is chosen_regime's choice from the committed factor study, at
    every scale but quick (round 3's small shape, in the chosen warmup and batch)."""
    results = committed("assets/results.json")
    if results is None or "regime" not in json.loads(results)["experiments"]:
        pytest.skip("no factor study committed")
    rows = [r for r in json.loads(results)["runs"] if r["experiment"] == "regime"]
    chosen, why = reproduce.chosen_regime(rows, reproduce.EXPERIMENTS["regime"])
    assert chosen, why
    for scale, spec in reproduce.EXPERIMENTS["clm"]["scales"].items():
        cell = reproduce.Cell(spec["n_layer"], spec["n_head"], spec["n_embd"], spec["steps"][-1],
                              **{k: spec[k] for k in (*reproduce.REGIME, "tokens") if k in spec})
        regime = chosen[0].regime if scale != "quick" else (cell.n_layer, cell.n_head, cell.n_embd, *chosen[0].regime[3:])
        assert cell.regime == regime, (scale, cell.label, chosen[0].label)


def test_the_readme_has_no_placeholder_left():
    assert not re.findall(r"^[A-Z][A-Z_]{3,}$", (REPO / "README.md").read_text(), re.M)  # a line of its own


def test_every_figure_the_readme_shows_is_in_the_repo():
    figures = re.findall(r"\]\((assets/[^)]+\.png)\)", (REPO / "README.md").read_text())
    assert len(figures) >= 5  # the pattern finds them
    figures += [f"assets/{png}" for png in re.findall(r"\]\(([^)/]+\.png)\)", (REPO / "assets" / "REPORT.md").read_text())]
    for figure in figures:
        assert (REPO / figure).exists(), f"README.md shows {figure}, which is not in the repo"


# ----------------------------------------------------------------------------- your block against the paper's

@pytest.fixture
def fresh_arms(monkeypatch, tmp_path):
    """reproduce.py's registries as they are, restored after the test (--blocks adds to them);
    OUT (its snapshots of --import files) in tmp_path."""
    for name in ("CONFIGS", "COLORS", "EXPERIMENTS"):
        monkeypatch.setattr(reproduce, name, dict(getattr(reproduce, name)))
    monkeypatch.setattr(reproduce, "OUT", tmp_path / "out" / "repro")


MY_BLOCK = """
import torch
from simple_gpt import BLOCKS, PreLN

class Mine(PreLN):
    pass

BLOCKS["mine"] = Mine
"""


@pytest.fixture
def my_block(tmp_path):
    (tmp_path / "mine.py").write_text(MY_BLOCK)
    yield str(tmp_path / "mine.py")
    BLOCKS.pop("mine", None)


def test_import_registers_a_block_for_every_script(my_block, fresh_arms):
    assert train.parse_args(["--import", my_block, "--block", "mine"]).block == "mine"
    assert bench.parse_args(["--import", my_block, "--blocks", "pre_ln,mine:norm=layernorm"]).runs["mine:norm=layernorm"] == (
        "mine", {"norm": "layernorm"})
    args = reproduce.parse_args(["--import", my_block, "--blocks", "pre_ln,mine", "--quick"])
    assert args.experiment == "compare"
    first, arm = reproduce.EXPERIMENTS["compare"]["tuned"]
    assert first == "pre_ln" and re.fullmatch(r"mine-[0-9a-f]{8}", arm)  # the file's hash: changed code, new runs
    run = reproduce.Run("clm", arm, 2, 2, 16, 10, 1e-3)
    copy = Path(run.argv()[run.argv().index("--import") + 1])
    assert copy != Path(my_block) and copy.read_text() == MY_BLOCK and run.model_config().block == "mine"
    Path(my_block).write_text(MY_BLOCK + "\n# edited while the comparison runs\n")
    assert copy.read_text() == MY_BLOCK  # the runs import the snapshot: an edit never mixes into them
    reproduce.parse_args(["--import", my_block, "--blocks", "pre_ln,mine", "--quick"])
    assert reproduce.EXPERIMENTS["compare"]["tuned"][1] != arm  # the edited file: another arm, new runs


def test_an_import_that_fails_is_one_line_with_its_own_error(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("from simple_gpt import BLOCKS\n\nBLOCKS['x'] = undefined_name\n")
    for parse in (train.parse_args, bench.parse_args, reproduce.parse_args):
        with pytest.raises(SystemExit, match=r"--import .*bad.py failed at line 3: NameError: name 'undefined_name'"):
            parse(["--import", str(bad)])
    bad.write_text("def f(:\n")
    with pytest.raises(SystemExit, match=r"failed at line 1: SyntaxError"):
        train.parse_args(["--import", str(bad)])
    with pytest.raises(SystemExit, match=r"--import nowhere.py: not a file"):
        train.parse_args(["--import", "nowhere.py"])


def test_a_run_of_ones_own_block_resumed_without_its_import_says_so(corpus, tmp_path, my_block):
    out = tmp_path / "out"
    train.train(train.parse_args(["--import", my_block, *tiny_run(corpus, out, "--block", "mine")]))
    BLOCKS.pop("mine")
    with pytest.raises(SystemExit, match=r"unknown block 'mine'; valid: .*--import FILE"):
        train.train(train.parse_args(["--dataset", "tiny", "--data_dir", str(corpus), "--out_dir", str(out), "--resume"]))


@pytest.mark.parametrize("spec, arm", [
    ("sas", ("sas", {})), ("sas:alpha_ff=0", ("sas", {"alpha_ff": 0.0})),
    ("sas_p:norm=none", ("sas_p", {"norm": "none"})), ("sas_p:none", ("sas_p", {"norm": "none"})),
    ("sas_p:first_value=false:schedule=cosine", ("sas_p", {"first_value": False, "schedule": "cosine"})),
    ("v_skipinit:vp=identity:vp_beta=0.2", ("v_skipinit", {"vp": "identity", "vp_beta": 0.2}))])
def test_an_arm_is_a_block_with_train_flags(spec, arm):
    assert train.parse_arm(spec, "test") == arm


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
        train.parse_arm(spec, "test")
    with pytest.raises(SystemExit, match=error):
        reproduce.parse_args(["--blocks", f"pre_ln,{spec}"])


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
    assert reproduce.EXPERIMENTS["compare"]["tuned"] == ("pre_ln", "sas_p_nonorm", "sas_no_mlp_skip",
                                                        "sas_alpha_ff0.5_mlp_slope0.2")


def test_any_first_arm_is_the_baseline_of_the_timing(fresh_arms):
    reproduce.parse_args(["--blocks", "sas_p,sas:alpha_ff=0"])
    arms = list(reproduce.EXPERIMENTS["compare"]["tuned"])
    step_s = reproduce.step_seconds("clm", (1, 2, 16, 2, reproduce.VOCAB), arms)
    assert set(step_s) == set(arms) and all(s > 0 for s in step_s.values())


def test_a_tiny_comparison_writes_its_table_and_figure_and_resumes(corpus, tmp_path, monkeypatch, capsys, fresh_arms):
    """Two arms through the whole protocol, as `reproduce.py --quick --blocks pre_ln,sas:alpha_ff=0`
    runs it (tiny shapes, two rates, one seed): a table and a figure in out/compare/, nothing in
    assets/; run again, it trains nothing."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(reproduce, "OUT", tmp_path / "out" / "repro")
    monkeypatch.setattr(reproduce, "DATASET", "tiny")
    monkeypatch.setattr(reproduce, "TRAINING", dict(reproduce.TRAINING, block_size=32, eval_tokens=512, data_dir=str(corpus)))
    monkeypatch.setattr(reproduce, "GRID", (1e-3, 4e-3))
    monkeypatch.setattr(reproduce, "MAX_EXTRA", 0)
    monkeypatch.setitem(reproduce.EXPERIMENTS["clm"]["scales"], "quick", dict(n_layer=2, n_head=2, n_embd=16, steps=(8,)))
    argv = ["--quick", "--seeds", "1", "--blocks", "pre_ln,sas:alpha_ff=0"]
    reproduce.main(argv)
    folder = tmp_path / "out" / "compare" / "quick_pre_ln_vs_sas_no_mlp_skip"  # the reproduction's config of it
    report = (folder / "REPORT.md").read_text()
    assert "| 8 | sas_no_mlp_skip |" in report and "paired gap to pre_ln" in report and "s to reach pre_ln's final loss" in report
    runs = json.loads((folder / "results.json").read_text())["runs"]
    assert {(r["config"], r["lr"]) for r in runs} == {(c, lr) for c in ("pre_ln", "sas_no_mlp_skip") for lr in (1e-3, 4e-3)}
    assert all(r["seconds_per_step"] > 0 for r in runs)  # bench.py timed each arm, with its switch
    assert not (tmp_path / "assets").exists()
    pytest.importorskip("matplotlib")
    assert (folder / "compare_val_loss.png").stat().st_size > 0 and "compare_val_loss.png" in report
    monkeypatch.setattr(subprocess, "Popen", None)  # finished: nothing is trained again
    capsys.readouterr()
    reproduce.main(argv)
    assert "reproduce: training" not in capsys.readouterr().out


def test_plot_draws_runs_side_by_side(corpus, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    runs = [tmp_path / block for block in ("pre_ln", "sas_p")]
    for run in runs:
        train.train(train.parse_args(tiny_run(corpus, run, "--block", run.name)))
    out = tmp_path / "side_by_side.png"
    reproduce.main(["--plot", *map(str, runs), "--plot_out", str(out)])
    assert out.stat().st_size > 0 and "2 runs plotted" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match=r"--plot .*empty: no log.jsonl"):
        reproduce.main(["--plot", str(runs[0]), str(tmp_path / "empty")])
