"""Files a user shares and folders a run holds: every file written atomically gets the mode
open() would give it under the user's umask (not a temporary file's, nor one a library
chose); a dead writer's temporary files are cleared; and the one-run-per-folder lock file
lasts as long as its run: a second trainer or fineweb.py on the folder is refused."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpt.checkpoint.files import save_atomic
from gpt.checkpoint.weights import write_safetensors
from gpt.core.fileio import (LOCK_NAME, FolderInUse, FolderLock, atomic_files, atomic_write,
                             remove_dead_temp_files)
from gpt.data.shards import write_shard
from gpt.entry import train_main

from helpers import QUIET, REPO, TINY, TINY_RUN, kill_tree, one_line_error, read_metrics, run_cli, start_trainer, wait_for

pytestmark = pytest.mark.skipif(os.name != "posix", reason="file modes and flock are POSIX's")


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_every_atomic_writer_gives_the_mode_open_gives(tmp_path: Path, mask: int) -> None:
    expected = 0o666 & ~mask
    with umask(mask):
        plain = tmp_path / "plain"
        plain.write_text("x")  # what open() gives: the reference
        atomic_write(tmp_path / "bytes", lambda fh: fh.write(b"x"))
        save_atomic({"w": torch.zeros(2)}, tmp_path / "ckpt_000001.pt")  # a checkpoint
        write_shard(tmp_path / "train_000000.bin", torch.zeros(8, dtype=torch.int32).numpy())
        # safetensors replaces the file it is given with one of its own, mode 0600
        write_safetensors({"w": torch.zeros(2)}, tmp_path / "model.safetensors")
        (tmp_path / "hf").mkdir()
        with atomic_files(tmp_path / "hf", ["a.json", "b.bin"]) as temps:
            temps["a.json"].write_text("{}")
            temps["b.bin"].unlink()  # a writer that makes its own file
            fd = os.open(temps["b.bin"], os.O_WRONLY | os.O_CREAT, 0o600)
            os.close(fd)
    assert mode(plain) == expected
    written = [tmp_path / n for n in ("bytes", "ckpt_000001.pt", "train_000000.bin",
                                      "model.safetensors")] + [tmp_path / "hf" / "a.json",
                                                               tmp_path / "hf" / "b.bin"]
    assert {p.name: oct(mode(p)) for p in written} == {p.name: oct(expected) for p in written}


@pytest.mark.slow  # a subprocess that imports torch and writes a model: ~10 s on 2 busy cores
def test_the_export_command_writes_files_a_user_can_share(tmp_path: Path) -> None:
    from helpers import REPO, write_checkpoint

    ckpt = write_checkpoint(tmp_path / "ckpt_000001.pt")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = tmp_path / "hf"
    proc = subprocess.run(f"umask 022 && {sys.executable} -m gpt.pretrained export "
                          f"--checkpoint {ckpt} --out {out}", shell=True, cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    files = sorted(p.name for p in out.iterdir())
    assert files == ["config.json", "merges.txt", "model.safetensors", "tokenizer_config.json",
                     "vocab.json"]
    assert {n: oct(mode(out / n)) for n in files} == {n: "0o644" for n in files}
    # the line names every file written, the tokenizer's too
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith(f"wrote {out}:") and all(n in line for n in files), line


# ---------------------------------------------------------------------------------------
# temporary files: a dead writer's go, a live one's stay, a planted link is not followed


@pytest.mark.slow
def test_dead_temp_files_go_and_live_ones_stay(run_copy: Path, data_dir: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True)
    dead_pid = int(done.stdout)
    dead = run_copy / f".ckpt_000009.pt.tmp-{dead_pid}"
    dead_meta = run_copy / f".metadata.json.tmp-{dead_pid}"
    live = run_copy / f".ckpt_000010.pt.tmp-{os.getpid()}"
    for p in (dead, dead_meta, live):
        p.write_bytes(b"x" * 1000)
    proc = run_cli(*TINY_RUN, "--max-steps", "5", "--data-dir", str(data_dir), "--out-dir", str(run_copy),
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


def test_a_planted_symlink_at_the_temp_name_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    target = tmp_path / "out.bin"
    (tmp_path / f".out.bin.tmp-{os.getpid()}").symlink_to(victim)
    atomic_write(target, lambda fh: fh.write(b"new"))
    assert victim.read_text() == "keep me" and target.read_bytes() == b"new"
    assert not target.is_symlink()


# ---------------------------------------------------------------------------------------
# the lock file


def test_the_lock_file_lasts_as_long_as_its_holder(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    lock = FolderLock(folder, "training run").acquire()
    text = (folder / LOCK_NAME).read_text()
    assert f"pid {os.getpid()} " in text
    lock.release()
    assert not (folder / LOCK_NAME).exists() and folder.is_dir()


def test_a_refused_process_leaves_the_holders_lock_file_as_it_was(tmp_path: Path) -> None:
    from helpers import REPO

    folder = tmp_path / "run"
    lock = FolderLock(folder, "training run").acquire()
    try:
        before = (folder / LOCK_NAME).read_bytes(), (folder / LOCK_NAME).stat().st_ino
        code = ("import sys; from pathlib import Path; from gpt.core.fileio import FolderLock\n"
                f"FolderLock(Path({str(folder)!r}), 'training run').acquire()")
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                              text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.returncode != 0 and "FolderInUse" in proc.stderr
        assert f"is in use by pid {os.getpid()}" in proc.stderr
        assert ((folder / LOCK_NAME).read_bytes(), (folder / LOCK_NAME).stat().st_ino) == before
    finally:
        lock.release()


def test_a_lock_file_left_by_a_killed_run_is_taken_over_and_removed(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / LOCK_NAME).write_text("pid 999999 on elsewhere since 2020 (killed)\n")
    lock = FolderLock(folder, "training run").acquire()  # nobody holds it: it means nothing
    assert f"pid {os.getpid()} " in (folder / LOCK_NAME).read_text()
    lock.release()
    assert not (folder / LOCK_NAME).exists()


def test_a_lock_file_a_killed_run_left_means_nothing(data_dir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    """A lock file that no live process holds (a kill -9 leaves one) is no refusal."""
    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock").write_text("pid 99999 on gone since then\n")
    args = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir", str(out)]
    assert train_main([*args, "--dry-run"]) == 0
    assert "dry run: the run would start" in capsys.readouterr().out


def test_a_waiter_on_a_released_lock_file_locks_the_new_one(tmp_path: Path) -> None:
    """The race removing the file opens: B opened the lock file just before its holder A
    removed it and let go. B's flock then succeeds on a file no longer in the folder, so B
    must notice and lock the file at the name, or C could hold that one at the same time."""
    folder = tmp_path / "run"
    a = FolderLock(folder, "run").acquire()
    stale_fd = os.open(folder / LOCK_NAME, os.O_RDWR)  # B's open, before A lets go
    a.release()
    b = FolderLock(folder, "run")
    real_open = os.open
    calls = []

    def open_stale_first(path, flags, *args):
        calls.append(path)
        return os.dup(stale_fd) if len(calls) == 1 else real_open(path, flags, *args)

    try:
        os.open = open_stale_first  # type: ignore[assignment]
        b.acquire()
    finally:
        os.open = real_open  # type: ignore[assignment]
        os.close(stale_fd)
    try:
        assert len(calls) == 2  # the stale file was let go, the one at the name locked
        with pytest.raises(FolderInUse, match=f"in use by pid {os.getpid()}"):
            FolderLock(folder, "run").acquire()  # C: refused
    finally:
        b.release()


def test_a_run_that_fails_at_start_leaves_no_folder(tmp_path: Path) -> None:
    folder = tmp_path / "new"
    FolderLock(folder, "run").acquire().release(remove_folder_if_unused=True)
    assert not folder.exists()
    kept = tmp_path / "kept"
    lock = FolderLock(kept, "run").acquire()
    (kept / "ckpt_000001.pt").write_bytes(b"x")
    lock.release(remove_folder_if_unused=True)
    assert sorted(p.name for p in kept.iterdir()) == ["ckpt_000001.pt"]


@pytest.mark.slow
def test_a_second_trainer_on_the_folder_is_refused_and_kill_9_leaves_no_stale_lock(
        data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [*TINY_RUN, "--max-steps", "100000", "--data-dir", str(data_dir), "--out-dir", str(out)]
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
