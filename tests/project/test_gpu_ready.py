"""What a GPU run of the tests would stop at, found on the CPU first.

- --fake-cuda (tests/cuda_checks.py): the tests marked cuda run on a machine without a GPU up
  to their first CUDA call, in the processes they start too; one that stops at CUDA's own
  error passes, one that fails before it (a bug a GPU run would stop at) fails, a skip
  stays a skip. On a file of such tests, in a pytest of its own (the option patches torch
  for its whole run); and where a report says a test stopped, against where it should.
- An in-process trainer run (tests/helpers.py's train_here), and a cuda test, in which
  torch.compile gave up on a function, its recompile limit hit, fails instead of passing
  uncompiled.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from helpers import REPO, train_here

EXAMPLE = textwrap.dedent('''
    import importlib.util

    import pytest
    import torch


    @pytest.mark.cuda
    def test_reaches_cuda():
        assert torch.cuda.is_available()  # what --fake-cuda answers
        torch.zeros(1, device="cuda")


    @pytest.mark.cuda
    def test_a_bug_before_its_first_cuda_call():
        importlib.util.find_spec(("liger_kernel", "liger_kernel.transformers"))  # a tuple
        torch.zeros(1, device="cuda")


    @pytest.mark.cuda
    def test_a_missing_package():
        pytest.skip("liger-kernel is not installed")


    @pytest.mark.cuda
    def test_a_child_process_reaches_cuda():
        import subprocess, sys

        code = "import torch; assert torch.cuda.is_available(), 'no GPU in the child'; torch.zeros(1, device='cuda')"
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert child.returncode == 0, child.stderr


    def test_not_a_cuda_test():
        raise RuntimeError("Torch not compiled with CUDA enabled")  # not judged: it fails


    @pytest.mark.cuda
    def test_compile_gave_up():
        import torch._dynamo

        fn = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
        with torch._dynamo.config.patch(recompile_limit=1):
            for n in (1, 2, 3):
                fn(torch.ones(n))  # past the limit: eager, and dynamo says so in a log line
''')


def pytest_on_the_example(tmp_path: Path, *flags: str, site: bool = True) -> subprocess.CompletedProcess:
    """pytest on EXAMPLE, with the plugin; its processes' PYTHONPATH this run's (the tests'
    sitecustomize.py on it), or, without `site`, tests/ alone."""
    (tmp_path / "test_example.py").write_text(EXAMPLE)
    inherited = [os.environ.get("PYTHONPATH", "")] if site else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), *inherited])}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "cuda_checks", "-rA",
                           "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning",
                           *flags, "test_example.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="--fake-cuda is for a machine without a GPU")
def test_fake_cuda_passes_what_reached_cuda_and_fails_what_broke_before(tmp_path: Path) -> None:
    """The plugin on a file of example tests, in a pytest of its own."""
    proc = pytest_on_the_example(tmp_path, "--fake-cuda", "-k", "not compile")
    out = proc.stdout
    assert "PASSED test_example.py::test_reaches_cuda" in out, out[-3000:]
    assert ("reached CUDA at test_example.py (test_reaches_cuda): Torch not compiled with CUDA "
            "enabled") in out
    assert "FAILED test_example.py::test_a_bug_before_its_first_cuda_call" in out
    assert "failed before its first CUDA call" in out
    assert "liger-kernel is not installed" in out and "SKIPPED" in out
    assert "FAILED test_example.py::test_not_a_cuda_test" in out
    # a process the test starts is faked too: it gets past is_available to its first CUDA call
    assert "PASSED test_example.py::test_a_child_process_reaches_cuda" in out
    assert proc.returncode == 1 and "2 failed, 2 passed, 1 skipped" in out


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="--fake-cuda is for a machine without a GPU")
def test_without_the_tests_sitecustomize_a_child_is_not_faked(tmp_path: Path) -> None:
    """The fake reaches a child through the tests' sitecustomize.py on its PYTHONPATH
    (tests/conftest.py's): a child without it finds no GPU and fails before CUDA, which
    the plugin calls a bug."""
    proc = pytest_on_the_example(tmp_path, "--fake-cuda", "-k", "child", site=False)
    assert "FAILED test_example.py::test_a_child_process_reaches_cuda" in proc.stdout, proc.stdout[-3000:]
    assert "no GPU in the child" in proc.stdout and "failed before its first CUDA call" in proc.stdout


CHILD_REPORT = textwrap.dedent("""
    tests/runs/test_cuda.py:270: in test_resume_after_sigterm_continues_the_curve
        wait_for(lambda: ..., timeout=300, proc=proc)
    tests/helpers.py:209: in wait_for
        raise AssertionError(f"process ended ...")
    E   AssertionError: process ended (status 1) before the condition; its last output:
    E   time: not timed on NVIDIA H100 80GB HBM3 x 1: timing a slice failed (Torch not compiled with CUDA enabled)
    E   Traceback (most recent call last):
    E     File "{repo}/train_gpt2.py", line 10, in <module>
    E     File "{repo}/gpt/train/trainer.py", line 80, in main_with
    E     File "{repo}/gpt/model/transformer.py", line 251, in to_empty
    E     File "{repo}/.venv/lib/python3.11/site-packages/torch/cuda/__init__.py", line 403, in _lazy_init
    E   AssertionError: Torch not compiled with CUDA enabled
    tests/helpers.py:209: AssertionError
""")


def test_where_a_test_stopped_and_whether_it_should_have() -> None:
    """The innermost frame of this project's code before the CUDA error, a child process's
    traceback (inside the test's assertion) included, the site-packages' left out, a line
    that only quotes the error before it (the run's speed line, timing that failed) not taken
    for it; and the
    judgement against STOPS: right where recorded, a failure elsewhere (the trainer
    stopping earlier, at its device check, as it did where the fake did not reach it) or
    for a test STOPS does not know."""
    from types import SimpleNamespace

    from cuda_checks import STOPS, stop_problem, stopped_at

    text = CHILD_REPORT.format(repo=REPO)
    where = stopped_at(text, "tests/runs/test_cuda.py (test_resume_after_sigterm_continues_the_curve)")
    assert where == "gpt/model/transformer.py (to_empty)"
    assert stopped_at("E   RuntimeError: Torch not compiled with CUDA enabled", "t.py (test_x)") == "t.py (test_x)"

    def item(test: str) -> SimpleNamespace:
        return SimpleNamespace(path=REPO / "tests" / "runs" / "test_cuda.py", originalname=test,
                               location=("tests/runs/test_cuda.py", 0, test))

    resume = item("test_resume_after_sigterm_continues_the_curve")
    assert STOPS["tests/runs/test_cuda.py::" + resume.originalname] == where
    assert stop_problem(resume, where) is None
    early = stop_problem(resume, "gpt/runtime/device.py (resolve_device)")
    assert early.startswith("it stopped at gpt/runtime/device.py (resolve_device), not at its "
                            "first CUDA call, gpt/model/transformer.py (to_empty)")
    assert "says nothing of tests/runs/test_cuda.py::test_new" in stop_problem(item("test_new"), where)
    outside = SimpleNamespace(path=Path("/elsewhere/test_x.py"), originalname="test_x",
                              location=("test_x.py", 0, "test_x"))
    assert stop_problem(outside, where) is None  # only this repository's tests are held to STOPS


@pytest.mark.parametrize("message, reached", [
    ("RuntimeError: Torch not compiled with CUDA enabled", True),  # torch's CPU build
    # torch's CUDA build where a driver library is installed without a GPU (CI's part 2)
    ("torch.AcceleratorError: CUDA error: CUDA driver version is insufficient for CUDA "
     "runtime version", True),
    ("RuntimeError: Found no NVIDIA driver on your system.", True),
    ("TypeError: expected str, bytes or os.PathLike object, not tuple", False),  # a bug first
    ("AssertionError: the loss is NaN on CUDA", False),  # names CUDA, is not CUDA's error
])
def test_what_counts_as_reaching_cuda(message: str, reached: bool) -> None:
    from cuda_checks import reached_cuda

    assert (reached_cuda(message) is not None) is reached


@pytest.mark.slow
def test_a_cuda_test_in_which_compile_gave_up_fails(tmp_path: Path) -> None:
    """Without --fake-cuda (torch.compile cannot run where CUDA is only pretended): the
    example's cuda test that runs torch.compile past its recompile limit passes its own
    assertions, and errors at its teardown, naming the limit."""
    proc = pytest_on_the_example(tmp_path, "-k", "compile")
    out = proc.stdout
    assert "ERROR test_example.py::test_compile_gave_up" in out, out[-3000:]
    assert "torch.compile fell back to eager in this test: torch._dynamo hit config.recompile_limit" in out
    assert proc.returncode == 1


def test_an_in_process_run_in_which_compile_gave_up_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """dynamo, past its recompile limit, runs a function eagerly and says so in one log
    line: train_here turns that into a failed run naming it. The run here compiles a
    function (dynamo's eager backend: no code generated) with a recompile limit of 1 and
    calls it at three shapes, as a trainer whose shapes kept changing would."""
    import gpt.entry

    def compiled_run(argv: list[str]) -> int:
        import torch._dynamo

        fn = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
        with torch._dynamo.config.patch(recompile_limit=1):
            for n in (1, 2, 3):
                fn(torch.ones(n))
        return 0

    monkeypatch.setattr(gpt.entry, "train_main", compiled_run)
    proc = train_here("--max-steps", "1")
    assert proc.returncode == 1, proc.stderr
    assert "torch.compile fell back to eager in this run: torch._dynamo hit config.recompile_limit (1)" \
        in proc.stderr
    assert logging.getLogger("torch._dynamo.convert_frame").handlers == []  # removed after the run
    monkeypatch.setattr(gpt.entry, "train_main", lambda argv: 0)
    assert train_here().returncode == 0  # a run that did not fall back: as it was
