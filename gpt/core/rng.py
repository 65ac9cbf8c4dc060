"""Random number generators: seeding a run, and their state as weights_only-loadable types
(a checkpoint holds every rank's, so a resume draws the same numbers)."""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


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


def check_rng_state(state: Any) -> None:
    """Raise ValueError unless `state` is one that set_rng_state takes: it is tried, and
    the generators are put back as they were."""
    before = rng_state()
    try:
        set_rng_state(state)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as e:
        raise ValueError(f"RNG state cannot be restored ({type(e).__name__}: {e})") from None
    finally:
        set_rng_state(before)
