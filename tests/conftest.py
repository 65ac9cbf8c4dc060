"""Shared fixtures: the offline tokenizer cache, the tiny-shakespeare corpus, small shards."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import QUIET, SHAKESPEARE, SHARED_DATA, TINY, run_cli, write_random_shards

TIKTOKEN_CACHE = SHARED_DATA / "tiktoken_cache"


CUDA_SKIP = ("needs an NVIDIA GPU: torch.cuda.is_available() is False here; run "
             "`python -m pytest -m cuda` on a CUDA machine")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked cuda are skipped, with the reason, where there is no GPU."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=CUDA_SKIP)
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    # tiktoken downloads its BPE files unless they are cached; offline machines (CI
    # here) have them under shared/data. Subprocesses inherit this too.
    if TIKTOKEN_CACHE.is_dir() and "TIKTOKEN_CACHE_DIR" not in os.environ:
        os.environ["TIKTOKEN_CACHE_DIR"] = str(TIKTOKEN_CACHE)


@pytest.fixture(autouse=True)
def restore_global_flags():
    """Put torch's process-wide numerics switches back after every test: a test that turns
    TF32 on (the trainer does, on CUDA) must not loosen later exact comparisons."""
    import torch

    cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (cuda.allow_tf32, cudnn.allow_tf32, cudnn.benchmark,
             torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled())
    yield
    cuda.allow_tf32, cudnn.allow_tf32, cudnn.benchmark = saved[:3]
    torch.set_float32_matmul_precision(saved[3])
    torch.use_deterministic_algorithms(saved[4])


@pytest.fixture(scope="session")
def enc():
    """The GPT-2 tokenizer (tiktoken's cache, else the files the package ships)."""
    from gpt.tokenizer import gpt2_tokenizer

    return gpt2_tokenizer()


@pytest.fixture(scope="session")
def shakespeare_tokens(request: pytest.FixtureRequest) -> np.ndarray:
    """GPT-2 tokens of tiny shakespeare (uint16), from the corpus the package ships."""
    enc = request.getfixturevalue("enc")
    ids = enc.encode_ordinary(SHAKESPEARE.read_text(encoding="utf-8"))
    return np.asarray([enc.eot_token, *ids], dtype=np.uint16)


@pytest.fixture(scope="session")
def shakespeare_dir(tmp_path_factory: pytest.TempPathFactory, shakespeare_tokens: np.ndarray) -> Path:
    """A data folder with tiny shakespeare: val = first 20k tokens, train = the rest in 2 shards."""
    from gpt.shards import write_shard

    out = tmp_path_factory.mktemp("shakespeare")
    val, train = shakespeare_tokens[:20_000], shakespeare_tokens[20_000:]
    half = len(train) // 2
    write_shard(out / "val_000000.bin", val)
    write_shard(out / "train_000000.bin", train[:half])
    write_shard(out / "train_000001.bin", train[half:])
    return out


@pytest.fixture(scope="session")
def four_step_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random shards for four_step_run (and for resuming copies of it)."""
    return write_random_shards(tmp_path_factory.mktemp("four_data"), seed=5, train=(9_000, 9_000),
                               val=(3_000,))


@pytest.fixture(scope="session")
def four_step_run(four_step_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run with ckpt_000002.pt and ckpt_000004.pt, trained once per session;
    tests that write into it take run_copy."""
    out = tmp_path_factory.mktemp("four") / "run"
    proc = run_cli(*TINY, *QUIET, "--total-batch-tokens", "512", "--max-steps", "4",
                   "--checkpoint-every", "2", "--data-dir", str(four_step_data), "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture()
def run_copy(four_step_run: Path, tmp_path: Path) -> Path:
    """A private copy of four_step_run."""
    return Path(shutil.copytree(four_step_run, tmp_path / "run"))


@pytest.fixture()
def random_data_dir(tmp_path: Path) -> Path:
    """Synthetic shards of random token ids (no tokenizer needed)."""
    return write_random_shards(tmp_path, seed=0, train=(30_000,), val=(5_000,))
