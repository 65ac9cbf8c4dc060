"""Where this process runs: device choice, precision support and the torchrun world.

Rank, device and world size live in one small Runtime object passed to whoever needs
them; nothing here is global.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from gpt.config import ConfigError


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_master(self) -> bool:
        return self.rank == 0

    @property
    def device_type(self) -> str:
        return self.device.type


def mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend and backend.is_available())


def pick_device(requested: str = "auto", local_rank: int = 0) -> torch.device:
    """cuda > mps > cpu for 'auto'; a forced device that is missing is a clear error."""
    if requested == "auto":
        if torch.cuda.is_available():
            requested = "cuda"
        elif mps_available():
            requested = "mps"
        else:
            requested = "cpu"
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is visible to torch (try --device auto)")
        return torch.device("cuda", local_rank)
    if requested == "mps" and not mps_available():
        raise ConfigError("--device mps: MPS is not available on this machine (try --device auto)")
    return torch.device(requested)


def init_runtime(requested_device: str = "auto", timeout_s: float = 600.0) -> Runtime:
    """Single process, or one rank of a torchrun job (RANK/LOCAL_RANK/WORLD_SIZE set).

    Under torchrun each rank drives the GPU of its LOCAL_RANK over NCCL, or the CPU over
    gloo. The collective timeout is bounded so a dead peer ends the job instead of
    hanging it forever.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return Runtime(device=pick_device(requested_device))
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(requested_device, local_rank)
    if device.type == "mps":
        raise ConfigError("--device mps: multi-process training needs CUDA (nccl) or CPU (gloo)")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return Runtime(device=device, rank=rank, local_rank=local_rank, world_size=world_size)


def shutdown(runtime: Runtime) -> None:
    if runtime.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor, runtime: Runtime) -> torch.Tensor:
    """Sum of a tensor over ranks, e.g. of correct/total counts (identity in one process)."""
    if runtime.world_size > 1:
        t = t.detach().clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_mean(t: torch.Tensor, runtime: Runtime) -> torch.Tensor:
    """Mean of a tensor over ranks (identity in a single process)."""
    if runtime.world_size > 1:
        t = t.detach().clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= runtime.world_size
    return t


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "mps":
        # MPS gained bf16 with macOS 14; older systems raise when asked for it.
        try:
            torch.ones(1, device=device, dtype=torch.bfloat16)
            return True
        except (RuntimeError, TypeError):
            return False
    return device.type == "cpu"


def resolve_dtype(requested: str, device: torch.device) -> torch.dtype:
    """The autocast dtype (torch.float32 means no autocast).

    auto: bf16 on CUDA (fp16 on GPUs without bf16, with a GradScaler) and on MPS where it
    has bf16; fp32 on CPU, where bf16 autocast is slower than fp32 on most processors.
    """
    if requested == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if bf16_supported(device) else torch.float16
        if device.type == "mps" and bf16_supported(device):
            return torch.bfloat16
        return torch.float32
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[requested]
    if dtype is torch.bfloat16 and not bf16_supported(device):
        raise ConfigError(f"--dtype bf16: {device} does not support bfloat16 (use fp16 or fp32)")
    if dtype is torch.float16 and device.type == "cpu":
        raise ConfigError("--dtype fp16: fp16 autocast needs a GPU; on CPU use bf16 or fp32")
    return dtype
