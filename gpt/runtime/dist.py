"""Where this process runs: device choice, precision support and the torchrun world.

Rank, device and world size live in one small Runtime object passed to whoever needs
them; nothing here is global.
"""

from __future__ import annotations

import ctypes
import gc
import os
import platform
import re
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.distributed as dist

from gpt.core.config import ConfigError
from gpt.core.errors import UserError


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


WORKER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")  # what torchrun sets for each worker
_HOW_TO_LAUNCH = ("start every rank with torchrun (torchrun --standalone --nproc_per_node=N "
                  "...), or unset RANK, WORLD_SIZE and LOCAL_RANK to run in one process")


class RendezvousError(UserError):
    """The ranks of a job could not meet; the message says where and how to launch."""


@dataclass(frozen=True)
class Launch:
    """A torchrun worker's place in the job, from its environment."""

    rank: int
    local_rank: int
    world_size: int
    host: str  # MASTER_ADDR and MASTER_PORT: where rank 0 hosts the store the ranks meet in
    port: int

    @property
    def master(self) -> str:
        return f"{self.host}:{self.port}"


def launch_environment(env: Mapping[str, str]) -> Launch | None:
    """This process's place in a torchrun job, or None for a single process (none of RANK,
    WORLD_SIZE, LOCAL_RANK set). Those variables without the rest of what torchrun sets
    (a shell or job script that exports them, a copied environment) are a ConfigError
    saying what is missing and how to launch, before torch.distributed fails on them."""
    present = [k for k in WORKER_VARS if k in env]
    if not present:
        return None
    given = ", ".join(f"{k}={env[k]}" for k in present)
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not env.get(k)]
    if missing:
        raise ConfigError(f"{given} set without {', '.join(missing)}: not a torchrun worker's "
                          f"environment; {_HOW_TO_LAUNCH}")
    numbers = {}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        value = env.get(key, "0")
        if not re.fullmatch(r"\s*\d+\s*", value):
            raise ConfigError(f"{key}={value!r} in the environment is not a number >= 0; "
                              f"{_HOW_TO_LAUNCH}")
        numbers[key] = int(value)
    rank, world_size, port = numbers["RANK"], numbers["WORLD_SIZE"], numbers["MASTER_PORT"]
    if not rank < world_size:
        raise ConfigError(f"RANK={rank} with WORLD_SIZE={world_size}: ranks go from 0 to "
                          f"WORLD_SIZE - 1; {_HOW_TO_LAUNCH}")
    if not 0 < port < 65536:
        raise ConfigError(f"MASTER_PORT={port} is not a TCP port (1..65535); {_HOW_TO_LAUNCH}")
    return Launch(rank, numbers["LOCAL_RANK"], world_size, env["MASTER_ADDR"].strip(), port)


def wait_for_master(launch: Launch, timeout_s: float) -> None:
    """Wait, up to timeout_s, until something listens at MASTER_ADDR:MASTER_PORT, else a
    RendezvousError. torch's own client retries there too, but logs a C++ stack trace to
    stderr at every retry; a plain connect that is closed at once says nothing, and the
    store does not count it as a rank."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((launch.host, launch.port),
                                          timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise RendezvousError(
                    f"rank {launch.rank} of {launch.world_size}: nothing listens at "
                    f"{launch.master} after {timeout_s:g} s (--dist-timeout; "
                    f"{e.strerror or e}), where rank 0 should be; {_HOW_TO_LAUNCH}") from None
            time.sleep(0.2)


def restart_store_prefix(env: Mapping[str, str]) -> str | None:
    """A key prefix that keeps one torchrun restart's rendezvous apart from the last one's.

    torchrun's agent hosts the TCPStore that workers meet in and, since torch 2.5, keeps the
    same store across `--max-restarts` restarts without prefixing the keys. A restarted
    worker can then read the address its dead predecessor published and connect to a port
    nobody listens on: gloo times out, NCCL fails to connect (pytorch issue #135712). With
    one agent (one node) every worker has the same TORCHELASTIC_RESTART_COUNT, so it
    names the attempt. Across nodes the agents count restarts separately, so there the
    prefix would split the world; launch/multi_node.sh sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    instead, which makes the agent hand each attempt a fresh store.
    """
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or env.get("GROUP_WORLD_SIZE", "1") != "1":
        return None
    if not env.get("MASTER_ADDR") or not env.get("MASTER_PORT"):
        return None
    return f"gpt2-trainer/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def restart_store_warning(env: Mapping[str, str]) -> str | None:
    """The advice a multi-node torchrun job with restarts needs, where the trainer cannot
    keep restarts apart itself (see restart_store_prefix)."""
    shared = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    restarts = int(env.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    if shared and restarts > 0 and env.get("GROUP_WORLD_SIZE", "1") != "1":
        return ("warning: torchrun --max-restarts across nodes reuses one rendezvous store, and a "
                "restarted worker can hang connecting to the address of the one it replaces "
                "(pytorch issue #135712); set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torchrun's "
                "environment on every node (launch/multi_node.sh does)")
    return None


def check_launch_device(device: torch.device, launch: Launch | None) -> None:
    """A device a torchrun worker can join a process group from: CUDA (nccl) or the CPU
    (gloo); MPS has no backend."""
    if launch is not None and device.type == "mps":
        raise ConfigError("--device mps: multi-process training needs CUDA (nccl) or CPU (gloo)")


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
            f"{timeout_s:g} s (--dist-timeout): {torch_message(e)}; {_HOW_TO_LAUNCH}") from None
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
        # TF32 runs fp32 matmuls on tensor cores (10-bit mantissa inputs, fp32 accumulate).
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32


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


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU), before reading a host clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def cpu_name() -> str:
    """The processor's model name (from /proc/cpuinfo on Linux), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                name = line.split(":", 1)[1].strip()
                if name:
                    return name
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                                 capture_output=True, text=True, timeout=5)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return f"Apple MPS ({cpu_name()})"
    return cpu_name()


def bf16_supported(device: torch.device) -> bool:
    """bf16 in hardware: Ampere (8.0) or newer on CUDA, ROCm, CPU autocast, recent MPS."""
    if device.type == "cuda":
        if torch.version.hip:
            return True
        # Native bf16 tensor cores arrived with Ampere (compute capability 8.0); older GPUs
        # report bf16 "supported" through slow emulation, where fp16 is the right choice.
        return torch.cuda.get_device_capability(device)[0] >= 8
    if device.type == "mps":
        # MPS gained bf16 with macOS 14; older systems raise when asked for it.
        try:
            torch.ones(1, device=device, dtype=torch.bfloat16)
            return True
        except (RuntimeError, TypeError):
            return False
    return device.type == "cpu"


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def autocast(device_type: str, dtype: torch.dtype) -> torch.autocast:
    """Autocast to `dtype` on the device; switched off for fp32, the weights' own dtype."""
    return torch.autocast(device_type, dtype=dtype, enabled=dtype != torch.float32)


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
    dtype = DTYPES[requested]
    if dtype is torch.bfloat16 and not bf16_supported(device):
        raise ConfigError(f"--dtype bf16: {device} does not support bfloat16 (use fp16 or fp32)")
    if dtype is torch.float16 and device.type == "cpu":
        raise ConfigError("--dtype fp16: fp16 autocast needs a GPU; on CPU use bf16 or fp32")
    return dtype


_OOM_MARKERS = ("out of memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed",
                "cuda_error_out_of_memory", "can't allocate memory")  # the last: the CPU allocator


def is_oom(exc: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError, or an error (or its cause) that reports running out of
    memory (the CPU allocator, MPS, cuBLAS/cuDNN workspaces, OOMs wrapped by torch.compile)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, torch.cuda.OutOfMemoryError):
            return True
        if isinstance(e, (RuntimeError, MemoryError)):
            text = str(e).lower()
            if isinstance(e, MemoryError) or any(m in text for m in _OOM_MARKERS):
                return True
        e = e.__cause__ or e.__context__
    return False


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_KEEP_BYTES = 1 << 30


def reuse_freed_memory() -> bool:
    """Make glibc keep freed blocks of up to 1 GiB for reuse. By default it serves each block
    above a few MB with a fresh mmap and unmaps it when freed, so on a CPU every step pays
    for the kernel zeroing and mapping the logits and activations again: about half of a
    small model's step (benchmarks/cpu_malloc.md). Returns whether it took effect (glibc
    only; elsewhere a no-op)."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, Windows, musl builds without it)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES))
