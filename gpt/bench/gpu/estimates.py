"""How long each cell of the GPU acceptance (`python -m gpt.bench gpu`) is expected to take
on one H100, in seconds: what `--plan` adds up and what `--budget` compares with what is
left. Every figure is an estimate, made from what a cell does (its processes, compiles and
steps) with the constants below; each cell's result records its estimate beside the
seconds it took, so a run says how far off they are.

Where a constant comes from a measurement, the comment names it: the H200 run of
2026-11-26 and the H100 run of 2026-11-27 (benchmarks/gpu/), whose 124M cells took 23-85 s
(most 40-47 s), XL 72 s and the CUDA tests 181-182 s. The stages none of those runs had
(max-autotune, ladder, tokens, fp8, fp8-loss, speedrun, fused-compile) are rougher:
`Stage.measured` says which, and --plan marks them. Within the measured loss-kernels stage,
the cell of --loss-kernel fused (gpt/model/fused_ce.py) has not run on a GPU yet: its
estimate is a guess, the same 124M trainer cell's as its neighbours' (which took 40-47 s);
and so are the two CUDA tests it adds (counted below), the loss-bench cell's (below) and
the XL cells with FP8 (an XL cell's, its compile FP8_COMPILE_FACTOR longer).
"""

from __future__ import annotations

from gpt.core.config import model_preset
from gpt.report.flops import flops_per_token, peak_tflops

WARMUP = 3  # steps left out of every median (compilation, autotuning, allocator warm-up)
MEASURED_STEPS = 10  # steps in every median: enough for a stable median at these step times

PROCESS_START_S = 15  # one trainer process to its first step: imports, CUDA context, model, loader
TORCHRUN_S = 10  # torchrun's launcher and NCCL's init, one GPU
XL_INIT_S = 20  # GPT-2 XL's 1.56B parameters initialised and fully_shard-ed
# torch.compile (default mode) of a forward+backward, as the first step's time over the
# median: 124M 3-67 s in 11 runs on the H100 and H200 (most 20-26 s; 67 s on a machine
# whose compile caches were empty), XL 23-33 s; taken near the top.
COMPILE_S = {"gpt2": 45.0, "gpt2-xl": 60.0}
COMPILE_MAX_AUTOTUNE_S = 360.0  # benchmarks Triton configs for every matmul shape: minutes (not measured)
# FP8 training (torchao's float8 linears) compiles more: the casts and scales around every
# matmul. A guess, not measured: half again the default compile.
FP8_COMPILE_FACTOR = 1.5
# Steps: the FLOPs over a utilisation of the H100's bf16 peak: 124M measured 42-45% MFU
# (264-266 ms for 2^17 tokens); XL 23-25% of its counted FLOPs, 31-34% with checkpointing's
# recomputation (AC_RECOMPUTE).
ASSUMED_MFU = 0.40
H100_PEAK_TFLOPS = peak_tflops("NVIDIA H100 80GB HBM3") or 989.0
AC_RECOMPUTE = 4 / 3  # activation checkpointing runs each block's forward twice: 4 passes, not 3
# tests/test_cuda.py: 16 tests; 10 start train_gpt2.py or torchrun on a 2-layer model, 5 of
# those compile it, and the resume test runs 3 compiled ones one after another. Measured:
# 181-182 s on 4 workers, against the 221 these gave. tests/test_fused_ce.py adds 2 compiled
# runs (the whole logits and --loss-kernel fused; not yet run on a GPU: a guess).
CUDA_TEST_RUNS, CUDA_TEST_COMPILED_RUNS, CUDA_TEST_LONGEST_RUNS = 12, 7, 3
TINY_RUN_S = 12  # one such run without its compile: start, CUDA and NCCL init, 3-30 tiny steps
TINY_COMPILE_S = 30  # compiling the 2-layer model (smaller and fewer graphs than 124M's)
PYTEST_START_S = 15  # collection: torch, gpt and the tests' imports
# the 6 in-process tests: HellaSwag under compile (a 'mini' model at several lengths) and
# activation checkpointing's memory at 124M, eager; the rest take seconds
CUDA_TESTS_IN_PROCESS_S = 50
# the ladder (gpt/bench/step/ladder.py): 5 of its 8 rungs compile GPT-2 124M in one process; the 3
# eager ones run 3 + 10 steps at B=16, T=1024, up to ~1 s each in fp32 with naive attention
LADDER_COMPILED_RUNGS, LADDER_EAGER_RUNGS, LADDER_EAGER_RUNG_S = 5, 3, 20.0
# gpt.plan.memory's plan of a trainer cell, made before the cell runs (results.predicted_memory):
# measured on a 2-core CPU (torch 2.13), 124M at micro-batch 64 and XL (FSDP + checkpointing, B=8)
PLANNER_S = {"gpt2": 3.0, "gpt2-xl": 13.0}
PROFILE_S = 15.0  # writing and summarising a trace of two steps (the profiled 124M cell took 25 s in all)
EAGER_SLOWDOWN = 2.0  # an eager step against a compiled one (the tokens stage runs eagerly)
# gpt/bench/gpu/loss_bench.py (not measured): inductor compiles the whole logits' loss
# forward and backward once per soft cap (a small graph: two kernels); Triton builds each
# fused kernel once per launch and cap (the backward mode's two, the forward mode's at 5
# launches, its rescaling once: 15); 16 variants x 13 iterations of ~20 ms, each after a
# 6.6 GB copy of the logits
LOSS_GRAPH_COMPILE_S, LOSS_GRAPHS = 20.0, 2
TRITON_KERNEL_S, TRITON_KERNELS = 2.0, 15
LOSS_BENCH_RUN_S = 15.0


def step_seconds(model: str, tokens: int, seq_len: int, recompute: bool = False) -> float:
    flops = tokens * flops_per_token(model_preset(model), seq_len) * (AC_RECOMPUTE if recompute else 1)
    return flops / (ASSUMED_MFU * H100_PEAK_TFLOPS * 1e12)


def run_estimate(model: str, steps: int, tokens: int, seq_len: int, *, mode: str = "default",
                 torchrun: bool = False, recompute: bool = False, fp8: bool = False) -> float:
    """One trainer (or build-nanogpt) process: its start, its compile, its steps."""
    compile_s = COMPILE_MAX_AUTOTUNE_S if mode == "max-autotune" else COMPILE_S[model]
    compile_s *= FP8_COMPILE_FACTOR if fp8 else 1.0
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


def tokens_estimate(runs: int, full_runs: float, steps: int, batch_tokens: int) -> float:
    """`python -m gpt.bench tokens` at 124M, eager: `runs` processes doing `full_runs` runs'
    worth of steps."""
    return runs * PROCESS_START_S + full_runs * steps * step_seconds("gpt2", batch_tokens, 1024) * EAGER_SLOWDOWN


def loss_bench_estimate() -> float:
    """`python -m gpt.bench.gpu.loss_bench` at 124M's micro-batch: one process, its compiles
    and its timed iterations."""
    return (PROCESS_START_S + LOSS_GRAPHS * LOSS_GRAPH_COMPILE_S + TRITON_KERNELS * TRITON_KERNEL_S
            + LOSS_BENCH_RUN_S)
