"""
Every transformer block of "Simplifying Transformer Blocks" (Bobby He, Thomas Hofmann; ICLR 2024,
arXiv 2311.01906) in one file, from the standard Pre-LN block to the skipless SAS-P block, and a
GPT around them. Equation numbers are the paper's; sections (§) are those of SPEC.md, the paper in
engineering terms.

The idea: shaped attention, A = alpha*I + beta*softmax(QK^T) - gamma*C with W_Q = 0 at init,
starts as the identity map. The attention skip, value and projection matrices then become
redundant and are removed (SAS), and the attention and MLP sub-blocks can run in parallel with no
skip at all (SAS-P): ~15% fewer parameters, ~15% faster training, same loss per step as Pre-LN.
Each of the paper's ablations (SPEC §8) is one GPTConfig switch away from a block. The sequel's
Outlier Protected block (OP; arXiv 2405.19279) is here too; diagnostics.py measures what it targets.

Readers of the authors' code: alpha, beta, gamma here are their attn_mat_skip_gain,
attn_mat_resid_gain and centre_attn_gain.
"""

import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------- the config

@dataclass
class GPTConfig:
    """A model: its block, shape and the paper's switches (each a flag of train.py, its comment the help)."""

    block: str = "sas_p"  # the transformer block, a key of BLOCKS
    norm: str = "rmsnorm"  # normalisation inside blocks: rmsnorm (the paper's), layernorm or none
    n_layer: int = 18  # layers (the paper's CodeParrot model, §4: 18 x 768, 12 heads, T = 128)
    n_head: int = 12  # attention heads
    n_embd: int = 768  # width d
    block_size: int = 128  # context length T
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64: faster matmuls
    causal: bool = True  # False: bidirectional attention and C = 1 1^T / T (the paper's BERT; packed: no padding mask)
    beta_ff: float | None = None  # initial MLP gain of SAS/SAS-P/V-SkipInit; None: 0.1 sqrt(18 / L) (the paper's; 0.2 at mlp_ratio 2, 0.05 in BERT)
    # the paper's ablations (SPEC §8); the defaults are the blocks as the paper defines them
    mlp_ratio: int = 4  # MLP hidden width / n_embd (Fig. 6's depth runs: 2)
    mlp_slope: float = 0.0  # negative slope of the MLP's ReLU; > 0: leaky ReLU (Fig. 25)
    alpha_ff: float = 1.0  # initial MLP skip gain of SAS/V-SkipInit (trainable); 0: no MLP skip (Fig. 25)
    attention: str = "shaped"  # shaped (Eq. 5) or skipinit (Eq. 4: alpha I + beta A, no C; Fig. 13)
    first_value: bool = True  # SAS/SAS-P's trainable first-layer value; False: W^V = I there too (Fig. 24)
    vp: str | None = None  # identity|orthogonal: every layer's W^V, W^P per Eq. 6 on this W_init (Figs. 3, 4, 23)
    vp_beta: float = 0.0  # vp's beta (Eq. 6): fixed, or the initial value with vp_trainable
    vp_trainable: bool = False  # vp's alpha and beta trainable, from 1 and vp_beta (Fig. 4)
    # attention logits and the OP block (arXiv 2405.19279)
    qk_norm: str | None = None  # rmsnorm: RMSNorm of each head's queries and keys; None: the block's own (op: rmsnorm, else none)
    logit_cap: float = 0.0  # > 0: logits soft-capped to logit_cap * tanh(logits / logit_cap); 0: off
    op_beta: float | None = None  # initial gain of both of OP's residual branches; None: 0.2 * sqrt(12 / n_layer)
    op_trainable: bool = False  # OP's gains trainable (op.yaml: optional)
    block_settings: dict = field(default_factory=dict)  # a block of one's own's settings, as its class declares them (settings)

    def __post_init__(self):
        checks = [
            (self.block in BLOCKS, f"unknown block {self.block!r}; valid: {', '.join(BLOCKS)}"),
            (self.norm in NORMS, f"unknown norm {self.norm!r}; valid: {', '.join(NORMS)}"),
            (min(self.n_layer, self.n_head, self.n_embd, self.block_size, self.vocab_size, self.mlp_ratio) >= 1,
             "n_layer, n_head, n_embd, block_size, vocab_size and mlp_ratio must be >= 1"),
            (self.n_embd % max(self.n_head, 1) == 0, f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"),
            (self.attention in ATTENTIONS, f"unknown attention {self.attention!r}; valid: {', '.join(ATTENTIONS)}"),
            (self.vp in (None, *VPS), f"unknown vp {self.vp!r}; valid: {', '.join(VPS)} (or None: the block's own V, P)"),
            (self.vp or not (self.vp_beta or self.vp_trainable), "vp_beta and vp_trainable set up vp: give vp too"),
            (self.qk_norm in (None, *QK_NORMS), f"unknown qk_norm {self.qk_norm!r}; valid: {', '.join(QK_NORMS)}"),
            (self.logit_cap >= 0, f"logit_cap {self.logit_cap} must be >= 0 (0: off)"),
            # dW = 0 and beta = 0: neither gets a gradient
            (self.vp_beta or not self.vp_trainable, "vp_trainable needs vp_beta > 0 (the paper's Fig. 4: 0.2)")]
        if failed := [message for ok, message in checks if not ok]:
            raise ValueError(failed[0])
        declared = getattr(BLOCKS[self.block], "settings", {})  # {name: (default, help)}: each a flag of train.py
        if unknown := set(self.block_settings) - set(declared):
            raise ValueError(f"{self.block} has no setting {', '.join(sorted(unknown))}" + (
                f"; its settings: {', '.join(declared)}" if declared else ""))
        self.block_settings = {**{name: default for name, (default, _) in declared.items()}, **self.block_settings}
        if unknown := set(switches_of(self.block)) - set(SWITCHES):
            raise ValueError(f"{self.block}'s switches {sorted(unknown)} are not GPTConfig's; valid: {', '.join(SWITCHES)}")
        for name in SWITCHES:
            if getattr(self, name) != getattr(GPTConfig, name) and name not in switches_of(self.block):
                takes = [block for block in BLOCKS if name in switches_of(block)]
                raise ValueError(f"{name} applies to {', '.join(takes)}, not to {self.block}")

    @property
    def beta_ff_init(self):
        """0.1 at the paper's 18 layers, scaled as 1/sqrt(L) (§2): 0.1 * sqrt(18 / n_layer)."""
        return float(self.beta_ff) if self.beta_ff is not None else 0.1 * math.sqrt(18 / self.n_layer)

    @property
    def op_beta_init(self):
        """0.2 at 12 layers, scaled as 1/sqrt(L): 0.2 * sqrt(12 / n_layer). The authors' op.yaml sets
        0.2 ("change for different depths: O(1/sqrt(depth))") on its default.yaml's 12 layers."""
        return float(self.op_beta) if self.op_beta is not None else 0.2 * math.sqrt(12 / self.n_layer)


NORMS = ("rmsnorm", "layernorm", "none")
VPS = ("identity", "orthogonal")  # W_init of the V/P ablations (Eq. 6)
QK_NORMS = ("rmsnorm", "none")


def make_norm(kind, dim):
    """RMSNorm is the paper's default for its GPT runs (§1); "none" drops the norm (§2, no-norm)."""
    if kind == "rmsnorm":
        return nn.RMSNorm(dim)
    if kind == "layernorm":
        return nn.LayerNorm(dim, bias=False)
    return nn.Identity()


# ----------------------------------------------------------------------------- attention

class KVCache:
    """One layer's keys and values so far, for generation: a prompt fills it, then one token at a time."""

    def __init__(self):
        self.k = self.v = None

    def __len__(self):
        return 0 if self.k is None else self.k.size(2)

    def update(self, k, v):
        if self.k is not None:
            if k.size(2) != 1:
                raise ValueError("a filled KVCache takes one new token at a time")
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v


def split_heads(x, n_head):
    B, T, C = x.shape
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, nh, T, hs)


def merge_heads(y):
    B, nh, T, hs = y.shape
    return y.transpose(1, 2).reshape(B, T, nh * hs)  # (B, T, C)


def attention_probs(q, k, mask, cap=0.0):
    """softmax(Q K^T / sqrt(d_k) + M) (Eq. 2), the T x T matrix itself, in fp32; mask: whether M,
    the causal mask, applies. cap > 0 soft-caps the logits first, to cap * tanh(logits / cap)
    (Gemma 2, Grok): they stay within (-cap, cap), so no head can saturate its softmax."""
    logits = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.size(-1))  # (B, nh, Tq, Tk)
    if cap:
        logits = cap * torch.tanh(logits / cap)
    if mask:
        Tq, Tk = logits.shape[-2:]
        logits = logits.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).triu(Tk - Tq + 1), -math.inf)
    return logits.softmax(dim=-1)


def centre(v, n_query, causal):
    """C V for the last n_query positions, C being softmax of the mask alone (§2): causal row i is
    uniform over positions 1..i, so C V is the running mean of V; bidirectional, the mean of V.
    C is built (n_query x T, shared by every head): a running sum would be O(T) not O(T^2), but
    torch.compile's CUDA scans broke on it at T > 128 (torch 2.11, pytorch#180221)."""
    if not causal:
        return v.mean(dim=2, keepdim=True)
    T = v.size(2)
    C = torch.ones(n_query, T, device=v.device).tril(T - n_query)  # fp32: its row sums exact past T = 256
    return (C / C.sum(dim=1, keepdim=True)).to(v.dtype) @ v


class Attention(nn.Module):
    """Multi-head self-attention (Eqs. 2-3), per head h:

        A_h = softmax(Q_h K_h^T / sqrt(d_k) + M)
        out = concat_h[A_h V_h] W^P,    V = X W^V

    value and proj are W^V and W^P: trainable matrices, or nn.Identity() where a block removes
    them (SAS). Subclasses change the formula: mix(), its A V, and matrix(), its A. Two switches
    act on the logits of every block: qk_norm="rmsnorm" normalises each head's queries and keys
    first (QK-norm: the OP block's entropy regulation), logit_cap > 0 soft-caps them."""

    def __init__(self, config, value, proj):
        super().__init__()
        self.n_head, self.causal, self.logit_cap = config.n_head, config.causal, config.logit_cap
        self.c_qk = nn.Linear(config.n_embd, 2 * config.n_embd, bias=False)  # W^Q, W^K fused
        head_dim = config.n_embd // config.n_head
        self.ln_q, self.ln_k = (make_norm(config.qk_norm or "none", head_dim) for _ in range(2))
        self.c_v, self.c_proj = value, proj

    def queries_keys(self, x):
        """Each head's queries and keys (B, nh, T, hs), QK-normed where the block has QK-norm."""
        q, k = (split_heads(t, self.n_head) for t in self.c_qk(x).chunk(2, dim=2))
        return self.ln_q(q), self.ln_k(k)

    def forward(self, x, cache=None):
        q, k = self.queries_keys(x)
        v = split_heads(self.c_v(x), self.n_head)
        # the causal mask hides later keys; a cached newest token has none. (Decided from the
        # cache, not from a tensor's length, so torch.compile sees a constant.)
        mask = self.causal and (cache is None or len(cache) == 0)
        if cache is not None:
            k, v = cache.update(k, v)
        # in its input's dtype: under autocast, a block without the attention skip (skipless, V-SkipInit)
        # keeps an fp32 stream, as a skip's fp32 sum keeps it elsewhere
        return self.c_proj(merge_heads(self.mix(q, k, v, mask))).type_as(x)

    def mix(self, q, k, v, mask):
        """A V for the queries q, over every key and value so far."""
        return self.softmax_attention(q, k, v, mask)

    def matrix(self, q, k):
        """A itself, (B, nh, T, T) for a whole sequence: the readable formula, which mix() applies
        to V without building it (the tests check that they agree; diagnostics.py draws it)."""
        return attention_probs(q, k, self.causal, self.logit_cap)

    def softmax_attention(self, q, k, v, mask):
        """softmax(Q K^T / sqrt(d_k) + M) V (Eq. 2) as one fused kernel, the T x T matrix never
        built; capped logits have no fused kernel, so there it is built (attention_probs)."""
        if self.logit_cap:
            return (attention_probs(q, k, mask, self.logit_cap) @ v.float()).type_as(v)
        return F.scaled_dot_product_attention(q, k, v, is_causal=mask)


class SkipInitAttention(Attention):
    """Value-SkipInit attention (Eq. 4; He et al. 2023), per head h:

        A_h = alpha_h I + beta_h softmax(Q_h K_h^T / sqrt(d_k) + M)

    with alpha from 1 and beta from 0: A = I at init. W_Q = 0 at init too, so shaped attention
    (below) differs by its formula alone: beta from 1 and the softmax centred, which the paper finds
    trains better (Fig. 13)."""

    beta_init = 0.0

    def __init__(self, config, value, proj):
        super().__init__(config, value, proj)
        # trainable per-head gains (§2); fp32 parameters, so the sums below are fp32
        self.alpha = nn.Parameter(torch.ones(config.n_head, 1, 1))
        self.beta = nn.Parameter(torch.full((config.n_head, 1, 1), self.beta_init))

    def init_paper(self):
        # W_Q = 0: the logits are 0, the softmax is C, and with shaping A = I at init. With QK-norm
        # too, RMSNorm(0) = 0 / sqrt(0 + eps) = 0: logits 0. But its slope at 0 is 1/sqrt(eps):
        # measured at 6 x 128, W_Q's first gradient is 1.7e3 (0.14 without), so clipping to 1
        # scales every gradient by 6e-4 in step 1; ~3 again by step 3.
        nn.init.zeros_(self.c_qk.weight[: self.c_qk.out_features // 2])  # W^Q: the first half of c_qk's rows
        for w in (self.c_v, self.c_proj):
            if isinstance(w, nn.Linear):  # V-SkipInit's trainable V and P: orthogonal (Fig. 2)
                nn.init.orthogonal_(w.weight)

    def mix(self, q, k, v, mask):
        n = q.size(2)  # the newest n positions are the queries
        return self.alpha * v[:, :, -n:] + self.beta * self.softmax_attention(q, k, v, mask)

    def matrix(self, q, k):
        return self.alpha * torch.eye(q.size(2), device=q.device) + self.beta * super().matrix(q, k)


class ShapedAttention(SkipInitAttention):
    """Shaped attention (Eq. 5), per head h:

        A_h = alpha_h I + beta_h softmax(Q_h K_h^T / sqrt(d_k) + M) - gamma_h C

    alpha, beta, gamma from 1. With W_Q = 0 the softmax is C, so A = I: at init the sub-block is
    the identity. SAS passes nn.Identity() as W^V (but the first layer's) and W^P; V-SkipInit
    passes matrices."""

    beta_init = 1.0

    def __init__(self, config, value, proj):
        super().__init__(config, value, proj)
        self.gamma = nn.Parameter(torch.ones(config.n_head, 1, 1))

    def mix(self, q, k, v, mask):
        return super().mix(q, k, v, mask) - self.gamma * centre(v, q.size(2), self.causal)

    def matrix(self, q, k):
        C = attention_probs(torch.zeros_like(q), k, self.causal)  # softmax of the mask alone
        return super().matrix(q, k) - self.gamma * C


ATTENTIONS = {"shaped": ShapedAttention, "skipinit": SkipInitAttention}


# ----------------------------------------------------------------------------- V, P and the MLP

class ReparamLinear(nn.Module):
    """x W with W = alpha * W_init + beta * dW (Eq. 6): W_init fixed, the identity or a random
    orthogonal matrix; dW trainable from 0. With Adam a step on dW moves W as a step with the
    learning rate times beta would (App. A): a small beta restricts W's updates, as a
    down-weighted residual branch does. alpha and beta are fixed, or trainable gains (never
    weight-decayed: they are not matrices)."""

    def __init__(self, dim, w_init="identity", alpha=1.0, beta=1.0, trainable=True):
        super().__init__()
        self.dW = nn.Linear(dim, dim, bias=False)
        self.register_buffer("W_init", None if w_init == "identity" else torch.empty(dim, dim))
        for name, value in (("alpha", alpha), ("beta", beta)):
            if trainable:
                setattr(self, name, nn.Parameter(torch.tensor(float(value))))
            else:
                self.register_buffer(name, torch.tensor(float(value)))

    def init_paper(self):
        nn.init.zeros_(self.dW.weight)
        if self.W_init is not None:
            nn.init.orthogonal_(self.W_init)

    def forward(self, x):
        x_init = x if self.W_init is None else F.linear(x, self.W_init)
        return self.alpha * x_init + self.beta * self.dW(x)  # = x W, without building W


def trainable_matrix(config, residual=False):
    """A trainable d x d W^V or W^P; residual: it writes into the stream (GPT-2's scaled init)."""
    w = nn.Linear(config.n_embd, config.n_embd, bias=False)
    w.residual_proj = residual
    return w


class MLP(nn.Module):
    """MLP(X) = ReLU(X W1) W2, hidden width 4d, no biases (§1: ReLU in the paper's GPT runs).
    Ablations: a leaky ReLU (Fig. 25), hidden width 2d (the depth runs of Fig. 6)."""

    def __init__(self, config):
        super().__init__()
        hidden = config.mlp_ratio * config.n_embd
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=False)
        self.act = nn.ReLU() if config.mlp_slope == 0 else nn.LeakyReLU(config.mlp_slope)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=False)
        self.c_proj.residual_proj = True

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


# ----------------------------------------------------------------------------- blocks
# Each block's forward is its equation (§2); in the diagrams ─(+)─ is a skip (residual) connection.
# A block's `switches` are the fields of SWITCHES it reads (GPTConfig refuses the others, which
# would silently do nothing); by default ATTENTION_SWITCHES, which act on every Attention.

ATTENTION_SWITCHES = ("qk_norm", "logit_cap")

class PreLN(nn.Module):
    """Pre-LN (Eq. 1), the standard GPT block and the paper's baseline.

        x ──┬── norm ── attn ──(+)──┬── norm ── mlp ──(+)──▶
            └────────────────────┘  └──────────────────┘
    """

    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = make_norm(config.norm, config.n_embd)
        self.attn = Attention(config, value=trainable_matrix(config), proj=trainable_matrix(config, residual=True))
        self.ln_2 = make_norm(config.norm, config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x, cache=None):
        x = x + self.attn(self.ln_1(x), cache)
        return x + self.mlp(self.ln_2(x))


class PostLN(PreLN):
    """Post-LN (§2; the original Transformer), norms after each skip.

        x ──┬── attn ──(+)── norm ──┬── mlp ──(+)── norm ──▶
            └───────────┘           └──────────┘
    """

    def forward(self, x, cache=None):
        x = self.ln_1(x + self.attn(x, cache))
        return self.ln_2(x + self.mlp(x))


class Skipless(PreLN):
    """Naive skipless: Pre-LN without the attention skip. Not a paper model but the failure it
    starts from: ordinary attention collapses token representations with depth (rank collapse).

        x ── norm ── attn ──┬── norm ── mlp ──(+)──▶
                            └──────────────────┘
    """

    def forward(self, x, cache=None):
        x = self.attn(self.ln_1(x), cache)
        return x + self.mlp(self.ln_2(x))


class Parallel(nn.Module):
    """Parallel block (Eq. 7; GPT-J, PaLM): one norm, one skip, attention and MLP side by side.

        x ──┬── norm ──┬── attn ──(+)──▶
            │          └── mlp ────┤
            └──────────────────────┘
    """

    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = make_norm(config.norm, config.n_embd)
        self.attn = Attention(config, value=trainable_matrix(config), proj=trainable_matrix(config, residual=True))
        self.mlp = MLP(config)

    def forward(self, x, cache=None):
        h = self.ln_1(x)
        return x + self.attn(h, cache) + self.mlp(h)


class SAS(nn.Module):
    """SAS, the Simplified Attention Sub-block (App. B, Eqs. 12-13): no attention skip, shaped
    attention with values = the normalised input (W^V = I but in layer 1) and no projection.

        Xh   = beta_SA * MHA~(Norm1(X))
        Xout = alpha_FF * Xh + beta_FF * MLP(Norm2(Xh))

        x ── norm ── shaped attn ── ×β_SA ──┬── norm ── mlp ── ×β_FF ──(+)──▶
                                            └────────── ×α_FF ──────────┘

    At init shaped attention is the identity (W_Q = 0), so the block starts as beta_SA * Norm1(X)
    with a down-weighted MLP branch on the MLP's skip.
    """

    switches = ("beta_ff", "alpha_ff", "attention", "first_value", *ATTENTION_SWITCHES)

    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = make_norm(config.norm, config.n_embd)
        self.attn = self.make_attention(config, layer)
        self.ln_2 = make_norm(config.norm, config.n_embd)
        self.mlp = MLP(config)
        self.beta_sa = nn.Parameter(torch.tensor(1.0))
        if config.alpha_ff:
            self.alpha_ff = nn.Parameter(torch.tensor(float(config.alpha_ff)))
        else:  # no MLP skip (Fig. 25): a fixed 0, so forward still reads as Eq. 13
            self.register_buffer("alpha_ff", torch.tensor(0.0))
        self.beta_ff = nn.Parameter(torch.tensor(config.beta_ff_init))

    @staticmethod
    def make_attention(config, layer):
        """Values = the normalised input (W^V = I) and no W^P, but in the first layer, which
        keeps W^V = alpha_V I + beta_V dW, both gains from 1 (App. C: a "very small" gain, so
        kept; config.first_value=False drops it too, Fig. 24)."""
        first = layer == 0 and config.first_value
        value = ReparamLinear(config.n_embd) if first else nn.Identity()
        return ATTENTIONS[config.attention](config, value=value, proj=nn.Identity())

    def forward(self, x, cache=None):
        x = self.beta_sa * self.attn(self.ln_1(x), cache)
        return self.alpha_ff * x + self.beta_ff * self.mlp(self.ln_2(x))


class VSkipInit(SAS):
    """The paper's V-SkipInit baseline (Fig. 2): SAS, but every layer keeps trainable value and
    projection matrices (orthogonal init). Trains slower per step than Pre-LN, worse with depth."""

    switches = ("beta_ff", "alpha_ff", "attention", *ATTENTION_SWITCHES)

    @staticmethod
    def make_attention(config, layer):
        return ATTENTIONS[config.attention](config, value=trainable_matrix(config), proj=trainable_matrix(config))


class SASP(nn.Module):
    """SAS-P (App. B): parallel sub-blocks and no skip at all. At init shaped attention is the
    identity, so SAS-P computes what SAS does.

        Xout = beta_SA * MHA~(Norm(X)) + beta_FF * MLP(Norm(X))

        x ── norm ──┬── shaped attn ── ×β_SA ──(+)──▶
                    └── mlp ────────── ×β_FF ───┘
    """

    switches = ("beta_ff", "attention", "first_value", *ATTENTION_SWITCHES)

    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = make_norm(config.norm, config.n_embd)
        self.attn = SAS.make_attention(config, layer)
        self.mlp = MLP(config)
        self.beta_sa = nn.Parameter(torch.tensor(1.0))
        self.beta_ff = nn.Parameter(torch.tensor(config.beta_ff_init))

    def forward(self, x, cache=None):
        h = self.ln_1(x)
        return self.beta_sa * self.attn(h, cache) + self.beta_ff * self.mlp(h)


class OP(nn.Module):
    """The Outlier Protected block (He, Noci, Paliotta, Schlag, Hofmann, "Understanding and
    Minimising Outlier Features in Transformer Training", NeurIPS 2024, arXiv 2405.19279): Pre-LN's
    layout and skips with no norm in the block, the normalisation that breeds outlier features;
    QK-norm keeps attention's entropy from collapsing instead, and both residual branches are
    scaled down by beta (their op.yaml: 0.2, "O(1/sqrt(depth))"). GPT-2's final norm stays.

        Xh   = X  + beta_SA * MHA_QKnorm(X)
        Xout = Xh + beta_FF * MLP(Xh)

        x ──┬── attn (QK-norm) ── ×β_SA ──(+)──┬── mlp ── ×β_FF ──(+)──▶
            └──────────────────────────────┘   └──────────────────┘
    """

    switches = ("op_beta", "op_trainable", *ATTENTION_SWITCHES)

    def __init__(self, config, layer):
        super().__init__()
        qk_normed = replace(config, qk_norm=config.qk_norm or "rmsnorm")  # the block's own; qk_norm="none" drops it
        self.attn = Attention(qk_normed, value=trainable_matrix(config), proj=trainable_matrix(config, residual=True))
        self.mlp = MLP(config)
        for name in ("beta_sa", "beta_ff"):  # fixed, as in op.yaml, or trainable (its "optional")
            gain = torch.tensor(config.op_beta_init)
            if config.op_trainable:
                setattr(self, name, nn.Parameter(gain))
            else:
                self.register_buffer(name, gain)

    def forward(self, x, cache=None):
        x = x + self.beta_sa * self.attn(x, cache)
        return x + self.beta_ff * self.mlp(x)


BLOCKS = dict(pre_ln=PreLN, post_ln=PostLN, parallel=Parallel, skipless=Skipless, v_skipinit=VSkipInit, sas=SAS,
              sas_p=SASP, op=OP)  # --block's names
SWITCHES = ("beta_ff", "alpha_ff", "attention", "first_value", "qk_norm", "logit_cap", "op_beta", "op_trainable")


def switches_of(block):
    """The switches of SWITCHES that a block (a key of BLOCKS) takes."""
    return getattr(BLOCKS[block], "switches", ATTENTION_SWITCHES)


# ----------------------------------------------------------------------------- the GPT

class GPT(nn.Module):
    """GPT-2 layout with learned absolute positions, tied embeddings, no biases, no dropout (§1).
    norm="none" keeps one norm on the embeddings and the final norm, as the authors' code (§5)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        outer_norm = "layernorm" if config.norm == "none" else config.norm
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            ln_e=make_norm(outer_norm, config.n_embd) if config.norm == "none" else nn.Identity(),
            h=nn.ModuleList(BLOCKS[config.block](config, i) for i in range(config.n_layer)),
            ln_f=make_norm(outer_norm, config.n_embd),
        ))
        if config.vp:  # the V/P ablations (SPEC §8): every layer's W^V and W^P per Eq. 6
            for block in self.transformer.h:
                block.attn.c_v, block.attn.c_proj = (
                    ReparamLinear(config.n_embd, config.vp, beta=config.vp_beta, trainable=config.vp_trainable)
                    for _ in range(2))
        if (config.qk_norm or config.logit_cap) and not any(isinstance(m, Attention) for m in self.transformer.h.modules()):
            raise ValueError(f"qk_norm and logit_cap act on simple_gpt's Attention, which {config.block} does not use")
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied input/output embeddings
        # GPT-2's init for every matrix first, then the paper's special inits, which must win:
        # the other order silently loses attention = identity at init.
        self.apply(self._init_weights)
        for module in self.modules():
            if hasattr(module, "init_paper"):
                module.init_paper()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            std = 0.02
            if getattr(module, "residual_proj", False):  # GPT-2: scale outputs into the stream
                std /= math.sqrt(2 * self.config.n_layer)
            nn.init.normal_(module.weight, mean=0.0, std=std)

    def forward(self, idx, targets=None, caches=None, positions=None):
        """idx (B, T) token ids -> (logits (B, T, vocab), mean cross-entropy against targets or None).
        positions (B, k): run the output head at these positions only, for logits (B, k, vocab) and
        targets (B, k): sparse prediction, as Cramming's MLM does (§7), where the head is most of a
        step and the unmasked positions are not scored. caches: one KVCache per layer, for generate()."""
        B, T = idx.shape
        start = len(caches[0]) if caches else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens is longer than block_size {self.config.block_size}")
        pos = torch.arange(start, start + T, device=idx.device)
        x = self.transformer.ln_e(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for i, block in enumerate(self.transformer.h):
            # .to: under autocast some blocks end in a bf16 matmul; keep the stream in fp32
            x = block(x, caches[i] if caches else None).to(x.dtype)
        if positions is not None:
            x = x.gather(1, positions[..., None].expand(-1, -1, x.size(-1)))  # (B, k, d)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        return logits, loss

    def num_params(self, non_embedding=False):
        """Parameters, the tied embedding counted once; non_embedding drops wte and wpe."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wte.weight.numel() + self.transformer.wpe.weight.numel()
        return n

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, vocab=None):
        """Sample max_new_tokens after idx (B, T) with a KV cache in every block (shaped
        attention's running mean of V continues over the cache); vocab: only ids below it (the
        tokenizer's, not the padding up to vocab_size)."""
        if not self.config.causal:
            raise ValueError("generate needs a causal model (causal=True)")
        caches = None
        for _ in range(max_new_tokens):
            if caches is None or len(caches[0]) == self.config.block_size:
                # (re)fill the cache; once the context window slides every position shifts
                caches = [KVCache() for _ in self.transformer.h]
                logits, _ = self(idx[:, -self.config.block_size:], caches=caches)
            else:
                logits, _ = self(idx[:, -1:], caches=caches)
            logits = logits[:, -1, :vocab].float() / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                logits[logits < kth] = -float("inf")
            idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
