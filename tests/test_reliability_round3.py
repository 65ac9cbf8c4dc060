"""Reliability, round three: files named like checkpoints are untrusted in every reader,
a checkpoint whose contents contradict themselves never wins --resume auto, token ids out
of range either way, launch environments without torchrun, torn metrics logs, data still
being written, exports, and errors that name the right culprit."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import (QUIET, REPO, TINY, one_line_error, run_cli, write_checkpoint,
                     write_random_shards)
from gpt.checkpoint import files as checkpoint
from gpt.checkpoint.export import export_hf
from gpt.checkpoint.files import CheckpointError
from gpt.checkpoint.model_load import PretrainedError, load_checkpoint_model, read_checkpoint
from gpt.checkpoint.weights import load_pretrained, read_safetensors, write_safetensors
from gpt.core.cli import parse_args
from gpt.core.config import ConfigError, model_preset
from gpt.core.fileio import FolderLock
from gpt.data.loader import ShardLoader
from gpt.data.shards import ShardError, check_not_being_written, read_shard, write_shard
from gpt.model.transformer import GPT
from gpt.plan.preflight import preflight
from gpt.report.metrics import MetricsLog
from gpt.runtime.launch import WORKER_VARS, RendezvousError, launch_environment
from gpt.runtime.world import Runtime, init_runtime
from gpt.train.build import build_loader

ARGS = [*TINY, *QUIET, "--total-batch-tokens", "512"]


def spoil(path: Path, how, to: Path | None = None) -> None:
    ckpt = torch.load(path, weights_only=True)
    how(ckpt)
    torch.save(ckpt, to or path)


# ---------------------------------------------------------------------------------------
# 1. a file named like a checkpoint is untrusted input, in every reader


FOREIGN = {
    "dict without the keys": {"weights": torch.zeros(2)},
    "list": [1, 2, 3],
    "tensor": torch.zeros(3),
}


@pytest.mark.parametrize("kind", list(FOREIGN))
def test_a_foreign_file_named_like_a_checkpoint_is_skipped_or_refused(kind: str,
                                                                      run_copy: Path) -> None:
    foreign = run_copy / "ckpt_000009.pt"
    torch.save(FOREIGN[kind], foreign)
    path, ckpt, notes = checkpoint.find_latest(run_copy)  # --resume auto and last_good
    assert path == run_copy / "ckpt_000004.pt" and ckpt["step"] == 4
    assert any("ckpt_000009.pt" in note for note in notes)
    with pytest.raises(CheckpointError, match="ckpt_000009.pt: "):  # --resume PATH
        checkpoint.usable(foreign)
    with pytest.raises(PretrainedError, match="ckpt_000009.pt: incomplete checkpoint"):
        read_checkpoint(foreign)  # generate, evaluate and export
    checkpoint.rotate(run_copy, 1, set())  # a running job's rotation
    assert foreign.exists() and not (run_copy / "ckpt_000002.pt").exists()


def test_an_entry_check_contents_does_not_foresee_is_still_one_line(run_copy: Path) -> None:
    """Optimizer state keyed by a number beside the names: sorting the keys raised a
    TypeError out of the check."""
    spoil(run_copy / "ckpt_000004.pt", lambda c: c["optimizer"]["state"].update({0: {}}))
    with pytest.raises(CheckpointError, match="ckpt_000004.pt: not a checkpoint of this trainer"):
        checkpoint.usable(run_copy / "ckpt_000004.pt")
    path, _, notes = checkpoint.find_latest(run_copy)
    assert path == run_copy / "ckpt_000002.pt" and "TypeError" in notes[0]


# ---------------------------------------------------------------------------------------
# 2. contents that contradict themselves never win --resume auto


def test_a_step_beyond_its_data_position_is_refused(run_copy: Path) -> None:
    spoil(run_copy / "ckpt_000002.pt", lambda c: c.update(step=1_000_000),
          to=run_copy / "ckpt_1000000.pt")  # name and step agree; the loader does not
    with pytest.raises(CheckpointError, match=r"ckpt_1000000.pt: holds step 1000000, but its "
                                              r"data position .* allows at most 8"):
        checkpoint.usable(run_copy / "ckpt_1000000.pt")
    path, _, notes = checkpoint.find_latest(run_copy)
    assert path == run_copy / "ckpt_000004.pt" and "contradict themselves" in notes[0]


def test_a_step_beyond_its_names_is_not_chosen_automatically(run_copy: Path) -> None:
    spoil(run_copy / "ckpt_000004.pt", lambda c: c.update(step=3),
          to=run_copy / "ckpt_000002.pt")  # within the loader's bound, beyond its name's step
    shutil.copy(run_copy / "ckpt_000004.pt", run_copy / "ckpt_000001.pt")
    shutil.copy(run_copy / "ckpt_000004.pt", run_copy / "ckpt_000009.pt")  # renamed later:
    path, _, notes = checkpoint.find_latest(run_copy)                    # ranks as step 4
    assert path in (run_copy / "ckpt_000004.pt", run_copy / "ckpt_000009.pt")
    assert sorted(n.split(": ")[1] for n in notes) == [str(run_copy / "ckpt_000001.pt"),
                                                       str(run_copy / "ckpt_000002.pt")]
    assert "holds step 4, beyond the 1 of its name" in " ".join(notes)
    for name in ("ckpt_000004.pt", "ckpt_000009.pt"):
        (run_copy / name).unlink()
    assert checkpoint.find_latest(run_copy)[0] is None  # --resume auto: no usable one
    assert checkpoint.usable(run_copy / "ckpt_000002.pt")["step"] == 3  # --resume PATH takes it


@pytest.mark.slow
def test_resume_auto_and_rotation_step_over_foreign_and_contradicting_files(
        run_copy: Path, data_dir: Path) -> None:
    """Once a KeyError traceback at start (or at a running job's next rotation), and a
    restart that always said "nothing to do"."""
    torch.save({"weights": torch.zeros(2)}, run_copy / "ckpt_000009.pt")
    spoil(run_copy / "ckpt_000002.pt", lambda c: c.update(step=1_000_000),
          to=run_copy / "ckpt_000003.pt")
    proc = run_cli(*ARGS, "--max-steps", "6", "--checkpoint-every", "1", "--keep-checkpoints", "1",
                   "--data-dir", str(data_dir), "--out-dir", str(run_copy), "--resume", "auto")
    assert proc.returncode == 0, proc.stderr
    assert "nothing to do" not in proc.stdout and "ckpt_000004.pt at step 4" in proc.stdout
    assert "ckpt_000009.pt" in proc.stderr and "ckpt_000003.pt: holds step 1000000" in proc.stderr
    names = sorted(p.name for _, p in checkpoint.list_checkpoints(run_copy))
    assert names == ["ckpt_000003.pt", "ckpt_000006.pt", "ckpt_000009.pt"]  # rotated, the rest kept


# ---------------------------------------------------------------------------------------
# 3. token ids out of range either way, in every shard format


def npy_shards(folder: Path, bad_at: int, bad_id: int, dtype: str = "int32") -> Path:
    """build-nanogpt style .npy shards of signed ids with one bad id in the train shard."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    train = rng.integers(0, 30_000, 6_000).astype(dtype)  # fits int16
    train[bad_at] = bad_id
    np.save(folder / "edu_train_000000.npy", train)
    np.save(folder / "edu_val_000000.npy", rng.integers(0, 30_000, 3_000).astype(dtype))
    return folder


@pytest.mark.parametrize("bad_id,words", [(-1, "token id -1 at index 40 is negative"),
                                          (60_000, "token id 60000 at index 40 is >= --vocab-size")])
def test_an_id_out_of_range_is_named_by_every_loader(bad_id: int, words: str,
                                                     tmp_path: Path) -> None:
    data = npy_shards(tmp_path, bad_at=40, bad_id=bad_id)
    loader = ShardLoader(data, "train", 2, 32, max_token=50303)
    with pytest.raises(ShardError, match=f"edu_train_000000.npy: {words}"):
        loader.next_batch()
    with pytest.raises(ShardError, match=f"edu_train_000000.npy: {words}"):  # --check-tokens
        ShardLoader(data, "train", 2, 32, vocab_size=50304)
    if bad_id < 0:  # without a vocabulary to check against, a negative id is still wrong
        with pytest.raises(ShardError, match=words):
            ShardLoader(data, "train", 2, 32).next_batch()


def test_a_negative_id_stops_training_in_one_line(tmp_path: Path) -> None:
    data = npy_shards(tmp_path / "d", bad_at=300, bad_id=-5, dtype="int16")
    proc = run_cli(*ARGS, "--max-steps", "2", "--data-dir", str(data), "--out-dir",
                   str(tmp_path / "run"))
    assert "edu_train_000000.npy: token id -5 at index 300 is negative" in one_line_error(proc)


def test_evaluate_names_an_id_beyond_the_vocabulary(tmp_path: Path, capsys) -> None:
    from gpt.evaluate import main as evaluate

    (tmp_path / "d").mkdir()
    data = write_random_shards(tmp_path / "d", seed=0, train=(1000,), val=(3000,))
    tokens = read_shard(data / "val_000000.bin").copy()
    tokens[40] = 60_000  # beyond the padded 50304
    write_shard(data / "val_000000.bin", tokens)
    ckpt = write_checkpoint(tmp_path / "ckpt.pt", block_size=32)
    code = evaluate(["--checkpoint", str(ckpt), "--data-dir", str(data), "--val-steps", "2",
                     "--batch-size", "2", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert "val_000000.bin: token id 60000 at index 40 is >= --vocab-size 50304" in err


# ---------------------------------------------------------------------------------------
# 4. launch environments


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("env,words", [
    ({"RANK": "0", "WORLD_SIZE": "2"}, "RANK=0, WORLD_SIZE=2 set without MASTER_ADDR, MASTER_PORT"),
    ({"RANK": "0", "WORLD_SIZE": "1"}, "RANK=0, WORLD_SIZE=1 set without MASTER_ADDR, MASTER_PORT"),
    ({"LOCAL_RANK": "0"}, "LOCAL_RANK=0 set without RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"),
    ({"RANK": "one", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
     "RANK='one' in the environment is not a number"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
     "LOCAL_RANK='-1' in the environment is not a number >= 0"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
     "RANK=2 with WORLD_SIZE=2: ranks go from 0 to WORLD_SIZE - 1"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"},
     "MASTER_PORT=70000 is not a TCP port"),
])
def test_a_launch_environment_without_torchrun_says_what_is_missing(env: dict, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        launch_environment(env)
    assert words in str(caught.value)
    assert "torchrun" in str(caught.value) and "unset RANK, WORLD_SIZE and LOCAL_RANK" in str(caught.value)


def test_torchruns_own_environment_and_none_at_all_are_accepted() -> None:
    assert launch_environment({"PATH": "/bin"}) is None
    launch = launch_environment({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                                 "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    assert (launch.rank, launch.local_rank, launch.world_size, launch.master) == (1, 1, 2, "10.0.0.1:29500")


def launch_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (*WORKER_VARS, "MASTER_ADDR", "MASTER_PORT")}
    return {**env, **values}


def test_worker_variables_without_torchrun_stop_the_trainer_in_one_line(tmp_path: Path) -> None:
    proc = run_cli(*ARGS, "--max-steps", "1", "--data-dir", str(tmp_path), "--out-dir",
                   str(tmp_path / "run"), env=launch_env(RANK="0", WORLD_SIZE="1"))
    line = one_line_error(proc, 2)
    assert "set without MASTER_ADDR, MASTER_PORT" in line and "torchrun" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_peer_that_never_comes_is_waited_for_no_longer_than_dist_timeout(
        rank: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    for name, value in {"RANK": rank, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)
    for name in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(name, raising=False)
    # torch counts a group before the rendezvous fails and never uncounts it: the next
    # default group in this process would be named "1", and a later test's FSDP would
    # look up that name after its own group ("0") replaced it. Put the count back after.
    c10d = torch.distributed.distributed_c10d
    monkeypatch.setattr(c10d._world, "group_count", c10d._world.group_count)
    started = time.monotonic()
    with pytest.raises(RendezvousError) as caught:
        init_runtime("cpu", timeout_s=1)
    assert time.monotonic() - started < 30 and not torch.distributed.is_initialized()
    message = str(caught.value)
    assert f"rank {rank} of 2" in message and f"127.0.0.1:{port}" in message
    assert "1 s (--dist-timeout" in message and "torchrun" in message
    assert "frame #" not in capfd.readouterr().err  # no C++ stack traces from torch's retries


# ---------------------------------------------------------------------------------------
# 5. every line of the metrics log parses, after any failure and resume


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]  # each line parses


@pytest.mark.parametrize("tail,words", [
    (b'{"type": "train", "step": 2, "lo', "dropped the torn end of its last record (32 bytes"),
    (b"\0" * 100, "dropped the torn end of its last record (100 bytes"),
    (b'{"type": "train", "step": 2}', "its last record had no line end"),
], ids=["torn record", "zeros", "no line end"])
def test_a_torn_end_of_the_metrics_log_is_repaired_on_open(tail: bytes, words: str,
                                                           tmp_path: Path, capsys) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"type": "run"}\n{"type": "train", "step": 1}\n' + tail)
    with MetricsLog(path) as log:
        log.write({"type": "run", "resumed": True})
    assert f"note: {path}: {words}" in capsys.readouterr().err
    got = records(path)
    assert got[0] == {"type": "run"} and got[-1] == {"type": "run", "resumed": True}
    assert len(got) == (4 if tail.startswith(b"{") and tail.endswith(b"}") else 3)
    with MetricsLog(path):  # a whole file: nothing to say
        pass
    assert capsys.readouterr().err == ""


def test_a_write_that_fails_part_way_leaves_no_torn_record(tmp_path: Path) -> None:
    """A file-size limit, as a full disk: the record cut short is taken back at once."""
    path = tmp_path / "metrics.jsonl"
    script = (f"import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))\n"
              f"from gpt.report.metrics import MetricsLog, MetricsError\n"
              f"log = MetricsLog({str(path)!r})\n"
              f"try:\n"
              f"    for step in range(100):\n"
              f"        log.write({{'type': 'train', 'step': step, 'note': 'x' * 200}})\n"
              f"except MetricsError as e:\n"
              f"    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert "cannot write the metrics log" in proc.stdout, proc.stderr
    assert [r["step"] for r in records(path)] == list(range(len(records(path))))
    assert path.stat().st_size < 3000 and path.read_bytes().endswith(b"\n")


# ---------------------------------------------------------------------------------------
# 6. data that is still being written


def half_written(folder: Path) -> Path:
    """A shard folder as fineweb.py leaves it part-way: shards, and metadata.json saying
    it is not complete."""
    (folder / "d").mkdir()
    data = write_random_shards(folder / "d", seed=4, train=(9_000,), val=(3_000,))
    meta = {"complete": False, "shards": [{"name": "val_000000.bin"}, {"name": "train_000000.bin"}]}
    (data / "metadata.json").write_text(json.dumps(meta))
    return data


def test_training_on_a_folder_fineweb_is_writing_is_refused(tmp_path: Path) -> None:
    data = half_written(tmp_path)
    lock = FolderLock(data, "fineweb.py run").acquire()  # this test process is the writer
    try:
        proc = run_cli(*ARGS, "--max-steps", "1", "--data-dir", str(data), "--out-dir",
                       str(tmp_path / "run"), process=True)  # a trainer beside the writer
        line = one_line_error(proc)
        assert f"--data-dir {data} is still being written, by pid {os.getpid()}" in line
        assert "(metadata.json: 2 shards so far)" in line and "--allow-incomplete-data" in line
        assert not (tmp_path / "run").exists()
        note = check_not_being_written(data, allow=True)
        assert note and "still being written" in note and "training on the shards there now" in note
    finally:
        lock.release()
    note = check_not_being_written(data, allow=False)  # stopped, nobody writes: a warning
    assert "metadata.json says fineweb.py stopped before it finished (2 shards)" in note
    (data / "metadata.json").write_text(json.dumps({"complete": True, "shards": []}))
    assert check_not_being_written(data, allow=False) is None


def test_allow_incomplete_data_trains_with_a_warning(tmp_path: Path) -> None:
    data = half_written(tmp_path)
    cfg = parse_args([*ARGS, "--allow-incomplete-data", "--data-dir", str(data)])
    lock = FolderLock(data, "fineweb.py run").acquire()
    try:
        plan = preflight(cfg).settled()  # the trainer's checks, with the warning it prints
        train_loader = build_loader(cfg.data, Runtime(device=torch.device("cpu")),
                                    seed=cfg.train.seed, vocab_size=cfg.model.vocab_size)
    finally:
        lock.release()
    assert train_loader.num_tokens == 9_000
    assert [w for w in plan.warnings if w.startswith(f"--data-dir {data} is still being written")
            and w.endswith("training on the shards there now (--allow-incomplete-data)")]


# ---------------------------------------------------------------------------------------
# 7. exports


def tiny_model(vocab_size: int = 50304, block_size: int = 32) -> GPT:
    torch.manual_seed(0)
    return GPT(model_preset("tiny", block_size=block_size, vocab_size=vocab_size))


def test_an_export_onto_a_full_disk_is_one_line_and_keeps_the_model_there(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt_000001.pt", tiny_model())
    out = export_hf(ckpt, tmp_path / "hf")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    script = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (100000, 100000))\n"
              "from gpt.pretrained import main\n"
              f"for out in {[str(out), str(tmp_path / 'new')]!r}:\n"
              f"    print('status', main(['export', '--checkpoint', {str(ckpt)!r}, '--out', out]))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=REPO)  # over a model, and into a new folder
    assert proc.stdout.split() == ["status", "1", "status", "1"] and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    for line, folder in zip(lines, (out, tmp_path / "new"), strict=True):
        assert line.startswith(f"error: --out {folder}: could not write model.safetensors")
        assert "GiB free" in line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temporary files either
    assert not (tmp_path / "new").exists()


def test_an_export_that_no_gpt2_tokenizer_fits_is_refused_or_said(tmp_path: Path, capsys) -> None:
    with pytest.raises(PretrainedError, match="--vocab-size 10 would cut GPT-2's token ids 10..50256"):
        export_hf(tiny_model(), tmp_path / "hf", vocab_size=10)
    assert not (tmp_path / "hf").exists()
    out = export_hf(tiny_model(), tmp_path / "hf")  # GPT-2's vocabulary: with its tokenizer
    assert (out / "vocab.json").exists() and capsys.readouterr().err == ""
    export_hf(tiny_model(vocab_size=100), out)  # over it, a model no GPT-2 tokenizer fits
    err = capsys.readouterr().err
    assert f"note: --out {out}: replaced the model that was there (config.json, model.safetensors, " \
           f"vocab.json, merges.txt, tokenizer_config.json)" in err
    assert "vocabulary 100 is not GPT-2's 50257: no tokenizer files were written" in err
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]  # no stale tokenizer
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 100


# ---------------------------------------------------------------------------------------
# 8. errors that name the right culprit


def test_non_finite_weights_given_by_init_from_are_named_when_loaded(tmp_path: Path) -> None:
    out = export_hf(tiny_model(), tmp_path / "hf")
    weights = read_safetensors(out / "model.safetensors")
    weights["transformer.h.1.mlp.c_fc.weight"][3, 5] = float("nan")
    write_safetensors(weights, out / "model.safetensors")
    (tmp_path / "d").mkdir()
    data = write_random_shards(tmp_path / "d", seed=6, train=(5_000,))
    proc = run_cli(*ARGS, "--max-steps", "2", "--init-from", str(out), "--data-dir", str(data),
                   "--out-dir", str(tmp_path / "run"))
    line = one_line_error(proc)
    assert f"{out / 'model.safetensors'}: transformer.h.1.mlp.c_fc.weight holds NaN" in line
    assert "--max-lr" not in proc.stderr + proc.stdout
    assert not (tmp_path / "run").exists()


def test_every_reader_of_a_single_file_names_non_finite_weights(tmp_path: Path) -> None:
    model = tiny_model()
    with torch.no_grad():
        model.transformer.wpe.weight[0, 0] = float("inf")
    ckpt = write_checkpoint(tmp_path / "ckpt_000001.pt", model)
    with pytest.raises(PretrainedError, match="ckpt_000001.pt: transformer.wpe.weight holds NaN, inf"):
        load_checkpoint_model(ckpt)  # generate and evaluate
    with pytest.raises(PretrainedError, match="ckpt_000001.pt: transformer.wpe.weight holds NaN, inf"):
        export_hf(ckpt, tmp_path / "hf")
    with pytest.raises(PretrainedError, match="a file, not a Hugging Face GPT-2 folder; a trainer "
                                              "checkpoint continues with --resume"):
        load_pretrained(ckpt)  # --init-from
