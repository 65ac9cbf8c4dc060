"""Validation loss over a fixed slice of the validation split."""

from __future__ import annotations

import torch

from gpt.data import ShardLoader


@torch.no_grad()
def val_loss(
    model: torch.nn.Module,
    loader: ShardLoader,
    steps: int,
    device_type: str,
    autocast_dtype: torch.dtype,
) -> torch.Tensor:
    """Mean loss over the first `steps` batches of the loader.

    The loader is reset first, so every call scores the same tokens and the numbers are
    comparable across a run. A split smaller than `steps` batches is scored once, not
    wrapped around. Returns a 0-dim device tensor, so the caller chooses when to sync
    (and can all-reduce it across ranks first).
    """
    was_training = model.training
    model.eval()
    loader.reset()
    losses = []
    for _ in range(min(steps, loader.steps_per_pass)):
        x, y = loader.next_batch()
        with torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_dtype != torch.float32):
            _, loss = model(x, y)
        losses.append(loss.float())
    model.train(was_training)
    return torch.stack(losses).mean()
