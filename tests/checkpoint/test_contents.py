"""A checkpoint is vetted before a resume uses it: any entry a resume reads with the wrong
type or shape makes the file unusable, so `--resume PATH` stops in one line naming the
file and the entry, and `--resume auto` skips it, with a warning, for the newest one that
is usable; contents that contradict themselves (a step beyond what its data position or
its name allows) never win --resume auto. Evaluating, sampling and exporting check the
entries they read the same way."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import TINY_RUN, one_line_error, run_cli
from gpt.checkpoint import files as checkpoint
from gpt.checkpoint.files import CheckpointError
from gpt.checkpoint.model_load import PretrainedError, read_checkpoint
from gpt.core.config import Config
from gpt.core.config_io import to_dict


def first_state(ckpt: dict[str, Any]) -> dict[str, Any]:
    return next(iter(ckpt["optimizer"]["state"].values()))


def rename_first_state(ckpt: dict[str, Any]) -> None:
    state = ckpt["optimizer"]["state"]
    state["transformer.bogus.weight"] = state.pop(next(iter(state)))


# entry -> (how to spoil it, words the error must hold)
SPOILED: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "best_val_loss": (lambda c: c.update(best_val_loss="abc"), "'best_val_loss' is 'abc'"),
    "val_loss": (lambda c: c.update(val_loss=float("nan")), "'val_loss' is nan"),
    "skipped_steps": (lambda c: c.update(skipped_steps="x"), "'skipped_steps' is 'x'"),
    "best_checkpoint": (lambda c: c.update(best_checkpoint=5), "'best_checkpoint' is 5"),
    "ended_at": (lambda c: c.update(ended_at="done"), "'ended_at' is 'done'"),
    "scaler": (lambda c: c.update(scaler={"scale": "big"}), "'scaler' is not a GradScaler state"),
    "rng": (lambda c: c.update(rng=[{"python": 5}]), "RNG state cannot be restored"),
    "loader": (lambda c: c.update(loader=[{"version": 1}]), "loader state is missing fields"),
    "loader step": (lambda c: c["loader"][0].update(step=-3), "saved step must be >= 0"),
    "param_groups": (lambda c: c["optimizer"].update(param_groups="nope"),
                     "not an optimizer state dict"),
    "lr": (lambda c: c["optimizer"]["param_groups"][0].update(lr="fast"), "lr is 'fast'"),
    "state step": (lambda c: first_state(c).update(step="seven"), "step count of"),
    "state name": (rename_first_state, "transformer.bogus.weight"),
    "exp_avg shape": (lambda c: first_state(c).update(exp_avg=torch.zeros(3)),
                      "exp_avg is (3,), not a tensor of the parameter's shape"),
    "huge state": (lambda c: first_state(c)["exp_avg_sq"].fill_(3e19), "beyond 1e19"),
}


def spoil(path: Path, how: Callable[[dict[str, Any]], None], to: Path | None = None) -> None:
    ckpt = torch.load(path, weights_only=True)
    how(ckpt)
    torch.save(ckpt, to or path)


@pytest.mark.slow
@pytest.mark.parametrize("entry", list(SPOILED))
def test_a_spoiled_entry_makes_the_checkpoint_unusable(entry: str, run_copy: Path) -> None:
    how, words = SPOILED[entry]
    spoil(run_copy / "ckpt_000004.pt", how)
    with pytest.raises(CheckpointError, match="ckpt_000004.pt: ") as caught:
        checkpoint.usable(run_copy / "ckpt_000004.pt")
    assert words in str(caught.value)
    path, ckpt, notes = checkpoint.find_latest(run_copy)
    assert path == run_copy / "ckpt_000002.pt" and ckpt["step"] == 2  # the older good one
    assert len(notes) == 1 and "skipping damaged checkpoint" in notes[0] and words in notes[0]


@pytest.mark.slow
def test_resume_auto_falls_back_from_wrong_shaped_optimizer_state(run_copy: Path,
                                                                  data_dir: Path) -> None:
    """The file that once resumed and then "diverged", calling itself the last good one."""
    spoil(run_copy / "ckpt_000004.pt", SPOILED["exp_avg shape"][0])
    proc = run_cli(*TINY_RUN, "--max-steps", "5", "--data-dir", str(data_dir), "--out-dir", str(run_copy),
                   "--resume", str(run_copy / "ckpt_000004.pt"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1
    assert "ckpt_000004.pt: 'optimizer':" in proc.stderr
    proc = run_cli(*TINY_RUN, "--max-steps", "5", "--data-dir", str(data_dir), "--out-dir", str(run_copy),
                   "--resume", "auto")
    assert proc.returncode == 0, proc.stderr
    assert "warning: skipping damaged checkpoint" in proc.stderr and "at step 2" in proc.stdout


@pytest.mark.slow
def test_resume_auto_skips_a_checkpoint_with_non_finite_state(data_dir: Path, run_copy: Path) -> None:
    ckpt = torch.load(run_copy / "ckpt_000004.pt", weights_only=True)
    ckpt["model"]["lm_head.weight"][0, 0] = float("inf")  # written by an older version, say
    torch.save(ckpt, run_copy / "ckpt_000004.pt")
    proc = run_cli(*TINY_RUN, "--max-steps", "5", "--data-dir", str(data_dir), "--out-dir", str(run_copy),
                   "--resume", "auto")
    assert proc.returncode == 0, proc.stderr
    assert "ckpt_000004.pt: holds non-finite" in proc.stderr
    assert "at step 2" in proc.stdout


@pytest.mark.slow
def test_checkpoint_with_wrong_shapes(run_copy: Path, data_dir: Path) -> None:
    ckpt = torch.load(run_copy / "ckpt_000004.pt", weights_only=True)
    ckpt["model"]["transformer.wpe.weight"] = torch.zeros(3, 3)
    torch.save(ckpt, run_copy / "ckpt_000004.pt")
    proc = run_cli(*TINY_RUN, "--max-steps", "6", "--data-dir", str(data_dir), "--out-dir", str(run_copy),
                   "--resume", str(run_copy / "ckpt_000004.pt"))
    assert "do not fit the model" in one_line_error(proc)
    proc = run_cli(*TINY_RUN, "--max-steps", "5", "--data-dir", str(data_dir), "--out-dir", str(run_copy),
                   "--resume", "auto")
    assert proc.returncode == 0 and "at step 2" in proc.stdout, proc.stderr  # the older good one


def test_checkpoint_with_wrong_types(run_copy: Path, data_dir: Path) -> None:
    ckpt = torch.load(run_copy / "ckpt_000004.pt", weights_only=True)
    ckpt["step"], ckpt["loader"] = "four", {"not": "a list"}
    torch.save(ckpt, run_copy / "ckpt_000004.pt")
    proc = run_cli(*TINY_RUN, "--max-steps", "6", "--data-dir", str(data_dir), "--out-dir", str(run_copy),
                   "--resume", str(run_copy / "ckpt_000004.pt"))
    assert "ckpt_000004.pt" in one_line_error(proc)


def test_an_entry_check_contents_does_not_foresee_is_still_one_line(run_copy: Path) -> None:
    """Optimizer state keyed by a number beside the names: sorting the keys raised a
    TypeError out of the check."""
    spoil(run_copy / "ckpt_000004.pt", lambda c: c["optimizer"]["state"].update({0: {}}))
    with pytest.raises(CheckpointError, match="ckpt_000004.pt: not a checkpoint of this trainer"):
        checkpoint.usable(run_copy / "ckpt_000004.pt")
    path, _, notes = checkpoint.find_latest(run_copy)
    assert path == run_copy / "ckpt_000002.pt" and "TypeError" in notes[0]


def test_a_step_beyond_its_data_position_is_refused(run_copy: Path) -> None:
    spoil(run_copy / "ckpt_000002.pt", lambda c: c.update(step=1_000_000),
          to=run_copy / "ckpt_1000000.pt")  # name and step agree; the loader does not
    with pytest.raises(CheckpointError, match=r"ckpt_1000000.pt: holds step 1000000, but its "
                                              r"data position .* allows at most 8"):
        checkpoint.usable(run_copy / "ckpt_1000000.pt")
    path, _, notes = checkpoint.find_latest(run_copy)
    assert path == run_copy / "ckpt_000004.pt" and "contradict themselves" in notes[0]


def test_a_step_beyond_its_names_is_not_chosen_automatically(run_copy: Path) -> None:
    spoil(run_copy / "ckpt_000004.pt", lambda c: c.update(step=3),
          to=run_copy / "ckpt_000002.pt")  # within the loader's bound, beyond its name's step
    shutil.copy(run_copy / "ckpt_000004.pt", run_copy / "ckpt_000001.pt")
    shutil.copy(run_copy / "ckpt_000004.pt", run_copy / "ckpt_000009.pt")  # renamed later:
    path, _, notes = checkpoint.find_latest(run_copy)                    # ranks as step 4
    assert path in (run_copy / "ckpt_000004.pt", run_copy / "ckpt_000009.pt")
    assert sorted(n.split(": ")[1] for n in notes) == [str(run_copy / "ckpt_000001.pt"),
                                                       str(run_copy / "ckpt_000002.pt")]
    assert "holds step 4, beyond the 1 of its name" in " ".join(notes)
    for name in ("ckpt_000004.pt", "ckpt_000009.pt"):
        (run_copy / name).unlink()
    assert checkpoint.find_latest(run_copy)[0] is None  # --resume auto: no usable one
    assert checkpoint.usable(run_copy / "ckpt_000002.pt")["step"] == 3  # --resume PATH takes it


@pytest.mark.slow
def test_resume_auto_and_rotation_step_over_foreign_and_contradicting_files(
        run_copy: Path, data_dir: Path) -> None:
    """Once a KeyError traceback at start (or at a running job's next rotation), and a
    restart that always said "nothing to do"."""
    torch.save({"weights": torch.zeros(2)}, run_copy / "ckpt_000009.pt")
    spoil(run_copy / "ckpt_000002.pt", lambda c: c.update(step=1_000_000),
          to=run_copy / "ckpt_000003.pt")
    proc = run_cli(*TINY_RUN, "--max-steps", "6", "--checkpoint-every", "1", "--keep-checkpoints", "1",
                   "--data-dir", str(data_dir), "--out-dir", str(run_copy), "--resume", "auto")
    assert proc.returncode == 0, proc.stderr
    assert "nothing to do" not in proc.stdout and "ckpt_000004.pt at step 4" in proc.stdout
    assert "ckpt_000009.pt" in proc.stderr and "ckpt_000003.pt: holds step 1000000" in proc.stderr
    names = sorted(p.name for _, p in checkpoint.list_checkpoints(run_copy))
    assert names == ["ckpt_000003.pt", "ckpt_000006.pt", "ckpt_000009.pt"]  # rotated, the rest kept


def test_evaluating_a_checkpoint_whose_model_is_not_weights_is_one_line(run_copy: Path) -> None:
    spoil(run_copy / "ckpt_000004.pt", lambda c: c.update(model=[1, 2]))
    with pytest.raises(PretrainedError, match="ckpt_000004.pt: 'model' is not a dict of tensors"):
        read_checkpoint(run_copy / "ckpt_000004.pt")
    spoil(run_copy / "ckpt_000002.pt", lambda c: c.update(config={"model": "tiny"}))
    with pytest.raises(PretrainedError, match="ckpt_000002.pt: its config cannot be read"):
        read_checkpoint(run_copy / "ckpt_000002.pt")


# Fields added to the config later: a checkpoint written before them has none of them
NEWER_FIELDS = {"model": ("rotary", "rmsnorm", "qk_norm", "relu2", "untied_head",
                          "zero_init_proj", "logit_softcap"),
                "optim": ("lr_schedule", "cooldown_frac", "optimizer", "muon_lr",
                          "muon_momentum", "muon_momentum_warmup", "muon_weight_decay")}


def test_a_checkpoint_from_before_an_option_existed_resumes_with_it_off() -> None:
    saved = to_dict(Config())
    for section, names in NEWER_FIELDS.items():
        for name in names:
            del saved[section][name]
    assert checkpoint.check_resume_config({"config": saved}, Config(), Path("ckpt_000002.pt")) == []


def test_zero_init_proj_may_change_on_resume_and_is_noted() -> None:
    """It only chooses the starting weights; a change of architecture is still refused."""

    def with_model(**changes: Any) -> Config:
        cfg = Config()
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **changes))

    saved = {"config": to_dict(Config())}
    path = Path("ckpt_000002.pt")
    assert checkpoint.check_resume_config(saved, with_model(zero_init_proj=True), path) == [
        "zero_init_proj: False -> True"]
    with pytest.raises(CheckpointError, match="rotary: checkpoint False, config True"):
        checkpoint.check_resume_config(saved, with_model(rotary=True), path)
