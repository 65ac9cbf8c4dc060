"""Running lm-evaluation-harness tasks on a model (gpt/eval/harness.py's LM): the task names
checked (before a run starts, too), the tasks loaded, one line saying what is wrong with
a task that cannot be (its template, its own data file, or Hub data not yet cached), and
the scores as {task: {metric: value}} for gpt.evaluate, gpt2-lm-eval and the trainer's
--eval-tasks.

lm-eval is an optional extra; nothing here imports it before it is needed, and without
it (or with an install that fails to import) require_lm_eval() says so in one line.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Iterator, NoReturn

from gpt.core import extras, network
from gpt.core.errors import UserError
from gpt.core.file_checks import READ, entry_problem
from gpt.core.text import one_line


class HarnessError(UserError):
    """lm-eval is missing or broken, a task cannot be loaded or scored; the message says
    which and why."""


# Hugging Face datasets' builders that read the files a task names (`dataset_path: json`
# with `data_files`): a task on them loads without network, so that is not the advice.
LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow", "pandas")


def quiet_progress() -> None:
    """Leave out the progress bars lm-eval draws for each task as it builds its requests
    and datasets draws for each split it reads: a few lines each on a screen, most of a
    log file. Both read these variables as they are imported, so this comes first; a
    value the user set stays."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


def require_lm_eval(what: str) -> None:
    """Raise one line naming `what` (the flag that needs it) if lm-eval is not installed,
    or is installed but fails to import the parts used here (they import datasets,
    transformers' tokenizers, ...): the two need different fixes. An address the Hugging
    Face libraries would fail to parse as they load (HF_ENDPOINT, a proxy) is named first."""
    network.check_addresses()
    extras.require(("lm_eval", "lm_eval.evaluator", "lm_eval.tasks"), what, "eval",
                   "lm-eval", error=HarnessError,
                   called="EleutherAI's lm-evaluation-harness (lm-eval)")


def parse_tasks(text: str | None) -> list[str]:
    """'hellaswag, arc_easy' -> ['hellaswag', 'arc_easy']."""
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def data_home() -> str:
    """Where Hugging Face datasets, which the harness loads its tasks' data with, keeps them."""
    from datasets import config

    return str(config.HF_DATASETS_CACHE)


TASK_SUFFIXES = (".yaml", ".yml", ".py")  # the files of a task folder the harness reads


def task_files(folder: str, flag: str = "--include-path") -> list[tuple[str, int]]:
    """(path, modification time) of every task file in `folder` and its subfolders, each
    one checked readable first: the harness indexes every task YAML there and passes over
    one it cannot read in silence (its tasks then "no such task"), or waits forever on a
    FIFO, and the index's stamp would raise on a symlink to nothing. So an entry that
    cannot be read (a symlink to nothing or in a loop, a FIFO, a file or subfolder this
    process may not read) is one HarnessError naming `flag`, the folder and the entry."""
    def refuse(path: str, problem: str) -> NoReturn:
        raise HarnessError(f"{flag} {folder}: {one_line(path)} {problem}: the harness reads every "
                           f"task file there; remove or fix it")

    found: list[tuple[str, int]] = []

    def walk(here: str, above: frozenset[str]) -> None:
        real = os.path.realpath(here)
        if real in above:
            refuse(here, "leads back to a folder it is in (a symlink loop)")
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError as e:
            refuse(here, f"cannot be listed ({e.strerror})")
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # follows a symlink; False for one to nothing
            except OSError:
                is_dir = False
            if is_dir:
                walk(entry.path, above | {real})
            elif entry.name.endswith(TASK_SUFFIXES):
                problem = entry_problem(Path(entry.path), READ)
                if problem is not None:
                    refuse(entry.path, problem)
                found.append((entry.path, os.stat(entry.path).st_mtime_ns))

    walk(folder, frozenset())
    return found


def _is_pattern(name: str) -> bool:
    """Whether a task name is a pattern the harness matches (arc_*), not a name."""
    return any(c in name for c in "*?[")


@functools.lru_cache(maxsize=4)
def _manager(include_path: str | None, stamp: tuple[tuple[str, int], ...], defaults: bool) -> Any:
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path, include_defaults=defaults)


def task_manager(include_path: str | None, names: list[str] | None = None) -> Any:
    """The harness's index of its tasks and those in include_path. Indexing its ~15,000
    task files takes 15 to 18 s on a 2-core machine, and a run checks the names before it
    starts and loads the tasks later: one index serves both, rebuilt when a task file in
    include_path changes. Where every name is a task of include_path's own (not a group, a
    tag or a pattern, which may reach the harness's tasks), that folder alone is indexed:
    the harness gives include_path's tasks precedence over its own of the same name, so the
    tasks are the same ones."""
    logging.getLogger("lm_eval").setLevel(logging.WARNING)  # its progress chatter
    stamp: tuple[tuple[str, int], ...] = ()
    if include_path is not None:
        stamp = tuple(sorted(task_files(include_path)))
        if names and not any(map(_is_pattern, names)):
            own = _manager(include_path, stamp, False)
            if all(n in own.all_subtasks for n in names):
                return own
    return _manager(include_path, stamp, True)


def check_tasks(text: str | None, include_path: str | None, flag: str = "--tasks",
                include_flag: str = "--include-path", patterns: bool = False
                ) -> tuple[Any, list[str]]:
    """(the harness's task index, the task names) for `flag`'s comma-separated list, or
    one line: lm-eval not importable, the include folder missing, no name at all, a name
    the harness does not know (a typo, not missing data). With `patterns` (the harness's
    command line takes them), a name like arc_* stands for the tasks it matches. Loads no
    data: the dry run and the trainer's checks before it starts call this too."""
    require_lm_eval(flag)
    if include_path is not None and not Path(include_path).is_dir():
        what = "is not a folder" if Path(include_path).exists() else "no such folder"
        raise HarnessError(f"{include_flag} {include_path}: {what} (the folder of task "
                           f"YAMLs of your own)")
    if include_path is not None:
        task_files(include_path, include_flag)  # an entry it cannot read: one line, now
    names = parse_tasks(text)
    if not names:
        raise HarnessError(f"{flag} {text!r} names no task: give a comma-separated list, "
                           f"e.g. hellaswag,arc_easy")
    manager = task_manager(include_path, names)
    if patterns:
        names = list(dict.fromkeys(m for n in names for m in (
            (manager.match_tasks([n]) or [n]) if _is_pattern(n) else [n])))
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        where = f" or in {include_flag} {include_path}" if include_path else ""
        raise HarnessError(f"{flag} {one_line(','.join(unknown))}: no such lm-eval task{where} "
                           f"(`lm_eval ls tasks` lists them)")
    return manager, names


def load_tasks(names: list[str] | str, include_path: str | None = None, flag: str = "--tasks",
               include_flag: str = "--include-path", patterns: bool = False
               ) -> tuple[dict[Any, Any], list[str]]:
    """(the harness's task dict of every task that loads, one line for each that does
    not). What check_tasks refuses raises."""
    text = names if isinstance(names, str) else ",".join(names)
    manager, names = check_tasks(text, include_path, flag, include_flag, patterns)
    tasks: dict[Any, Any] = {}
    failed: list[str] = []
    # Without network, datasets reads its cache alone: a task cached loads at once, one
    # that is not fails at once (not after a minute of retries per task)
    offline = network.hub_unreachable()
    for name in names:
        try:
            with warnings.catch_warnings():  # 0.4.13 prefers load(); older ones lack it
                warnings.simplefilter("ignore", DeprecationWarning)
                with network.offline_hub() if offline else contextlib.nullcontext():
                    tasks.update(manager.load_task_or_group([name]))
        except Exception as e:  # noqa: BLE001 - datasets raises many kinds for missing data
            failed.append(load_failure(manager, name, e))
    return tasks, failed


def load_failure(manager: Any, name: str, e: BaseException) -> str:
    """The line for a task that did not load, saying what is wrong: its template (which
    the harness tries on the first document as it loads), a data file of its own that
    holds no documents or cannot be read, or data from the Hub that is not cached."""
    # the error may quote the task's YAML or data file: one line, control characters escaped
    reason = one_line(" ".join(str(e).split()), 200) or type(e).__name__
    shown = one_line(name)  # a name may come from a task's YAML (a pattern's match)
    entry = manager.task_index.get(name) if hasattr(manager, "task_index") else None
    yaml_path = getattr(entry, "yaml_path", None) or (entry.get("yaml_path") if isinstance(
        entry, dict) else None)
    cfg = getattr(entry, "cfg", None)
    dataset = str(cfg.get("dataset_path", "")) if isinstance(cfg, dict) else ""
    where = f" ({one_line(str(yaml_path))})" if yaml_path else ""
    if type(e).__module__.split(".")[0] == "jinja2":
        return (f"task {shown}: its template cannot be rendered on its documents "
                f"({type(e).__name__}: {reason}): fix doc_to_text, doc_to_target or "
                f"doc_to_choice{where}, or the fields of its data")
    if dataset in LOCAL_BUILDERS or (dataset and Path(dataset).exists()):
        files = (cfg.get("dataset_kwargs") or {}).get("data_files") if isinstance(cfg, dict) else None
        if isinstance(files, dict):
            files = ", ".join(str(f) for f in files.values())
        source = f" ({one_line(str(files))})" if files else where
        if isinstance(e, StopIteration):
            return f"task {shown}: its data holds no documents{source}"
        return f"task {shown}: its data could not be read{source}: {type(e).__name__}: {reason}"
    offline = network.hub_unreachable()
    if offline:
        return (f"task {shown}: its data could not be loaded: it is not in Hugging Face "
                f"datasets' cache ({data_home()}, HF_DATASETS_CACHE) and the Hub cannot be "
                f"reached ({offline}): run once with network")
    return (f"task {shown}: its data could not be loaded: {reason}; the harness loads "
            f"it with Hugging Face datasets from the Hub into {data_home()} "
            f"(HF_DATASETS_CACHE): run once with network")


def run_tasks(lm: Any, tasks: dict[Any, Any], limit: int | None = None
              ) -> dict[str, dict[str, float]]:
    """Score lm on the loaded tasks (zero-shot as each task defines; `limit` examples of
    each at most). Every rank calls this; the scores come back on rank 0 (empty on the
    others). No bootstrap: standard errors of accuracies are closed-form anyway."""
    from lm_eval.evaluator import evaluate

    if not tasks:
        return {}
    with _request_bars(shown=not getattr(lm, "quiet", False)):
        out = evaluate(lm=lm, task_dict=tasks, limit=limit, bootstrap_iters=0, log_samples=False)
    return scores(out) if out is not None else {}


@contextlib.contextmanager
def _request_bars(shown: bool) -> Iterator[None]:
    """lm-eval draws a progress bar for each task as it builds its requests. TQDM_DISABLE
    (quiet_progress) reaches only a tqdm imported after it is set, and `import torch`
    imports tqdm (torch.hub): in the trainer it comes too late. So for a quiet model the
    bar is turned off where lm-eval draws it, for this call alone."""
    from lm_eval.api import task as drawer

    bar = getattr(drawer, "tqdm", None)
    if shown or bar is None:
        yield
        return
    drawer.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        drawer.tqdm = bar


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
