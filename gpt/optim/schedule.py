"""What changes from step to step: the learning rate (a linear warm-up, then GPT-2's
cosine or the speedrun's trapezoid) and the chosen optimizer's own settings (its
step_settings, e.g. a momentum warm-up), from the optimizer's section of the config and
the run's length; and the learning rates a run's schedule set at each of its steps, from
the configs its metrics log's headers hold (read by gpt/report/metrics_reader.py), for
the curves' figure (gpt/train/run_curves.py, gpt/plot.py hand them to
gpt/report/curves.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from gpt.core.config import Config, OptimConfig
from gpt.optim.kind import GroupSettings, OptimizerKind
from gpt.optim.optimizer import chosen


def lr_at(step: int, max_lr: float, min_lr_ratio: float, warmup_steps: int, max_steps: int,
          schedule: str = "cosine", cooldown_frac: float = 0.4) -> float:
    """Learning rate for optimizer step `step` (0-based).

    Linear warm-up from max_lr / warmup_steps at step 0 to max_lr at step warmup_steps - 1
    (never 0, which would waste the first step). Then, cosine (GPT-2): a cosine from max_lr
    at step warmup_steps down to min_lr at step max_steps; trapezoid (the speedrun's):
    max_lr until the last cooldown_frac of max_steps, then a straight line down to min_lr
    at max_steps. min_lr after that.
    """
    min_lr = max_lr * min_lr_ratio
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    if schedule == "trapezoid":
        cooldown = max(1, round(cooldown_frac * max_steps))
        left = max_steps - step
        return max_lr if left >= cooldown else min_lr + (max_lr - min_lr) * left / cooldown
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


@dataclass(frozen=True)
class Schedule:
    """The schedule of one run: `optim` is its section of the config, `max_steps` its
    length (--max-steps, which a --stop-at-step does not change)."""

    optim: OptimConfig
    max_steps: int

    def lr(self, step: int) -> float:
        o = self.optim
        return lr_at(step, o.max_lr, o.min_lr_ratio, o.warmup_steps, self.max_steps,
                     o.lr_schedule, o.cooldown_frac)

    @property
    def kind(self) -> OptimizerKind:
        return chosen(self.optim)

    def settings(self, step: int) -> GroupSettings:
        """The optimizer's group settings at `step` beside the learning rate."""
        return self.kind.step_settings(self.optim, step)

    def log_fields(self, step: int) -> dict[str, float]:
        """The optimizer's figures of `step` for its log record, beside "lr"."""
        return self.kind.log_fields(self.optim, step, self.lr(step))


# Steps a learning-rate curve holds at most (besides its corners): a figure's width in
# pixels is about a thousand, so a curve through this many points is the schedule itself.
CURVE_POINTS = 2000


def schedule_curves(starts: Sequence[tuple[int, Config]], last_step: int,
                    points: int = CURVE_POINTS
                    ) -> tuple[dict[str, tuple[list[int], list[float]]], dict[str, str]] | None:
    """The learning rates the schedule set at steps 0 to `last_step` of a run whose starts
    are `starts` (each start's step and config, in order, each after the one before: a
    metrics log's, read by gpt/report/metrics_reader.py's run_starts): "lr", and the
    optimizer's own rates under the same schedule where it has others (its log fields
    named in its lr_labels), for the steps a start with that optimizer ran; and the
    legend's word for each (lr_labels). A step follows the last start at or before it (a
    resume with a longer --max-steps stretches the rest of the cosine). Every step while
    there are at most `points`; beyond, `points` evenly spaced steps and the schedule's
    corners (the end of the warm-up, the start of a cooldown, each resume), so a line
    through them is the schedule's. None where there is no step."""
    if not starts or last_step < 0:
        return None
    scheduled = [(start, Schedule(c.optim, c.train.max_steps)) for start, c in starts]
    steps = _curve_steps(scheduled, last_step, points)
    curves: dict[str, tuple[list[int], list[float]]] = {"lr": ([], [])}
    labels: dict[str, str] = {}
    at = 0
    for step in steps:
        while at + 1 < len(scheduled) and scheduled[at + 1][0] <= step:
            at += 1
        sched = scheduled[at][1]
        value = sched.lr(step)
        rates = {"lr": value}
        if sched.kind.lr_labels:
            labels.update(sched.kind.lr_labels)
            fields = sched.kind.log_fields(sched.optim, step, value)
            rates.update((k, fields[k]) for k in sched.kind.lr_labels if k in fields)
        for key, rate in rates.items():
            series = curves.setdefault(key, ([], []))
            series[0].append(step)
            series[1].append(rate)
    return curves, labels


def _curve_steps(starts: list[tuple[int, Schedule]], last: int, points: int) -> list[int]:
    if last < points:
        return list(range(last + 1))
    picked = {round(i * last / (points - 1)) for i in range(points)}
    for start, sched in starts:
        o, n = sched.optim, sched.max_steps
        cooldown = n - max(1, round(o.cooldown_frac * n))
        for corner in (start, o.warmup_steps, cooldown, n):
            picked.update((corner - 1, corner))
    return sorted(s for s in picked if 0 <= s <= last)
