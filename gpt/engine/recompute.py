"""Activation checkpointing (--activation-checkpointing): which of a block's activations
the forward pass keeps for the backward pass, and which the backward pass recomputes.

- none: every activation is kept (the fastest step, the most memory).
- selective: each block keeps the outputs of its matmuls and of attention (SDPA's kernels
  and FlexAttention: gpt/model/attention.py's SAVED_OPS), and recomputes
  the rest from them in the backward pass: the norms, the activation function (GELU's
  4x-wide output), the casts to the compute dtype (autocast's bf16 copies of the inputs
  and weights) and the residual additions. Those are pointwise, a few percent of the
  step's work, and they hold a quarter to a third of its activations (the planner's
  numbers: gpt.plan.memory). The expensive work is never redone.
- blocks: each block keeps only its input and recomputes all of itself in the backward
  pass: about one more forward pass of compute, for most of the activation memory.

Either way the recomputation gives the values the forward pass had: the loss and the
gradients are those of none (tests/plan/test_layout.py holds them equal).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn as nn
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                    create_selective_checkpoint_contexts)

from gpt.model import attention


MODES = ("none", "selective", "blocks")

_aten = torch.ops.aten
# The ops whose outputs selective checkpointing keeps: the matmuls (a linear layer is
# addmm or mm, batched ones bmm, FP8's _scaled_mm) and attention's kernels, as
# gpt/model/attention.py declares them (SDPA's fused kernels, FlexAttention). The list is
# of ops, not modules, so it holds under autocast and torch.compile alike.
MATMUL_OPS = frozenset(getattr(_aten, name).default for name in ("mm", "addmm", "bmm", "_scaled_mm")
                       if hasattr(_aten, name))
KEPT_OPS = MATMUL_OPS | attention.SAVED_OPS


def _policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in KEPT_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def apply(model: nn.Module, mode: str) -> None:
    """Checkpoint each of the model's transformer blocks (model.transformer.h) in `mode`
    (one of MODES; none leaves the model alone)."""
    if mode not in MODES:
        raise ValueError(f"activation checkpointing {mode!r}: one of {', '.join(MODES)} "
                         f"(auto is settled before the model is built: gpt/plan/layout.py)")
    if mode == "none":
        return
    # The recomputation must see the random numbers the forward saw only if it draws any:
    # with dropout off, saving and restoring the RNG state per block would be pure cost.
    preserve_rng = model.config.dropout > 0
    extra: dict[str, Any] = {}
    if mode == "selective":
        extra["context_fn"] = functools.partial(create_selective_checkpoint_contexts, _policy)
    for block in model.transformer.h:
        forward = block.forward
        # An instance attribute shadows the method, so module hooks (FSDP's) still run
        # around __call__ and the parameter names do not change.
        block.forward = lambda *a, _f=forward, **kw: checkpoint(
            _f, *a, use_reentrant=False, preserve_rng_state=preserve_rng, **extra, **kw)
