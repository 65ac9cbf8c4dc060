"""`gpu`: the GPU acceptance run, one stage per device call (each well inside 9 minutes).

    PYTHONPATH=. python3 -m gpt.bench gpu --stage 1 --out $OUT     # on the GPU machine
    python -m gpt.bench gpu --stage 1 --smoke --out /tmp/g1          # CPU plumbing check (CI)

Stage 1: `pytest -m cuda` (the CUDA test suite), then GPT-2 124M for 30 steps through
         train_gpt2.py on random tokens (bf16, compile on, the trainer's CUDA defaults).
Stage 2: the 124M throughput grid: micro-batch 16/32/64 x compile default/max-autotune,
         and karpathy/build-nanogpt's train_gpt2.py on the same tokens at the same
         micro-batches (compile on), side by side.
Stage 3: the speed ladder (`python -m gpt.bench ladder`), and GPT-2 XL on one GPU under
         `torchrun --nproc_per_node=1 train_gpt2.py --parallel fsdp --activation-checkpointing`.

Every cell runs as a subprocess with a time limit drawn from the stage's --budget, so a
stage that runs long records the cells it could not start as skipped (with the reason)
instead of being killed; --only runs chosen cells in a later call. Results: one JSON
(`gpu_stage<N>.json`: the machine, versions, commit, command and every cell's raw figures)
and a markdown summary beside it. Step times come from the trainer's own per-step log
(synchronised at every step here); the first WARMUP steps (compilation, autotuning,
allocator warm-up) are left out of the medians, and compile time is the first step's time
minus the median. --smoke runs the same stages with tiny sizes on the CPU in seconds and
writes the same schema (build-nanogpt's cells are skipped there: its model is fixed at 124M).
Everything imported here exists on the GPU machine's image (no `datasets`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpt.bench import nanogpt
from gpt.bench.report import git_commit
from gpt.config import model_preset
from gpt.dist import device_name
from gpt.metrics import flops_per_token, mfu, peak_tflops
from gpt.shards import write_shard

SCHEMA = 1
WARMUP = 3  # steps left out of every median
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Cell:
    name: str
    kind: str  # pytest | trainer | nanogpt | ladder
    estimate_s: float  # what the budget sets aside for it (compilation included)
    cmd: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    """The sizes of a stage: real on the GPU, tiny in --smoke."""

    smoke: bool
    model: str
    seq_len: int
    batches: tuple[int, ...]
    modes: tuple[str, ...]
    steps: int
    tokens_per_step: int

    @classmethod
    def make(cls, smoke: bool) -> "Plan":
        if smoke:
            return cls(True, "tiny", 64, (2, 4), ("default",), WARMUP + 3, 512)
        return cls(False, "gpt2", 1024, (16, 32, 64), ("default", "max-autotune"), WARMUP + 15, 2**17)

    def device_flags(self) -> list[str]:
        return ["--device", "cpu", "--no-compile"] if self.smoke else ["--device", "cuda"]


# ---------------------------------------------------------------------------------------
# the stages


def stage_cells(stage: int, plan: Plan, data: Path, work: Path, tmp: Path) -> list[Cell]:
    py = sys.executable
    smoke_steps = plan.steps if plan.smoke else 30  # stage 1's trainer run: 30 steps on the GPU
    if stage == 1:
        return [
            Cell("pytest-cuda", "pytest", 300,
                 [py, "-m", "pytest", "-m", "cuda", "-q", "-rs", "-p", "no:cacheprovider",
                  "--continue-on-collection-errors",
                  f"--junitxml={tmp / 'junit.xml'}", str(REPO / "tests")]),
            trainer_cell(f"train-{plan.model}-{smoke_steps}-steps", plan, data, work,
                         batch=plan.batches[0], mode="default", steps=smoke_steps, estimate=150),
        ]
    if stage == 2:
        cells = []
        for b in plan.batches:  # ours and the baseline at the same micro-batch, back to back
            cells.append(trainer_cell(f"ours-b{b}-default", plan, data, work, batch=b, mode="default",
                                      steps=plan.steps, estimate=100))
            cells.append(Cell(f"build-nanogpt-b{b}", "nanogpt", 100,
                              params={"batch_size": b, "steps": plan.steps}))
        for mode in plan.modes[1:]:  # max-autotune compiles for minutes: last
            for b in plan.batches:
                cells.append(trainer_cell(f"ours-b{b}-{mode}", plan, data, work, batch=b, mode=mode,
                                          steps=plan.steps, estimate=360))
        return cells
    if stage == 3:
        ladder = [py, "-m", "gpt.bench", "ladder", "--out", str(tmp / "ladder"), "--name", "ladder",
                  "--steps", "10" if not plan.smoke else "2", "--warmup", "3" if not plan.smoke else "1"]
        if plan.smoke:
            ladder += ["--device", "cpu", "--no-compile-rungs", "--seq-len", "32", "--batch-size", "2"]
        xl = "tiny" if plan.smoke else "gpt2-xl"
        xl_batch = 2 if plan.smoke else 8
        # One micro-batch a step: the figures are per step, and XL's steps are long enough.
        xl_cell = trainer_cell(f"{xl}-fsdp-ac-1gpu", plan, data, work, batch=xl_batch, mode="default",
                               steps=WARMUP + (3 if plan.smoke else 8), estimate=300, model=xl,
                               tokens_per_step=xl_batch * plan.seq_len,
                               extra=["--parallel", "fsdp", "--activation-checkpointing"])
        xl_cell.cmd = [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                       *xl_cell.cmd[1:]]
        return [Cell("ladder-gpt2" if not plan.smoke else "ladder-tiny", "ladder", 240, ladder), xl_cell]
    raise ValueError(f"--stage must be 1, 2 or 3, got {stage}")


def trainer_cell(name: str, plan: Plan, data: Path, work: Path, *, batch: int, mode: str,
                 steps: int, estimate: float, model: str | None = None,
                 tokens_per_step: int | None = None, extra: list[str] | None = None) -> Cell:
    out = work / name
    tokens = tokens_per_step or max(plan.tokens_per_step, batch * plan.seq_len)
    cmd = [sys.executable, str(REPO / "train_gpt2.py"), "--model", model or plan.model,
           "--seq-len", str(plan.seq_len), "--block-size", str(plan.seq_len),
           "--batch-size", str(batch), "--total-batch-tokens", str(tokens),
           "--max-steps", str(steps), "--warmup-steps", "10", "--log-every", "1",
           "--val-every", "0", "--sample-every", "0", "--checkpoint-every", "0",
           "--data-dir", str(data), "--out-dir", str(out), *plan.device_flags(), *(extra or [])]
    if not plan.smoke:
        cmd += ["--compile-mode", mode]
    return Cell(name, "trainer", estimate, cmd, {"batch_size": batch, "compile_mode": mode,
                                                 "out": str(out), "steps": steps})


# ---------------------------------------------------------------------------------------
# running cells


def run_cell(cell: Cell, limit_s: float, plan: Plan, tokens: tuple[np.ndarray, np.ndarray],
             nanogpt_dir: Path, tmp: Path, log: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"name": cell.name, "kind": cell.kind, "params": cell.params}
    if cell.kind == "nanogpt":
        if plan.smoke:
            return {**record, "status": "skipped",
                    "reason": "--smoke: build-nanogpt's model is fixed at GPT-2 124M, too big for a CPU check"}
        try:
            script = nanogpt.prepare(nanogpt_dir, tmp / cell.name, *tokens,
                                     batch_size=cell.params["batch_size"],
                                     total_batch_tokens=plan.tokens_per_step, max_steps=cell.params["steps"])
        except (nanogpt.MissingBaseline, ValueError) as e:
            return {**record, "status": "skipped", "reason": str(e)}
        cell.cmd = [sys.executable, str(script)]
    record["command"] = " ".join(cell.cmd)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cell.cmd, cwd=tmp / cell.name if cell.kind == "nanogpt" else REPO,
                              capture_output=True, text=True, timeout=limit_s,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired as e:
        log.write(f"\n===== {cell.name}: timed out after {limit_s:.0f} s\n{_text(e.stdout)}{_text(e.stderr)}")
        return {**record, "status": "timeout", "seconds": round(time.perf_counter() - t0, 1),
                "reason": f"ran past its {limit_s:.0f} s share of the budget"}
    record["seconds"] = round(time.perf_counter() - t0, 1)
    log.write(f"\n===== {cell.name} (exit {proc.returncode}, {record['seconds']} s)\n"
              f"$ {record['command']}\n{proc.stdout}{proc.stderr}")
    try:
        record["result"] = RESULTS[cell.kind](cell, proc, plan, tmp)
    except (OSError, ValueError, KeyError, ET.ParseError) as e:
        record["result"] = {"error": f"{type(e).__name__}: {e}"}
    ok = proc.returncode == 0 and "error" not in record["result"]
    if not ok:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        record["reason"] = f"exit {proc.returncode}: " + " | ".join(tail)
    return {**record, "status": "ok" if ok else "failed"}


def _text(x: str | bytes | None) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")


def step_figures(steps: list[dict[str, float]], tokens_per_step: int, model: str,
                 seq_len: int, device: str) -> dict[str, Any]:
    """Median and spread of step time after the warm-up steps, tokens/s and MFU."""
    measured = [s["ms"] for s in steps[WARMUP:]]
    if not measured:
        raise ValueError(f"only {len(steps)} steps logged; need more than {WARMUP}")
    ms = statistics.median(measured)
    tok_s = tokens_per_step / (ms / 1e3)
    peak = peak_tflops(device)
    util = mfu(tok_s, flops_per_token(model_preset(model), seq_len), peak)
    return {
        "steps_logged": len(steps), "warmup_steps_excluded": WARMUP,
        "step_ms": {"median": ms, "min": min(measured), "max": max(measured),
                    "mean": statistics.fmean(measured),
                    "std": statistics.stdev(measured) if len(measured) > 1 else 0.0,
                    "n": len(measured)},
        "tokens_per_step": tokens_per_step, "tokens_per_s_median": tok_s,
        "mfu_median": util, "peak_tflops": peak,
        "compile_s_estimate": max(0.0, (steps[0]["ms"] - ms) / 1e3),
        "losses": [s["loss"] for s in steps], "final_loss": steps[-1]["loss"],
    }


def trainer_result(cell: Cell, proc: subprocess.CompletedProcess, plan: Plan, tmp: Path) -> dict[str, Any]:
    lines = (Path(cell.params["out"]) / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    header = next(r for r in records if r["type"] == "run")
    steps = [r for r in records if r["type"] == "train"]
    cfg = header["config"]
    out = step_figures(steps, cfg["data"]["total_batch_tokens"], cfg["preset"],
                       cfg["data"]["seq_len"], header["device_name"])
    out.update(peak_mem_gb=max(r["peak_mem_gb"] for r in steps), peak_mem_source=header["peak_mem_source"],
               compile=header["compile"], fused_adamw=header["fused_adamw"], dtype=header["dtype"],
               params=header["params"], trainer_mfu=[r["mfu"] for r in steps])
    return out


def nanogpt_result(cell: Cell, proc: subprocess.CompletedProcess, plan: Plan, tmp: Path) -> dict[str, Any]:
    steps = nanogpt.parse_steps(proc.stdout)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return step_figures(steps, plan.tokens_per_step, "gpt2", 1024, device_name(device))


def pytest_result(cell: Cell, proc: subprocess.CompletedProcess, plan: Plan, tmp: Path) -> dict[str, Any]:
    suite = ET.parse(tmp / "junit.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    cases = suite.findall("testcase")
    failures = []
    for case in cases:
        for bad in case.findall("failure") + case.findall("error"):
            failures.append({"test": f"{case.get('classname')}::{case.get('name')}",
                             "message": (bad.get("message") or "")[:500],
                             "detail": (bad.text or "")[-3000:]})
    skipped = sum(1 for c in cases if c.find("skipped") is not None)
    return {"tests": len(cases), "failed": len(failures), "skipped": skipped,
            "passed": len(cases) - len(failures) - skipped, "failures": failures,
            "seconds": float(suite.get("time", 0)),
            "summary": proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""}


def ladder_result(cell: Cell, proc: subprocess.CompletedProcess, plan: Plan, tmp: Path) -> dict[str, Any]:
    return json.loads((tmp / "ladder" / "ladder.json").read_text())


RESULTS = {"trainer": trainer_result, "nanogpt": nanogpt_result, "pytest": pytest_result,
           "ladder": ladder_result}


# ---------------------------------------------------------------------------------------
# the run


def environment(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    commit, dirty = git_commit()
    env: dict[str, Any] = {
        "device": device_name(device), "device_type": device.type, "torch": torch.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(), "host": socket.gethostname(),
        "commit": args.commit or commit, "commit_dirty": dirty,
        "peak_tflops": peak_tflops(device_name(device)),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   compute_capability=f"{props.major}.{props.minor}",
                   cudnn=torch.backends.cudnn.version())
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


def run(args: argparse.Namespace) -> int:
    plan = Plan.make(args.smoke)
    device = torch.device("cpu" if args.smoke else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device; run on a GPU machine, or use --smoke to check the plumbing "
              "on the CPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "schema": SCHEMA, "stage": args.stage, "smoke": args.smoke,
        "command": " ".join(["python -m gpt.bench", *args.argv]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "budget_s": args.budget,
        "env": environment(args, device), "cells": [],
    }
    with tempfile.TemporaryDirectory(prefix=f"gpu_stage{args.stage}_") as tmp_name, \
            open(out / f"gpu_stage{args.stage}.log", "w", encoding="utf-8") as log:
        tmp = Path(tmp_name)
        tokens = make_tokens(8 * plan.tokens_per_step * plan.steps // 4 + 1_000_000, 200_000)
        data = tmp / "data"
        data.mkdir()
        write_shard(data / "train_000000.bin", tokens[0])
        write_shard(data / "val_000000.bin", tokens[1])
        for cell in stage_cells(args.stage, plan, data, tmp / "runs", tmp):
            left = args.budget - (time.perf_counter() - t0)
            if args.only and cell.name not in args.only:
                continue
            if left < cell.estimate_s and not args.smoke:
                report["cells"].append({"name": cell.name, "kind": cell.kind, "params": cell.params,
                                        "status": "skipped",
                                        "reason": f"budget: {left:.0f} s left of {args.budget:.0f}, "
                                                  f"the cell needs about {cell.estimate_s:.0f}; "
                                                  f"run it with --only {cell.name}"})
                continue
            print(f"[{time.perf_counter() - t0:6.0f} s] {cell.name} ...", flush=True)
            result = run_cell(cell, max(60.0, left) if not args.smoke else 600.0, plan, tokens,
                              Path(args.nanogpt), tmp, log)
            report["cells"].append(result)
            print(f"[{time.perf_counter() - t0:6.0f} s] {cell.name}: {result['status']}"
                  + (f" ({result['reason']})" if result.get("reason") else ""), flush=True)
            log.flush()
    report["seconds"] = round(time.perf_counter() - t0, 1)
    (out / f"gpu_stage{args.stage}.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / f"gpu_stage{args.stage}.md").write_text(summary(report))
    print(summary(report))
    print(f"wrote {out}/gpu_stage{args.stage}.json, .md and .log")
    failed = [c["name"] for c in report["cells"] if c["status"] in ("failed", "timeout")]
    return 1 if failed else 0


def summary(report: dict[str, Any]) -> str:
    env = report["env"]
    lines = [f"# GPU acceptance, stage {report['stage']}{' (smoke, CPU)' if report['smoke'] else ''}", "",
             f"{env['device']} | torch {env['torch']} | CUDA {env['cuda']} | commit {env['commit']} | "
             f"{report['seconds']} s of a {report['budget_s']:.0f} s budget", "",
             f"`{report['command']}`", "",
             "| cell | status | step ms (median, min-max) | tokens/s | MFU | peak mem GiB | compile s | final loss |",
             "|---|---|---|---|---|---|---|---|"]
    for c in report["cells"]:
        r = c.get("result") or {}
        if "step_ms" in r:
            s = r["step_ms"]
            mfu_s = f"{r['mfu_median'] * 100:.1f}%" if r.get("mfu_median") is not None else "-"
            lines.append(f"| {c['name']} | {c['status']} | {s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f}) | "
                         f"{r['tokens_per_s_median']:,.0f} | {mfu_s} | "
                         f"{r.get('peak_mem_gb', float('nan')):.2f} | {r['compile_s_estimate']:.1f} | "
                         f"{r['final_loss']:.4f} |")
        elif "results" in r:  # the ladder: one rung per row
            lines.append(f"| {c['name']} | {c['status']} | see the rungs below | | | | | |")
            for rung in r["results"]:
                if rung.get("status") != "ok":
                    lines.append(f"| - {rung['title']} | {rung.get('status')} | {rung.get('reason', '')} | | | | | |")
                    continue
                mfu_s = f"{rung['mfu'] * 100:.1f}%" if rung.get("mfu") is not None else "-"
                mem = rung.get("peak_mem_bytes")
                lines.append(f"| - {rung['title']} | ok | {rung['ms_per_step']:.1f} | {rung['tokens_per_s']:,.0f} | "
                             f"{mfu_s} | {mem / 2**30 if mem else float('nan'):.2f} | | |")
        elif "tests" in r:
            lines.append(f"| {c['name']} | {c['status']} | {r['passed']} passed, {r['failed']} failed, "
                         f"{r['skipped']} skipped | | | | | |")
        else:
            lines.append(f"| {c['name']} | {c['status']} | {c.get('reason', '')} | | | | | |")
    return "\n".join(lines) + "\n"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gpu", help="GPU acceptance: CUDA tests, 124M throughput vs build-nanogpt, "
                       "ladder and XL (one stage per call)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", type=int, choices=(1, 2, 3), required=True)
    p.add_argument("--out", required=True, help="folder for gpu_stage<N>.json, .md and .log ($OUT)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU: checks the plumbing")
    p.add_argument("--budget", type=float, default=500.0,
                   help="seconds for the stage; cells that would not fit are skipped (default 500)")
    p.add_argument("--only", nargs="+", metavar="CELL", help="run only these cells")
    p.add_argument("--nanogpt", default=str(REPO / nanogpt.DEFAULT_DIR),
                   help="folder holding build-nanogpt's train_gpt2.py (default .carry/build-nanogpt)")
    p.add_argument("--commit", default=None,
                   help="the commit measured, where the checkout has no .git (the device tool's copy)")
    p.set_defaults(standalone=run)
