"""Muon (--optimizer muon) for the blocks' weight matrices, AdamW for the rest: its groups,
its settings and checks, its momentum warm-up, what it keeps and how it may be laid out.
The torch optimizer that runs both is gpt/optim/muon_adamw.py's MuonAdamW.

Muon (Jordan et al., 2024) replaces each 2-D weight's momentum update by its nearest
semi-orthogonal matrix (a few Newton-Schulz iterations), so every direction of the update
moves at the same rate. It is meant for the hidden matrices only: the token embedding,
the head (tied or not), biases and norm gains stay with AdamW (at --max-lr). Its own
learning rate, --muon-lr, follows the same schedule: its group's "lr_ratio" is
--muon-lr / --max-lr.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpt.core.config import ConfigError
from gpt.core.config_check import MAX_LR
from gpt.core.config_io import flag
from gpt.optim.adamw import STATE_BYTES as ADAMW_STATE_BYTES
from gpt.optim.adamw import adamw_kwargs
from gpt.optim.kind import GroupSettings, OptimizerKind

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from gpt.core.config import OptimConfig

STATE_BYTES = 4  # one fp32 momentum buffer for each hidden matrix
MARK = "muon"  # the key each group holds: True for Muon's group, False for AdamW's
WARMUP_START = 0.85  # the momentum a warm-up starts from (the speedrun's)


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The blocks' 2-D weights (attention and MLP matmuls): Muon's parameters."""
    blocks = getattr(model, "transformer").h
    return [p for p in blocks.parameters() if p.dim() == 2 and p.requires_grad]


def muon_param_groups(model: nn.Module, weight_decay: float, muon_weight_decay: float,
                      muon_lr_ratio: float) -> list[dict[str, Any]]:
    """Muon's group (the hidden matrices), then AdamW's decay group (embeddings and an
    untied head) and its no-decay group (biases, gains)."""
    hidden = {id(p) for p in hidden_matrices(model)}
    params = [p for p in model.parameters() if p.requires_grad]  # a tied weight once
    return [
        {"params": [p for p in params if id(p) in hidden], "weight_decay": muon_weight_decay,
         MARK: True, "lr_ratio": muon_lr_ratio},
        {"params": [p for p in params if id(p) not in hidden and p.dim() >= 2],
         "weight_decay": weight_decay, MARK: False},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, MARK: False},
    ]


def momentum_at(step: int, final: float, warmup_steps: int, start: float = WARMUP_START) -> float:
    """Muon's momentum at `step`: from `start` up to `final` over warmup_steps (the
    speedrun's warm-up, which steadies the first steps), then `final`."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return final
    return start + (final - start) * step / warmup_steps


def lr_ratio(o: OptimConfig) -> float:
    """Muon's learning rate over the schedule's (--muon-lr / --max-lr)."""
    return o.muon_lr / o.max_lr if o.max_lr else 0.0


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


class Muon(OptimizerKind):
    name = "muon"
    fusable = True  # its AdamW
    # its matrices' one momentum, counted as one for every parameter: the bound's least
    least_state_bytes = STATE_BYTES
    lr_labels = {"lr": "AdamW", "muon_lr": "Muon"}

    def param_groups(self, model: nn.Module, o: OptimConfig) -> list[dict[str, Any]]:
        return muon_param_groups(model, o.weight_decay, o.muon_weight_decay, lr_ratio(o))

    def torch_class(self) -> type[torch.optim.Optimizer]:
        from gpt.optim.muon_adamw import MuonAdamW

        return MuonAdamW

    def kwargs(self, o: OptimConfig, fused: bool) -> dict[str, Any]:
        return {"adamw": dict(adamw_kwargs(o), fused=fused),
                "muon": {"momentum": o.muon_momentum, "nesterov": True}}

    def state_bytes(self, model: nn.Module) -> int:
        hidden = sum(p.numel() for p in hidden_matrices(model))
        every = sum(p.numel() for p in model.parameters())
        return STATE_BYTES * hidden + ADAMW_STATE_BYTES * (every - hidden)

    def layout_problem(self, parallel: str) -> str | None:
        # Muon orthogonalises each matrix as a whole; under FSDP2 a rank holds row shards
        if parallel != "fsdp":
            return None
        return ("--optimizer muon orthogonalises whole weight matrices, and --parallel fsdp "
                "holds row shards of them: use --parallel ddp or zero1 with Muon")

    def check(self, o: OptimConfig) -> None:
        for name in ("muon_lr", "muon_momentum", "muon_weight_decay"):
            _check(getattr(o, name) >= 0 and math.isfinite(getattr(o, name)),
                   f"{flag(name)} {getattr(o, name)}: must be a finite number >= 0")
        _check(o.muon_momentum < 1, f"--muon-momentum {o.muon_momentum}: must be below 1")
        # Muon's update has about unit spectral norm whatever the gradient: its rate is a
        # step size, and the speedrun's is 0.02-0.05
        _check(o.muon_lr <= MAX_LR, f"--muon-lr must be <= {MAX_LR}, got {o.muon_lr} (the "
               f"speedrun used 0.05)")
        _check(o.muon_lr * o.muon_weight_decay < 1,
               f"--muon-weight-decay {o.muon_weight_decay} x --muon-lr {o.muon_lr} must be < 1 "
               f"(each step multiplies the weights by 1 - lr x weight decay)")
        _check(o.muon_momentum_warmup >= 0,
               f"--muon-momentum-warmup {o.muon_momentum_warmup}: must be >= 0")

    def step_settings(self, o: OptimConfig, step: int) -> GroupSettings:
        return {MARK: {"momentum": momentum_at(step, o.muon_momentum, o.muon_momentum_warmup)}}

    def log_fields(self, o: OptimConfig, step: int, lr: float) -> dict[str, float]:
        return {"muon_lr": lr * lr_ratio(o),
                "muon_momentum": momentum_at(step, o.muon_momentum, o.muon_momentum_warmup)}


MUON = Muon()
