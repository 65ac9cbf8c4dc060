"""The optimizers by name, one row each (gpt/optim/kind.py's OptimizerKind: AdamW, Muon),
the one --optimizer chooses, and its build: alone, or under ZeRO-1 (one per rank over its
share of the parameters), fused where the device has the kernel. The learning-rate
schedule is gpt/optim/schedule.py's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpt.core.config import ConfigError, OptimConfig
from gpt.optim.adamw import ADAMW
from gpt.optim.kind import OptimizerKind
from gpt.optim.muon import MUON

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

# --optimizer NAME -> its row. gpt/core/config.py's OPTIMIZER_NAMES are the flag's choices:
# the same names (a test holds the two equal).
OPTIMIZERS: dict[str, OptimizerKind] = {k.name: k for k in (ADAMW, MUON)}


def chosen(o: OptimConfig) -> OptimizerKind:
    """The row of --optimizer."""
    try:
        return OPTIMIZERS[o.optimizer]
    except KeyError:
        raise ConfigError(f"--optimizer {o.optimizer}: not an optimizer of this trainer; "
                          f"choose one of {', '.join(OPTIMIZERS)}") from None


def check(o: OptimConfig, parallel: str) -> None:
    """The optimizers' checks of the fields each owns (every one's, whichever is chosen,
    as a mistyped value is an error however it is used), then whether the chosen one
    can run under --parallel `parallel` (auto chooses among the layouts it allows)."""
    for kind in OPTIMIZERS.values():
        kind.check(o)
    problem = chosen(o).layout_problem(parallel)
    if problem is not None:
        raise ConfigError(problem)


def fused_supported(device_type: str) -> bool:
    # CUDA has had fused AdamW longest; CPU and MPS gained it in torch 2.4 / 2.5.
    # Where in doubt, build_optimizer tries it and falls back.
    return device_type in ("cuda", "cpu", "mps")


def want_fused(o: OptimConfig, device_type: str) -> bool:
    """Whether the optimizer is built with its fused kernel: --fused as given, or (unset)
    whether the device has one; never for an optimizer without one."""
    if not chosen(o).fusable:
        return False
    return fused_supported(device_type) if o.fused is None else o.fused


def build_optimizer(model: nn.Module, o: OptimConfig, device: torch.device
                    ) -> tuple[torch.optim.Optimizer, bool]:
    """The chosen optimizer over the model's groups. Returns (optimizer, whether it runs
    its fused kernel)."""
    kind = chosen(o)
    cls = kind.torch_class()
    if want_fused(o, device.type):
        try:
            return cls(kind.param_groups(model, o), **kind.kwargs(o, True)), True
        except (RuntimeError, TypeError) as e:
            if o.fused:  # asked for explicitly: say why it cannot be had
                raise ConfigError(f"--fused: fused AdamW is not available on {device}: {e}") from None
    return cls(kind.param_groups(model, o), **kind.kwargs(o, False)), False


def build_zero1(model: nn.Module, o: OptimConfig, device: torch.device
                ) -> tuple[torch.optim.Optimizer, bool]:
    """ZeRO-1: a ZeroRedundancyOptimizer that builds the chosen optimizer on each rank over
    its share of each group (the groups keep their order and settings)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    kind = chosen(o)
    fused = want_fused(o, device.type)
    return ZeroRedundancyOptimizer(kind.param_groups(model, o), optimizer_class=kind.torch_class(),
                                   **kind.kwargs(o, fused)), fused
