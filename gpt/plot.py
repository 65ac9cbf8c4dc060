"""Training curves from a run's metrics.jsonl: loss (train and val), learning rate,
tokens/s and the evaluations' scores.

    python -m gpt.plot runs/gpt2/metrics.jsonl -o curves.png
    python -m gpt.plot runs/a runs/b -o compare.png          # run folders work too; overlaid

The command; the figure is gpt/report/curves.py's and the reading of the log
gpt/report/metrics_reader.py's. The trainer draws the same figure into its run folder as
it goes (gpt/train/run_curves.py).

matplotlib is an optional dependency (the plot extra: ``pip install -e ".[plot]"``); reading the
file (``load_metrics``) needs only the standard library. A long log is read in one pass and
each series drawn with a bounded number of points (gpt/report/curves.py says how); the
learning rate is the schedule's at every step, from the log's header records
(gpt/train/run_curves.py's read_run).

metrics.jsonl holds one JSON object per line with a "type": "run" (written at every
start, with "start_step" when resumed), "train" (step, loss, lr, grad_norm, ms,
tokens_per_s, mfu), "val" (step, val_loss), an evaluation's (its panels' fields:
gpt/eval/evaluations.py's), "summary" (a stop is marked where it happened), and others
("sample", "checkpoint") that are not plotted. Runs drawn together that ran differently
(device, processes, threads, batch) say so in the figure. A resumed run appends to the
same file, so
a step can appear more than once: the later record wins. When a "run" record starts a
new segment, the earlier attempt's train records from the resume step on and its
evaluations after that step are dropped (that attempt was superseded from an earlier
checkpoint). A line cut short by a crash is skipped and counted."""

from __future__ import annotations

import sys
from pathlib import Path

from gpt.core.cli import OneLineParser, finite_float
from gpt.core.file_checks import REPLACED, entry_problem, folder_problem
from gpt.report.curves import MATPLOTLIB_HINT, _import_pyplot, plot_runs
from gpt.report.metrics_reader import resolve_path, run_title
from gpt.train.run_curves import read_run


def output_problem(output: Path, given: bool = True) -> str | None:
    """Why the figure cannot be written at `output` (written beside it and renamed over
    it, its folder made if missing), in words naming -o where it was `given`; None where
    it can. Writes nothing: asked before the logs are read as well as before drawing."""
    label = f"-o {output}" if given else str(output)
    found = folder_problem(output.parent)
    if found is not None:
        where, problem = found
        return (f"{label}: cannot write there: {where} {problem}; name an image file in a "
                f"folder you can write (-o PATH)")
    problem = entry_problem(output, REPLACED)
    if problem is not None:
        return (f"{label}: it {problem}; name an image file (-o PATH), e.g. "
                f"-o {output / 'curves.png'}")
    return None


def _format_problem(output: Path, label: str) -> str | None:
    """Why matplotlib cannot write an image of `output`'s kind (its suffix: png where it
    has none), or None."""
    from matplotlib.backend_bases import FigureCanvasBase

    kind = output.suffix.lstrip(".").lower() or "png"
    kinds = FigureCanvasBase.get_supported_filetypes()
    if kind in kinds:
        return None
    return (f"{label}: matplotlib cannot write .{kind} images; name a file ending in one of "
            f"{', '.join('.' + k for k in sorted(kinds))} (-o PATH)")


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
    if args.output is not None and (problem := output_problem(Path(args.output))):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    runs = []
    for m in args.metrics:
        path = resolve_path(m)
        if not path.is_file():
            print(f"error: {path}: no such file", file=sys.stderr)
            return 2
        try:
            run = read_run(path)  # with the learning rate its schedule set at every step
        except OSError as e:  # no read permission, an I/O error mid-file
            print(f"error: {path}: cannot read it ({e.strerror or e})", file=sys.stderr)
            return 2
        if run.bad_lines:
            print(f"note: {path}: skipped {run.bad_lines} unreadable line(s)", file=sys.stderr)
        if run.empty:
            print(f"note: {path}: no records to plot (train, val, evaluations)", file=sys.stderr)
        runs.append(run)
    try:
        _import_pyplot()
    except ImportError:
        print(f"error: plotting needs matplotlib: {MATPLOTLIB_HINT}", file=sys.stderr)
        return 1
    output = args.output or runs[0].path.parent / "curves.png"
    title = args.title if args.title is not None else run_title(runs[0]) if len(runs) == 1 else None
    label = f"-o {output}" if args.output is not None else str(output)
    problem = output_problem(Path(output), given=args.output is not None) or _format_problem(
        Path(output), label)
    try:
        if problem is None:
            out = plot_runs(runs, output, smooth=args.smooth, title=title, log_loss=args.log_loss)
    except OSError as e:  # what no check can foresee: the disk filling as it writes
        problem = (f"{label}: cannot write it ({e.strerror or e}); name an image file in a "
                   f"folder you can write (-o PATH)")
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
