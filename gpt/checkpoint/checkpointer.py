"""A run's checkpointing: the run folder (its lock, the checkpoint to continue from),
saving, restoring and rotating, collectively over the ranks. What a checkpoint holds and
its files (atomic writes, verification, choosing one, rotation) are gpt/checkpoint/files.py's."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from gpt.checkpoint.files import (SCHEMA_KEY, CheckpointError, check_resume_config, checkpoint_path,
                                  choose, find_latest, load, rotate, save_atomic)
from gpt.checkpoint.run_folder import LOCK_WHAT, check_run_folder
from gpt.core.config import SCHEMA_VERSION, CheckpointConfig, Config, ConfigError
from gpt.core.config_io import to_dict
from gpt.core.errors import UserError
from gpt.core.fileio import FolderLock, remove_dead_temp_files, temp_path
from gpt.core.rng import rng_state, set_rng_state
from gpt.data.loader import ShardLoader
from gpt.engine import parallel
from gpt.engine.step import TrainingDiverged, nonfinite_tensors
from gpt.runtime.world import Runtime, all_reduce_mean, broadcast_object, gather_objects


@dataclass
class LoopState:
    """What the loop carries from step to step, and a checkpoint restores."""

    step: int = 0  # optimizer steps completed
    last_val: float | None = None
    best_val: float = math.inf
    best_checkpoint: str | None = None
    bad_in_row: int = 0  # not saved: a resumed run starts a fresh streak
    skipped: int = 0
    # The step whose end-of-run work (the last evaluations) was done: a
    # run stopped by a signal after its last step was saved without it, and its resume
    # does it (gpt/train/loop.py).
    ended_at: int | None = None

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's top-level loop entries (see the module docstring)."""
        return {"step": self.step, "val_loss": self.last_val,
                "best_val_loss": None if math.isinf(self.best_val) else self.best_val,
                "best_checkpoint": self.best_checkpoint, "skipped_steps": self.skipped,
                "ended_at": self.ended_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        # a checkpoint from before the entry: as before, its step counts as ended
        self.ended_at = state.get("ended_at", self.step)
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
        self._lock = FolderLock(out_dir, LOCK_WHAT)

    # ---- opening the run folder, and where to start

    def open(self, config: Config) -> tuple[Path | None, dict[str, Any] | None]:
        """Take the run folder (rank 0: judge it and the files the run opens there as the
        preflight did, create it, prove it writable, lock it for this run, remove dead
        writers' temporary files) and choose the checkpoint to continue from.
        Returns it and its contents, or (None, None) for a fresh start. Every rank then
        reads that file (the run folder is on storage every node sees, as multi-node
        training needs anyway). A start that fails leaves no empty folder behind."""
        decision: tuple[str | None, UserError | None] = (None, None)
        ckpt = None
        if self.runtime.is_master:
            try:
                check_run_folder(self.out_dir, config.train.tensorboard,
                                 bool(config.train.wandb_project))
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
