"""What changes from step to step: the learning rate (a linear warm-up, then GPT-2's
cosine or the speedrun's trapezoid) and Muon's momentum (its warm-up), from the
optimizer's section of the config and the run's length."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpt.core.config import OptimConfig
from gpt.optim.muon import momentum_at


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

    def muon_momentum(self, step: int) -> float | None:
        """Muon's momentum at `step`; None where the optimizer is AdamW alone."""
        o = self.optim
        if o.optimizer != "muon":
            return None
        return momentum_at(step, o.muon_momentum, o.muon_momentum_warmup)
