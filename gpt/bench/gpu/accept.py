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
whole invocation, from its start, fits in that time, its cells in order: RESERVE_S of it
are kept for stopping a cell and writing the results; a cell whose estimate no longer fits
is recorded as skipped with the reason (run it later with --only CELL), and a cell that
runs past what is left is stopped, its whole group killed (torchrun's workers, pytest's
trainer runs), and recorded as a timeout. Without --budget, a cell is stopped only past
HANG_FACTOR times its estimate (at least 10 minutes): hung. SIGTERM (a time limit's) or
Ctrl-C stops the cell running the same way, records the cells left as not run, writes
every stage's files and exits 1. A stage that lacks an input it needs (--nanogpt,
--corpus) fails at once, running nothing; a cell whose optional package (Liger Kernel,
Cut Cross-Entropy, torchao) cannot be had (not importable, no wheel in --wheels, or one
that does not install or import) is skipped with the reason, in one line, and the others
run; only the packages the chosen cells use are looked at. A cell whose command an earlier stage of the
invocation ran takes that measurement ("same_as"). Results, per stage, under --out:
`gpu_<stage>.json` (the machine, versions, commit, command, every cell's raw figures and
estimate, the comparisons, each trainer cell's predicted peak memory beside the measured
one), `gpu_<stage>.md` (its summary) and `gpu_<stage>.log` (every cell's output), the
JSON and summary written again after every cell, so a run killed outright (SIGKILL) still
leaves every finished cell's figures; an earlier run's files are kept, the new ones
numbered (`gpu_<stage>-2.json`).
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
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpt.bench.args import standalone_parser
from gpt.bench.gpu import inputs
from gpt.bench.gpu.cell_run import Signals, Stopped, cell_limit, not_run, run_cell
from gpt.bench.gpu.inputs import Packages
from gpt.bench.gpu.plan import RESERVE_S, plan, render_plan
from gpt.bench.gpu.results import comparisons_of, summary
from gpt.bench.gpu.stages import (FULL, NOWHERE, STAGES, Cell, Sizes, Where, pytest_workers,
                                  same_command, stage_cells)
from gpt.bench.record import command_line, git_commit, now, write_json, write_text
from gpt.bench.report import machine
from gpt.core.cli import finite_float
from gpt.core.errors import UserError
from gpt.data.shards import write_shard
from gpt.report.flops import peak_tflops
from gpt.runtime.device import device_name

# 4: stages by name ("stage" is a name), budget_s per invocation (null: none), params fp8
# and recipe, fp8_comparison, recipe_comparison, packages, mean loss differences.
# 5: "finished" (whether the stage ran to its end), cells "stopped", the loss-bench cell,
# params softcap, profiles per micro-batch (gpt/bench/trace_summary.py)
# 6: loss-bench variants by launch, judged (tolerances, status "wrong"), and its "choice";
# the loss kernels' baseline is the loss "default"; comparison rows with "loss", the
# earlier stages' cells ("stage") and "fastest"; packages those of the stage's cells; the
# CUDA tests' "durations_s"
SCHEMA = 6


class NoGPU(UserError):
    """A stage, not --smoke, on a machine without CUDA."""

    exit_code = 2


def clock() -> float:
    return time.perf_counter()


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
    t0 = clock()  # --budget counts from here: the wheels' installation is part of it
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
        packages = inputs.prepare([c for cells in stages.values() for c in cells],
                                  inputs.wheels_dir(args), tmp / "site")
        for module, why in packages.missing.items():  # once here; each cell says it again
            print(f"{module}: {why}; the cells that need it are skipped", flush=True)
        return run_stages(args, sizes, stages, device, tmp, packages, t0)


def check_only(args: argparse.Namespace, names: list[str], known: list[str]) -> None:
    """--only names cells of the stages named, or is a one-line error listing theirs."""
    unknown = [n for n in args.only or [] if n not in known]
    if unknown:
        args.parser.error(f"--only {' '.join(unknown)}: not a cell of {', '.join(names)} "
                          f"(their cells: {', '.join(dict.fromkeys(known))})")


def write_stage(out: Path, stem: str, report: dict[str, Any], started: float,
                earlier: list[dict[str, Any]] | None = None) -> None:
    """The stage's JSON and summary as they stand: after every cell, so that whatever ends
    the run, every finished cell's figures are on disk. `earlier`: the cells of the
    invocation's earlier stages (build-nanogpt is compared with each of ours at its
    micro-batch, whichever stage measured it)."""
    report["seconds"] = round(clock() - started, 1)
    report.update(comparisons_of(report["cells"], earlier or []))
    write_json(out / f"{stem}.json", report, indent=1)
    write_text(out / f"{stem}.md", summary(report))


def run_stages(args: argparse.Namespace, sizes: Sizes, stages: dict[str, list[Cell]],
               device: torch.device, tmp: Path, packages: Packages, t0: float | None = None) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = clock() if t0 is None else t0
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
    failed: list[str] = []
    done: list[dict[str, Any]] = []  # the finished stages' cells, each with its stage
    measured: dict[str, tuple[str, dict[str, Any]]] = {}  # a command run: its stage, result
    with Signals() as signals:
        for name, cells in stages.items():
            stem = free_stem(out, f"gpu_{name}")
            report: dict[str, Any] = {
                "schema": SCHEMA, "stage": name, "title": STAGES[name].title, "smoke": args.smoke,
                "command": command_line(args.argv), "started": now(), "budget_s": args.budget,
                "estimates": "each cell's estimate_s is gpt/bench/gpu/estimates.py's for one H100, "
                             "not measured; beside its seconds (what it took) it says how far off it is",
                "env": env, "packages": {m: packages.status.get(m, "missing") for m in
                                         dict.fromkeys(m for c in cells for m in (*c.needs, *c.uses))},
                "cells": [], "finished": False,
            }
            started = clock()
            with open(out / f"{stem}.log", "w", encoding="utf-8") as log:
                for cell in cells:
                    report["cells"].append(run_one(args, cell, name, sizes, tokens, tmp, log,
                                                   packages, measured, signals, t0))
                    log.flush()
                    write_stage(out, stem, report, started, done)
            report["finished"] = True
            write_stage(out, stem, report, started, done)
            print(summary(report))
            print(f"wrote {out / stem}.json, .md and .log")
            done += [{**c, "stage": name} for c in report["cells"]]
            failed += [c["name"] for c in report["cells"]
                       if c["status"] in ("failed", "timeout", "stopped")]
    return 1 if failed or signals.received else 0


def run_one(args: argparse.Namespace, cell: Cell, stage: str, sizes: Sizes,
            tokens: tuple[np.ndarray, np.ndarray], tmp: Path, log: Any, packages: Packages,
            measured: dict[str, tuple[str, dict[str, Any]]], signals: Signals,
            t0: float) -> dict[str, Any]:
    """One cell's record: as measured earlier in the invocation, not run (a signal came,
    the budget has no room for it), or run, within what is left of the budget."""
    elapsed = clock() - t0
    if signals.received:
        return not_run(cell, f"not run: the invocation was stopped ({signals.received}) at "
                             f"{elapsed:.0f} s")
    earlier = measured.get(same_command(cell))
    if earlier is not None:  # the same command ran in an earlier stage: its figures
        print(f"[{elapsed:6.0f} s] {stage}: {cell.name}: as measured in stage {earlier[0]}",
              flush=True)
        return {**earlier[1], "same_as": earlier[0]}
    left = None if args.budget is None else args.budget - elapsed - RESERVE_S
    if left is not None and left < cell.estimate_s:
        return not_run(cell, f"budget: {max(0.0, args.budget - elapsed):.0f} s left of "
                             f"{args.budget:.0f} ({RESERVE_S:.0f} kept for stopping and writing), "
                             f"the cell needs about {cell.estimate_s:.0f}; run it with --only "
                             f"{cell.name}")
    print(f"[{elapsed:6.0f} s] {stage}: {cell.name} ...", flush=True)
    began = clock()
    signals.armed = True
    try:
        result = run_cell(cell, cell_limit(cell, left, args.smoke), sizes, tokens,
                          Path(args.nanogpt) if args.nanogpt else None, tmp, log, packages)
    except Stopped as e:  # run_group killed the cell's process group on the way out
        result = {**not_run(cell, ""), "status": "stopped", "seconds": round(clock() - began, 1),
                  "reason": f"stopped by {e} after {clock() - began:.0f} s; its process group "
                            f"was killed"}
        log.write(f"\n===== {cell.name}: {result['reason']}\n")
    finally:
        signals.armed = False
    if result["status"] == "ok":
        measured[same_command(cell)] = (stage, result)
    print(f"[{clock() - t0:6.0f} s] {stage}: {cell.name}: {result['status']}"
          + (f" ({result['reason']})" if result.get("reason") else ""), flush=True)
    return result


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
