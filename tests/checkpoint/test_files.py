"""Checkpoint files (gpt/checkpoint/files.py): each verified on load (a flipped byte fails
its CRC check, and --resume auto steps back to the newest good one), the newest chosen by
the step stored inside, not by its name, rotation that keeps the one just verified, and a
file named like a checkpoint that is none, skipped or refused by every reader."""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from gpt.checkpoint import files as checkpoint
from gpt.checkpoint.files import CheckpointError, load
from gpt.checkpoint.model_load import PretrainedError, read_checkpoint

from helpers import TINY_RUN, one_line_error, run_cli


def flip_tensor_bytes(path: Path) -> None:
    """Flip bytes inside the largest tensor record of a checkpoint (not its zip headers)."""
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    with open(path, "r+b") as fh:
        fh.seek(info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + 64)
        data = fh.read(8)
        fh.seek(-8, os.SEEK_CUR)
        fh.write(bytes(b ^ 0xFF for b in data))


@pytest.mark.slow
def test_flipped_bytes_are_caught_on_load(run_copy: Path, data_dir: Path) -> None:
    flip_tensor_bytes(run_copy / "ckpt_000004.pt")
    with pytest.raises(CheckpointError, match="ckpt_000004.pt: damaged: record .* fails its CRC check"):
        load(run_copy / "ckpt_000004.pt")
    proc = run_cli(*TINY_RUN, "--max-steps", "6", "--data-dir", str(data_dir), "--out-dir", str(run_copy),
                   "--resume", str(run_copy / "ckpt_000004.pt"))
    assert "fails its CRC check" in one_line_error(proc)
    proc = run_cli(*TINY_RUN, "--max-steps", "5", "--data-dir", str(data_dir), "--out-dir", str(run_copy),
                   "--resume", "auto")
    assert proc.returncode == 0, proc.stderr
    assert "skipping damaged checkpoint" in proc.stderr and "CRC" in proc.stderr
    assert "resumed from" in proc.stdout and "ckpt_000002.pt at step 2" in proc.stdout


@pytest.mark.slow
def test_rotation_keeps_the_checkpoint_just_verified(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli(*TINY_RUN, "--max-steps", "4", "--checkpoint-every", "1", "--keep-checkpoints", "1",
                   "--data-dir", str(data_dir), "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    assert [s for s, _ in checkpoint.list_checkpoints(out)] == [4]
    checkpoint.verify(out / "ckpt_000004.pt")


def test_newest_is_chosen_by_the_step_stored_inside(run_copy: Path) -> None:
    shutil.copy(run_copy / "ckpt_000002.pt", run_copy / "ckpt_000099.pt")  # a newer name, step 2
    (run_copy / "ckpt_000098.pt").mkdir()  # named like a checkpoint, not a file
    (run_copy / "ckpt_000097.pt").symlink_to(run_copy / "ckpt_000002.pt")
    path, ckpt, _ = checkpoint.find_latest(run_copy)
    assert path == run_copy / "ckpt_000004.pt" and ckpt["step"] == 4
    names = [p.name for _, p in checkpoint.list_checkpoints(run_copy)]
    assert "ckpt_000098.pt" not in names and "ckpt_000097.pt" not in names
    checkpoint.rotate(run_copy, 1, set())
    assert (run_copy / "ckpt_000098.pt").is_dir() and (run_copy / "ckpt_000097.pt").is_symlink()


FOREIGN = {
    "dict without the keys": {"weights": torch.zeros(2)},
    "list": [1, 2, 3],
    "tensor": torch.zeros(3),
}


@pytest.mark.parametrize("kind", list(FOREIGN))
def test_a_foreign_file_named_like_a_checkpoint_is_skipped_or_refused(kind: str,
                                                                      run_copy: Path) -> None:
    foreign = run_copy / "ckpt_000009.pt"
    torch.save(FOREIGN[kind], foreign)
    path, ckpt, notes = checkpoint.find_latest(run_copy)  # --resume auto and last_good
    assert path == run_copy / "ckpt_000004.pt" and ckpt["step"] == 4
    assert any("ckpt_000009.pt" in note for note in notes)
    with pytest.raises(CheckpointError, match="ckpt_000009.pt: "):  # --resume PATH
        checkpoint.usable(foreign)
    with pytest.raises(PretrainedError, match="ckpt_000009.pt: incomplete checkpoint"):
        read_checkpoint(foreign)  # generate, evaluate and export
    checkpoint.rotate(run_copy, 1, set())  # a running job's rotation
    assert foreign.exists() and not (run_copy / "ckpt_000002.pt").exists()
