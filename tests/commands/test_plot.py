"""Tests for gpt.plot: reading metrics.jsonl (needs no matplotlib) and drawing (skipped
when matplotlib is not installed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpt.plot import main
from gpt.report.curves import MATPLOTLIB_HINT
from gpt.eval.evaluations import panels  # the evaluations' records the figure keeps
from gpt.report.metrics_reader import load_metrics

from helpers import error_line, listing, read_only_folder


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


def test_plot_smoothing_is_finite(capsys) -> None:
    from gpt.plot import main as plot_main
    with pytest.raises(SystemExit):
        plot_main(["metrics.jsonl", "--smooth", "nan"])
    assert "--smooth" in error_line(capsys.readouterr().err)


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
        assert list(lines["NaN, inf or over 1e30 loss (3 steps)"].get_xdata()) == [2, 3, 5]
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
        marks = list(lines["NaN, inf or over 1e30 loss (100 steps)"].get_xdata())
        assert marks and all(40_000 <= m < 40_100 for m in marks)
    finally:
        plt.close(fig)


def test_the_plot_command_needs_no_torch() -> None:
    """Reading a log and computing its schedule import no torch (seconds and half a GB)."""
    proc = subprocess.run([sys.executable, "-c", "import sys, gpt.plot; "
                           "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr


# ---------------------------------------------------------------------------------------
# what was measured, the learning made visible, resumes and stops, runs that differ


def _figure(runs: list, **kw: object):
    pytest.importorskip("matplotlib")
    from gpt.report.curves import draw

    return draw(runs, **kw)


def _close(fig) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def first_run_like(tmp_path: Path, name: str = "metrics.jsonl", val_every: int = 50,
                   **head: object) -> Path:
    """The README's first run's shape: 150 steps logged every 10, the loss falling from
    10.8 to about 5 in its first 20 steps, validation every 50."""
    records: list[dict] = [{"type": "run", "start_step": 0, **head}]
    for s in [*range(0, 150, 10), 149]:
        records.append(train(s, 10.8 if s == 0 else 7.6 if s == 10 else 6.0 - s / 150))
    records += [{"type": "val", "step": s, "val_loss": 10.8 if s == 0 else 6.1 - s / 150}
                for s in range(0, 151, val_every)]
    return write_jsonl(tmp_path / name, records)


def test_measured_points_are_marked_and_sparse_validations_not_joined(tmp_path: Path) -> None:
    """Four validations in 150 steps are dots: a line from step 0 to step 50 would read as
    measured between them (above the train curve); validations every 5 steps are a
    curve. The 16 logged train points are each marked."""
    fig = _figure([load_metrics(first_run_like(tmp_path))])
    try:
        lines = {line.get_label(): line for line in fig.axes[0].lines}
        assert lines["val"].get_linestyle() == "None" and lines["val"].get_marker() == "o"
        assert lines["train"].get_marker() == "o" and len(lines["train"].get_xdata()) == 16
    finally:
        _close(fig)
    fig = _figure([load_metrics(first_run_like(tmp_path, "dense.jsonl", val_every=5))])
    try:
        lines = {line.get_label(): line for line in fig.axes[0].lines}
        assert lines["val"].get_linestyle() == "--"
    finally:
        _close(fig)


def test_the_loss_axis_shows_the_learning_not_the_first_steps_fall(tmp_path: Path) -> None:
    """From 10.8 to 5 in 20 steps, then 6 to 5 over 130: the axis is zoomed to the later
    part, the first steps' losses marked at its top with their highest value; a run
    without such a fall keeps its whole range."""
    from gpt.report.curves import zoomed_range

    run = load_metrics(first_run_like(tmp_path))
    bottom, top, highest = zoomed_range([run])
    assert highest == 10.8 and top < 6.1 and bottom == pytest.approx(6.0 - 149 / 150)
    fig = _figure([run])
    try:
        ax = fig.axes[0]
        assert ax.get_ylim()[1] < 6.5 and ax.get_ylim()[0] < bottom
        above = [line for line in ax.lines if line.get_marker() == "^"]
        assert len(above) == 1 and list(above[0].get_xdata()) == [0, 10]
        assert any("up to 10.8" in t.get_text() for t in ax.texts)
    finally:
        _close(fig)
    flat = load_metrics(write_jsonl(tmp_path / "flat.jsonl",
                                    [train(s, 6.0 - s / 100) for s in range(0, 100, 10)]))
    assert zoomed_range([flat]) is None
    fig = _figure([flat], log_loss=True)  # --log-loss: the whole range, on a log axis
    try:
        assert fig.axes[0].get_yscale() == "log"
    finally:
        _close(fig)


def test_resumes_and_stops_are_marked_where_they_happened(tmp_path: Path) -> None:
    """A stop at step 100 (--stop-at-step), then a resume there: one dotted line at 100,
    named; a stop whose steps a resume from an earlier checkpoint superseded is not."""
    path = write_jsonl(tmp_path / "metrics.jsonl", [
        {"type": "run", "start_step": 0}, *(train(s, 5.0) for s in range(0, 130, 10)),
        {"type": "summary", "step": 120, "stopped_by": "SIGTERM"},
        {"type": "run", "start_step": 100}, *(train(s, 4.0) for s in range(100, 110, 10)),
        {"type": "summary", "step": 110, "stopped_by": "--stop-at-step 110"},
        {"type": "run", "start_step": 110}, *(train(s, 3.0) for s in range(110, 150, 10)),
        {"type": "summary", "step": 150, "stopped_by": None}])
    run = load_metrics(path)
    assert run.events == [(100, "resumed"), (110, "stopped (--stop-at-step 110)"),
                          (110, "resumed")]
    fig = _figure([run])
    try:
        texts = [t.get_text() for t in fig.axes[0].texts]
        assert " resumed" in texts and " stopped (--stop-at-step 110), then resumed" in texts
        for ax in fig.axes:  # every panel: the same steps
            drawn = sorted(line.get_xdata()[0] for line in ax.lines
                           if line.get_linestyle() == ":")
            assert drawn == [100, 110]
    finally:
        _close(fig)


def test_compared_runs_say_in_the_figure_what_differs_between_them(tmp_path: Path) -> None:
    """A single process of 2 threads beside 2 ranks of 1 thread each: the title says
    what differs (processes, threads, batch; not the device, which they share), and
    each tokens/s curve names its processes and threads. Runs alike say nothing."""
    from gpt.report.metrics_reader import differences

    def head(world: int, threads: int, accum: int) -> dict:
        return {"device_name": "AMD EPYC", "world_size": world, "threads": threads,
                "grad_accum": accum, "config": {"data": {"batch_size": 8, "seq_len": 128,
                                                         "total_batch_tokens": 2048}}}

    one = load_metrics(first_run_like(tmp_path, "one.jsonl", **head(1, 2, 2)), label="one")
    two = load_metrics(first_run_like(tmp_path, "two.jsonl", **head(2, 1, 1)), label="two")
    assert differences([one, two]) == [
        "one: processes 1, threads 2, batch 8 x 128 x 2 accum, 2.05k tokens/step",
        "two: processes 2, threads 1 each, batch 8 x 128 x 1 accum, 2.05k tokens/step"]
    fig = _figure([one, two])
    try:
        title = fig._suptitle.get_text()
        assert "these runs differ in their setup" in title and "two: processes 2" in title
        tok = next(ax for ax in fig.axes if ax.get_title() == "tokens / s")
        assert [line.get_label() for line in tok.lines] == [
            "one (processes 1, threads 2)", "two (processes 2, threads 1 each)"]
    finally:
        _close(fig)
    assert differences([one, one]) == []


def test_a_run_records_its_threads_for_the_comparison(four_step_run: Path) -> None:
    import torch

    header = json.loads((four_step_run / "metrics.jsonl").read_text().splitlines()[0])
    assert header["type"] == "run" and isinstance(header["threads"], int)
    assert 1 <= header["threads"] <= max(torch.get_num_threads(), os.cpu_count() or 1)


@pytest.mark.parametrize("case", ["huge", "step", "deep"])
def test_hostile_logs_are_drawn_never_a_traceback(tmp_path: Path, case: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Losses of 1e308 (beyond what an axis can span: drawn as non-finite marks), a step
    of 2**63 (beyond an int64: the record skipped and counted), a record nested 100,000
    lists deep (past the parser's depth: skipped and counted)."""
    pytest.importorskip("matplotlib")
    lines = [json.dumps(train(0, 5.0)), json.dumps(train(1, 4.0))]
    if case == "huge":
        lines += [json.dumps(train(s, 1e308, tokens_per_s=1e308)) for s in (2, 3)]
        lines += [json.dumps({"type": "val", "step": 3, "val_loss": -1e308})]
    elif case == "step":
        lines += [json.dumps(train(2**63, 3.0)), json.dumps({"type": "run", "start_step": 2**70}),
                  json.dumps({"type": "summary", "step": 2**64, "stopped_by": "SIGTERM"})]
    else:
        lines += ["[" * 100_000 + "]" * 100_000,
                  '{"type": "train", "step": 2, "loss": ' + "[" * 100_000 + "]" * 100_000 + "}"]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert main([str(path), "-o", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    run = load_metrics(path)
    if case == "huge":
        assert run.nonfinite("train", "loss") == [2, 3] and run.nonfinite("val", "val_loss") == [3]
    else:
        assert run.bad_lines == (1 if case == "step" else 2)
        assert "unreadable line(s)" in capsys.readouterr().err
    assert run.series("train", "loss")[0][:2] == [0, 1]


def test_an_unreadable_log_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from gpt.report import metrics_reader

    path = write_jsonl(tmp_path / "metrics.jsonl", [train(0, 1.0)])

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(metrics_reader, "open", denied, raising=False)  # root reads anything
    assert main([str(path), "-o", str(tmp_path / "c.png")]) == 2
    assert capsys.readouterr().err == f"error: {path}: cannot read it (Permission denied)\n"
    assert not (tmp_path / "c.png").exists()
