"""Validation loss (and bits per byte) over a fixed slice of the validation split: the
trainer's periodic validation and `python -m gpt.evaluate --data-dir` (gpt/evaluate.py)."""

from __future__ import annotations

import torch

from gpt.data.loader import ShardLoader
from gpt.runtime.device import autocast


@torch.no_grad()
def val_loss(
    model: torch.nn.Module,
    loader: ShardLoader,
    steps: int,
    device_type: str,
    autocast_dtype: torch.dtype,
    token_bytes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean loss over the first `steps` batches of the loader; with token_bytes (see
    gpt/eval/bpb.py), a 2-vector: the mean loss and the mean UTF-8 bytes per target token.

    The loader is reset first, so every call scores the same tokens and the numbers are
    comparable across a run. A split smaller than `steps` batches is scored once, not
    wrapped around. Returns a device tensor, so the caller chooses when to sync (and can
    all-reduce it across ranks first: every rank scores as many tokens).
    """
    was_training = model.training
    model.eval()
    loader.reset()
    steps = min(steps, loader.steps_per_pass)
    total: torch.Tensor | None = None
    for _ in range(steps):
        x, y = loader.next_batch()
        with autocast(device_type, autocast_dtype):
            _, loss = model(x, y)
        # Summed into a tensor of our own at once: a model compiled with CUDA graphs
        # (--compile-mode reduce-overhead) overwrites its outputs at the next call.
        value = loss.float().reshape(1).clone()
        if token_bytes is not None:
            value = torch.cat([value, token_bytes[y].mean().reshape(1).to(value.device)])
        total = value if total is None else total + value
    model.train(was_training)
    assert total is not None  # a loader has at least one batch a pass
    total = total / steps
    return total if token_bytes is not None else total[0]
