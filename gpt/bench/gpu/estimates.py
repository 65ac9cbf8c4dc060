"""How long each cell of the GPU acceptance (`python -m gpt.bench gpu`) is expected to take
on one H100, in seconds: what `--plan` adds up and what `--budget` compares with what is
left. Every figure is an estimate, made from what a cell does (its processes, compiles and
steps) with the constants below; each cell's result records its estimate beside the
seconds it took, so a run says how far off they are.

Where a constant comes from a measurement, the comment names it: the H200 run of
2026-11-26 and the H100 run of 2026-11-27 (benchmarks/gpu/), whose 124M cells took 23-85 s
(most 40-47 s), XL 72 s and the CUDA tests 181-182 s (on 4 workers, the tests spread one
by one: `--dist load`). The stages none of those runs had
(max-autotune, ladder, tokens, fp8, fp8-loss, speedrun, fused-compile) are rougher:
`Stage.measured` says which, and --plan marks them. Within the measured loss-kernels stage,
the cell of --loss-kernel fused (gpt/model/fused_ce.py) has not run on a GPU yet: its
estimate is a guess, the same 124M trainer cell's as its neighbours' (which took 40-47 s);
and so are the CUDA tests added since (marked in CUDA_TESTS), the loss-bench cell's (below) and
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
# `pytest -m cuda`, test by test (tests/<file>::<test>), in collection order: seconds
# measured where a GPU run's durations name the test (the H200 run of 2026-11-26, on 4
# workers: the 15 slowest in benchmarks/gpu/2026-11-26-h200/stage1/gpu_stage1.log; the H100
# run of 2026-11-27 kept none per test), MEASURED_UNDER where that run had the test but
# not among its slowest (each took less), and a guess, marked, for the tests added since.
MEASURED_UNDER = 10.22  # that run's 15th slowest
CUDA_TESTS: dict[str, float] = {
    "model/test_chunked_ce.py::test_compiled_on_cuda_it_holds_a_chunk_not_every_chunks_gradient":
        30.0,  # guess: one compile of a small model in the test's process
    # guesses: Triton's compile of the kernels and 2,048-4,096 rows of GPT-2's logits
    **{f"model/test_fused_ce.py::test_on_cuda_in_bf16_it_equals_the_whole_logits[{cap}]": 10.0
       for cap in ("0.0", "15.0")},
    **{f"model/test_fused_ce.py::test_on_cuda_the_forward_mode_in_bf16_against_float64[{p}]": 10.0
       for p in ("0.0-0.37", "0.0-1.0", "15.0-0.37", "15.0-1.0")},
    # guess: three compiled 4-step runs, each about test_compiled_training_run_learns's
    "model/test_fused_ce.py::test_a_compiled_trainer_run_with_fused_logs_the_whole_logits_losses": 80.0,
    "model/test_loss_kernels.py::test_a_library_kernel_on_cuda_equals_ours[liger]": MEASURED_UNDER,
    "model/test_loss_kernels.py::test_a_library_kernel_on_cuda_equals_ours[cce]": 10.60,
    # measured under their former name, ..._logs_our_losses
    "model/test_loss_kernels.py::test_a_compiled_trainer_run_with_a_library_kernel_logs_the_whole_logits_losses[liger]":
        56.33,
    "model/test_loss_kernels.py::test_a_compiled_trainer_run_with_a_library_kernel_logs_the_whole_logits_losses[cce]":
        42.42,
    "model/test_speedrun_parts.py::test_flex_attention_trains_as_sdpa_on_cuda": 17.86,
    **{f"runs/test_cuda.py::{name}": MEASURED_UNDER for name in (
        "test_bf16_autocast_dtypes", "test_fp16_grad_scaler_takes_a_step",
        "test_trainer_cuda_defaults_use_tf32_compile_and_fused_adamw",
        "test_a_fused_sdpa_kernel_runs_at_1024_and_matches_math",
        "test_pinned_double_buffered_loader_gives_the_cpu_batches")},
    "runs/test_cuda.py::test_compiled_training_run_learns": 27.05,
    "runs/test_cuda.py::test_resume_after_sigterm_continues_the_curve": 72.21,
    "runs/test_cuda.py::test_validation_under_cuda_graphs": 40.80,
    "runs/test_cuda.py::test_a_training_step_never_waits_for_the_gpu": MEASURED_UNDER,
    "runs/test_cuda.py::test_a_meta_model_initialised_on_the_gpu_equals_the_cpu_build": MEASURED_UNDER,
    "runs/test_cuda.py::test_metrics_report_mfu_against_the_device_peak": 10.22,
    **{f"runs/test_cuda.py::test_torchrun_nccl_modes_take_steps[{mode}]": s for mode, s in (
        ("ddp", 16.22), ("zero1", 15.77), ("fsdp-compile", 31.18), ("ddp-ac", 15.35),
        ("fsdp-ac", 14.81), ("fsdp-fp16", 16.21), ("fsdp-bf16-params", 29.50))},
    **{f"runs/test_cuda.py::{name}": MEASURED_UNDER for name in (
        "test_activation_checkpointing_keeps_a_fraction_of_the_block_activations",
        "test_kv_cache_generation_equals_full_recompute",
        "test_hellaswag_under_compile_equals_eager")},
}
# What the stage takes beyond its tests' calls: pytest's start, its workers' start and
# collection, fixtures. Calibrated on the H200 run: these durations (its 26 tests) put on 4
# workers as below come to 155 s of calls; the stage took 181 s.
PYTEST_START_S = 26
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
    """`pytest -m cuda`: serial, its start and every test's seconds (CUDA_TESTS); on N
    workers under `--dist load`, each test in collection order to the worker with the least
    work so far (how xdist's load scheduler hands them out, near enough), the busiest
    worker's work."""
    loads = [0.0] * max(1, workers)
    for seconds in CUDA_TESTS.values():
        loads[loads.index(min(loads))] += seconds
    return PYTEST_START_S + max(loads)


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
