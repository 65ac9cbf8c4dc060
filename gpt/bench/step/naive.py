"""Naive (hand-written) causal attention, and a swap that puts it into a GPT in place of SDPA.

The model's own attention calls ``F.scaled_dot_product_attention``; the speed ladder and
the attention benchmark compare it with attention written out the way it is first
taught: the T x T score matrix, a masked softmax, then the weighted sum of the values.
With ``nvtx=True`` the three parts show up as "attn.scores", "attn.softmax" and
"attn.output" ranges in Nsight Systems (not inside torch.compile, which fuses them).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt.report.profiling import nvtx_range


def causal_mask(T: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(T, T) bool, True where a query may attend (key position <= query position)."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                    nvtx: bool = False, dropout_p: float = 0.0) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal mask) v for (B, H, T, d) inputs; mask (>=T, >=T) bool."""
    T = q.size(-2)
    with nvtx_range("attn.scores", nvtx):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
        att = att.masked_fill(~mask[:T, :T], float("-inf"))
    with nvtx_range("attn.softmax", nvtx):
        att = F.softmax(att, dim=-1)
        if dropout_p > 0.0:
            att = F.dropout(att, p=dropout_p)
    with nvtx_range("attn.output", nvtx):
        return att @ v


class NaiveCausalSelfAttention(nn.Module):
    """Drop-in for gpt.model.transformer.CausalSelfAttention that shares its weights.

    The projections are the original module's own submodules under the same names, so
    the parameters (and state_dict keys) do not change; the causal mask is a
    non-persistent buffer.
    """

    def __init__(self, attn: nn.Module, mask: torch.Tensor, nvtx: bool = False) -> None:
        super().__init__()
        self.n_head = attn.n_head
        self.n_embd = attn.n_embd
        self.dropout = attn.dropout
        self.c_attn = attn.c_attn
        self.c_proj = attn.c_proj
        self.resid_dropout = attn.resid_dropout
        self.nvtx = nvtx
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor, kv_cache: object = None, layer: int = 0,
                mask: object = None, ve: object = None) -> torch.Tensor:
        # Same call signature as the model's attention; the KV cache (generation), masks
        # and value embeddings are not something this benchmark module supports.
        if kv_cache is not None or mask is not None or ve is not None:
            raise NotImplementedError("naive attention (gpt.bench) is GPT-2's causal attention "
                                      "only: no KV cache, window, document mask or value embeddings")
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = naive_attention(q, k, v, self.mask, nvtx=self.nvtx,
                            dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


def use_naive_attention(model: nn.Module, nvtx: bool = False) -> nn.Module:
    """Replace every block's ``attn`` of a gpt.model.transformer.GPT with the naive version, in place.

    Call it before torch.compile. Returns the model.
    """
    # One (block_size, block_size) mask shared by every block.
    mask = causal_mask(model.config.block_size, model.transformer.wte.weight.device)
    for block in model.transformer.h:
        if not isinstance(block.attn, NaiveCausalSelfAttention):
            block.attn = NaiveCausalSelfAttention(block.attn, mask, nvtx=nvtx)
    return model
