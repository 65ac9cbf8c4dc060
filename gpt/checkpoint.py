"""Checkpoint files: atomic writes, and loading with torch.load(weights_only=True).

A checkpoint is a plain dict of tensors and Python scalars/containers, so it loads
without unpickling arbitrary objects.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from gpt.fileio import atomic_write


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
    previous file at `path` loadable."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda fh: torch.save(obj, fh))
    return path


def load(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint file")
    return torch.load(path, map_location=map_location, weights_only=True)
