"""The training curves' figure from runs' metrics: loss (train and val), learning rate,
tokens/s and, where a run scored them, its evaluations' panels (the caller's Panels:
gpt/eval's, which this layer is below), written atomically (the trainer
redraws its run folder's curves.png as it goes: gpt/train/run_curves.py; `python -m
gpt.plot` is the command). matplotlib is the plot extra's.

A series is drawn with at most POINTS points, however long the run: beyond that, each
stretch of steps keeps its lowest and highest value (a spike stays visible), so a log of a
million steps draws in the time and memory of a short one. A loss that was NaN or
infinite (or beyond 1e30) breaks its line there and is marked (a red x at the top of the panel), never
bridged by a line that makes a diverging run look healthy. The learning rate is the
schedule's at every step where the caller computed it (RunMetrics.lr_schedule: this layer
cannot, the schedule is gpt/optim's), an optimizer's own rates dashed beside it; else the
rate the log sampled at its log steps.

What was measured is shown as such: a series of few points marks each one, and sparse
validations are dots, not joined by lines that would read as measured between them. The
loss axis is zoomed to where the learning goes on when the first steps' fall would
squeeze it into a strip (zoomed_range: the losses above it are marked at its top edge
with their highest value). A resume and a stop are marked where they happened. Runs drawn
together that ran on different setups (device, processes, threads, batch) say so in the
figure's title, and their tokens/s are labelled with their processes and threads."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from gpt.core.extras import install
from gpt.core.fileio import atomic_path
from gpt.report.metrics_reader import RunMetrics, differences, setup


MATPLOTLIB_HINT = f"{install('plot')} (or pip install matplotlib)"
POINTS = 3000  # points a series is drawn with, at most
NONFINITE_COLOR = "red"
MARKED = 200  # a series of at most this many points marks each measured one
JOINED = 20  # validations joined by a line only from this many on (else dots alone)
SQUEEZED = 2.0  # zoom where the whole range is this many times the learning's range
EARLY = 0.1  # the share of a run's steps whose fall the zoomed range leaves out


def _import_pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only; works without a display
    import matplotlib.pyplot as plt

    return plt


def _ema(values: np.ndarray, alpha: float) -> np.ndarray:
    if alpha <= 0 or not len(values):
        return values
    out, acc = np.empty_like(values), float(values[0])
    for i, v in enumerate(values.tolist()):
        acc = alpha * acc + (1 - alpha) * v
        out[i] = acc
    return out


def decimate(steps: Any, values: Any, points: int = POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) to draw for one series, at most `points` of them. Missing values
    (NaN) are left out; a non-finite one (inf: NaN or inf in the log) becomes a NaN, which
    breaks the line there. Beyond `points`, the series is cut into points // 3 stretches
    of steps and each keeps its lowest and highest finite value and its first non-finite
    one, in step order."""
    x = np.asarray(steps, dtype=np.int64)
    y = np.asarray(values, dtype=np.float64)
    keep = ~np.isnan(y)
    x, y = x[keep], y[keep]
    bad = np.isinf(y)
    if len(x) > points:
        buckets = max(1, points // 3)
        size = -(-len(x) // buckets)
        pad = buckets * size - len(x)
        finite = np.pad(~bad, (0, pad)).reshape(buckets, size)
        padded = np.pad(y, (0, pad)).reshape(buckets, size)
        rows = np.arange(buckets)
        low = np.where(finite, padded, np.inf).argmin(axis=1)
        high = np.where(finite, padded, -np.inf).argmax(axis=1)
        has_finite = finite.any(axis=1)
        gap = np.pad(bad, (0, pad)).reshape(buckets, size)
        first_bad = gap.argmax(axis=1)
        picked = np.concatenate([(rows * size + low)[has_finite], (rows * size + high)[has_finite],
                                 (rows * size + first_bad)[gap.any(axis=1)]])
        picked = np.unique(picked)  # sorted: step order
        x, y, bad = x[picked], y[picked], bad[picked]
    return x, np.where(bad, np.nan, y)


def nonfinite_marks(steps: Sequence[int], points: int = POINTS) -> np.ndarray:
    """The steps to mark as non-finite, at most about `points`: the first of each stretch
    of steps where they are more."""
    x = np.asarray(steps, dtype=np.int64)
    if len(x) <= points:
        return x
    width = max(1, -(-(int(x[-1]) - int(x[0]) + 1) // points))
    _, first = np.unique((x - x[0]) // width, return_index=True)
    return x[first]


def plot_runs(runs: Sequence[RunMetrics], output: str | Path, smooth: float = 0.0,
              title: str | None = None, log_loss: bool = False) -> Path:
    """Draw the figure (see draw()) into ``output``, atomically: a viewer or a copy never
    meets half a file (the trainer redraws it as it runs)."""
    plt = _import_pyplot()
    fig = draw(runs, smooth, title, log_loss)
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(out) as tmp:
            # the format from the final name: the temporary one has no image suffix
            fig.savefig(tmp, dpi=120, format=out.suffix.lstrip(".").lower() or "png")
    finally:
        plt.close(fig)
    return out


def _panels(plt: Any, extra: int) -> tuple[Any, list[Any]]:
    """The figure and its panels: loss, learning rate, tokens/s and `extra` more (the
    evaluations'), two a row; with none, the loss across the top and the other two below."""
    if not extra:
        fig = plt.figure(figsize=(12, 8))
        grid = fig.add_gridspec(2, 2)
        return fig, [fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0]),
                     fig.add_subplot(grid[1, 1])]
    rows = -(-(3 + extra) // 2)
    fig = plt.figure(figsize=(12, 4 * rows))
    grid = fig.add_gridspec(rows, 2)
    return fig, [fig.add_subplot(grid[i // 2, i % 2]) for i in range(3 + extra)]


def draw(runs: Sequence[RunMetrics], smooth: float = 0.0, title: str | None = None,
         log_loss: bool = False) -> Any:
    """The figure: loss, learning rate, tokens/s, and each evaluation's panel (the runs'
    Panels) where a run scored it."""
    plt = _import_pyplot()
    panels = list({p.record: p for run in runs for p in run.panels
                   if run.steps(p.record)}.values())
    fig, axes = _panels(plt, len(panels))
    ax_loss, ax_lr, ax_tok = axes[:3]
    many = len(runs) > 1
    differ = differences(list(runs)) if many else []
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", [None])
    for i, run in enumerate(runs):
        c = colors[i % len(colors)]
        name = f"{run.label} " if many else ""
        _draw_loss(ax_loss, run, c, name, smooth)
        _draw_lr(ax_lr, run, c, many)
        x, y = decimate(*run.column("train", "tokens_per_s"))
        if len(x):
            facts = setup(run)
            tok_label = (f"{run.label} (processes {facts['processes']}, threads "
                         f"{facts['threads']})" if differ else run.label) if many else None
            ax_tok.plot(x, y, color=c, label=tok_label, **_marks(len(x)))
        for ax in axes:
            _draw_events(ax, run, c, ax is ax_loss)
        for ax, panel in zip(axes[3:], panels):
            for j, (key, word) in enumerate(panel.lines):
                x, y = decimate(*run.column(panel.record, key))
                if len(x):
                    ax.plot(x, y, color=c, label=f"{name}{word}",
                            **({"marker": "o", "markersize": 3} if j == 0 else {"linestyle": ":"}))
    ax_loss.set_title("loss")
    ax_loss.set_ylabel("loss (nats / token)")
    if log_loss:
        ax_loss.set_yscale("log")
    else:
        _zoom(ax_loss, runs, colors)
    ax_lr.set_title("learning rate")
    ax_lr.set_ylabel("learning rate")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax_tok.set_title("tokens / s")
    ax_tok.set_ylabel("tokens / s")
    for ax, panel in zip(axes[3:], panels):
        ax.set_title(panel.title)
        ax.set_ylabel(panel.ylabel)
    for ax in fig.axes:
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
        elif not ax.lines:
            ax.text(0.5, 0.5, "no records", ha="center", va="center", transform=ax.transAxes,
                    color="gray")
    if differ:  # tokens/s of different setups side by side: say what differs
        shown = differ[:6] + ([f"... and {len(differ) - 6} more"] if len(differ) > 6 else [])
        title = "\n".join(filter(None, [title, "these runs differ in their setup "
                                               "(tokens/s are whole runs'):", *shown]))
    if title:
        fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    return fig


def _marks(points: int) -> dict[str, Any]:
    """A series' style: each measured point marked where they are few."""
    return {"marker": "o", "markersize": 2.5} if points <= MARKED else {}


def zoomed_range(runs: Sequence[RunMetrics]) -> tuple[float, float, float] | None:
    """(bottom, top, highest) of the loss axis where the first steps' fall would squeeze
    the rest into a strip: the top is the highest loss after the first EARLY of each run's
    steps, the highest is the highest loss drawn; None where no zoom is needed."""
    values, later = [], []
    for run in runs:
        for kind, key in (("train", "loss"), ("val", "val_loss")):
            steps, v = run.series(kind, key)
            if not steps:
                continue
            first, last = steps[0], steps[-1]
            cut = first + EARLY * (last - first)
            values += v
            later += [y for x, y in zip(steps, v) if x > cut]
    if not values or not later:
        return None
    bottom, top, highest = min(values), max(later), max(values)
    if highest - bottom <= SQUEEZED * max(top - bottom, 1e-12):
        return None
    return bottom, top, highest


def _zoom(ax: Any, runs: Sequence[RunMetrics], colors: Sequence[Any]) -> None:
    """The zoomed loss axis (zoomed_range), each loss above it a mark on its top edge."""
    from matplotlib.transforms import blended_transform_factory

    zoom = zoomed_range(runs)
    if zoom is None:
        return
    bottom, top, highest = zoom
    pad = 0.05 * (top - bottom) or 0.05 * abs(top) or 0.05
    ax.set_ylim(bottom - pad, top + pad)
    at_top = blended_transform_factory(ax.transData, ax.transAxes)
    for i, run in enumerate(runs):
        above = sorted({x for kind, key in (("train", "loss"), ("val", "val_loss"))
                        for x, y in zip(*run.series(kind, key)) if y > top + pad})
        if above:
            marks = nonfinite_marks(above)
            ax.plot(marks, np.full(len(marks), 0.985), transform=at_top, linestyle="none",
                    marker="^", markersize=4, color=colors[i % len(colors)], clip_on=False)
    ax.annotate(f"^ above the axis: the first steps' losses, up to {highest:.4g}",
                xy=(0.01, 0.93), xycoords="axes fraction", va="top", fontsize="small",
                color="gray")


def _draw_events(ax: Any, run: RunMetrics, c: Any, labelled: bool) -> None:
    """Each resume and stop of the run as a dotted vertical line, named on the loss panel."""
    from matplotlib.transforms import blended_transform_factory

    named: dict[int, list[str]] = {}
    for step, what in run.events[:POINTS]:  # a stop and its resume at one step: one line
        named.setdefault(step, []).append(what)
    for step, whats in named.items():
        what = ", then ".join(whats)
        ax.axvline(step, color=c, linestyle=":", linewidth=0.9, alpha=0.7)
        if labelled:
            ax.text(step, 0.02, f" {what}", rotation=90, va="bottom", ha="right",
                    fontsize="x-small", color=c,
                    transform=blended_transform_factory(ax.transData, ax.transAxes))


def _draw_loss(ax: Any, run: RunMetrics, c: Any, name: str, smooth: float) -> None:
    steps, loss = run.column("train", "loss")
    x, y = decimate(steps, loss)
    if len(x):
        if smooth > 0:
            s, v = run.series("train", "loss")  # the average over finite values only
            ax.plot(x, y, color=c, alpha=0.25, linewidth=0.8)
            ax.plot(*decimate(s, _ema(np.asarray(v), smooth)), color=c,
                    label=f"{name}train (EMA {smooth:g})")
        else:
            ax.plot(x, y, color=c, linewidth=1.0, label=f"{name}train", **_marks(len(x)))
    x, y = decimate(*run.column("val", "val_loss"))
    if len(x):  # measured at its dots: joined only where they are dense enough to be a curve
        ax.plot(x, y, color=c, linestyle="--" if len(x) >= JOINED else "none", marker="o",
                markersize=4, label=f"{name}val")
    bad = sorted({*run.nonfinite("train", "loss"), *run.nonfinite("val", "val_loss")})
    if bad:
        from matplotlib.transforms import blended_transform_factory

        marks = nonfinite_marks(bad)
        at_top = blended_transform_factory(ax.transData, ax.transAxes)
        ax.plot(marks, np.full(len(marks), 0.97), transform=at_top, linestyle="none",
                marker="x", color=NONFINITE_COLOR,
                label=f"{name}NaN, inf or over 1e30 loss ({len(bad):,} step{'s' if len(bad) > 1 else ''})")


def _draw_lr(ax: Any, run: RunMetrics, c: Any, many: bool) -> None:
    if run.lr_schedule:
        several = len(run.lr_schedule) > 1  # the schedule's, and an optimizer's own beside it
        for i, (key, (steps, values)) in enumerate(run.lr_schedule.items()):
            which = run.lr_labels.get(key, key) if several else None
            label = " ".join(filter(None, [run.label if many else None, which])) or None
            ax.plot(steps, values, color=c, linestyle="-" if i == 0 else "--", label=label)
        return
    x, y = decimate(*run.column("train", "lr"))
    if len(x):
        ax.plot(x, y, color=c, label=run.label if many else None)
