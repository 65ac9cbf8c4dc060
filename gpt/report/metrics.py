"""What a run records as it goes: step time and progress, and the JSONL metrics log (one
writer, repaired after a crash). FLOPs and MFU are gpt/report/flops.py's; TensorBoard
and W&B, gpt/report/trackers.py's."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt.core.errors import UserError
from gpt.core.file_checks import APPENDED, entry_problem
from gpt.core.units import format_duration, human_count
from gpt.report.trackers import Tracker
from gpt.runtime.device import synchronize
from gpt.runtime.world import Runtime


@dataclass
class StepTimer:
    """Wall time between log points; the device is synchronised only at those points, so
    steps in between queue up without host stalls."""

    runtime: Runtime
    start: float = 0.0
    steps: int = 0

    def reset(self) -> None:
        synchronize(self.runtime.device)
        self.start = time.perf_counter()
        self.steps = 0

    def lap(self) -> float:
        """Seconds per step since the last lap/reset."""
        synchronize(self.runtime.device)
        now = time.perf_counter()
        per_step = (now - self.start) / max(1, self.steps)
        self.start, self.steps = now, 0
        return per_step


@dataclass
class Progress:
    """How far the run is: tokens seen, time since this process started training, and an
    estimate of the time to --max-steps from a moving average of the step time (evaluation
    and checkpoints not counted)."""

    tokens_per_step: int
    max_steps: int
    started: float = field(default_factory=time.monotonic)
    step: int = 0
    step_seconds: float | None = None

    def update(self, step: int, seconds_per_step: float) -> "Progress":
        self.step = step
        avg = self.step_seconds
        self.step_seconds = seconds_per_step if avg is None else 0.9 * avg + 0.1 * seconds_per_step
        return self

    def record(self) -> dict[str, float]:
        left = max(0, self.max_steps - self.step - 1) * (self.step_seconds or 0.0)
        return {"tokens_seen": (self.step + 1) * self.tokens_per_step,
                "elapsed_s": round(time.monotonic() - self.started, 1), "eta_s": round(left, 1)}

    def line(self) -> str:
        r = self.record()
        return (f"{human_count(r['tokens_seen'])} tokens | {self.step + 1}/{self.max_steps} steps in "
                f"{format_duration(r['elapsed_s'])}, ETA {format_duration(r['eta_s'])}")


class MetricsError(UserError):
    """The metrics log cannot be opened or written; the message names the file."""


def repair_tail(path: Path) -> str | None:
    """Make a JSONL file end on a whole line again, if it does not: a last record that
    parses but lacks its newline gets one, anything else after the last newline (a
    record torn by a crash, zeros after a power loss) is cut off, so that the next record
    starts a line of its own. Returns what was done, or None for a whole (or no) file."""
    try:
        fh = open(path, "r+b")
    except FileNotFoundError:
        return None
    with fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0 or os.pread(fh.fileno(), 1, size - 1) == b"\n":
            return None
        start = size  # of the last line: just after the last newline before the end
        while start > 0:
            chunk = os.pread(fh.fileno(), min(start, 1 << 16), max(0, start - (1 << 16)))
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                start = start - len(chunk) + cut + 1
                break
            start -= len(chunk)
        try:
            whole = isinstance(json.loads(os.pread(fh.fileno(), size - start, start)), dict)
        except ValueError:  # not JSON, or not UTF-8
            whole = False
        if whole:
            fh.write(b"\n")
            return "its last record had no line end (a write cut short); added it"
        fh.truncate(start)
        return (f"dropped the torn end of its last record ({size - start} bytes, left by a write "
                f"that failed); the records before it are intact")


def check_log_path(path: Path) -> None:
    """A MetricsError, in MetricsLog's words, where what stands at `path` cannot be opened
    as the log (a folder, a FIFO, which would block, a symlink, which would write outside
    the run's folder, a file that cannot be read and written). MetricsLog asks it as it
    opens, and the trainer's check of its run folder before a run (gpt/checkpoint/run_folder.py)
    asks the same. Writes nothing."""
    problem = entry_problem(path, APPENDED)
    if problem is not None:
        raise MetricsError(f"{path}: cannot open the metrics log for appending: it {problem}; "
                           f"remove or rename it")


class MetricsLog:
    """Append-only JSONL file: one JSON object per line (a header record, then one per event).

    Each record is written as it comes, in one unbuffered write, so a crashed run keeps
    everything up to its last step, and a reader can tail the file while training runs.
    Every line parses, whatever fails: a write cut short (full disk, file-size limit) is
    taken back before the error is raised, and a torn record that a crash left at the end
    is completed or dropped when the log is opened again (with a note). A log made with
    enabled=False (every rank but 0) opens nothing and writes nothing, so callers need
    no rank checks.
    """

    def __init__(self, path: str | os.PathLike, enabled: bool = True,
                 trackers: Sequence[Tracker] = ()) -> None:
        self.path = Path(path)
        self._fh = None
        self.trackers = list(trackers)  # every record goes to these as well (not closed here)
        if enabled:
            check_log_path(self.path)
            try:
                note = repair_tail(self.path)
                # never through a link (check_log_path refused one; one planted since fails)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                             | getattr(os, "O_NOFOLLOW", 0), 0o666)
                self._fh = os.fdopen(fd, "ab", buffering=0)
            except OSError as e:
                raise MetricsError(f"{self.path}: cannot open the metrics log for appending "
                                   f"({e.strerror or e})") from None
            if note:
                print(f"note: {self.path}: {note}", file=sys.stderr)

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            return
        data = memoryview((json.dumps(record) + "\n").encode("utf-8"))
        start = -1  # the file's size before this record
        try:
            start = os.fstat(self._fh.fileno()).st_size
            while data:
                data = data[self._fh.write(data):]
        except OSError as e:  # a full disk, a quota, a file-size limit
            fh, self._fh = self._fh, None
            with contextlib.suppress(OSError):
                if start >= 0:  # take back what part of the record got written (no space needed)
                    os.ftruncate(fh.fileno(), start)
                fh.close()
            raise MetricsError(f"{self.path}: cannot write the metrics log ({e.strerror or e}); "
                               f"the records before this one are intact") from None
        for tracker in list(self.trackers):
            try:
                tracker.write(record)
            except Exception as e:  # a tracking service must not stop training
                print(f"warning: {type(tracker).__name__} failed ({type(e).__name__}: {e}); "
                      f"it gets no more records, metrics.jsonl still does", file=sys.stderr)
                self.trackers.remove(tracker)

    def close(self) -> None:
        """Close the file; the trackers belong to whoever opened them."""
        if self._fh is not None:
            self._fh.close()

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
