"""The trainer's --eval-tasks: lm-evaluation-harness tasks scored every
--eval-tasks-every steps (and at the end), each metric in the metrics log and so in
TensorBoard and W&B ("tasks/<task>/<metric>"), beside GPT-2's published scores.

The task names are checked before the run starts (gpt/plan/preflight.py: the dry run says the
same) and the tasks loaded once, as it starts: a task whose data cannot be loaded, or
that fails while being scored, is one warning and the run goes on without it.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from gpt.core.config import EvalConfig
from gpt.eval import gpt2_scores, harness_tasks
from gpt.eval.rank_agreement import first_failure
from gpt.runtime.world import Runtime


class _Run(Protocol):
    """What score() reads of the trainer's Run (gpt/train/loop.py), by name."""

    model: torch.nn.Module
    runtime: Runtime
    autocast_dtype: torch.dtype
    log: Any
    say: Callable[..., None]


class TrainingTasks:
    def __init__(self, e: EvalConfig, runtime: Runtime, sharded: bool) -> None:
        self.limit = e.eval_tasks_limit
        # Under FSDP a forward pass is a collective: every rank scores every example, in
        # step; otherwise each rank scores its share and rank 0 gathers the results.
        self.rank, self.world_size = (0, 1) if sharded else (runtime.rank, runtime.world_size)
        self.tasks, failed = harness_tasks.load_tasks(
            e.eval_tasks or "", e.eval_tasks_include, flag="--eval-tasks",
            include_flag="--eval-tasks-include")
        self.is_master = runtime.is_master
        for line in failed:
            self._warn(f"{line}; training goes on without it")

    def _warn(self, line: str) -> None:
        if self.is_master:
            print(f"warning: --eval-tasks {line}", flush=True)

    def score(self, run: _Run, step: int) -> None:
        """Score the model on each task; print and log the results (rank 0). A task that
        fails while being scored is one warning and is dropped, as one that cannot load
        is: training and its checkpoints go on."""
        if not self.tasks:
            return
        from gpt.eval.harness import GPT2TrainerLM

        lm = GPT2TrainerLM(model=run.model, dtype=run.autocast_dtype, rank=self.rank,
                           world_size=self.world_size, quiet=True)
        scores: dict[str, dict[str, float]] = {}
        for name, task in list(self.tasks.items()):
            why = None
            try:
                task_scores = harness_tasks.run_tasks(lm, {name: task}, self.limit)
            except Exception as e:  # noqa: BLE001 - the harness and its metrics raise any kind
                why = " ".join(str(e).split())[:300]
                if not isinstance(e, harness_tasks.HarnessError):  # the harness's own error
                    why = f"{type(e).__name__}: {why}"
            why = agreed_failure(why, self.world_size)
            if why is not None:
                del self.tasks[name]
                self._warn(f"task {_label(name)} could not be scored at step {step} ({why}); "
                           f"training goes on without it")
            else:
                scores.update(task_scores)
        if not scores:  # not rank 0, or nothing scored
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


def agreed_failure(why: str | None, world_size: int) -> str | None:
    """Whether a task failed on any rank (the first rank's reason), the same answer on
    every rank. A scoring failure inside the model is agreed on already (gpt/eval/harness.py),
    but the harness computes the metrics on rank 0 alone: a failure there must drop the
    task on every rank, or the others would score it next time and wait for rank 0 in its
    gather."""
    found = first_failure(why, world_size)
    return None if found is None else found[1]


def _label(key: Any) -> str:
    """A task dict's key: a task's name, or a group (an object with a group_name)."""
    return str(getattr(key, "group_name", None) or getattr(key, "group", None) or key)
