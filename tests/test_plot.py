"""Tests for gpt.plot: reading metrics.jsonl (needs no matplotlib) and drawing (skipped
when matplotlib is not installed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpt.plot import main
from gpt.report.curves import MATPLOTLIB_HINT
from gpt.eval.evaluations import panels  # the evaluations' records the figure keeps
from gpt.report.metrics_reader import load_metrics


def write_jsonl(path: Path, records: list[dict], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")
    return path


def train(step: int, loss: float, **extra: object) -> dict:
    return {"type": "train", "step": step, "loss": loss, "lr": 1e-3, "grad_norm": 1.0,
            "ms": 10.0, "tokens_per_s": 1000.0 + step, "mfu": None, **extra}


def test_series_by_type(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "metrics.jsonl", [
        {"type": "run", "config": {}, "device": "cpu"},
        {"type": "val", "step": 0, "val_loss": 11.0},
        train(0, 10.9), train(1, 9.5), train(2, 8.0),
        {"type": "sample", "step": 2, "samples": ["hi"]},
        {"type": "hellaswag", "step": 2, "acc": 0.25, "acc_norm": 0.26},
        {"type": "val", "step": 2, "val_loss": 8.5},
        {"type": "checkpoint", "step": 3, "path": "ckpt_000003.pt"},
    ])
    run = load_metrics(path, panels=panels())
    assert run.series("train", "loss") == ([0, 1, 2], [10.9, 9.5, 8.0])
    assert run.series("train", "tokens_per_s") == ([0, 1, 2], [1000.0, 1001.0, 1002.0])
    assert run.series("val", "val_loss") == ([0, 2], [11.0, 8.5])
    assert run.series("hellaswag", "acc_norm") == ([2], [0.26])
    assert run.series("hellaswag", "acc") == ([2], [0.25])
    assert run.series("train", "mfu") == ([], [])  # None values are skipped
    assert len(run.runs) == 1 and run.bad_lines == 0
    assert load_metrics(tmp_path).series("train", "loss")[0] == [0, 1, 2]  # a run folder works


def test_later_record_wins(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", [
        train(0, 10.0), train(1, 9.0), train(2, 8.0),
        {"type": "val", "step": 2, "val_loss": 8.8},
        train(1, 9.1), train(2, 7.9),  # the same steps again: the later records win
        {"type": "val", "step": 2, "val_loss": 8.7},
    ])
    run = load_metrics(path)
    assert run.series("train", "loss") == ([0, 1, 2], [10.0, 9.1, 7.9])
    assert run.series("val", "val_loss") == ([2], [8.7])


def test_resumed_run_replaces_the_superseded_attempt(tmp_path: Path) -> None:
    """Attempt 1 ran to step 6 with a checkpoint at 4; attempt 2 resumed from 4 and ran
    to 5 (so far): attempt 1's steps 4-6 are gone, its evaluation at step 4 stays."""
    path = write_jsonl(tmp_path / "m.jsonl", [
        {"type": "run", "start_step": 0},
        *(train(s, 10.0 - s) for s in range(7)),
        {"type": "val", "step": 4, "val_loss": 6.5},
        {"type": "hellaswag", "step": 4, "acc": 0.3, "acc_norm": 0.31},
        {"type": "val", "step": 6, "val_loss": 4.5},
        {"type": "run", "start_step": 4, "resumed_from": "ckpt_000004.pt"},
        train(4, 5.5), train(5, 4.4),
    ])
    run = load_metrics(path, panels=panels())
    assert run.series("train", "loss") == ([0, 1, 2, 3, 4, 5], [10.0, 9.0, 8.0, 7.0, 5.5, 4.4])
    assert run.series("val", "val_loss") == ([4], [6.5])
    assert run.series("hellaswag", "acc_norm") == ([4], [0.31])
    assert len(run.runs) == 2


def test_unreadable_lines_are_skipped(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", [train(0, 3.0), train(1, float("nan"))],
                       tail='[1, 2]\n{"type": "train", "st')  # a crash mid-line
    run = load_metrics(path)
    assert run.bad_lines == 2
    assert run.series("train", "loss") == ([0], [3.0])  # NaN skipped


def test_main_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = write_jsonl(tmp_path / "metrics.jsonl", [train(0, 1.0)])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert main([str(path), "-o", str(tmp_path / "c.png")]) == 1
    err = capsys.readouterr().err
    assert MATPLOTLIB_HINT in err and "pip install matplotlib" in err
    assert not (tmp_path / "c.png").exists()


def test_main_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_plot_writes_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    records = [{"type": "run"}]
    for s in range(0, 50, 5):
        records.append(train(s, 10.0 / (s + 1)))
        if s % 20 == 0:
            records.append({"type": "val", "step": s, "val_loss": 10.5 / (s + 1)})
            records.append({"type": "hellaswag", "step": s, "acc": 0.25, "acc_norm": 0.26})
    a = write_jsonl(tmp_path / "a.jsonl", records)
    b = write_jsonl(tmp_path / "b.jsonl", records[:5])  # no HellaSwag yet
    out = tmp_path / "plots" / "curves.png"
    assert main([str(a), str(b), "-o", str(out), "--smooth", "0.6", "--title", "t"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([str(b)]) == 0  # default output: next to the metrics file
    assert (tmp_path / "curves.png").exists()


def test_a_run_without_hellaswag_has_no_empty_panel_and_the_title_names_the_run(
        tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from gpt.report.curves import draw
    from gpt.report.metrics_reader import run_title

    head = {"type": "run", "params": 3_327_744, "device_name": "AMD EPYC", "world_size": 1,
            "config": {"preset": "tiny", "train": {"max_steps": 150},
                       "data": {"total_batch_tokens": 2048},
                       "optim": {"max_lr": 3e-3, "optimizer": "adamw"}}}
    run = load_metrics(write_jsonl(tmp_path / "metrics.jsonl", [
        head, train(0, 10.8), train(1, 9.0), {"type": "val", "step": 1, "val_loss": 9.5}]))
    title = run_title(run)
    assert title == (f"{tmp_path}: tiny model, 3.33M params; 307.20k tokens (150 steps x "
                     f"2.05k); max lr 0.003, adamw; AMD EPYC x 1")
    fig = draw([run], title=title)
    try:
        assert [ax.get_title() for ax in fig.axes] == ["loss", "learning rate", "tokens / s"]
        assert fig._suptitle.get_text() == title
        # no empty quarter: the loss across the top, the other two below it
        (loss, lr, tok) = (ax.get_position() for ax in fig.axes)
        assert loss.width > 2 * lr.width and loss.y0 > lr.y1 and lr.y0 == tok.y0
        assert [ax.get_ylabel() for ax in fig.axes] == ["loss (nats / token)", "learning rate",
                                                        "tokens / s"]
    finally:
        plt.close(fig)
    run = load_metrics(write_jsonl(tmp_path / "metrics.jsonl", [
        head, train(0, 10.8), train(1, 9.0), {"type": "val", "step": 1, "val_loss": 9.5},
        {"type": "hellaswag", "step": 1, "acc": 0.25, "acc_norm": 0.25}]), panels=panels())
    fig = draw([run])
    try:
        assert fig.axes[-1].get_title() == "HellaSwag accuracy" and len(fig.axes) == 4
        assert fig.axes[-1].get_ylabel() == "accuracy"
        assert len({round(ax.get_position().width, 3) for ax in fig.axes}) == 1  # a 2 x 2 grid
    finally:
        plt.close(fig)
    # a header from elsewhere (no config) still gives the folder
    assert run_title(load_metrics(write_jsonl(tmp_path / "m2.jsonl", [train(0, 1.0)]))) == str(tmp_path)


# ---------------------------------------------------------------------------------------
# the learning rate as the schedule set it, non-finite losses, long logs


def header(max_steps: int, **optim: object) -> dict:
    """A run record as the trainer writes it: the config (sections it leaves out take
    their defaults), the step it started at."""
    return {"type": "run", "start_step": optim.pop("start_step", 0),
            "config": {"preset": "tiny", "train": {"max_steps": max_steps},
                       "optim": {"max_lr": 3e-3, "warmup_steps": 5, **optim}}}


def test_the_learning_rate_is_the_schedules_at_every_step(tmp_path: Path) -> None:
    """A 30-step cosine logged every 10 steps: the log holds 4 of its rates (a triangle,
    drawn through them); the figure gets all 30, as the trainer set them."""
    from gpt.core.cli import parse_args
    from gpt.optim.schedule import Schedule
    from gpt.train.run_curves import read_run

    path = write_jsonl(tmp_path / "metrics.jsonl", [header(30), *(train(s, 5.0) for s in
                                                                  (0, 10, 20, 29))])
    run = read_run(path)
    cfg = parse_args(["--model", "tiny", "--max-steps", "30", "--max-lr", "3e-3",
                      "--warmup-steps", "5"])
    steps, lrs = run.lr_schedule["lr"]
    assert steps == list(range(30)) and set(run.lr_schedule) == {"lr"}
    assert lrs == [Schedule(cfg.optim, 30).lr(s) for s in steps]
    # a resume with a longer --max-steps: its steps follow the new schedule
    write_jsonl(path, [header(30), *(train(s, 5.0) for s in range(0, 20)),
                       header(60, start_step=10), *(train(s, 5.0) for s in range(10, 40))])
    steps, lrs = read_run(path).lr_schedule["lr"]
    assert steps == list(range(40))
    assert lrs[:10] == [Schedule(cfg.optim, 30).lr(s) for s in range(10)]
    assert lrs[10:] == [Schedule(cfg.optim, 60).lr(s) for s in range(10, 40)]
    # a log from elsewhere (no config): the rates it logged
    assert read_run(write_jsonl(tmp_path / "bare.jsonl", [train(0, 1.0)])).lr_schedule is None


def test_a_long_run_s_schedule_keeps_its_corners(tmp_path: Path) -> None:
    from gpt.optim.schedule import CURVE_POINTS
    from gpt.train.run_curves import read_run

    run = read_run(write_jsonl(tmp_path / "m.jsonl", [
        header(100_000, warmup_steps=700, lr_schedule="trapezoid"), train(99_999, 3.0)]))
    steps, lrs = run.lr_schedule["lr"]
    assert len(steps) <= CURVE_POINTS + 10 and steps[0] == 0 and steps[-1] == 99_999
    assert {699, 700, 59_999, 60_000} <= set(steps)  # the warm-up's end, the cooldown's start
    assert max(lrs) == 3e-3 == lrs[steps.index(700)] == lrs[steps.index(59_999)]


def test_muons_learning_rate_is_drawn_beside_adamws(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from gpt.report.curves import draw
    from gpt.train.run_curves import read_run

    run = read_run(write_jsonl(tmp_path / "metrics.jsonl", [
        header(20, optimizer="muon", muon_lr=0.02), *(train(s, 5.0) for s in (0, 5, 10, 15, 19))]))
    (steps, lrs), (muon_steps, muon) = run.lr_schedule["lr"], run.lr_schedule["muon_lr"]
    assert muon_steps == steps == list(range(20))
    assert muon == [lr * (0.02 / 3e-3) for lr in lrs]  # as the step sets it: x its lr_ratio
    fig = draw([run])
    try:
        ax = next(ax for ax in fig.axes if ax.get_title() == "learning rate")
        lines = {line.get_label(): line for line in ax.lines}
        assert set(lines) == {"AdamW", "Muon"}
        assert list(lines["Muon"].get_ydata()) == muon and len(lines["AdamW"].get_xdata()) == 20
    finally:
        plt.close(fig)


def test_a_nan_or_inf_loss_is_marked_not_bridged(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import math

    import matplotlib.pyplot as plt

    from gpt.report.curves import draw

    losses = [5.0, 4.5, float("nan"), float("inf"), 4.0, 3.9]
    run = load_metrics(write_jsonl(tmp_path / "m.jsonl", [
        *(train(s, v) for s, v in enumerate(losses)),
        {"type": "val", "step": 5, "val_loss": float("nan")}]))
    assert run.nonfinite("train", "loss") == [2, 3] and run.nonfinite("val", "val_loss") == [5]
    assert run.series("train", "loss") == ([0, 1, 4, 5], [5.0, 4.5, 4.0, 3.9])  # finite only
    fig = draw([run])
    try:
        lines = {line.get_label(): line for line in fig.axes[0].lines}
        y = list(lines["train"].get_ydata())
        assert y[:2] == [5.0, 4.5] and all(math.isnan(v) for v in y[2:4]) and y[4:] == [4.0, 3.9]
        assert list(lines["NaN or inf loss (3 steps)"].get_xdata()) == [2, 3, 5]
    finally:
        plt.close(fig)


def test_a_long_log_is_drawn_with_a_bounded_number_of_points(tmp_path: Path) -> None:
    """A log of 60,000 steps with a spike and a stretch of NaN losses: each series is drawn
    with at most POINTS points, and the spike and the NaNs are still there."""
    pytest.importorskip("matplotlib")
    import math

    import matplotlib.pyplot as plt

    from gpt.report.curves import POINTS, draw

    n = 60_000
    with open(tmp_path / "metrics.jsonl", "w", encoding="utf-8") as fh:
        for s in range(n):
            loss = 50.0 if s == 31_337 else float("nan") if 40_000 <= s < 40_100 else 4.0 - s / n
            fh.write(json.dumps({"type": "train", "step": s, "loss": loss, "lr": 1e-3,
                                 "tokens_per_s": 1000.0 + s % 7}) + "\n")
    run = load_metrics(tmp_path / "metrics.jsonl")
    assert len(run.steps("train")) == n
    fig = draw([run])
    try:
        drawn = [line for ax in fig.axes for line in ax.lines]
        assert drawn and all(len(line.get_xdata()) <= POINTS for line in drawn)
        lines = {line.get_label(): line for line in fig.axes[0].lines}
        y = list(lines["train"].get_ydata())
        assert max(v for v in y if not math.isnan(v)) == 50.0  # the spike
        assert any(math.isnan(v) for v in y)  # the line breaks at the NaNs
        marks = list(lines["NaN or inf loss (100 steps)"].get_xdata())
        assert marks and all(40_000 <= m < 40_100 for m in marks)
    finally:
        plt.close(fig)


def test_the_plot_command_needs_no_torch() -> None:
    """Reading a log and computing its schedule import no torch (seconds and half a GB)."""
    proc = subprocess.run([sys.executable, "-c", "import sys, gpt.plot; "
                           "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr
