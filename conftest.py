"""What the tests share: the repo's path, a tiny byte-level corpus (corpus) and a train.py run on it
(tiny_run), the README's code blocks and its own block file (readme_block), a block of one's own
(my_block). The tests, by what they test: test_simple_gpt.py (the model), test_train.py (the
trainer), test_prepare_data.py (the data), test_bench.py, test_diagnostics.py; the study's beside
it, in reproduction/: test_reproduction.py (reproduce.py), test_reuse.py (when a committed run
stands in for training it), test_experiments.py (each experiment's rule), test_committed.py (the
README and the committed results agree with the code). Run them all with `python -m pytest -q`."""

import os
import re
import shlex
import subprocess
from pathlib import Path

# The suite is CI's on every machine: CPU. On a GPU every tiny run would pick CUDA and compile
# (minutes); the CUDA paths are tested with a stubbed device here, and for real by a GPU's check.
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import pytest

import bench
import common
import diagnostics
import prepare_data
import sample
import train_config
from simple_gpt import BLOCKS

REPO = Path(__file__).resolve().parent
# blocks of your own in every test parametrised over BLOCKS (README: "Hacking a variant"):
# SIMPLE_GPT_IMPORT=my_blocks.py python -m pytest -q -k mine
common.import_blocks([w for f in os.environ.get("SIMPLE_GPT_IMPORT", "").split(os.pathsep) if f for w in ("--import", f)],
                     "SIMPLE_GPT_IMPORT")


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A byte-level dataset made from this repo's own source: no tokenizer files needed."""
    root = tmp_path_factory.mktemp("data")
    text = "\n".join((REPO / f).read_text() for f in ("simple_gpt.py", "train.py", "prepare_data.py"))
    (root / "corpus.txt").write_text(text * 2)
    prepare_data.main(["--input", str(root / "corpus.txt"), "--name", "tiny",
                       "--data_dir", str(root), "--tokenizer", "bytes"])
    return root


def tiny_run(corpus, out_dir, *extra):
    """A tiny train.py run's flags, extra last. float32 unless extra says otherwise: a test's
    numbers must not depend on whether the machine has native bf16 (--dtype auto)."""
    return ["--dataset", "tiny", "--data_dir", str(corpus), "--out_dir", str(out_dir),
            "--block", "sas_p", "--n_layer", "2", "--n_head", "2", "--n_embd", "32", "--block_size", "32",
            "--batch_size", "4", "--max_iters", "6", "--eval_interval", "3", "--eval_tokens", "512",
            "--log_interval", "1", "--dtype", "float32", *extra]


def readme_code(language=None):
    """The bodies of the README's fenced code blocks (of one language)."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", (REPO / "README.md").read_text(), re.S | re.M)
    return [body for lang, body in blocks if language is None or lang == language]


# the scripts whose command lines the README shows, and their parsers
SCRIPTS = {"train.py": train_config.parse_args, "bench.py": bench.parse_args, "prepare_data.py": prepare_data.parse_args,
           "sample.py": sample.parse_args, "diagnostics.py": diagnostics.parse_args}


def readme_commands(scripts=SCRIPTS):
    """Every command line of the README that runs one of scripts, as words: the lines of its code
    blocks, and its inline code spans (which may wrap over lines)."""
    text = (REPO / "README.md").read_text()
    lines = [line.removeprefix("$ ") for block in readme_code() for line in block.replace("\\\n", " ").splitlines()]
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    lines += [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", prose)]
    commands = [shlex.split(line, comments=True) for line in lines if line.startswith(("python ", "torchrun "))]
    return [words for words in commands if any(w in scripts for w in words)]


@pytest.fixture
def readme_block(tmp_path, monkeypatch):
    """The README's own block file, my_blocks.py, written where the README's commands run and
    imported as --import does; the name of its block."""
    code = next(b for b in readme_code("python") if "BLOCKS[" in b)
    (tmp_path / "my_blocks.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    name = re.search(r'BLOCKS\["(\w+)"\]', code).group(1)
    assert common.import_blocks(["--import", "my_blocks.py"], "test") == {name: str(tmp_path / "my_blocks.py")}
    yield name
    del BLOCKS[name]


MY_BLOCK = """
import torch
from simple_gpt import BLOCKS, PreLN

class Mine(PreLN):
    pass

BLOCKS["mine"] = Mine
"""


KNOB_BLOCK = """
from simple_gpt import BLOCKS, PreLN

class Scaled(PreLN):
    settings = {"out_scale": (1.0, "the factor on the block's output")}  # a setting of its own: --out_scale

    def __init__(self, config, layer):
        super().__init__(config, layer)
        self.out_scale = config.block_settings["out_scale"]

    def forward(self, x, cache=None):
        return self.out_scale * super().forward(x, cache)

BLOCKS["scaled"] = Scaled
"""


@pytest.fixture
def my_block(tmp_path):
    (tmp_path / "mine.py").write_text(MY_BLOCK)
    yield str(tmp_path / "mine.py")
    BLOCKS.pop("mine", None)


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
