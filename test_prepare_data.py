"""prepare_data.py: a split dataset written once and whole, the files of --input, the tokenizer
offline, and its one-line errors."""

import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import prepare_data
import train
import train_config
from conftest import REPO, tiny_run


def log_records(out_dir):
    return [json.loads(line) for line in (Path(out_dir) / "log.jsonl").read_text().splitlines()]


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


def test_input_a_folder_gives_its_text_files_and_a_glob_is_named_after_its_folder(tmp_path, capsys):
    src = tmp_path / "src"
    for name, data in (("a.py", b"x = 1\n"), ("pkg/b.txt", b"text\n"), (".git/objects/ab/cd", b"x\0\x01"),
                       (".venv/lib/c.py", b"y = 2\n"), ("pkg/__pycache__/b.pyc", b"\x00\x0d"), ("data/train.bin", b"\x01\x00"),
                       (".hidden.py", b"z = 3\n")):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    assert prepare_data.input_files(str(src)) == [src / "a.py", src / "pkg" / "b.txt"]
    assert "left out 1 binary files" in capsys.readouterr().out  # data/train.bin
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no text file there"):
        prepare_data.input_files(str(tmp_path / "empty"))
    with pytest.raises(SystemExit, match="no such file, folder or glob match"):
        prepare_data.input_files(str(tmp_path / "nothing*.py"))
    assert [prepare_data.input_name(p) for p in ("src/**/*.py", "src/m*.py", "~/code/", "notes/a.txt")] == ["src", "src", "code", "a"]
    with pytest.raises(SystemExit, match="name the dataset"):  # not a folder called *
        prepare_data.input_name("/*.py")
    (tmp_path / "one.py").write_text("x = 1")  # one line: all of it falls into val
    with pytest.raises(SystemExit, match="too little text for both splits"):
        prepare_data.main(["--input", str(tmp_path / "one.py"), "--data_dir", str(tmp_path / "data"), "--tokenizer", "bytes"])


def test_a_few_files_none_hashed_into_val_prepare_and_train(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    names = [f"m{i}.py" for i in range(40) if prepare_data.split_of(f"m{i}.py") == "train"][:15]  # no val by name
    for i, name in enumerate(names):
        (src / name).write_text(f"def f{i}(x):\n    return x * {i}\n" * 20)
    meta = prepare_data.main(["--input", str(src), "--name", "few", "--data_dir", str(tmp_path), "--tokenizer", "bytes"])
    assert "these 15 files leave the {'val'} split empty; each file's last 5% is validation" in capsys.readouterr().out
    assert 0.03 < meta["val_tokens"] / (meta["train_tokens"] + meta["val_tokens"]) < 0.08  # each file's last 5%
    train.main(["--dataset", "few", "--data_dir", str(tmp_path), "--out_dir", str(tmp_path / "out"), "--device", "cpu",
                "--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "16", "--batch_size", "2",
                "--max_iters", "2", "--eval_interval", "2", "--eval_tokens", "64", "--dtype", "float32"])
    assert log_records(tmp_path / "out")[-1]["iter"] == 2


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
        train.load_dataset(train_config.TrainConfig(data_dir=str(tmp_path)), master=True)
    assert prepared == [["--data_dir", str(tmp_path)]]


def test_a_broken_meta_json_is_one_line_that_says_how_to_prepare_again(corpus, tmp_path):
    broken = tmp_path / "tiny"
    broken.mkdir()
    for f in ("train.bin", "val.bin"):
        (broken / f).write_bytes((corpus / "tiny" / f).read_bytes())
    (broken / "meta.json").write_text('{"vocab_size": 2')  # cut short
    with pytest.raises(SystemExit, match=r"tiny/meta.json is broken .*prepare_data.py --input YOUR_FILES --name tiny"):
        train.main(tiny_run(tmp_path, tmp_path / "out"))


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
