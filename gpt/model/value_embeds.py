"""Value embeddings (the modded-nanogpt speedrun's): token embedding tables of their own,
mixed into the attention's values of the first and last few blocks.

A value embedding gives a block's attention a direct view of the token ids, which the
residual stream carries only blurred after a few blocks. There are min(3, n_layer // 2)
tables; block i of the first k uses table i, and block n_layer - k + i of the last k uses
it again (the speedrun's sharing, which keeps the parameter count at k tables of V x d).
A block with a table mixes its values as a * v + b * ve, a and b learned scalars per
block starting at 1/2 each; the other blocks' values are untouched.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gpt.core.config import ModelConfig


def tables(cfg: ModelConfig) -> int:
    return min(3, cfg.n_layer // 2) if cfg.value_embeds else 0


def table_of(cfg: ModelConfig, layer: int) -> int | None:
    """The table block `layer` reads, or None."""
    k = tables(cfg)
    if layer < k:
        return layer
    if layer >= cfg.n_layer - k:
        return layer - (cfg.n_layer - k)
    return None


class ValueEmbeddings(nn.Module):
    """The tables; called with the token ids, the value embedding of every block (None
    where a block has none), each (B, T, n_embd)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layers = [table_of(cfg, i) for i in range(cfg.n_layer)]
        self.tables = nn.ModuleList(nn.Embedding(cfg.vocab_size, cfg.n_embd)
                                    for _ in range(tables(cfg)))

    def forward(self, idx: torch.Tensor) -> list[torch.Tensor | None]:
        looked_up = [table(idx) for table in self.tables]
        return [None if t is None else looked_up[t] for t in self.layers]


class NoValueEmbeddings(nn.Module):
    """GPT-2's: no block gets a value embedding."""

    def __init__(self, n_layer: int) -> None:
        super().__init__()
        self.n_layer = n_layer

    def forward(self, idx: torch.Tensor) -> list[torch.Tensor | None]:
        return [None] * self.n_layer


def value_embeddings(cfg: ModelConfig) -> nn.Module:
    return ValueEmbeddings(cfg) if cfg.value_embeds else NoValueEmbeddings(cfg.n_layer)


class ValueMix(nn.Module):
    """v <- a * v + b * ve for one block's values (B, heads, T, head_dim)."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.full((2,), 0.5))

    def init_values(self) -> None:
        self.weights.data.fill_(0.5)

    def forward(self, v: torch.Tensor, ve: torch.Tensor) -> torch.Tensor:
        a, b = self.weights.to(v.dtype).unbind()
        return a * v + b * ve.view_as(v)
