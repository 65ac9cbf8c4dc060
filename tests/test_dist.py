"""Distributed training on CPU: 2 gloo ranks under torchrun against one process."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from clitools import QUIET, TINY, read_metrics, run_cli, run_torchrun
from gpt.checkpoint import load
from gpt.data import ShardLoader, write_shard

# Global batch 512 tokens = 4 micro-batches of 4 x 32: one process accumulates 4, two
# ranks 2 each. 3 steps, fp32 on CPU.
ARGS = [*TINY, *QUIET, "--total-batch-tokens", "512", "--max-steps", "3"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(1)
    write_shard(out / "train_000000.bin", rng.integers(0, 50257, 20_000))
    write_shard(out / "train_000001.bin", rng.integers(0, 50257, 7_000))
    return out


@pytest.fixture(scope="module")
def single_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("single")
    proc = run_cli(*ARGS, "--data-dir", str(data_dir), "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def final_params(out: Path) -> dict[str, torch.Tensor]:
    return load(out / "ckpt_000003.pt")["model"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "zero1", "fsdp", "fsdp-ac"])
def test_two_ranks_match_one_process(mode: str, data_dir: Path, single_run: Path,
                                     tmp_path: Path) -> None:
    """Same global batch: the losses and the parameters after 3 steps agree to fp32 rounding."""
    flags = ["--parallel", mode.split("-")[0]]
    if mode.endswith("-ac"):
        flags.append("--activation-checkpointing")
    out = tmp_path / "two"
    proc = run_torchrun(*ARGS, *flags, "--data-dir", str(data_dir), "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "x 2 | parallel " + flags[1] in proc.stdout  # the banner: 2 ranks, this mode
    assert proc.stdout.count("saved checkpoint") == 1  # rank 0 alone writes

    one, two = read_metrics(single_run, "train"), read_metrics(out, "train")
    assert [r["step"] for r in two] == [0, 1, 2]
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], rel=1e-5)
    assert [r["grad_norm"] for r in two] == pytest.approx([r["grad_norm"] for r in one], rel=1e-3)
    ref, got = final_params(single_run), final_params(out)
    assert got.keys() == ref.keys()  # full, unprefixed names in every mode
    for name in ref:
        # Adam divides by sqrt(v): where a gradient is tiny, fp32 rounding differences of
        # the reduction order are magnified up to a fraction of the lr (3e-3) in a few
        # elements. A real error (a missed all-reduce, a wrong batch) moves most elements
        # by about the lr, so bound the worst element loosely and the mean tightly.
        diff = (got[name] - ref[name]).abs()
        assert diff.max() < 5e-5, (name, diff.max())
        assert diff.mean() < 2e-6, (name, diff.mean())
    ckpt = load(out / "ckpt_000003.pt")
    assert len(ckpt["loader"]) == 2 and [s["rank"] for s in ckpt["loader"]] == [0, 1]
    assert len(ckpt["rng"]) == 2


def test_ranks_get_disjoint_batches(data_dir: Path) -> None:
    """The loaders the trainer builds for rank 0 and 1 of 2 never serve the same tokens."""
    seen = []
    for rank in (0, 1):
        loader = ShardLoader(data_dir, "train", 4, 32, rank=rank, world_size=2)
        xs = [loader.next_batch()[0] for _ in range(loader.steps_per_pass)]
        seen.append({tuple(row.tolist()) for x in xs for row in x})
    assert seen[0] and seen[1] and not (seen[0] & seen[1])


@pytest.mark.slow
def test_a_failing_rank_ends_the_whole_job_quickly(tmp_path: Path) -> None:
    """Rank 1's first batch holds a token id beyond the vocabulary: rank 1 stops with a clear
    error, and the job (rank 0 waiting in a collective) ends non-zero within seconds."""
    data = tmp_path / "data"
    data.mkdir()
    tokens = np.random.default_rng(0).integers(0, 50257, 10_000)
    tokens[128 + 20] = 60_000  # window 1 (tokens 128..256) is rank 1's first
    write_shard(data / "train_000000.bin", tokens)
    start = time.monotonic()
    proc = run_torchrun(*ARGS, "--data-dir", str(data), "--out-dir", str(tmp_path / "run"),
                        timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "[rank 1] error:" in proc.stderr and "train_000000.bin" in proc.stderr
    assert "token id 60000" in proc.stderr
    assert elapsed < 60, f"the job took {elapsed:.0f}s to end"


@pytest.mark.slow
def test_fsdp_checkpoint_resumes_in_a_single_process(data_dir: Path, tmp_path: Path) -> None:
    """Checkpoints hold full, name-keyed state: one written under FSDP on 2 ranks continues
    as plain single-process training."""
    out = tmp_path / "run"
    args = [*ARGS[:-1], "6", "--data-dir", str(data_dir), "--out-dir", str(out)]
    proc = run_torchrun(*args, "--parallel", "fsdp", "--stop-at-step", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_cli(*args, "--resume", "auto")
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" in proc.stdout and "ckpt_000003.pt" in proc.stdout
    assert [r["step"] for r in read_metrics(out, "train")] == list(range(6))
    assert load(out / "ckpt_000006.pt")["step"] == 6
