"""One optimizer step: gradients accumulated over micro-batches, unscaled and clipped,
then the AdamW update at the step's learning rate; and the check that the weights and
optimizer state it leaves are finite.

The training loop (gpt/train.py) calls these, and so does the speed ladder's last rung
(gpt/bench/ladder.py), so both time the same step.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn as nn

from gpt.dist import autocast
from gpt.errors import UserError
from gpt.parallel import full_tensor, local_optimizer, local_tensor, set_grad_sync
from gpt.profiling import nvtx_range


class TrainingDiverged(UserError):
    """The loss, gradients, weights or optimizer state stopped being finite."""


class BatchSource(Protocol):
    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]: ...


def forward_backward(
    model: nn.Module,
    scaler: torch.amp.GradScaler,
    optimizer: torch.optim.Optimizer,
    loader: BatchSource,
    accum_steps: int,
    grad_clip: float,
    device_type: str,
    autocast_dtype: torch.dtype,
    nvtx: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of the mean loss over `accum_steps` micro-batches, unscaled and clipped.

    Returns (mean loss of this rank, global gradient norm before clipping) as device
    tensors, so the caller decides when to pay for reading them.
    """
    optimizer.zero_grad(set_to_none=True)
    loss_sum: torch.Tensor | None = None
    for micro in range(accum_steps):
        set_grad_sync(model, micro == accum_steps - 1)
        x, y = loader.next_batch()
        with nvtx_range("forward", nvtx), autocast(device_type, autocast_dtype):
            _, loss = model(x, y)
        # Each micro-batch's mean loss is divided by the number of micro-batches, so the
        # summed gradients are those of the mean loss over the whole batch.
        loss = loss / accum_steps
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        with nvtx_range("backward", nvtx):
            scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # no-op unless fp16; clipping must see the true gradients
    max_norm = grad_clip if grad_clip > 0 else math.inf
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    assert loss_sum is not None  # accum_steps >= 1
    return loss_sum, full_tensor(norm)


def optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, lr: float,
                   nvtx: bool = False) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
    with nvtx_range("optimizer", nvtx):
        scaler.step(optimizer)  # skips the update itself if fp16 gradients overflowed
        scaler.update()


def nonfinite_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """How many of this rank's weight and optimizer-state tensors hold a NaN or an inf (or
    values so large that their norm overflows), as a device tensor: the caller decides when
    to read it. One fused norm over everything; under FSDP and ZeRO-1 each rank checks its
    own shards, so the counts are summed over ranks."""
    tensors = [local_tensor(p.detach()) for p in model.parameters()]
    tensors += [local_tensor(v) for state in local_optimizer(optimizer).state.values()
                for v in state.values() if torch.is_tensor(v) and v.is_floating_point() and v.dim() > 0]
    if not tensors:
        return torch.zeros((), device=next(model.parameters()).device)
    return count_nonfinite(tensors)


def count_nonfinite(tensors: list[torch.Tensor]) -> torch.Tensor:
    """How many of these tensors hold a NaN or an inf, or values so large that their norm
    overflows (above about 1e19 in fp32: no weight worth keeping), as a device tensor. The
    one test of finiteness for the loop and for checkpoints, in one fused norm kernel (the
    one clip_grad_norm_ uses)."""
    norms = torch.stack(torch._foreach_norm(tensors))
    return (~torch.isfinite(norms)).sum().float()
