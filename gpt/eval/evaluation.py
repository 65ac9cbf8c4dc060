"""What a run does every so many steps to see how it goes, in one interface (Evaluation):
validation loss (gpt/eval/validation.py), HellaSwag (gpt/eval/train_hellaswag.py) and the
harness's tasks (gpt/eval/train_tasks.py) are its instances, listed in
gpt/eval/evaluations.py. The training loop, its summary, the curves and the planner ask
the list; none of them names an evaluation.

An evaluation says:
    when it is due     every(): its interval in steps (and the run's end); 0 is off
    before the run     check(): what the preflight checks for it (files, network, extras)
    at the start       load(): what it loads once (data, tasks), or None: it does not run
    at a step          score(): its record for the metrics log and what the run says of it,
                       scored on every rank (each its share, or all in step where the
                       forward is a collective) or on rank 0 alone (every_rank)
    at the end         summary(): a part of the run's summary line; evaluate_flags():
                       `python -m gpt.evaluate`'s flags that score it again
    in the curves      panels: the fields of its records the figure draws (Panels: data,
                       as the figure's layer is below this one)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpt.report.metrics_reader import Panel

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from gpt.core.config import Config, EvalConfig
    from gpt.runtime.world import Runtime


@dataclass(frozen=True)
class Scoring:
    """What an evaluation scores with at a step: handed to it by the loop."""

    model: nn.Module  # the bare model (sharded in place under FSDP)
    eval_model: nn.Module  # what evaluation calls: compiled apart from training's
    runtime: Runtime
    autocast_dtype: torch.dtype
    step: int


@dataclass(frozen=True)
class Result:
    """A score: its record for the metrics log (its "type" and "step" included) and the
    lines the run says of it (each after "step N | ")."""

    record: dict[str, Any]
    lines: tuple[str, ...] = ()


class Evaluation:
    """One kind of periodic evaluation. Subclass it and add an instance to
    gpt/eval/evaluations.py's EVALUATIONS."""

    name: str = ""  # its records' type in metrics.jsonl
    every_rank: bool = True  # score() runs on every rank (it may hold collectives), or rank 0's
    # the field of its record that is the run's validation loss (the checkpoints' best,
    # the summary's "val loss"): one evaluation's at most
    loss: str | None = None
    # its evaluate_flags(cfg, None) are the summary's command when no evaluation that ran
    # offers one (something a checkpoint can be scored on without the run's data)
    stands_in: bool = False
    panels: tuple[Panel, ...] = ()

    def every(self, e: EvalConfig) -> int:
        """Its interval in steps; 0: off."""
        raise NotImplementedError

    def check(self, cfg: Config) -> None:
        """A UserError for what would stop it (a missing file, an unreachable host, a
        package not installed), before anything is built; nothing where it is off."""

    def load(self, cfg: Config, runtime: Runtime) -> Any | None:
        """What it loads once as the run is built (on every rank); None: it does not run
        (what it needs is not there: it says so)."""
        raise NotImplementedError

    def score(self, loaded: Any, at: Scoring) -> Result | None:
        """Its score of the model at `at.step`; None where there is nothing to record
        (on a rank that does not write, or nothing left to score)."""
        raise NotImplementedError

    def summary(self, record: dict[str, Any]) -> str | None:
        """Its part of the summary line, from its last record; None: it has none."""
        return None

    def evaluate_flags(self, cfg: Config, loaded: Any | None, compiled: bool) -> list[str]:
        """`python -m gpt.evaluate`'s flags that score what it scored (loaded None: as
        the stand-in); none where gpt.evaluate cannot."""
        return []
