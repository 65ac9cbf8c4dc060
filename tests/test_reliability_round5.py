"""Reliability, round five: the dry run and the run refuse the same --eval-tasks, --out-dir
and --check-tokens inputs in the same words (5); a saved config is checked as the command
line is, in every reader (6); a checkpoint from before config schemas that lacks a model
field says so once (7); an empty task list is an error (8); the tokens bench's --out is
one line (9). The evaluation surfaces (1-4) are tests/test_reliability_round5_harness.py's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from gpt.bench import cli as bench_cli
from gpt.checkpoint import files as checkpoint
from gpt.checkpoint.export import export_hf
from gpt.checkpoint.files import CheckpointError
from gpt.checkpoint.model_load import PretrainedError, load_checkpoint_model, read_checkpoint
from gpt.entry import train_main
from gpt.evaluate import main as evaluate_main

from harness_fixtures import write_tasks
from helpers import QUIET, TINY, error_line, read_only_folder

@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tasks(tmp_path_factory.mktemp("tasks"))


# ---- 5: what the run refuses, the dry run refuses, in the same words


def lm_eval_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval raises ImportError


# name -> (flags, words of the refusal, what to do to the environment first)
CASES = {
    "an unknown task in --eval-tasks": (
        ["--eval-tasks", "no_such_task", "--eval-tasks-every", "1"],
        "--eval-tasks no_such_task: no such lm-eval task", None),
    "--eval-tasks-include naming a missing folder": (
        ["--eval-tasks", "tiny_mc", "--eval-tasks-every", "1", "--eval-tasks-include", "MISSING"],
        "--eval-tasks-include MISSING: no such folder", None),
    "lm-eval not importable": (
        ["--eval-tasks", "tiny_mc", "--eval-tasks-every", "1"],
        "--eval-tasks needs EleutherAI's lm-evaluation-harness (lm-eval), which is not installed",
        lm_eval_missing),
    "--out-dir naming a file": (["--out-dir", "FILE"],
                                "--out-dir FILE: cannot write there: it is a file, not a folder",
                                None),
    "--vocab-size below the data's ids with --check-tokens": (
        ["--vocab-size", "1000", "--check-tokens"], "is >= --vocab-size 1000", None),
}


@pytest.mark.usefixtures("hub_offline")
@pytest.mark.parametrize("case", list(CASES))
def test_the_dry_run_refuses_what_the_run_refuses_in_the_same_words(
        case: str, data_dir: Path, tasks: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    pytest.importorskip("lm_eval", reason="the eval extra")
    flags, words, environment = CASES[case]
    (tmp_path / "file").write_text("not a folder")
    names = {"MISSING": str(tmp_path / "missing"), "FILE": str(tmp_path / "file")}
    flags = [names.get(f, f) for f in flags]
    words = words.replace("MISSING", names["MISSING"]).replace("FILE", names["FILE"])
    if environment is not None:
        environment(monkeypatch)
    args = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir",
            str(tmp_path / "run"), "--eval-tasks-include", str(tasks), *flags]
    dry = train_main([*args, "--dry-run"])
    dry_text = capsys.readouterr()
    assert dry != 0 and "the run would start" not in dry_text.out, dry_text
    dry_line = error_line(dry_text.err)
    real = train_main(args)
    real_line = error_line(capsys.readouterr().err)
    assert real == dry and words in dry_line and dry_line == real_line
    assert not (tmp_path / "run").exists()  # nothing written


@pytest.mark.usefixtures("hub_offline")
def test_the_dry_run_promises_a_run_with_known_tasks(data_dir: Path, tasks: Path, tmp_path: Path,
                                                     capsys) -> None:
    pytest.importorskip("lm_eval", reason="the eval extra")
    code = train_main([*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir",
                       str(tmp_path / "run"), "--eval-tasks", "tiny_mc,tiny_gen",
                       "--eval-tasks-every", "1", "--eval-tasks-include", str(tasks),
                       "--check-tokens", "--dry-run"])
    assert code == 0 and "dry run: the run would start" in capsys.readouterr().out
    assert not (tmp_path / "run").exists()


def test_an_out_dir_below_a_file_is_refused_before_anything_is_built(data_dir: Path, tmp_path: Path,
                                                                      capsys) -> None:
    (tmp_path / "file").write_text("not a folder")
    out = tmp_path / "file" / "run"
    assert train_main([*TINY, *QUIET, "--data-dir", str(data_dir), "--out-dir", str(out)]) == 2
    assert f"--out-dir {out}: cannot write there: {tmp_path / 'file'} is a file" in error_line(
        capsys.readouterr().err)


# ---- 6: a saved config's values are checked as the command line's are, in every reader


def edited(src: Path, dst: Path, schema: bool = True, drop: tuple[str, ...] = (),
           **model: object) -> Path:
    """src with model fields of its saved config set or dropped (and its schema version)."""
    ckpt = torch.load(src, weights_only=True)
    ckpt["config"]["model"].update(model)
    for name in drop:
        del ckpt["config"]["model"][name]
    if not schema:
        del ckpt[checkpoint.SCHEMA_KEY]
    dst.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, dst)
    return dst


def readers(path: Path, tmp_path: Path) -> dict:
    """Every reader of a checkpoint: generate and evaluate, export, resume, the harness."""
    def harness() -> object:
        pytest.importorskip("lm_eval", reason="the eval extra")
        from gpt.eval.harness import GPT2TrainerLM
        return GPT2TrainerLM(checkpoint=str(path), device="cpu")

    return {"load": lambda: load_checkpoint_model(path), "read": lambda: read_checkpoint(path),
            "export": lambda: export_hf(path, tmp_path / "hf"),
            "resume": lambda: checkpoint.choose(path.parent, str(path)), "harness": harness}


@pytest.mark.parametrize("value, words", [
    ({"n_layer": "2"}, "n_layer = '2' must be int (flag --n-layer)"),
    ({"n_embd": 64.0}, "n_embd = 64.0 must be int (flag --n-embd)"),
    ({"n_head": 3}, "--n-embd 64 must be divisible by --n-head 3"),
    ({"dropout": 1.5}, "--dropout must be in [0, 1), got 1.5"),
])
def test_a_bad_value_in_a_saved_config_is_one_line_in_every_reader(
        value: dict, words: str, trained: Path, tmp_path: Path) -> None:
    path = edited(trained, tmp_path / "run" / "ckpt_000001.pt", **value)
    for name, read in readers(path, tmp_path).items():
        with pytest.raises((PretrainedError, CheckpointError)) as e:
            read()
        assert f"{path}: its saved config: {words}" in str(e.value), name
    assert not (tmp_path / "hf").exists()


def test_a_checkpoint_of_the_current_trainer_loads_as_before(trained: Path, capsys) -> None:
    model = load_checkpoint_model(trained)
    saved = torch.load(trained, weights_only=True)["model"]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    assert "warning" not in capsys.readouterr().err


# ---- 7: a file from before schemas that lacks a model field says so, once


def one_step(data_dir: Path, out: Path, *flags: str) -> Path:
    assert train_main([*TINY, *QUIET, *flags, "--max-steps", "1", "--data-dir", str(data_dir),
                       "--out-dir", str(out)]) == 0
    return out / "ckpt_000001.pt"


@pytest.fixture(scope="module")
def relu2_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return one_step(data_dir, tmp_path_factory.mktemp("relu2"), "--relu2")


def test_a_file_from_before_schemas_that_lacks_a_field_warns_in_every_reader(
        relu2_run: Path, tmp_path: Path, capsys) -> None:
    path = edited(relu2_run, tmp_path / "run" / "ckpt_000001.pt", schema=False, drop=("relu2",))
    capsys.readouterr()
    for name, read in readers(path, tmp_path).items():
        read()
        warnings = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning:")]
        assert len(warnings) == 1, (name, warnings)
        assert f"{path}: its config lacks relu2" in warnings[0] and "relu2=False" in warnings[0]


def test_weights_that_disagree_with_the_assumed_model_are_refused(data_dir: Path,
                                                                  tmp_path: Path) -> None:
    # RMSNorm holds no bias: read as LayerNorm, the weights show the loss
    src = one_step(data_dir, tmp_path / "src", "--rmsnorm")
    path = edited(src, tmp_path / "run" / "ckpt_000001.pt", schema=False, drop=("rmsnorm",))
    for name, read in readers(path, tmp_path).items():
        with pytest.raises((PretrainedError, CheckpointError), match="missing .*ln_1.bias"):
            read()


def test_a_resume_from_before_schemas_warns_once(trained: Path, data_dir: Path, tmp_path: Path,
                                                 capsys) -> None:
    path = edited(trained, tmp_path / "run" / "ckpt_000001.pt", schema=False,
                  drop=("qk_norm", "relu2"))
    assert train_main([*TINY, *QUIET, "--max-steps", "2", "--data-dir", str(data_dir),
                       "--out-dir", str(tmp_path / "run"), "--resume", str(path)]) == 0
    warnings = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning:")]
    assert len(warnings) == 1 and "lacks qk_norm, relu2" in warnings[0]
    assert (tmp_path / "run" / "ckpt_000002.pt").is_file()


# ---- 8: an empty task list is an error, and tasks never scored too


@pytest.mark.usefixtures("hub_offline")
@pytest.mark.parametrize("text", ["", ",,,", " , "])
def test_evaluate_refuses_an_empty_task_list(text: str, trained: Path, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        evaluate_main(["--checkpoint", str(trained), "--tasks", text])
    assert e.value.code == 2 and f"--tasks {text!r} names no task" in error_line(
        capsys.readouterr().err)


@pytest.mark.usefixtures("hub_offline")
@pytest.mark.parametrize("flags, words", [
    (["--eval-tasks", "hellaswag"], "--eval-tasks hellaswag is scored every --eval-tasks-every "
                                    "N steps (and at the end), and that is 0 (off)"),
    (["--eval-tasks", ",,,", "--eval-tasks-every", "5"], "--eval-tasks ',,,' names no task"),
])
def test_the_trainer_refuses_tasks_it_would_drop(flags: list[str], words: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        train_main([*TINY, *flags, "--dry-run"])
    assert e.value.code == 2 and words in error_line(capsys.readouterr().err)


# ---- 9: the tokens bench's --out


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
