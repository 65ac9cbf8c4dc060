"""Reliability, round seven: the dry run's verdict holds for the run folder's own files
(1); a model's size is judged by what building it costs, not its parameters alone (2);
--hellaswag-file is judged by its first examples before the run (3); an entry of a task
folder that cannot be read is one line (4); text read from a file is printed as one
line, control characters escaped (6); `python -m gpt.plot -o` is one line (7)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest
import torch

from gpt.checkpoint.export import export_hf
from gpt.checkpoint.files import save_atomic
from gpt.checkpoint.model_load import PretrainedError, load_checkpoint_model
from gpt.checkpoint.weights import load_pretrained
from gpt.core import file_checks
from gpt.core.config import ModelConfig
from gpt.core.errors import UserError
from gpt.core.fileio import FolderLock
from gpt.core.text import one_line
from gpt.entry import train_main
from gpt.model import sizing
from gpt.plan import preflight

from helpers import QUIET, TINY, error_line, lm_eval_command, read_only_folder


def listing(folder: Path) -> list[str]:
    """What a folder holds (to show a refusal wrote nothing); [] for none."""
    if not os.path.lexists(folder) or not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir())


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


# ---- 1: the dry run's verdict holds for the run folder's own files


def _held_lock(out: Path, stack: contextlib.ExitStack) -> None:
    """The folder locked by this live process, its lock file naming it in text with a
    newline and terminal escapes (a holder's text is anyone's to write: see 6)."""
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


def test_a_lock_file_a_killed_run_left_means_nothing(data_dir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    """A lock file that no live process holds (a kill -9 leaves one) is no refusal."""
    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock").write_text("pid 99999 on gone since then\n")
    args = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir", str(out)]
    assert train_main([*args, "--dry-run"]) == 0
    assert "dry run: the run would start" in capsys.readouterr().out


# ---- 2: the size is judged by what building costs, not by parameters alone


DEEP_THIN = {"n_layer": 80_000, "n_embd": 2, "n_head": 1}  # passes the parameter bounds


def test_a_deep_thin_model_by_flags_is_refused_before_anything_is_built(
        data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Its parameters fit any device; building it (or planning its memory, which
    --batch-size auto does) would take minutes to hours. The dry run and the run answer
    at once, naming the flag."""
    base = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir",
            str(tmp_path / "run"), "--n-layer", "20000", "--n-embd", "16", "--n-head", "1"]
    for args in ([*base, "--dry-run"], base, [*base, "--batch-size", "auto", "--dry-run"]):
        assert train_main(args) == 2
        line = error_line(capsys.readouterr().err)
        assert line.startswith("error: --n-layer 20000: a model of more than 1,000 blocks")
        assert "choose --n-layer 1000 or fewer" in line
    assert sizing.param_count(ModelConfig(**DEEP_THIN)) < 10**7  # the parameters pass


def test_a_saved_config_edited_deep_and_thin_is_refused_by_every_reader(
        trained: Path, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A checkpoint whose config says 80,000 blocks 2 wide: within twice its weights'
    size, so the parameter bound passes; every reader refuses it before building it."""
    ckpt = torch.load(trained, weights_only=True)
    ckpt["config"]["model"].update(DEEP_THIN)
    path = tmp_path / "run" / "ckpt_000001.pt"
    path.parent.mkdir()
    save_atomic(ckpt, path)
    with pytest.raises(PretrainedError, match="its config's n_layer 80000: a model of more "
                                              "than 1,000 blocks"):
        load_checkpoint_model(path)  # generate, evaluate, export and gpt2-lm-eval read so
    args = [*TINY, *QUIET, "--max-steps", "2", "--data-dir", str(data_dir), "--out-dir",
            str(path.parent), "--resume", "auto"]
    for flags in ([*args, "--dry-run"], args):
        assert train_main(flags) != 0
        assert "its config's n_layer 80000" in error_line(capsys.readouterr().err)


def test_an_exported_folder_edited_deep_and_thin_is_refused_by_its_readers(
        trained: Path, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = export_hf(trained, tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    config.update(DEEP_THIN)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(PretrainedError, match=r"config\.json: n_layer 80000: a model of more "
                                              r"than 1,000 blocks"):
        load_pretrained(folder)  # generate and evaluate's --init-from
    args = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir",
            str(tmp_path / "run"), "--init-from", str(folder)]
    for flags in ([*args, "--dry-run"], args):
        assert train_main(flags) != 0
        assert f"{folder}: n_layer 80000: a model of more than 1,000 blocks" in error_line(
            capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


# ---- 3: --hellaswag-file is judged before the run


GOOD = json.dumps({"ctx": "The man", "endings": ["a", "b", "c", "d"], "label": 0})


@pytest.mark.parametrize("content,words", [
    (b"ctx,endings,label\nThe man,a|b|c|d,0\n", "FILE:1: not valid JSON"),
    (f"{GOOD}\n{GOOD}\n".encode() + b'{"ctx": "x", "label": 1}\n', "FILE:3: 'endings' must be"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", "FILE:1: not UTF-8 text"),
    (b'[{"ctx": "x"}]\n', "FILE:1: expected a JSON object"),
])
def test_a_hellaswag_file_that_is_not_hellaswags_is_refused_before_the_run(
        content: bytes, words: str, data_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "hs.jsonl"
    path.write_bytes(content)
    args = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir",
            str(tmp_path / "run"), "--hellaswag-every", "1", "--hellaswag-file", str(path)]
    for flags in ([*args, "--dry-run"], args):
        assert train_main(flags) == 2
        line = error_line(capsys.readouterr().err)
        assert f"--hellaswag-file {words.replace('FILE', str(path))}" in line, line
    assert not (tmp_path / "run").exists()


# ---- 4: an entry of a task folder that cannot be read is one line


def _broken_entries(folder: Path, kind: str) -> str:
    """An entry of `kind` put in a task folder; the words that name it."""
    if kind == "dangling yaml":
        (folder / "gone.yaml").symlink_to(folder / "nowhere.yaml")
        return (f"{folder / 'gone.yaml'} is a symlink to {folder / 'nowhere.yaml'}, which does "
                f"not exist")
    if kind == "fifo yaml":  # the harness would wait on it for ever
        os.mkfifo(folder / "pipe.yaml")
        return f"{folder / 'pipe.yaml'} is a FIFO (named pipe), not a file"
    (folder / "sub").mkdir()
    (folder / "sub" / "up").symlink_to(folder)
    return f"{folder / 'sub' / 'up'} leads back to a folder it is in (a symlink loop)"


@pytest.mark.parametrize("kind", ["dangling yaml", "fifo yaml", "folder loop"])
def test_an_unreadable_entry_of_a_task_folder_is_one_line_everywhere(
        kind: str, data_dir: Path, trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("lm_eval", reason="the eval extra")
    from harness_fixtures import write_tasks

    from gpt.evaluate import main as evaluate_main

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    folder = write_tasks(tmp_path / "tasks")
    words = _broken_entries(folder, kind)
    args = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir",
            str(tmp_path / "run"), "--eval-tasks", "tiny_mc", "--eval-tasks-every", "1",
            "--eval-tasks-include", str(folder)]
    for flags in ([*args, "--dry-run"], args):
        assert train_main(flags) != 0
        assert f"--eval-tasks-include {folder}: {words}" in error_line(capsys.readouterr().err)
    assert evaluate_main(["--checkpoint", str(trained), "--tasks", "tiny_mc", "--include-path",
                          str(folder), "--device", "cpu"]) != 0
    assert f"--include-path {folder}: {words}" in error_line(capsys.readouterr().err)
    assert lm_eval_command(monkeypatch, "--model", "gpt2-trainer", "--model_args",
                           f"checkpoint={trained}", "--tasks", "tiny_mc", "--include_path",
                           str(folder), "--device", "cpu") != 0
    assert f"--include_path {folder}: {words}" in error_line(capsys.readouterr().err)


# ---- 6: text read from a file is printed as one line, control characters escaped


def test_one_line_escapes_what_a_terminal_would_act_on() -> None:
    assert one_line("  pid 7 on host\n") == "pid 7 on host"
    assert one_line("a\nb\r\tc\x1b[31md\x07\x9b\u202ee\u2028f") == \
        "a\\nb\\r\\tc\\x1b[31md\\x07\\x9b\\u202ee\\u2028f"
    assert one_line("ünïcödé → ok") == "ünïcödé → ok"  # printable text stays as it is
    assert one_line("x" * 400) == "x" * 300 + "..." and len(one_line("x" * 400, None)) == 400


def test_a_user_error_is_one_line_whatever_it_quotes() -> None:
    """The net under every command's `error:` line: a message quoting a file's text (or a
    library's error of several lines) cannot split it or reach the terminal raw."""
    assert str(UserError("bad file: line one\nline two \x1b[2J")) == \
        "bad file: line one\\nline two \\x1b[2J"


def test_a_lock_holders_text_reaches_a_data_folder_warning_escaped(tmp_path: Path) -> None:
    from gpt.data.shards import check_not_being_written

    folder = tmp_path / "shards"
    lock = FolderLock(folder, "fineweb.py run").acquire()
    try:
        os.pwrite(lock._fd, b"pid 1\n\x1b]0;title\x07", 0)
        note = check_not_being_written(folder, allow=True)
    finally:
        lock.release()
    assert note is not None and "by pid 1\\n\\x1b]0;title\\x07" in note and "\n" not in note


# ---- 7: python -m gpt.plot -o PATH


@pytest.fixture
def metrics(tmp_path: Path) -> Path:
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in (
        {"type": "run", "config": {}, "device": "cpu"},
        {"type": "train", "step": 0, "loss": 10.0, "lr": 1e-3, "tokens_per_s": 100.0},
        {"type": "train", "step": 1, "loss": 9.0, "lr": 1e-3, "tokens_per_s": 100.0})))
    return path


@pytest.mark.parametrize("case", ["below a read-only folder", "below a file", "a folder",
                                  "an unknown image type"])
def test_an_output_that_cannot_be_written_is_one_line(case: str, metrics: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("matplotlib", reason="the plot extra")
    from gpt.plot import main

    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "folder").mkdir()
    output = {"below a read-only folder": lambda: read_only_folder(tmp_path) / "c.png",
              "below a file": lambda: tmp_path / "file" / "c.png",
              "a folder": lambda: tmp_path / "folder",
              "an unknown image type": lambda: tmp_path / "c.xyz"}[case]()
    before = listing(tmp_path)
    assert main([str(metrics), "-o", str(output)]) == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith(f"error: -o {output}: ") and "(-o PATH)" in line, line
    assert listing(tmp_path) == before
