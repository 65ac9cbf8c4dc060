"""Checkpoints: what one holds, and its files (atomic and verified writes, rotation,
choosing the one to resume from, loading with weights_only=True). A run's checkpointing
over its ranks (the run folder's lock, saving, restoring) is gpt/checkpoint/checkpointer.py's.

A checkpoint is a plain dict of tensors and Python scalars/containers (no pickled
objects), so loading it never runs code:
    model           full state dict, parameter names without wrapper prefixes
    optimizer       full AdamW state keyed by parameter name (any --parallel mode)
    scaler          GradScaler state (fp16)
    loader          the training loader's state of every rank, in rank order
    rng             python/numpy/torch/cuda RNG states of every rank, in rank order
    config          the resolved Config as a dict (gpt.core.config_io.to_dict)
    config_schema   gpt.core.config.SCHEMA_VERSION when it was written (absent in older files:
                    their configs are read as before, a missing field taking its default)
    step            optimizer steps completed
    val_loss        the last validation loss, or None
    best_val_loss   the best validation loss so far, or None
    best_checkpoint file name of the checkpoint with best_val_loss, or None
    skipped_steps   steps skipped so far for a non-finite loss or gradient
    ended_at        the step whose end-of-run work (the last evaluations) was
                    done, or None (absent in older files: their step counts as ended)
Checkpointer.save (gpt/checkpoint/checkpointer.py) writes this dict; Checkpointer.restore reads it
back, check_contents (gpt/checkpoint/contents.py) vets it first, and model_weights reads
the config and weights alone (for evaluating, sampling and exporting). Nothing outside
these three files reads or writes its keys.
The file is torch.save's zip archive, whose CRC-32 of every record is checked on load
(torch.load does not check them), and its weights and optimizer state are always finite:
save() refuses to write others, and the resume choice skips them.
"""

from __future__ import annotations

import os
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from gpt.checkpoint.contents import BadContents, check_contents, check_weights_fit, stored_step
from gpt.core.config import INIT_ONLY, Config, ConfigError, ModelConfig
from gpt.core.config_check import assumed_defaults, check_saved
from gpt.core.config_io import to_dict, upgrade_dict
from gpt.core.errors import UserError
from gpt.core.fileio import atomic_write, free_space, write_failure


CKPT_PATTERN = re.compile(r"^ckpt_(\d+)\.pt$")
REQUIRED_KEYS = ("model", "optimizer", "config", "step", "loader")
SCHEMA_KEY = "config_schema"  # config.SCHEMA_VERSION of the "config" entry; absent before it


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be written, read or used; the message names the file."""


def checkpoint_path(out_dir: Path, step: int) -> Path:
    return out_dir / f"ckpt_{step:06d}.pt"


# ---- files


def save_atomic(obj: dict[str, Any], path: str | os.PathLike) -> Path:
    """torch.save through an atomic write, then read back and CRC-checked: a crash or full
    disk mid-save leaves the previous file at `path` and no partial file under the final
    name, and a file that does not read back as written is not kept."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    failed: list[OSError] = []

    def save(fh: BinaryIO) -> None:
        torch.save(obj, _Recorded(fh, failed))

    try:
        atomic_write(path, save)
    except (OSError, RuntimeError) as e:
        # torch.save reports a failed write (disk full, quota, file-size limit) as a
        # RuntimeError from its zip writer, in its own words: the OS's error, kept as the
        # file was written, says what it was.
        error = e if isinstance(e, OSError) else (failed[0] if failed else None)
        reason = (write_failure(error, path.parent) if error is not None else
                  f"{str(e).strip()}; {free_space(path.parent)}")
        raise CheckpointError(
            f"{path}: could not write the checkpoint ({reason}); earlier checkpoints in "
            f"{path.parent} are untouched"
        ) from None
    try:
        verify(path)
    except CheckpointError as e:
        path.unlink(missing_ok=True)
        raise CheckpointError(f"{e}; it was removed, earlier checkpoints are untouched") from None
    return path


class _Recorded:
    """The file torch.save writes to, keeping the first OSError of a write (torch's zip
    writer raises its own RuntimeError in its place)."""

    def __init__(self, fh: BinaryIO, failed: list[OSError]) -> None:
        self._fh, self._failed = fh, failed

    def write(self, data: Any) -> int:
        try:
            return self._fh.write(data)
        except OSError as e:
            self._failed.append(e)
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)


def verify(path: Path) -> None:
    """Check every record of the archive against its CRC-32 (flipped bytes inside the
    tensor data would otherwise load silently)."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__}: {e})") from None
    if bad is not None:
        raise CheckpointError(f"{path}: damaged: record {bad} fails its CRC check (the bytes on "
                              f"disk changed after it was written)")


def load(path: str | os.PathLike, map_location: str | torch.device = "cpu",
         required: tuple[str, ...] = REQUIRED_KEYS, check: bool = True) -> dict[str, Any]:
    """Load a checkpoint safely (weights_only), after verifying its CRCs (unless check is
    False: another rank did); memory-mapped, so only what is used is read afterwards.

    `required` names the entries the caller needs: all of them to resume training, only
    "model" and "config" to evaluate, sample or export.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    if check:
        verify(path)
    ckpt = _unpickle(path, map_location)
    missing = [k for k in required if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise CheckpointError(f"{path}: incomplete checkpoint, missing {', '.join(missing)}")
    return ckpt


def saved_config(ckpt: Any, path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint's config as a dict in today's sections (config.upgrade_dict, told the
    schema it was written with), checked as the command line's values are
    (config_check.check_saved), or a one-line error naming the file."""
    try:
        saved = upgrade_dict(ckpt["config"], ckpt.get(SCHEMA_KEY))
    except (ConfigError, TypeError, AttributeError, KeyError) as e:
        raise CheckpointError(f"{path}: its config cannot be read ({e})") from None
    try:
        return check_saved(saved, f"{path}: its saved config")
    except ConfigError as e:
        raise CheckpointError(str(e)) from None


def model_weights(ckpt: Any, path: str | os.PathLike, warn: bool = True
                  ) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """The model's config and weights in a loaded checkpoint, checked against each other,
    or a one-line error naming the file. Every reader comes here (resume, generate,
    evaluate, export), so none builds a model the weights do not fit. A file from before
    config schemas whose config lacks model fields is read with their defaults, and
    (`warn`) one warning says which."""
    model_cfg = ModelConfig(**saved_config(ckpt, path)["model"])
    weights = ckpt.get("model")
    if not isinstance(weights, dict) or not all(isinstance(k, str) and torch.is_tensor(v)
                                                for k, v in weights.items()):
        raise CheckpointError(f"{path}: 'model' is not a dict of tensors")
    try:
        check_weights_fit(model_cfg, weights)
    except BadContents as e:
        raise CheckpointError(f"{path}: {e}") from None
    assumed = assumed_defaults(ckpt["config"].get("model") or {}, ckpt.get(SCHEMA_KEY))
    if warn and assumed:
        print(f"warning: {path}: its config lacks {', '.join(assumed)} and, written before "
              f"configs held their schema version, cannot say whether they were removed or "
              f"did not exist yet: read as {', '.join(f'{k}={v!r}' for k, v in assumed.items())}"
              f" (what the trainer did before they existed); the weights fit that model, "
              f"but if it was trained with other values this reads it as another model",
              file=sys.stderr)
    return model_cfg, weights


def _unpickle(path: Path, map_location: str | torch.device = "cpu") -> Any:
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=True)
    except Exception as e:  # truncated zip, bad pickle, unsupported object, ...
        first = str(e).splitlines()[0] if str(e) else ""
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__}: {first})") from None


def list_checkpoints(out_dir: Path) -> list[tuple[int, Path]]:
    """(step in the name, path) of the checkpoint files in a run folder, oldest first.
    Only regular files count: a folder or symlink named like a checkpoint is not one."""
    try:  # the first look at --out-dir, before its own check: a folder that cannot be
        if not out_dir.is_dir():  # listed (no read permission, a name too long) is one line
            return []
        found = [(int(m.group(1)), p) for p in out_dir.iterdir()
                 if (m := CKPT_PATTERN.match(p.name)) and p.is_file() and not p.is_symlink()]
    except OSError as e:
        raise ConfigError(f"--out-dir {out_dir}: cannot list it for its checkpoints "
                          f"({e.strerror or e}); name a folder this process can read and "
                          f"write") from None
    return sorted(found)


def by_stored_step(out_dir: Path) -> tuple[list[tuple[int, Path]], list[str]]:
    """The checkpoints newest first by the step stored inside each (read without loading
    the tensors), and a warning for each file whose step cannot be read, or is beyond its
    name's or its data position's (a file copied in or edited, which would otherwise win:
    no automatic choice trusts it). A file renamed to a later step ranks by its contents."""
    found, notes = [], []
    for named, path in list_checkpoints(out_dir):
        try:
            step = stored_step(_unpickle(path))
            if step > named:
                raise BadContents(f"holds step {step}, beyond the {named} of its name (renamed, "
                                  f"or copied in from another run); --resume {path} takes it "
                                  f"all the same")
        except BadContents as e:
            notes.append(f"skipping damaged checkpoint: {path}: {e}")
            continue
        except CheckpointError as e:
            notes.append(f"skipping damaged checkpoint: {e}")
            continue
        found.append((step, path))
    return sorted(found, key=lambda sp: (sp[0], sp[1].name), reverse=True), notes


def usable(path: Path) -> dict[str, Any]:
    """A checkpoint that verifies and whose contents a resume can use, or an error."""
    ckpt = load(path)
    model_cfg = model_weights(ckpt, path)[0]
    try:
        check_contents(ckpt, model_cfg)
    except BadContents as e:
        raise CheckpointError(f"{path}: {e}") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as e:
        # Any file can be named ckpt_*.pt: check_contents names what it foresees, and this
        # is the net for the rest, so that no reader stops on a traceback.
        raise CheckpointError(f"{path}: not a checkpoint of this trainer ({type(e).__name__}: "
                              f"{str(e)[:200]})") from None
    return ckpt


def find_latest(out_dir: Path) -> tuple[Path | None, dict[str, Any] | None, list[str]]:
    """The newest usable checkpoint by the step stored in it (path and contents), and a
    warning for each newer one that is damaged or unusable."""
    candidates, notes = by_stored_step(out_dir)
    for _, path in candidates:
        try:
            return path, usable(path), notes
        except CheckpointError as e:
            notes.append(f"skipping damaged checkpoint: {e}")
    return None, None, notes


def choose(out_dir: Path, resume: str) -> tuple[Path | None, dict[str, Any] | None, list[str]]:
    """(path, contents, warnings) of the checkpoint `--resume` asks for in out_dir, or
    (None, None, []) for a fresh start; a clear error if it cannot be honoured. Reads
    only: Checkpointer.open calls it under the folder's lock, a dry run without."""
    if resume == "none":
        existing = list_checkpoints(out_dir)
        if existing:
            raise ConfigError(
                f"--out-dir {out_dir} already holds checkpoints ({existing[-1][1].name} "
                f"is the newest); continue it with --resume auto, or pick a new --out-dir"
            )
        return None, None, []
    if resume == "auto":
        path, ckpt, notes = find_latest(out_dir)
        if path is None and notes:
            raise CheckpointError(f"--resume auto: no checkpoint in {out_dir} could be "
                                  f"used: " + "; ".join(notes))
        return path, ckpt, notes
    return Path(resume), usable(Path(resume)), []  # a clear error if unusable


@dataclass(frozen=True)
class ResumePoint:
    """Where a run would start: fresh (path None), or the checkpoint --resume continues
    from, with the step and config stored in it. Verified (resume_point's verify):
    `contents` is the whole checkpoint, its CRCs and everything a resume reads checked,
    and `notes` the warnings about files passed over on the way."""

    path: Path | None = None
    step: int = 0
    saved: dict[str, Any] | None = None
    contents: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()


def resume_point(out_dir: Path, resume: str, verify: bool) -> ResumePoint:
    """The checkpoint `--resume` would continue from in out_dir, read before the run
    starts and without its lock. verify: as the resume itself chooses (choose: every CRC,
    every entry a resume reads, an older file where the newest cannot be used), which
    reads the whole file; else from the files' configs and the weights' shapes alone
    (memory-mapped, no tensor's values read): which file, its step and config, and the
    same refusals of a folder or a file that cannot be resumed, with the resume's own
    choice, under the lock, to come (Checkpointer.open). Errors are one line naming the
    file."""
    if verify:
        path, ckpt, notes = choose(out_dir, resume)
        if path is None:
            return ResumePoint(notes=tuple(notes))
        return ResumePoint(path, stored_step(ckpt), saved_config(ckpt, path), ckpt, tuple(notes))
    if resume == "none":
        choose(out_dir, resume)  # a listing: refuses a folder that holds checkpoints
        return ResumePoint()
    if resume != "auto":
        return _config_of(Path(resume))
    found, notes = by_stored_step(out_dir)
    for _, path in found:  # newest first; one that cannot be read is passed over, as
        try:               # find_latest passes it over (and warns: its notes, not these)
            return _config_of(path)
        except CheckpointError as e:
            notes.append(f"skipping damaged checkpoint: {e}")
    if notes:
        raise CheckpointError(f"--resume auto: no checkpoint in {out_dir} could be used: "
                              + "; ".join(notes))
    return ResumePoint()


def _config_of(path: Path) -> ResumePoint:
    """The step and config a checkpoint holds, and its weights' names and shapes against
    that config, as every reader judges them (model_weights); memory-mapped: no tensor's
    values are read."""
    ckpt = load(path, check=False)
    try:
        step = stored_step(ckpt)
    except BadContents as e:
        raise CheckpointError(f"{path}: {e}") from None
    model_weights(ckpt, path, warn=False)  # the resume itself warns of assumed fields
    return ResumePoint(path, step, saved_config(ckpt, path))


def rotate(out_dir: Path, keep: int, protect: set[str]) -> list[Path]:
    """Delete all but the newest `keep` checkpoints by the step stored in each, never those
    named in `protect`. A file that cannot be read is neither counted nor deleted (resume
    skips it with a warning), and one that cannot be deleted stays, with a warning."""
    newest_first, _ = by_stored_step(out_dir)
    removed = []
    for _, path in newest_first[keep:]:
        if path.name in protect:
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:
            print(f"warning: could not remove old checkpoint {path} ({e.strerror or e}); "
                  f"training goes on", file=sys.stderr)
            continue
        removed.append(path)
    return removed


def model_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """'field: checkpoint X, config Y' for each model setting that differs, but for the
    ones that only choose the starting weights."""
    keys = sorted((set(saved) | set(current)) - set(INIT_ONLY))
    return [
        f"{k}: checkpoint {saved.get(k)!r}, config {current.get(k)!r}"
        for k in keys
        if saved.get(k) != current.get(k)
    ]


def check_resume_config(ckpt: dict[str, Any], cfg: Config, path: Path) -> list[str]:
    """Refuse a checkpoint of another model; return notes on other settings that changed."""
    return resume_differences(saved_config(ckpt, path), cfg, path)


def resume_differences(saved: dict[str, Any], cfg: Config, path: Path) -> list[str]:
    """check_resume_config on a checkpoint's config already read (saved_config)."""
    current = to_dict(cfg)
    diffs = model_differences(saved["model"], current["model"])
    if diffs:
        raise CheckpointError(
            f"{path}: the checkpoint's model differs from this config: " + "; ".join(diffs)
        )
    was = saved["optim"]["optimizer"]  # the default in a checkpoint from before the choice
    if was != cfg.optim.optimizer:
        raise CheckpointError(
            f"{path}: the checkpoint holds {was}'s state, and this run asks for --optimizer "
            f"{cfg.optim.optimizer}; resume with --optimizer {was}, or start a new run")
    return [f"{key}: {saved[section][key]!r} -> {value!r}"
            for section in current if section != "preset"
            for key, value in current[section].items()
            if (section != "model" or key in INIT_ONLY) and key != "resume"
            and saved[section][key] != value]
