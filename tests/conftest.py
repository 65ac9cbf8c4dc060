"""Shared fixtures: the offline tokenizer cache, the tiny-shakespeare corpus, small shards."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from helpers import QUIET, SHAKESPEARE, SHARED_DATA, TINY, run_cli, write_random_shards

TIKTOKEN_CACHE = SHARED_DATA / "tiktoken_cache"
_HOME_ROOT = pytest.StashKey[Path]()
_HOME_BEFORE = pytest.StashKey[set]()


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


# Every place the package and the libraries it drives (datasets, lm-eval, matplotlib, W&B,
# Triton) would write under the user's home, pointed into one temporary folder for the
# whole test run: tests write into temporary folders only, never into ~/.cache or ~/.config.
# Set before any of those libraries is imported (datasets reads its cache path at import),
# and inherited by every subprocess a test starts.
HOME_WRITES = {
    "XDG_CACHE_HOME": "cache",        # gpt.hellaswag's downloads, and most libraries'
    "XDG_CONFIG_HOME": "config",
    "XDG_DATA_HOME": "data",
    "HF_HOME": "huggingface",
    "HF_DATASETS_CACHE": "huggingface/datasets",  # lm-eval's tasks, read through datasets
    "MPLCONFIGDIR": "matplotlib",
    "TRITON_CACHE_DIR": "triton",
    "WANDB_DIR": "wandb",
    "WANDB_CONFIG_DIR": "wandb/config",
    "WANDB_CACHE_DIR": "wandb/cache",
    "WANDB_DATA_DIR": "wandb/data",
}
# What those libraries would create in the home when the variables above were missed: the
# run fails at its end if one of these appears there during it.
HOME_PATHS = [".cache/huggingface", ".cache/gpt2-trainer", ".cache/matplotlib",
              ".config/matplotlib", ".config/wandb", ".cache/wandb", ".triton"]


def _home_paths() -> set[str]:
    home = Path.home()
    return {p for p in HOME_PATHS if (home / p).exists()}


def pytest_configure(config: pytest.Config) -> None:
    # tiktoken downloads its BPE files unless they are cached; offline machines (CI
    # here) have them under shared/data. Subprocesses inherit this too.
    if TIKTOKEN_CACHE.is_dir() and "TIKTOKEN_CACHE_DIR" not in os.environ:
        os.environ["TIKTOKEN_CACHE_DIR"] = str(TIKTOKEN_CACHE)
    root = Path(tempfile.mkdtemp(prefix="gpt2-trainer-tests-home-"))
    config.stash[_HOME_ROOT] = root
    config.stash[_HOME_BEFORE] = _home_paths()
    for name, sub in HOME_WRITES.items():
        (root / sub).mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(root / sub)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    created = _home_paths() - session.config.stash.get(_HOME_BEFORE, set())
    if created:
        print(f"\nthe tests wrote into the home folder: {sorted(created)} under {Path.home()}; "
              "point that library's cache at the temporary folder in tests/conftest.py",
              file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    root = config.stash.get(_HOME_ROOT, None)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


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
