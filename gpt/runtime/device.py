"""The device this process computes on: which one (cuda > mps > cpu), its name, the
precision it supports and autocast to it, out-of-memory errors, and the CPU allocator's
setting that keeps freed memory for reuse."""

from __future__ import annotations

import ctypes
import platform
import subprocess
import sys
from pathlib import Path

import torch

from gpt.core.config import ConfigError


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
