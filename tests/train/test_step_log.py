"""The finiteness check of the weights and optimizer state (gpt/train/step_log.py): a run
whose update turned a weight into NaN stops at the next check, naming the last good
checkpoint, and no checkpoint is ever written from the poisoned state (the save itself
refuses: gpt/checkpoint/checkpointer.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpt.checkpoint import files as checkpoint
from gpt.checkpoint.files import load
from gpt.core.cli import parse_args
from gpt.engine.step import TrainingDiverged
from gpt.train.trainer import train

from helpers import TINY_RUN


def all_finite(path: Path) -> bool:
    ckpt = load(path)
    tensors = list(ckpt["model"].values()) + [v for s in ckpt["optimizer"]["state"].values()
                                              for v in s.values() if torch.is_tensor(v)]
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def poison_after(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """From optimizer step `step` on, the update turns one weight into NaN, as an update
    from a finite gradient at an absurd learning rate would."""
    import gpt.train.loop as train_mod

    real = train_mod.optimizer_step
    count = {"n": 0}

    def overflowing(optimizer, scaler, lr, norm, nvtx=False, settings=None):
        found_inf = real(optimizer, scaler, lr, norm, nvtx, settings)
        count["n"] += 1
        if count["n"] > step:
            with torch.no_grad():
                optimizer.param_groups[0]["params"][0].view(-1)[0] = float("nan")
        return found_inf

    monkeypatch.setattr(train_mod, "optimizer_step", overflowing)


@pytest.mark.slow
def test_poisoned_weights_stop_the_run_at_the_next_check(monkeypatch, data_dir: Path,
                                                         tmp_path: Path) -> None:
    out = tmp_path / "run"
    poison_after(monkeypatch, 3)
    cfg = parse_args([*TINY_RUN, "--max-steps", "8", "--checkpoint-every", "2",
                      "--finite-check-every", "1", "--data-dir", str(data_dir), "--out-dir", str(out)])
    with pytest.raises(TrainingDiverged, match=r"after step 3.*last good checkpoint is .*ckpt_000002\.pt"):
        train(cfg)
    saved = [s for s, _ in checkpoint.list_checkpoints(out)]
    assert saved == [2]  # nothing written from the poisoned state
    assert all_finite(out / "ckpt_000002.pt")


def test_the_finiteness_check_runs_between_log_steps_too(monkeypatch, data_dir: Path,
                                                         tmp_path: Path) -> None:
    out = tmp_path / "run"
    poison_after(monkeypatch, 3)
    cfg = parse_args([*TINY_RUN, "--max-steps", "8", "--checkpoint-every", "2", "--log-every", "100",
                      "--finite-check-every", "1", "--data-dir", str(data_dir), "--out-dir", str(out)])
    with pytest.raises(TrainingDiverged, match=r"after step 3.*ckpt_000002\.pt"):
        train(cfg)
    assert [s for s, _ in checkpoint.list_checkpoints(out)] == [2]


@pytest.mark.slow
def test_a_checkpoint_is_never_written_from_poisoned_state(monkeypatch, data_dir: Path,
                                                            tmp_path: Path) -> None:
    """Log steps far apart: the save itself must refuse, and name a good checkpoint. The
    update just before the save is the poisoned one, so no loss has seen it yet."""
    out = tmp_path / "run"
    poison_after(monkeypatch, 3)
    cfg = parse_args([*TINY_RUN, "--max-steps", "8", "--checkpoint-every", "2", "--log-every", "100",
                      "--data-dir", str(data_dir), "--out-dir", str(out)])
    with pytest.raises(TrainingDiverged, match=r"at step 4: no checkpoint of them is written.*"
                                               r"ckpt_000002\.pt"):
        train(cfg)
    assert [s for s, _ in checkpoint.list_checkpoints(out)] == [2]
    assert all_finite(out / "ckpt_000002.pt")
