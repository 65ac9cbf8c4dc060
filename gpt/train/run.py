"""One training run's parts, built whole by gpt/train/build.py's build_run() and passed to
every piece of periodic work (gpt/train/run_record.py, the loop's helpers); and what the
loop keeps as it trains (Records), started with it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpt.checkpoint.checkpointer import Checkpointer, LoopState, Parts
from gpt.core.config import Config
from gpt.data.loader import ShardLoader
from gpt.engine import parallel
from gpt.engine.step import SkippedSteps
from gpt.eval.evaluations import Loaded
from gpt.model.transformer import GPT
from gpt.report.metrics import MetricsLog, Progress
from gpt.runtime.world import Runtime
from gpt.train.run_curves import RunCurves
from gpt.train.run_summary import Tally


@dataclass
class Run:
    """Everything one training run is made of, built whole by build_run(): the loop
    changes its state (the step, the last validation) and the skips it counts, and
    nothing else of it."""

    cfg: Config
    runtime: Runtime
    out_dir: Path
    model: GPT  # the bare model (sharded in place under FSDP)
    par: parallel.Parallelized  # the module the loop calls, and its optimizer
    autocast_dtype: torch.dtype
    accum: int
    train_loader: ShardLoader
    checkpointer: Checkpointer
    tokenizer: Any
    evaluations: Loaded  # each evaluation the run makes, and what it loaded
    state: LoopState  # where the loop is (a checkpoint's, when resumed)
    layout_choice: dict[str, Any] | None  # what the auto layout chose (gpt/plan/layout.py)
    trackers: list[Any]  # TensorBoard / W&B, rank 0 only
    skips: SkippedSteps = field(default_factory=SkippedSteps)  # counted on the device
    expected_step_s: float | None = None  # one step's seconds as the start's estimate timed it

    def say(self, *args: Any) -> None:
        """Print on rank 0 only."""
        if self.runtime.is_master:
            print(*args, flush=True)

    @property
    def end_step(self) -> int:
        """The step this run stops at: --max-steps, or --stop-at-step if sooner."""
        c = self.cfg
        return min(c.train.max_steps, c.checkpoint.stop_at_step or c.train.max_steps)

    def parts(self) -> Parts:
        """What a checkpoint of this run is made of."""
        return Parts(self.model, self.par.optimizer, self.par.scaler, self.train_loader, self.state,
                     self.cfg)


@dataclass
class Records:
    """What the loop keeps as it trains, started with it (gpt/train/loop.py's run_loop): the
    metrics log (open for the loop's life), the progress line's clock and ETA, the tally
    its summary reads, OUT_DIR/curves.png's drawing."""

    log: MetricsLog
    progress: Progress
    tally: Tally
    curves: RunCurves
