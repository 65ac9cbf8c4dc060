"""What a run says as it ends: one line with where it stopped, its last and best validation
loss, the tokens it trained on, its time and tokens/s (the time of its steps, validations
and checkpoints; drawing its curves left out), and its checkpoint; then the commands that
go on from there (resume a run that stopped early, sample, evaluate: the last one scores
the batches the run's validation scored, so it prints the run's figure) and the picture of
its curves. The same figures go to metrics.jsonl as a "summary" record.

    done: step 150/150 | val loss 6.3424, best 6.3424 at step 150 | 307.20k tokens in 15m57s:
    321 tokens/s (341 in the steps alone) | checkpoint runs/shakespeare/ckpt_000150.pt
      sample:   python -m gpt.generate --checkpoint runs/shakespeare/ckpt_000150.pt --prompt ROMEO:
      evaluate: python -m gpt.evaluate --checkpoint runs/shakespeare/ckpt_000150.pt --data-dir data/shakespeare --val-steps 8 --device cpu
      curves:   runs/shakespeare/curves.png

(configs/cpu-demo.toml on a busy 2-core CPU; the first line here wrapped). The loop keeps
a Tally as it goes; the loop (gpt/train/loop.py) hands the rest over as an Ending.
"""

from __future__ import annotations

import math
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt.checkpoint.checkpointer import LoopState
from gpt.core.config import Config
from gpt.core.units import format_duration, human_count


@dataclass
class Tally:
    """What the summary needs that the loop does not keep otherwise: when and where this
    process started training, the time its logged steps took, its best validation."""

    start_step: int = 0
    started: float = field(default_factory=time.monotonic)
    timed_steps: int = 0  # steps whose time a log line measured (evaluation not included)
    timed_seconds: float = 0.0
    best_val: float = math.inf
    best_step: int | None = None
    drawing_seconds: float = 0.0  # the curves' figure, drawn during the run and at its end
    last: dict[str, dict[str, Any]] = field(default_factory=dict)  # each evaluation's last record

    def training_seconds(self) -> float:
        """The time since the start, less the curves' drawing: the summary's figures are
        the training's (a long log's figure once took longer than a short resume's steps)."""
        return max(0.0, time.monotonic() - self.started - self.drawing_seconds)

    def steps_timed(self, steps: int, seconds_per_step: float) -> None:
        self.timed_steps += steps
        self.timed_seconds += steps * seconds_per_step

    def validated(self, step: int, loss: float) -> None:
        if math.isfinite(loss) and loss < self.best_val:
            self.best_val, self.best_step = loss, step

    def scored(self, evaluation: str, record: dict[str, Any]) -> None:
        self.last[evaluation] = record


@dataclass(frozen=True)
class Ending:
    """Where and how the run ended, and what it leaves."""

    cfg: Config
    state: LoopState  # the step it ended at, its last validation, the best a checkpoint holds
    stopped_by: str | None  # None: it ran to --max-steps; else "--stop-at-step N", "SIGTERM", ...
    checkpoint: Path | None  # this process's last
    out_dir: Path
    curves: Path | None  # drawn at the end, if it was
    distributed: bool  # under torchrun
    # `python -m gpt.evaluate`'s flags that score its checkpoint as its evaluations did
    # (gpt/eval/evaluations.py's evaluate_flags)
    evaluate: list[str] = field(default_factory=list)
    scores: list[str] = field(default_factory=list)  # the evaluations' parts of the line


def summarize(tally: Tally, end: Ending) -> tuple[list[str], dict[str, Any]]:
    """The lines to print and the metrics record."""
    cfg, step, last_val = end.cfg, end.state.step, end.state.last_val
    max_steps, tokens_per_step = cfg.train.max_steps, cfg.data.total_batch_tokens
    wall = tally.training_seconds()
    trained = (step - tally.start_step) * tokens_per_step
    rate = trained / wall if wall > 0 else None
    steps_rate = (tally.timed_steps * tokens_per_step / tally.timed_seconds
                  if tally.timed_seconds > 0 else None)
    best, best_step = tally.best_val, tally.best_step
    if end.state.best_val < best:  # a checkpoint's, from before the resume
        best, best_step = end.state.best_val, None
    head = (f"done: step {step:,}/{max_steps:,}" if end.stopped_by is None else
            f"stopped at step {step:,}/{max_steps:,} ({end.stopped_by})")
    parts = [head]
    if last_val is not None:
        where = (f" at step {best_step:,}" if best_step is not None else
                 " before the resume" if math.isfinite(best) else "")
        parts.append(f"val loss {last_val:.4f}"
                     + (f", best {best:.4f}{where}" if math.isfinite(best) else ""))
    parts += end.scores
    seen = f"{human_count(trained)} tokens in {format_duration(wall)}"
    if tally.start_step:
        seen += f" ({human_count(step * tokens_per_step)} in all)"
    if rate is not None:
        seen += f": {rate:,.0f} tokens/s"
        if steps_rate is not None:
            seen += f" ({steps_rate:,.0f} in the steps alone)"
    parts.append(seen)
    parts.append(f"checkpoint {end.checkpoint}" if end.checkpoint else "no checkpoint" + (
        "" if cfg.checkpoint.save_checkpoints else " (--no-save-checkpoints)"))
    lines = [" | ".join(parts)]
    if end.stopped_by is not None:
        config = shlex.quote(str(end.out_dir / "config.toml"))
        again = f"train_gpt2.py --config {config} --resume auto"
        lines.append(f"  resume:   the same torchrun launch with {again}" if end.distributed
                     else f"  resume:   python {again}")
    if end.checkpoint:
        ckpt = shlex.quote(str(end.checkpoint))
        lines.append(f"  sample:   python -m gpt.generate --checkpoint {ckpt} --prompt "
                     f"{shlex.quote(cfg.eval.sample_prompt)}")
        lines.append(f"  evaluate: python -m gpt.evaluate --checkpoint {ckpt} "
                     f"{' '.join(end.evaluate)}".rstrip())
    if end.curves is not None:
        lines.append(f"  curves:   {end.curves}")
    record = {"type": "summary", "step": step, "stopped_by": end.stopped_by,
              "val_loss": last_val, "best_val_loss": best if math.isfinite(best) else None,
              "best_step": best_step, "tokens": trained, "tokens_seen": step * tokens_per_step,
              "wall_s": round(wall, 3), "tokens_per_s": rate, "step_tokens_per_s": steps_rate,
              "checkpoint": str(end.checkpoint) if end.checkpoint else None,
              "curves": str(end.curves) if end.curves else None,
              **({"scores": end.scores} if end.scores else {})}
    return lines, record
