"""
Text from a trained run's checkpoint: a GPT continues a prompt, an encoder fills in its [MASK]s.

    python sample.py out/sas_p                                   # continues "def "
    python sample.py out/sas_p --prompt "import os" --tokens 300
    python sample.py out/sas_p_mlm --prompt "import[MASK]"       # an encoder (--objective mlm)

train.py prints a short sample at the end of every run through sample_text.
"""

import argparse

import numpy as np
import torch
import torch.nn.functional as F

import prepare_data
from common import add_import_flag, import_blocks, load_model

MASK_MARKER = "[MASK]"  # in a --prompt for a masked LM: one token to fill in
# by model.config.causal; GPT-2's BPE starts a word with its space, so "in[MASK](" asks for " range"
DEFAULT_PROMPTS = {True: "def ", False: f"for i in{MASK_MARKER}(10):\n    print(i)"}


def fail(message):
    raise SystemExit(f"sample: error: {message}")


def sample_text(model, tokenizer, prompt, n_tokens, device):
    """A causal model continues the prompt by n_tokens; a masked LM fills in its [MASK]s."""
    prompt = DEFAULT_PROMPTS[model.config.causal] if prompt is None else prompt
    model.eval()
    if not model.config.causal:
        return fill_in(model, tokenizer, prompt, device)
    prompt_ids = tokenizer.encode_batch([prompt])[0] if prompt else np.array([tokenizer.eot])
    ids = torch.tensor(prompt_ids.astype(np.int64), device=device)[None]
    torch.manual_seed(0)
    out = model.generate(ids[:, -model.config.block_size:], n_tokens, temperature=0.8, top_k=200, vocab=tokenizer.vocab_size)
    return tokenizer.decode(out[0].tolist())


@torch.no_grad()
def fill_in(model, tokenizer, prompt, device, top=5):
    """The prompt with each [MASK] filled by the model's best guess, then its top guesses per mask."""
    if MASK_MARKER not in prompt:
        fail(f"--prompt has no {MASK_MARKER}: a masked language model fills in each {MASK_MARKER} "
             f"of the prompt with one token, e.g. --prompt 'import{MASK_MARKER}'")
    mask_token = tokenizer.vocab_size  # as in training: the first id past the tokenizer's
    pieces = [p.astype(np.int64) for p in tokenizer.encode_batch(prompt.split(MASK_MARKER))]
    ids = np.concatenate([x for p in pieces for x in (p, [mask_token])][:-1])
    if len(ids) > model.config.block_size:
        fail(f"--prompt is {len(ids)} tokens, longer than the model's block_size {model.config.block_size}")
    idx = torch.tensor(ids, device=device)[None]
    positions = (idx[0] == mask_token).nonzero()[:, 0][None]  # (1, masks)
    logits = model(idx, positions=positions)[0][0].float()
    logits[:, tokenizer.vocab_size:] = -float("inf")  # never the mask token or the vocabulary's padding
    probs, guesses = F.softmax(logits, dim=-1).topk(top, dim=-1)
    filled = ids.copy()
    filled[positions[0].cpu().numpy()] = guesses[:, 0].cpu().numpy()
    lines = [tokenizer.decode(filled.tolist())]
    for i, (p, g) in enumerate(zip(probs.tolist(), guesses.tolist())):
        lines.append(f"{MASK_MARKER} {i + 1}: " + " | ".join(f"{tokenizer.decode([t])!r} {q:.2f}" for t, q in zip(g, p)))
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="sample.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", default="out/sas_p", help="a train.py run's folder, holding ckpt.pt (default: %(default)s)")
    p.add_argument("--prompt", help=f"the text to continue (default: {DEFAULT_PROMPTS[True]!r}); for an encoder, a text "
                   f"whose {MASK_MARKER}s it fills in, one token each (default: a small example)")
    p.add_argument("--tokens", type=int, default=200, help="tokens to sample (default: %(default)s)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "mps", "cpu"], help="auto: cuda > mps > cpu")
    add_import_flag(p)
    return p.parse_args(argv)


def main(argv=None):
    import_blocks(argv, "sample.py")
    args = parse_args(argv)
    available = dict(cuda=torch.cuda.is_available(), mps=torch.backends.mps.is_available(), cpu=True)
    if args.device != "auto" and not available[args.device]:
        fail(f"--device {args.device}, but torch sees no {args.device.upper()} device")
    device = args.device if args.device != "auto" else next(d for d, there in available.items() if there)
    model, ckpt = load_model(args.run, device, "sample")
    print(sample_text(model, prepare_data.load_tokenizer(ckpt["tokenizer"]), args.prompt, args.tokens, device))


if __name__ == "__main__":
    main()
