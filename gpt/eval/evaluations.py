"""The evaluations a run makes every so many steps (gpt/eval/evaluation.py's interface), in
the order a step runs them, and what the stages ask of them all: the preflight which to
check, the build what to load, the loop which are due, the summary the command that
scores a checkpoint again, the curves their panels. Read EVALUATIONS through these
functions (a test adds one to it for a while). The list and its rows import without torch (the
curves' command reads their panels)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpt.core.config import Config, EvalConfig
from gpt.eval.evaluation import Evaluation
from gpt.eval.train_hellaswag import HELLASWAG
from gpt.eval.train_tasks import TASKS
from gpt.eval.train_validation import VALIDATION
from gpt.report.metrics_reader import Panel

if TYPE_CHECKING:
    from gpt.runtime.world import Runtime

EVALUATIONS: tuple[Evaluation, ...] = (VALIDATION, HELLASWAG, TASKS)

Loaded = list[tuple[Evaluation, Any]]  # each evaluation the run makes, and what it loaded


def enabled(e: EvalConfig) -> list[Evaluation]:
    """The evaluations a run with this section makes (a nonzero interval)."""
    return [ev for ev in EVALUATIONS if ev.every(e) > 0]


def load(cfg: Config, runtime: Runtime) -> Loaded:
    """What each enabled evaluation loads once; one that loads nothing does not run."""
    out = []
    for ev in enabled(cfg.eval):
        loaded = ev.load(cfg, runtime)
        if loaded is not None:
            out.append((ev, loaded))
    return out


def panels() -> tuple[Panel, ...]:
    """The curves' panels of every evaluation's records (the figure draws those a run has)."""
    return tuple(p for ev in EVALUATIONS for p in ev.panels)


def evaluate_flags(cfg: Config, loaded: Loaded, compiled: bool) -> list[str]:
    """`python -m gpt.evaluate`'s flags that score a checkpoint of the run as its
    evaluations did; where none of them can be, the stand-in's (something to score)."""
    flags = [f for ev, held in loaded for f in ev.evaluate_flags(cfg, held, compiled)]
    if flags:
        return flags
    return next((ev.evaluate_flags(cfg, None, compiled) for ev in EVALUATIONS if ev.stands_in),
                [])
