"""Checkpoints: what one holds, and its files (the run folder's lock, atomic and verified
writes, rotation, choosing the one to resume from, loading with weights_only=True).

A checkpoint is a plain dict of tensors and Python scalars/containers (no pickled
objects), so loading it never runs code:
    model           full state dict, parameter names without wrapper prefixes
    optimizer       full AdamW state keyed by parameter name (any --parallel mode)
    scaler          GradScaler state (fp16)
    loader          the training loader's state of every rank, in rank order
    rng             python/numpy/torch/cuda RNG states of every rank, in rank order
    config          the resolved Config as a dict (gpt.config.to_dict)
    config_schema   gpt.config.SCHEMA_VERSION when it was written (absent in older files:
                    their configs are read as before, a missing field taking its default)
    step            optimizer steps completed
    val_loss        the last validation loss, or None
    best_val_loss   the best validation loss so far, or None
    best_checkpoint file name of the checkpoint with best_val_loss, or None
    skipped_steps   steps skipped so far for a non-finite loss or gradient
Checkpointer.save writes this dict; Checkpointer.restore reads it back, check_contents
(gpt/checkpoint_contents.py) vets it first, and model_weights reads the config and weights
alone (for evaluating, sampling and exporting). Nothing outside these two files reads or
writes its keys.
The file is torch.save's zip archive, whose CRC-32 of every record is checked on load
(torch.load does not check them), and its weights and optimizer state are always finite:
save() refuses to write others, and the resume choice skips them.
"""

from __future__ import annotations

import math
import os
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from gpt import parallel
from gpt.config import (INIT_ONLY, SCHEMA_VERSION, CheckpointConfig, Config, ConfigError,
                        ModelConfig, to_dict, upgrade_dict)
from gpt.checkpoint_contents import BadContents, check_contents, check_weights_fit, stored_step
from gpt.config_check import assumed_defaults, check_saved
from gpt.data import ShardLoader
from gpt.dist import Runtime, all_reduce_mean, broadcast_object, gather_objects
from gpt.errors import UserError
from gpt.fileio import FolderLock, atomic_write, free_space, remove_dead_temp_files, temp_path
from gpt.rng import rng_state, set_rng_state
from gpt.step import TrainingDiverged, nonfinite_tensors

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
    try:
        atomic_write(path, lambda fh: torch.save(obj, fh))
    except (OSError, RuntimeError) as e:
        # torch.save reports a failed write (disk full, quota, file-size limit) as a
        # RuntimeError from its zip writer, so both kinds land here.
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip()
        raise CheckpointError(
            f"{path}: could not write the checkpoint ({reason}; {free_space(path.parent)}); "
            f"earlier checkpoints in {path.parent} are untouched"
        ) from None
    try:
        verify(path)
    except CheckpointError as e:
        path.unlink(missing_ok=True)
        raise CheckpointError(f"{e}; it was removed, earlier checkpoints are untouched") from None
    return path


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
    if not out_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out_dir.iterdir()
             if (m := CKPT_PATTERN.match(p.name)) and p.is_file() and not p.is_symlink()]
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


def resume_config(out_dir: Path, resume: str) -> dict[str, Any] | None:
    """The config (in today's sections) of the checkpoint `--resume` would continue from,
    read before the run starts, without its tensors or the CRC check that the resume
    itself makes (Checkpointer.open); None for a fresh start, or if the file cannot be
    read (the resume then says why)."""
    if resume == "none":
        return None
    if resume == "auto":
        found, _ = by_stored_step(out_dir)
        if not found:
            return None
        path = found[0][1]
    else:
        path = Path(resume)
    try:
        return saved_config(_unpickle(path), path)
    except (CheckpointError, TypeError, KeyError):
        return None


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


# ---- the contents: what a training run saves and restores


@dataclass
class LoopState:
    """What the loop carries from step to step, and a checkpoint restores."""

    step: int = 0  # optimizer steps completed
    last_val: float | None = None
    best_val: float = math.inf
    best_checkpoint: str | None = None
    bad_in_row: int = 0  # not saved: a resumed run starts a fresh streak
    skipped: int = 0

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's top-level loop entries (see the module docstring)."""
        return {"step": self.step, "val_loss": self.last_val,
                "best_val_loss": None if math.isinf(self.best_val) else self.best_val,
                "best_checkpoint": self.best_checkpoint, "skipped_steps": self.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.last_val = state.get("val_loss")
        best = state.get("best_val_loss")
        self.best_val = math.inf if best is None else float(best)
        self.best_checkpoint = state.get("best_checkpoint")
        self.skipped = int(state.get("skipped_steps", 0))


@dataclass
class Parts:
    """The live objects a checkpoint is made of."""

    model: nn.Module  # the bare model (sharded in place under FSDP)
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    loader: ShardLoader  # the training loader
    loop: LoopState
    config: Config


class Checkpointer:
    """A run folder and its checkpoints: the lock, where to resume from, saving, restoring,
    rotating.

    Rank 0 reads and writes the files; open(), save() and close() are collectives, so
    every rank calls them and every rank learns the outcome (or the same error).
    """

    def __init__(self, out_dir: Path, cfg: CheckpointConfig, runtime: Runtime) -> None:
        self.out_dir = out_dir
        self.cfg = cfg
        self.runtime = runtime
        self.last_saved: Path | None = None  # this run's newest checkpoint
        self.resumed_from: Path | None = None  # the checkpoint open() chose
        self._lock = FolderLock(out_dir, "training run")

    # ---- opening the run folder, and where to start

    def open(self, config: Config) -> tuple[Path | None, dict[str, Any] | None]:
        """Take the run folder (rank 0: create it, prove it writable, lock it for this run,
        remove dead writers' temporary files) and choose the checkpoint to continue from.
        Returns it and its contents, or (None, None) for a fresh start. Every rank then
        reads that file (the run folder is on storage every node sees, as multi-node
        training needs anyway). A start that fails leaves no empty folder behind."""
        decision: tuple[str | None, UserError | None] = (None, None)
        ckpt = None
        if self.runtime.is_master:
            try:
                self._take_folder()
                path, ckpt, notes = choose(self.out_dir, self.cfg.resume)
                for note in notes:
                    print(f"warning: {note}", file=sys.stderr)
                if ckpt is not None:
                    for note in check_resume_config(ckpt, config, path):
                        print(f"note: setting changed since the checkpoint: {note}", flush=True)
                decision = (str(path) if path else None, None)
            except UserError as e:
                self._lock.release(remove_folder_if_unused=True)
                decision = (None, e)
        path_str, error = broadcast_object(decision, self.runtime)
        if error is not None:
            raise error
        if path_str is None:
            return None, None
        self.resumed_from = Path(path_str)
        # Rank 0 verified the file; the others read it without checking the CRCs again.
        return self.resumed_from, ckpt if ckpt is not None else load(path_str, check=False)

    def close(self, failed_at_start: bool = False) -> None:
        self._lock.release(remove_folder_if_unused=failed_at_start)

    def _take_folder(self) -> None:
        try:
            self._lock.acquire()
            probe = temp_path(self.out_dir / "write-test")  # a kill here leaves a dead temp file
            probe.write_text("ok")
            probe.unlink()
            for path in remove_dead_temp_files(self.out_dir):
                print(f"note: removed {path.name}, left by a killed write", file=sys.stderr)
        except OSError as e:
            raise ConfigError(f"--out-dir {self.out_dir}: cannot write there "
                              f"({e.strerror or e})") from None

    def last_good(self) -> str:
        """Which checkpoint to go back to, for an error message: the newest that verifies
        and holds finite state (rank 0 reads; others get the same answer)."""
        note = "no usable checkpoint was written"
        if self.runtime.is_master:
            path, _, _ = find_latest(self.out_dir)
            if path is not None:
                note = f"the last good checkpoint is {path}"
        return broadcast_object(note, self.runtime)

    # ---- writing and reading the contents

    def save(self, parts: Parts) -> Path:
        """Write a checkpoint of the current step (a collective: every rank calls it).
        Non-finite weights or optimizer state are never written: the run stops instead."""
        rt, s = self.runtime, parts.loop
        if all_reduce_mean(nonfinite_tensors(parts.model, parts.optimizer), rt).item() > 0:
            raise TrainingDiverged(
                f"the weights or optimizer state hold NaN, inf or values beyond 1e19 at step "
                f"{s.step}: no checkpoint of them is written; {self.last_good()}. Lower "
                f"--max-lr or check the data, then --resume auto")
        model_sd = parallel.model_state(parts.model)
        optim_sd = parallel.optimizer_state(parts.model, parts.optimizer, rt)
        loaders = gather_objects(parts.loader.state_dict(), rt)
        rngs = gather_objects(rng_state(), rt)
        path = checkpoint_path(self.out_dir, s.step)
        error = None
        if rt.is_master:
            is_best = s.last_val is not None and s.last_val < s.best_val
            loop = s.state_dict()
            if is_best:
                loop.update(best_val_loss=s.last_val, best_checkpoint=path.name)
            state = {"model": model_sd, "optimizer": optim_sd, "scaler": parts.scaler.state_dict(),
                     "loader": loaders, "rng": rngs, "config": to_dict(parts.config),
                     SCHEMA_KEY: SCHEMA_VERSION, **loop}
            try:
                save_atomic(state, path)
            except CheckpointError as e:
                error = e
            else:
                if is_best:
                    s.best_val, s.best_checkpoint = s.last_val, path.name  # type: ignore[assignment]
                # The file just written read back intact, so rotating can never leave the
                # run without a checkpoint that verifies.
                protect = {path.name} | ({s.best_checkpoint} if s.best_checkpoint else set())
                rotate(self.out_dir, self.cfg.keep_checkpoints, protect)
        # Every rank learns whether rank 0's write worked, so all fail together if not.
        error = broadcast_object(error, rt)
        if error is not None:
            raise error
        self.last_saved = path
        return path

    def restore(self, parts: Parts, ckpt: dict[str, Any]) -> None:
        """Load optimizer, scaler, loader, RNG and loop state (the model is already loaded:
        it must be, before any sharding)."""
        rt = self.runtime
        loaders = ckpt["loader"]
        # In lockstep every rank is at the same position; a new world size re-splits it
        # (the loader checks that the split is exact, or refuses).
        try:
            parts.loader.load_state_dict(loaders[rt.rank] if len(loaders) == rt.world_size else loaders[0])
        except ValueError as e:
            raise CheckpointError(f"cannot continue the data where the checkpoint left it: {e}") from None
        try:
            parallel.load_optimizer_state(parts.model, parts.optimizer, ckpt["optimizer"])
            if ckpt.get("scaler"):
                parts.scaler.load_state_dict(ckpt["scaler"])
            rngs = ckpt.get("rng") or []
            if rngs:
                set_rng_state(rngs[rt.rank] if len(rngs) == rt.world_size else rngs[0])
            parts.loop.load_state_dict(ckpt)
        except torch.OutOfMemoryError:
            raise
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as e:
            # check_contents vetted the file; this is the net for what it cannot foresee
            first = str(e).splitlines()[0] if str(e) else ""
            raise CheckpointError(f"{self.resumed_from}: its training state cannot be restored "
                                  f"({type(e).__name__}: {first})") from None


def check_resume_config(ckpt: dict[str, Any], cfg: Config, path: Path) -> list[str]:
    """Refuse a checkpoint of another model; return notes on other settings that changed."""
    saved = saved_config(ckpt, path)
    current = to_dict(cfg)
    diffs = model_differences(saved["model"], current["model"])
    if diffs:
        raise CheckpointError(
            f"{path}: the checkpoint's model differs from this config: " + "; ".join(diffs)
        )
    was = saved["optim"]["optimizer"]  # "adamw" in a checkpoint from before Muon
    if was != cfg.optim.optimizer:
        raise CheckpointError(
            f"{path}: the checkpoint holds {was}'s state, and this run asks for --optimizer "
            f"{cfg.optim.optimizer}; resume with --optimizer {was}, or start a new run")
    return [f"{key}: {saved[section][key]!r} -> {value!r}"
            for section in current if section != "preset"
            for key, value in current[section].items()
            if (section != "model" or key in INIT_ONLY) and key != "resume"
            and saved[section][key] != value]
