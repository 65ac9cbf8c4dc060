"""The torch versions this package runs on, checked in one place.

pyproject.toml declares the minimum (TORCH_MIN here; the reasons are written there) and CI
runs the tests on it, on the GPU machine's torch and on the newest. pip enforces the range,
but a torch installed around pip (a cluster's module, `--no-deps`, running train_gpt2.py from
a clone) can be older: the trainer then says so in one line at start-up, and a feature that
cannot work on the torch found stops with one line naming the version it needs instead of
failing inside torch. A feature that needs more than TORCH_MIN calls needs_torch() where it
is chosen.
"""

from __future__ import annotations

import re
import warnings

import torch

from gpt.core.config import ConfigError


# The same as pyproject.toml's torch>= and .ci/run's TORCH_MIN (tests/core/test_compat.py checks).
TORCH_MIN = (2, 9)


def version_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string: "2.6.0+cu124" -> (2, 6)."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(m.group(1)), int(m.group(2))


def _dotted(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def needs_torch(feature: str, needed: tuple[int, int], why: str) -> None:
    """Stop, in one line, where `feature` needs a newer torch than the one running."""
    found = torch.__version__
    if version_tuple(found) < needed:
        upgrade = max(needed, TORCH_MIN)  # no advice to install an untested torch
        raise ConfigError(f"{feature} needs torch>={_dotted(needed)} (found {found}): {why}; "
                          f"pip install 'torch>={_dotted(upgrade)}'")


def old_torch_note() -> str | None:
    """The start-up line for a torch older than the declared minimum, else None."""
    found = torch.__version__
    if version_tuple(found) >= TORCH_MIN:
        return None
    return (f"note: torch {found} is older than this package's minimum, {_dotted(TORCH_MIN)} "
            f"(pyproject.toml says why); pip install 'torch>={_dotted(TORCH_MIN)}'")


# torch 2.9 warns, once a process, when TF32 is read or set through the allow_tf32 switches
# ("Please use the new API settings to control TF32 ..."); torch 2.13 and 2.14 do not. Its
# new switches (fp32_precision) cannot be mixed with torch.set_float32_matmul_precision
# (torch raises, on newer versions), so the package keeps allow_tf32, through these two
# functions, without that notice.
_TF32_NOTICE = "Please use the new API settings to control TF32"


def tf32_switches() -> tuple[bool, bool]:
    """Whether TF32 is on for CUDA matmuls and for cuDNN."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TF32_NOTICE)
        return bool(torch.backends.cuda.matmul.allow_tf32), bool(torch.backends.cudnn.allow_tf32)


def set_tf32(matmul: bool, cudnn: bool) -> None:
    """TF32 on or off for CUDA matmuls (fp32 inputs rounded to 10-bit mantissas on tensor
    cores, fp32 accumulation) and for cuDNN."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TF32_NOTICE)
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn
