"""The trainer, start to end: the preflight's plan, this rank's runtime, the run built,
the loop run, the process group torn down; and the one-line errors a run can end with.

Run it as `python train_gpt2.py [flags]` (or `gpt2-train`); `--help` lists every flag.
The same code runs one process or one rank under torchrun."""

from __future__ import annotations

import os
import sys
from typing import Any

from gpt.core.config import Config
from gpt.core.errors import UserError
from gpt.plan.preflight import Plan, preflight
from gpt.report.trackers import close_trackers
from gpt.runtime.device import is_oom, reuse_freed_memory
from gpt.runtime.world import Runtime, init_runtime, peer_lost, shutdown
from gpt.train.build import build_run
from gpt.train.loop import run_loop


class OutOfMemory(UserError):
    """The device (or host) ran out of memory; the message says which flag to lower."""


def train(cfg: Config) -> dict[str, Any]:
    """Run training as configured (one process, or one rank under torchrun)."""
    # Every check before the ranks meet, as the dry run makes them: a refusal is one
    # line, not a rendezvous that waits for --dist-timeout
    plan = preflight(cfg).settled()
    cfg = plan.cfg  # settled: --init-from's shape, the automatic layout's values
    if plan.runtime.is_master:
        if plan.layout is not None:
            print(plan.layout.line(), flush=True)
        if plan.time_line is not None:  # how long it should take, as the dry run says it
            print(plan.time_line, flush=True)
        for warning in plan.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    runtime = init_runtime(cfg.train.device, cfg.train.dist_timeout)
    if runtime.device_type == "cpu" and cfg.train.cpu_malloc_reuse:
        reuse_freed_memory()
    clean = False
    try:
        result = build_and_run(plan, runtime)
        clean = True
        return result
    except (RuntimeError, MemoryError) as e:
        if not is_oom(e):
            lost = peer_lost(e, runtime)  # one line: the rank that stopped says why
            if lost is None:
                raise
            raise lost from None
        d = cfg.data
        raise OutOfMemory(
            f"out of memory on {runtime.device} at --batch-size {d.batch_size} x --seq-len "
            f"{d.seq_len}: lower --batch-size (gradient accumulation keeps each step at "
            f"--total-batch-tokens {d.total_batch_tokens}), or add --activation-checkpointing "
            f"(or let the planner fit both: --batch-size auto --activation-checkpointing auto);"
            f" `python -m gpt.bench memory <these flags> --world-size {runtime.world_size} "
            f"--largest-batch` predicts the peak and the largest batch that fits"
            f" ({' '.join(str(e).split())[:200]})") from None
    finally:
        shutdown(runtime, clean)


def build_and_run(plan: Plan, runtime: Runtime) -> dict[str, Any]:
    """The run lives in this frame alone, so it is gone by the time the process group is
    torn down (see gpt/runtime/world.py's shutdown)."""
    run = build_run(plan, runtime)
    try:
        return run_loop(run)
    finally:
        close_trackers(run.trackers)
        run.checkpointer.close()



def main_with(cfg: Config) -> int:
    """Train as configured; the process's exit status (one line on stderr for errors)."""
    prefix = f"[rank {os.environ['RANK']}] " if "RANK" in os.environ else ""
    try:
        result = train(cfg)
    except UserError as e:
        print(f"{prefix}error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"{prefix}interrupted", file=sys.stderr)
        return 130
    if result["stopped_by"] is not None:
        return 128 + int(result["stopped_by"])  # the conventional status of that signal
    return 0
