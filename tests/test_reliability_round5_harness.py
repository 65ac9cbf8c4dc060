"""Reliability, round five, the evaluation surfaces: `gpt2-lm-eval` answers bad input in
one line as `python -m gpt.evaluate` does (1, 2), a request the model cannot score is
refused before scoring in one line naming the task and document (3), a task that fails
while being scored during training is one warning and the run goes on (4), and a task
that cannot load says what is wrong with it. Offline, on tiny local tasks
(tests/harness_fixtures.py); the rest of round five is tests/test_reliability_round5.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from gpt.core.config import model_preset
from gpt.entry import train_main
from gpt.eval import harness_tasks
from gpt.evaluate import main as evaluate_main
from gpt.model.transformer import GPT

from harness_fixtures import write_odd_tasks, write_tasks
from helpers import (QUIET, TINY, error_line, lm_eval_command, read_metrics, run_torchrun,
                     write_checkpoint, write_random_shards)

lm_eval = pytest.importorskip("lm_eval", reason='lm-eval is not installed (pip install -e ".[eval]")')


pytestmark = pytest.mark.usefixtures("hub_offline")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every fixture task in one folder: the harness indexes it once for the module."""
    folder = tmp_path_factory.mktemp("tasks")
    write_tasks(folder)
    return write_odd_tasks(folder)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt.pt")  # block size 64


# ---- 1: a checkpoint that cannot be read is one line, not a traceback


def bad_checkpoint(case: str, good: Path, folder: Path) -> Path:
    path = folder / f"{case}.pt"
    data = good.read_bytes()
    if case == "a folder":
        path.mkdir()
    elif case == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif case == "corrupt":
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(flipped))
    return path  # "missing": nothing there


@pytest.mark.parametrize("case", ["missing", "a folder", "truncated", "corrupt"])
def test_lm_eval_command_answers_a_checkpoint_it_cannot_read_in_one_line(
        case: str, tasks: Path, ckpt: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    path = bad_checkpoint(case, ckpt, tmp_path)
    code = lm_eval_command(monkeypatch, "--model", "gpt2-trainer", "--model_args",
                           f"checkpoint={path}", "--device", "cpu", "--tasks", "tiny_mc",
                           "--include_path", str(tasks), "--limit", "2")
    line = error_line(capsys.readouterr().err)
    # named as the user gave it, in model_args, not as gpt.evaluate's --checkpoint flag
    assert code == 1 and f"model_args checkpoint={path}" in line and "--checkpoint" not in line


# ---- 2: the harness's own command-line errors are one line, as gpt.evaluate's are


@pytest.mark.parametrize("flags, words", [
    (["--tasks", "no_such_task"], "--tasks no_such_task: no such lm-eval task or in --include_path"),
    (["--tasks", "tiny_mc", "--limit", "0"], "--limit 0: must be above 0"),
    (["--tasks", "tiny_mc", "--limit", "-1"], "--limit -1: must be above 0"),
    (["--tasks", "broken_empty"], "task broken_empty: its data holds no documents"),
    (["--tasks", "broken_missing"], "task broken_missing: its data could not be read"),
    (["--tasks", ""], "--tasks '' names no task"),
    (["--tasks", ",,,"], "--tasks ',,,' names no task"),
])
def test_lm_eval_command_answers_bad_flags_in_one_line(flags: list[str], words: str, tasks: Path,
                                                      ckpt: Path, monkeypatch, capsys) -> None:
    code = lm_eval_command(monkeypatch, "--model", "gpt2-trainer", "--model_args",
                           f"checkpoint={ckpt}", "--device", "cpu", "--include_path", str(tasks),
                           *flags)
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert words in [line for line in err.splitlines() if line.startswith("error:")][0]


def test_lm_eval_command_still_takes_task_patterns(tasks: Path, ckpt: Path, monkeypatch,
                                                   capsys) -> None:
    code = lm_eval_command(monkeypatch, "--model", "gpt2-trainer", "--model_args",
                           f"checkpoint={ckpt}", "--device", "cpu", "--include_path", str(tasks),
                           "--tasks", "tiny_m*", "--limit", "2")
    assert code == 0 and "tiny_mc" in capsys.readouterr().out


# ---- 3: a request the model cannot score is refused before scoring, naming it


@pytest.mark.parametrize("task, words", [
    ("odd_long_continuation", "its continuation is 100 tokens, more than the model's block "
                              "size of 64"),
    ("odd_empty_continuation", "its continuation is empty"),
    ("odd_max_gen_toks", "max_gen_toks 100 must be a whole number from 1 to 63"),
    ("odd_empty_context", "its context is empty"),
    ("odd_empty_document", "the text to score is empty"),
])
def test_a_request_the_model_cannot_score_is_refused_naming_task_and_document(
        task: str, words: str, tasks: Path, ckpt: Path, capsys) -> None:
    # --limit 1: the first document alone, the odd one (a rolling task of empty documents
    # only is where the harness divided by zero)
    code = evaluate_main(["--checkpoint", str(ckpt), "--tasks", task, "--include-path",
                          str(tasks), "--device", "cpu", "--limit", "1"])
    line = error_line(capsys.readouterr().err)
    assert code == 1 and f"task {task}, document 0: {words}" in line
    assert "refused before scoring" in line


def test_lm_eval_command_refuses_a_request_in_one_line(tasks: Path, ckpt: Path, monkeypatch,
                                                       capsys) -> None:
    code = lm_eval_command(monkeypatch, "--model", "gpt2-trainer", "--model_args",
                           f"checkpoint={ckpt}", "--device", "cpu", "--include_path", str(tasks),
                           "--tasks", "odd_long_continuation")
    line = error_line(capsys.readouterr().err)
    assert code == 1 and "task odd_long_continuation, document 0: its continuation" in line


@pytest.mark.numerics
def test_a_continuation_as_long_as_the_block_scores_as_the_hf_model_scores_it(
        tasks: Path, tmp_path: Path) -> None:
    """The left cut keeps a continuation of block-size tokens whole: the harness's `hf`
    model on the export gives the same log-likelihoods (and it refuses longer ones)."""
    pytest.importorskip("accelerate", reason="the harness's hf model needs it (the hf extra)")
    from lm_eval.evaluator import evaluate
    from lm_eval.models.huggingface import HFLM

    from gpt.checkpoint.export import export_hf
    from gpt.eval.harness import GPT2TrainerLM

    torch.manual_seed(0)
    model = GPT(model_preset("tiny", block_size=64))
    export_hf(model, tmp_path / "hf")
    answers = []
    for lm in (GPT2TrainerLM(model=model, dtype="fp32"),
               HFLM(pretrained=str(tmp_path / "hf"), device="cpu", dtype="float32")):
        loaded, failed = harness_tasks.load_tasks(["fits_block"], str(tasks))
        assert not failed
        out = evaluate(lm=lm, task_dict=loaded, bootstrap_iters=0, log_samples=True)
        answers.append([s["resps"][0][0] for s in sorted(out["samples"]["fits_block"],
                                                         key=lambda s: s["doc_id"])])
    ours, theirs = answers
    assert len(ours) == 2
    for (lp, greedy), (lp_hf, greedy_hf) in zip(ours, theirs):
        assert lp == pytest.approx(lp_hf, abs=1e-4) and greedy == greedy_hf


@pytest.mark.slow
def test_ranks_agree_on_a_refusal(tasks: Path, ckpt: Path) -> None:
    """Under torchrun the odd document is rank 0's alone: both ranks stop with its line,
    rather than rank 1 waiting for rank 0 in the next collective."""
    proc = run_torchrun("--checkpoint", str(ckpt), "--tasks", "odd_long_continuation",
                        "--include-path", str(tasks), "--device", "cpu",
                        target=("-m", "gpt.evaluate"), timeout=300)
    assert proc.returncode != 0  # torchrun's own report of failed workers follows
    assert "/gpt/" not in proc.stderr and "lm_eval/" not in proc.stderr  # no worker traceback
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 2 and all("odd_long_continuation, document 0" in x for x in lines)


# ---- 4: in training, a task that fails while being scored is one warning


def test_a_task_that_fails_to_score_in_training_is_a_warning_and_the_run_goes_on(
        tasks: Path, tmp_path: Path, capsys) -> None:
    data = write_random_shards(tmp_path, seed=0, train=(10_000,))
    out = tmp_path / "run"
    code = train_main([*TINY, *QUIET, "--max-steps", "2", "--data-dir", str(data),
                       "--out-dir", str(out), "--eval-tasks",
                       "tiny_mc,odd_long_continuation,odd_later_document",
                       "--eval-tasks-every", "1", "--eval-tasks-include", str(tasks)])
    text = capsys.readouterr()
    assert code == 0 and "Traceback" not in text.err
    warnings = [line for line in text.out.splitlines() if line.startswith("warning: --eval-tasks")]
    assert len(warnings) == 2, warnings  # each failing task once, then dropped
    assert "odd_long_continuation could not be scored at step 0" in warnings[0]
    assert "document 0: its continuation is 100 tokens" in warnings[0]
    assert "odd_later_document could not be scored at step 0" in warnings[1]
    assert all("training goes on without it" in w for w in warnings)
    assert [r["step"] for r in read_metrics(out, "tasks")] == [0, 1, 2]
    assert all("tiny_mc/acc" in r for r in read_metrics(out, "tasks"))
    assert (out / "ckpt_000002.pt").is_file()  # the final checkpoint, after the scores


def _failing_rank_worker(rank: int, folder: str) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from gpt.core.config import model_preset
    from gpt.eval.harness import GPT2TrainerLM
    from gpt.eval.harness_tasks import HarnessError
    from gpt.eval.rank_agreement import agreed
    from gpt.model.transformer import GPT
    from gpt.eval.train_tasks import agreed_failure

    dist.init_process_group("gloo", init_method=f"file://{folder}/pg", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    try:
        lm = GPT2TrainerLM(model=GPT(model_preset("tiny", block_size=64)), rank=rank,
                           world_size=2, quiet=True)

        def share() -> list[tuple[float, bool]]:  # rank 1's share fails part-way
            if rank == 1:
                raise ValueError("out of memory on this share")
            return [(0.0, True)]

        try:
            outcome = f"returned {agreed(share, lm._world_size)}"
        except HarnessError as e:
            outcome = str(e)
        # the metrics, which the harness computes on rank 0 alone, fail there
        dropped = agreed_failure("ZeroDivisionError: in the metrics" if rank == 0 else None, 2)
        (Path(folder) / f"rank{rank}.json").write_text(json.dumps([outcome, dropped]))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ranks_agree_when_one_fails_while_scoring(tmp_path: Path) -> None:
    """Under DDP each rank scores its share: a rank whose share fails, or rank 0 whose
    metrics fail, must not leave the others waiting in the next gather; every rank raises
    or drops the task alike."""
    import torch.multiprocessing as mp

    mp.spawn(_failing_rank_worker, args=(str(tmp_path),), nprocs=2, join=True)
    for rank in range(2):
        outcome, dropped = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert outcome == "scoring failed on rank 1: ValueError: out of memory on this share"
        assert dropped == "ZeroDivisionError: in the metrics"


# ---- misleading words: a task that cannot load says what is wrong with it


@pytest.mark.parametrize("task, words", [
    ("broken_template", "task broken_template: its template cannot be rendered on its documents "
                        "(TemplateSyntaxError"),
    ("broken_field", "task broken_field: its template cannot be rendered on its documents "
                     "(UndefinedError: 'question' is undefined)"),
    ("broken_empty", "task broken_empty: its data holds no documents"),
    ("broken_missing", "task broken_missing: its data could not be read"),
])
def test_a_local_task_that_cannot_load_says_what_is_wrong(task: str, words: str,
                                                          tasks: Path) -> None:
    loaded, failed = harness_tasks.load_tasks([task], str(tasks))
    assert not loaded and len(failed) == 1
    assert words in failed[0] and "network" not in failed[0]


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


def test_an_lm_eval_that_fails_to_import_is_not_called_missing(ckpt: Path, monkeypatch,
                                                               capsys) -> None:
    """lm-eval is there, but a package it needs (datasets, here) is not: its modules fail
    to import, and the line says so rather than "not installed"."""
    for name in [m for m in sys.modules if m.split(".")[0] in ("lm_eval", "datasets")
                 and m != "lm_eval"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "datasets", None)  # its import now fails
    code = evaluate_main(["--checkpoint", str(ckpt), "--tasks", "tiny_mc", "--device", "cpu"])
    line = error_line(capsys.readouterr().err)
    assert code == 1 and "installed but fails to import" in line and "datasets" in line
    assert "not installed" not in line
