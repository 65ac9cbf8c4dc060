"""`gpu`: the GPU acceptance run, stage by stage, on your own GPU machine.

    python -m gpt.bench gpu --plan                                   # every stage, its cells, estimated seconds
    python -m gpt.bench gpu --plan throughput xl --budget 600        # a choice, and what would not fit
    python -m gpt.bench gpu cuda-tests throughput xl --out results/h100 --nanogpt ~/build-nanogpt/train_gpt2.py
    python -m gpt.bench gpu loss-kernels fp8 --out results/h100 --wheels ~/wheels
    python -m gpt.bench gpu fp8-loss tokens --out results/h100 --corpus data/fineweb-edu-10B
    python -m gpt.bench gpu throughput xl --smoke --out /tmp/g       # the plumbing, on a CPU, in seconds

Stages (gpt/bench/gpu/stages.py says what each runs): cuda-tests, throughput (124M, ours vs
build-nanogpt at micro-batch 64, 32, 16), xl, loss-kernels, profile, fp8, fp8-loss,
speedrun, max-autotune, ladder, tokens; `all` names them all. They run in the order named.

Every cell runs as a subprocess in a process group of its own. With --budget SECONDS the
invocation's cells share that time, in order: a cell whose estimate no longer fits is
recorded as skipped with the reason (run it later with --only CELL), and a cell that runs
past what is left is stopped, its whole group killed (torchrun's workers, pytest's trainer
runs), and recorded as a timeout. Without --budget, a cell is stopped only past
HANG_FACTOR times its estimate (at least 10 minutes): hung. A stage that lacks what it
needs (--nanogpt, --corpus, a package) fails at once, running nothing. A cell whose command
an earlier stage of the invocation ran takes that measurement ("same_as"). Results, per stage,
under --out: `gpu_<stage>.json` (the machine, versions, commit, command, every cell's raw
figures and estimate, the comparisons, each trainer cell's predicted peak memory beside
the measured one), `gpu_<stage>.md` (its summary) and `gpu_<stage>.log` (every cell's
output); an earlier run's files are kept, the new ones numbered (`gpu_<stage>-2.json`).
Step times come from the trainer's own per-step log (synchronised at every step here);
the first WARMUP steps (compilation, autotuning, allocator warm-up) are left out of the
medians, and compile time is the first step's time minus the median. Bench cells write no
checkpoint (--no-save-checkpoints). --smoke runs the same stages with tiny sizes on the
CPU and writes the same schema (build-nanogpt's cells are skipped there: its model is
fixed at 124M; so are the cells of Liger, Cut Cross-Entropy and FP8: CUDA only).
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

from gpt.bench.args import standalone_parser
from gpt.bench.gpu import inputs, nanogpt
from gpt.bench.gpu.inputs import Packages
from gpt.bench.gpu.plan import plan, render_plan
from gpt.bench.gpu.results import RESULTS, comparisons_of, predicted_memory, summary, with_measured
from gpt.bench.gpu.stages import (CUDA_ONLY_LOSSES, FULL, LOSS_PACKAGES, LR_WARMUP_STEPS, NOWHERE,
                                  STAGES, Cell, Sizes, Where, pytest_workers, same_command,
                                  stage_cells)
from gpt.bench.record import REPO, command_line, git_commit, now, write_json, write_text
from gpt.bench.report import machine
from gpt.bench.runs import run_group
from gpt.core.cli import finite_float
from gpt.runtime.device import device_name
from gpt.core.errors import UserError
from gpt.report.flops import peak_tflops
from gpt.data.shards import write_shard

# 4: stages by name ("stage" is a name), budget_s per invocation (null: none), params fp8
# and recipe, fp8_comparison, recipe_comparison, packages, mean loss differences
SCHEMA = 4
HANG_FACTOR, HANG_MIN_S = 5.0, 600.0  # without --budget: a cell this far past its estimate is hung


class NoGPU(UserError):
    """A stage, not --smoke, on a machine without CUDA."""

    exit_code = 2


def clock() -> float:
    return time.perf_counter()


# ---------------------------------------------------------------------------------------
# running cells (each in a process group of its own: gpt.bench.runs.run_group)


def skip_reason(cell: Cell, sizes: Sizes, packages: Packages) -> str | None:
    loss, fp8 = cell.params.get("loss"), cell.params.get("fp8", "off")
    if sizes.smoke and loss in CUDA_ONLY_LOSSES:
        return f"--smoke: --loss-kernel {loss} runs Triton kernels on CUDA only"
    if sizes.smoke and fp8 != "off":
        return f"--smoke: --fp8 {fp8} runs FP8 matmuls on CUDA only"
    if sizes.smoke and cell.kind == "nanogpt":
        return "--smoke: build-nanogpt's model is fixed at GPT-2 124M, too big for a CPU check"
    module = LOSS_PACKAGES.get(loss or "")
    if module in packages.missing:
        return packages.missing[module]
    return None


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


def chosen_stages(args: argparse.Namespace) -> list[str]:
    names = list(STAGES) if "all" in args.stages or (args.plan and not args.stages) else args.stages
    unknown = [n for n in names if n not in STAGES]
    if unknown:
        args.parser.error(f"unknown stage {unknown[0]!r}: the stages are {', '.join(STAGES)} (or all)")
    if not names:
        args.parser.error("name the stages to run (or all); --plan lists them")
    return list(dict.fromkeys(names))


def run(args: argparse.Namespace) -> int:
    names = chosen_stages(args)
    if args.plan:
        check_only(args, names, [c.name for n in names for c in stage_cells(n, FULL, NOWHERE)])
        return show_plan(names, args.budget, args.json, args.only)
    if args.json:
        args.parser.error("--json goes with --plan (a stage always writes its JSON)")
    if args.out is None:
        args.parser.error("the stages need --out DIR (where their JSON, markdown and logs go)")
    sizes = Sizes.make(args.smoke)
    with tempfile.TemporaryDirectory(prefix="gpu_") as tmp_name:
        tmp = Path(tmp_name)
        where = Where(tmp / "data", tmp / "runs", tmp, Path(args.corpus) if args.corpus else None,
                      pytest_workers())
        stages = {n: stage_cells(n, sizes, where) for n in names}
        check_only(args, names, [c.name for cells in stages.values() for c in cells])
        stages = {n: [c for c in cells if not args.only or c.name in args.only] for n, cells in stages.items()}
        stages = {n: cells for n, cells in stages.items() if cells}
        inputs.check(stages, args)  # before anything runs
        device = torch.device("cpu" if args.smoke else "cuda")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise NoGPU("no CUDA device; run on a GPU machine, or use --smoke to check the "
                        "plumbing on the CPU")
        packages = inputs.prepare(list(stages), inputs.wheels_dir(args), tmp / "site")
        return run_stages(args, sizes, stages, device, tmp, packages)


def check_only(args: argparse.Namespace, names: list[str], known: list[str]) -> None:
    """--only names cells of the stages named, or is a one-line error listing theirs."""
    unknown = [n for n in args.only or [] if n not in known]
    if unknown:
        args.parser.error(f"--only {' '.join(unknown)}: not a cell of {', '.join(names)} "
                          f"(their cells: {', '.join(dict.fromkeys(known))})")


def cell_limit(cell: Cell, left: float | None, smoke: bool) -> float:
    """How long a cell may run: what is left of the budget (at least a minute), else until
    it is plainly hung."""
    if left is not None:
        return max(60.0, left)
    return HANG_MIN_S if smoke else max(HANG_MIN_S, HANG_FACTOR * cell.estimate_s)


def run_stages(args: argparse.Namespace, sizes: Sizes, stages: dict[str, list[Cell]],
               device: torch.device, tmp: Path, packages: Packages) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = clock()
    env = environment(args, device)
    # random tokens for every cell but those of --corpus (all of them in --smoke)
    steps = max(sizes.steps, sizes.loss_steps if sizes.smoke else 0)
    per_step = max([sizes.tokens_per_step] + [c.params.get("tokens_per_step", 0)
                                              for cells in stages.values() for c in cells])
    tokens = make_tokens(2 * per_step * steps + 1_000_000, 200_000)
    data = tmp / "data"
    data.mkdir()
    write_shard(data / "train_000000.bin", tokens[0])
    write_shard(data / "val_000000.bin", tokens[1])
    failed = []
    measured: dict[str, tuple[str, dict[str, Any]]] = {}  # a command run: its stage, result
    for name, cells in stages.items():
        stem = free_stem(out, f"gpu_{name}")
        report: dict[str, Any] = {
            "schema": SCHEMA, "stage": name, "title": STAGES[name].title, "smoke": args.smoke,
            "command": command_line(args.argv), "started": now(), "budget_s": args.budget,
            "estimates": "each cell's estimate_s is gpt/bench/gpu/estimates.py's for one H100, not "
                         "measured; beside its seconds (what it took) it says how far off it is",
            "env": env, "packages": {m: packages.status.get(m, "missing") for m in
                                     (*STAGES[name].requires, *STAGES[name].optional)},
            "cells": [],
        }
        started = clock()
        with open(out / f"{stem}.log", "w", encoding="utf-8") as log:
            for cell in cells:
                earlier = measured.get(same_command(cell))
                if earlier is not None:  # the same command ran in an earlier stage: its figures
                    report["cells"].append({**earlier[1], "same_as": earlier[0]})
                    print(f"[{clock() - t0:6.0f} s] {name}: {cell.name}: as measured in stage "
                          f"{earlier[0]}", flush=True)
                    continue
                left = None if args.budget is None else args.budget - (clock() - t0)
                if left is not None and (left < cell.estimate_s or left <= 0):
                    report["cells"].append({
                        "name": cell.name, "kind": cell.kind, "params": cell.params,
                        "estimate_s": round(cell.estimate_s), "status": "skipped",
                        "reason": f"budget: {max(0.0, left):.0f} s left of {args.budget:.0f}, the cell "
                                  f"needs about {cell.estimate_s:.0f}; run it with --only {cell.name}"})
                    continue
                print(f"[{clock() - t0:6.0f} s] {name}: {cell.name} ...", flush=True)
                result = run_cell(cell, cell_limit(cell, left, args.smoke), sizes, tokens,
                                  Path(args.nanogpt) if args.nanogpt else None, tmp, log, packages)
                report["cells"].append(result)
                if result["status"] == "ok":
                    measured[same_command(cell)] = (name, result)
                print(f"[{clock() - t0:6.0f} s] {name}: {cell.name}: {result['status']}"
                      + (f" ({result['reason']})" if result.get("reason") else ""), flush=True)
                log.flush()
        report["seconds"] = round(clock() - started, 1)
        report.update(comparisons_of(report["cells"]))
        write_json(out / f"{stem}.json", report, indent=1)
        write_text(out / f"{stem}.md", summary(report))
        print(summary(report))
        print(f"wrote {out / stem}.json, .md and .log")
        failed += [c["name"] for c in report["cells"] if c["status"] in ("failed", "timeout")]
    return 1 if failed else 0


def free_stem(out: Path, stem: str) -> str:
    """`stem`, or `stem-2`, `stem-3` ...: the first whose JSON is not there (an earlier
    run's results are kept)."""
    n, name = 1, stem
    while (out / f"{name}.json").exists() or (out / f"{name}.log").exists():
        n += 1
        name = f"{stem}-{n}"
    return name


def show_plan(names: list[str], budget: float | None, as_json: bool,
              only: list[str] | None = None) -> int:
    """Prints the chosen stages' cells and estimates; runs nothing and needs no GPU."""
    p = plan(names, budget, only=only)
    print(json.dumps(p, indent=1) if as_json else render_plan(p), end="\n" if as_json else "")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = standalone_parser(sub, "gpu", __doc__, run)
    p.add_argument("stages", nargs="*", metavar="STAGE",
                   help=f"the stages to run, in order: {', '.join(STAGES)}, or all")
    p.add_argument("--plan", action="store_true",
                   help="print the stages' cells and estimated seconds (all stages if none is "
                        "named; with --budget, which cells would not fit); runs nothing")
    p.add_argument("--json", action="store_true", help="with --plan: the plan as one JSON object")
    p.add_argument("--out", metavar="DIR", help="folder for each stage's gpu_<stage>.json, .md and .log")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU: checks the plumbing")
    p.add_argument("--budget", metavar="SECONDS", type=finite_float(0, above=True), default=None,
                   help="seconds for all the cells of this invocation; a cell whose estimate no "
                        "longer fits is skipped, one that runs past what is left is stopped "
                        "(default: no budget)")
    p.add_argument("--only", nargs="+", metavar="CELL", help="run only these cells of the stages named")
    p.add_argument("--nanogpt", metavar="PATH",
                   help="build-nanogpt's train_gpt2.py (or its folder), downloaded from "
                        "https://github.com/karpathy/build-nanogpt: the throughput stage's baseline")
    p.add_argument("--wheels", metavar="DIR",
                   help="wheels of the optional packages (liger-kernel, cut-cross-entropy, torchao) "
                        "to install for the cells where they are not importable (a machine "
                        "without internet)")
    p.add_argument("--corpus", metavar="DIR",
                   help="GPT-2 token shards (train_*/val_*, as fineweb.py writes them) for the "
                        "stages that compare losses: fp8-loss and tokens")
    p.add_argument("--commit", default=None,
                   help="the commit measured, where the checkout has no .git (a copy of the tree)")
    p.set_defaults(parser=p)
