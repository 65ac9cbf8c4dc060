"""Task folders and tasks that cannot load (gpt/eval/harness_tasks.py): each says what is
wrong with it in one line, in the trainer, `python -m gpt.evaluate` and `gpt2-lm-eval`
alike: an include folder that is missing or holds an entry that cannot be read, and a
task of the Hub's whose data was never downloaded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpt.entry import train_main
from gpt.eval import harness_tasks

from helpers import QUIET, TINY, error_line, lm_eval_command

lm_eval = pytest.importorskip("lm_eval", reason='lm-eval is not installed (pip install -e ".[eval]")')

pytestmark = pytest.mark.usefixtures("hub_offline")


def test_a_task_of_the_hubs_without_its_data_says_run_once_with_network(tmp_path: Path) -> None:
    (tmp_path / "hub_task.yaml").write_text(
        "task: hub_task\ndataset_path: no-such-org/no-such-dataset\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: \"{{ctx}}\"\n"
        "doc_to_choice: \"{{endings}}\"\ndoc_to_target: \"{{label}}\"\n")
    _, failed = harness_tasks.load_tasks(["hub_task"], str(tmp_path))
    assert "task hub_task: its data could not be loaded" in failed[0]
    assert "HF_DATASETS_CACHE" in failed[0] and "run once with network" in failed[0]


def test_a_missing_include_folder_is_named_as_missing(tmp_path: Path) -> None:
    with pytest.raises(harness_tasks.HarnessError,
                       match=f"--include-path {tmp_path / 'nope'}: no such folder"):
        harness_tasks.load_tasks(["tiny_mc"], str(tmp_path / "nope"))


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
