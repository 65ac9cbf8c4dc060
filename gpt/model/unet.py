"""U-net skip connections (the modded-nanogpt speedrun's): each block of the model's second
half also receives, scaled by a learned weight, the output of its mirror block in the first
half (block n_layer - 1 - i for block i), so late blocks see early features directly.

The weights start at 1. GPT-2 has none: NoSkips passes the stream through.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gpt.core.config import ModelConfig


class UNetSkips(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_layer = cfg.n_layer
        self.pairs = cfg.n_layer // 2
        self.weights = nn.Parameter(torch.ones(self.pairs))

    def init_values(self) -> None:
        self.weights.data.fill_(1.0)

    def forward(self, layer: int, x: torch.Tensor, outputs: list[torch.Tensor]) -> torch.Tensor:
        """The input of block `layer`, given the stream x and the earlier blocks' outputs."""
        first_late = self.n_layer - self.pairs
        if layer < first_late:
            return x
        mirror = self.n_layer - 1 - layer
        return x + self.weights[layer - first_late].to(x.dtype) * outputs[mirror]


class NoSkips(nn.Module):
    def forward(self, layer: int, x: torch.Tensor, outputs: list[torch.Tensor]) -> torch.Tensor:
        return x


def skips(cfg: ModelConfig) -> nn.Module:
    return UNetSkips(cfg) if cfg.unet_skips else NoSkips()
