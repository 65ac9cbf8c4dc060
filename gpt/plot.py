"""Training curves from a run's metrics.jsonl: loss (train and val), learning rate,
tokens/s and HellaSwag accuracy.

    python -m gpt.plot runs/gpt2/metrics.jsonl -o curves.png
    python -m gpt.plot runs/a runs/b -o compare.png          # run folders work too; overlaid

The command; the figure is gpt/report/curves.py's and the reading of the log
gpt/report/metrics_reader.py's. The trainer draws the same figure into its run folder as
it goes (gpt/train/run_curves.py).

matplotlib is an optional dependency (the plot extra: ``pip install -e ".[plot]"``); reading the
file (``load_metrics``) needs only the standard library.

metrics.jsonl holds one JSON object per line with a "type": "run" (written at every
start, with "start_step" when resumed), "train" (step, loss, lr, grad_norm, ms,
tokens_per_s, mfu), "val" (step, val_loss), "hellaswag" (step, acc, acc_norm), and others
("sample", "checkpoint") that are not plotted. A resumed run appends to the same file, so
a step can appear more than once: the later record wins. When a "run" record starts a
new segment, the earlier attempt's train records from the resume step on and its
evaluations after that step are dropped (that attempt was superseded from an earlier
checkpoint). A line cut short by a crash is skipped and counted."""

from __future__ import annotations

import sys

from gpt.core.cli import OneLineParser, finite_float
from gpt.report.curves import MATPLOTLIB_HINT, _import_pyplot, plot_runs
from gpt.report.metrics_reader import load_metrics, resolve_path, run_title


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
