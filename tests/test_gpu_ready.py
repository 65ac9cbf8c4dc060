"""What a GPU run of the tests would stop at, found on the CPU first.

- --fake-cuda (tests/cuda_checks.py): the tests marked cuda run on a machine without a GPU up
  to their first CUDA call; one that stops at CUDA's own error passes, one that fails
  before it (a bug a GPU run would stop at) fails, a skip stays a skip. On a file of such
  tests, in a pytest of its own (the option patches torch for its whole run).
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


def pytest_on_the_example(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_example.py").write_text(EXAMPLE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"),
                                                        os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "cuda_checks", "-rA",
                           "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning",
                           *flags, "test_example.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="--fake-cuda is for a machine without a GPU")
def test_fake_cuda_passes_what_reached_cuda_and_fails_what_broke_before(tmp_path: Path) -> None:
    """The plugin on a file of example tests, in a pytest of its own."""
    proc = pytest_on_the_example(tmp_path, "--fake-cuda", "-k", "not compile")
    out = proc.stdout
    assert "PASSED test_example.py::test_reaches_cuda" in out, out[-3000:]
    assert "reached CUDA: Torch not compiled with CUDA enabled" in out
    assert "FAILED test_example.py::test_a_bug_before_its_first_cuda_call" in out
    assert "failed before its first CUDA call" in out
    assert "liger-kernel is not installed" in out and "SKIPPED" in out
    assert "FAILED test_example.py::test_not_a_cuda_test" in out
    assert proc.returncode == 1 and "2 failed, 1 passed, 1 skipped" in out


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
