"""
What a model does inside, measured: what train.py logs at every evaluation (the token similarity
of rank collapse, every learned gain, outlier features and attention entropy; at the end, the
loss with int8 inputs), the loss by how frequent the predicted token is (loss_by_frequency, any
checkpoint's), and the attention matrices themselves, drawn:

    python diagnostics.py out/pre_ln out/sas_p     # each run's attention at init and trained: attention.png

For shaped attention the matrix drawn is the whole A = alpha I + beta softmax(QK^T) - gamma C the
sub-block applies to its values (at init: I), for Pre-LN its softmax.
"""

import argparse
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import prepare_data
from common import add_import_flag, import_blocks, load_model
from simple_gpt import GPT, Attention, GPTConfig, attention_probs


@torch.no_grad()
def residual_streams(model, idx):
    """What one forward pass of idx (B, T) leaves in the residual stream, after the embeddings and
    after every block (L + 1 tensors (B, T, d)), and what every attention sub-block was given."""
    streams, attention_inputs = [], []
    hooks = [m.register_forward_hook(lambda m, args, out: streams.append(out))
             for m in (model.transformer.ln_e, *model.transformer.h)]
    hooks += [m.register_forward_hook(lambda m, args, out: attention_inputs.append(args[0]))
              for m in attention_layers(model)]
    try:
        model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return streams, attention_inputs


def attention_layers(model):
    return [block.attn for block in model.transformer.h if isinstance(getattr(block, "attn", None), Attention)]


def mean_cosine(x):
    """Mean cosine similarity between the tokens of each sequence of x (B, T, d), off the diagonal."""
    x = F.normalize(x.float(), dim=-1)
    T = x.size(1)
    return ((x @ x.transpose(1, 2)).sum((1, 2)) - T).mean().item() / (T * (T - 1))


def token_similarity(model, idx):
    """Mean cosine similarity between the token representations of a sequence, after the
    embeddings and after every block (§6, claim 3). Climbing to 1 with depth is rank collapse:
    every token looks alike, and attention has nothing left to tell apart."""
    return [mean_cosine(x) for x in residual_streams(model, idx)[0]]


def learned_gains(model):
    """Every trainable gain of the paper, one value per layer that has it (per-head gains
    averaged): the trajectories of Fig. 4. value_* and proj_* are those of W = alpha W_init +
    beta dW (Eq. 6): SAS's first-layer W^V, or every layer's W^V and W^P with --vp_trainable."""
    gains = {}
    for name, p in model.named_parameters():
        *path, leaf = name.split(".")
        if leaf in ("alpha", "beta", "gamma", "beta_sa", "alpha_ff", "beta_ff"):
            key = {"c_v": f"value_{leaf}", "c_proj": f"proj_{leaf}"}.get(path[-1], leaf)
            gains.setdefault(key, []).append(round(p.detach().float().mean().item(), 5))
    for w in ("value", "proj"):
        if f"{w}_alpha" in gains:
            gains[f"{w}_beta_over_alpha"] = [round(b / a, 5) for a, b in zip(gains[f"{w}_alpha"], gains[f"{w}_beta"])]
    return gains


def kurtosis(h):
    """Kurt = mean_j s_j^2 / (mean_j s_j)^2 of the neurons' mean squares s_j = mean_n h_nj^2 over
    the tokens n of h (..., d): 1 when every neuron carries the same power, d when one carries it
    all. Outlier features are the few neurons far above the rest (arXiv 2405.19279, Eq. 1). The
    authors' code logs var_j(s_j / mean_j s_j), which is this minus 1, times d / (d - 1)."""
    s = h.flatten(0, -2).float().pow(2).mean(0)  # (d,)
    return s.pow(2).mean() / s.mean().pow(2)


def max_median_ratio(h):
    """max_j |h_nj| / median_j |h_nj| of each token n, averaged over the tokens (the authors' code)."""
    a = h.flatten(0, -2).float().abs()
    return (a.amax(dim=-1) / a.median(dim=-1).values).mean()


def attention_entropy(attn, x):
    """Entropy of attention's softmax (for shaped attention its softmax part), in nats, averaged
    over heads and queries: its collapse to 0 with training is what QK-norm prevents."""
    return torch.special.entr(attention_probs(*attn.queries_keys(x), attn.causal, attn.logit_cap)).sum(-1).mean()


@torch.no_grad()
def outlier_stats(model, streams, attention_inputs):
    """Per layer, from residual_streams: the residual stream's kurtosis and max/median ratio after
    every block, and every attention layer's entropy. As the authors' code does, each token's h
    is centred over the width first, so that an offset shared by all neurons counts for none."""
    hs = [h.float() - h.float().mean(-1, keepdim=True) for h in streams[1:]]
    entropy = [attention_entropy(a, x) for a, x in zip(attention_layers(model), attention_inputs)]
    stats = dict(kurtosis=[kurtosis(h) for h in hs], max_median=[max_median_ratio(h) for h in hs], entropy=entropy)
    return {k: [round(x, 4) for x in torch.stack(v).tolist()] if v else [] for k, v in stats.items()}


@torch.no_grad()
def stream_stats(model, idx):
    """From one forward pass: the mean cosine similarity of the last block's tokens (near 1: rank
    collapse) and each layer's outlier_stats; what each evaluation of train.py logs."""
    streams, attention_inputs = residual_streams(model, idx)
    return round(mean_cosine(streams[-1]), 4), outlier_stats(model, streams, attention_inputs)


def fake_int8(x):
    """x rounded to int8 and back: symmetric, one scale per tensor, max|x| / 127."""
    scale = x.detach().abs().amax().clamp(min=1e-12) / 127
    return (x / scale).round().clamp(-127, 127) * scale


@contextmanager
def int8_inputs(model):
    """Within it, the input of every linear layer in the blocks is fake-quantised to int8 (fake_int8):
    what int8 inference would give, where outlier features stretch the scale of everyone else."""
    linears = [m for m in model.transformer.h.modules() if isinstance(m, nn.Linear)]
    hooks = [m.register_forward_pre_hook(lambda m, args: (fake_int8(args[0]),)) for m in linears]
    try:
        yield model
    finally:
        for hook in hooks:
            hook.remove()


FREQUENCY_EDGES = (100, 1000, 10000)  # the buckets of loss_by_frequency: the 100 most frequent tokens, the next 900, ...


@torch.no_grad()
def loss_by_frequency(model, paths, offsets, T, edges=FREQUENCY_EDGES, batch_size=16, n_tokens=None):
    """The validation loss by how often the predicted token occurs in the training text: tokens
    ranked by their count in paths["train"], bucketed at edges (the 100 most frequent, the next 900,
    ..., the rest: rare or never seen, whose embedding rows get few updates); on the validation
    sequences at offsets, per bucket: (first rank, last rank, share of the targets, mean loss).
    n_tokens: the tokenizer's vocabulary (meta.json's), ranked without the model's padding."""
    if not model.config.causal:
        raise ValueError("loss_by_frequency scores next-token prediction: an encoder (causal=False) sees its targets")
    counts = np.bincount(np.memmap(paths["train"], dtype=np.uint16, mode="r"), minlength=n_tokens or model.config.vocab_size)
    edges = [edge for edge in edges if edge < len(counts)]  # a small vocabulary has fewer buckets
    ranks = np.empty(len(counts), dtype=np.int64)
    ranks[np.argsort(-counts, kind="stable")] = np.arange(len(counts))
    bucket = torch.from_numpy(np.searchsorted(edges, ranks, side="right"))
    loss_sum, n = torch.zeros(len(edges) + 1, dtype=torch.float64), torch.zeros(len(edges) + 1, dtype=torch.float64)
    for i in range(0, len(offsets), batch_size):
        seqs = torch.from_numpy(prepare_data.sequences(paths["val"], offsets[i:i + batch_size], T))
        targets = seqs[:, 1:].flatten()
        logits = model(seqs[:, :-1].to(model.lm_head.weight.device))[0]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.to(logits.device), reduction="none").double().cpu()
        loss_sum += torch.bincount(bucket[targets], weights=loss, minlength=len(n))
        n += torch.bincount(bucket[targets], minlength=len(n))
    bounds = [0, *edges, len(counts)]
    return [(bounds[b] + 1, bounds[b + 1], n[b].item() / n.sum().item(), (loss_sum[b] / n[b]).item() if n[b] else None)
            for b in range(len(n))]


# ----------------------------------------------------------------------------- the attention picture

@torch.no_grad()
def attention_matrices(model, idx):
    """The T x T matrix A that every attention layer applies to its values, on idx (B, T): a list
    of (B, n_head, T, T), one per layer."""
    _, inputs = residual_streams(model, idx)
    return [attn.matrix(*attn.queries_keys(x)) for attn, x in zip(attention_layers(model), inputs)]


def attention_figure(models, head, out):
    """One row per (name, model, idx) of models, one panel per layer: head `head`'s A on idx's first sequence."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [(name, [A[0, head].float().numpy() for A in attention_matrices(model, idx)]) for name, model, idx in models]
    top = max(np.abs(A).max() for _, As in rows for A in As)
    n_layer = max(len(As) for _, As in rows)
    fig, axes = plt.subplots(len(rows), n_layer, figsize=(1.9 * n_layer + 1, 2 * len(rows) + 0.4), squeeze=False)
    for r, (name, As) in enumerate(rows):
        for layer, ax in enumerate(axes[r]):
            ax.set_xticks([]), ax.set_yticks([])
            if layer >= len(As):
                ax.axis("off")
                continue
            image = ax.imshow(As[layer], cmap="RdBu_r", vmin=-top, vmax=top)
            if r == 0:
                ax.set_title(f"layer {layer + 1}")
        axes[r][0].set_ylabel(name, fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.8, label="A[query, key]")
    fig.suptitle(f"head {head + 1}'s attention matrix A on {models[0][2].size(1)} tokens of validation text "
                 "(rows: queries; columns: the keys they take from)", fontsize=10)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


def validation_text(ckpt, n_tokens):
    """The first n_tokens of the validation text a run trained on, (1, n_tokens)."""
    cfg = ckpt["config"]
    try:
        _, paths = prepare_data.open_prepared(Path(cfg["data_dir"]) / cfg["dataset"], n_tokens)
    except ValueError as e:
        raise SystemExit(f"diagnostics.py: error: the validation text of {cfg['out_dir']}: {e}") from None
    return torch.from_numpy(prepare_data.sequences(paths["val"], [0], n_tokens)[:, :-1])


def parse_args(argv=None):
    import_blocks(argv, "diagnostics.py")
    p = argparse.ArgumentParser(prog="diagnostics.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_import_flag(p)
    p.add_argument("runs", nargs="+", help="train.py runs' folders, each holding ckpt.pt")
    p.add_argument("--tokens", type=int, default=24, help="the sequence's length (default: %(default)s)")
    p.add_argument("--head", type=int, default=1, help="the head drawn (default: %(default)s)")
    p.add_argument("--out", default="attention.png", help="the figure (default: %(default)s)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    models = []
    for run in args.runs:
        model, ckpt = load_model(run, "cpu", "diagnostics.py")
        if not 1 <= args.head <= model.config.n_head:
            raise SystemExit(f"diagnostics.py: error: --head {args.head}: {run} has heads 1 to {model.config.n_head}")
        if not 2 <= args.tokens <= model.config.block_size:
            raise SystemExit(f"diagnostics.py: error: --tokens {args.tokens}: {run} takes 2 to {model.config.block_size}")
        torch.manual_seed(ckpt["config"]["seed"])  # as train.py does: the very weights the run started from
        at_init = GPT(GPTConfig(**ckpt["model_config"])).eval()
        block, idx = ckpt["model_config"]["block"], validation_text(ckpt, args.tokens)  # each run its own tokens
        models += [(f"{block} at init", at_init, idx), (f"{block} trained ({ckpt['iter']} steps)", model, idx)]
    attention_figure(models, args.head - 1, args.out)
    print(f"diagnostics: wrote {args.out}")


if __name__ == "__main__":
    main()
