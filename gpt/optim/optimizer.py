"""The optimizer: AdamW with weight-decay groups, or Muon + AdamW (gpt/optim/muon.py),
fused where the device has it. The learning-rate schedule is gpt/optim/schedule.py's."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from gpt.core.config import ConfigError, OptimConfig
from gpt.optim.muon import MuonAdamW, muon_param_groups


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
    """AdamW over the model's decay groups, or (--optimizer muon) Muon and AdamW.
    Returns (optimizer, whether its AdamW is fused)."""
    if cfg.optimizer == "muon":
        return build_muon(model, cfg, want_fused(cfg, device))
    groups = param_groups(model, cfg.weight_decay)
    kwargs = adamw_kwargs(cfg)
    if want_fused(cfg, device):
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs), True
        except (RuntimeError, TypeError) as e:
            if cfg.fused:  # asked for explicitly: say why it cannot be had
                raise ConfigError(f"--fused: fused AdamW is not available on {device}: {e}") from None
    return torch.optim.AdamW(groups, **kwargs), False


def muon_kwargs(cfg: OptimConfig, fused: bool) -> dict[str, Any]:
    """MuonAdamW's arguments (for it, or for ZeroRedundancyOptimizer to build one per rank)."""
    return {"adamw": dict(adamw_kwargs(cfg), fused=fused),
            "muon": {"momentum": cfg.muon_momentum, "nesterov": True}}


def optimizer_groups(model: nn.Module, cfg: OptimConfig) -> list[dict]:
    """The optimizer's parameter groups: AdamW's decay groups, or Muon's and AdamW's."""
    if cfg.optimizer == "muon":
        return muon_param_groups(model, cfg.weight_decay, cfg.muon_weight_decay,
                                 cfg.muon_lr / cfg.max_lr if cfg.max_lr else 0.0)
    return param_groups(model, cfg.weight_decay)


def build_muon(model: nn.Module, cfg: OptimConfig, fused: bool) -> tuple[MuonAdamW, bool]:
    try:
        opt = MuonAdamW(optimizer_groups(model, cfg), **muon_kwargs(cfg, fused))
    except (RuntimeError, TypeError) as e:  # no fused AdamW here: the unfused one
        if cfg.fused:
            raise ConfigError(f"--fused: fused AdamW is not available: {e}") from None
        return MuonAdamW(optimizer_groups(model, cfg), **muon_kwargs(cfg, False)), False
    return opt, fused
