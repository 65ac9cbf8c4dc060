"""Running lm-evaluation-harness tasks on a model (gpt/harness.py's LM): loading the
tasks, one line for a task whose data cannot be loaded, and the scores as
{task: {metric: value}} for gpt.evaluate and the trainer's --eval-tasks.

lm-eval is an optional extra; nothing here imports it before it is needed, and without
it require_lm_eval() says in one line how to install it.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

from gpt.errors import UserError

INSTALL = 'pip install -e ".[eval]"'


class HarnessError(UserError):
    """lm-eval is missing, or a task cannot be loaded; the message says which and why."""


def require_lm_eval(what: str) -> None:
    """Raise one line naming `what` (the flag that needs it) if lm-eval is not installed."""
    try:
        import lm_eval  # noqa: F401  # optional: the eval extra
    except ImportError:
        raise HarnessError(f"{what} runs EleutherAI's lm-evaluation-harness, which is not "
                           f"installed: {INSTALL}") from None


def parse_tasks(text: str | None) -> list[str]:
    """'hellaswag, arc_easy' -> ['hellaswag', 'arc_easy']."""
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def data_home() -> str:
    """Where Hugging Face datasets, which the harness loads its tasks' data with, keeps them."""
    from datasets import config

    return str(config.HF_DATASETS_CACHE)


def load_tasks(names: list[str], include_path: str | None = None
               ) -> tuple[dict[Any, Any], list[str]]:
    """(the harness's task dict of every task that loads, one line for each that does
    not). A name the harness does not know raises: that is a typo, not missing data."""
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm_eval").setLevel(logging.WARNING)  # its progress chatter
    manager = TaskManager(include_path=include_path)
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        where = f" or in {include_path}" if include_path else ""
        raise HarnessError(f"--tasks {','.join(unknown)}: no such lm-eval task{where} "
                           f"(`lm_eval ls tasks` lists them)")
    tasks: dict[Any, Any] = {}
    failed: list[str] = []
    for name in names:
        try:
            with warnings.catch_warnings():  # 0.4.13 prefers load(); older ones lack it
                warnings.simplefilter("ignore", DeprecationWarning)
                tasks.update(manager.load_task_or_group([name]))
        except Exception as e:  # noqa: BLE001 - datasets raises many kinds for missing data
            reason = " ".join(str(e).split())[:200] or type(e).__name__
            offline = " (HF_DATASETS_OFFLINE is set)" if os.environ.get("HF_DATASETS_OFFLINE") else ""
            failed.append(f"task {name}: its data could not be loaded{offline}: {reason}; the "
                          f"harness loads it with Hugging Face datasets from the Hub into "
                          f"{data_home()} (HF_DATASETS_CACHE): run once with network")
    return tasks, failed


def run_tasks(lm: Any, tasks: dict[Any, Any], limit: int | None = None
              ) -> dict[str, dict[str, float]]:
    """Score lm on the loaded tasks (zero-shot as each task defines; `limit` examples of
    each at most). Every rank calls this; the scores come back on rank 0 (empty on the
    others). No bootstrap: standard errors of accuracies are closed-form anyway."""
    from lm_eval.evaluator import evaluate

    if not tasks:
        return {}
    out = evaluate(lm=lm, task_dict=tasks, limit=limit, bootstrap_iters=0, log_samples=False)
    return scores(out) if out is not None else {}


def scores(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The harness's results -> {task: {metric: value}} (metrics of the default filter
    under their bare names, others as 'metric,filter'; sample_len: the examples scored;
    no standard errors)."""
    table: dict[str, dict[str, float]] = {}
    for task, metrics in results.get("results", {}).items():
        row = {}
        for key, value in metrics.items():
            name, _, filt = key.partition(",")
            if "_stderr" in name or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            row[name if filt in ("", "none") else key] = float(value)
        if row:
            table[task] = row
    return table
