"""
What the scripts share: --import (a file of your own blocks, run before the flags are parsed)
and reading a run's checkpoint, each failing in one line that names the script.
"""

import argparse
import importlib.util
import sys
import traceback
import zlib
from pathlib import Path

import torch

from simple_gpt import BLOCKS, GPT, GPTConfig


def import_blocks(argv, prog):
    """Runs argv's --import FILEs before the flags are parsed, so --block can name the blocks they register
    (BLOCKS["mine"] = Mine); returns {block: file}. A file that fails is one line: its error, and where."""
    pre = argparse.ArgumentParser(prog=prog, add_help=False)
    pre.add_argument("--import", dest="imports", action="append", default=[], metavar="FILE")
    added = {}
    for path in pre.parse_known_args(sys.argv[1:] if argv is None else argv)[0].imports:
        file = Path(path).expanduser().resolve()
        if not file.is_file():
            raise SystemExit(f"{prog}: error: --import {path}: not a file")
        name = f"imported_{file.stem}_{zlib.crc32(str(file).encode()):08x}"  # two files of one name stay apart
        spec = importlib.util.spec_from_file_location(name, file)
        module, before = importlib.util.module_from_spec(spec), dict(BLOCKS)
        sys.modules[spec.name] = module  # as an import would: inspect and pickle find it
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            frames = [f.lineno for f in traceback.extract_tb(e.__traceback__) if Path(f.filename) == file]
            line = e.lineno if isinstance(e, SyntaxError) else frames[-1] if frames else None
            raise SystemExit(f"{prog}: error: --import {path} failed" + (f" at line {line}" if line else "")
                             + f": {type(e).__name__}: {e}") from None
        added.update({block: str(file) for block, cls in BLOCKS.items() if before.get(block) is not cls})
    return added


def add_import_flag(p):
    p.add_argument("--import", dest="imports", action="append", metavar="FILE",
                   help="a Python file to run first, e.g. one that registers a block of your own "
                        "(BLOCKS['mine'] = Mine; README: 'Hacking a variant'); repeatable")


def load_checkpoint(path, device, prog):
    """A checkpoint train.py wrote, or one line saying why it cannot be read."""
    path = Path(path)
    if not path.exists():
        raise SystemExit(f"{prog}: error: no checkpoint {path}; train first (python train.py --block ...), "
                         "or name a run's folder")
    if path.stat().st_size == 0:
        raise SystemExit(f"{prog}: error: checkpoint {path} is empty (the disk was full when it was written?)")
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as e:
        first_line = (str(e).splitlines() or [""])[0][:160]
        raise SystemExit(f"{prog}: error: cannot read checkpoint {path} ({type(e).__name__}: {first_line})") from None


def load_weights(model, ckpt, path, prog):
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:  # e.g. saved by an older version whose modules were named otherwise
        raise SystemExit(f"{prog}: error: checkpoint {path} does not fit this version of the model "
                         f"({str(e).splitlines()[0][:120]})") from None


def load_model(run_dir, device, prog):
    """(the trained model of a run's folder, its checkpoint), in eval mode."""
    path = Path(run_dir) / "ckpt.pt"
    ckpt = load_checkpoint(path, device, prog)
    if ckpt["model_config"]["block"] not in BLOCKS:
        raise SystemExit(f"{prog}: error: {path} holds a block of your own, {ckpt['model_config']['block']!r}: "
                         "add --import FILE, the file that registers it")
    try:
        model = GPT(GPTConfig(**ckpt["model_config"])).to(device)
    except (TypeError, ValueError) as e:  # saved by a version whose model had other settings
        raise SystemExit(f"{prog}: error: checkpoint {path} does not fit this version of the model ({e})") from None
    load_weights(model, ckpt, path, prog)
    return model.eval(), ckpt
