"""Checkpoints: what one holds, and its files (atomic writes, rotation, finding the one to
resume from, loading with torch.load(weights_only=True)).

A checkpoint is a plain dict of tensors and Python scalars/containers (no pickled
objects), so loading it never runs code:
    model           full state dict, parameter names without wrapper prefixes
    optimizer       full AdamW state keyed by parameter name (any --parallel mode)
    scaler          GradScaler state (fp16)
    loader          the training loader's state of every rank, in rank order
    rng             python/numpy/torch/cuda RNG states of every rank, in rank order
    config          the resolved Config as a dict (gpt.config.to_dict)
    step            optimizer steps completed
    val_loss        the last validation loss, or None
    best_val_loss   the best validation loss so far, or None
    best_checkpoint file name of the checkpoint with best_val_loss, or None
    skipped_steps   steps skipped so far for a non-finite loss or gradient
Checkpointer.save writes this dict and Checkpointer.restore reads it; nothing else does.
"""

from __future__ import annotations

import math
import os
import random
import re
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from gpt import parallel
from gpt.config import Config, ConfigError, CheckpointConfig, to_dict, upgrade_dict
from gpt.data import ShardLoader
from gpt.dist import Runtime, broadcast_object, gather_objects
from gpt.errors import UserError
from gpt.fileio import atomic_write

CKPT_PATTERN = re.compile(r"^ckpt_(\d+)\.pt$")
REQUIRED_KEYS = ("model", "optimizer", "config", "step", "loader")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be written, read or used; the message names the file."""


def checkpoint_path(out_dir: Path, step: int) -> Path:
    return out_dir / f"ckpt_{step:06d}.pt"


def save_atomic(obj: dict[str, Any], path: str | os.PathLike) -> Path:
    """torch.save through an atomic write: a crash or full disk mid-save leaves the
    previous file at `path` loadable and no partial file under the final name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write(path, lambda fh: torch.save(obj, fh))
    except (OSError, RuntimeError) as e:
        # torch.save reports a failed write (disk full, quota, file-size limit) as a
        # RuntimeError from its zip writer, so both kinds land here.
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip()
        raise CheckpointError(
            f"{path}: could not write the checkpoint ({reason}; {_free_space(path.parent)}); "
            f"earlier checkpoints in {path.parent} are untouched"
        ) from None
    return path


def _free_space(folder: Path) -> str:
    try:
        return f"{shutil.disk_usage(folder).free / 2**30:.1f} GiB free there"
    except OSError:
        return "free space unknown"


def load(path: str | os.PathLike, map_location: str | torch.device = "cpu",
         required: tuple[str, ...] = REQUIRED_KEYS) -> dict[str, Any]:
    """Load a checkpoint safely (weights_only); memory-mapped, so only what is used is read.

    `required` names the entries the caller needs: all of them to resume training, only
    "model" and "config" to evaluate, sample or export.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=True)
    except Exception as e:  # truncated zip, bad pickle, unsupported object, ...
        first = str(e).splitlines()[0] if str(e) else ""
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__}: {first})") from None
    missing = [k for k in required if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise CheckpointError(f"{path}: incomplete checkpoint, missing {', '.join(missing)}")
    return ckpt


def list_checkpoints(out_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of the checkpoint files in a run folder, oldest first."""
    if not out_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out_dir.iterdir() if (m := CKPT_PATTERN.match(p.name))]
    return sorted(found)


def find_latest(out_dir: Path) -> tuple[Path | None, dict[str, Any] | None, list[str]]:
    """The newest checkpoint that loads (path and contents), and a warning for each newer
    one that does not."""
    warnings_: list[str] = []
    for _, path in reversed(list_checkpoints(out_dir)):
        try:
            ckpt = load(path)
        except CheckpointError as e:
            warnings_.append(f"skipping damaged checkpoint: {e}")
            continue
        return path, ckpt, warnings_
    return None, None, warnings_


def rotate(out_dir: Path, keep: int, protect: set[str]) -> list[Path]:
    """Delete all but the newest `keep` checkpoints, never those named in `protect`."""
    ckpts = list_checkpoints(out_dir)
    removed = []
    for _, path in ckpts[: max(0, len(ckpts) - keep)]:
        if path.name not in protect:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def model_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """'field: checkpoint X, config Y' for each model setting that differs."""
    keys = sorted(set(saved) | set(current))
    return [
        f"{k}: checkpoint {saved.get(k)!r}, config {current.get(k)!r}"
        for k in keys
        if saved.get(k) != current.get(k)
    ]


# ---- RNG state, as weights_only-loadable types


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": random.getstate(),
        "numpy": {"bit_generator": np_state["bit_generator"],
                  "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                  "pos": int(np_state["state"]["pos"]),
                  "has_gauss": int(np_state["has_gauss"]),
                  "gauss": float(np_state["gauss"])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_as_tuple(state["python"]))
    np_state = state["numpy"]
    np.random.set_state({
        "bit_generator": np_state["bit_generator"],
        "state": {"key": np_state["key"].numpy().astype(np.uint32), "pos": np_state["pos"]},
        "has_gauss": np_state["has_gauss"],
        "gauss": np_state["gauss"],
    })
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            warnings.warn("CUDA device count changed since the checkpoint; CUDA RNG not restored")


def _as_tuple(x: Any) -> Any:
    """random.setstate needs tuples; a checkpoint round trip may give lists."""
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


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
    """A run folder's checkpoints: where to resume from, saving, restoring, rotating.

    Rank 0 reads and writes the files; save() and resume_point() are collectives, so
    every rank calls them and every rank learns the outcome (or the same error).
    """

    def __init__(self, out_dir: Path, cfg: CheckpointConfig, runtime: Runtime) -> None:
        self.out_dir = out_dir
        self.cfg = cfg
        self.runtime = runtime
        self.last_saved: Path | None = None  # this run's newest checkpoint

    # ---- where to start

    def resume_point(self, config: Config) -> tuple[Path | None, dict[str, Any] | None]:
        """The checkpoint to continue from and its contents, or (None, None) for a fresh
        start. Rank 0 decides; every rank then reads that file (the run folder is on
        storage every node sees, as multi-node training needs anyway)."""
        decision: tuple[str | None, UserError | None] = (None, None)
        ckpt = None
        if self.runtime.is_master:
            try:
                path, ckpt, notes = self._choose()
                for note in notes:
                    print(f"warning: {note}", file=sys.stderr)
                if ckpt is not None:
                    for note in check_resume_config(ckpt, config, path):
                        print(f"note: setting changed since the checkpoint: {note}", flush=True)
                decision = (str(path) if path else None, None)
            except UserError as e:
                decision = (None, e)
        path_str, error = broadcast_object(decision, self.runtime)
        if error is not None:
            raise error
        if path_str is None:
            return None, None
        return Path(path_str), ckpt if ckpt is not None else load(path_str)

    def _choose(self) -> tuple[Path | None, dict[str, Any] | None, list[str]]:
        """(path, contents, warnings) of the checkpoint --resume asks for (rank 0 only)."""
        resume = self.cfg.resume
        existing = list_checkpoints(self.out_dir)
        if resume == "none":
            if existing:
                raise ConfigError(
                    f"--out-dir {self.out_dir} already holds checkpoints ({existing[-1][1].name} "
                    f"is the newest); continue it with --resume auto, or pick a new --out-dir"
                )
            return None, None, []
        if resume == "auto":
            path, ckpt, notes = find_latest(self.out_dir)
            if path is None and existing:
                raise CheckpointError(
                    f"--resume auto: no checkpoint in {self.out_dir} could be read: " + "; ".join(notes)
                )
            return path, ckpt, notes
        path = Path(resume)
        return path, load(path), []  # a clear CheckpointError if missing or damaged

    # ---- writing and reading the contents

    def save(self, parts: Parts) -> Path:
        """Write a checkpoint of the current step (a collective: every rank calls it)."""
        rt, s = self.runtime, parts.loop
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
                     "loader": loaders, "rng": rngs, "config": to_dict(parts.config), **loop}
            try:
                save_atomic(state, path)
            except CheckpointError as e:
                error = e
            else:
                if is_best:
                    s.best_val, s.best_checkpoint = s.last_val, path.name  # type: ignore[assignment]
                protect = {s.best_checkpoint} if s.best_checkpoint else set()
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
        parallel.load_optimizer_state(parts.model, parts.optimizer, ckpt["optimizer"])
        if ckpt.get("scaler"):
            parts.scaler.load_state_dict(ckpt["scaler"])
        loaders = ckpt["loader"]
        # In lockstep every rank is at the same position; a new world size re-splits it
        # (the loader checks that the split is exact, or refuses).
        try:
            parts.loader.load_state_dict(loaders[rt.rank] if len(loaders) == rt.world_size else loaders[0])
        except ValueError as e:
            raise CheckpointError(f"cannot continue the data where the checkpoint left it: {e}") from None
        rngs = ckpt.get("rng") or []
        if rngs:
            set_rng_state(rngs[rt.rank] if len(rngs) == rt.world_size else rngs[0])
        parts.loop.load_state_dict(ckpt)


def check_resume_config(ckpt: dict[str, Any], cfg: Config, path: Path) -> list[str]:
    """Refuse a checkpoint of another model; return notes on other settings that changed."""
    try:
        saved = upgrade_dict(ckpt["config"])
    except ConfigError as e:
        raise CheckpointError(f"{path}: the checkpoint's config cannot be read here: {e}") from None
    current = to_dict(cfg)
    diffs = model_differences(saved["model"], current["model"])
    if diffs:
        raise CheckpointError(
            f"{path}: the checkpoint's model differs from this config: " + "; ".join(diffs)
        )
    return [f"{key}: {saved[section].get(key)!r} -> {value!r}"
            for section in current if section not in ("preset", "model")
            for key, value in current[section].items()
            if key != "resume" and saved[section].get(key) != value]
