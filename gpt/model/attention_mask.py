"""Which keys each query may attend to beyond causality: a sliding window that grows during
training, and documents (no attention across the end-of-text token that separates them).

Both are off by default (GPT-2 attends to every earlier position of its context). With
either on, GPT builds an AttentionMask, which turns a batch's token ids into one mask
shared by every layer, which gpt/model/attention.py applies: under torch.compile on CUDA
a FlexAttention BlockMask (the kernel skips the masked blocks), elsewhere a boolean mask
(True: may attend) for SDPA (attention.flex_wanted says which; a KV cache and dropout
take SDPA too).

The window is a buffer, not a Python number, so a compiled model reads its current value
without recompiling; the trainer sets it from the step (window_at), so a resumed run gets
the same window at the same step and no checkpoint needs to carry it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn as nn

from gpt.core.config import ModelConfig
from gpt.model import attention


if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask as FlexMask

EOT = 50256  # GPT-2's <|endoftext|>, which fineweb.py puts between documents



class Cache(Protocol):
    """What the mask needs of gpt.model.kv_cache.KVCache (named here by its shape, not imported:
    gpt/model/transformer.py imports this module)."""

    length: int
    docs: torch.Tensor | None


def masked(cfg: ModelConfig) -> bool:
    """Whether cfg's attention needs a mask beyond the causal one."""
    return cfg.attn_window > 0 or cfg.doc_mask


def window_at(cfg: ModelConfig, step: int, max_steps: int) -> int:
    """The attention window at `step`: --attn-window at step 0, growing linearly to
    --attn-window-final (0: the block size) at the last step."""
    first, last = cfg.attn_window, cfg.attn_window_final or cfg.block_size
    if not first:
        return cfg.block_size
    frac = min(1.0, step / max(1, max_steps - 1))
    return round(first + (last - first) * frac)


class AttentionMask(nn.Module):
    """The mask of one forward pass: (B or 1, 1, T, S) booleans for T queries over S keys
    (S = cached + new positions)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        attention.load_flex()
        self.cfg = cfg
        self.register_buffer("window", torch.tensor(window_at(cfg, 0, 1)), persistent=False)

    def init_values(self) -> None:
        """The window at step 0 (also after a meta-device model is materialised)."""
        self.window.fill_(window_at(self.cfg, 0, 1))

    def set_step(self, step: int, max_steps: int) -> None:
        self.window.fill_(window_at(self.cfg, step, max_steps))

    def forward(self, idx: torch.Tensor, kv_cache: Cache | None = None) -> "torch.Tensor | FlexMask":
        """idx: (B, T) new tokens, at positions kv_cache.length onwards with a cache (whose
        document ids this extends). Returns the mask: a BlockMask where FlexAttention is
        used, else booleans (B or 1, 1, T, cached + T)."""
        start, T = (0 if kv_cache is None else kv_cache.length), idx.size(1)
        if kv_cache is None and self.cfg.dropout == 0 and attention.flex_wanted(idx):
            return self.block_mask(idx)
        q = torch.arange(start, start + T, device=idx.device).unsqueeze(1)
        k = torch.arange(start + T, device=idx.device).unsqueeze(0)
        mask = q >= k
        if self.cfg.attn_window > 0:
            mask = mask & (q - k < self.window)
        mask = mask.view(1, 1, T, start + T)
        if not self.cfg.doc_mask:
            return mask
        # A token's document: how many end-of-text tokens came up to and including it, so
        # the separator opens the next document (fineweb.py puts one before each document)
        docs = torch.cumsum(idx == EOT, dim=1)
        if kv_cache is not None:
            if start > 0 and kv_cache.docs is not None:
                docs = torch.cat((kv_cache.docs, docs + kv_cache.docs[:, -1:]), dim=1)
            kv_cache.docs = docs
        same = docs[:, -T:].unsqueeze(2) == docs.unsqueeze(1)  # (B, T, S)
        return mask & same.unsqueeze(1)


    def block_mask(self, idx: torch.Tensor) -> FlexMask:
        """The same mask as a FlexAttention BlockMask, for a pass without a cache."""
        B, T = idx.shape
        windowed, window = self.cfg.attn_window > 0, self.window
        docs = torch.cumsum(idx == EOT, dim=1) if self.cfg.doc_mask else None

        def allowed(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            ok = q >= k
            if windowed:
                ok = ok & (q - k < window)
            if docs is not None:
                ok = ok & (docs[b, q] == docs[b, k])
            return ok

        return attention.create_block_mask(allowed, B if docs is not None else None, None, T,
                                           T, device=idx.device)


class CausalOnly(nn.Module):
    """GPT-2's attention: no mask beyond the causal one, which SDPA applies itself."""

    def forward(self, idx: torch.Tensor, kv_cache: Cache | None = None) -> None:
        return None


def set_attention_step(model: nn.Module, step: int, max_steps: int) -> None:
    """Set the growing window of a GPT (unwrapped) for `step` of `max_steps`."""
    mask = getattr(model, "attn_mask", None)
    if isinstance(mask, AttentionMask):
        mask.set_step(step, max_steps)
