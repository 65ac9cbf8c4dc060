"""The training curves' figure from runs' metrics: loss (train and val), learning rate,
tokens/s and HellaSwag accuracy, written atomically (the trainer redraws its run folder's
curves.png as it goes: gpt/train/run_curves.py; `python -m gpt.plot` is the command).
matplotlib is the plot extra's."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from gpt.core.extras import install
from gpt.core.fileio import atomic_path
from gpt.report.metrics_reader import RunMetrics


MATPLOTLIB_HINT = f"{install('plot')} (or pip install matplotlib)"


def _import_pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only; works without a display
    import matplotlib.pyplot as plt

    return plt


def _ema(values: list[float], alpha: float) -> list[float]:
    if alpha <= 0 or not values:
        return values
    out, acc = [], values[0]
    for v in values:
        acc = alpha * acc + (1 - alpha) * v
        out.append(acc)
    return out


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


def draw(runs: Sequence[RunMetrics], smooth: float = 0.0, title: str | None = None,
         log_loss: bool = False) -> Any:
    """The 2 x 2 figure: loss, learning rate, tokens/s and HellaSwag, the last left out
    when no run scored it."""
    plt = _import_pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ax_loss, ax_lr, ax_tok, ax_hs = axes.flat
    many = len(runs) > 1
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", [None])
    for i, run in enumerate(runs):
        c = colors[i % len(colors)]
        name = f"{run.label} " if many else ""
        steps, loss = run.series("train", "loss")
        if steps:
            if smooth > 0:
                ax_loss.plot(steps, loss, color=c, alpha=0.25, linewidth=0.8)
                ax_loss.plot(steps, _ema(loss, smooth), color=c, label=f"{name}train (EMA {smooth:g})")
            else:
                ax_loss.plot(steps, loss, color=c, linewidth=1.0, label=f"{name}train")
        steps, val = run.series("val", "val_loss")
        if steps:
            ax_loss.plot(steps, val, color=c, linestyle="--", marker="o", markersize=3,
                         label=f"{name}val")
        steps, lr = run.series("train", "lr")
        if steps:
            ax_lr.plot(steps, lr, color=c, label=run.label if many else None)
        steps, tok = run.series("train", "tokens_per_s")
        if steps:
            ax_tok.plot(steps, tok, color=c, label=run.label if many else None)
        steps, acc_norm = run.series("hellaswag", "acc_norm")
        if steps:
            ax_hs.plot(steps, acc_norm, color=c, marker="o", markersize=3, label=f"{name}acc_norm")
        steps, acc = run.series("hellaswag", "acc")
        if steps:
            ax_hs.plot(steps, acc, color=c, linestyle=":", label=f"{name}acc")
    ax_loss.set_title("loss")
    if log_loss:
        ax_loss.set_yscale("log")
    ax_lr.set_title("learning rate")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax_tok.set_title("tokens / s")
    ax_hs.set_title("HellaSwag accuracy")
    if not ax_hs.lines:  # no run scored it (--hellaswag-every 0): nothing to show
        fig.delaxes(ax_hs)
    for ax in fig.axes:
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
        elif not ax.lines:
            ax.text(0.5, 0.5, "no records", ha="center", va="center", transform=ax.transAxes,
                    color="gray")
    if title:
        fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    return fig
