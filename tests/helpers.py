"""Shared test helpers: the trainer's command line in subprocesses, shared data paths,
small models and trainer-style checkpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAIN_SCRIPT = REPO / "train_gpt2.py"
SHARED_DATA = REPO.parent / "shared" / "data"  # offline caches beside the checkout, when present
SHAKESPEARE = REPO / "gpt" / "assets" / "tinyshakespeare.txt"  # shipped with the package

# A 2-layer, 64-wide model on 32-token sequences: a CPU step takes well under a second.
TINY = ["--model", "tiny", "--block-size", "32", "--seq-len", "32", "--batch-size", "4",
        "--total-batch-tokens", "256", "--warmup-steps", "2", "--max-lr", "3e-3",
        "--device", "cpu"]
QUIET = ["--val-every", "0", "--sample-every", "0"]


def write_random_shards(folder: Path, seed: int, train: tuple[int, ...],
                        val: tuple[int, ...] = ()) -> Path:
    """A data folder of random GPT-2 token ids: one train_/val_ shard per size given."""
    import numpy as np

    from gpt.shards import write_shard

    rng = np.random.default_rng(seed)
    for split, sizes in (("train", train), ("val", val)):
        for i, n in enumerate(sizes):
            write_shard(folder / f"{split}_{i:06d}.bin", rng.integers(0, 50257, n))
    return folder


def run_cli(*args: str, timeout: int = 300, **kwargs) -> subprocess.CompletedProcess:
    """`python train_gpt2.py ARGS`, captured."""
    return subprocess.run([sys.executable, str(TRAIN_SCRIPT), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout, **kwargs)


def torchrun_cmd(*args: str, nproc: int = 2, extra: tuple[str, ...] = (),
                 target: Sequence[str] = (str(TRAIN_SCRIPT),)) -> list[str]:
    """torchrun's command line; `target` is what it launches: a script, or ("-m", module)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", *extra, *target, *args]


# Set by a launcher for its workers; torchrun sets its own, so none may leak in from here.
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def run_torchrun(*args: str, nproc: int = 2, extra: tuple[str, ...] = (),
                 target: Sequence[str] = (str(TRAIN_SCRIPT),),
                 timeout: int = 300) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=N TARGET ARGS` (gloo on CPU), captured;
    TARGET is train_gpt2.py unless given."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
    env["OMP_NUM_THREADS"] = "1"  # 2 ranks on 2 cores: no oversubscription
    return subprocess.run(torchrun_cmd(*args, nproc=nproc, extra=extra, target=target), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, env=env)


def meta_gpt(name: str, **overrides: object):
    """A preset GPT built on the meta device: shapes without memory, so even 2.7B is instant."""
    import torch

    from gpt.config import model_preset
    from gpt.model import GPT

    with torch.device("meta"):
        return GPT(model_preset(name, **overrides))


def write_checkpoint(path: Path, model=None, step: int = 1, block_size: int = 64) -> Path:
    """A trainer-style checkpoint of `model`; by default a tiny model (seed 0) with GPT-2's
    padded vocabulary and the given block size."""
    import torch

    from gpt.config import Config, model_preset, to_dict
    from gpt.model import GPT

    if model is None:
        torch.manual_seed(0)
        model = GPT(model_preset("tiny", block_size=block_size))
    cfg = Config(preset="tiny", model=model.config)
    torch.save({"model": model.state_dict(), "optimizer": {}, "loader": {}, "step": step,
                "config": to_dict(cfg)}, path)
    return path


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


def assert_resume_is_exact(args: Sequence[str], tmp_path: Path, steps: int = 4) -> Path:
    """Train `steps` steps straight, and again stopped at half and resumed: the same losses.
    Returns the resumed run's folder."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = [*args, "--max-steps", str(steps)]
    assert run_cli(*common, "--out-dir", str(straight)).returncode == 0
    for extra in (["--stop-at-step", str(steps // 2)], ["--resume", "auto"]):
        proc = run_cli(*common, *extra, "--out-dir", str(split))
        assert proc.returncode == 0, proc.stderr
    assert [r["loss"] for r in read_metrics(split, "train")] == \
        [r["loss"] for r in read_metrics(straight, "train")]
    return split


def assert_two_ranks_match_one(args: Sequence[str], mode: str, tmp_path: Path) -> tuple[Path, Path]:
    """The same run in one process and on 2 gloo ranks under --parallel `mode`: the same
    losses to fp32 rounding. Returns (one, two), the run folders."""
    import pytest

    one, two = tmp_path / "one", tmp_path / "two"
    assert run_cli(*args, "--out-dir", str(one)).returncode == 0
    proc = run_torchrun(*args, "--parallel", mode, "--out-dir", str(two))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["loss"] for r in read_metrics(two, "train")] == \
        pytest.approx([r["loss"] for r in read_metrics(one, "train")], rel=1e-5)
    return one, two


def meta_build_and_reference(cfg: Any) -> tuple[Any, Any]:
    """(a GPT of cfg built on the meta device, moved to the CPU and initialised; one built
    on the CPU directly), each from seed 0, after checking that their weights are equal:
    the trainer builds big models the first way, and must get the same start."""
    import torch

    from gpt.model import GPT

    torch.manual_seed(0)
    ref = GPT(cfg)
    with torch.device("meta"):
        model = GPT(cfg)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_weights()
    assert model.state_dict().keys() == ref.state_dict().keys()
    for key, value in ref.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    return model, ref


def read_only_folder(tmp_path: Path) -> Path:
    """A folder this process cannot create anything in: one of mode 555, or for root, whom
    modes do not stop, sysfs (where not even root may make a folder). Skips the test where
    there is none."""
    import pytest

    if os.geteuid() != 0:
        parent = tmp_path / "ro"
        parent.mkdir(mode=0o555)
        return parent
    probe = Path("/sys/gpt2-trainer-probe")
    try:
        probe.mkdir()
    except OSError:
        return Path("/sys")
    probe.rmdir()
    pytest.skip("no folder here is read-only to root")
