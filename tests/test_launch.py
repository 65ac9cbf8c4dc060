"""The launch scripts as users run them: relative paths from where they stand, and two
torchrun agents on one machine (--nnodes=2, c10d rendezvous on 127.0.0.1) training like one
process at the same global batch."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import QUIET, REPO, TINY, read_metrics, run_cli, write_random_shards
from gpt.checkpoint import load

LAUNCH = REPO / "launch"
# Global batch 512 tokens: one process accumulates 4 micro-batches of 4 x 32, two nodes 2 each.
ARGS = [*TINY, *QUIET, "--total-batch-tokens", "512", "--max-steps", "3"]


def launcher_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_shards(tmp_path_factory.mktemp("data"), seed=4, train=(20_000, 7_000))


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
    one_losses = [r["loss"] for r in read_metrics(single, "train")]
    assert [r["loss"] for r in read_metrics(two, "train")] == pytest.approx(one_losses, rel=1e-5)
    ref, got = load(single / "ckpt_000003.pt")["model"], load(two / "ckpt_000003.pt")["model"]
    for name in ref:  # the tolerance of tests/test_dist.py: fp32 reduction order only
        diff = (got[name] - ref[name]).abs()
        assert diff.max() < 5e-5 and diff.mean() < 2e-6, name
    ckpt = load(two / "ckpt_000003.pt")
    assert [s["rank"] for s in ckpt["loader"]] == [0, 1]
