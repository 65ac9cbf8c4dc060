"""Reliability, round two: no poisoned checkpoints, one run per folder, verified files,
dead temporary files cleared, the newest checkpoint by its stored step, every failure a
single line, and the scheduler signals that ask for a checkpoint."""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from helpers import (QUIET, REPO, TINY, kill_tree, one_line_error, read_metrics, run_cli,
                     start_trainer, wait_for, write_random_shards)
from gpt.checkpoint import files as checkpoint
from gpt.checkpoint.files import CheckpointError, load
from gpt.core.cli import parse_args
from gpt.core.fileio import LOCK_NAME, FolderLock, atomic_write, remove_dead_temp_files
from gpt.data.loader import ShardLoader
from gpt.data.shards import DataError, ShardError, find_shards
from gpt.engine.step import TrainingDiverged
from gpt.train.trainer import train

ARGS = [*TINY, *QUIET, "--total-batch-tokens", "512"]


def all_finite(path: Path) -> bool:
    ckpt = load(path)
    tensors = list(ckpt["model"].values()) + [v for s in ckpt["optimizer"]["state"].values()
                                              for v in s.values() if torch.is_tensor(v)]
    return all(bool(torch.isfinite(t).all()) for t in tensors)


# ---------------------------------------------------------------------------------------
# 1. no poisoned checkpoints


@pytest.mark.parametrize("flags,words", [
    (["--max-lr", "inf"], "--max-lr must be <= 1.0, got inf"),
    (["--max-lr", "1e39"], "--max-lr must be <= 1.0"),
    (["--max-lr", "1e6"], "--max-lr must be <= 1.0"),
    (["--grad-clip", "inf"], "--grad-clip must be a finite number"),
    (["--eps", "inf"], "--eps must be a finite number"),
    (["--weight-decay", "2000"], "must be < 1"),
    (["--seed", "-1"], "--seed must be in [0, 2**32), got -1"),
    (["--seed", "99999999999"], "--seed must be in [0, 2**32)"),
    (["--dist-timeout", "1e300"], "--dist-timeout must be > 0 and at most 604800 seconds"),
    (["--num-samples", "10000000"], "--num-samples must be <= 64"),
    (["--sample-tokens", "1000000"], "--sample-tokens must be <= 4096"),
])
def test_values_that_cannot_be_meant_are_refused(flags: list[str], words: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(flags)
    assert exc.value.code == 2 and words in capsys.readouterr().err


def test_refusal_is_one_line_naming_the_flag() -> None:
    proc = run_cli("--max-lr", "inf")
    assert "--max-lr must be <= 1.0, got inf" in one_line_error(proc, 2)


def poison_after(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """From optimizer step `step` on, the update turns one weight into NaN, as an update
    from a finite gradient at an absurd learning rate would."""
    import gpt.train.loop as train_mod

    real = train_mod.optimizer_step
    count = {"n": 0}

    def overflowing(optimizer, scaler, lr, norm, nvtx=False, settings=None):
        found_inf = real(optimizer, scaler, lr, norm, nvtx, settings)
        count["n"] += 1
        if count["n"] > step:
            with torch.no_grad():
                optimizer.param_groups[0]["params"][0].view(-1)[0] = float("nan")
        return found_inf

    monkeypatch.setattr(train_mod, "optimizer_step", overflowing)


def test_poisoned_weights_stop_the_run_at_the_next_check(monkeypatch, data_dir: Path,
                                                         tmp_path: Path) -> None:
    out = tmp_path / "run"
    poison_after(monkeypatch, 3)
    cfg = parse_args([*ARGS, "--max-steps", "8", "--checkpoint-every", "2",
                      "--finite-check-every", "1", "--data-dir", str(data_dir), "--out-dir", str(out)])
    with pytest.raises(TrainingDiverged, match=r"after step 3.*last good checkpoint is .*ckpt_000002\.pt"):
        train(cfg)
    saved = [s for s, _ in checkpoint.list_checkpoints(out)]
    assert saved == [2]  # nothing written from the poisoned state
    assert all_finite(out / "ckpt_000002.pt")


def test_the_finiteness_check_runs_between_log_steps_too(monkeypatch, data_dir: Path,
                                                         tmp_path: Path) -> None:
    out = tmp_path / "run"
    poison_after(monkeypatch, 3)
    cfg = parse_args([*ARGS, "--max-steps", "8", "--checkpoint-every", "2", "--log-every", "100",
                      "--finite-check-every", "1", "--data-dir", str(data_dir), "--out-dir", str(out)])
    with pytest.raises(TrainingDiverged, match=r"after step 3.*ckpt_000002\.pt"):
        train(cfg)
    assert [s for s, _ in checkpoint.list_checkpoints(out)] == [2]


def test_a_checkpoint_is_never_written_from_poisoned_state(monkeypatch, data_dir: Path,
                                                            tmp_path: Path) -> None:
    """Log steps far apart: the save itself must refuse, and name a good checkpoint. The
    update just before the save is the poisoned one, so no loss has seen it yet."""
    out = tmp_path / "run"
    poison_after(monkeypatch, 3)
    cfg = parse_args([*ARGS, "--max-steps", "8", "--checkpoint-every", "2", "--log-every", "100",
                      "--data-dir", str(data_dir), "--out-dir", str(out)])
    with pytest.raises(TrainingDiverged, match=r"at step 4: no checkpoint of them is written.*"
                                               r"ckpt_000002\.pt"):
        train(cfg)
    assert [s for s, _ in checkpoint.list_checkpoints(out)] == [2]
    assert all_finite(out / "ckpt_000002.pt")


def test_resume_auto_skips_a_checkpoint_with_non_finite_state(data_dir: Path, run_copy: Path) -> None:
    ckpt = torch.load(run_copy / "ckpt_000004.pt", weights_only=True)
    ckpt["model"]["lm_head.weight"][0, 0] = float("inf")  # written by an older version, say
    torch.save(ckpt, run_copy / "ckpt_000004.pt")
    proc = run_cli(*ARGS, "--max-steps", "5", "--data-dir", str(data_dir), "--out-dir", str(run_copy),
                   "--resume", "auto")
    assert proc.returncode == 0, proc.stderr
    assert "ckpt_000004.pt: holds non-finite" in proc.stderr
    assert "at step 2" in proc.stdout


# ---------------------------------------------------------------------------------------
# 2. one run per folder


@pytest.mark.slow
def test_a_second_trainer_on_the_folder_is_refused_and_kill_9_leaves_no_stale_lock(
        data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [*ARGS, "--max-steps", "100000", "--data-dir", str(data_dir), "--out-dir", str(out)]
    first = start_trainer(*args)
    try:
        wait_for(lambda: (out / "metrics.jsonl").exists() and len(read_metrics(out, "train")) >= 1,
                 timeout=120, proc=first)
        second = run_cli(*args, "--resume", "auto")
        line = one_line_error(second)
        assert f"{out} is in use by pid {first.pid}" in line and "one training run per folder" in line
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        kill_tree(first)
    third = run_cli(*args[:-6], "--max-steps", "2", "--data-dir", str(data_dir), "--out-dir",
                    str(out), "--resume", "auto")
    assert third.returncode == 0, third.stderr  # the OS released the dead run's lock


def test_fineweb_refuses_a_folder_another_process_holds(tmp_path: Path) -> None:
    out = tmp_path / "shards"
    src = tmp_path / "in.txt"
    src.write_text("hello world " * 200)
    lock = FolderLock(out, "test").acquire()  # this test process is the other holder
    try:
        proc = subprocess.run([sys.executable, str(REPO / "fineweb.py"), "--source", str(src),
                               "--out", str(out), "--val-tokens", "10"], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing written
    finally:
        lock.release()
    line = one_line_error(proc)
    assert f"{out} is in use by pid {os.getpid()}" in line and "one fineweb.py run per folder" in line


# ---------------------------------------------------------------------------------------
# 3. verified checkpoints


def flip_tensor_bytes(path: Path) -> None:
    """Flip bytes inside the largest tensor record of a checkpoint (not its zip headers)."""
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    with open(path, "r+b") as fh:
        fh.seek(info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + 64)
        data = fh.read(8)
        fh.seek(-8, os.SEEK_CUR)
        fh.write(bytes(b ^ 0xFF for b in data))


@pytest.mark.slow
def test_flipped_bytes_are_caught_on_load(run_copy: Path, data_dir: Path) -> None:
    flip_tensor_bytes(run_copy / "ckpt_000004.pt")
    with pytest.raises(CheckpointError, match="ckpt_000004.pt: damaged: record .* fails its CRC check"):
        load(run_copy / "ckpt_000004.pt")
    proc = run_cli(*ARGS, "--max-steps", "6", "--data-dir", str(data_dir), "--out-dir", str(run_copy),
                   "--resume", str(run_copy / "ckpt_000004.pt"))
    assert "fails its CRC check" in one_line_error(proc)
    proc = run_cli(*ARGS, "--max-steps", "5", "--data-dir", str(data_dir), "--out-dir", str(run_copy),
                   "--resume", "auto")
    assert proc.returncode == 0, proc.stderr
    assert "skipping damaged checkpoint" in proc.stderr and "CRC" in proc.stderr
    assert "resumed from" in proc.stdout and "ckpt_000002.pt at step 2" in proc.stdout


@pytest.mark.slow
def test_rotation_keeps_the_checkpoint_just_verified(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli(*ARGS, "--max-steps", "4", "--checkpoint-every", "1", "--keep-checkpoints", "1",
                   "--data-dir", str(data_dir), "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    assert [s for s, _ in checkpoint.list_checkpoints(out)] == [4]
    checkpoint.verify(out / "ckpt_000004.pt")


# ---------------------------------------------------------------------------------------
# 4. leftovers and ordering


def test_dead_temp_files_go_and_live_ones_stay(run_copy: Path, data_dir: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True)
    dead_pid = int(done.stdout)
    dead = run_copy / f".ckpt_000009.pt.tmp-{dead_pid}"
    dead_meta = run_copy / f".metadata.json.tmp-{dead_pid}"
    live = run_copy / f".ckpt_000010.pt.tmp-{os.getpid()}"
    for p in (dead, dead_meta, live):
        p.write_bytes(b"x" * 1000)
    proc = run_cli(*ARGS, "--max-steps", "5", "--data-dir", str(data_dir), "--out-dir", str(run_copy),
                   "--resume", "auto", process=True)  # this process is the live writer
    assert proc.returncode == 0, proc.stderr
    assert not dead.exists() and not dead_meta.exists() and live.exists()
    assert f"removed {dead.name}" in proc.stderr


def test_a_temp_file_tagged_with_our_own_pid_counts_as_dead(tmp_path: Path) -> None:
    """At start-up this process has written nothing yet: a file with its pid was left by a
    dead process that had the same pid (a restarted container often gets the same one)."""
    ours = tmp_path / f".ckpt_000007.pt.tmp-{os.getpid()}"
    ours.write_bytes(b"x")
    assert remove_dead_temp_files(tmp_path) == [ours] and not ours.exists()


def test_newest_is_chosen_by_the_step_stored_inside(run_copy: Path) -> None:
    shutil.copy(run_copy / "ckpt_000002.pt", run_copy / "ckpt_000099.pt")  # a newer name, step 2
    (run_copy / "ckpt_000098.pt").mkdir()  # named like a checkpoint, not a file
    (run_copy / "ckpt_000097.pt").symlink_to(run_copy / "ckpt_000002.pt")
    path, ckpt, _ = checkpoint.find_latest(run_copy)
    assert path == run_copy / "ckpt_000004.pt" and ckpt["step"] == 4
    names = [p.name for _, p in checkpoint.list_checkpoints(run_copy)]
    assert "ckpt_000098.pt" not in names and "ckpt_000097.pt" not in names
    checkpoint.rotate(run_copy, 1, set())
    assert (run_copy / "ckpt_000098.pt").is_dir() and (run_copy / "ckpt_000097.pt").is_symlink()


def test_a_planted_symlink_at_the_temp_name_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    target = tmp_path / "out.bin"
    (tmp_path / f".out.bin.tmp-{os.getpid()}").symlink_to(victim)
    atomic_write(target, lambda fh: fh.write(b"new"))
    assert victim.read_text() == "keep me" and target.read_bytes() == b"new"
    assert not target.is_symlink()


# ---------------------------------------------------------------------------------------
# 5. fineweb.py: every kill point resumes


def test_fineweb_killed_between_first_shard_and_metadata_resumes(tmp_path: Path, monkeypatch) -> None:
    from gpt.data.prepare import PrepareConfig, prepare
    from gpt.data.prepare import writer as prep_writer

    src = tmp_path / "in.txt"
    src.write_text(" ".join(f"word{i}" for i in range(3000)))
    cfg = dict(sources=(str(src),), val_tokens=100, shard_tokens=1000, progress=False, workers=1)
    reference = prepare(PrepareConfig(out_dir=str(tmp_path / "ref"), **cfg))

    real = prep_writer.write_shard

    def killed_after_writing(path, tokens):
        real(path, tokens)
        raise KeyboardInterrupt  # as a kill right after the first shard, before its metadata

    monkeypatch.setattr(prep_writer, "write_shard", killed_after_writing)
    with pytest.raises(KeyboardInterrupt):
        prepare(PrepareConfig(out_dir=str(tmp_path / "out"), **cfg))
    monkeypatch.setattr(prep_writer, "write_shard", real)
    again = prepare(PrepareConfig(out_dir=str(tmp_path / "out"), **cfg))  # the same command
    assert again.shards == reference.shards
    for entry in reference.shards:
        assert (tmp_path / "out" / entry["name"]).read_bytes() == (tmp_path / "ref" / entry["name"]).read_bytes()


# ---------------------------------------------------------------------------------------
# 6. every error a single line


@pytest.mark.slow
def test_checkpoint_with_wrong_shapes(run_copy: Path, data_dir: Path) -> None:
    ckpt = torch.load(run_copy / "ckpt_000004.pt", weights_only=True)
    ckpt["model"]["transformer.wpe.weight"] = torch.zeros(3, 3)
    torch.save(ckpt, run_copy / "ckpt_000004.pt")
    proc = run_cli(*ARGS, "--max-steps", "6", "--data-dir", str(data_dir), "--out-dir", str(run_copy),
                   "--resume", str(run_copy / "ckpt_000004.pt"))
    assert "do not fit the model" in one_line_error(proc)
    proc = run_cli(*ARGS, "--max-steps", "5", "--data-dir", str(data_dir), "--out-dir", str(run_copy),
                   "--resume", "auto")
    assert proc.returncode == 0 and "at step 2" in proc.stdout, proc.stderr  # the older good one


def test_checkpoint_with_wrong_types(run_copy: Path, data_dir: Path) -> None:
    ckpt = torch.load(run_copy / "ckpt_000004.pt", weights_only=True)
    ckpt["step"], ckpt["loader"] = "four", {"not": "a list"}
    torch.save(ckpt, run_copy / "ckpt_000004.pt")
    proc = run_cli(*ARGS, "--max-steps", "6", "--data-dir", str(data_dir), "--out-dir", str(run_copy),
                   "--resume", str(run_copy / "ckpt_000004.pt"))
    assert "ckpt_000004.pt" in one_line_error(proc)


def test_unreadable_data_folder(tmp_path: Path, monkeypatch) -> None:
    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "iterdir", denied)
    with pytest.raises(DataError, match="cannot list the data folder \\(Permission denied\\)"):
        find_shards(tmp_path, "train")


def test_dangling_symlink_named_like_a_shard(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    data = write_random_shards(tmp_path / "d", seed=1, train=(5_000,))
    (data / "train_000001.bin").symlink_to(tmp_path / "gone.bin")
    proc = run_cli(*ARGS, "--max-steps", "1", "--data-dir", str(data), "--out-dir", str(tmp_path / "r"))
    assert "train_000001.bin: a symlink to" in one_line_error(proc)
    assert not (tmp_path / "r").exists()  # a run that fails at start leaves no folder


def test_a_folder_named_like_a_shard_is_an_error(tmp_path: Path) -> None:
    data = write_random_shards(tmp_path, seed=1, train=(5_000,))
    (data / "train_000001.bin").mkdir()
    with pytest.raises(ShardError, match="train_000001.bin: named like a shard but not a file"):
        find_shards(data, "train")
    (data / "train_notes").mkdir()  # any other folder is not the data's business
    (data / "train_000001.bin").rmdir()
    assert [p.name for p in find_shards(data, "train")] == ["train_000000.bin"]


def test_truncated_gz_input(tmp_path: Path) -> None:
    src = tmp_path / "in.txt.gz"
    data = gzip.compress(("some text here " * 20000).encode())
    src.write_bytes(data[: len(data) // 2])
    proc = subprocess.run([sys.executable, str(REPO / "fineweb.py"), "--source", str(src),
                           "--out", str(tmp_path / "o"), "--val-tokens", "10", "--quiet"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert "in.txt.gz: corrupt or truncated compressed file" in one_line_error(proc)


def test_output_folder_that_cannot_be_created(tmp_path: Path, data_dir: Path) -> None:
    blocker = tmp_path / "a_file.txt"
    blocker.write_text("some text")
    proc = subprocess.run([sys.executable, str(REPO / "fineweb.py"), "--source", str(blocker),
                           "--out", str(blocker / "sub"), "--val-tokens", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert "cannot create or write there" in one_line_error(proc)
    proc = run_cli(*ARGS, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir", str(blocker / "sub"))
    assert "cannot write there" in one_line_error(proc, 2)


def test_metadata_write_failure(tmp_path: Path, monkeypatch) -> None:
    from gpt.data.prepare import PrepareConfig, PrepareError, prepare
    from gpt.data.prepare import writer as prep_writer

    def full(path, obj):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prep_writer, "_write_json_atomic", full)
    src = tmp_path / "in.txt"
    src.write_text("hello world " * 300)
    with pytest.raises(PrepareError, match="metadata.json: cannot write it \\(No space left on device\\)"):
        prepare(PrepareConfig((str(src),), str(tmp_path / "o"), val_tokens=10, progress=False))


@pytest.mark.slow
def test_file_size_limit_on_the_metrics_log(data_dir: Path, tmp_path: Path) -> None:
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))

    proc = run_cli(*ARGS, "--max-steps", "200", "--checkpoint-every", "0", "--data-dir", str(data_dir),
                   "--out-dir", str(tmp_path / "r"), preexec_fn=limit)
    assert "metrics.jsonl: cannot write the metrics log" in one_line_error(proc)
    assert read_metrics(tmp_path / "r")  # every line parses: the cut record was taken back


def test_non_utf8_toml(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_bytes(b"[train]\nout_dir = \"caf\xe9\"\n")
    proc = run_cli("--config", str(cfg))
    assert "run.toml: not valid TOML" in one_line_error(proc, 2)


def test_metrics_log_that_cannot_be_opened(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r"
    (out / "metrics.jsonl").mkdir(parents=True)
    proc = run_cli(*ARGS, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir", str(out))
    assert "metrics.jsonl: cannot open the metrics log" in one_line_error(proc)


def test_out_of_memory_names_the_flag(monkeypatch, data_dir: Path, tmp_path: Path, capsys) -> None:
    from gpt.entry import train_main
    import gpt.train.loop as train_mod

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(train_mod, "forward_backward", oom)
    code = train_main([*ARGS, "--max-steps", "2", "--data-dir", str(data_dir),
                           "--out-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 1 and "out of memory" in err and "lower --batch-size" in err
    assert "python -m gpt.bench memory" in err  # the planner says what fits
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_shard_truncated_under_the_loader_is_a_named_error(tmp_path: Path) -> None:
    data = write_random_shards(tmp_path, seed=2, train=(4_000,))
    loader = ShardLoader(data, "train", 2, 32)
    loader.next_batch()
    with open(data / "train_000000.bin", "r+b") as fh:
        fh.truncate(2048)
    with pytest.raises(ShardError, match="train_000000.bin: holds fewer tokens than its header said"):
        for _ in range(loader.steps_per_pass):
            loader.next_batch()


@pytest.mark.slow
def test_a_shard_truncated_during_training_stops_with_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    data = write_random_shards(tmp_path / "d", seed=3, train=(200_000,))
    out = tmp_path / "run"
    proc = start_trainer(*ARGS, "--max-steps", "100000", "--data-dir", str(data), "--out-dir", str(out))
    try:
        wait_for(lambda: (out / "metrics.jsonl").exists() and len(read_metrics(out, "train")) >= 2,
                 timeout=120, proc=proc)
        with open(data / "train_000000.bin", "r+b") as fh:
            fh.truncate(4096)
        _, stderr = proc.communicate(timeout=120)
    finally:
        kill_tree(proc)
    assert proc.returncode == 1 and proc.returncode != -signal.SIGBUS, stderr
    assert "Traceback" not in stderr and "holds fewer tokens than its header said" in stderr
    saved = checkpoint.list_checkpoints(out)
    assert len(saved) == 1 and f"saved {saved[0][1]}" in stderr
    assert load(saved[0][1])["step"] == saved[0][0]


# ---------------------------------------------------------------------------------------
# 7. the signals schedulers send before a kill


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGUSR1])
def test_sighup_and_sigusr1_save_a_checkpoint(sig: int, data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = start_trainer(*ARGS, "--max-steps", "100000", "--data-dir", str(data_dir), "--out-dir", str(out))
    try:
        wait_for(lambda: (out / "metrics.jsonl").exists() and len(read_metrics(out, "train")) >= 2,
                 timeout=120, proc=proc)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        kill_tree(proc)
    assert proc.returncode == 128 + sig, stderr
    assert f"{signal.Signals(sig).name} received: saved checkpoint" in stdout
    assert len(checkpoint.list_checkpoints(out)) == 1
