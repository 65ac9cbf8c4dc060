"""Helpers for tests that run the trainer's command line in subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# A 2-layer, 64-wide model on 32-token sequences: a CPU step takes well under a second.
TINY = ["--model", "tiny", "--block-size", "32", "--seq-len", "32", "--batch-size", "4",
        "--total-batch-tokens", "256", "--warmup-steps", "2", "--max-lr", "3e-3",
        "--device", "cpu"]
QUIET = ["--val-every", "0", "--sample-every", "0"]


def write_random_shards(folder: Path, seed: int, train: tuple[int, ...],
                        val: tuple[int, ...] = ()) -> Path:
    """A data folder of random GPT-2 token ids: one train_/val_ shard per size given."""
    import numpy as np

    from gpt.data import write_shard

    rng = np.random.default_rng(seed)
    for split, sizes in (("train", train), ("val", val)):
        for i, n in enumerate(sizes):
            write_shard(folder / f"{split}_{i:06d}.bin", rng.integers(0, 50257, n))
    return folder


def run_cli(*args: str, timeout: int = 300, **kwargs) -> subprocess.CompletedProcess:
    """`python train_gpt2.py ARGS`, captured."""
    return subprocess.run([sys.executable, str(REPO / "train_gpt2.py"), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout, **kwargs)


def torchrun_cmd(*args: str, nproc: int = 2, extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", *extra, str(REPO / "train_gpt2.py"), *args]


def run_torchrun(*args: str, nproc: int = 2, extra: tuple[str, ...] = (),
                 timeout: int = 300) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=N train_gpt2.py ARGS` (gloo on CPU), captured."""
    env = dict(os.environ, OMP_NUM_THREADS="1")  # 2 ranks on 2 cores: no oversubscription
    return subprocess.run(torchrun_cmd(*args, nproc=nproc, extra=extra), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, env=env)


def read_metrics(out: Path, kind: str | None = None) -> list[dict]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if kind is None or r["type"] == kind]


def wait_for(predicate, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Poll until predicate() is true; fail if the process ends or time runs out first."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process ended (status {proc.returncode}) before the condition")
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.1)


def kill_tree(proc: subprocess.Popen) -> None:
    """Make sure a test's process group is gone, whatever state it is in."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
