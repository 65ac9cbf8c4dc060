"""What the GPU acceptance (`python -m gpt.bench gpu`) runs on a device machine: the
stages, their cells, each cell's time estimate, and the plan of sessions and device calls
that `--plan` prints.

A developer session has 15 minutes of device time, at most 10 minutes a call, and a fresh
machine starts bare and compiles everything anew. The acceptance does not fit one session:
it spans three, each a fresh machine whose start and calls fit 870 s, riskiest first:

  session 1  call 1  stage 1  the CUDA tests (pytest -m cuda); GPT-2 124M through
                              train_gpt2.py at the trainer's micro-batch (64), and
                              build-nanogpt at the same micro-batch
             call 2  stage 2  GPT-2 XL on one GPU: torchrun, --parallel fsdp
                              --activation-checkpointing
  session 2  call 3  stage 3  the rest of the 124M grid: ours and build-nanogpt at
                              micro-batch 16 and 32
  session 3  call 4  stage 7  124M at micro-batch 64: the chunked loss's kernels side by
                              side (ours, Liger Kernel, Cut Cross-Entropy) and
                              --no-chunked-loss

and four optional sessions, one call each, alone for their long compiles:

  session 4  call 5  stage 8  124M at micro-batch 64 and XL, each with a torch.profiler
                              trace of its last two steps, summarised (where the time goes)
  session 5  call 6  stage 4  124M at micro-batch 64 under --compile-mode max-autotune
  session 6  call 7  stage 5  the speed ladder (python -m gpt.bench ladder)
  session 7  call 8  stage 6  GPT-2 recipe vs the speedrun-era recipe (python -m gpt.bench tokens)

Calls are numbered in the plan's order, so a call's number and its stage's can differ.
Every process compiles its own graphs (the trainer's command line cannot share a compiled
model across micro-batches), so the plan keeps processes few: stage 1's 124M run is the
grid's micro-batch-64 cell, beside its baseline, not a run of its own; XL has a call to
itself because its compile time is the least certain of all; stage 7 runs ours again, so
that the loss kernels are compared on one machine, in one call.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt.bench.record import REPO
from gpt.bench.runs import trainer_command
from gpt.config import model_preset
from gpt.metrics import flops_per_token, peak_tflops

WARMUP = 3  # steps left out of every median (compilation, autotuning, allocator warm-up)
MEASURED_STEPS = 10  # steps in every median: enough for a stable median at these step times

# ---- the device tool's limits (/work/.library/device/README.md) and the session's target
SESSION_LIMIT_S = 900  # a developer session's device time (15 minutes), machine starts included
# a session's target: 30 s under the limit, for the tool's transfers and the idle wait after
# the session's last call (the machine stays warm 30 s, counted, unless given back)
SESSION_BUDGET_S = 870
CALL_LIMIT_S = 600  # one command's run at most (timeout_s)
STAGE_BUDGET_S = 540  # a stage's cells: the call's limit less a minute for its own start and report
PYTEST_WORKERS = 4  # pytest-xdist workers for the CUDA tests (the device image has pytest-xdist)

# ---- estimates in seconds. None has been measured: no GPU has run this yet. Each cell's
# record keeps its estimate beside the seconds it took, so the first session's
# gpu_stage<N>.json calibrates these.
MACHINE_START_S = 120  # a fresh machine: "a minute or more" (device tool), 1-2 min (issue #20)
# a call's own: sending the tree (+ .carry, ~2 MB) and $OUT back, python and torch imports,
# the stage's token shards, nvidia-smi, and the moments until the next call is made
CALL_OVERHEAD_S = 30
PROCESS_START_S = 15  # one trainer process to its first step: imports, CUDA context, model, loader
TORCHRUN_S = 10  # torchrun's launcher and NCCL's init, one GPU
XL_INIT_S = 20  # GPT-2 XL's 1.56B parameters initialised and fully_shard-ed
# torch.compile (default mode) of a forward+backward: 124M "about a minute" (issue #20), the
# top of 60-90 s; XL has 4x the blocks and FSDP2's hooks break the graph at each of them
COMPILE_S = {"gpt2": 75.0, "gpt2-xl": 180.0}
COMPILE_MAX_AUTOTUNE_S = 360.0  # benchmarks Triton configs for every matmul shape: "several minutes"
# Steps: the FLOPs over an assumed utilisation of the H100's bf16 peak (124M: ~0.33 s per
# 2^17-token step); small beside the compiles, so the guess matters little.
ASSUMED_MFU = 0.35
H100_PEAK_TFLOPS = peak_tflops("NVIDIA H100 80GB HBM3") or 989.0
AC_RECOMPUTE = 4 / 3  # activation checkpointing runs each block's forward twice: 4 passes, not 3
# tests/test_cuda.py: 16 tests; 10 start train_gpt2.py or torchrun on a 2-layer model, 5 of
# those compile it, and the resume test runs 3 compiled ones one after another.
CUDA_TEST_RUNS, CUDA_TEST_COMPILED_RUNS, CUDA_TEST_LONGEST_RUNS = 10, 5, 3
TINY_RUN_S = 12  # one such run without its compile: start, CUDA and NCCL init, 3-30 tiny steps
TINY_COMPILE_S = 30  # compiling the 2-layer model (smaller and fewer graphs than 124M's)
PYTEST_START_S = 15  # collection: torch, gpt and the tests' imports
# the 6 in-process tests: HellaSwag under compile (a 'mini' model at several lengths) and
# activation checkpointing's memory at 124M, eager; the rest take seconds
CUDA_TESTS_IN_PROCESS_S = 50
# the ladder (gpt/bench/ladder.py): 5 of its 8 rungs compile GPT-2 124M in one process; the 3
# eager ones run 3 + 10 steps at B=16, T=1024, up to ~1 s each in fp32 with naive attention
LADDER_COMPILED_RUNGS, LADDER_EAGER_RUNGS, LADDER_EAGER_RUNG_S = 5, 3, 20.0
# gpt.memory's plan of a trainer cell, made before the cell runs (gpu_results.predicted_memory):
# measured on a 2-core CPU (torch 2.13), 124M at micro-batch 64 and XL (FSDP + checkpointing, B=8)
PLANNER_S = {"gpt2": 8.0, "gpt2-xl": 18.0}


@dataclass
class Cell:
    name: str
    kind: str  # pytest | trainer | nanogpt | ladder
    estimate_s: float  # what the budget sets aside for it, compilation included (0 in --smoke)
    cmd: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sizes:
    """The sizes of the stages: real on the GPU, tiny in --smoke."""

    smoke: bool
    model: str
    seq_len: int
    batches: tuple[int, ...]  # the grid's micro-batches; the last is the trainer's default (stage 1)
    steps: int
    tokens_per_step: int
    xl_model: str
    xl_batch: int  # one micro-batch a step: XL's figures are per step, and its steps are long enough

    @classmethod
    def make(cls, smoke: bool) -> "Sizes":
        if smoke:
            return cls(True, "tiny", 64, (2, 4, 8), WARMUP + 3, 512, "tiny", 2)
        return cls(False, "gpt2", 1024, (16, 32, 64), WARMUP + MEASURED_STEPS, 2**17, "gpt2-xl", 8)

    def device_flags(self) -> list[str]:
        return ["--device", "cpu", "--no-compile"] if self.smoke else ["--device", "cuda"]


@dataclass(frozen=True)
class Stage:
    title: str
    question: str
    optional: bool = False


STAGES: dict[int, Stage] = {
    1: Stage("CUDA tests; GPT-2 124M vs build-nanogpt at micro-batch 64",
             "does the CUDA path work; compile time, step time, tokens/s, MFU and memory at the "
             "trainer's defaults, against the baseline"),
    2: Stage("GPT-2 XL with FSDP2 and activation checkpointing on one GPU (torchrun)",
             "does XL train, and in how much memory"),
    3: Stage("GPT-2 124M vs build-nanogpt at micro-batch 16 and 32",
             "the rest of the throughput grid"),
    4: Stage("GPT-2 124M at micro-batch 64 under --compile-mode max-autotune",
             "what max-autotune's minutes of compiling buy", optional=True),
    5: Stage("the speed ladder (python -m gpt.bench ladder)",
             "where the speed comes from, one optimisation at a time", optional=True),
    6: Stage("GPT-2 recipe vs the speedrun-era recipe at 124M (python -m gpt.bench tokens)",
             "how many fewer tokens the new recipe needs at GPU scale", optional=True),
    7: Stage("GPT-2 124M at micro-batch 64: the chunked loss's kernels (ours, Liger Kernel, "
             "Cut Cross-Entropy) and no chunking",
             "which fused head + loss is fastest on CUDA, and the peak memory of each"),
    8: Stage("GPT-2 124M at micro-batch 64 and GPT-2 XL (FSDP2 + checkpointing), each with a "
             "torch.profiler trace of its last two steps",
             "where a step's GPU time goes: each kind of kernel's share, the top kernels, the "
             "gaps between them", optional=True),
}
# The sessions, in the plan's order: each a fresh machine (its own start) whose calls, one
# per stage, fit SESSION_BUDGET_S; the riskiest first, the optional ones (a session is
# optional when its stages are) after the acceptance.
SESSIONS: tuple[tuple[int, ...], ...] = ((1, 2), (3,), (7,), (8,), (4,), (5,), (6,))
PROFILED_STEPS = 2  # stage 8 traces each cell's last steps (after compiling and warming up)
PROFILE_S = 15.0  # a guess, not yet measured: writing and summarising a trace of two steps
# The learning rate's warm-up of every trainer cell, and build-nanogpt's beside them (its own
# is 715 steps): the same rate at each step, so the two runs' losses compare step by step.
LR_WARMUP_STEPS = 10
# A 124M cell's head + loss: the trainer's default (stages 1 and 3: on a compiled CUDA
# run, the whole logits), or, side by side in stage 7, the chunked loss through ours
# (gpt/chunked_ce.py), Liger Kernel's or Cut Cross-Entropy's kernel (--loss-kernel, CUDA
# only), and the whole logits (--no-chunked-loss): its name's suffix and its flags.
LOSSES: dict[str, tuple[str, tuple[str, ...]]] = {
    "default": ("", ()), "ours": ("-chunked", ("--chunked-loss", "--loss-kernel", "ours")),
    "unchunked": ("-unchunked", ("--no-chunked-loss",)),
    "liger": ("-liger", ("--loss-kernel", "liger")), "cce": ("-cce", ("--loss-kernel", "cce"))}
STAGE7_LOSSES = ("ours", "unchunked", "liger", "cce")  # ours first: the others' baseline
CUDA_ONLY_LOSSES = ("liger", "cce")  # Triton kernels: --smoke (CPU) records them as skipped
# Stage 6's corpus: real English shards prepared here and carried (random tokens, which the
# other stages use, have no loss to compare); benchmarks/gpu/README.md says how.
TOKENS_DATA = REPO / ".carry" / "tokens-data"
WHEELS = ".carry/wheels"  # liger-kernel's and cut-cross-entropy's wheels, installed by each call
TOKENS_STEPS, TOKENS_BATCH_TOKENS = 40, 2**16  # 2.6M tokens: below the corpus's 3.3M
TOKENS_SEEDS = 2  # each point over 2 seeds: a spread within the device's time
# Per seed: the GPT-2 recipe under both schedules, the new one and its tied-head variant
# each over the full, half and (if still below the target) a quarter budget: 8 processes,
# 5.5 full runs' work
TOKENS_RUNS, TOKENS_WORK = 8 * TOKENS_SEEDS, 5.5 * TOKENS_SEEDS
EAGER_SLOWDOWN = 2.0  # stage 6 runs eagerly (three compiles would cost more than its steps)


# ---------------------------------------------------------------------------------------
# estimates, from what each cell does


def step_seconds(model: str, tokens: int, seq_len: int, recompute: bool = False) -> float:
    flops = tokens * flops_per_token(model_preset(model), seq_len) * (AC_RECOMPUTE if recompute else 1)
    return flops / (ASSUMED_MFU * H100_PEAK_TFLOPS * 1e12)


def run_estimate(model: str, steps: int, tokens: int, seq_len: int, *, mode: str = "default",
                 torchrun: bool = False, recompute: bool = False) -> float:
    """One trainer (or build-nanogpt) process: its start, its compile, its steps."""
    compile_s = COMPILE_MAX_AUTOTUNE_S if mode == "max-autotune" else COMPILE_S[model]
    return (PROCESS_START_S + (TORCHRUN_S if torchrun else 0) + (XL_INIT_S if model == "gpt2-xl" else 0)
            + compile_s + steps * step_seconds(model, tokens, seq_len, recompute))


def pytest_estimate(workers: int) -> float:
    """`pytest -m cuda`: serial, the sum of its parts; on N workers at most work/N plus the
    longest test (list scheduling's bound), the resume test's three compiled runs."""
    work = (CUDA_TEST_RUNS * TINY_RUN_S + CUDA_TEST_COMPILED_RUNS * TINY_COMPILE_S
            + CUDA_TESTS_IN_PROCESS_S)
    if workers <= 1:
        return PYTEST_START_S + work
    return PYTEST_START_S + work / workers + CUDA_TEST_LONGEST_RUNS * (TINY_RUN_S + TINY_COMPILE_S)


def ladder_estimate() -> float:
    return (PROCESS_START_S + LADDER_COMPILED_RUNGS * COMPILE_S["gpt2"]
            + LADDER_EAGER_RUNGS * LADDER_EAGER_RUNG_S)


def pytest_workers() -> int:
    """xdist's workers where pytest-xdist is installed (the device image has it), else none."""
    return PYTEST_WORKERS if importlib.util.find_spec("xdist") is not None else 0


# ---------------------------------------------------------------------------------------
# the stages' cells


def stage_cells(stage: int, s: Sizes, data: Path, work: Path, tmp: Path, workers: int) -> list[Cell]:
    if stage == 1:
        b = s.batches[-1]
        return [pytest_cell(tmp, workers, s.smoke), ours_cell(s, data, work, b), nanogpt_cell(s, b)]
    if stage == 2:
        return [xl_cell(s, data, work)]
    if stage == 3:
        return [c for b in s.batches[:-1] for c in (ours_cell(s, data, work, b), nanogpt_cell(s, b))]
    if stage == 4:
        return [ours_cell(s, data, work, s.batches[-1], mode="max-autotune")]
    if stage == 5:
        return [ladder_cell(s, tmp)]
    if stage == 6:
        return [tokens_cell(s, data, tmp)]
    if stage == 8:
        return [profiled(ours_cell(s, data, work, s.batches[-1]), s),
                profiled(xl_cell(s, data, work), s)]
    if stage == 7:  # ours first, then each other head + loss beside it, on the same machine
        return [ours_cell(s, data, work, s.batches[-1], loss=loss) for loss in STAGE7_LOSSES]
    raise ValueError(f"--stage must be one of {', '.join(map(str, STAGES))}, got {stage}")


def pytest_cell(tmp: Path, workers: int, smoke: bool) -> Cell:
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-rs", "-p", "no:cacheprovider",
           "--continue-on-collection-errors", f"--junitxml={tmp / 'junit.xml'}"]
    if workers > 1:  # the tests' trainer runs are mostly compiling: CPU work, 16 cores there
        cmd += ["-n", str(workers)]
    return Cell("pytest-cuda", "pytest", 0.0 if smoke else pytest_estimate(workers),
                [*cmd, str(REPO / "tests")], {"workers": workers})


def ours_cell(s: Sizes, data: Path, work: Path, batch: int, mode: str = "default",
              loss: str = "default") -> Cell:
    """The trainer at `s.model`; `loss` (one of LOSSES) picks its head + loss."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    suffix, flags = LOSSES[loss]
    estimate = 0.0 if s.smoke else run_estimate(s.model, s.steps, s.tokens_per_step, s.seq_len,
                                                mode=mode)
    return trainer_cell(f"ours-b{batch}-{mode}{suffix}", s, data, work, batch=batch, mode=mode,
                        steps=s.steps, estimate=estimate, extra=list(flags) or None, loss=loss)


def profiled(cell: Cell, s: Sizes) -> Cell:
    """`cell` with a torch.profiler trace of its last PROFILED_STEPS steps (--torch-profile),
    which its result summarises (gpt/bench/trace_summary.py)."""
    folder = Path(cell.params["out"]) / "trace"
    flags = ["--torch-profile", str(folder), "--profile-start", str(s.steps - PROFILED_STEPS),
             "--profile-steps", str(PROFILED_STEPS)]
    return dataclasses.replace(
        cell, name=f"{cell.name}-profile", cmd=[*cell.cmd, *flags],
        estimate_s=cell.estimate_s + (0.0 if s.smoke else PROFILE_S),
        params={**cell.params, "trainer_argv": [*cell.params["trainer_argv"], *flags],
                "profile_dir": str(folder)})


def nanogpt_cell(s: Sizes, batch: int) -> Cell:
    # build-nanogpt's model is GPT-2 124M at T=1024, whatever the sizes
    estimate = 0.0 if s.smoke else run_estimate("gpt2", s.steps, s.tokens_per_step, 1024)
    return Cell(f"build-nanogpt-b{batch}", "nanogpt", estimate,
                params={"batch_size": batch, "steps": s.steps})


def xl_cell(s: Sizes, data: Path, work: Path) -> Cell:
    tokens = s.xl_batch * s.seq_len
    estimate = 0.0 if s.smoke else run_estimate(s.xl_model, s.steps, tokens, s.seq_len,
                                                torchrun=True, recompute=True)
    cell = trainer_cell(f"{s.xl_model}-fsdp-ac-1gpu", s, data, work, batch=s.xl_batch,
                        mode="default", steps=s.steps, estimate=estimate, model=s.xl_model,
                        tokens_per_step=tokens, extra=["--parallel", "fsdp", "--activation-checkpointing"])
    cell.cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                *cell.cmd[1:]]
    return cell


def tokens_cell(s: Sizes, data: Path, tmp: Path) -> Cell:
    """python -m gpt.bench tokens at 124M, T=1024: one learning rate per recipe (the GPT-2
    recipe's own, the CPU sweep's best scale for the new one), TOKENS_SEEDS seeds."""
    steps = 4 if s.smoke else TOKENS_STEPS
    batch_tokens = s.seq_len * 2 if s.smoke else TOKENS_BATCH_TOKENS
    cmd = [sys.executable, "-m", "gpt.bench", "tokens", "--out", str(tmp / "tokens"),
           "--data-dir", str(data if s.smoke else TOKENS_DATA), "--model", s.model,
           "--seq-len", str(s.seq_len), "--batch-size", str(2 if s.smoke else 16),
           "--total-batch-tokens", str(batch_tokens), "--steps", str(steps),
           "--val-every", str(2 if s.smoke else 5), "--val-steps", "2" if s.smoke else "8",
           "--baseline-lrs", "6e-4", "--new-lr-scales", "1", "--new-budgets", "0.5",
           "--seeds", "1" if s.smoke else str(TOKENS_SEEDS),
           "--max-halvings", "0" if s.smoke else "1",
           "--device", "cpu" if s.smoke else "cuda", "--trainer-flags=--no-compile",
           # no timing phase: the GPU is this session's alone, so the runs' own times are
           # not another job's load, and a timing phase would not fit the call's budget
           "--timing-repeats", "0"]
    cmd += ["--n-layer", "2", "--n-head", "2", "--n-embd", "64"] if s.smoke else \
        ["--n-layer", "12", "--n-head", "12", "--n-embd", "768"]
    work = TOKENS_WORK * TOKENS_STEPS * step_seconds("gpt2", TOKENS_BATCH_TOKENS, 1024) * EAGER_SLOWDOWN
    estimate = 0.0 if s.smoke else TOKENS_RUNS * PROCESS_START_S + work
    return Cell(f"tokens-{s.model}", "tokens", estimate, cmd,
                {"data_dir": str(data if s.smoke else TOKENS_DATA), "steps": steps})


def ladder_cell(s: Sizes, tmp: Path) -> Cell:
    cmd = [sys.executable, "-m", "gpt.bench", "ladder", "--out", str(tmp / "ladder"), "--name", "ladder",
           "--steps", str(MEASURED_STEPS) if not s.smoke else "2",
           "--warmup", str(WARMUP) if not s.smoke else "1"]
    if s.smoke:
        cmd += ["--device", "cpu", "--no-compile-rungs", "--seq-len", "32", "--batch-size", "2"]
    return Cell(f"ladder-{s.model}", "ladder", 0.0 if s.smoke else ladder_estimate(), cmd)


def trainer_cell(name: str, s: Sizes, data: Path, work: Path, *, batch: int, mode: str,
                 steps: int, estimate: float, model: str | None = None,
                 tokens_per_step: int | None = None, extra: list[str] | None = None,
                 loss: str = "default") -> Cell:
    out = work / name
    tokens = tokens_per_step or max(s.tokens_per_step, batch * s.seq_len)
    # --no-save-checkpoints: a benchmark keeps nothing (a final checkpoint is 1.5 GB at 124M,
    # 18.7 GB at XL, written with fsync and a CRC pass)
    argv = ["--model", model or s.model, "--seq-len", str(s.seq_len), "--block-size", str(s.seq_len),
            "--batch-size", str(batch), "--total-batch-tokens", str(tokens),
            "--max-steps", str(steps), "--warmup-steps", str(LR_WARMUP_STEPS), "--log-every", "1",
            "--val-every", "0", "--sample-every", "0", "--no-save-checkpoints",
            "--data-dir", str(data), "--out-dir", str(out), *s.device_flags(), *(extra or [])]
    if not s.smoke:
        argv += ["--compile-mode", mode]
    estimate += 0 if s.smoke else PLANNER_S[model or s.model]
    return Cell(name, "trainer", estimate, trainer_command(argv),
                {"model": model or s.model, "batch_size": batch, "compile_mode": mode, "out": str(out),
                 "steps": steps, "loss": loss, "trainer_argv": argv, "world_size": 1,
                 "device_type": "cpu" if s.smoke else "cuda"})


# ---------------------------------------------------------------------------------------
# the session's plan (--plan)


def device_command(stage: int, commit: str) -> str:
    """The `run` tool's command for a stage, on the device machine (PYTHONPATH=. since the
    checkout is not installed there; tiktoken's cache for build-nanogpt, which loads GPT-2's
    BPE files at start and cannot download them there). The wheels carried in
    .carry/wheels (the loss kernels' libraries: benchmarks/gpu/README.md) are installed
    first where there are any, into /tmp/site after PYTHONPATH's `.`; a failed install ends
    the call at once."""
    return ("set -o pipefail; export PYTHONPATH=. PYTHONUNBUFFERED=1 "
            "TIKTOKEN_CACHE_DIR=$PWD/.carry/tiktoken_cache; "
            f"if ls {WHEELS}/*.whl >/dev/null 2>&1; then python3 -m pip install -q --no-index "
            "--no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "
            f"{WHEELS}/*.whl && export PYTHONPATH=.:/tmp/site || exit 1; fi; "
            "nvidia-smi > $OUT/nvidia-smi.txt; "
            f"python3 -m gpt.bench gpu --stage {stage} --out $OUT --commit {commit} "
            "2>&1 | tee $OUT/console.log")


def session_plan(commit: str) -> dict[str, Any]:
    """Every session and call of the acceptance, in order, with its cells' estimates. Each
    session is a fresh machine: its total_s is the machine's start and its calls; the plan's
    total_s is the acceptance's device time, the sessions that are not optional."""
    sizes, nowhere = Sizes.make(smoke=False), Path("/nowhere")  # commands are not shown: paths unused
    calls: list[dict[str, Any]] = []
    sessions: list[dict[str, Any]] = []
    for number, stages in enumerate(SESSIONS, 1):
        mine = []
        for n in stages:
            stage = STAGES[n]
            cells = stage_cells(n, sizes, nowhere, nowhere, nowhere, PYTEST_WORKERS)
            mine.append({
                "call": len(calls) + len(mine) + 1, "stage": n, "session": number,
                "title": stage.title, "question": stage.question, "optional": stage.optional,
                "cells": [{"name": c.name, "estimate_s": round(c.estimate_s)} for c in cells],
                "cells_s": round(sum(c.estimate_s for c in cells)),
                "estimate_s": round(CALL_OVERHEAD_S + sum(c.estimate_s for c in cells)),
                "command": device_command(n, commit), "carry": [".carry"], "timeout_s": CALL_LIMIT_S,
            })
        calls += mine
        sessions.append({"session": number, "calls": [c["call"] for c in mine], "stages": list(stages),
                         "optional": all(c["optional"] for c in mine),
                         "total_s": MACHINE_START_S + sum(c["estimate_s"] for c in mine)})
    return {
        "budget_s": SESSION_BUDGET_S, "session_limit_s": SESSION_LIMIT_S,
        "machine_start_s": MACHINE_START_S,
        "total_s": sum(s["total_s"] for s in sessions if not s["optional"]),
        "stage_budget_s": STAGE_BUDGET_S, "call_overhead_s": CALL_OVERHEAD_S,
        "estimates": "not measured: derived in gpt/bench/gpu_plan.py from what each cell does; "
                     "each cell's record holds its estimate beside the seconds it took, so the "
                     "first GPU session's gpu_stage<N>.json calibrates them",
        "sessions": sessions, "calls": calls,
    }


def numbers(ns: list[int]) -> str:
    return f"{ns[0]}-{ns[-1]}" if len(ns) > 1 else str(ns[0])


def render_plan(plan: dict[str, Any]) -> str:
    sessions, calls = plan["sessions"], {c["call"]: c for c in plan["calls"]}
    required = [s for s in sessions if not s["optional"]]
    optional = [s for s in sessions if s["optional"]]
    lines = [f"GPU acceptance: {len(required)} sessions, {sum(len(s['calls']) for s in required)} "
             f"device calls, then {len(optional)} optional sessions (seconds are estimates; the "
             "first GPU run's measured times, mostly shorter, are in benchmarks/gpu/README.md)",
             f"Each session is a fresh machine, its start counted: it must fit {plan['budget_s']} s "
             f"of its {plan['session_limit_s']} s of device time."]
    for s in sessions:
        tag = " (optional)" if s["optional"] else ""
        lines += ["", f"session {s['session']}{tag}: call{'s' if len(s['calls']) > 1 else ''} "
                      f"{numbers(s['calls'])}, ~{s['total_s']} s of the {plan['budget_s']} s target",
                  f"  machine start{'':35}{plan['machine_start_s']:5d} s"]
        for c in (calls[n] for n in s["calls"]):
            lines += [f"  call {c['call']}, stage {c['stage']}: {c['title']}{'':2}~{c['estimate_s']} s "
                      f"({c['cells_s']} s of cells + {plan['call_overhead_s']} s for the call)"]
            lines += [f"    {cell['name']:<45}{cell['estimate_s']:5d} s" for cell in c["cells"]]
            lines.append(f"    run: command={c['command']!r} carry={c['carry']} timeout_s={c['timeout_s']}")
    lines += ["", f"total, sessions {numbers([s['session'] for s in required])} (calls "
                  f"{numbers([n for s in required for n in s['calls']])}) with their machines' starts: "
                  f"{plan['total_s']} s ({plan['total_s'] / 60:.1f} min) of device time",
              "Within a session, make each call as soon as the last returns: the machine stays "
              f"warm 30 s after a call, and a fresh one costs another start (~{plan['machine_start_s']} s) "
              "and recompiles everything; after its last call, give the machine back.",
              "Before call 1: build-nanogpt's train_gpt2.py in .carry/build-nanogpt/ and tiktoken's "
              "cache in .carry/tiktoken_cache; before the loss kernels' call, their wheels in "
              ".carry/wheels (benchmarks/gpu/README.md)."]
    return "\n".join(lines) + "\n"
