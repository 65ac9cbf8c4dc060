"""The trainer's --eval-tasks: lm-evaluation-harness tasks scored every
--eval-tasks-every steps (and at the end), one of gpt/eval/evaluations.py's, each metric
in the metrics log and so in TensorBoard and W&B ("tasks/<task>/<metric>"), beside GPT-2's
published scores.

The task names are checked before the run starts (the preflight asks Tasks.check: the
dry run says the same) and the tasks loaded once, as it starts: a task whose data cannot
be loaded, or that fails while being scored, is one warning and the run goes on without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpt.core.config import Config, EvalConfig
from gpt.eval import gpt2_scores, harness_tasks
from gpt.eval.evaluation import Evaluation, Result, Scoring

if TYPE_CHECKING:
    from gpt.runtime.world import Runtime


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

    def score(self, at: Scoring) -> Result | None:
        """Score the model on each task: the record and lines of the results (rank 0;
        None elsewhere). A task that fails while being scored is one warning and is
        dropped, as one that cannot load is: training and its checkpoints go on."""
        if not self.tasks:
            return None
        from gpt.eval.harness import GPT2TrainerLM

        step = at.step
        lm = GPT2TrainerLM(model=at.model, dtype=at.autocast_dtype, rank=self.rank,
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
            return None
        record: dict[str, Any] = {"type": Tasks.name, "step": step}
        for task, metrics in scores.items():
            record.update({f"{task}/{metric}": value for metric, value in metrics.items()})
        centred, _ = gpt2_scores.centred_mean(scores)
        if centred is not None:
            record["centred_mean"] = centred
        return Result(record, tuple(gpt2_scores.comparison_lines(scores)))


def agreed_failure(why: str | None, world_size: int) -> str | None:
    """Whether a task failed on any rank (the first rank's reason), the same answer on
    every rank. A scoring failure inside the model is agreed on already (gpt/eval/harness.py),
    but the harness computes the metrics on rank 0 alone: a failure there must drop the
    task on every rank, or the others would score it next time and wait for rank 0 in its
    gather."""
    from gpt.eval.rank_agreement import first_failure  # torch's import: where it scores

    found = first_failure(why, world_size)
    return None if found is None else found[1]


def _label(key: Any) -> str:
    """A task dict's key: a task's name, or a group (an object with a group_name)."""
    return str(getattr(key, "group_name", None) or getattr(key, "group", None) or key)


class Tasks(Evaluation):
    name = "tasks"

    def every(self, e: EvalConfig) -> int:
        return e.eval_tasks_every

    def check(self, cfg: Config) -> None:
        """lm-eval importable, --eval-tasks-include a folder, every task a name the harness
        knows. No task's data is loaded (that may download): a task whose data cannot be
        loaded is a warning when the run starts, and the run goes on without it."""
        # datasets' progress bars would fill the training log at each scoring: it reads
        # this as check_tasks first imports it (lm-eval's own: harness_tasks.run_tasks)
        harness_tasks.quiet_progress()
        e = cfg.eval
        harness_tasks.check_tasks(e.eval_tasks, e.eval_tasks_include, flag="--eval-tasks",
                                  include_flag="--eval-tasks-include")

    def load(self, cfg: Config, runtime: Runtime) -> TrainingTasks:
        return TrainingTasks(cfg.eval, runtime, cfg.train.parallel == "fsdp")

    def score(self, loaded: TrainingTasks, at: Scoring) -> Result | None:
        return loaded.score(at)


TASKS = Tasks()
