"""The tests marked cuda, checked on the CPU before a GPU runs them, and on the GPU.

`python -m pytest -m cuda --fake-cuda`: every CUDA test, on a machine without a GPU, up to
its first CUDA call. A test marked cuda is skipped without a GPU, so a bug in what it does
before it reaches CUDA (its arguments, its skips, the package's code it calls first) would
show only on a GPU, whose time is scarce: one such bug (a tuple handed to
importlib.util.find_spec) once stopped a whole GPU run's tests. Under --fake-cuda,
torch.cuda.is_available() answers True for the whole run (the tests' own checks, the
trainer's device choice, conftest's skip), every cuda test runs, and its outcome is judged
by where it stopped:

- it fails with CUDA's own error (CUDA_ERRORS: torch without CUDA or without a driver, the
  trainer's refusal in a process the patch does not reach): it got as far as a CPU can
  take it. That is a pass here, reported with the error it reached.
- it fails with anything else: a bug before its first CUDA call. It fails, saying so.
- it skips (a package it needs is missing) or passes: as it would on a GPU.

On a GPU, a cuda test in which torch.compile gave up on a function (its recompile limit
hit: dynamo then runs it eagerly, saying so in one log line) fails at its teardown: a test
of the compiled path must not pass uncompiled (tests/helpers.py's CompileFellBack; the
trainer runs it starts in-process fail the same way).

Registered by tests/conftest.py (pytest_plugins); CI runs --fake-cuda (.ci/run, part 2).
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import pytest

from helpers import CompileFellBack

# What a CUDA call raises where there is no CUDA: torch built without it (torch/cuda's lazy
# init, a CUDA generator, pinned memory), torch built with it on a machine without a GPU or
# driver, Triton finding no GPU to launch on, and the trainer's own refusal
# (gpt/runtime/device.py) in a process of its own (torchrun's ranks, a subprocess), which
# the patch does not reach.
CUDA_ERRORS = re.compile("|".join(map(re.escape, (
    "Torch not compiled with CUDA enabled",
    "Cannot get CUDA generator without ATen_cuda library",
    "no pinned memory allocator is available",
    "Found no NVIDIA driver on your system",
    "No CUDA GPUs are available",
    "no CUDA-capable device is detected",
    "CUDA driver initialization failed",
    "0 active drivers",
    "--device cuda: no CUDA device is visible to torch",
    # torch's CUDA build where a driver library is present but no GPU or too old a driver:
    # the CUDA runtime's own errors, all "CUDA error: ..."
    "CUDA error: ",
))))
FAKE = pytest.StashKey[bool]()


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

    if torch.cuda.is_available():
        raise pytest.UsageError("--fake-cuda is for a machine without a GPU: this one has one, "
                                "so run `python -m pytest -m cuda` without it")
    # for the whole run (a test's own checks, conftest's skip and the in-process trainer
    # all ask), in this process and in each xdist worker, which configures itself too
    torch.cuda.is_available = lambda: True  # type: ignore[assignment]


def reached_cuda(text: str) -> str | None:
    """The CUDA error a failure's report shows, if any."""
    found = CUDA_ERRORS.search(text)
    return found.group(0) if found else None


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
        report.outcome = "passed"
        report.longrepr = None
        report.sections.append(("fake CUDA", f"reached CUDA: {error}"))
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
