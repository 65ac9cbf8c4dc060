"""AdamW (--optimizer adamw, GPT-2's): weight decay on the matmul weights and embeddings,
none on biases and norm gains, fused where the device has the kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpt.optim.kind import OptimizerKind

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from gpt.core.config import OptimConfig

STATE_BYTES = 8  # exp_avg and exp_avg_sq, fp32


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matmul weights and embeddings (2+ dims); not biases or LayerNorm gains (1 dim)."""
    params = [p for p in model.parameters() if p.requires_grad]  # tied weights appear once
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def adamw_kwargs(o: OptimConfig) -> dict[str, Any]:
    """AdamW's settings from the config (the LR is set again on every step)."""
    return dict(lr=o.max_lr, betas=(o.beta1, o.beta2), eps=o.eps)


class AdamW(OptimizerKind):
    name = "adamw"
    fusable = True
    least_state_bytes = STATE_BYTES

    def param_groups(self, model: nn.Module, o: OptimConfig) -> list[dict[str, Any]]:
        return param_groups(model, o.weight_decay)

    def torch_class(self) -> type[torch.optim.Optimizer]:
        import torch

        return torch.optim.AdamW

    def kwargs(self, o: OptimConfig, fused: bool) -> dict[str, Any]:
        return dict(adamw_kwargs(o), fused=fused)


ADAMW = AdamW()
