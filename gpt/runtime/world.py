"""The world of ranks this process belongs to: one small Runtime (device, rank, world size)
passed to whoever needs it, the process group's start and end, and the collectives the
run uses (means, small objects), with one line when a peer is gone. Nothing here is
global."""

from __future__ import annotations

import gc
import os
import re
import sys
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from gpt.core.compat import set_tf32
from gpt.core.errors import UserError
from gpt.runtime.device import pick_device
from gpt.runtime.launch import (HOW_TO_LAUNCH, RendezvousError, check_launch_device,
                                launch_environment, restart_store_prefix, restart_store_warning,
                                wait_for_master)


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    distributed: bool = False  # a process group is up (torchrun), even with one process
    # A gloo group for small host-side decisions (stop now?): its collectives never wait
    # on the GPU stream, unlike NCCL's.
    control_group: Any = None

    @property
    def is_master(self) -> bool:
        return self.rank == 0

    @property
    def device_type(self) -> str:
        return self.device.type


def init_runtime(requested_device: str = "auto", timeout_s: float = 600.0) -> Runtime:
    """A plain single process, or one rank of a torchrun job (RANK/LOCAL_RANK/WORLD_SIZE).

    Under torchrun each rank drives the GPU of its LOCAL_RANK over NCCL, or the CPU over
    gloo. The collective timeout is bounded, so a dead or stuck peer ends the job with an
    error instead of hanging it forever.
    """
    launch = launch_environment(os.environ)
    if launch is None:
        return Runtime(device=pick_device(requested_device))
    rank, world_size, local_rank = launch.rank, launch.world_size, launch.local_rank
    device = pick_device(requested_device, local_rank)
    check_launch_device(device, launch)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=timeout_s)
    prefix = restart_store_prefix(os.environ)
    warning = restart_store_warning(os.environ)
    if warning and rank == 0:
        print(warning, file=sys.stderr)
    if rank == 0 and world_size > 1 and "TORCHELASTIC_RUN_ID" not in os.environ:
        print(f"note: not started by torchrun: waiting up to {timeout_s:g} s (--dist-timeout) "
              f"for the {world_size} ranks to meet at {launch.master}", file=sys.stderr)
    if rank != 0:
        wait_for_master(launch, timeout_s)
    try:
        if prefix is None:
            dist.init_process_group(backend=backend, timeout=timeout)
        else:
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                  world_size, is_master=False, timeout=timeout)
            dist.init_process_group(backend=backend, store=dist.PrefixStore(prefix, store),
                                    rank=rank, world_size=world_size, timeout=timeout)
    except (RuntimeError, ValueError) as e:  # torch's DistStoreError, DistNetworkError, ...
        raise RendezvousError(
            f"rank {rank} of {world_size} could not meet the others at {launch.master} within "
            f"{timeout_s:g} s (--dist-timeout): {torch_message(e)}; {HOW_TO_LAUNCH}") from None
    # Its own group even where training runs on gloo too: its votes then never queue
    # behind, or beside, the training collectives.
    control = dist.new_group(backend="gloo", timeout=timeout)
    return Runtime(device=device, rank=rank, local_rank=local_rank, world_size=world_size,
                   distributed=True, control_group=control)


class PeerLost(UserError):
    """A collective failed because another rank of the job stopped (or stalls); that
    rank's own error says why, so this one says only that much."""


# What gloo's TCP transport says when a peer's process is gone or stuck (plain RuntimeErrors);
# NCCL's failures are DistErrors.
_PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe",
              "socket closed", "read error", "timed out waiting")


def peer_lost(exc: BaseException, runtime: Runtime) -> PeerLost | None:
    """The one-line error for a collective that failed with another rank gone (gloo's
    "Connection closed by peer", NCCL's DistBackendError, a timeout), or None if `exc` is
    not that. torchrun stops the job when a rank exits; without this, each of the others
    would print torch's traceback beside the one line that says what went wrong."""
    if not runtime.distributed:
        return None
    if not isinstance(exc, dist.DistError) and not any(m in str(exc).lower() for m in _PEER_GONE):
        return None
    gist = torch_message(exc).split(". ")[0]  # gloo goes on with advice on reading logs
    return PeerLost(f"a collective failed ({gist}): another rank stopped or stalls, and its "
                    f"own error says why")


def torch_message(e: BaseException) -> str:
    """The gist of an error torch.distributed raised: its first line, without the C++
    source location gloo and c10d put in front."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return re.sub(r"^\[[^\]]*\]\s*", "", first)[:200].rstrip(". ")


def set_matmul_precision(runtime: Runtime, tf32: bool) -> None:
    if runtime.device_type == "cuda":
        set_tf32(tf32, tf32)


def shutdown(runtime: Runtime, clean: bool) -> None:
    """Tear the process group down. After a clean finish, wait for every rank first (rank 0
    may still be writing); after an error, do not: the peers may be gone.

    What holds the group from C++ (DDP's reducer, FSDP's state) must be gone first, the
    frames of an exception in flight included. Freed later, it would destroy the group while
    holding the GIL, and gloo's destructor then waits on worker threads that need the GIL
    to free their last tensors: the process hung at exit, or aborted during interpreter
    shutdown ("terminate called without an active exception"). Dropped here, the group dies
    in destroy_process_group, which releases the GIL."""
    if runtime.distributed and dist.is_initialized():
        exc = sys.exc_info()[1]
        while exc is not None:
            traceback.clear_frames(exc.__traceback__)
            exc = exc.__cause__ or exc.__context__
        gc.collect()
        if clean:
            dist.barrier()
        dist.destroy_process_group()


def gather_objects(obj: Any, runtime: Runtime) -> list[Any]:
    """Every rank's small picklable `obj`, in rank order (on every rank)."""
    if not runtime.distributed:
        return [obj]
    out: list[Any] = [None] * runtime.world_size
    dist.all_gather_object(out, obj, group=runtime.control_group)
    return out


def broadcast_object(obj: Any, runtime: Runtime) -> Any:
    """Rank 0's `obj` on every rank."""
    if not runtime.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=runtime.control_group)
    return box[0]


def all_reduce_mean(t: torch.Tensor, runtime: Runtime) -> torch.Tensor:
    """Mean of a tensor over ranks (identity in a single process)."""
    if runtime.distributed:
        t = t.detach().clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= runtime.world_size
    return t
