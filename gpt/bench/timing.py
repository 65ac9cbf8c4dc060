"""The one timing helper every benchmark uses, its statistics, peak memory and OOM guards.

Rules it enforces, so that numbers are right by construction:

- Warm-up iterations run first and are not in the statistics (the first call is the
  slowest: allocator growth, cuBLAS/cuDNN heuristics, torch.compile). Their times are
  kept, so the first call (compile included) can be reported on its own.
- The device is synchronised before the measured region, and every measured iteration is
  timed on the device: with CUDA events on CUDA (no host stall between iterations, as in
  training), with ``perf_counter`` around the call plus a synchronise on CPU and MPS.
- All samples are returned; the statistics are mean, std (sample, n - 1), median, min,
  max. Throughput is computed from the median.
- Peak memory over the measured region (gpt.report.flops.peak_memory): the CUDA allocator's
  ``max_memory_allocated``, or on CPU and MPS the process's peak RSS, reset just before
  where the OS allows it (Linux) and otherwise the peak since the process started; the
  result says which.
- On CUDA the host's time to enqueue one iteration (from an idle GPU) is measured too: if
  it is close to the GPU time, the GPU is waiting for the CPU (launch overhead, the
  usual trap with small models) and the result says so.
"""

from __future__ import annotations

import functools
import gc
import statistics
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
import torch._dynamo

from gpt.report.flops import peak_memory, reset_peak_memory
from gpt.runtime.device import is_oom, synchronize

from gpt.report.profiling import cuda_profiler_range, nvtx_range

# Host enqueue time / GPU time above which a result is flagged as launch-bound.
LAUNCH_BOUND_RATIO = 0.9


@dataclass(frozen=True)
class Stats:
    mean: float
    std: float
    median: float
    min: float
    max: float
    n: int

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def summarize(samples: list[float]) -> Stats:
    """Mean, sample standard deviation (0 for one sample), median, min, max."""
    if not samples:
        raise ValueError("no samples to summarise")
    std = statistics.stdev(samples) if len(samples) > 1 else 0.0
    return Stats(
        mean=statistics.fmean(samples),
        std=std,
        median=statistics.median(samples),
        min=min(samples),
        max=max(samples),
        n=len(samples),
    )


def compiled_warmup(warmup: int, compiled: bool) -> int:
    """Warm-up calls for a cell: at least one when compiled, since the first compiled call
    is the compilation and must never be measured."""
    return max(warmup, 1) if compiled else warmup


def compile_seconds(first_call_ms: float | None, steady_ms: float) -> float | None:
    """Compilation time: the first (compiling) call minus one steady-state call, in s."""
    if first_call_ms is None:
        return None
    return max(0.0, first_call_ms - steady_ms) / 1e3


@dataclass
class Timing:
    samples_ms: list[float]
    warmup_ms: list[float]
    method: str
    host_ms: float | None = None  # median host enqueue time from an idle GPU (CUDA only)
    peak_mem_bytes: int | None = None  # peak during the measured calls (see metrics.peak_memory)
    peak_mem_source: str | None = None  # what peak_mem_bytes measured
    stats: Stats = field(init=False)

    def __post_init__(self) -> None:
        self.stats = summarize(self.samples_ms)

    @property
    def first_call_ms(self) -> float | None:
        return self.warmup_ms[0] if self.warmup_ms else None

    @property
    def compile_s(self) -> float | None:
        """Of a compiled call: its compilation time (compile_seconds)."""
        return compile_seconds(self.first_call_ms, self.stats.median)

    @property
    def launch_bound(self) -> bool | None:
        if self.host_ms is None:
            return None
        return self.host_ms >= LAUNCH_BOUND_RATIO * self.stats.median

    def to_dict(self) -> dict[str, Any]:
        return {
            "ms": self.stats.to_dict(),
            "samples_ms": self.samples_ms,
            "warmup_ms": self.warmup_ms,
            "first_call_ms": self.first_call_ms,
            "timing_method": self.method,
            "host_ms": self.host_ms,
            "launch_bound": self.launch_bound,
            "peak_mem_bytes": self.peak_mem_bytes,
            "peak_mem_source": self.peak_mem_source,
        }


def bind_setup(fn: Callable[..., Any], setup: Callable[[], Any] | None) -> Callable[[], Any]:
    """``fn`` itself without ``setup``; else runs ``setup()`` now and returns ``fn`` bound to
    its result, so the setup's work stays outside the region where the call is timed.
    Dropping the returned callable drops the setup's result with it."""
    return fn if setup is None else functools.partial(fn, setup())


def time_fn(
    fn: Callable[[Any], Any] | Callable[[], Any],
    device: torch.device,
    *,
    warmup: int = 5,
    steps: int = 10,
    setup: Callable[[], Any] | None = None,
    nvtx: bool = False,
    profiler_range: bool = False,
    host_probe: int = 3,
) -> Timing:
    """Time ``fn`` on ``device``: ``warmup`` untimed-for-stats calls, then ``steps`` timed.

    ``setup``, if given, runs before every call outside the timed region and its return
    value is passed to ``fn`` (e.g. a forward pass whose backward ``fn`` times). ``fn``'s
    return value is dropped at once, so its memory is freed between iterations.
    ``nvtx`` wraps each measured call in a "step" range; ``profiler_range`` wraps the
    measured calls in cudaProfilerStart/Stop (for nsys --capture-range=cudaProfilerApi).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")

    use_events = device.type == "cuda"

    # Warm-up: each call synchronised and timed on the host, so the first call's cost
    # (compilation included) can be reported apart from the steady state.
    warmup_ms: list[float] = []
    for _ in range(warmup):
        call = bind_setup(fn, setup)
        synchronize(device)
        t0 = time.perf_counter()
        call()
        synchronize(device)
        warmup_ms.append((time.perf_counter() - t0) * 1e3)
        del call

    samples: list[float] = []
    if device.type != "cpu":
        gc.collect()  # cyclic garbage from warm-up may hold device memory: not in the peak
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection pause inside the measured region is noise, not model time
    try:
        synchronize(device)
        reset_peak_memory(device)
        with cuda_profiler_range(profiler_range):
            if use_events:
                events = []
                for _ in range(steps):
                    call = bind_setup(fn, setup)
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    with nvtx_range("step", nvtx):
                        start.record()
                        call()
                        end.record()
                    del call
                    events.append((start, end))
                torch.cuda.synchronize(device)
                samples = [s.elapsed_time(e) for s, e in events]
            else:
                for _ in range(steps):
                    call = bind_setup(fn, setup)
                    synchronize(device)
                    with nvtx_range("step", nvtx):
                        t0 = time.perf_counter()
                        call()
                        synchronize(device)
                        samples.append((time.perf_counter() - t0) * 1e3)
                    del call
    finally:
        if gc_was_enabled:
            gc.enable()
    peak, peak_source = peak_memory(device)

    host_ms = None
    if use_events and host_probe > 0:
        # Host time to enqueue one iteration, starting from an idle GPU. Measured in a
        # separate pass because in the pipelined loop above a full launch queue throttles
        # the host to the GPU's pace, which would hide the answer.
        host: list[float] = []
        for _ in range(host_probe):
            call = bind_setup(fn, setup)
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            call()
            host.append((time.perf_counter() - t0) * 1e3)
            del call
        torch.cuda.synchronize(device)
        host_ms = statistics.median(host)

    return Timing(samples_ms=samples, warmup_ms=warmup_ms,
                  method="cuda_events" if use_events else "perf_counter+synchronize",
                  host_ms=host_ms, peak_mem_bytes=peak, peak_mem_source=peak_source)


# --------------------------------------------------------------------------------------
# Memory


def allocated_memory(device: torch.device) -> int | None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return int(torch.cuda.memory_allocated(device))
    return None


def free_memory(device: torch.device, reset_compiler: bool = False,
                collect: bool = True) -> None:
    """Return cached memory after a cell (the cell's tensors must be unreferenced)."""
    if reset_compiler:
        reset_dynamo()
    if collect:
        gc.collect()  # tensors kept alive by reference cycles (tracebacks, graphs)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()


def reset_dynamo() -> None:
    """Forget compiled graphs: each compiled cell compiles afresh (honest compile times,
    and a sweep never hits dynamo's recompile limit and silently falls back to eager)."""
    torch._dynamo.reset()


# --------------------------------------------------------------------------------------
# Guarded cells: an OOM or an error in one configuration never ends the sweep


def _one_line(exc: BaseException, limit: int = 500) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_guarded(
    cell: Callable[[], dict[str, Any]],
    device: torch.device,
    *,
    classify: Callable[[BaseException], dict[str, Any] | None] | None = None,
    compiled: bool = False,
) -> dict[str, Any]:
    """Run one benchmark cell; return its result dict with a "status".

    ``cell`` returns its measurements (status "ok" is added). An OOM gives
    ``{"status": "oom", "error": ...}``; ``classify`` may turn other exceptions into a
    status of its own (e.g. an SDPA backend that cannot run a shape -> "unsupported");
    anything else is ``{"status": "error", "error": ...}``. Memory is freed afterwards
    either way. KeyboardInterrupt is not caught.
    """
    result: dict[str, Any]
    try:
        result = cell()
        result.setdefault("status", "ok")
    except Exception as exc:  # noqa: BLE001 - one cell's failure must not end the sweep
        if is_oom(exc):
            result = {"status": "oom", "error": _one_line(exc, 300)}
        else:
            special = classify(exc) if classify else None
            if special is not None:
                result = special
            else:
                result = {"status": "error", "error": _one_line(exc),
                          "traceback": traceback.format_exc(limit=6)}
    # Leaving the except block drops the traceback, and with it the frames that still
    # hold the cell's tensors; only now can their memory be returned. (A full collection
    # costs ~0.1 s; on a CPU after a clean cell there is no device memory to win back.)
    free_memory(device, reset_compiler=compiled,
                collect=compiled or result["status"] != "ok" or device.type != "cpu")
    return result

