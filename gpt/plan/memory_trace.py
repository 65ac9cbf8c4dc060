"""The memory planner's measurement: the trainer's own step (parallelize, forward_backward)
run on fake tensors under torch's memory tracker, over a fake process group for FSDP, so
no byte is allocated; the bytes per tracker category at the step's peak, and the head and
loss's own peak. gpt/plan/memory.py turns these into a plan."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

import torch
import torch.distributed as dist

from gpt.core.config import Config, ConfigError
from gpt.runtime.world import Runtime


# torch's tracker categories (MemTracker's and FSDPMemTracker's) -> the plan's components
CATEGORY = {
    "PARAM": "parameters", "SHARDED_PARAM": "parameters", "BUFFER": "parameters",
    "UNSHARDED_PARAM": "gathered parameters",
    "GRAD": "gradients", "SHARDED_GRAD": "gradients", "UNSHARDED_GRAD": "gradients",
    "OPT": "optimizer state",
    "ACT": "activations", "INP": "activations",
    "TEMP": "temporary buffers",
    "ALL_GATHER": "collective buffers", "REDUCE_SCATTER": "collective buffers",
}


class _Batches:
    """Random token batches for forward_backward. Each one also tells the tracker a new
    forward pass starts (it refuses to see a module called twice otherwise)."""

    def __init__(self, batch: int, seq: int, vocab: int) -> None:
        self.shape, self.vocab, self.tracker = (batch, seq), vocab, None

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.tracker is not None:
            self.tracker.reset_mod_stats()
        x = torch.randint(0, self.vocab, self.shape)
        return x, torch.randint(0, self.vocab, self.shape)


@contextlib.contextmanager
def _fake_group(world_size: int) -> Iterator[Any]:
    """A process group of `world_size` fake ranks (its collectives do nothing), and its
    device mesh, built outside the fake-tensor mode (a mesh cannot be built inside)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"

    if dist.is_initialized():
        raise ConfigError("the memory planner plans FSDP on a fake process group of its own; "
                          "run it outside torchrun (one process)")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()


_TOTAL = "Total"  # the key of a tracker snapshot's sum over categories


class _StepPeak:
    """Put before torch's MemTracker or FSDPMemTracker in a class's bases: the tracker
    keeps the step's peak snapshot alone. torch's own update also keeps every module's
    peak, looping over all modules seen so far at every operator (GPT-2 XL: about 500
    modules x 50,000 operators, 80% of planning time); the plan reads the step's peak
    only. Where a torch release names its tracker's state otherwise, its own update runs."""

    def _update_peak_stats(self, peak_state: Any) -> None:
        current = getattr(self, "_curr_mem_snap", None)
        peak, snapshot = getattr(self, "_peak_mem", None), getattr(self, "_peak_mem_snap", None)
        if not (isinstance(current, dict) and isinstance(peak, dict) and isinstance(snapshot, dict)):
            super()._update_peak_stats(peak_state)  # type: ignore[misc]
            return
        for dev, now in current.items():
            if peak.get(dev, 0) < now[_TOTAL]:
                peak[dev] = now[_TOTAL]
                snapshot[dev] = dict(now)


def measure_step(cfg: Config, world_size: int, dtype: torch.dtype,
             micro_steps: int) -> tuple[dict[str, int], list[torch.Tensor], list[list[int]]]:
    """Bytes per tracker category at the peak of a `micro_steps` step, on one rank of
    `world_size` (FSDP) or one process; the model's (meta) parameters, and the sizes of
    those in each of the optimizer's groups."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    from gpt.engine import parallel
    from gpt.engine.step import forward_backward
    from gpt.model.transformer import GPT
    from gpt.optim.optimizer import chosen

    fsdp = cfg.train.parallel == "fsdp"
    with torch.device("meta"):
        model = GPT(cfg.model)
    params = [p.detach() for p in model.parameters()]  # meta: shapes only
    groups = [[p.numel() for p in g["params"]]
              for g in chosen(cfg.optim).param_groups(model, cfg.optim)]
    # The fused AdamW runs on fake tensors (the unfused one reads its step count on the
    # host); the unfused one's extra temporaries are added by plan(). Other optimizers run
    # as they are.
    train = dataclasses.replace(cfg.train, compile=False, device="cpu",
                                parallel="fsdp" if fsdp else "ddp")
    runtime = Runtime(device=torch.device("cpu"), world_size=world_size, distributed=fsdp)
    batches = _Batches(cfg.data.batch_size, cfg.data.seq_len, cfg.model.vocab_size)
    group = _fake_group(world_size) if fsdp else contextlib.nullcontext()
    with group as mesh, FakeTensorMode(allow_non_fake_inputs=True):
        optim = dataclasses.replace(cfg.optim, fused=True)
        par = parallel.parallelize(model, train, optim, runtime, dtype, mesh)

        def step(micro: int) -> torch.Tensor:
            _, norm = forward_backward(par.train_model, par.scaler, par.optimizer, batches,
                                       micro, 1.0, "cpu", dtype)
            return norm

        step(1)
        par.optimizer.step()  # creates the optimizer state (no skip check: nothing to read)
        if fsdp:
            tracker: Any = type("Tracker", (_StepPeak, FSDPMemTracker), {})(model, par.optimizer)
        else:
            tracker = type("Tracker", (_StepPeak, MemTracker), {})()
            tracker.track_external(model, par.optimizer)
        batches.tracker = tracker
        # The optimizer step itself stays outside: its peak is below the backward's (the
        # activations are gone), and on fake DTensors its bookkeeping inflates it.
        with tracker:
            step(micro_steps)
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return {_name(k): int(v) for k, v in peak.items() if k != "Total" and v}, params, groups


def head_and_loss_peak(cfg: Config, dtype: torch.dtype) -> int:
    """Peak bytes the final LayerNorm, the head and the cross-entropy hold over their
    forward and backward (the logits, in the autocast dtype and fp32, and their
    gradients), beyond the head's weight and its gradient."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from gpt.model.transformer import GPT
    from gpt.runtime.device import autocast

    with torch.device("meta"):
        head = GPT(dataclasses.replace(cfg.model, n_layer=0))
    head.chunked_loss = cfg.train.chunked_loss  # as gpt.engine.parallel sets it for the trainer
    B, T, C = cfg.data.batch_size, cfg.data.seq_len, cfg.model.n_embd
    with FakeTensorMode(allow_non_fake_inputs=True):
        head.to_empty(device="cpu")
        x = torch.empty(B, T, C, requires_grad=True)
        y = torch.zeros(B, T, dtype=torch.long)
        tracker = MemTracker()
        tracker.track_external(head)
        with tracker:
            with autocast("cpu", dtype):
                loss = head.loss(x, y)
            loss.backward()
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return sum(int(v) for k, v in peak.items()
               if k != "Total" and CATEGORY.get(_name(k)) in ("activations", "temporary buffers"))


def _name(category: Any) -> str:
    return str(getattr(category, "name", category)).split(".")[-1]
