"""
Tokenise a corpus into nanoGPT's format: data/<name>/train.bin and val.bin (uint16 token ids,
documents separated by the end-of-text token) and meta.json (tokenizer, vocab size, counts).

    python prepare_data.py                       # Python's standard library: real code, offline
    python prepare_data.py --input ~/src --name mycode   # any text file, folder or glob
    python prepare_data.py --dataset codeparrot  # the paper's data (pip install datasets)

The paper trains on CodeParrot, Python files from GitHub. Every Python installation carries
~1,800 files of real Python (~15M GPT-2 tokens): the default corpus, no download needed.
Documents go to val.bin when a hash of their name falls in the first 5%, so the split is the
same on every run (too few files for that: the last 5% of each). Writes are atomic: meta.json appears last, only for a complete dataset.
"""

import argparse
import glob
import itertools
import json
import os
import re
import sys
import sysconfig
import zlib
from contextlib import contextmanager
from pathlib import Path

import numpy as np

try:
    import fcntl  # locks between processes (not on Windows)
except ImportError:
    fcntl = None

DEFAULT_DATASET = "python_stdlib"
BYTES_DATASET = "python_stdlib_bytes"  # the same corpus as bytes: the reproduction's
CODEPARROT = "codeparrot/codeparrot-clean"  # the paper's training data on the HuggingFace hub
VAL_PERCENT = 5


def fail(message):
    raise SystemExit(f"prepare_data: error: {message}")


# ----------------------------------------------------------------------------- tokenizers

GPT2_RANKS = 50256  # GPT-2's BPE: 256 byte tokens and 50,000 merges; end-of-text is id 50256


class Tokenizer:
    """GPT-2 BPE through tiktoken, or UTF-8 bytes (ids 0-255, end-of-text 256) offline.
    gpt2_N is GPT-2's BPE cut to its first N tokens (the 256 bytes and the first N - 256 merges,
    in rank order), end-of-text id N: a valid BPE of a smaller vocabulary, with no training."""

    def __init__(self, name):
        self.name = name
        ranks = re.fullmatch(r"gpt2(?:_(\d+))?", name)
        if ranks:
            import tiktoken
            gpt2 = tiktoken.get_encoding("gpt2")  # needs the network or TIKTOKEN_CACHE_DIR
            n = int(ranks[1] or GPT2_RANKS)
            if not 256 <= n <= GPT2_RANKS:
                fail(f"--vocab {n}: GPT-2's BPE has 256 to {GPT2_RANKS} tokens before end-of-text")
            self.bpe = gpt2 if n == GPT2_RANKS else tiktoken.Encoding(
                name=name, pat_str=gpt2._pat_str, special_tokens={"<|endoftext|>": n},
                mergeable_ranks={token: rank for token, rank in gpt2._mergeable_ranks.items() if rank < n})
            self.vocab_size, self.eot = self.bpe.n_vocab, self.bpe.eot_token
        elif name == "bytes":
            self.bpe, self.vocab_size, self.eot = None, 257, 256
        else:
            fail(f"unknown tokenizer {name!r}; valid: gpt2, gpt2_N (its first N tokens), bytes")

    def encode_batch(self, texts):
        if self.bpe is None:
            return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]
        return [np.array(ids, dtype=np.uint16) for ids in
                self.bpe.encode_ordinary_batch(texts, num_threads=os.cpu_count() or 1)]

    def decode(self, ids):
        ids = [i for i in ids if i < self.vocab_size]  # a padded vocabulary has ids past the end
        if self.bpe is None:
            return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
        return self.bpe.decode(ids)


def load_tokenizer(choice="auto"):
    """auto: GPT-2 BPE if tiktoken can load it, else bytes with a one-line warning."""
    if choice != "auto":
        try:
            return Tokenizer(choice)
        except SystemExit:
            raise
        except Exception as e:
            fail(f"cannot load the {choice} tokenizer ({type(e).__name__}); "
                 "offline, point TIKTOKEN_CACHE_DIR at a folder holding tiktoken's GPT-2 files")
    try:
        return Tokenizer("gpt2")
    except Exception as e:
        print(f"warning: GPT-2 BPE unavailable ({type(e).__name__}), using byte-level tokens; for "
              "GPT-2 BPE offline set TIKTOKEN_CACHE_DIR to a folder holding tiktoken's cache",
              file=sys.stderr)
        return Tokenizer("bytes")


# ----------------------------------------------------------------------------- corpora
# Each yields (split, text) documents, split being "train" or "val".

def split_of(name):
    """A document's split from a hash of its name: the same on every run and machine."""
    return "val" if zlib.crc32(name.encode()) % 100 < VAL_PERCENT else "train"


def stdlib_documents():
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if "site-packages" not in path.relative_to(root).parts:
            yield split_of(str(path.relative_to(root))), path.read_text(encoding="utf-8", errors="replace")


def input_files(pattern):
    """The text files of --input, a file, folder or glob: a folder's files but those in or under a
    hidden folder (.git, .venv) or __pycache__; any binary file (a NUL byte in its first 8 KiB) is
    left out, and counted."""
    path = Path(pattern).expanduser()
    if path.is_dir():
        found = [p for p in path.rglob("*") if p.is_file() and not any(
            part.startswith(".") or part == "__pycache__" for part in p.relative_to(path).parts)]
    else:
        found = [path] if path.is_file() else [Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file()]
    files = sorted(p for p in found if not binary(p))
    if len(files) < len(found):
        print(f"prepare_data: left out {len(found) - len(files)} binary files of --input {pattern}")
    if not files:
        fail(f"--input {pattern}: " + ("no text file there" if found or path.is_dir() else "no such file, folder or glob match"))
    return files


def binary(path):
    """Whether a file is binary: a NUL byte in its first 8 KiB, as git decides it."""
    with open(path, "rb") as f:
        return b"\0" in f.read(8192)


def input_name(pattern):
    """A dataset's default name from --input: its file's or folder's name, a glob's folder's."""
    parts = Path(pattern).expanduser().parts
    fixed = list(itertools.takewhile(lambda part: not re.search(r"[*?[]", part), parts))  # the folder a glob is in
    name = Path(*fixed or ["."]).resolve().name.split(".")[0]
    if not name:
        fail(f"--input {pattern}: name the dataset (--name NAME)")
    return name


def file_documents(files):
    """One document per file, split by its path below the files' common folder, so the split
    does not depend on where that folder is. Where that leaves a split empty (a single file, or
    a few files none of whose paths hash into val), every file is split by position instead:
    its last 5% to val."""
    root = Path(os.path.commonpath([path.parent for path in files]))
    splits = [split_of(str(path.relative_to(root))) for path in files]
    read = lambda path: path.read_text(encoding="utf-8", errors="replace")
    if {"train", "val"} <= set(splits):
        yield from ((split, read(path)) for split, path in zip(splits, files))
        return
    if len(files) > 1:
        print(f"prepare_data: split by their paths, these {len(files)} files leave the {set(('train', 'val')) - set(splits)} "
              f"split empty; each file's last {VAL_PERCENT}% is validation instead")
    for path in files:
        text = read(path)
        cut = text.rfind("\n", 0, len(text) * (100 - VAL_PERCENT) // 100) + 1
        yield "train", text[:cut]
        yield "val", text[cut:]


def codeparrot_documents():
    try:
        from datasets import load_dataset
    except ImportError:
        fail("--dataset codeparrot needs HuggingFace datasets: pip install datasets")
    try:
        for i, row in enumerate(load_dataset(CODEPARROT, split="train", streaming=True)):
            yield split_of(str(i)), row["content"]
    except Exception as e:
        first_line = (str(e).splitlines() or [""])[0][:200]
        fail(f"could not read {CODEPARROT} from the HuggingFace hub ({type(e).__name__}: "
             f"{first_line}); check the connection, or use --input with local files")


# ----------------------------------------------------------------------------- writing

class Locked(Exception):
    """Another process holds the lock (locked without wait)."""


@contextmanager
def locked(path, wait=True, waiting=None):
    """An exclusive lock on path (a file) within the block, across processes: with wait, a second
    process waits for the first to finish (saying waiting, if given, first); without, it gets
    Locked. Without fcntl (Windows) there are no locks: one process at a time there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None and not getattr(locked, "warned", False):
        print("warning: no file locks on this platform (fcntl): run one process at a time", file=sys.stderr)
        locked.warned = True
    with open(path, "w") as f:
        if fcntl:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    raise Locked(path) from None
                if waiting:
                    print(waiting, flush=True)
                fcntl.flock(f, fcntl.LOCK_EX)
        yield


def prepare(out_dir, documents, source, tokenizer, max_tokens=None, batch=256):
    """Tokenise documents into out_dir, streaming: memory holds one batch of documents. A second
    process preparing the same folder at once waits for the first, then finds it prepared."""
    out_dir = Path(out_dir)
    with locked(out_dir / ".prepare.lock", waiting=f"prepare_data: waiting for another process preparing {out_dir}"):
        return prepare_unlocked(out_dir, documents, source, tokenizer, max_tokens, batch)


def prepared(meta_path):
    """The meta.json of a prepared dataset as a dict, None if it is missing or broken."""
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):  # missing, unreadable, not UTF-8 or not JSON
        return None
    return meta if isinstance(meta, dict) else None


def prepare_unlocked(out_dir, documents, source, tokenizer, max_tokens, batch):
    meta_path = out_dir / "meta.json"
    meta = prepared(meta_path)
    if meta and (meta.get("source"), meta.get("tokenizer"), meta.get("max_tokens")) == (source, tokenizer.name, max_tokens):
        print(f"prepare_data: {out_dir} is already prepared ({meta['train_tokens']:,} train tokens)")
        return meta
    meta_path.unlink(missing_ok=True)  # a different request: the old dataset is replaced
    tmp = {split: out_dir / f"{split}.bin.tmp{os.getpid()}" for split in ("train", "val")}  # this process's own
    counts, text, n_docs, pending = {"train": 0, "val": 0}, {"train": 0, "val": 0}, 0, []  # text: without end-of-text
    print(f"prepare_data: tokenising {source} with {tokenizer.name} into {out_dir}")
    try:
        with open(tmp["train"], "wb") as train_f, open(tmp["val"], "wb") as val_f:
            files = {"train": train_f, "val": val_f}

            def flush():
                nonlocal n_docs
                splits, texts = zip(*pending)
                for split, ids in zip(splits, tokenizer.encode_batch(texts)):
                    np.append(ids, tokenizer.eot).astype(np.uint16).tofile(files[split])
                    counts[split] += len(ids) + 1
                    text[split] += len(ids)
                n_docs += len(pending)
                pending.clear()
                print(f"  {n_docs:,} documents, {counts['train'] + counts['val']:,} tokens", flush=True)

            for doc in documents:
                pending.append(doc)
                if len(pending) == batch:
                    flush()
                    if max_tokens and counts["train"] + counts["val"] >= max_tokens:
                        break
            if pending:
                flush()
        if not text["train"] or not text["val"]:
            fail(f"{source}: too little text for both splits ({text} tokens of text)")
        for split, path in tmp.items():
            os.replace(path, out_dir / f"{split}.bin")
    finally:
        for path in tmp.values():
            path.unlink(missing_ok=True)  # nothing half-written survives Ctrl-C or an error
    meta = dict(source=source, tokenizer=tokenizer.name, vocab_size=tokenizer.vocab_size,
                eot_token=tokenizer.eot, documents=n_docs, max_tokens=max_tokens,
                train_tokens=counts["train"], val_tokens=counts["val"])
    meta_tmp = out_dir / f"meta.json.tmp{os.getpid()}"
    meta_tmp.write_text(json.dumps(meta, indent=2))
    os.replace(meta_tmp, meta_path)
    print(f"prepare_data: wrote {counts['train']:,} train and {counts['val']:,} val tokens "
          f"from {n_docs:,} documents to {out_dir}")
    return meta


# ----------------------------------------------------------------------------- reading (train.py)

def open_prepared(folder, block_size):
    """(meta, {split: path}) of the dataset prepared in folder, checked the way a crash or a
    hand edit can break it; ValueError says what is wrong."""
    meta = prepared(folder / "meta.json")
    if meta is None or not {"vocab_size", "tokenizer", "train_tokens", "val_tokens"} <= meta.keys():
        raise ValueError(f"{folder / 'meta.json'} is broken (not the JSON prepare_data.py writes)")
    paths = {split: folder / f"{split}.bin" for split in ("train", "val")}
    for path in paths.values():
        if not path.exists():
            raise ValueError(f"{path} is missing")
        size = path.stat().st_size
        if size % 2:
            raise ValueError(f"{path} is corrupt: {size} bytes is not a whole number of uint16 tokens")
        if size // 2 < block_size + 1:
            raise ValueError(f"{path} holds {size // 2} tokens, fewer than one sequence of block_size + 1")
        top = int(np.memmap(path, dtype=np.uint16, mode="r").max())
        if top >= meta["vocab_size"]:
            raise ValueError(f"{path} is corrupt: token id {top} >= vocab_size {meta['vocab_size']} of meta.json")
    return meta, paths


def spread_offsets(n_tokens, n_seq, T):
    """Offsets of up to n_seq sequences of T + 1 tokens spread evenly over a file of n_tokens: the
    validation sequences, the same at every evaluation."""
    return np.linspace(0, n_tokens - T - 1, min(n_seq, (n_tokens - 1) // T)).astype(np.int64)


def sequences(path, offsets, T):
    """The T + 1 tokens at each offset of a .bin file, (len(offsets), T + 1) int64: inputs and
    next-token targets are its two shifted views."""
    data = np.memmap(path, dtype=np.uint16, mode="r")  # a fresh memmap per batch: no memory growth
    return np.stack([data[o:o + T + 1] for o in offsets]).astype(np.int64)


def unigram_level(path, offsets, T):
    """The entropy of the frequencies of the tokens at offsets: the loss of the best model that
    ignores context. A run whose validation loss stays there has stalled."""
    counts = np.bincount(sequences(path, offsets, T)[:, 1:].ravel())
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def command_for(name, data_dir):
    """The prepare_data.py command that makes the dataset called name (one of your own files: its --input)."""
    flags = {DEFAULT_DATASET: "", BYTES_DATASET: f" --tokenizer bytes --name {name}", "codeparrot": " --dataset codeparrot"}.get(name)
    if flags is None:
        vocab = re.fullmatch(rf"{DEFAULT_DATASET}_bpe(\d+)", name)
        flags = f" --vocab {vocab[1]}" if vocab else f" --input YOUR_FILES --name {name}"
    return f"python prepare_data.py{flags} --data_dir {data_dir}"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="prepare_data.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", help="a text file, folder or glob to use instead of the default corpus")
    p.add_argument("--dataset", choices=[DEFAULT_DATASET, "codeparrot"], default=DEFAULT_DATASET,
                   help="built-in corpus when --input is not given (default: %(default)s)")
    p.add_argument("--name", help="dataset name, the folder under --data_dir (default: from the source)")
    p.add_argument("--data_dir", default="data", help="parent folder of datasets (default: %(default)s)")
    p.add_argument("--tokenizer", choices=["auto", "gpt2", "bytes"], default="auto",
                   help="auto: GPT-2 BPE, or bytes when tiktoken cannot load it (default: auto)")
    p.add_argument("--vocab", type=int, metavar="N", help="GPT-2's BPE cut to its first N tokens (the 256 bytes and "
                   "the first N - 256 merges), end-of-text id N: a smaller vocabulary of the same kind")
    p.add_argument("--max_tokens", type=int, default=None,
                   help="stop after about this many tokens (the paper's run sees ~0.7B)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.vocab is not None and args.tokenizer == "bytes":
        fail("--vocab cuts GPT-2's BPE; bytes have no vocabulary to cut")
    tokenizer = load_tokenizer(args.tokenizer if args.vocab is None else f"gpt2_{args.vocab}")
    if args.input:
        files = input_files(args.input)
        documents = file_documents(files)
        source = f"input:{Path(args.input).expanduser().resolve()}"
        name = args.name or input_name(args.input)
    elif args.dataset == "codeparrot":
        documents, source, name = codeparrot_documents(), f"hf:{CODEPARROT}", args.name or "codeparrot"
    else:
        documents = stdlib_documents()
        source = f"python-stdlib:{sys.version.split()[0]}"
        name = args.name or DEFAULT_DATASET + ("" if args.vocab is None else f"_bpe{args.vocab}")
    return prepare(Path(args.data_dir) / name, documents, source, tokenizer, args.max_tokens)


if __name__ == "__main__":
    main()
