"""The run folder (--out-dir) and the files a run opens there, judged before it opens them.

Rank 0 of a run takes the folder (gpt/checkpoint/checkpointer.py: made if missing, then
locked) and then opens, writes or replaces, by name:

  .lock            the one-run-per-folder lock (gpt/core/fileio.py's FolderLock)
  config.toml      the resolved recipe, replaced (gpt/train/run_record.py)
  metrics.jsonl    the metrics log, appended to (gpt/report/metrics.py's MetricsLog)
  ckpt_NNNNNN.pt   the checkpoints, each replaced (gpt/checkpoint/files.py)
  tensorboard/     --tensorboard's event files (gpt/report/trackers.py)
  wandb/, wandb_run_id   --wandb-project's run and its id

check_run_folder() judges all of them, writing nothing, with gpt/core/file_checks.py's
verdicts, which the opening code itself asks: the trainer calls it as it takes the folder,
and the preflight (so the dry run) calls the same function, so a dry run's "the run would
start" holds for the run folder's own files, in the run's own words.
"""

from __future__ import annotations

from pathlib import Path

from gpt.checkpoint.files import CKPT_PATTERN
from gpt.core import file_checks
from gpt.core.config import ConfigError
from gpt.core.file_checks import APPENDED, FOLDER, REPLACED, entry_problem, folder_problem
from gpt.core.fileio import lock_problem
from gpt.core.units import human_bytes
from gpt.report.metrics import check_log_path


LOCK_WHAT = "training run"  # FolderLock's `what`: "one training run per folder"
CONFIG_NAME = "config.toml"
METRICS_NAME = "metrics.jsonl"
TENSORBOARD_NAME = "tensorboard"
WANDB_NAMES = ("wandb", "wandb_run_id")
# The lock, config.toml and the metrics log's first records take a few kB; a disk with
# less than this free fails them part-way (or a first checkpoint soon after)
FIRST_FILES_BYTES = 2**20


def _entries(tensorboard: bool, wandb: bool) -> list[tuple[str, str, str]]:
    """(name, how it is opened, what it is) of each file the run opens by name."""
    entries = [(CONFIG_NAME, REPLACED, "resolved config")]
    if tensorboard:
        entries.append((TENSORBOARD_NAME, FOLDER, "TensorBoard event files (--tensorboard)"))
    if wandb:
        entries += [(WANDB_NAMES[0], FOLDER, "W&B run (--wandb-project)"),
                    (WANDB_NAMES[1], APPENDED, "W&B run's id (--wandb-project)")]
    return entries


def check_run_folder(out_dir: Path, tensorboard: bool = False, wandb: bool = False) -> None:
    """Raise, in the words of the code that would fail, where the run could not take
    `out_dir` or open one of its files there: the folder cannot be made or written, or
    its disk is full (a ConfigError naming --out-dir); its lock is held or is not a lock
    file (FolderLock's FolderInUse or BadLockFile); the metrics log cannot be opened
    (MetricsLog's MetricsError); a file the run writes is a folder, a FIFO, a symlink to
    nothing or in a loop, or cannot be opened as the run opens it (a ConfigError naming
    it). Each names what to do. Writes nothing."""
    flag = f"--out-dir {out_dir}"
    found = folder_problem(out_dir)
    if found is not None:
        where, problem = found
        if problem == "permission denied":
            inside = "" if where == out_dir else f" (in {where}, where it would be made)"
            raise ConfigError(f"{flag}: cannot write there{inside}: permission denied")
        what = "it" if where == out_dir else str(where)
        raise ConfigError(f"{flag}: cannot write there: {what} {problem}; name a folder for "
                          f"the run's log, metrics and checkpoints")
    free = file_checks.free_bytes(out_dir)
    if free is not None and free < FIRST_FILES_BYTES:
        raise ConfigError(f"{flag}: its disk is full ({human_bytes(free)} free): the run's first "
                          f"files (its lock, {CONFIG_NAME}, {METRICS_NAME}) need about "
                          f"{human_bytes(FIRST_FILES_BYTES)}; free some space there, or name a "
                          f"folder on another disk")
    if not out_dir.is_dir():
        return  # the run makes it: nothing stands in its files' way
    refusal = lock_problem(out_dir, LOCK_WHAT)
    if refusal is not None:
        raise refusal
    check_log_path(out_dir / METRICS_NAME)
    try:
        names = sorted(p.name for p in out_dir.iterdir() if CKPT_PATTERN.match(p.name))
    except OSError as e:
        raise ConfigError(f"{flag}: cannot list it for its checkpoints ({e.strerror or e}); "
                          f"name a folder this process can read and write") from None
    entries = _entries(tensorboard, wandb) + [
        (name, REPLACED, "checkpoint of that step") for name in names]
    for name, use, role in entries:
        problem = entry_problem(out_dir / name, use)
        if problem is not None:
            raise ConfigError(f"{out_dir / name}: cannot write the run's {role} there: it "
                              f"{problem}; remove or rename it, or choose another --out-dir")
