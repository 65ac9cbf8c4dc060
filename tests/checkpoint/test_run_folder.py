"""The run folder's own files (gpt/checkpoint/run_folder.py): the dry run's verdict holds
for them, in the run's own words (config.toml, metrics.jsonl or the lock file a folder, a
FIFO or a symlink loop, the folder a dangling symlink or on a full disk, the folder held
by a live run), and the trackers' folders are judged where their flags ask for them."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

from gpt.core import file_checks
from gpt.core.fileio import FolderLock
from gpt.entry import train_main
from gpt.plan import preflight

from helpers import QUIET, TINY, error_line, listing


@contextlib.contextmanager
def unopenable(path: Path) -> Iterator[None]:
    """`path` (a file) made one this process cannot open for writing: mode 000, or for
    root, whom modes do not stop, immutable (chattr +i). Skips where neither can be."""
    if os.geteuid() != 0:
        path.chmod(0)
        try:
            yield
        finally:
            path.chmod(0o644)
        return
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("no file here can be made unwritable to root (chattr +i)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)


def _held_lock(out: Path, stack: contextlib.ExitStack) -> None:
    """The folder locked by this live process, its lock file naming it in text with a
    newline and terminal escapes (a holder's text is anyone's to write: it is printed
    escaped, tests/core/test_errors.py)."""
    lock = FolderLock(out, "training run").acquire()
    stack.callback(lock.release)
    os.ftruncate(lock._fd, 0)
    os.pwrite(lock._fd, b"pid 1 on evil\n\x1b[2J\x1b]0;owned\x07 since now\n", 0)


def _make(kind: str) -> Callable[[Path, contextlib.ExitStack], None]:
    def setup(out: Path, stack: contextlib.ExitStack) -> None:
        if kind == "dangling":
            out.symlink_to(out.parent / "nowhere")
            return
        out.mkdir()
        if kind in ("config.toml", "metrics.jsonl", ".lock"):
            (out / kind).mkdir()
        elif kind == "lock loop":
            (out / ".lock").symlink_to(".lock")
        elif kind == "lock fifo":
            os.mkfifo(out / ".lock")
        elif kind == "lock unopenable":
            (out / ".lock").write_text("")
            stack.enter_context(unopenable(out / ".lock"))
        elif kind == "lock held":
            _held_lock(out, stack)
    return setup


def _full_disk(out: Path, stack: contextlib.ExitStack) -> None:
    out.mkdir()
    patch = stack.enter_context(pytest.MonkeyPatch.context())
    patch.setattr(file_checks, "free_bytes", lambda folder: 4096)  # as statvfs would say


# case -> (what to do to --out-dir, words of the refusal: OUT stands for --out-dir)
RUN_FOLDER_CASES: dict[str, tuple[Callable[[Path, contextlib.ExitStack], None], str]] = {
    "config.toml a folder": (_make("config.toml"), "OUT/config.toml: cannot write the run's "
                             "resolved config there: it is a folder, not a file; remove"),
    "metrics.jsonl a folder": (_make("metrics.jsonl"), "OUT/metrics.jsonl: cannot open the "
                               "metrics log for appending: it is a folder, not a file; remove"),
    ".lock a folder": (_make(".lock"), "OUT/.lock: cannot lock OUT there (one training run at "
                       "a time): it is a folder, not a file; remove it"),
    ".lock a symlink loop": (_make("lock loop"), "OUT/.lock: cannot lock OUT there (one "
                             "training run at a time): it is a symlink (to .lock)"),
    ".lock a FIFO": (_make("lock fifo"), "OUT/.lock: cannot lock OUT there (one training run "
                     "at a time): it is a FIFO (named pipe), not a file; remove it"),
    ".lock unopenable": (_make("lock unopenable"), "OUT/.lock: cannot lock OUT there (one "
                         "training run at a time): it cannot be opened for reading and writing"),
    "OUT a dangling symlink": (_make("dangling"), "--out-dir OUT: cannot write there: it is a "
                               "symlink to "),
    ".lock held by a live process": (_make("lock held"), "OUT is in use by pid 1 on evil\\n"
                                     "\\x1b[2J\\x1b]0;owned\\x07 since now: one training run "
                                     "per folder"),
    "OUT on a full disk": (_full_disk, "--out-dir OUT: its disk is full (4.1 kB free): the "
                           "run's first files"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(RUN_FOLDER_CASES))
def test_the_dry_run_refuses_what_the_run_folder_would_refuse_in_the_runs_words(
        case: str, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The dry run says the run would not start, naming the entry and what to do; the run
    refuses in the same line, and so does its own taking of the folder (the preflight's
    check left out: the same function, so the two cannot drift); nothing is written."""
    setup, words = RUN_FOLDER_CASES[case]
    out = tmp_path / "run"
    words = words.replace("OUT", str(out))
    args = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir", str(out)]
    with contextlib.ExitStack() as stack:
        setup(out, stack)
        before = listing(out)
        dry = train_main([*args, "--dry-run"])
        text = capsys.readouterr()
        assert dry != 0 and "the run would start" not in text.out, text
        assert words in error_line(text.err), text.err
        real = train_main(args)
        assert real == dry and error_line(capsys.readouterr().err) == error_line(text.err)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(preflight, "check_out_dir", lambda cfg: None)
            taken = train_main(args)
        assert taken == dry and error_line(capsys.readouterr().err) == error_line(text.err)
        assert listing(out) == before


def test_the_trackers_folders_are_judged_where_the_flags_ask_for_them(tmp_path: Path) -> None:
    from gpt.checkpoint.run_folder import check_run_folder
    from gpt.core.config import ConfigError

    out = tmp_path / "run"
    out.mkdir()
    (out / "tensorboard").write_text("not a folder")
    (out / "wandb_run_id").mkdir()
    check_run_folder(out)  # neither flag: neither name is the run's
    with pytest.raises(ConfigError, match="tensorboard: cannot write the run's TensorBoard "
                                          "event files .* it is a file, not a folder"):
        check_run_folder(out, tensorboard=True)
    with pytest.raises(ConfigError, match="wandb_run_id: cannot write the run's W&B run's id "
                                          ".* it is a folder, not a file"):
        check_run_folder(out, wandb=True)
