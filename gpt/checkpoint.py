"""Checkpoint files: atomic writes, rotation, finding the one to resume from, and loading
with torch.load(weights_only=True).

A checkpoint is a plain dict of tensors and Python scalars/containers (no pickled
objects), so loading it never runs code:
    model        full state dict, parameter names without wrapper prefixes
    optimizer    full AdamW state keyed by parameter name (any --parallel mode)
    scaler       GradScaler state (fp16)
    loader       the training loader's state of every rank, in rank order
    rng          python/numpy/torch/cuda RNG states of every rank, in rank order
    config       the resolved Config as a dict
    step         optimizer steps completed
    val_loss, best_val_loss, best_checkpoint, skipped_steps
"""

from __future__ import annotations

import os
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from gpt.fileio import atomic_write

CKPT_PATTERN = re.compile(r"^ckpt_(\d+)\.pt$")
REQUIRED_KEYS = ("model", "optimizer", "config", "step", "loader")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written, read or used; the message names the file."""


def checkpoint_path(out_dir: Path, step: int) -> Path:
    return out_dir / f"ckpt_{step:06d}.pt"


def clean_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights without the wrappers' prefixes (torch.compile's `_orig_mod.`,
    DDP's `module.`), so a checkpoint loads into a bare GPT whatever trained it."""
    out = {}
    for key, value in model.state_dict().items():
        for prefix in ("_orig_mod.", "module."):
            while key.startswith(prefix):
                key = key[len(prefix):]
        out[key.replace("._orig_mod.", ".")] = value
    return out


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
