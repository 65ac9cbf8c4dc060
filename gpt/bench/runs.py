"""Whole runs, each in a process of its own, as the benchmarks that measure them start them
(cpu-malloc, tokens, prepare, the GPU acceptance's trainer cells): train_gpt2.py's and
fineweb.py's command lines, a failed run as one line ending with the tool's own last words,
the trainer's metrics.jsonl read back, and the order of repeated runs.

Torch-free: the parent only starts and reads; the runs import torch themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from gpt.bench.record import REPO
from gpt.errors import UserError

TRAINER = REPO / "train_gpt2.py"
FINEWEB = REPO / "fineweb.py"


def trainer_command(flags: Sequence[str]) -> list[str]:
    return [sys.executable, str(TRAINER), *flags]


def run_tool(cmd: Sequence[str], what: str, env: dict[str, str] | None = None) -> float:
    """Run ``cmd`` from the repository root, its output captured; its wall seconds. A run
    that fails is a UserError naming ``what``, ending with the end of its stderr (where the
    trainer and fineweb.py say in one line what was wrong)."""
    started = time.perf_counter()
    proc = subprocess.run(list(cmd), cwd=REPO, capture_output=True, text=True,
                          env=None if env is None else {**os.environ, **env})
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise UserError(f"{what} failed: {proc.stderr.strip()[-2000:]}")
    return seconds


def run_trainer(flags: Sequence[str], what: str, env: dict[str, str] | None = None) -> float:
    """train_gpt2.py with ``flags`` (see run_tool); its wall seconds."""
    return run_tool(trainer_command(flags), what, env)


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
