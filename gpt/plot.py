"""Training curves from a run's metrics.jsonl: loss (train and val), learning rate,
tokens/s and HellaSwag accuracy.

    python -m gpt.plot runs/gpt2/metrics.jsonl -o curves.png
    python -m gpt.plot runs/a runs/b -o compare.png          # run folders work too; overlaid

The trainer draws the same figure into its run folder as it goes (gpt/train/run_curves.py).

matplotlib is an optional dependency (the plot extra: ``pip install -e ".[plot]"``); reading the
file (``load_metrics``) needs only the standard library.

metrics.jsonl holds one JSON object per line with a "type": "run" (written at every
start, with "start_step" when resumed), "train" (step, loss, lr, grad_norm, ms,
tokens_per_s, mfu), "val" (step, val_loss), "hellaswag" (step, acc, acc_norm), and others
("sample", "checkpoint") that are not plotted. A resumed run appends to the same file, so
a step can appear more than once: the later record wins. When a "run" record starts a
new segment, the earlier attempt's train records from the resume step on and its
evaluations after that step are dropped (that attempt was superseded from an earlier
checkpoint). A line cut short by a crash is skipped and counted.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from gpt.core.cli import OneLineParser, finite_float
from gpt.core.extras import install
from gpt.core.fileio import atomic_path
from gpt.core.units import human_count

PLOTTED = ("train", "val", "hellaswag")
MATPLOTLIB_HINT = f"{install('plot')} (or pip install matplotlib)"


@dataclass
class RunMetrics:
    """A run's records by type, each keyed by step (the latest record for a step wins)."""

    path: Path
    label: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    records: dict[str, dict[int, dict[str, Any]]] = field(
        default_factory=lambda: {k: {} for k in PLOTTED})
    bad_lines: int = 0

    def series(self, kind: str, key: str) -> tuple[list[int], list[float]]:
        """Sorted (steps, values) of one field, skipping missing and non-finite values."""
        steps, values = [], []
        for step in sorted(self.records.get(kind, {})):
            v = self.records[kind][step].get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                steps.append(step)
                values.append(float(v))
        return steps, values


def run_title(run: RunMetrics) -> str:
    """The run's folder and its recipe, from the newest header record: model, parameters,
    tokens (steps x tokens a step), peak learning rate, optimizer, device."""
    head = run.runs[-1] if run.runs else {}
    cfg = head.get("config")
    if not isinstance(cfg, dict):
        return str(run.path.parent)
    try:
        train, data, optim = cfg["train"], cfg["data"], cfg["optim"]
        steps, batch = int(train["max_steps"]), int(data["total_batch_tokens"])
        parts = [f"{cfg.get('preset') or 'custom'} model"]
        if isinstance(head.get("params"), int):
            parts[0] += f", {human_count(head['params'])} params"
        parts.append(f"{human_count(steps * batch)} tokens ({steps:,} steps x {human_count(batch)})")
        parts.append(f"max lr {float(optim['max_lr']):g}, {optim.get('optimizer', 'adamw')}")
        if head.get("device_name"):
            parts.append(f"{head['device_name']} x {head.get('world_size', 1)}")
    except (KeyError, TypeError, ValueError):  # a header from another version: the folder
        return str(run.path.parent)
    return f"{run.path.parent}: " + "; ".join(parts)


def resolve_path(path: str | Path) -> Path:
    p = Path(path)
    return p / "metrics.jsonl" if p.is_dir() else p


def read_records(path: str | Path) -> tuple[list[dict[str, Any]], int]:
    """(the JSON objects of a JSONL file in order, number of unreadable lines)."""
    records, bad = [], 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(rec, dict):
                records.append(rec)
            else:
                bad += 1
    return records, bad


def _step(rec: dict[str, Any]) -> int | None:
    s = rec.get("step")
    if isinstance(s, bool):
        return None
    if isinstance(s, int):
        return s
    if isinstance(s, float) and s.is_integer():
        return int(s)
    return None


def load_metrics(path: str | Path, label: str | None = None) -> RunMetrics:
    path = resolve_path(path)
    records, bad = read_records(path)
    out = RunMetrics(path=path, label=label or path.parent.name or path.stem, bad_lines=bad)
    # Split at "run" records: each segment is one start (first run or a resume).
    segments: list[list[dict[str, Any]]] = [[]]
    for rec in records:
        if rec.get("type") == "run" and segments[-1]:
            segments.append([])
        segments[-1].append(rec)
    for seg in segments:
        head = seg[0] if seg and seg[0].get("type") == "run" else None
        if head is not None:
            out.runs.append(head)
        steps = [s for r in seg if r.get("type") in PLOTTED and (s := _step(r)) is not None]
        if steps:
            start = head.get("start_step") if head is not None else None
            first = start if isinstance(start, int) and not isinstance(start, bool) else min(steps)
            # Drop what an earlier attempt logged past the resume point: its training steps
            # from `first` on (they are redone), its evaluations after `first` (an
            # evaluation at `first` itself scored the checkpointed weights, still valid).
            for kind, by_step in out.records.items():
                cut = first if kind == "train" else first + 1
                for s in [s for s in by_step if s >= cut]:
                    del by_step[s]
        for r in seg:
            kind, s = r.get("type"), _step(r)
            if kind in PLOTTED and s is not None:
                out.records[kind][s] = r
    return out


# --------------------------------------------------------------------------------------
# Plotting


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


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m gpt.plot", description=__doc__.split("\n\n")[0])
    p.add_argument("metrics", nargs="+", help="metrics.jsonl files or run folders (overlaid)")
    p.add_argument("-o", "--output", default=None,
                   help="image file (default: curves.png next to the first metrics file)")
    p.add_argument("--smooth", type=finite_float(0, 1), default=0.0,
                   help="EMA factor in [0, 1) for the train loss (default: 0, the raw loss)")
    p.add_argument("--log-loss", action="store_true", help="log scale for the loss")
    p.add_argument("--title", default=None,
                   help="the figure's title (default: the run's folder and recipe, for one run)")
    args = p.parse_args(argv)
    if not 0.0 <= args.smooth < 1.0:
        p.error("--smooth must be in [0, 1)")
    runs = []
    for m in args.metrics:
        path = resolve_path(m)
        if not path.is_file():
            print(f"error: {path}: no such file", file=sys.stderr)
            return 2
        run = load_metrics(path)
        if run.bad_lines:
            print(f"note: {path}: skipped {run.bad_lines} unreadable line(s)", file=sys.stderr)
        if not any(run.records.values()):
            print(f"note: {path}: no train/val/hellaswag records", file=sys.stderr)
        runs.append(run)
    try:
        _import_pyplot()
    except ImportError:
        print(f"error: plotting needs matplotlib: {MATPLOTLIB_HINT}", file=sys.stderr)
        return 1
    output = args.output or runs[0].path.parent / "curves.png"
    title = args.title if args.title is not None else run_title(runs[0]) if len(runs) == 1 else None
    out = plot_runs(runs, output, smooth=args.smooth, title=title, log_loss=args.log_loss)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
