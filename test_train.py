"""train.py: the data it reads, the trainer's logs, checkpoints and resumes, DDP, its
one-line errors, its device defaults; --import and a comparison's arms."""

import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bench
import common
import prepare_data
import sample
import train_config
import train
from conftest import KNOB_BLOCK, REPO, readme_commands, tiny_run
from simple_gpt import BLOCKS


def losses_printed(text):
    return {int(i): float(v) for i, v in re.findall(r"iter (\d+)/\d+ \| loss ([\d.]+)", text)}


def log_records(out_dir):
    return [json.loads(line) for line in (Path(out_dir) / "log.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------- train.py

def test_the_default_corpus_prepared_as_bytes_offline_is_warned_about_on_every_run(corpus, tmp_path, capsys):
    data = tmp_path / "data"
    prepare_data.main(["--input", str(corpus / "corpus.txt"), "--name", "python_stdlib", "--data_dir", str(data),
                       "--tokenizer", "bytes"])
    cfg = types.SimpleNamespace(data_dir=str(data), dataset="python_stdlib", block_size=32)
    capsys.readouterr()
    assert train.load_dataset(cfg, master=True)[0]["tokenizer"] == "bytes"
    assert f"{data / 'python_stdlib'} holds bytes, not GPT-2 tokens" in capsys.readouterr().out
    train.load_dataset(types.SimpleNamespace(data_dir=str(corpus), dataset="tiny", block_size=32), master=True)  # one's own: as asked
    assert "holds bytes" not in capsys.readouterr().out


def test_a_batch_is_each_sequence_and_its_next_tokens(corpus):
    path, offsets, T = corpus / "tiny" / "train.bin", [0, 7, 100], 16
    x, y = train.get_batch(path, offsets, T, "cpu")
    data = torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))
    assert torch.equal(x, torch.stack([data[o:o + T] for o in offsets]))
    assert torch.equal(y, torch.stack([data[o + 1:o + T + 1] for o in offsets]))  # each input's next token


def test_the_validation_loss_is_the_mean_over_every_sequence_a_last_short_batch_too(corpus, tmp_path):
    trainer = train.Trainer(train_config.parse_args(tiny_run(corpus, tmp_path, "--eval_tokens", str(18 * 32))))
    assert len(trainer.val_offsets) == 18 and trainer.cfg.batch_size == 4  # batches of 4, 4, 4, 4, 2
    x, y = train.get_batch(trainer.paths["val"], trainer.val_offsets, 32, "cpu")
    with torch.no_grad():
        logits = trainer.raw_model(x)[0]
    each = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(18, 32).mean(1)
    assert trainer.val_loss(trainer.raw_model) == pytest.approx(each.mean().item(), rel=1e-5)


def test_training_logs_checkpoints_and_samples(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    train.main(tiny_run(corpus, out, "--block", "sas"))
    printed = capsys.readouterr().out
    records = log_records(out)
    assert [r["iter"] for r in records] == [0, 3, 6]
    assert records[-1]["val_loss"] < records[0]["val_loss"]
    steps = losses_printed(printed)
    assert records[0]["train_loss"] is None  # the mean of the steps' losses since the last evaluation:
    assert [r["train_loss"] for r in records[1:]] == pytest.approx([sum(steps[i] for i in (1, 2, 3)) / 3,
                                                                    sum(steps[i] for i in (4, 5, 6)) / 3], abs=1e-4)
    gains = records[-1]["gains"]
    assert len(gains["alpha"]) == len(gains["beta_ff"]) == 2 and len(gains["value_beta_over_alpha"]) == 1
    assert all(k in records[-1] for k in ("elapsed_s", "lr", "tokens"))
    printed_lr = dict(re.findall(r"^iter (\d+)/6 .*\| lr ([\d.e+-]+) \|", printed, re.M))
    assert [f"{r['lr']:.1e}" for r in records[1:]] == [printed_lr["3"], printed_lr["6"]]  # the step just taken, as printed
    assert records[-1]["gains"]["beta_ff"] != records[0]["gains"]["beta_ff"]  # the gains train
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == 6 and not any(k.startswith("_orig_mod") for k in ckpt["model"])
    assert ckpt["model_config"]["block"] == "sas" and isinstance(ckpt["config"], dict)
    assert "sample:" in printed and len(losses_printed(printed)) == 6
    sample.main([str(out), "--tokens", "20"])
    assert capsys.readouterr().out.startswith("def ")
    with pytest.raises(SystemExit, match=f"no checkpoint {tmp_path}/nothing/ckpt.pt; train first"):
        sample.main([str(tmp_path / "nothing")])


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
    sample.main([str(out), "--prompt", "def [MASK](x): [MASK]"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0][:4] + lines[0][5:10] == "def (x): " and len(lines[0]) == 11  # one byte in each blank
    assert [line.split(":")[0] for line in lines[1:]] == ["[MASK] 1", "[MASK] 2"]
    assert lines[1].count("|") == 4  # the top 5 guesses, with probabilities
    with pytest.raises(SystemExit, match=r"--prompt has no \[MASK\]"):
        sample.main([str(out), "--prompt", "def f(x):"])


@pytest.mark.parametrize("objective,optimizer", [("clm", "adamw"), ("mlm", "adamw"), ("clm", "muon")])
def test_interrupted_and_resumed_run_equals_uninterrupted(corpus, tmp_path, objective, optimizer):
    args = ["--max_iters", "200", "--eval_interval", "50", "--objective", objective, "--optimizer", optimizer]
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
    assert 70 <= stopped_at < 200 and "continue with --resume" in first
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
        assert (a["train_loss"] is None) == (b["train_loss"] is None)  # the ranks' mean: the one process's
        assert a["train_loss"] is None or a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)


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
    assert error("--block", "sasp").strip().endswith("(a block of your own: --import FILE)")
    assert "invalid choice: 'batchnorm'" in error("--norm", "batchnorm")
    assert "divisible" in error("--n_embd", "30", "--n_head", "4")
    assert "is not prepared; run: python prepare_data.py --input YOUR_FILES" in error("--dataset", "nothing_here")
    assert "run: python prepare_data.py --tokenizer bytes --name python_stdlib_bytes" in error("--dataset", "python_stdlib_bytes")
    assert "run: python prepare_data.py --vocab 4096 --data_dir" in error("--dataset", "python_stdlib_bpe4096")  # GPT-2's BPE cut
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
    (tmp_path / "out" / "ckpt.pt").write_bytes(b"")  # a disk that filled up
    assert "is empty" in error("--resume")
    for argv in ([str(tmp_path / "out")], [str(tmp_path / "nothing")], ["--device", "mps"]):
        with pytest.raises(SystemExit) as e:
            sample.main(argv)
        assert str(e.value).startswith("sample: error:") and "\n" not in str(e.value), e.value
    assert "divisible" in error("--n_embd", "130", "--n_head", "4")  # the config's error, not the run's folder
    (tmp_path / "out" / "ckpt.pt").unlink()
    assert "divisible" in error("--n_embd", "130", "--n_head", "4", "--out_dir", str(tmp_path / "new"))
    assert not (tmp_path / "new").exists()  # a refused run leaves nothing behind
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
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    ckpt["config"]["device"] = "cuda"  # checkpointed on a GPU: this machine chooses its dtype afresh
    torch.save(ckpt, out / "ckpt.pt")
    monkeypatch.setattr(common, "bf16_speedup", lambda device: 1.0)  # a CPU without native bf16
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
    ckpt["config"]["device"] = "cuda"  # float16 is CUDA's; resumed on this CPU
    torch.save(ckpt, out / "ckpt.pt")
    train.main(tiny_run(corpus, out, "--resume"))
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter"] == 6


def test_a_resumed_run_keeps_its_dtype_on_the_same_kind_of_device_float16_too():
    saved = dict(device="cuda:0", dtype="float16", lr=1e-3)
    assert train_config.resumed({}, saved, "cuda")["dtype"] == "float16"  # asked for, or auto's on a V100
    assert "dtype" not in train_config.resumed({}, saved, "cpu")  # another kind: chosen afresh
    assert "dtype" not in train_config.resumed({"dtype": "bfloat16"}, saved, "cuda")  # as the flag says


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


def test_under_torchrun_each_process_takes_its_local_gpu_and_tells_nccl(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(train.dist, "init_process_group", lambda **kw: calls.append(("init", kw)))
    monkeypatch.setattr(train.dist, "get_rank", lambda: 5)
    monkeypatch.setattr(train.dist, "get_world_size", lambda: 8)
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")  # the second GPU of the second machine
    assert train.setup_device("auto") == ("cuda:1", 5, 8)
    gpu = torch.device("cuda", 1)
    assert calls == [("set_device", gpu), ("init", dict(backend="nccl", device_id=gpu))]
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)  # a Mac: one process, never a silent CPU
    with pytest.raises(SystemExit, match="--device mps takes one process"):
        train.setup_device("mps")


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_the_cuda_defaults_keep_the_papers_global_batch_over_any_process_count(world, a_gpu):
    a_gpu((9, 0))
    command = next(c for c in readme_commands() if c[0] == "torchrun")
    assert command[:3] == ["torchrun", "--nproc_per_node=8", "train.py"]
    for argv in (command[3:], ["--block", "sas_p", "--grad_accum", "8"]):
        cfg, why = train_config.settings(train_config.parse_args(argv), "cuda", world)
        assert cfg.batch_size * cfg.grad_accum == 128 and cfg.grad_accum % world == 0, (argv, cfg)
        assert cfg.dtype == "auto" and cfg.compile and cfg.max_iters == 40_000  # auto: the trainer's, bf16 on an H100
    assert (cfg.batch_size, cfg.grad_accum) == (16, 8)
    cfg, why = train_config.settings(train_config.parse_args([]), "cuda", 3)  # 128 does not split over 3 processes: says so
    assert (cfg.batch_size, cfg.grad_accum) == (21, 6) and "does not split over 3 processes" in why["batch"]
    cfg, why = train_config.settings(train_config.parse_args(["--batch_size", "16"]), "cuda", 1)  # 64: says so
    assert cfg.grad_accum == 4 and "(not the default 128: --batch_size 16 with the default micro-steps)" in why["batch"]
    cfg, why = train_config.settings(train_config.parse_args(["--batch_size", "32"]), "cuda", 8)  # 256: says how
    assert cfg.grad_accum == 8 and "--batch_size 32 with 8 micro-steps, the default 4 rounded up to a multiple of the 8" in why["batch"]
    assert "batch" not in train_config.settings(train_config.parse_args(["--batch_size", "16", "--grad_accum", "4"]), "cuda", 1)[1]
    with pytest.raises(SystemExit, match="--grad_accum 4 must be a multiple of the 8 processes$"):
        train_config.settings(train_config.parse_args(["--grad_accum", "4"]), "cuda", 8)
    with pytest.raises(SystemExit, match="8 processes; it is the checkpoint's: resume on a number of processes that divides it"):
        train_config.settings(train_config.parse_args(["--resume"]), "cuda", 8, saved=dict(device="cuda", dtype="bfloat16", grad_accum=4))


def test_a_gpt_on_cpu_trains_with_the_warmup_and_rates_the_reproduction_found(a_gpu):
    for block, lr in train_config.CPU_GPT_LR.items():
        cfg, why = train_config.settings(train_config.parse_args(["--block", block]), "cpu")
        assert (cfg.lr, cfg.warmup_frac) == (lr, train_config.CPU_GPT_WARMUP) and f"lr {lr:g} for {block}" in why["defaults"]
    assert train_config.CPU_GPT_WARMUP > train_config.PAPER_RUN["warmup_frac"]  # the rates: test_the_main_job_is_a_cell_of_the_study
    for block, (muon_lr, lr) in train_config.CPU_GPT_MUON.items():  # with Muon, its pair (test_the_readmes_muon_paragraph...)
        cfg, why = train_config.settings(train_config.parse_args(["--block", block, "--optimizer", "muon"]), "cpu")
        assert (cfg.muon_lr, cfg.lr) == (muon_lr, lr) and f"muon_lr {muon_lr:g}, lr {lr:g} for {block} with Muon" in why["defaults"]
    cfg, why = train_config.settings(train_config.parse_args(["--optimizer", "muon", "--muon_lr", "1e-2"]), "cpu")  # a rate given:
    assert (cfg.muon_lr, cfg.lr) == (1e-2, train_config.CPU_GPT_LR[cfg.block]) and "muon_lr" not in why["defaults"]  # no pair
    cfg, why = train_config.settings(train_config.parse_args(["--block", "skipless", "--optimizer", "muon"]), "cpu")
    assert cfg.muon_lr == cfg.lr == 1e-3  # a block with no pair tuned: one rate for both
    cfg, why = train_config.settings(train_config.parse_args(["--block", "skipless"]), "cpu")  # not tuned: the paper's rate
    assert (cfg.lr, cfg.warmup_frac) == (1e-3, 0.2) and "(warmup 20%: the reproduction's finding" in why["defaults"]
    cfg, why = train_config.settings(train_config.parse_args(["--lr", "3e-3", "--warmup_frac", "0.1"]), "cpu")  # flags win
    assert (cfg.lr, cfg.warmup_frac) == (3e-3, 0.1) and "finding" not in why["defaults"]
    cfg, why = train_config.settings(train_config.parse_args(["--objective", "mlm"]), "cpu")  # the study measured no encoder
    assert (cfg.lr, cfg.warmup_frac) == (1e-3, 0.05) and "finding" not in why["defaults"]
    a_gpu((9, 0))
    cfg, why = train_config.settings(train_config.parse_args(["--block", "sas_p"]), "cuda")  # the GPU run stays the paper's
    assert (cfg.lr, cfg.warmup_frac) == (1e-3, 0.05) and "finding" not in why["defaults"]


@pytest.mark.parametrize("capability,dtype", [((6, 1), "float32"), ((7, 0), "float16"), ((7, 5), "float16"),
                                              ((8, 0), "bfloat16"), ((8, 9), "bfloat16"), ((9, 0), "bfloat16")])
def test_autocast_dtype_by_compute_capability(capability, dtype, a_gpu):
    a_gpu(capability)
    chosen, why = common.autocast_dtype("cuda")
    assert chosen == dtype and f"{capability[0]}.{capability[1]}" in why
    assert bench.parse_args(["--device", "cuda"]).dtypes == [dtype]


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
        assert common.peak_flops(name, (8, 0), "bfloat16") == peak, name
    assert common.peak_flops("Tesla T4", (7, 5), "float16") == 65e12
    assert common.peak_flops("Tesla T4", (7, 5), "bfloat16") is None  # emulated: no tensor cores
    assert common.peak_flops("NVIDIA H100 PCIe", (9, 0), "float32") is None


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
    assert prepare_data.unigram_level(path, offsets, 32) == pytest.approx(unigram_entropy(targets))
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


# ----------------------------------------------------------------------------- --import and arms

def test_an_import_that_fails_is_one_line_with_its_own_error(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("from simple_gpt import BLOCKS\n\nBLOCKS['x'] = undefined_name\n")
    for parse in (train_config.parse_args, bench.parse_args):
        with pytest.raises(SystemExit, match=r"--import .*bad.py failed at line 3: NameError: name 'undefined_name'"):
            parse(["--import", str(bad)])
    bad.write_text("def f(:\n")
    with pytest.raises(SystemExit, match=r"failed at line 1: SyntaxError"):
        train_config.parse_args(["--import", str(bad)])
    with pytest.raises(SystemExit, match=r"--import nowhere.py: not a file"):
        train_config.parse_args(["--import", "nowhere.py"])


def test_a_setting_added_without_a_comment_gets_a_generic_help_and_trains(corpus, tmp_path, monkeypatch, capsys):
    """A hacker's first new switch: a TrainConfig field with no comment (--help's text) is a flag
    all the same, in --help and in the checkpoint."""
    added = dataclasses.make_dataclass("TrainConfig", [("my_knob", float, 0.5)], bases=(train_config.TrainConfig,))
    monkeypatch.setattr(train_config, "TrainConfig", added)
    with pytest.raises(SystemExit):
        train_config.parse_args(["--help"])
    assert "--my_knob MY_KNOB my knob (a setting without help: give its field a comment) (default: 0.5)" in " ".join(
        capsys.readouterr().out.split())
    train.main(tiny_run(corpus, tmp_path, "--my_knob", "0.7", "--max_iters", "2"))
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["config"]["my_knob"] == 0.7


def test_a_block_of_ones_own_declares_a_setting_a_flag_in_help_and_the_checkpoint(corpus, tmp_path, capsys):
    (tmp_path / "scaled.py").write_text(KNOB_BLOCK)
    imported = ["--import", str(tmp_path / "scaled.py")]
    try:
        with pytest.raises(SystemExit):
            train_config.parse_args([*imported, "--help"])
        assert "--out_scale OUT_SCALE the factor on the block's output (scaled's setting; default: 1.0)" in " ".join(
            capsys.readouterr().out.split())
        out = tmp_path / "run"
        train.main([*imported, *tiny_run(corpus, out, "--block", "scaled", "--out_scale", "0.5", "--max_iters", "2")])
        ckpt = torch.load(out / "ckpt.pt", weights_only=True)
        assert ckpt["config"]["block_settings"] == ckpt["model_config"]["block_settings"] == {"out_scale": 0.5}
        model, _ = common.load_model(out, "cpu", "test")
        assert all(block.out_scale == 0.5 for block in model.transformer.h)
        with pytest.raises(SystemExit, match=re.escape("block_settings={'out_scale': 0.5} (flags say {'out_scale': 0.25})")):
            train.main([*imported, *tiny_run(corpus, out, "--resume", "--out_scale", "0.25")])
        with pytest.raises(SystemExit, match="sas_p has no setting out_scale$"):
            train.main([*imported, *tiny_run(corpus, tmp_path / "other", "--out_scale", "0.5")])
        with pytest.raises(SystemExit, match="a block's own setting is not an arm's switch"):  # a comparison's arm
            bench.parse_arm("scaled:out_scale=0.5", "bench.py")
    finally:
        BLOCKS.pop("scaled", None)


def test_a_run_of_ones_own_block_resumed_without_its_import_says_so(corpus, tmp_path, my_block):
    out = tmp_path / "out"
    train.main(["--import", my_block, *tiny_run(corpus, out, "--block", "mine")])
    BLOCKS.pop("mine")
    with pytest.raises(SystemExit, match=r"unknown block 'mine'; valid: .*--import FILE"):
        train.main(["--dataset", "tiny", "--data_dir", str(corpus), "--out_dir", str(out), "--resume"])


@pytest.mark.parametrize("spec, arm", [
    ("sas", ("sas", {})), ("sas:alpha_ff=0", ("sas", {"alpha_ff": 0.0})),
    ("sas_p:norm=none", ("sas_p", {"norm": "none"})), ("sas_p:none", ("sas_p", {"norm": "none"})),
    ("sas_p:first_value=false:schedule=cosine", ("sas_p", {"first_value": False, "schedule": "cosine"})),
    ("v_skipinit:vp=identity:vp_beta=0.2", ("v_skipinit", {"vp": "identity", "vp_beta": 0.2}))])
def test_an_arm_is_a_block_with_train_flags(spec, arm):
    assert bench.parse_arm(spec, "test") == arm


@pytest.mark.parametrize("block", BLOCKS)
def test_every_block_trains_with_muon(block, corpus, tmp_path, capsys):
    train.main(tiny_run(corpus, tmp_path, "--block", block, "--optimizer", "muon", "--max_iters", "12",
                        "--eval_interval", "12", "--lr", "3e-3", "--muon_lr", "3e-3"))
    first, last = log_records(tmp_path)[0]["val_loss"], log_records(tmp_path)[-1]["val_loss"]
    assert last < first - 0.3, (first, last)
    assert "Muon on the blocks' matrices to lr 0.003, W^Q and W^K apart" in capsys.readouterr().out


def test_muon_takes_two_rates_in_the_banner_and_a_resumed_run_keeps_both(corpus, tmp_path, monkeypatch, capsys):
    """--lr is AdamW's (embeddings, norms, gains), --muon_lr the matrices' (default: --lr); each decays
    on the schedule from its own peak; a resumed run keeps both and refuses another."""
    out, run = tmp_path / "run", ["--optimizer", "muon", "--lr", "4e-3", "--muon_lr", "1e-3"]
    interrupted_at(monkeypatch, 3)
    train.main(tiny_run(corpus, out, *run))
    monkeypatch.undo()
    printed = capsys.readouterr().out
    assert "to lr 0.004, AdamW on the embeddings, norms and gains; Muon on the blocks' matrices to lr 0.001" in printed
    assert "Newton-Schulz in float32" in printed  # a float32 run: bf16 Newton-Schulz would run emulated, 23x slower on AVX2
    bf16 = train.Trainer(train_config.parse_args(tiny_run(corpus, tmp_path / "bf16", *run, "--dtype", "bfloat16")))
    assert bf16.optimizers[0].dtype == torch.bfloat16  # as Muon's users run it, on hardware that does bf16
    with pytest.raises(SystemExit, match=re.escape("muon_lr=0.001 (flags say 0.002)")):
        train.main(tiny_run(corpus, out, "--resume", "--muon_lr", "2e-3"))
    trainer = train.Trainer(train_config.parse_args(tiny_run(corpus, out, "--resume")))
    assert (trainer.cfg.lr, trainer.cfg.muon_lr) == (4e-3, 1e-3)
    trainer.train_step()  # step 3 of 6, after 1 of warmup: each at 3/5 of its peak
    muon, adamw = trainer.optimizers
    assert [g["lr"] for g in muon.param_groups] == [trainer.lr_at(3, 1e-3)] * 2 and trainer.lr_at(3, 1e-3) == 1e-3 * (3 / 5)
    assert [g["lr"] for g in adamw.param_groups] == [trainer.lr_at(3)] * 2 and trainer.lr_at(3) == 4e-3 * (3 / 5)
    assert train_config.settings({"optimizer": "muon", "lr": 3e-3}, "cpu")[0].muon_lr == 3e-3  # one rate, as given
    with pytest.raises(SystemExit, match=r"^train: error: --muon_lr is Muon's rate: give --optimizer muon too$"):
        train.main(tiny_run(corpus, tmp_path / "adamw", "--muon_lr", "1e-3"))
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    del ckpt["config"]["muon_lr"]  # a checkpoint of a Muon that orthogonalised W^Q and W^K as one matrix
    torch.save(ckpt, out / "ckpt.pt")
    with pytest.raises(SystemExit, match="orthogonalised W\\^Q and W\\^K as one matrix; this one takes them apart"):
        train.main(tiny_run(corpus, out, "--resume"))


def test_the_embeddings_rate_in_the_banner_and_the_schedule_and_a_resumed_run_keeps_it(corpus, tmp_path, monkeypatch, capsys):
    """--emb_lr: the peak of the embeddings' group; each group decays on the schedule from its own peak."""
    out, run = tmp_path / "run", ["--lr", "1e-2", "--emb_lr", "4e-2", "--emb_weight_decay", "0.025"]
    interrupted_at(monkeypatch, 3)
    train.main(tiny_run(corpus, out, *run))
    monkeypatch.undo()
    assert "to lr 0.01, the embeddings (wte, tied to the head, and wpe) to lr 0.04 with decay 0.025, AdamW)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=re.escape("emb_lr=0.04 (flags say 0.02)")):
        train.main(tiny_run(corpus, out, "--resume", "--emb_lr", "2e-2"))
    trainer = train.Trainer(train_config.parse_args(tiny_run(corpus, out, "--resume")))
    trainer.train_step()  # step 3 of 6, after 1 of warmup: each group at 3/5 of its peak
    (adamw,) = trainer.optimizers
    assert {g["name"]: (g["lr"], g["weight_decay"]) for g in adamw.param_groups} == {
        "embeddings": (4e-2 * 3 / 5, 0.025), "matrices": (1e-2 * 3 / 5, 0.1), "gains and norms": (1e-2 * 3 / 5, 0.0)}


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_checkpoint_from_before_the_embeddings_had_a_group_resumes_as_if_never_stopped(corpus, tmp_path, monkeypatch,
                                                                                         optimizer):
    train.main(tiny_run(corpus, tmp_path / "reference", "--optimizer", optimizer))
    out = tmp_path / "run"
    interrupted_at(monkeypatch, 3)
    train.main(tiny_run(corpus, out, "--optimizer", optimizer))
    monkeypatch.undo()
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    del ckpt["config"]["emb_lr"], ckpt["config"]["emb_weight_decay"]
    old = lambda groups: [{**{k: v for k, v in g.items() if k not in ("name", "peak")}, "params": g["params"]} for g in groups]
    for state in ckpt["optimizers"]:  # as they were: no names, no peaks; AdamW's embeddings in the matrices' group
        named = {g["name"]: g for g in state["param_groups"]}
        if "embeddings" in named and "matrices" in named:
            embeddings, matrices = named.pop("embeddings"), named.pop("matrices")
            named = {"matrices": dict(matrices, params=embeddings["params"] + matrices["params"]), **named}
        state["param_groups"] = old(named.values())
    torch.save(ckpt, out / "ckpt.pt")
    train.main(tiny_run(corpus, out, "--resume"))
    same = lambda records: [(r["iter"], r["train_loss"], r["val_loss"]) for r in records]
    assert same(log_records(out)) == same(log_records(tmp_path / "reference"))


@pytest.mark.parametrize("clip", [0.5, 0.0])
def test_the_optimizers_see_the_gradient_clipped_to_grad_clip_over_every_parameter(corpus, tmp_path, clip):
    trainer = train.Trainer(train_config.parse_args(tiny_run(corpus, tmp_path, "--optimizer", "muon", "--grad_clip", str(clip))))
    trainer.raw_model.transformer.wte.weight.register_hook(lambda g: g * 1e6)  # far past any clip
    seen = []  # the norm over every parameter when the first optimizer steps (Muon's: then AdamW's)
    trainer.optimizers[0].step = lambda *a, **k: seen.append(torch.linalg.vector_norm(torch.stack(
        [p.grad.norm() for p in trainer.raw_model.parameters()])).item())
    trainer.train_step()
    assert len(seen) == 1 and (seen[0] == pytest.approx(clip, rel=1e-4) if clip else seen[0] > 1e3)  # 0: no clipping


def test_a_float16_overflow_in_one_optimizers_parameters_skips_the_step_for_all(corpus, tmp_path):
    """With the loss scaler, an inf gradient in AdamW's embedding alone must not let Muon step on
    the gradients clipping has zeroed: the whole step is skipped, and the scale comes down."""
    trainer = train.Trainer(train_config.parse_args(tiny_run(corpus, tmp_path, "--optimizer", "muon")))
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)  # float16's scaler, on CPU
    before = {name: p.detach().clone() for name, p in trainer.raw_model.named_parameters()}
    hook = trainer.raw_model.transformer.wte.weight.register_hook(lambda g: g * math.inf)
    trainer.train_step()
    hook.remove()
    assert all(torch.equal(p, before[name]) for name, p in trainer.raw_model.named_parameters())
    assert trainer.scaler.get_scale() < 2.0**10
    trainer.train_step()  # finite again: every parameter group steps
    assert not torch.equal(trainer.raw_model.transformer.h[0].mlp.c_fc.weight, before["transformer.h.0.mlp.c_fc.weight"])


@pytest.mark.parametrize("speedup,dtype", [(5.8, "bfloat16"), (1.86, "bfloat16"), (1.2, "float32"), (0.004, "float32")])
def test_off_cuda_bf16_is_chosen_only_where_a_bf16_matmul_is_measured_clearly_faster(speedup, dtype, monkeypatch,
                                                                                    corpus, tmp_path):
    monkeypatch.setattr(common, "bf16_speedup", lambda device: speedup)
    trainer = train.Trainer(train_config.parse_args(tiny_run(corpus, tmp_path, "--dtype", "auto")))
    assert trainer.cfg.dtype == dtype and f"a bf16 matmul runs {speedup:.2g}x as fast as float32 here" == trainer.why["dtype"]
    assert bench.parse_args([]).dtypes == (["float32", "bfloat16"] if dtype == "bfloat16" else ["float32"])
    assert train_config.settings(train_config.parse_args(["--dtype", "float32"]), "cpu")[0].dtype == "float32"  # as asked
    assert bench.parse_args(["--dtype", "float32,bfloat16"]).dtypes == ["float32", "bfloat16"]


def test_the_bf16_probe_measures_a_real_ratio_float32s_time_over_bf16s(monkeypatch):
    assert 0 < common.bf16_speedup("cpu") < 100
    clock = [0.0]  # a machine where a bf16 matmul takes twice float32's time: 0.5x as fast
    monkeypatch.setattr(common.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda x, y: clock.__setitem__(0, clock[0] + 1 + (x.dtype == torch.bfloat16)))
    assert common.bf16_speedup("cpu") == 0.5
