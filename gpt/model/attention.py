"""Attention itself: the one place the model computes softmax(q k^T / sqrt(d)) v, and
which kernel does it.

- SDPA (F.scaled_dot_product_attention) for GPT-2's causal attention, the KV cache's
  cases and a boolean mask: torch picks a fused kernel (flash, memory-efficient, cuDNN;
  on a CPU its flash kernel) where one fits, and never holds the T x T scores then.
- FlexAttention for a BlockMask (a window or documents, gpt/model/attention_mask.py):
  where it has a fused kernel with a backward, on CUDA under torch.compile (flex_wanted);
  elsewhere the mask is boolean and SDPA takes it. (FlexAttention has no backward on a
  CPU in torch 2.13, and uncompiled it runs an unfused fallback.)

And what selective activation checkpointing keeps of it (SAVED_OPS, which
gpt/engine/recompute.py asks): the outputs of every kernel above, so the backward pass
never runs attention's forward again. The benchmarks' naive attention, the baseline they
compare with, is gpt/bench/step/naive.py's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

# FlexAttention's names, set by load_flex() when a model with a mask is built: importing it
# pulls in sympy (about 0.8 s of every start-up), which GPT-2's causal-only attention never
# needs. The compiled forward reads them as this module's globals, set before it runs.
BlockMask: Any = None
create_block_mask: Any = None
flex_attention: Any = None

_aten = torch.ops.aten
# The ops whose outputs selective checkpointing keeps: every fused kernel SDPA may pick
# (with its output, the log-sum-exp its backward reads), and FlexAttention, which reaches
# the checkpointing's dispatch as one higher-order op (its output and log-sum-exp). Ops,
# not modules, so the list holds under autocast and torch.compile alike; the math
# fallback's softmax and matmuls are the matmuls' and the pointwise ops' rule.
SAVED_OPS = frozenset([getattr(_aten, name).default for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
) if hasattr(_aten, name)] + [torch._higher_order_ops.flex_attention])


def load_flex() -> None:
    """Import FlexAttention into this module's globals (once; torch >= 2.9 has it)."""
    global BlockMask, create_block_mask, flex_attention
    if flex_attention is None:
        from torch.nn.attention import flex_attention as flex
        BlockMask, create_block_mask = flex.BlockMask, flex.create_block_mask
        flex_attention = flex.flex_attention


def flex_wanted(idx: torch.Tensor) -> bool:
    """FlexAttention where it has a fused kernel with a backward: CUDA, under torch.compile
    (a mask for `idx`'s pass is then a BlockMask; else a boolean one)."""
    return flex_attention is not None and idx.is_cuda and torch.compiler.is_compiling()


def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """GPT-2's attention: each query over the keys up to its own position (q, k, v:
    (B, heads, T, head_dim))."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)


def masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: object,
           dropout_p: float) -> torch.Tensor:
    """Attention under an AttentionMask's mask: a BlockMask's by FlexAttention, a boolean
    one's (True: may attend) by SDPA."""
    if BlockMask is not None and isinstance(mask, BlockMask):
        return flex_attention(q, k, v, block_mask=mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


def after_prefix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                 dropout_p: float) -> torch.Tensor:
    """T new queries at positions start.. over the `start` cached keys and their own
    (k, v: the cache's, these appended)."""
    T = q.size(2)
    if start == 0:  # prefill: the plain causal case
        return causal(q, k, v, dropout_p)
    if T == 1:  # one new token is the last position: it may see every cached key
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    # Several new tokens after a prefix: query i sits at position start + i. (SDPA's
    # is_causal aligns the mask top-left, which is wrong when keys outnumber queries.)
    rows = torch.arange(start, start + T, device=q.device).unsqueeze(1)
    mask = rows >= torch.arange(start + T, device=q.device).unsqueeze(0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
