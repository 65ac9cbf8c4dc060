"""The KV cache for incremental decoding: each layer's keys and values of the positions
seen so far, so that sampling one more token runs the model over that token alone."""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of the positions seen so far, per layer, for incremental decoding.

    Each layer's buffers have shape (B, n_head, max_len, head_dim) and are allocated on
    first use with the dtype and device of that layer's keys (so they follow autocast).
    `length` is the number of positions stored; GPT.forward advances it after each call,
    and the next call's tokens take positions length, length + 1, ... A sequence cannot
    grow past max_len (at most the model's block_size): generation past the block size
    recomputes over the cropped context instead (see gpt/eval/sampling.py).
    """

    def __init__(self, n_layer: int, max_len: int) -> None:
        if max_len < 1:
            raise ValueError(f"KVCache max_len must be >= 1, got {max_len}")
        self.max_len = max_len
        self.length = 0
        self.docs: torch.Tensor | None = None  # (B, length) document ids, with --doc-mask
        self.keys: list[torch.Tensor | None] = [None] * n_layer
        self.values: list[torch.Tensor | None] = [None] * n_layer

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, heads, T, head_dim) after the cached positions; return all of them."""
        B, H, T, D = k.shape
        end = self.length + T
        if end > self.max_len:
            raise ValueError(f"KV cache full: {self.length} + {T} positions exceed max_len {self.max_len}")
        if self.keys[layer] is None:
            self.keys[layer] = k.new_zeros(B, H, self.max_len, D)
            self.values[layer] = v.new_zeros(B, H, self.max_len, D)
        keys, values = self.keys[layer], self.values[layer]
        assert keys is not None and values is not None
        keys[:, :, self.length : end] = k
        values[:, :, self.length : end] = v
        return keys[:, :, :end], values[:, :, :end]
