"""The launch scripts as users run them: relative paths from where they stand, and two
torchrun agents on one machine (--nnodes=2, c10d rendezvous on 127.0.0.1) training like one
process at the same global batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, TINY_RUN, assert_trains_alike, free_port, run_cli
from gpt.checkpoint.files import load

LAUNCH = REPO / "launch"
# Global batch 512 tokens: one process accumulates 4 micro-batches of 4 x 32, two nodes 2 each.
ARGS = [*TINY_RUN, "--max-steps", "3"]


def launcher_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **extra}


@pytest.mark.slow
def test_single_node_script_resolves_relative_paths_where_the_user_stands(data_dir: Path,
                                                                          tmp_path: Path) -> None:
    (tmp_path / "data").symlink_to(data_dir)
    proc = subprocess.run([str(LAUNCH / "single_node.sh"), *ARGS, "--data-dir", "data",
                           "--out-dir", "runs/here"], cwd=tmp_path, env=launcher_env(NGPUS="1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "runs" / "here" / "ckpt_000003.pt").is_file()
    assert not (REPO / "runs" / "here").exists()


@pytest.mark.numerics
@pytest.mark.slow
def test_two_nodes_on_one_machine_train_like_one_process(data_dir: Path, tmp_path: Path) -> None:
    single = tmp_path / "single"
    proc = run_cli(*ARGS, "--data-dir", str(data_dir), "--out-dir", str(single))
    assert proc.returncode == 0, proc.stderr

    env = launcher_env(NNODES="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                       NGPUS="1", MAX_RESTARTS="0", RUN_ID=f"test-{os.getpid()}")
    cmd = [str(LAUNCH / "multi_node.sh"), *ARGS, "--data-dir", str(data_dir), "--out-dir", "two"]
    nodes = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
             for _ in range(2)]
    try:
        outputs = [node.communicate(timeout=300) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, 9)
    for node, (_, err) in zip(nodes, outputs):
        assert node.returncode == 0, err[-3000:]
    stdout = "".join(out for out, _ in outputs)
    assert "x 2 | parallel ddp" in stdout and stdout.count("saved checkpoint") == 1

    two = tmp_path / "two"  # relative to where the launchers ran
    assert_trains_alike(single, two, 3)  # fp32 rounding in another order, as tests/runs/test_two_ranks.py
    ckpt = load(two / "ckpt_000003.pt")
    assert [s["rank"] for s in ckpt["loader"]] == [0, 1]


# ---------------------------------------------------------------------------------------
# Which Python the launchers run: $PYTHON, else the active virtual environment's, else
# python3 on PATH (launch/find_python.sh); one line when it cannot import torch.

SCRIPTS = ["single_node.sh", "multi_node.sh", "slurm.sbatch", "profile_nsys.sh"]


def path_without_torch(tmp_path: Path) -> str:
    """A PATH whose python3 fails as a Python without torch does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n")
    fake.chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin"


def bare_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The launchers' environment with no PYTHON and no active virtual environment."""
    env = {k: v for k, v in launcher_env().items() if k not in ("PYTHON", "VIRTUAL_ENV")}
    return {**env, "PATH": path_without_torch(tmp_path), "GPT2_TRAINER": str(REPO),
            "NNODES": "1", "MASTER_ADDR": "127.0.0.1", **extra}


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_python_without_torch_is_named_in_one_line(script: str, tmp_path: Path) -> None:
    proc = subprocess.run(["/bin/bash", str(LAUNCH / script)], cwd=tmp_path,
                          env=bare_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr  # one line, no traceback
    assert proc.stderr.startswith(f"error: {tmp_path}/bin/python3 (python3 on PATH) cannot import torch")
    assert "PYTHON=/path/to/python" in proc.stderr


@pytest.mark.slow
def test_the_python_chosen_is_said_and_exported(tmp_path: Path) -> None:
    finder = ["/bin/bash", str(LAUNCH / "find_python.sh")]
    proc = subprocess.run(finder, env=bare_env(tmp_path, PYTHON=sys.executable),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    import torch
    assert proc.stderr == f"python: {sys.executable} (torch {torch.__version__}; PYTHON)\n"

    proc = subprocess.run(finder, env=bare_env(tmp_path, PYTHON="/nonexistent/python"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: /nonexistent/python (PYTHON) not found")


@pytest.mark.slow
@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the suite runs outside a virtual environment")
def test_the_active_virtual_environment_wins_over_python3_on_path(tmp_path: Path) -> None:
    """The issue's case: the environment is active, another python3 comes first on PATH.
    Its python runs torchrun; --help stops the trainer before any work."""
    env = bare_env(tmp_path, VIRTUAL_ENV=sys.prefix, NGPUS="1")
    proc = subprocess.run(["/bin/bash", str(LAUNCH / "single_node.sh"), "--help"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"python: {sys.prefix}/bin/python (torch " in proc.stderr
    assert "the active virtual environment" in proc.stderr and "--max-steps" in proc.stdout
