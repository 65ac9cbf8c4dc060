"""The tests marked cuda, checked on the CPU before a GPU runs them, and on the GPU.

`python -m pytest -m cuda --fake-cuda`: every CUDA test, on a machine without a GPU, up to
its first CUDA call. A test marked cuda is skipped without a GPU, so a bug in what it does
before it reaches CUDA (its arguments, its skips, the package's code it calls first) would
show only on a GPU, whose time is scarce: one such bug (a tuple handed to
importlib.util.find_spec) once stopped a whole GPU run's tests. Under --fake-cuda, torch
answers as one H100 would to what is asked before the device is used
(tests/fake_cuda.py: is_available, the device's count, name, capability, memory), for the
whole run (the tests' own checks, the trainer's device choice, conftest's skip) and in every
process the tests start (the trainer a test runs as a process, torchrun and its ranks: the
tests' sitecustomize.py, tests/conftest.py's, loads the fake there); every cuda test runs,
and its outcome is judged by where it stopped:

- it fails with CUDA's own error (CUDA_ERRORS: torch without CUDA or without a driver) at
  its first CUDA call, STOPS's (in the innermost frame of this project's code before the
  error, a child process's included: the report holds its traceback): it got as far as a
  CPU can take it. That is a pass here, reported with where and the error.
- it fails with CUDA's error elsewhere, earlier or later: something before it changed, or
  the fake no longer reaches the process. It fails, saying so.
- it fails with anything else: a bug before its first CUDA call. It fails, saying so.
- it skips (a package it needs is missing) or passes: as it would on a GPU.

On a GPU, a cuda test in which torch.compile gave up on a function (its recompile limit
hit: dynamo then runs it eagerly, saying so in one log line) fails at its teardown: a test
of the compiled path must not pass uncompiled (tests/helpers.py's CompileFellBack; the
trainer runs it starts in-process fail the same way).

Registered by tests/conftest.py (pytest_plugins); CI runs --fake-cuda (.ci/run, part 2).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterator

import pytest

import fake_cuda
from helpers import CompileFellBack

# What a CUDA call raises where there is no CUDA: torch built without it (torch/cuda's lazy
# init, a CUDA generator, pinned memory, torch._C's CUDA bindings), torch built with it on a
# machine without a GPU or driver, Triton finding no GPU to launch on. (Not the trainer's
# own refusal, gpt/runtime/device.py's "--device cuda: no CUDA device is visible to torch":
# the fake reaches every process, so that refusal is a process it did not reach.)
CUDA_ERRORS = re.compile("|".join([*map(re.escape, (
    "Torch not compiled with CUDA enabled",
    "Cannot get CUDA generator without ATen_cuda library",
    "no pinned memory allocator is available",
    "Found no NVIDIA driver on your system",
    "No CUDA GPUs are available",
    "no CUDA-capable device is detected",
    "CUDA driver initialization failed",
    "0 active drivers",
    # torch's CUDA build where a driver library is present but no GPU or too old a driver:
    # the CUDA runtime's own errors, all "CUDA error: ..."
    "CUDA error: ",
)),
    # torch built without CUDA, called where the fake's answers sent the code on to the
    # device (torch.cuda.set_device and the like reach torch._C's CUDA bindings)
    r"module 'torch\._C' has no attribute '_cuda_\w+'"]))
FAKE = pytest.StashKey[bool]()
# Where each CUDA test of tests/ stops under --fake-cuda: its first real CUDA call, after
# everything a CPU can check (stopped_at's `file (function)`; a test's own name where its
# body makes the call). A trainer in a process of its own stops where it does in-process.
TRAINER = "gpt/model/transformer.py (to_empty)"  # the model moved onto the GPU
OWN = "own body"
STOPS: dict[str, str] = {f"tests/{test}": where for test, where in {
    "model/test_chunked_ce.py::test_compiled_on_cuda_it_holds_a_chunk_not_every_chunks_gradient": OWN,
    "runs/test_cuda.py::test_bf16_autocast_dtypes": "tests/runs/test_cuda.py (tiny_gpu_model)",
    "runs/test_cuda.py::test_fp16_grad_scaler_takes_a_step": "tests/runs/test_cuda.py (tiny_gpu_model)",
    "runs/test_cuda.py::test_trainer_cuda_defaults_use_tf32_compile_and_fused_adamw": TRAINER,
    "runs/test_cuda.py::test_a_fused_sdpa_kernel_runs_at_1024_and_matches_math":
        "tests/runs/test_cuda.py (<genexpr>)",
    "runs/test_cuda.py::test_pinned_double_buffered_loader_gives_the_cpu_batches":
        "gpt/data/loader.py (_to_cuda)",
    "runs/test_cuda.py::test_compiled_training_run_learns": TRAINER,
    # the trainer it starts and signals, a process of its own
    "runs/test_cuda.py::test_resume_after_sigterm_continues_the_curve": TRAINER,
    "runs/test_cuda.py::test_validation_under_cuda_graphs": TRAINER,
    "runs/test_cuda.py::test_a_training_step_never_waits_for_the_gpu": "tests/runs/test_cuda.py (tiny_gpu_model)",
    "runs/test_cuda.py::test_a_meta_model_initialised_on_the_gpu_equals_the_cpu_build": TRAINER,
    "runs/test_cuda.py::test_metrics_report_mfu_against_the_device_peak": TRAINER,
    # torchrun's rank: its device set before NCCL's process group (one more call is NCCL)
    "runs/test_cuda.py::test_torchrun_nccl_modes_take_steps": "gpt/runtime/world.py (init_runtime)",
    "runs/test_cuda.py::test_activation_checkpointing_keeps_a_fraction_of_the_block_activations":
        "tests/runs/test_cuda.py (held)",
    "runs/test_cuda.py::test_kv_cache_generation_equals_full_recompute": "tests/runs/test_cuda.py (tiny_gpu_model)",
    "runs/test_cuda.py::test_hellaswag_under_compile_equals_eager": OWN,
    "model/test_fused_ce.py::test_on_cuda_in_bf16_it_equals_the_whole_logits": OWN,
    "model/test_fused_ce.py::test_on_cuda_the_forward_mode_in_bf16_against_float64": OWN,
    "model/test_fused_ce.py::test_a_compiled_trainer_run_with_fused_logs_the_whole_logits_losses": TRAINER,
    "model/test_loss_kernels.py::test_a_library_kernel_on_cuda_equals_ours": OWN,
    "model/test_loss_kernels.py::test_a_compiled_trainer_run_with_a_library_kernel_logs_the_whole_logits_losses":
        TRAINER,
    "model/test_speedrun_parts.py::test_flex_attention_trains_as_sdpa_on_cuda": OWN,
}.items()}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fake-cuda", action="store_true",
                     help="run the tests marked cuda on a machine without a GPU, "
                          "torch.cuda.is_available() answering True: each passes if it stops at "
                          "CUDA's own error (it reached its first CUDA call) and fails for any "
                          "other (a bug before it); use with -m cuda")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.stash[FAKE] = bool(config.getoption("--fake-cuda", False))
    if not config.stash[FAKE]:
        return
    import torch

    if fake_cuda.real_is_available(torch):  # an xdist worker is faked already, at its start
        raise pytest.UsageError("--fake-cuda is for a machine without a GPU: this one has one, "
                                "so run `python -m pytest -m cuda` without it")
    # for the whole run (a test's own checks, conftest's skip and the in-process trainer
    # all ask), in this process and in each xdist worker, which configures itself too, and
    # in every process they start (the trainer, torchrun and its ranks): the tests'
    # sitecustomize.py loads the fake where the variable names it
    os.environ[fake_cuda.FAKE_CUDA] = fake_cuda.__file__
    fake_cuda.install()


def reached_cuda(text: str) -> str | None:
    """The CUDA error a failure's report shows, if any."""
    found = CUDA_ERRORS.search(text)
    return found.group(0) if found else None


# The line of a raised error ("E   AssertionError: ...", "RuntimeError: ..."), not one that
# only quotes it (a run's line saying what it could not time, printed before the traceback)
RAISED = re.compile(r"(E\s+)?\s*[\w.]*(Error|Exception): ")
# A frame in a report: a Python traceback's (a child process's stderr), or pytest's own
FRAME = re.compile(r'File "(?P<file>[^"]+)", line \d+, in (?P<fn>[\w<>.]+)'
                   r'|^(?P<path>[^\s:]+\.py):\d+: in (?P<func>[\w<>.]+)', re.M)
REPO = Path(__file__).resolve().parent.parent


def stopped_at(text: str, test: str) -> str | None:
    """Where a report's CUDA error stopped the test: the innermost frame of this project
    (gpt/, tests/, train_gpt2.py) before the first line that raises the error (RAISED;
    failing that, its first mention), as `file (function)`;
    a child process's traceback comes inside the report (the test asserts on its stderr),
    so this is the child's own innermost frame; `test` (`file (function)`) where there is
    none (the test's own body called CUDA)."""
    raised = [m for m in CUDA_ERRORS.finditer(text) if RAISED.match(
        text, text.rfind("\n", 0, m.start()) + 1)]
    found = raised[0] if raised else CUDA_ERRORS.search(text)
    if found is None:
        return None
    last = test
    for frame in FRAME.finditer(text, 0, found.start()):
        file, fn = frame.group("file") or frame.group("path"), frame.group("fn") or frame.group("func")
        path = Path(file)
        if path.is_absolute():
            try:
                path = path.resolve().relative_to(REPO)
            except ValueError:
                continue
        if path.parts[0] in ("gpt", "tests") or path.as_posix() == "train_gpt2.py":
            last = f"{path.as_posix()} ({fn})"
    return last


def stop_problem(item: pytest.Item, where: str | None) -> str | None:
    """Why `where` is not where the test should stop (STOPS), or None: a test of this
    repository's tests/ must stop where STOPS says its first CUDA call is."""
    if not Path(str(item.path)).resolve().is_relative_to(REPO / "tests"):
        return None
    key = f"{item.location[0]}::{item.originalname}"
    expected = STOPS.get(key)
    if expected == OWN:
        expected = f"{item.location[0]} ({item.originalname})"
    if expected is None:
        return (f"it stopped at {where}, and tests/cuda_checks.py's STOPS says nothing of "
                f"{key}: add where its first CUDA call is")
    if where != expected:
        return (f"it stopped at {where}, not at its first CUDA call, {expected} "
                f"(tests/cuda_checks.py's STOPS): something before it changed, or the fake "
                f"no longer reaches the process that makes it")
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[Any]:
    outcome = yield
    if not item.config.stash.get(FAKE, False) or "cuda" not in item.keywords:
        return
    report: pytest.TestReport = outcome.get_result()
    if not report.failed:
        return
    error = reached_cuda(report.longreprtext)
    if error is not None:
        where = stopped_at(report.longreprtext, f"{item.location[0]} ({item.originalname})")
        problem = stop_problem(item, where)
        if problem is not None:
            report.sections.append(("fake CUDA", f"reached CUDA ({error}), but {problem}"))
            return
        report.outcome = "passed"
        report.longrepr = None
        report.sections.append(("fake CUDA", f"reached CUDA at {where}: {error}"))
        return
    if report.when != "teardown":
        report.sections.append(("fake CUDA", "failed before its first CUDA call: a bug a GPU "
                                "run would have stopped at"))


@pytest.fixture(autouse=True)
def compiled_throughout(request: pytest.FixtureRequest) -> Iterator[None]:
    """A cuda test fails if torch.compile gave up on a function while it ran."""
    if "cuda" not in request.keywords:
        yield
        return
    fell_back = CompileFellBack()
    fell_back.start()
    try:
        yield
    finally:
        fell_back.stop()
    if fell_back.said:
        pytest.fail("torch.compile fell back to eager in this test: " + "; ".join(fell_back.said))
