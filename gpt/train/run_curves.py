"""The run folder's picture: `curves.png`, gpt/report/curves.py's figure (the one
`python -m gpt.plot` draws) of the run's metrics.jsonl (loss, learning rate, tokens/s,
the evaluations' panels when scored), titled with the run's folder and recipe, redrawn as the run goes
where matplotlib is installed. Where it is not, the run says so once, as it starts, with
the command that installs it.

Drawing takes a second or two of CPU (matplotlib's import, then each figure), so the
redraws after evaluations are paced: once MIN_INTERVAL_S have passed since the run
started or last drew (or COST_FACTOR times the last drawing's time, where a long log makes
it longer). The end of a run that trained always draws, with its last points, so every
run folder holds its picture (`python -m gpt.plot RUN_FOLDER` draws it from the log at any
time too). The time spent drawing is counted (RunCurves.seconds) and left out of the
run's summary. A figure that fails to draw is a warning, never the end of a run.

The learning rate drawn is the one the run's schedule set at every step, computed here
from the log's header records (read_run): the figure's layer, gpt/report, is below the
schedule's, gpt/optim, so the figure is handed the curve rather than computing it.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpt.core.extras import have, install
from gpt.eval import evaluations
from gpt.optim.schedule import schedule_curves
from gpt.report.metrics_reader import RunMetrics, load_metrics, run_starts, run_title


CURVES_NAME = "curves.png"
# About 1-2% of a run's time at most, with a figure costing ~0.3 s on an idle core and
# ~1.5 s on a busy one; GPT-2's recipe validates every 250 steps (~4.5 min on one H100),
# so there every validation redraws it. A figure that costs more (a log of a million
# steps is read in tens of seconds) waits COST_FACTOR times its last cost instead.
MIN_INTERVAL_S = 60.0
COST_FACTOR = 50.0


@dataclass
class RunCurves:
    """Rank 0's drawing of OUT_DIR/curves.png; on other ranks, and without matplotlib,
    every call does nothing."""

    out_dir: Path
    enabled: bool
    started: float = field(default_factory=time.monotonic)
    last: float | None = None  # when it last drew (time.monotonic)
    failed: bool = False
    seconds: float = 0.0  # spent drawing, all told
    cost: float = 0.0  # the last drawing's seconds

    @classmethod
    def start(cls, out_dir: Path, is_master: bool) -> "RunCurves":
        """The run's curves; prints the one line that says how to get them when
        matplotlib is missing (on rank 0)."""
        if is_master and not have("matplotlib"):
            print(f"note: no {out_dir / CURVES_NAME} without matplotlib: {install('plot')} "
                  f"(python -m gpt.plot {out_dir} draws it from the log at any time)", flush=True)
            return cls(out_dir, enabled=False)
        return cls(out_dir, enabled=is_master)

    @property
    def path(self) -> Path:
        return self.out_dir / CURVES_NAME

    def after_evaluations(self) -> Path | None:
        """Redraw, if a minute (or COST_FACTOR times the last drawing's time, if more) has
        passed since the start or the last drawing."""
        since = self.last if self.last is not None else self.started
        if time.monotonic() - since < max(MIN_INTERVAL_S, COST_FACTOR * self.cost):
            return None
        return self._draw()

    def at_end(self) -> Path | None:
        """The last drawing, with the final points; the picture's path, or None if none
        was drawn."""
        return self._draw()

    def _draw(self) -> Path | None:
        if not self.enabled or self.failed:
            return None
        began = time.monotonic()
        try:
            return self._drawn()
        finally:  # the summary's time is the training's: drawing is left out of it
            self.cost = time.monotonic() - began
            self.seconds += self.cost

    def _drawn(self) -> Path | None:
        try:
            from gpt.report.curves import plot_runs  # matplotlib's import: when first drawn

            run = read_run(self.out_dir / "metrics.jsonl")
            plot_runs([run], self.path, title=run_title(run))
        except Exception as e:  # noqa: BLE001 - a picture is never worth a run
            self.failed = True
            reason = " ".join(str(e).split())[:200]
            print(f"warning: {self.path}: not drawn ({type(e).__name__}: {reason}); training "
                  f"goes on without it (python -m gpt.plot {self.out_dir} draws it later)",
                  file=sys.stderr, flush=True)
            return None
        self.last = time.monotonic()
        return self.path


def read_run(path: Path, label: str | None = None) -> RunMetrics:
    """A run's metrics log read for its figure, with its evaluations' records (their
    panels: gpt/eval/evaluations.py's) and the learning rates its schedule set at every
    step (from its headers' config: gpt/optim/schedule.py), where they can be computed:
    both from layers above the figure's."""
    run = load_metrics(path, label, evaluations.panels())
    last = run.last_step("train")
    starts = run_starts(run.runs)  # the configs its headers hold
    curves = schedule_curves(starts, last) if starts and last is not None else None
    if curves is not None:
        run.lr_schedule, run.lr_labels = curves
    return run
