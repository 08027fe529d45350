"""simple_gpt.py: the paper's invariants, tested on tiny models (identity at init, causality,
fast == reference, parameter closed forms), every block."""

import math

import pytest
import torch
import torch.nn.functional as F

import bench
import train_config
from diagnostics import token_similarity
from common import Masking, Muon, configure_optimizers, flops_per_token, orthogonalised
from simple_gpt import BLOCKS, GPT, NORMS, Attention, GPTConfig, ReparamLinear, ShapedAttention, SkipInitAttention


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
    ones, SAS's first-layer value); ordinary softmax attention mixes tokens from the start. P is
    moved off its init: a block that starts it at 0 would make both sides 0."""
    model = model_of(block, causal=causal)
    x = torch.randn(2, model.config.block_size, model.config.n_embd)
    for layer in model.transformer.h:
        attn = layer.attn
        perturb(attn.c_proj)
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


# each block's equation (SPEC §2), written out from the block's parts: its norms, attention, MLP and gains
EQUATIONS = {
    "pre_ln": lambda b, x: (h := x + b.attn(b.ln_1(x))) + b.mlp(b.ln_2(h)),  # Eq. 1
    "post_ln": lambda b, x: b.ln_2((h := b.ln_1(x + b.attn(x))) + b.mlp(h)),
    "parallel": lambda b, x: x + b.attn(b.ln_1(x)) + b.mlp(b.ln_1(x)),  # Eq. 7
    "skipless": lambda b, x: (h := b.attn(b.ln_1(x))) + b.mlp(b.ln_2(h)),
    "sas": lambda b, x: b.alpha_ff * (h := b.beta_sa * b.attn(b.ln_1(x))) + b.beta_ff * b.mlp(b.ln_2(h)),  # Eqs. 12-13
    "v_skipinit": lambda b, x: b.alpha_ff * (h := b.beta_sa * b.attn(b.ln_1(x))) + b.beta_ff * b.mlp(b.ln_2(h)),
    "sas_p": lambda b, x: b.beta_sa * b.attn(b.ln_1(x)) + b.beta_ff * b.mlp(b.ln_1(x)),
    "op": lambda b, x: (h := x + b.beta_sa * b.attn(x)) + b.beta_ff * b.mlp(h),
}


@pytest.mark.parametrize("block", EQUATIONS)
@torch.no_grad()
def test_every_block_computes_its_equation_with_its_gains_off_their_init(block):
    model = perturb(model_of(block, op_trainable=True) if block == "op" else model_of(block))  # OP's gains: parameters
    for name, b in model.transformer.h.named_children():
        x = torch.randn(2, model.config.block_size, model.config.n_embd)
        torch.testing.assert_close(b(x), EQUATIONS[block](b, x), rtol=1e-5, atol=1e-6, msg=f"layer {name}")
        for other, equation in EQUATIONS.items():  # and no other block's: a Post-LN computing Pre-LN fails
            if other != block and not {block, other} <= {"sas", "v_skipinit"}:
                try:
                    assert not torch.allclose(b(x), equation(b, x), atol=1e-3), f"{block} computes {other}'s equation"
                except AttributeError:  # the other needs parts this block lacks
                    pass


def test_the_attention_matrix_is_the_papers_formula():
    """attn.matrix, the readable A that the fast path is checked against, is Eq. 5 at init (W_Q = 0:
    softmax = C, so A = I) and Eq. 2's softmax, with its causal mask, for ordinary attention."""
    for causal in (True, False):
        sas, pre_ln = model_of("sas", causal=causal), perturb(model_of("pre_ln", causal=causal))
        x = torch.randn(2, 12, 16)
        shaped = sas.transformer.h[1].attn
        torch.testing.assert_close(shaped.matrix(*shaped.queries_keys(x)), torch.eye(12).expand(2, 2, 12, 12), rtol=0, atol=1e-6)
        attn = pre_ln.transformer.h[1].attn
        q, k = attn.queries_keys(x)
        mask = torch.full((12, 12), -math.inf).triu(1) if causal else torch.zeros(12, 12)
        torch.testing.assert_close(attn.matrix(q, k), torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8) + mask, dim=-1))


def reference_attention(attn, x):
    """The sub-block computed from its matrix: W^P(concat_h[A_h V_h]), A built whole (attn.matrix)."""
    B, T, C = x.shape
    v = attn.c_v(x).view(B, T, attn.n_head, -1).transpose(1, 2)
    y = (attn.matrix(*attn.queries_keys(x)) @ v).transpose(1, 2).reshape(B, T, C)
    return attn.c_proj(y)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block,switches", [("pre_ln", {}), ("sas", {}), ("v_skipinit", {}),
                                             ("sas", dict(attention="skipinit")), ("v_skipinit", dict(vp="orthogonal"))])
def test_fast_attention_equals_the_matrix_formula(block, switches, causal):
    model = perturb(model_of(block, causal=causal, **switches))
    x = torch.randn(2, model.config.block_size, model.config.n_embd)
    for layer in model.transformer.h:  # sas layer 0 has the value matrix, later layers do not
        expected = reference_attention(layer.attn, x)
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


def test_weights_start_at_gpt2s_init_then_the_papers():
    """GPT-2's N(0, 0.02), its outputs into the stream at 0.02 / sqrt(2 L); then the paper's: W_Q = 0,
    V-SkipInit's V and P orthogonal (Fig. 2)."""
    d, L = 256, 4
    shape = dict(n_layer=L, n_head=4, n_embd=d, vocab_size=512, block_size=64)
    pre_ln, v_skipinit = GPT(GPTConfig(block="pre_ln", **shape)), GPT(GPTConfig(block="v_skipinit", **shape))
    layer = pre_ln.transformer.h[1]
    for w, std in ((pre_ln.transformer.wte.weight, 0.02), (layer.attn.c_qk.weight, 0.02), (layer.mlp.c_fc.weight, 0.02),
                   (layer.attn.c_v.weight, 0.02), (layer.attn.c_proj.weight, 0.02 / math.sqrt(2 * L)),
                   (layer.mlp.c_proj.weight, 0.02 / math.sqrt(2 * L))):
        assert w.mean().abs() < 1e-3 and w.std().item() == pytest.approx(std, rel=0.03)
    for layer in v_skipinit.transformer.h:
        assert not layer.attn.c_qk.weight[:d].any() and layer.attn.c_qk.weight[d:].std().item() == pytest.approx(0.02, rel=0.03)
        for w in (layer.attn.c_v.weight, layer.attn.c_proj.weight):
            torch.testing.assert_close(w @ w.T, torch.eye(d), atol=1e-5, rtol=0)


def test_flops_count_only_the_matmuls_a_block_has():
    pre, sas_p = model_of("pre_ln"), model_of("sas_p")
    d, L, T, V = 16, 3, 12, 37
    attention = 12 * L * d * T
    assert flops_per_token(pre, T) == 6 * (12 * d * d * L + V * d) + attention
    assert flops_per_token(sas_p, T) == 6 * (10 * d * d * L + d * d + V * d) + attention
    # sparse prediction (MLM): the output head runs at a quarter of the positions
    assert flops_per_token(sas_p, T, predicted=0.25) == 6 * (10 * d * d * L + d * d + V * d / 4) + attention
    # V-SkipInit's V and P per Eq. 6: a trained dW each, and a fixed orthogonal W_init (no gradient: 4 a weight)
    for vp, fixed in (("identity", 0), ("orthogonal", 2 * d * d * L)):
        model = model_of("v_skipinit", vp=vp)
        assert flops_per_token(model, T) == 6 * (12 * d * d * L + V * d) + 4 * fixed + attention


def test_no_weight_decay_on_gains_and_norms():
    ablations = [tiny("v_skipinit", vp="identity", vp_beta=0.2, vp_trainable=True), tiny("sas", attention="skipinit")]
    for cfg in [tiny(block) for block in BLOCKS] + ablations:
        model = GPT(cfg)
        (opt,) = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.999), "cpu")
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
    with torch.no_grad():  # the padding past the tokenizer's ids made the likeliest: never sampled
        model.lm_head.weight[10:] *= 50
    out = model.generate(tokens(model.config, B=3, T=2) % 10, 7, vocab=10)
    assert out.max() < 10


def test_generate_samples_from_the_softmax_of_the_top_k_logits_over_the_temperature(monkeypatch):
    model, drawn = perturb(model_of("sas_p")).eval(), []
    idx = tokens(model.config, B=2, T=3)
    real = torch.multinomial
    monkeypatch.setattr(torch, "multinomial", lambda probs, num_samples: drawn.append(probs) or real(probs, num_samples))
    model.generate(idx, 1, temperature=0.7, top_k=5)
    with torch.no_grad():
        logits = model(idx)[0][:, -1].float()
    top = logits >= logits.topk(5).values[:, -1:]
    torch.testing.assert_close(drawn[0], torch.softmax(logits.masked_fill(~top, -math.inf) / 0.7, dim=-1))
    assert (drawn[0] > 0).sum(-1).tolist() == [5, 5]


# ----------------------------------------------------------------------------- training

@pytest.mark.parametrize("block,norm", [(b, "rmsnorm") for b in BLOCKS] + [("sas_p", "none"), ("sas", "layernorm")])
def test_every_block_learns(block, norm):
    model = model_of(block, norm, n_layer=4, n_embd=32, n_head=4)
    (opt,) = configure_optimizers(model, 0.0, 3e-3, (0.9, 0.999), "cpu")
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
    torch.compiler.reset()  # every block's frames, not those of other tests' models: the recompile limit is per frame
    model = model_of(block)
    compiled = torch.compile(model, backend="eager", fullgraph=True)  # fullgraph: a break raises
    idx = tokens(model.config)
    torch.testing.assert_close(compiled(idx)[0], model(idx)[0])


def train_steps_compiled(model, lengths, positions=None):
    """Training steps of torch.compile(model, fullgraph=True) (a graph break raises) at these
    sequence lengths; then the same and a new length again, where a recompilation raises."""
    torch.compiler.reset()
    compiled = torch.compile(model, fullgraph=True)  # inductor, the default: what train.py and bench.py use
    (opt,) = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.999), "cpu")

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


@pytest.mark.parametrize("block", BLOCKS)
def test_under_bf16_autocast_every_blocks_stream_stays_fp32(block):
    """Mixed precision's rule: matmuls in bf16, the residual stream in fp32, in a block without a skip too."""
    model, streams = model_of(block), []
    for layer in model.transformer.h:
        layer.register_forward_hook(lambda module, inputs, output: streams.append(output.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(tokens(model.config))
    assert streams == [torch.float32] * model.config.n_layer


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block", BLOCKS)
def test_every_block_runs_with_bf16_weights(block, causal):
    """model.bfloat16() (no autocast: a GPU user's cheap inference) trains and generates, near fp32."""
    model = perturb(model_of(block, causal=causal), scale=0.05)
    idx, targets = tokens(model.config), tokens(model.config, seed=2)
    loss = model(idx, targets)[1].item()
    model.bfloat16()
    logits, bf16_loss = model(idx, targets)
    bf16_loss.backward()
    assert logits.dtype == torch.bfloat16 and abs(bf16_loss.item() - loss) < 0.05
    assert all(p.grad is not None and p.grad.isfinite().all() and p.grad.any() for p in model.parameters())
    if causal:
        assert model.generate(idx[:, :4], 3).shape == (idx.size(0), 7)


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
    masking = Masking(0.25, T, mask_token, n_tokens)
    x = torch.randint(0, n_tokens, (B, T), generator=torch.Generator().manual_seed(1))
    positions, put = masking.draw((B,), torch.Generator().manual_seed(0))
    inputs, targets = Masking.apply(x, positions, put)
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
    masking = Masking(0.25, 12, mask_token=36, n_tokens=36)
    x = torch.randint(0, 36, (2, 12), generator=torch.Generator().manual_seed(0))
    positions, put = masking.draw((2,), torch.Generator().manual_seed(1))
    unchosen = [t for t in range(12) if t not in positions[0].tolist()][0]
    changed = x.clone()
    changed[0, unchosen] = (changed[0, unchosen] + 1) % 36
    (inputs, targets), (inputs2, targets2) = Masking.apply(x, positions, put), Masking.apply(changed, positions, put)
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
    masking = Masking(0.25, cfg.block_size, mask_token=cfg.vocab_size - 1, n_tokens=cfg.vocab_size - 1)
    x = tokens(cfg, B=4, seed=3) % (cfg.vocab_size - 1)
    g = torch.Generator().manual_seed(0)
    held_out = masking.draw((4,), torch.Generator().manual_seed(99))
    held_out_loss = lambda: model(*Masking.apply(x, *held_out), positions=held_out[0])[1].item()
    (opt,) = configure_optimizers(model, 0.0, 3e-3, (0.9, 0.999), "cpu")
    first = held_out_loss()
    for _ in range(60):
        positions, put = masking.draw((4,), g)
        loss = model(*Masking.apply(x, positions, put), positions=positions)[1]
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
    (opt,) = configure_optimizers(model, 0.1, 1e-2, (0.9, 0.999), "cpu")
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
    (opt,) = configure_optimizers(model, 0.1, 1e-2, (0.9, 0.999), "cpu")
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
        assert type(attn) is SkipInitAttention and not hasattr(attn, "gamma") and attn.beta.abs().sum() == 0
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


# ----------------------------------------------------------------------------- the README's own block

def test_the_readmes_own_block_is_picked_up_by_name(readme_block):
    name = readme_block
    assert train_config.parse_args(["--import", "my_blocks.py", "--block", name])["block"] == name
    assert name in bench.parse_args(["--import", "my_blocks.py", "--blocks", f"pre_ln,{name}"]).runs
    test_causality(name)
    test_attention_is_the_identity_at_init_exactly_where_it_is_shaped(name, causal=True)
    test_gradients_reach_every_parameter(name, "rmsnorm")
    test_every_block_learns(name, "rmsnorm")


@pytest.mark.parametrize("block", BLOCKS)
def test_muon_takes_the_blocks_matrices_at_its_rate_and_adamw_every_other_parameter_once(block):
    for switches in ({}, dict(vp="orthogonal", vp_beta=0.5, vp_trainable=True)):
        model = model_of(block, **switches)
        muon, adamw = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.999), "cpu", "muon", muon_lr=4e-3)
        assert isinstance(muon, Muon) and isinstance(adamw, torch.optim.AdamW)
        grouped = [id(p) for o in (muon, adamw) for g in o.param_groups for p in g["params"]]
        assert sorted(grouped) == sorted(id(p) for p in model.parameters())  # every parameter, once
        in_muon = {id(p) for g in muon.param_groups for p in g["params"]}
        blocks = {id(m.weight) for m in model.transformer.h.modules() if isinstance(m, torch.nn.Linear)}
        assert in_muon == blocks and all(p.ndim == 2 for p in model.parameters() if id(p) in in_muon)  # no gain, no norm
        assert id(model.transformer.wte.weight) not in in_muon  # the embeddings and tied head: AdamW
        fused = {id(m.c_qk.weight) for m in model.modules() if isinstance(m, Attention)}
        assert {id(p) for g in muon.param_groups if g["split"] == 2 for p in g["params"]} == fused  # W^Q, W^K apart
        assert {g["lr"] for g in muon.param_groups} == {4e-3} and {g["lr"] for g in adamw.param_groups} == {1e-3}
        (only,) = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.999), "cpu")  # the paper's: AdamW alone
        assert isinstance(only, torch.optim.AdamW)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_the_embeddings_take_their_own_rate_and_decay_and_unset_every_parameter_keeps_the_papers(optimizer):
    """--emb_lr and --emb_weight_decay: wte (the tied head) and wpe alone move; ln_e, a norm, does not."""
    model = model_of("sas_p", "none")  # norm none keeps a norm on the embeddings, ln_e
    name = {id(p): n for n, p in model.named_parameters()}

    def settings(**apart):  # {parameter: (group, peak, decay)}
        made = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.999), "cpu", optimizer, muon_lr=4e-3, **apart)
        return {name[id(p)]: (g["name"], g["peak"], g["weight_decay"]) for o in made for g in o.param_groups for p in g["params"]}

    paper, apart = settings(), settings(emb_lr=1.6e-2, emb_weight_decay=0.01)
    embeddings = {"transformer.wte.weight", "transformer.wpe.weight"}
    assert {n for n, (group, _, _) in apart.items() if group == "embeddings"} == embeddings
    assert {n: paper[n] if n not in embeddings else ("embeddings", 1.6e-2, 0.01) for n in paper} == apart
    decayed = {id(m.weight) for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))}
    muon = {name[id(m.weight)] for m in model.transformer.h.modules() if isinstance(m, torch.nn.Linear)} if optimizer == "muon" else ()
    assert {n: (peak, decay) for n, (_, peak, decay) in paper.items()} == {  # unset: the paper's AdamW (and Muon's rate)
        name[id(p)]: (4e-3 if name[id(p)] in muon else 1e-3, 0.1 if id(p) in decayed else 0.0) for p in model.parameters()}


def test_muon_orthogonalises_wq_and_wk_apart_and_a_whole_matrix_as_torchs_muon():
    """A fused (2d, d) W^Q-over-W^K steps as two (d, d) matrices would, each orthogonalised alone
    (its update's singular values near 1, not those of the pair); a plain matrix as torch.optim.Muon."""
    torch.manual_seed(0)
    fused, grads = torch.nn.Parameter(torch.randn(32, 16)), [torch.randn(32, 16) for _ in range(3)]
    apart = [torch.nn.Parameter(half.detach().clone()) for half in fused.chunk(2)]
    one, two = Muon([{"params": [fused], "split": 2}], lr=0.02, weight_decay=0.1), Muon(apart, lr=0.02, weight_decay=0.1)
    for g in grads:
        fused.grad, (apart[0].grad, apart[1].grad) = g, g.chunk(2)
        one.step(), two.step()
    assert torch.equal(fused.detach(), torch.cat(apart).detach())
    g = torch.randn(16, 16)
    sv = torch.linalg.svdvals(orthogonalised(g))
    assert 0.6 < sv.min() and sv.max() < 1.25  # Newton-Schulz's quintic leaves them in about 0.7-1.2
    exact = orthogonalised(g, torch.float32)  # where bf16 is emulated: the same steps, rounded less
    assert not torch.equal(exact, orthogonalised(g)) and torch.allclose(exact, orthogonalised(g), atol=0.05)
    if hasattr(torch.optim, "Muon"):
        mine, theirs = (torch.nn.Parameter(torch.ones(24, 16)) for _ in range(2))
        opts = Muon([mine], lr=0.02, weight_decay=0.1), torch.optim.Muon([theirs], lr=0.02, weight_decay=0.1,
                                                                          adjust_lr_fn="match_rms_adamw")
        for g in grads:
            mine.grad, theirs.grad = g[:24], g[:24].clone()
            [o.step() for o in opts]
        assert torch.equal(mine.detach(), theirs.detach())
