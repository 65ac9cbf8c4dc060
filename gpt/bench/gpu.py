"""`gpu`: the GPU acceptance run, one stage per device call (gpt/bench/gpu_plan.py says what
each stage runs, why in that order, and how long each cell is expected to take).

    python -m gpt.bench gpu --plan [--json]                          # every call a session makes
    PYTHONPATH=. python3 -m gpt.bench gpu --stage 1 --out $OUT       # on the GPU machine
    python -m gpt.bench gpu --stage 1 --smoke --out /tmp/g1          # CPU plumbing check (CI)

The acceptance spans three device sessions (15 minutes each, a fresh machine each):
Session 1, stage 1: `pytest -m cuda`; GPT-2 124M through train_gpt2.py and build-nanogpt,
  micro-batch 64. Stage 2: GPT-2 XL on one GPU, torchrun --parallel fsdp
  --activation-checkpointing.
Session 2, stage 3: GPT-2 124M and build-nanogpt at micro-batch 16 and 32.
Session 3, stage 7: GPT-2 124M at micro-batch 64, the chunked loss through ours, Liger
  Kernel's and Cut Cross-Entropy's kernels (--loss-kernel), and --no-chunked-loss.
Optional, a session each: stage 4, GPT-2 124M, micro-batch 64, --compile-mode max-autotune;
stage 5, the speed ladder (`python -m gpt.bench ladder`); stage 6, GPT-2 recipe vs the
speedrun-era recipe at 124M (`python -m gpt.bench tokens`), on a real corpus carried in
.carry/tokens-data.

Every cell runs as a subprocess in a process group of its own, with a time limit drawn from
the stage's --budget: a cell that runs past it has its whole group killed (torchrun's
workers, pytest's trainer runs) and is recorded as a timeout, and the cells that no longer
fit are recorded as skipped with the reason; --only runs chosen cells in a later call. A
stage with build-nanogpt cells fails at once, running nothing, when the baseline is not
there. Results: one JSON (`gpu_stage<N>.json`: the machine, versions, commit, command,
every cell's raw figures and estimate, ours / build-nanogpt at each micro-batch, each other
head + loss against ours, and each trainer cell's predicted peak memory beside the measured
one) and a markdown summary beside it. Step times come from the trainer's own per-step log
(synchronised at every step here); the first WARMUP steps (compilation, autotuning,
allocator warm-up) are left out of the medians, and compile time is the first step's time
minus the median. Bench cells write no checkpoint (--no-save-checkpoints). --smoke runs the
same stages with tiny sizes on the CPU in seconds and writes the same schema
(build-nanogpt's cells are skipped there: its model is fixed at 124M; so are the Liger and
Cut Cross-Entropy cells: their kernels run on CUDA only). Everything imported here exists
on the GPU machine's image (no `datasets`).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpt.bench import nanogpt
from gpt.bench.gpu_plan import (CUDA_ONLY_LOSSES, LR_WARMUP_STEPS, REPO, STAGE_BUDGET_S, STAGES,
                                Cell, Sizes, pytest_workers, render_plan, session_plan,
                                stage_cells)
from gpt.bench.gpu_results import (RESULTS, comparisons, loss_comparisons, predicted_memory,
                                   summary, with_measured)
from gpt.bench.args import standalone_parser
from gpt.bench.record import command_line, git_commit, now, write_json, write_text
from gpt.bench.report import machine
from gpt.bench.runs import run_group
from gpt.dist import device_name
from gpt.cli import finite_float
from gpt.errors import UserError
from gpt.metrics import peak_tflops
from gpt.shards import write_shard

SCHEMA = 3  # 2: stages renumbered (5), estimate_s, memory and comparison; 3: stage 7, loss_comparison


class StageError(UserError):
    """A stage cannot run here (its baseline or corpus is missing); nothing was run."""


class NoGPU(UserError):
    """A stage, not --smoke, on a machine without CUDA."""

    exit_code = 2


# ---------------------------------------------------------------------------------------
# running cells (each in a process group of its own: gpt.bench.runs.run_group)


def run_cell(cell: Cell, limit_s: float, sizes: Sizes, tokens: tuple[np.ndarray, np.ndarray],
             nanogpt_dir: Path, tmp: Path, log: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"name": cell.name, "kind": cell.kind, "params": cell.params,
                              "estimate_s": round(cell.estimate_s)}
    loss = cell.params.get("loss")
    if sizes.smoke and loss in CUDA_ONLY_LOSSES:
        return {**record, "status": "skipped", "reason": f"--smoke: --loss-kernel {loss} runs "
                "Triton kernels on CUDA only"}
    if cell.kind == "trainer":  # predicted before it runs: an out-of-memory cell keeps it
        record["memory"] = predicted_memory(cell)
    if cell.kind == "nanogpt":
        if sizes.smoke:
            return {**record, "status": "skipped", "reason": "--smoke: build-nanogpt's model is "
                    "fixed at GPT-2 124M, too big for a CPU check"}
        try:
            script = nanogpt.prepare(nanogpt_dir, tmp / cell.name, *tokens,
                                     batch_size=cell.params["batch_size"],
                                     total_batch_tokens=sizes.tokens_per_step, max_steps=cell.params["steps"],
                                     warmup_steps=LR_WARMUP_STEPS)
        except (nanogpt.MissingBaseline, ValueError) as e:
            return {**record, "status": "failed", "reason": str(e)}
        cell.cmd = [sys.executable, str(script)]
    record["command"] = " ".join(cell.cmd)
    t0 = time.perf_counter()
    cwd = tmp / cell.name if cell.kind == "nanogpt" else REPO
    code, stdout, stderr = run_group(cell.cmd, cwd, limit_s)
    record["seconds"] = round(time.perf_counter() - t0, 1)
    if code is None:
        log.write(f"\n===== {cell.name}: timed out after {limit_s:.0f} s\n$ {record['command']}\n"
                  f"{stdout}{stderr}")
        return {**record, "status": "timeout",
                "reason": f"ran past its {limit_s:.0f} s (what was left of the budget); its "
                          f"process group was killed"}
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


# ---------------------------------------------------------------------------------------
# the run


def environment(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    commit, dirty = git_commit()
    env: dict[str, Any] = {**machine(device), "host": socket.gethostname(),
                           "commit": args.commit or commit, "commit_dirty": dirty,
                           "peak_tflops": peak_tflops(device_name(device))}
    if device.type == "cuda":
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                                  "clocks.max.sm,power.limit", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            env["nvidia_smi"] = smi.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            env["nvidia_smi"] = None
    return env


def make_tokens(n_train: int, n_val: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random GPT-2 token ids: the same for the trainer and the baseline."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 50257, n_train).astype(np.uint16),
            rng.integers(0, 50257, n_val).astype(np.uint16))


def baseline_missing(cells: list[Cell], smoke: bool, script_dir: Path) -> str | None:
    """Why build-nanogpt cannot run here, when the stage has its cells (and is not --smoke,
    which skips them); None when it can."""
    if smoke or not any(c.kind == "nanogpt" for c in cells):
        return None
    try:
        nanogpt.check(script_dir)
    except (nanogpt.MissingBaseline, ValueError) as e:
        return str(e)
    return None


def run(args: argparse.Namespace) -> int:
    if args.plan:
        return show_plan(args.json)
    if args.json:
        args.parser.error("--json goes with --plan (a stage always writes its JSON)")
    if args.out is None:
        args.parser.error(f"--stage {args.stage} needs --out DIR (where its JSON, markdown and log go)")
    sizes = Sizes.make(args.smoke)
    with tempfile.TemporaryDirectory(prefix=f"gpu_stage{args.stage}_") as tmp_name:
        tmp = Path(tmp_name)
        cells = stage_cells(args.stage, sizes, tmp / "data", tmp / "runs", tmp, pytest_workers())
        names = [c.name for c in cells]
        unknown = [n for n in args.only or [] if n not in names]
        if unknown:
            args.parser.error(f"--only {' '.join(unknown)}: not a cell of stage {args.stage} "
                              f"(its cells: {', '.join(names)})")
        cells = [c for c in cells if not args.only or c.name in args.only]
        missing = baseline_missing(cells, args.smoke, Path(args.nanogpt))
        if missing:  # no comparison, no acceptance: fail before spending the call's minutes
            raise StageError(f"stage {args.stage} compares with build-nanogpt, which cannot run: "
                             f"{missing}; nothing was run")
        corpus = [c.params["data_dir"] for c in cells if c.kind == "tokens" and not args.smoke]
        if corpus and not Path(corpus[0]).is_dir():
            raise StageError(f"stage {args.stage} needs a real corpus in {corpus[0]} (random "
                             f"tokens have no loss to compare): prepare it as "
                             f"benchmarks/gpu/README.md says; nothing was run")
        device = torch.device("cpu" if args.smoke else "cuda")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise NoGPU("no CUDA device; run on a GPU machine, or use --smoke to check the "
                        "plumbing on the CPU")
        return run_stage(args, sizes, cells, device, tmp)


def run_stage(args: argparse.Namespace, sizes: Sizes, cells: list[Cell], device: torch.device,
              tmp: Path) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "schema": SCHEMA, "stage": args.stage, "title": STAGES[args.stage].title, "smoke": args.smoke,
        "command": command_line(args.argv), "started": now(), "budget_s": args.budget,
        "estimates": "each cell's estimate_s is gpt/bench/gpu_plan.py's, not measured; beside "
                     "its seconds (what it took) it calibrates the plan",
        "env": environment(args, device), "cells": [],
    }
    with open(out / f"gpu_stage{args.stage}.log", "w", encoding="utf-8") as log:
        tokens = make_tokens(2 * sizes.tokens_per_step * sizes.steps + 1_000_000, 200_000)
        data = tmp / "data"
        data.mkdir()
        write_shard(data / "train_000000.bin", tokens[0])
        write_shard(data / "val_000000.bin", tokens[1])
        for cell in cells:
            left = args.budget - (time.perf_counter() - t0)
            if left < cell.estimate_s and not args.smoke:
                report["cells"].append({"name": cell.name, "kind": cell.kind, "params": cell.params,
                                        "estimate_s": round(cell.estimate_s), "status": "skipped",
                                        "reason": f"budget: {left:.0f} s left of {args.budget:.0f}, "
                                                  f"the cell needs about {cell.estimate_s:.0f}; "
                                                  f"run it with --only {cell.name}"})
                continue
            print(f"[{time.perf_counter() - t0:6.0f} s] {cell.name} ...", flush=True)
            result = run_cell(cell, max(60.0, left) if not args.smoke else 600.0, sizes, tokens,
                              Path(args.nanogpt), tmp, log)
            report["cells"].append(result)
            print(f"[{time.perf_counter() - t0:6.0f} s] {cell.name}: {result['status']}"
                  + (f" ({result['reason']})" if result.get("reason") else ""), flush=True)
            log.flush()
    report["seconds"] = round(time.perf_counter() - t0, 1)
    report["comparison"] = comparisons(report["cells"])
    report["loss_comparison"] = loss_comparisons(report["cells"])
    write_json(out / f"gpu_stage{args.stage}.json", report, indent=1)
    write_text(out / f"gpu_stage{args.stage}.md", summary(report))
    print(summary(report))
    print(f"wrote {out}/gpu_stage{args.stage}.json, .md and .log")
    failed = [c["name"] for c in report["cells"] if c["status"] in ("failed", "timeout")]
    return 1 if failed else 0


def show_plan(as_json: bool) -> int:
    """Prints every call a session makes; runs nothing and needs no GPU."""
    commit, dirty = git_commit()
    plan = session_plan(commit or "SHA")
    plan["commit"], plan["commit_dirty"] = commit, dirty
    if as_json:
        print(json.dumps(plan, indent=1))
        return 0
    print(render_plan(plan), end="")
    if dirty or commit is None:
        print("Commit first: the device runs this working tree, and --commit should name what ran.")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = standalone_parser(sub, "gpu", __doc__, run)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--stage", type=int, choices=tuple(STAGES), help="run this stage (one device call)")
    what.add_argument("--plan", action="store_true",
                      help="print every call a session makes (stage, cells, estimated seconds, "
                           "command); runs nothing")
    p.add_argument("--json", action="store_true", help="with --plan: the plan as one JSON object")
    p.add_argument("--out", help="folder for gpu_stage<N>.json, .md and .log ($OUT)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU: checks the plumbing")
    p.add_argument("--budget", type=finite_float(0, above=True), default=float(STAGE_BUDGET_S),
                   help=f"seconds for the stage's cells; those that would not fit are skipped "
                        f"(default {STAGE_BUDGET_S}: a 10-minute call less its own start and report)")
    p.add_argument("--only", nargs="+", metavar="CELL", help="run only these cells of the stage")
    p.add_argument("--nanogpt", default=str(REPO / nanogpt.DEFAULT_DIR),
                   help="folder holding build-nanogpt's train_gpt2.py (default .carry/build-nanogpt)")
    p.add_argument("--commit", default=None,
                   help="the commit measured, where the checkout has no .git (the device tool's copy)")
    p.set_defaults(parser=p)
