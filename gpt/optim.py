"""AdamW with weight-decay groups, and the warm-up + cosine learning-rate schedule."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn

from gpt.config import ConfigError, OptimConfig


def lr_at(step: int, max_lr: float, min_lr_ratio: float, warmup_steps: int, max_steps: int) -> float:
    """Learning rate for optimizer step `step` (0-based).

    Linear warm-up from max_lr / warmup_steps at step 0 to max_lr at step warmup_steps - 1
    (never 0, which would waste the first step), then a cosine from max_lr at step
    warmup_steps down to min_lr at step max_steps, and min_lr after that.
    """
    min_lr = max_lr * min_lr_ratio
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matmul weights and embeddings (2+ dims); not biases or LayerNorm gains (1 dim)."""
    params = [p for p in model.parameters() if p.requires_grad]  # tied weights appear once
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def fused_supported(device: torch.device) -> bool:
    # CUDA has had fused AdamW longest; CPU and MPS gained it in torch 2.4 / 2.5.
    # Where in doubt, build_optimizer tries it and falls back.
    return device.type in ("cuda", "cpu", "mps")


def want_fused(cfg: OptimConfig, device: torch.device) -> bool:
    """--fused as given, or (unset) whether the device has a fused AdamW."""
    return fused_supported(device) if cfg.fused is None else cfg.fused


def adamw_kwargs(cfg: OptimConfig) -> dict[str, Any]:
    """AdamW's settings from the config (the LR is set again on every step)."""
    return dict(lr=cfg.max_lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, device: torch.device
) -> tuple[torch.optim.AdamW, bool]:
    """AdamW over the model's decay groups. Returns (optimizer, whether it is fused)."""
    groups = param_groups(model, cfg.weight_decay)
    kwargs = adamw_kwargs(cfg)
    if want_fused(cfg, device):
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs), True
        except (RuntimeError, TypeError) as e:
            if cfg.fused:  # asked for explicitly: say why it cannot be had
                raise ConfigError(f"--fused: fused AdamW is not available on {device}: {e}") from None
    return torch.optim.AdamW(groups, **kwargs), False
