"""One optimizer step: gradients accumulated over micro-batches, unscaled and clipped,
then the optimizer's update at the step's learning rate, skipped on the device when the
gradient is not finite; the count of such steps; and the check that the weights and
optimizer state are finite.

Nothing here waits for the device: losses, norms and counts stay device tensors until
the loop reads them, at log steps.

The training loop (gpt/train/loop.py) calls these, and so does the speed ladder's last rung
(gpt/bench/step/ladder.py), so both time the same step.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn as nn

from gpt.core.errors import UserError
from gpt.engine.parallel import full_tensor, local_optimizer, local_tensor, set_grad_sync
from gpt.optim.kind import GroupSettings
from gpt.report.profiling import nvtx_range
from gpt.runtime.device import autocast


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
        loss = loss / accum_steps  # a tensor of our own: under CUDA graphs the next call
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()  # reuses the model's
        with nvtx_range("backward", nvtx):
            scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # no-op unless fp16; clipping must see the true gradients
    max_norm = grad_clip if grad_clip > 0 else math.inf
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    assert loss_sum is not None  # accum_steps >= 1
    return loss_sum, full_tensor(norm)


def optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, lr: float,
                   norm: torch.Tensor, nvtx: bool = False,
                   settings: GroupSettings | None = None) -> torch.Tensor | None:
    """The update at `lr` (times a group's "lr_ratio", where a group's rate is its own),
    with the step's other `settings` in the groups they mark (the optimizer's
    step_settings: marker -> values, for each group that holds the marker as True), unless
    the gradient norm is not finite. Returns whether the step was skipped as a 0-dim device
    tensor (1.0 if so), or None under fp16, whose scaler skips overflowed steps itself
    (routinely, while it finds its scale)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_ratio"] if "lr_ratio" in group else lr
        for marker, values in (settings or {}).items():
            if group.get(marker) is True:
                group.update(values)
    with nvtx_range("optimizer", nvtx):
        if scaler.is_enabled():
            scaler.step(optimizer)
            scaler.update()
            return None
        found_inf = (~torch.isfinite(norm)).float()
        _step_unless(optimizer, found_inf)
    return found_inf


def _step_unless(optimizer: torch.optim.Optimizer, found_inf: torch.Tensor) -> None:
    """optimizer.step(), skipped if found_inf is 1. Fused AdamW takes the flag (as
    GradScaler passes it): its kernel leaves weights, moments and step counts alone, with
    no host sync. The unfused AdamW cannot, so there the flag is read (one sync)."""
    inner = local_optimizer(optimizer)  # ZeRO-1's inner AdamW is the one that steps
    if inner.defaults.get("fused"):
        inner.found_inf = found_inf  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del inner.found_inf  # type: ignore[attr-defined]
    elif found_inf.item() == 0:
        optimizer.step()


class SkippedSteps:
    """Steps skipped for a non-finite gradient, counted on the device (a few tiny kernels
    a step, no sync) and read when the loop reads its losses."""

    def __init__(self) -> None:
        # skipped since the last read, the current streak, the longest streak since the last read
        self._counts: torch.Tensor | None = None

    def add(self, found_inf: torch.Tensor | None) -> None:
        if found_inf is None:
            return
        if self._counts is None:
            self._counts = torch.zeros(3, device=found_inf.device)
        skipped, streak, longest = self._counts.unbind()
        streak = (streak + found_inf) * found_inf  # back to 0 at a good step
        self._counts = torch.stack([skipped + found_inf, streak, torch.maximum(longest, streak)])

    def counts(self, device: torch.device) -> torch.Tensor:
        """The three counts as a device tensor, to read with other values in one go."""
        return self._counts if self._counts is not None else torch.zeros(3, device=device)

    def reset(self) -> None:
        """After a read: the since-the-last-read counts start again; the streak goes on."""
        if self._counts is not None:
            streak = self._counts[1]
            self._counts = torch.stack([torch.zeros_like(streak), streak, streak])


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
