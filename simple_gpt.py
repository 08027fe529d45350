"""
Every transformer block of "Simplifying Transformer Blocks" (Bobby He, Thomas Hofmann; ICLR 2024,
arXiv 2311.01906) in one file, from the standard Pre-LN block to the skipless SAS-P block, and a
GPT around them. Read it next to the paper: equation numbers are the paper's, section names (§)
are those of SPEC.md, the paper in engineering terms.

The idea in one paragraph: shaped attention, A = alpha*I + beta*softmax(QK^T) - gamma*C with
W_Q = 0 at init, starts as the identity map. The attention skip, value and projection matrices
then become redundant and are removed (SAS), and the attention and MLP sub-blocks can run in
parallel with no skip at all (SAS-P): ~15% fewer parameters, ~15% faster training, same loss per
step as Pre-LN.

Readers of the authors' code: alpha, beta, gamma here are their attn_mat_skip_gain,
attn_mat_resid_gain and centre_attn_gain.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

NORMS = ("rmsnorm", "layernorm", "none")


def make_norm(kind, dim):
    """RMSNorm is the paper's default for its GPT runs (§1); "none" drops the norm (§2, no-norm)."""
    if kind == "rmsnorm":
        return nn.RMSNorm(dim)
    if kind == "layernorm":
        return nn.LayerNorm(dim, bias=False)
    return nn.Identity()


# ----------------------------------------------------------------------------- attention

class KVCache:
    """One layer's keys and values of the tokens seen so far. Generation only: a prompt fills it,
    then tokens are appended one at a time."""

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


def softmax_attention(q, k, v, causal):
    """softmax(Q K^T / sqrt(d_k) + M) V (Eq. 2) as one fused kernel; the T x T matrix is never
    built. A single query (cached generation) is the newest token and may see every key."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal and q.size(2) > 1)


def centre(v, n_query, causal):
    """C V for the last n_query positions, C being softmax of the mask alone (§2): causal row i is
    uniform over positions 1..i, so C V is the running mean of V; bidirectional, the mean of V."""
    if not causal:
        return v.mean(dim=2, keepdim=True)
    T = v.size(2)
    inv_count = 1 / torch.arange(T - n_query + 1, T + 1, device=v.device, dtype=torch.float32)
    return v.float().cumsum(dim=2)[:, :, -n_query:] * inv_count[:, None]  # fp32: sums T tokens


class Attention(nn.Module):
    """Multi-head self-attention (Eq. 2-3): softmax(Q K^T / sqrt(d_k) + M) V W^P."""

    def __init__(self, config):
        super().__init__()
        self.n_head, self.causal = config.n_head, config.causal
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)  # W^Q, W^K, W^V
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)  # W^P
        self.c_proj.residual_proj = True

    def forward(self, x, cache=None):
        q, k, v = (split_heads(t, self.n_head) for t in self.c_attn(x).chunk(3, dim=2))
        if cache is not None:
            k, v = cache.update(k, v)
        return self.c_proj(merge_heads(softmax_attention(q, k, v, self.causal)))


class FirstLayerValue(nn.Module):
    """W^V = alpha_V I + beta_V dW with dW = 0 at init (Eq. 6): the one value matrix SAS keeps,
    in the first layer only, where trained gains show it is not redundant (Fig. 4, App. C)."""

    def __init__(self, dim):
        super().__init__()
        self.dW = nn.Linear(dim, dim, bias=False)
        self.alpha = nn.Parameter(torch.tensor(1.0))
        self.beta = nn.Parameter(torch.tensor(1.0))

    def init_paper(self):
        nn.init.zeros_(self.dW.weight)

    def forward(self, x):
        return self.alpha * x + self.beta * self.dW(x)  # = x W^V, without building W^V


class ShapedAttention(nn.Module):
    """Shaped attention (Eq. 5), per head h:

        A_h = alpha_h I + beta_h softmax(Q_h K_h^T / sqrt(d_k) + M) - gamma_h C
        out = concat_h[A_h V_h] W^P,    V = X W^V

    With W_Q = 0 the logits are 0, softmax = C, and A = I: at init the sub-block is the identity.
    SAS passes nn.Identity() as W^V (but the first layer's) and W^P; V-SkipInit passes matrices.
    """

    def __init__(self, config, value, proj):
        super().__init__()
        self.n_head, self.causal = config.n_head, config.causal
        self.c_qk = nn.Linear(config.n_embd, 2 * config.n_embd, bias=False)  # W^Q, W^K fused
        self.c_v, self.c_proj = value, proj
        # trainable per-head gains, init 1 (§2); fp32 parameters, so the sum below is fp32
        self.alpha = nn.Parameter(torch.ones(config.n_head, 1, 1))
        self.beta = nn.Parameter(torch.ones(config.n_head, 1, 1))
        self.gamma = nn.Parameter(torch.ones(config.n_head, 1, 1))

    def init_paper(self):
        nn.init.zeros_(self.c_qk.weight[: self.c_qk.in_features])  # W_Q = 0: A = I at init
        for w in (self.c_v, self.c_proj):
            if isinstance(w, nn.Linear):  # V-SkipInit's trainable V and P: orthogonal (Fig. 2)
                nn.init.orthogonal_(w.weight)

    def forward(self, x, cache=None):
        q, k = (split_heads(t, self.n_head) for t in self.c_qk(x).chunk(2, dim=2))
        v = split_heads(self.c_v(x), self.n_head)
        k_all, v_all = (k, v) if cache is None else cache.update(k, v)
        y = (self.alpha * v
             + self.beta * softmax_attention(q, k_all, v_all, self.causal)
             - self.gamma * centre(v_all, q.size(2), self.causal))
        return self.c_proj(merge_heads(y))


class MLP(nn.Module):
    """MLP(X) = ReLU(X W1) W2, hidden width 4d, no biases (§1: ReLU in the paper's GPT runs)."""

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)
        self.c_proj.residual_proj = True

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)))


# ----------------------------------------------------------------------------- blocks
# Each block's forward is its equation (§2). Arrows: ─(+)─ is a skip (residual) connection.

class PreLN(nn.Module):
    """Pre-LN (Eq. 1), the standard GPT block and the paper's baseline.

        x ──┬── norm ── attn ──(+)──┬── norm ── mlp ──(+)──▶
            └────────────────────┘  └──────────────────┘
    """

    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = make_norm(config.norm, config.n_embd)
        self.attn = Attention(config)
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
        self.attn = Attention(config)
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
    """

    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = make_norm(config.norm, config.n_embd)
        self.attn = self.make_attention(config, layer)
        self.ln_2 = make_norm(config.norm, config.n_embd)
        self.mlp = MLP(config)
        self.beta_sa = nn.Parameter(torch.tensor(1.0))
        self.alpha_ff = nn.Parameter(torch.tensor(1.0))
        self.beta_ff = nn.Parameter(torch.tensor(config.beta_ff_init))

    @staticmethod
    def make_attention(config, layer):
        value = FirstLayerValue(config.n_embd) if layer == 0 else nn.Identity()
        return ShapedAttention(config, value=value, proj=nn.Identity())

    def forward(self, x, cache=None):
        x = self.beta_sa * self.attn(self.ln_1(x), cache)
        return self.alpha_ff * x + self.beta_ff * self.mlp(self.ln_2(x))


class VSkipInit(SAS):
    """The paper's V-SkipInit baseline (Fig. 2): SAS, but every layer keeps trainable value and
    projection matrices (orthogonal init). Trains slower per step than Pre-LN, worse with depth."""

    @staticmethod
    def make_attention(config, layer):
        value = nn.Linear(config.n_embd, config.n_embd, bias=False)
        proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        return ShapedAttention(config, value=value, proj=proj)


class SASP(nn.Module):
    """SAS-P (App. B): parallel sub-blocks and no skip at all. At init shaped attention is the
    identity, so SAS-P computes what SAS does.

        Xout = beta_SA * MHA~(Norm(X)) + beta_FF * MLP(Norm(X))

        x ── norm ──┬── shaped attn ── ×β_SA ──(+)──▶
                    └── mlp ────────── ×β_FF ───┘
    """

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


BLOCKS = {
    "pre_ln": PreLN,
    "post_ln": PostLN,
    "parallel": Parallel,
    "skipless": Skipless,
    "v_skipinit": VSkipInit,
    "sas": SAS,
    "sas_p": SASP,
}


# ----------------------------------------------------------------------------- the GPT

@dataclass
class GPTConfig:
    block: str = "sas_p"  # a key of BLOCKS
    norm: str = "rmsnorm"  # rmsnorm (the paper's), layernorm or none
    n_layer: int = 18  # the paper's CodeParrot model: 18 x 768, 12 heads, T = 128 (§4)
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 128
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64: faster matmuls
    causal: bool = True  # False: bidirectional attention and C = 1 1^T / T (the paper's BERT)
    beta_ff: float | None = None  # initial MLP gain of SAS/SAS-P/V-SkipInit; None: see below

    def __post_init__(self):
        if self.block not in BLOCKS:
            raise ValueError(f"unknown block {self.block!r}; valid: {', '.join(BLOCKS)}")
        if self.norm not in NORMS:
            raise ValueError(f"unknown norm {self.norm!r}; valid: {', '.join(NORMS)}")
        if min(self.n_layer, self.n_head, self.n_embd, self.block_size, self.vocab_size) < 1:
            raise ValueError("n_layer, n_head, n_embd, block_size and vocab_size must be >= 1")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")

    @property
    def beta_ff_init(self):
        """0.1 at the paper's 18 layers, scaled as 1/sqrt(L) (§2): 0.1 * sqrt(18 / n_layer)."""
        return self.beta_ff if self.beta_ff is not None else 0.1 * math.sqrt(18 / self.n_layer)


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

    def flops_per_token(self, seq_len=None, predicted=1.0):
        """Training FLOPs per token (forward + backward): 6 per weight of every matmul the block
        really has (so SAS's removed V and P are not counted) and of the LM head at the fraction
        `predicted` of positions it runs at, plus attention's Q K^T and A V, 12 * L * d * T (PaLM's
        estimate). Shaped attention's extra terms are O(T d)."""
        T = seq_len or self.config.block_size
        matmul = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        head = self.lm_head.weight.numel()
        return 6 * (matmul - head + predicted * head) + 12 * self.config.n_layer * self.config.n_embd * T

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW with the paper's groups (§4): decay on matrices and embeddings, none on gains
        and norms. fused on CUDA."""
        decay = {id(m.weight) for m in self.modules() if isinstance(m, (nn.Linear, nn.Embedding))}
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if id(p) in decay], "weight_decay": weight_decay},
            {"params": [p for p in params if id(p) not in decay], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=1e-8,
                                 fused=device_type == "cuda")

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Sample max_new_tokens after idx (B, T) with a KV cache in every block (shaped
        attention's running mean of V continues over the cache)."""
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
            logits = logits[:, -1, :].float() / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                logits[logits < kth] = -float("inf")
            idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


@torch.no_grad()
def token_similarity(model, idx):
    """Mean cosine similarity between the token representations of a sequence, after the
    embeddings and after every block (§6, claim 3). Climbing to 1 with depth is rank collapse:
    every token looks alike, and attention has nothing left to tell apart."""
    outputs = []
    modules = [model.transformer.ln_e, *model.transformer.h]
    hooks = [m.register_forward_hook(lambda m, args, out: outputs.append(out)) for m in modules]
    try:
        model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    sims = []
    for x in outputs:
        x = F.normalize(x.float(), dim=-1)
        gram = x @ x.transpose(1, 2)  # (B, T, T) cosines
        T = x.size(1)
        sims.append(((gram.sum((1, 2)) - T) / (T * (T - 1))).mean().item())  # off-diagonal mean
    return sims
