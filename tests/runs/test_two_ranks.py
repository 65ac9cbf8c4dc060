"""Distributed training on CPU: 2 gloo ranks under torchrun against one process."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import REPO, TINY_RUN, assert_trains_alike, read_metrics, run_cli, run_torchrun
from gpt.checkpoint.files import load
from gpt.data.loader import ShardLoader
from gpt.data.shards import write_shard

# Global batch 512 tokens = 4 micro-batches of 4 x 32: one process accumulates 4, two
# ranks 2 each. 3 steps, fp32 on CPU.
ARGS = [*TINY_RUN, "--max-steps", "3"]


@pytest.fixture(scope="module")
def single_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("single")
    proc = run_cli(*ARGS, "--data-dir", str(data_dir), "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def final_params(out: Path) -> dict[str, torch.Tensor]:
    return load(out / "ckpt_000003.pt")["model"]


@pytest.mark.numerics
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "zero1", "fsdp", "fsdp-ac"])
def test_two_ranks_match_one_process(mode: str, data_dir: Path, single_run: Path,
                                     tmp_path: Path) -> None:
    """Same global batch: the losses, gradient norms and the parameters after 3 steps agree
    to fp32 rounding in another summation order."""
    flags = ["--parallel", mode.split("-")[0]]
    if mode.endswith("-ac"):
        flags.append("--activation-checkpointing")
    out = tmp_path / "two"
    proc = run_torchrun(*ARGS, *flags, "--data-dir", str(data_dir), "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "x 2 | parallel " + flags[1] in proc.stdout  # the banner: 2 ranks, this mode
    assert proc.stdout.count("saved checkpoint") == 1  # rank 0 alone writes

    assert [r["step"] for r in read_metrics(out, "train")] == [0, 1, 2]
    assert final_params(out).keys() == final_params(single_run).keys()  # full, unprefixed names
    # Losses, gradient norms and weights to what another summation order (2 ranks' halves
    # all-reduced, against 4 micro-batches in one process; another CPU's kernels) can make
    # of fp32 rounding, AdamW's amplification included: helpers.assert_trains_alike.
    assert_trains_alike(single_run, out, 3)
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
    """Rank 1's batch in the second step holds a token id beyond the vocabulary: rank 1 stops
    with a clear error, and the job (rank 0 waiting in a collective) ends non-zero within
    seconds; rank 0 says one line (or nothing, if torchrun's SIGTERM comes first), not
    torch's traceback. The id is in the second shard: every rank's preflight reads the
    first one's start (check_first_tokens) and would refuse it on both ranks alike."""
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    write_shard(data / "train_000000.bin", rng.integers(0, 50257, 600))  # step 1's 512, +1
    tokens = rng.integers(0, 50257, 10_000)
    tokens[128 + 20] = 60_000  # window 1 (tokens 128..256) is rank 1's first in a shard
    write_shard(data / "train_000001.bin", tokens)
    start = time.monotonic()
    proc = run_torchrun(*ARGS, "--data-dir", str(data), "--out-dir", str(tmp_path / "run"),
                        timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "[rank 1] error:" in proc.stderr and "train_000001.bin" in proc.stderr
    assert "token id 60000" in proc.stderr
    assert elapsed < 60, f"the job took {elapsed:.0f}s to end"
    lines = proc.stderr.splitlines()
    assert len([line for line in lines if line.startswith("[rank 1]")]) == 1
    rank0 = [line for line in lines if line.startswith(("[rank 0]", "[rank0]"))]
    assert len(rank0) <= 1 and all("error: a collective failed" in line for line in rank0), rank0


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


LAUNCH_DIR = REPO / "launch"
LAUNCH = sorted(p for p in LAUNCH_DIR.iterdir() if p.suffix in (".sh", ".sbatch"))


@pytest.mark.parametrize("script", LAUNCH, ids=lambda p: p.name)
def test_launch_scripts_are_valid_bash(script: Path) -> None:
    import subprocess

    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert os.access(script, os.X_OK), f"{script} is not executable"


@pytest.mark.slow
def test_single_node_launcher_runs_two_cpu_ranks(data_dir: Path, tmp_path: Path) -> None:
    import subprocess

    out = tmp_path / "run"
    # This interpreter, also where its environment is not active (a venv's python run by path).
    env = dict(os.environ, NGPUS="2", OMP_NUM_THREADS="1", PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", str(LAUNCH_DIR / "single_node.sh"), *ARGS[:-1], "1",
         "--data-dir", str(data_dir), "--out-dir", str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "x 2 | parallel ddp" in proc.stdout
    assert load(out / "ckpt_000001.pt")["step"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("what,extra", [("allreduce", ["--sizes-mb", "0.1", "1"]),
                                        ("ddp", ["--seq-len", "32"])])
def test_comm_bench_under_torchrun(what: str, extra: list[str], tmp_path: Path) -> None:
    import json

    out = tmp_path / "r.json"
    proc = run_torchrun("comm", what, *extra, "--warmup", "1", "--iters", "3", "--out", str(out),
                        target=("-m", "gpt.bench"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["backend"] == "gloo" and result["world_size"] == 2 and result["torch"]
    if what == "allreduce":
        rows = result["allreduce"]
        assert [r["size_mb"] for r in rows] == [0.1, 1]
        for r in rows:
            assert r["n"] == 3 and 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"]
            assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])  # 2(n-1)/n = 1 for n=2
        assert "busbw GB/s" in proc.stdout
    else:
        d = result["ddp"]
        assert d["compute_fwd_bwd"]["median_ms"] > 0 and d["grad_allreduce"]["median_ms"] > 0
        assert d["exposed_comm_ms"] >= 0 and "exposed communication" in proc.stdout


# ---------------------------------------------------------------------------------------
# torchrun restarts: keep one attempt's rendezvous keys apart from the last one's

AGENT_ENV = {"TORCHELASTIC_USE_AGENT_STORE": "True", "GROUP_WORLD_SIZE": "1",
             "MASTER_ADDR": "localhost", "MASTER_PORT": "29500",
             "TORCHELASTIC_MAX_RESTARTS": "3"}


def test_each_restart_on_one_node_rendezvous_under_its_own_prefix() -> None:
    from gpt.runtime.launch import restart_store_prefix

    first = restart_store_prefix({**AGENT_ENV, "TORCHELASTIC_RESTART_COUNT": "0"})
    second = restart_store_prefix({**AGENT_ENV, "TORCHELASTIC_RESTART_COUNT": "1"})
    assert first and second and first != second
    # Not torchrun's shared store (opted out, or a plain env:// launch): torch's own path.
    assert restart_store_prefix({**AGENT_ENV, "TORCHELASTIC_USE_AGENT_STORE": "False"}) is None
    assert restart_store_prefix({"MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}) is None
    # Several nodes count restarts apart, so a prefix from the count could split the world.
    assert restart_store_prefix({**AGENT_ENV, "GROUP_WORLD_SIZE": "2"}) is None


def test_multi_node_restarts_on_a_shared_store_are_warned_about() -> None:
    from gpt.runtime.launch import restart_store_warning

    warning = restart_store_warning({**AGENT_ENV, "GROUP_WORLD_SIZE": "2"})
    assert warning and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in warning
    assert restart_store_warning(AGENT_ENV) is None  # one node: handled by the prefix
    assert restart_store_warning({**AGENT_ENV, "GROUP_WORLD_SIZE": "2",
                                  "TORCHELASTIC_MAX_RESTARTS": "0"}) is None
    assert restart_store_warning({**AGENT_ENV, "GROUP_WORLD_SIZE": "2",
                                  "TORCHELASTIC_USE_AGENT_STORE": "False"}) is None
