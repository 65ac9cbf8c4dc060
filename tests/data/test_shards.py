"""Shard folders (gpt/data/shards.py): what is found there, and every way a shard can be
wrong (unreadable, a folder or a dangling symlink named like one, cut short under the
loader, a token id out of range either way, in every shard format), each one line naming
the file; and a folder fineweb.py is still writing, refused unless allowed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from gpt.core.cli import parse_args
from gpt.core.fileio import FolderLock
from gpt.data.loader import ShardLoader
from gpt.data.shards import DataError, ShardError, check_not_being_written, find_shards
from gpt.plan.preflight import preflight
from gpt.runtime.world import Runtime
from gpt.train.build import build_loader

from helpers import TINY_RUN, one_line_error, run_cli, write_random_shards


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
    proc = run_cli(*TINY_RUN, "--max-steps", "1", "--data-dir", str(data), "--out-dir", str(tmp_path / "r"))
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


def npy_shards(folder: Path, bad_at: int, bad_id: int, dtype: str = "int32") -> Path:
    """build-nanogpt style .npy shards of signed ids with one bad id in the train shard."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    train = rng.integers(0, 30_000, 6_000).astype(dtype)  # fits int16
    train[bad_at] = bad_id
    np.save(folder / "edu_train_000000.npy", train)
    np.save(folder / "edu_val_000000.npy", rng.integers(0, 30_000, 3_000).astype(dtype))
    return folder


@pytest.mark.parametrize("bad_id,words", [(-1, "token id -1 at index 40 is negative"),
                                          (60_000, "token id 60000 at index 40 is >= --vocab-size")])
def test_an_id_out_of_range_is_named_by_every_loader(bad_id: int, words: str,
                                                     tmp_path: Path) -> None:
    data = npy_shards(tmp_path, bad_at=40, bad_id=bad_id)
    loader = ShardLoader(data, "train", 2, 32, max_token=50303)
    with pytest.raises(ShardError, match=f"edu_train_000000.npy: {words}"):
        loader.next_batch()
    with pytest.raises(ShardError, match=f"edu_train_000000.npy: {words}"):  # --check-tokens
        ShardLoader(data, "train", 2, 32, vocab_size=50304)
    if bad_id < 0:  # without a vocabulary to check against, a negative id is still wrong
        with pytest.raises(ShardError, match=words):
            ShardLoader(data, "train", 2, 32).next_batch()


def test_a_negative_id_stops_training_in_one_line(tmp_path: Path) -> None:
    data = npy_shards(tmp_path / "d", bad_at=300, bad_id=-5, dtype="int16")
    proc = run_cli(*TINY_RUN, "--max-steps", "2", "--data-dir", str(data), "--out-dir",
                   str(tmp_path / "run"))
    assert "edu_train_000000.npy: token id -5 at index 300 is negative" in one_line_error(proc)


def half_written(folder: Path) -> Path:
    """A shard folder as fineweb.py leaves it part-way: shards, and metadata.json saying
    it is not complete."""
    (folder / "d").mkdir()
    data = write_random_shards(folder / "d", seed=4, train=(9_000,), val=(3_000,))
    meta = {"complete": False, "shards": [{"name": "val_000000.bin"}, {"name": "train_000000.bin"}]}
    (data / "metadata.json").write_text(json.dumps(meta))
    return data


@pytest.mark.slow
def test_training_on_a_folder_fineweb_is_writing_is_refused(tmp_path: Path) -> None:
    data = half_written(tmp_path)
    lock = FolderLock(data, "fineweb.py run").acquire()  # this test process is the writer
    try:
        proc = run_cli(*TINY_RUN, "--max-steps", "1", "--data-dir", str(data), "--out-dir",
                       str(tmp_path / "run"), process=True)  # a trainer beside the writer
        line = one_line_error(proc)
        assert f"--data-dir {data} is still being written, by pid {os.getpid()}" in line
        assert "(metadata.json: 2 shards so far)" in line and "--allow-incomplete-data" in line
        assert not (tmp_path / "run").exists()
        note = check_not_being_written(data, allow=True)
        assert note and "still being written" in note and "training on the shards there now" in note
    finally:
        lock.release()
    note = check_not_being_written(data, allow=False)  # stopped, nobody writes: a warning
    assert "metadata.json says fineweb.py stopped before it finished (2 shards)" in note
    (data / "metadata.json").write_text(json.dumps({"complete": True, "shards": []}))
    assert check_not_being_written(data, allow=False) is None


def test_a_lock_holders_text_reaches_a_data_folder_warning_escaped(tmp_path: Path) -> None:
    from gpt.data.shards import check_not_being_written

    folder = tmp_path / "shards"
    lock = FolderLock(folder, "fineweb.py run").acquire()
    try:
        os.pwrite(lock._fd, b"pid 1\n\x1b]0;title\x07", 0)
        note = check_not_being_written(folder, allow=True)
    finally:
        lock.release()
    assert note is not None and "by pid 1\\n\\x1b]0;title\\x07" in note and "\n" not in note


def test_allow_incomplete_data_trains_with_a_warning(tmp_path: Path) -> None:
    data = half_written(tmp_path)
    cfg = parse_args([*TINY_RUN, "--allow-incomplete-data", "--data-dir", str(data)])
    lock = FolderLock(data, "fineweb.py run").acquire()
    try:
        plan = preflight(cfg).settled()  # the trainer's checks, with the warning it prints
        train_loader = build_loader(cfg.data, Runtime(device=torch.device("cpu")),
                                    seed=cfg.train.seed, vocab_size=cfg.model.vocab_size)
    finally:
        lock.release()
    assert train_loader.num_tokens == 9_000
    assert [w for w in plan.warnings if w.startswith(f"--data-dir {data} is still being written")
            and w.endswith("training on the shards there now (--allow-incomplete-data)")]
