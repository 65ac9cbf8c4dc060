"""Shard folders (gpt/data/shards.py): what is found there, and every way a shard can be
wrong (unreadable, a folder or a dangling symlink named like one, cut short under the
loader), each one line naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpt.data.loader import ShardLoader
from gpt.data.shards import DataError, ShardError, find_shards

from helpers import QUIET, TINY, one_line_error, run_cli, write_random_shards

ARGS = [*TINY, *QUIET, "--total-batch-tokens", "512"]


def test_unreadable_data_folder(tmp_path: Path, monkeypatch) -> None:
    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "iterdir", denied)
    with pytest.raises(DataError, match="cannot list the data folder \\(Permission denied\\)"):
        find_shards(tmp_path, "train")


def test_dangling_symlink_named_like_a_shard(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    data = write_random_shards(tmp_path / "d", seed=1, train=(5_000,))
    (data / "train_000001.bin").symlink_to(tmp_path / "gone.bin")
    proc = run_cli(*ARGS, "--max-steps", "1", "--data-dir", str(data), "--out-dir", str(tmp_path / "r"))
    assert "train_000001.bin: a symlink to" in one_line_error(proc)
    assert not (tmp_path / "r").exists()  # a run that fails at start leaves no folder


def test_a_folder_named_like_a_shard_is_an_error(tmp_path: Path) -> None:
    data = write_random_shards(tmp_path, seed=1, train=(5_000,))
    (data / "train_000001.bin").mkdir()
    with pytest.raises(ShardError, match="train_000001.bin: named like a shard but not a file"):
        find_shards(data, "train")
    (data / "train_notes").mkdir()  # any other folder is not the data's business
    (data / "train_000001.bin").rmdir()
    assert [p.name for p in find_shards(data, "train")] == ["train_000000.bin"]


def test_a_shard_truncated_under_the_loader_is_a_named_error(tmp_path: Path) -> None:
    data = write_random_shards(tmp_path, seed=2, train=(4_000,))
    loader = ShardLoader(data, "train", 2, 32)
    loader.next_batch()
    with open(data / "train_000000.bin", "r+b") as fh:
        fh.truncate(2048)
    with pytest.raises(ShardError, match="train_000000.bin: holds fewer tokens than its header said"):
        for _ in range(loader.steps_per_pass):
            loader.next_batch()
