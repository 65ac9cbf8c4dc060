"""--out of every `python -m gpt.bench` subcommand, checked before anything is measured: a
file where a folder is meant, a folder where a file is meant, a place that cannot be
written. Each is one line naming --out, exit status 1, and what was there is left as it
was."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpt.bench import cli as bench_cli
from helpers import error_line, only_line, read_only_folder


def refuse_to_measure(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any subcommand that got past the check would be measuring: fail instead."""
    def measured(*args: object, **kwargs: object) -> None:
        raise AssertionError("the subcommand ran before its --out was checked")

    for name in ("gpu.accept", "step.memory", "step.model", "tokens.newton_schulz", "step.malloc",
                 "prepare.throughput"):
        module = bench_cli._module(next(k for k, (m, _) in bench_cli.SUBCOMMANDS.items() if m == name))
        for attr in ("run", "run_model", "main"):
            if hasattr(module, attr):
                monkeypatch.setattr(module, attr, measured)


@pytest.mark.parametrize("argv,says", [
    (["model", "--out", "{file}"], "is a file, not a folder: name a folder for model's JSON"),
    (["newton-schulz", "--out", "{file}/below"], "cannot be used as a folder"),
    (["cpu-malloc", "--out", "{file}"], "is a file, not a folder"),
    (["prepare", "--out", "{file}"], "is a file, not a folder: name a folder for prepare_cpu"),
    (["gpu", "throughput", "--smoke", "--out", "{file}"], "name a folder for each stage's JSON"),
    (["memory", "--model", "tiny", "--out", "{folder}"], "is a folder: name a file for the plan's JSON"),
    (["memory", "--model", "tiny", "--out", "{file}/plan.json"], "its folder cannot be written"),
])
def test_an_unusable_out_is_one_line_before_anything_runs(argv: list[str], says: str, tmp_path: Path,
                                                          capsys, monkeypatch) -> None:
    refuse_to_measure(monkeypatch)
    (tmp_path / "file").write_text("kept")
    (tmp_path / "folder").mkdir()
    argv = [a.format(file=tmp_path / "file", folder=tmp_path / "folder") for a in argv]
    assert bench_cli.main(argv) == 1
    err = only_line(capsys.readouterr().err)
    assert err.startswith(f"error: --out {argv[argv.index('--out') + 1]}") and says in err, err
    assert (tmp_path / "file").read_text() == "kept" and not any((tmp_path / "folder").iterdir())


@pytest.mark.skipif(sys.platform == "win32", reason="folder modes and sysfs are POSIX")
def test_a_folder_this_process_may_not_write_in_is_one_line(tmp_path: Path, capsys,
                                                             monkeypatch) -> None:
    refuse_to_measure(monkeypatch)
    parent = read_only_folder(tmp_path)
    plan = parent / "gpt2-trainer" / "plan.json"
    assert bench_cli.main(["memory", "--model", "tiny", "--out", str(plan)]) == 1
    assert "its folder cannot be written" in only_line(capsys.readouterr().err)
    assert bench_cli.main(["model", "--out", str(parent / "gpt2-trainer")]) == 1
    assert "cannot be used as a folder" in only_line(capsys.readouterr().err)


def test_plan_writes_nothing_and_needs_no_usable_out(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("kept")
    assert bench_cli.main(["gpu", "--plan", "xl", "--out", str(tmp_path / "file")]) == 0
    assert (tmp_path / "file").read_text() == "kept"


def test_the_check_leaves_no_folder_behind(tmp_path: Path, capsys, monkeypatch) -> None:
    """The folders --out needs are made by the subcommand when it writes: a run that stops
    before (here at a bad --n-layer) leaves none of them."""
    out = tmp_path / "a" / "b" / "plan.json"
    with pytest.raises(SystemExit):  # the trainer's flags are refused as the trainer does
        bench_cli.main(["memory", "--model", "tiny", "--n-layer", "0", "--out", str(out)])
    assert "--n-layer must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("where", ["a file", "below a file"])
def test_the_tokens_bench_refuses_an_unusable_out_in_one_line(where: str, data_dir: Path,
                                                               tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("not a folder")
    out = tmp_path / "file" if where == "a file" else tmp_path / "file" / "out"
    code = bench_cli.main(["tokens", "--data-dir", str(data_dir), "--out", str(out)])
    assert code == 1 and f"--out {out}" in error_line(capsys.readouterr().err)
    assert (tmp_path / "file").read_text() == "not a folder"


@pytest.mark.skipif(sys.platform == "win32", reason="folder modes and sysfs are POSIX")
def test_the_tokens_bench_refuses_a_read_only_out(data_dir: Path, tmp_path: Path, capsys) -> None:
    parent = read_only_folder(tmp_path)
    code = bench_cli.main(["tokens", "--data-dir", str(data_dir), "--out", str(parent / "out")])
    assert code == 1 and "cannot be used as a folder" in error_line(capsys.readouterr().err)
