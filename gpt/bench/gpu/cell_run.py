"""One cell of the GPU acceptance (`python -m gpt.bench gpu`, gpt/bench/gpu/accept.py), run: in
a process group of its own (gpt.bench.runs.run_group) within its time limit, killed whole
past it; skipped, with the reason, where it cannot run here (--smoke on a CPU, its optional
package missing); stopped, its group killed, when SIGTERM or SIGINT arrives (Signals);
its output read into figures (gpt/bench/gpu/results.py).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np

from gpt.bench.gpu import nanogpt
from gpt.bench.gpu.inputs import Packages
from gpt.bench.gpu.results import RESULTS, predicted_memory, with_measured
from gpt.bench.gpu.stages import CUDA_ONLY_LOSSES, LR_WARMUP_STEPS, Cell, Sizes
from gpt.bench.record import REPO
from gpt.bench.runs import run_group

HANG_FACTOR, HANG_MIN_S = 5.0, 600.0  # without --budget: a cell this far past its estimate is hung


class Stopped(Exception):
    """SIGTERM or SIGINT arrived while a cell ran."""


class Signals:
    """SIGTERM and SIGINT while the stages run (in the main thread, where Python takes
    signals): raised as Stopped while a cell runs (run_group kills its process group on
    the way out), else noted for the loop to act on before the next cell."""

    def __init__(self) -> None:
        self.received: str | None = None
        self.armed = False
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> "Signals":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signal.Signals(signum).name
        if self.armed:
            self.armed = False
            raise Stopped(self.received)


def skip_reason(cell: Cell, sizes: Sizes, packages: Packages) -> str | None:
    loss, fp8 = cell.params.get("loss"), cell.params.get("fp8", "off")
    if sizes.smoke and loss in CUDA_ONLY_LOSSES:
        return f"--smoke: --loss-kernel {loss} runs Triton kernels on CUDA only"
    if sizes.smoke and fp8 != "off":
        return f"--smoke: --fp8 {fp8} runs FP8 matmuls on CUDA only"
    if sizes.smoke and cell.kind == "nanogpt":
        return "--smoke: build-nanogpt's model is fixed at GPT-2 124M, too big for a CPU check"
    return next((packages.missing[m] for m in cell.needs if m in packages.missing), None)


def run_cell(cell: Cell, limit_s: float, sizes: Sizes, tokens: tuple[np.ndarray, np.ndarray],
             nanogpt_path: Path | None, tmp: Path, log: Any,
             packages: Packages | None = None) -> dict[str, Any]:
    packages = packages or Packages()
    record: dict[str, Any] = {"name": cell.name, "kind": cell.kind, "params": cell.params,
                              "estimate_s": round(cell.estimate_s)}
    reason = skip_reason(cell, sizes, packages)
    if reason:
        return {**record, "status": "skipped", "reason": reason}
    if cell.kind == "trainer":  # predicted before it runs: an out-of-memory cell keeps it
        record["memory"] = predicted_memory(cell)
    env = dict(packages.env)
    if cell.kind == "nanogpt":
        try:
            if nanogpt_path is None:
                raise nanogpt.MissingBaseline("no --nanogpt PATH was given")
            script = nanogpt.prepare(nanogpt_path, tmp / cell.name, *tokens,
                                     batch_size=cell.params["batch_size"],
                                     total_batch_tokens=sizes.tokens_per_step, max_steps=cell.params["steps"],
                                     warmup_steps=LR_WARMUP_STEPS)
        except (nanogpt.MissingBaseline, ValueError) as e:
            return {**record, "status": "failed", "reason": str(e)}
        cell.cmd = [sys.executable, str(script)]
        env.update(nanogpt.tiktoken_env(tmp / "tiktoken_cache"))
    record["command"] = " ".join(cell.cmd)
    t0 = time.perf_counter()
    cwd = tmp / cell.name if cell.kind == "nanogpt" else REPO
    code, stdout, stderr = run_group(cell.cmd, cwd, limit_s, env=env)
    record["seconds"] = round(time.perf_counter() - t0, 1)
    if code is None:
        log.write(f"\n===== {cell.name}: timed out after {limit_s:.0f} s\n$ {record['command']}\n"
                  f"{stdout}{stderr}")
        return {**record, "status": "timeout",
                "reason": f"ran past its {limit_s:.0f} s; its process group was killed"}
    log.write(f"\n===== {cell.name} (exit {code}, {record['seconds']} s)\n"
              f"$ {record['command']}\n{stdout}{stderr}")
    proc = subprocess.CompletedProcess(cell.cmd, code, stdout, stderr)
    try:
        record["result"] = RESULTS[cell.kind](cell, proc, sizes, tmp)
    except (OSError, ValueError, KeyError, StopIteration, ET.ParseError) as e:
        record["result"] = {"error": f"{type(e).__name__}: {e}"}
    if "memory" in record:
        record["memory"] = with_measured(record["memory"], record["result"])
    ok = code == 0 and "error" not in record["result"]
    if not ok:
        tail = (stderr or stdout).strip().splitlines()[-5:]
        record["reason"] = f"exit {code}: " + " | ".join(tail)
    return {**record, "status": "ok" if ok else "failed"}


def cell_limit(cell: Cell, left: float | None, smoke: bool) -> float:
    """How long a cell may run: what is left of the budget (less its reserve: stopping the
    cell and writing the results fit before the budget ends), else until it is plainly
    hung."""
    if left is not None:
        return max(1.0, left)
    return HANG_MIN_S if smoke else max(HANG_MIN_S, HANG_FACTOR * cell.estimate_s)


def not_run(cell: Cell, reason: str) -> dict[str, Any]:
    return {"name": cell.name, "kind": cell.kind, "params": cell.params,
            "estimate_s": round(cell.estimate_s), "status": "skipped", "reason": reason}
