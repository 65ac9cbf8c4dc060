"""How a run ends: the summary line and the commands after it, the stop line of
--stop-at-step, and the curves a run draws into its folder (or the one line that says how
to get them). In-process tiny runs of a few steps."""

from __future__ import annotations

import json
import math
import re
import shlex
import sys
import time
from pathlib import Path

import pytest

from gpt.checkpoint.checkpointer import LoopState
from gpt.core.cli import parse_args
from gpt.core.extras import have
from gpt.entry import train_main
import gpt.train.run_curves as run_curves
from gpt.train.run_summary import Ending, Tally, summarize

from helpers import TINY, read_metrics

ARGS = [*TINY, "--sample-every", "0", "--val-every", "2", "--val-steps", "1"]


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = train_main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def summary_lines(out: str) -> list[str]:
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(("done:", "stopped at")))
    return lines[first:]


def test_a_finished_run_ends_on_its_summary_and_the_commands_that_follow(
        random_data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "r"
    code, out, _ = run([*ARGS, "--max-steps", "4", "--data-dir", str(random_data_dir),
                        "--out-dir", str(out_dir), "--sample-prompt", "It's a"], capsys)
    assert code == 0
    vals = [r["val_loss"] for r in read_metrics(out_dir, "val")]
    lines = summary_lines(out)  # the last lines of the run, nothing after
    head, sample, evaluate = lines[:3]
    curves = out_dir / "curves.png"  # drawn at the end wherever matplotlib is installed
    assert lines[3:] == ([f"  curves:   {curves}"] if have("matplotlib") else [])
    best = min(vals)
    m = re.fullmatch(r"done: step 4/4 \| val loss ([\d.]+), best ([\d.]+) at step (\d) \| "
                     r"1\.02k tokens in (\d+)s: ([\d,]+) tokens/s \(([\d,]+) in the steps "
                     r"alone\) \| checkpoint (\S+)", head)
    assert m, head
    assert float(m.group(1)) == pytest.approx(vals[-1], abs=5e-5)
    assert float(m.group(2)) == pytest.approx(best, abs=5e-5)
    assert int(m.group(3)) == 2 * vals.index(best)  # validated at steps 0, 2, 4
    assert m.group(7) == str(out_dir / "ckpt_000004.pt") and Path(m.group(7)).is_file()
    ckpt = shlex.quote(m.group(7))
    assert sample == f"  sample:   python -m gpt.generate --checkpoint {ckpt} --prompt 'It'\"'\"'s a'"
    assert evaluate == (f"  evaluate: python -m gpt.evaluate --checkpoint {ckpt} --data-dir "
                        f"{random_data_dir} --val-steps 1 --batch-size 4 --device cpu")
    # every figure of the line is in the metrics log too
    record = read_metrics(out_dir, "summary")[-1]
    assert record["stopped_by"] is None and record["tokens"] == 1024 == record["tokens_seen"]
    assert record["best_val_loss"] == best and record["checkpoint"] == m.group(7)
    assert record["tokens_per_s"] == pytest.approx(1024 / record["wall_s"], rel=0.05)
    assert record["step_tokens_per_s"] >= record["tokens_per_s"]  # evaluation left out
    assert not (out_dir / ".lock").exists()  # the run let go of its folder


def test_the_evaluate_command_it_prints_scores_what_the_run_scored_last(
        random_data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The summary's evaluate command, run as printed (gpt.evaluate's main in this
    process), gives the run's last validation loss: the same batches of the same size, on
    the same device and precision (gpt.evaluate's defaults, 20 batches of 8, gave another
    figure). Compared exactly: it is the same computation (the same weights, read back from
    the checkpoint saved after that validation, the same fp32 kernels on the same tokens in
    the same order, in the same process), so it gives the same bits."""
    from gpt.evaluate import main as evaluate_main

    out_dir = tmp_path / "r"
    code, out, _ = run([*ARGS, "--max-steps", "2", "--val-steps", "3", "--device", "cpu",
                        "--data-dir", str(random_data_dir), "--out-dir", str(out_dir)], capsys)
    assert code == 0
    evaluate = summary_lines(out)[2]
    argv = shlex.split(evaluate.split(":", 1)[1])
    assert argv[:3] == ["python", "-m", "gpt.evaluate"] and "--val-steps" in argv
    assert evaluate_main([*argv[3:], "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    last = read_metrics(out_dir, "val")[-1]
    assert last["step"] == 2 and scored["val_loss"] == last["val_loss"]
    assert scored["val_tokens"] == 3 * 4 * 32  # --val-steps x --batch-size x --seq-len


def test_the_summary_times_the_training_not_the_drawing_of_its_curves(
        random_data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A figure that takes long to draw (a long log) does not lower the tokens/s the run
    reports. The drawing here moves the clock on by a day instead of taking time."""
    clock = {"offset": 0.0}
    real = time.monotonic
    monkeypatch.setattr(time, "monotonic", lambda: real() + clock["offset"])

    def slow_drawing(self):
        clock["offset"] += 86_400.0
        return None

    monkeypatch.setattr(run_curves.RunCurves, "_drawn", slow_drawing)
    monkeypatch.setattr(run_curves, "have", lambda module: True)
    monkeypatch.setattr(run_curves, "MIN_INTERVAL_S", 0.0)  # drawn after each validation too
    monkeypatch.setattr(run_curves, "COST_FACTOR", 0.0)  # however long the last one took
    out_dir = tmp_path / "r"
    code, out, _ = run([*ARGS, "--max-steps", "4", "--data-dir", str(random_data_dir),
                        "--out-dir", str(out_dir)], capsys)
    assert code == 0 and clock["offset"] == 3 * 86_400.0  # after steps 0 and 2, and at the end
    record = read_metrics(out_dir, "summary")[-1]
    assert record["wall_s"] < 86_400.0, record  # a few seconds of training, not days
    assert record["tokens_per_s"] == pytest.approx(1024 / record["wall_s"], rel=0.05)
    assert "1.02k tokens in 1d" not in summary_lines(out)[0]


@pytest.mark.slow
def test_stop_at_step_says_where_it_stopped_and_how_to_resume(
        random_data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "r"
    flags = [*ARGS, "--max-steps", "4", "--data-dir", str(random_data_dir), "--out-dir", str(out_dir)]
    code, out, _ = run([*flags, "--stop-at-step", "2"], capsys)
    assert code == 0  # a planned stop, not a failure
    lines = summary_lines(out)
    assert lines[0].startswith("stopped at step 2/4 (--stop-at-step 2) | val loss ")
    assert lines[0].endswith(f"| checkpoint {out_dir / 'ckpt_000002.pt'}")
    resume = lines[1]
    assert resume == f"  resume:   python train_gpt2.py --config {out_dir / 'config.toml'} --resume auto"
    # the command it prints carries the run on to --max-steps
    code, out, _ = run(shlex.split(resume.split(":", 1)[1])[2:], capsys)
    assert code == 0 and "resumed from" in out
    head = summary_lines(out)[0]
    assert head.startswith("done: step 4/4 | ") and "512 tokens in " in head
    assert "(1.02k in all)" in head, head
    assert [r["stopped_by"] for r in read_metrics(out_dir, "summary")] == ["--stop-at-step 2", None]


@pytest.mark.slow
def test_a_stop_as_the_last_step_finishes_leaves_the_end_of_run_work_to_the_resume(
        random_data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM during step 4 of 4: the checkpoint is saved before the end's validation;
    the resume computes it (and records it in the checkpoint and the summary) instead
    of saying there is nothing to do."""
    import os
    import signal

    from gpt.checkpoint.files import load
    from gpt.train import loop

    out_dir = tmp_path / "r"
    flags = [*ARGS, "--max-steps", "4", "--data-dir", str(random_data_dir), "--out-dir",
             str(out_dir)]
    steps, step = [], loop.optimizer_step

    def signalled_at_the_last(*args, **kwargs):
        steps.append(1)
        if len(steps) == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # the loop finishes the step, then stops
        return step(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(loop, "optimizer_step", signalled_at_the_last)
        code, out, _ = run(flags, capsys)
    assert code == 128 + signal.SIGTERM and "SIGTERM received: saved checkpoint" in out
    assert [r["step"] for r in read_metrics(out_dir, "val")] == [0, 2]  # not the end's
    assert load(out_dir / "ckpt_000004.pt")["ended_at"] is None
    code, out, _ = run([*flags, "--resume", "auto"], capsys)
    assert code == 0 and "its end-of-run work was not done" in out
    vals = read_metrics(out_dir, "val")
    assert [r["step"] for r in vals] == [0, 2, 4]  # the end's validation, once
    summary = read_metrics(out_dir, "summary")[-1]
    assert summary["step"] == 4 and summary["val_loss"] == vals[-1]["val_loss"]
    ckpt = load(out_dir / "ckpt_000004.pt")
    assert ckpt["ended_at"] == 4 and ckpt["val_loss"] == vals[-1]["val_loss"]
    code, out, _ = run([*flags, "--resume", "auto"], capsys)  # now there is nothing to do
    assert code == 0 and "nothing to do: the run is already at step 4" in out
    assert len(read_metrics(out_dir, "val")) == 3


def test_no_checkpoint_is_said_and_no_commands_offered(
        random_data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*ARGS, "--max-steps", "2", "--val-every", "0", "--no-save-checkpoints",
                        "--data-dir", str(random_data_dir), "--out-dir", str(tmp_path / "r")], capsys)
    assert code == 0
    head, *curves = summary_lines(out)  # (and the curves' line where matplotlib is installed)
    assert curves == ([f"  curves:   {tmp_path / 'r' / 'curves.png'}"] if have("matplotlib") else [])
    assert head.startswith("done: step 2/2 | 512 tokens in ")
    assert head.endswith("| no checkpoint (--no-save-checkpoints)") and "val loss" not in head


def test_summary_after_a_resume_counts_the_best_of_before() -> None:
    """The best validation a resumed run's checkpoint recorded beats this process's: it is
    reported, without a step (only its checkpoint knows it)."""
    cfg = parse_args([*TINY, "--max-steps", "10"])
    tally = Tally(start_step=6)
    tally.validated(8, 5.5)
    tally.validated(10, 5.25)
    state = LoopState(step=10, last_val=5.25, best_val=5.0)
    end = Ending(cfg=cfg, state=state, stopped_by=None, checkpoint=None, out_dir=Path("r"),
                 curves=None, distributed=False)
    lines, record = summarize(tally, end)
    assert "val loss 5.2500, best 5.0000 before the resume" in lines[0]
    assert "1.02k tokens in 0s" in lines[0] and "(2.56k in all)" in lines[0]
    assert record["best_val_loss"] == 5.0 and record["best_step"] is None
    state.best_val = math.inf  # no checkpoint recorded one: this process's best, with its step
    assert "best 5.2500 at step 10" in summarize(tally, end)[0][0]


# ---------------------------------------------------------------------------------------
# the run's picture


def test_a_run_draws_its_curves_titled_with_its_folder_and_recipe(
        random_data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    import gpt.report.curves as plot

    monkeypatch.setattr(run_curves, "MIN_INTERVAL_S", 0.0)  # no pacing: every validation
    monkeypatch.setattr(run_curves, "COST_FACTOR", 0.0)
    drawn: list[tuple[list[int], str]] = []
    real = plot.plot_runs

    def spy(runs, output, smooth=0.0, title=None, log_loss=False):
        drawn.append((runs[0].series("val", "val_loss")[0], title))
        return real(runs, output, smooth=smooth, title=title, log_loss=log_loss)

    monkeypatch.setattr(plot, "plot_runs", spy)
    out_dir = tmp_path / "r"
    code, out, _ = run([*ARGS, "--max-steps", "4", "--data-dir", str(random_data_dir),
                        "--out-dir", str(out_dir)], capsys)
    assert code == 0
    png = out_dir / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert summary_lines(out)[-1] == f"  curves:   {png}"
    # after the validations at steps 0 and 2, then once at the end (with step 4's)
    assert [steps for steps, _ in drawn] == [[0], [0, 2], [0, 2, 4]]
    title = drawn[-1][1]
    assert title.startswith(f"{out_dir}: tiny model, ") and "1.02k tokens (4 steps x 256)" in title
    assert not [p for p in out_dir.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_a_short_run_draws_its_curves_once_at_the_end(
        random_data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The redraws after a validation are paced to a minute; the end always draws."""
    pytest.importorskip("matplotlib")
    import gpt.report.curves as plot

    drawn: list[int] = []
    real = plot.plot_runs
    monkeypatch.setattr(plot, "plot_runs", lambda runs, output, **kw: (
        drawn.append(len(runs[0].series("val", "val_loss")[0])), real(runs, output, **kw))[1])
    out_dir = tmp_path / "r"
    code, out, _ = run([*ARGS, "--max-steps", "4", "--data-dir", str(random_data_dir),
                        "--out-dir", str(out_dir)], capsys)
    assert code == 0 and (out_dir / "curves.png").is_file()
    assert drawn == [3]  # once, with the validations at steps 0, 2 and 4
    assert summary_lines(out)[-1] == f"  curves:   {out_dir / 'curves.png'}"


def test_without_matplotlib_the_start_says_once_how_to_get_the_curves(
        random_data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_curves, "have", lambda module: module != "matplotlib")
    monkeypatch.setattr(run_curves, "MIN_INTERVAL_S", 0.0)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # and were it imported, it fails
    out_dir = tmp_path / "r"
    code, out, err = run([*ARGS, "--max-steps", "4", "--data-dir", str(random_data_dir),
                          "--out-dir", str(out_dir)], capsys)
    assert code == 0 and not (out_dir / "curves.png").exists()
    notes = [line for line in (out + err).splitlines() if "curves.png" in line]
    assert notes == [f'note: no {out_dir / "curves.png"} without matplotlib: pip install -e '
                     f'".[plot]" (python -m gpt.plot {out_dir} draws it from the log at any time)']
    assert not any("warning" in line for line in err.splitlines())


def test_a_figure_that_fails_is_one_warning_and_the_run_goes_on(
        random_data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import gpt.report.curves as plot

    monkeypatch.setattr(run_curves, "have", lambda module: True)
    monkeypatch.setattr(run_curves, "MIN_INTERVAL_S", 0.0)

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plot, "plot_runs", broken)
    out_dir = tmp_path / "r"
    code, out, err = run([*ARGS, "--max-steps", "4", "--data-dir", str(random_data_dir),
                          "--out-dir", str(out_dir)], capsys)
    assert code == 0 and (out_dir / "ckpt_000004.pt").is_file()
    warnings = [line for line in err.splitlines() if "curves.png" in line]
    assert warnings == [f"warning: {out_dir / 'curves.png'}: not drawn (OSError: [Errno 28] No "
                        f"space left on device); training goes on without it (python -m gpt.plot "
                        f"{out_dir} draws it later)"]


def test_a_figure_that_costs_more_is_redrawn_less_often(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """After a validation the figure is redrawn once a minute has passed, or COST_FACTOR
    times its last drawing's time where that is longer (a long log's figure)."""
    drawn: list[float] = []
    monkeypatch.setattr(run_curves.RunCurves, "_drawn", lambda self: drawn.append(self.cost))
    curves = run_curves.RunCurves(tmp_path, enabled=True)
    curves.last = time.monotonic() - 100.0  # drawn 100 s ago
    curves.cost = 10.0  # in 10 s: the next waits 500 s
    curves.after_evaluations()
    assert drawn == []
    curves.cost = 1.0  # in 1 s: the next waits the minute
    curves.after_evaluations()
    assert drawn == [1.0]
