"""The trainer's --eval-tasks: lm-evaluation-harness tasks scored every
--eval-tasks-every steps (and at the end), each metric in the metrics log and so in
TensorBoard and W&B ("tasks/<task>/<metric>"), beside GPT-2's published scores.

The tasks are loaded once, when the run starts: an unknown task name stops the run
there, a task whose data cannot be loaded is one line and the run goes on without it.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from gpt import gpt2_scores, harness_tasks
from gpt.config import EvalConfig
from gpt.dist import Runtime


class _Run(Protocol):
    """What score() reads of the trainer's Run (gpt/train.py), by name."""

    model: torch.nn.Module
    runtime: Runtime
    autocast_dtype: torch.dtype
    log: Any
    say: Callable[..., None]


class TrainingTasks:
    def __init__(self, e: EvalConfig, runtime: Runtime, sharded: bool) -> None:
        harness_tasks.require_lm_eval("--eval-tasks")
        self.limit = e.eval_tasks_limit
        # Under FSDP a forward pass is a collective: every rank scores every example, in
        # step; otherwise each rank scores its share and rank 0 gathers the results.
        self.rank, self.world_size = (0, 1) if sharded else (runtime.rank, runtime.world_size)
        self.tasks, failed = harness_tasks.load_tasks(harness_tasks.parse_tasks(e.eval_tasks),
                                                      e.eval_tasks_include)
        if runtime.is_master:
            for line in failed:
                print(f"warning: --eval-tasks {line}; training goes on without it", flush=True)

    def score(self, run: _Run, step: int) -> None:
        """Score the model on the tasks; print and log the results (rank 0)."""
        if not self.tasks:
            return
        from gpt.harness import GPT2TrainerLM

        lm = GPT2TrainerLM(model=run.model, dtype=run.autocast_dtype, rank=self.rank,
                           world_size=self.world_size, quiet=True)
        scores = harness_tasks.run_tasks(lm, self.tasks, self.limit)
        if not scores:  # not rank 0
            return
        for line in gpt2_scores.comparison_lines(scores):
            run.say(f"step {step:6d} | {line}")
        record: dict[str, Any] = {"type": "tasks", "step": step}
        for task, metrics in scores.items():
            record.update({f"{task}/{metric}": value for metric, value in metrics.items()})
        centred, _ = gpt2_scores.centred_mean(scores)
        if centred is not None:
            record["centred_mean"] = centred
        run.log.write(record)
