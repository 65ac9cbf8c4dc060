"""Whole runs, each in a process of its own, as the benchmarks that measure them start them
(cpu-malloc, tokens, prepare, the GPU acceptance's trainer cells): train_gpt2.py's and
fineweb.py's command lines, a process group per run that a time limit ends whole, a failed
run as one line ending with the tool's own last words, the trainer's metrics.jsonl read
back, and the order of repeated runs.

Torch-free: the parent only starts and reads; the runs import torch themselves.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from gpt.bench.record import REPO
from gpt.core.errors import UserError

TRAINER = REPO / "train_gpt2.py"
FINEWEB = REPO / "fineweb.py"
KILL_GRACE_S = 10.0  # after SIGTERM: the trainer's stop handler ends its step, torchrun its workers
# A process group of its own for each run, so that a timeout ends all of it; where Python
# allows (3.11+) without setsid, so that the runs stay in the caller's terminal and job:
# whatever ends those (a closed terminal, a batch system's job end) ends the runs too.
GROUP: dict[str, Any] = ({"process_group": 0} if sys.version_info >= (3, 11)
                         else {"start_new_session": True})


def run_group(cmd: list[str], cwd: Path, limit_s: float | None = None,
              env: dict[str, str] | None = None,
              on_start: Callable[[int], None] | None = None) -> tuple[int | None, str, str]:
    """(exit status, or None past limit_s; stdout; stderr) of ``cmd`` in a process group of
    its own, with ``env`` added to this process's. Past the limit the group gets SIGTERM,
    then SIGKILL after KILL_GRACE_S; either way whatever of the group outlives its first
    process is killed (a worker left on the GPU would slow or break the next run).
    ``on_start`` gets the group's id once it runs (for a caller that runs several at once
    from threads, and must end them all on Ctrl-C, which only the main thread sees)."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, **GROUP)
    if on_start is not None:
        on_start(proc.pid)
    code: int | None = None
    try:
        out, err = proc.communicate(timeout=limit_s)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    finally:  # also on Ctrl-C or an error here: nothing of the run may go on
        signal_group(proc.pid, signal.SIGKILL)
    if code is None:
        try:
            out, err = proc.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:  # a process outside the group holds its pipes
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            proc.wait()
            out, err = "", "(output lost: a process outside the run's group kept its pipes open)"
    return code, out, err


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the group is gone already
        pass


def trainer_command(flags: Sequence[str]) -> list[str]:
    return [sys.executable, str(TRAINER), *flags]


def run_tool(cmd: Sequence[str], what: str, env: dict[str, str] | None = None,
             on_start: Callable[[int], None] | None = None) -> float:
    """Run ``cmd`` from the repository root (run_group, no time limit); its wall seconds. A
    run that fails is a UserError naming ``what``, ending with the end of its stderr (where
    the trainer and fineweb.py say in one line what was wrong)."""
    started = time.perf_counter()
    code, _, err = run_group(list(cmd), REPO, env=env, on_start=on_start)
    if code != 0:
        raise UserError(f"{what} failed: {err.strip()[-2000:]}")
    return time.perf_counter() - started


def run_trainer(flags: Sequence[str], what: str, env: dict[str, str] | None = None,
                on_start: Callable[[int], None] | None = None) -> float:
    """train_gpt2.py with ``flags`` (see run_tool); its wall seconds."""
    return run_tool(trainer_command(flags), what, env, on_start)


def run_fineweb(flags: Sequence[str], what: str) -> None:
    """fineweb.py with ``flags`` (see run_tool)."""
    run_tool([sys.executable, str(FINEWEB), *flags], what)


def read_metrics(run_dir: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl, in order; only those of type ``kind`` if given
    ("run" is the header, "train" a step, "val" an evaluation)."""
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return records if kind is None else [r for r in records if r.get("type") == kind]


def rotated(names: Sequence[str], i: int) -> list[str]:
    """The i-th repeat's order of the runs compared: each first in turn, so a drift in the
    machine's load falls on every one alike."""
    names = list(names)
    return names[i % len(names):] + names[: i % len(names)]
