"""What every stage asks of an optimizer, in one interface (OptimizerKind): one row of
gpt/optim/optimizer.py's table for each --optimizer, chosen once by name. The other
stages never name an optimizer: they ask the chosen row.

    the engine       its parameter groups, its torch class and arguments (built alone or
                     under ZeRO-1, which builds one per rank), the group settings that change
                     from step to step (step_settings: Muon's momentum warm-up)
    the planner      the bytes of state it keeps (a checkpoint's, and the least a parameter
                     costs for gpt/model/sizing.py's bound), the parallel layouts it refuses
    the preflight    its checks of the config fields it owns
    the loop, curves the figures it adds to each log line (log_fields) and the ones of them
                     that are learning rates, drawn beside the schedule's (lr_labels)

Rows are torch-free to import (the curves' command reads a log's schedule without torch):
a row imports torch where it builds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from gpt.core.config import OptimConfig

# Settings a step gives some of the optimizer's groups beside the learning rate: a marker (a
# key those groups hold as True, e.g. "muon") -> the values to set in them at this step
GroupSettings = Mapping[str, Mapping[str, float]]


class OptimizerKind:
    """One optimizer, as the stages ask about it. Subclass, fill the class attributes and
    the methods that raise, and add an instance to gpt/optim/optimizer.py's OPTIMIZERS
    (and its name to gpt/core/config.py's OPTIMIZER_NAMES, --optimizer's choices)."""

    name: str = ""
    # whether --fused (or its default: where the device has it) asks kwargs() for a fused
    # kernel; one that is not available falls back to the unfused one (gpt/optim/optimizer.py)
    fusable: bool = False
    # bytes of state a parameter costs at the least, in fp32: gpt/model/sizing.py's bound
    least_state_bytes: int = 0
    # log field -> its word in the curves' legend, for the log fields that are learning
    # rates of some groups ("lr" is the schedule's: named here where others stand beside it)
    lr_labels: Mapping[str, str] = {}

    def param_groups(self, model: nn.Module, o: OptimConfig) -> list[dict[str, Any]]:
        """The groups of the model's trainable parameters, each once (a tied weight too),
        with their settings. A group's "lr_ratio" scales the schedule's rate for it."""
        raise NotImplementedError

    def torch_class(self) -> type[torch.optim.Optimizer]:
        """The torch optimizer that runs it (ZeroRedundancyOptimizer builds one per rank)."""
        raise NotImplementedError

    def kwargs(self, o: OptimConfig, fused: bool) -> dict[str, Any]:
        """The torch class's arguments beside the groups (the learning rate is set again
        on every step)."""
        raise NotImplementedError

    def state_bytes(self, model: nn.Module) -> int:
        """Bytes of state it keeps for the model's parameters (a checkpoint's share; the
        model may be on the meta device)."""
        return self.least_state_bytes * sum(p.numel() for p in model.parameters())

    def layout_problem(self, parallel: str) -> str | None:
        """Why it cannot run under --parallel `parallel`, in words naming the flags; None
        where it can."""
        return None

    def check(self, o: OptimConfig) -> None:
        """A ConfigError for a value of a field it owns that cannot work. Asked of every
        optimizer whichever is chosen, as the config's own checks are of every field."""

    def step_settings(self, o: OptimConfig, step: int) -> GroupSettings:
        """The group settings of optimizer step `step` beside its learning rate."""
        return {}

    def log_fields(self, o: OptimConfig, step: int, lr: float) -> dict[str, float]:
        """Figures of step `step` (at the schedule's rate `lr`) for its log line's record."""
        return {}
