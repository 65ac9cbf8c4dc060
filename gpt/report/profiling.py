"""Profiling helpers shared by the benchmark suite (`python -m gpt.bench`) and the trainer.

Every helper takes an ``enabled`` flag and is a cheap no-op when it is off, so call sites
need no ``if``. Helpers that need CUDA (NVTX ranges, the CUDA profiler range, memory
snapshots) are also no-ops without a CUDA device; the memory snapshot says so once.

- ``nvtx_range(name, enabled)``: a named range on the Nsight Systems timeline.
- ``cuda_profiler_range(enabled)`` / ``CudaProfilerWindow``: cudaProfilerStart/Stop around
  the measured region, so ``nsys profile --capture-range=cudaProfilerApi`` (see
  launch/profile_nsys.sh) records the measured steps and not warm-up or compilation.
- ``MemorySnapshot(path, enabled)``: records the CUDA caching allocator's history and
  writes a snapshot for https://pytorch.org/memory_viz at the end (also after an OOM).
- ``TorchProfile(out_dir, enabled, wait, warmup, active)``: torch.profiler with a step
  schedule; each finished window is written as a Chrome trace (chrome://tracing or
  https://ui.perfetto.dev) plus a text table of the top operators. Works on CPU too.
- ``Profiler(cfg, runtime, start_step)``: the trainer's one object over all of these, as
  the ``--nvtx``/``--profile-*``/``--torch-profile``/``--memory-snapshot`` flags ask.
"""

from __future__ import annotations

import contextlib
import re
import sys
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any, Iterator

import torch

from gpt.core.config import ConfigError, ProfileConfig
from gpt.core.file_checks import FOLDER, REPLACED, entry_problem, folder_problem, free_bytes
from gpt.runtime.world import Runtime


__all__ = [
    "nvtx_available",
    "nvtx_range",
    "cuda_profiler_range",
    "cuda_profiler_start",
    "cuda_profiler_stop",
    "CudaProfilerWindow",
    "MemorySnapshot",
    "TorchProfile",
    "Profiler",
]

_NULL = contextlib.nullcontext()


def nvtx_available() -> bool:
    """NVTX ranges can be emitted (a CUDA build of torch with a visible GPU)."""
    return torch.cuda.is_available()


def _compiling() -> bool:
    # Inside a torch.compile'd region the ranges would break the graph and mean nothing
    # (kernels are fused across them), so they are dropped there.
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and compiler.is_compiling())


class _NvtxRange:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        torch.cuda.nvtx.range_push(self.name)

    def __exit__(self, *exc: object) -> None:
        torch.cuda.nvtx.range_pop()


def nvtx_range(name: str, enabled: bool = True) -> contextlib.AbstractContextManager[Any]:
    """``with nvtx_range("forward", enabled=args.nvtx): ...``

    A no-op (a shared nullcontext) when disabled, without CUDA, or while torch.compile is
    tracing. NVTX ranges are host-side markers: they cost about a microsecond and do not
    synchronise the device.
    """
    if not enabled or _compiling() or not nvtx_available():
        return _NULL
    return _NvtxRange(name)


def cuda_profiler_start(enabled: bool = True) -> bool:
    """cudaProfilerStart after draining queued work (so earlier kernels stay outside).

    Returns whether the range was started (False when disabled or without CUDA).
    """
    if not (enabled and torch.cuda.is_available()):
        return False
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    return True


def cuda_profiler_stop(enabled: bool = True) -> bool:
    """cudaProfilerStop after the queued work has run (so it is inside the range)."""
    if not (enabled and torch.cuda.is_available()):
        return False
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return True


@contextlib.contextmanager
def cuda_profiler_range(enabled: bool = True) -> Iterator[None]:
    """cudaProfilerStart/Stop around a block, e.g. the measured steps after warm-up.

    With ``nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop`` only
    this block is recorded. Note that ``stop`` ends the capture at the first range; use
    ``--capture-range-end=repeat`` to record every range of a sweep as its own report.
    """
    started = cuda_profiler_start(enabled)
    try:
        yield
    finally:
        if started:
            cuda_profiler_stop(True)


class CudaProfilerWindow:
    """A CUDA profiler range over training steps [start_step, start_step + num_steps).

    Call ``window.step(step)`` at the top of every step and ``window.close()`` at the end
    (or use it as a context manager): the range starts before ``start_step`` runs and
    stops before ``start_step + num_steps`` runs, so warm-up/compile steps stay outside.
    """

    def __init__(self, start_step: int, num_steps: int, enabled: bool = True) -> None:
        if start_step < 0 or num_steps < 1:
            raise ValueError(f"profiler window needs start_step >= 0 and num_steps >= 1, "
                             f"got {start_step}, {num_steps}")
        self.start_step = start_step
        self.stop_step = start_step + num_steps
        self.enabled = enabled and torch.cuda.is_available()
        self.active = False

    def step(self, step: int) -> None:
        if not self.enabled:
            return
        if not self.active and self.start_step <= step < self.stop_step:
            self.active = cuda_profiler_start(True)
        elif self.active and step >= self.stop_step:
            cuda_profiler_stop(True)
            self.active = False

    def close(self) -> None:
        if self.active:
            cuda_profiler_stop(True)
            self.active = False

    def __enter__(self) -> "CudaProfilerWindow":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MemorySnapshot:
    """Record the CUDA allocator's history; dump a snapshot for pytorch.org/memory_viz.

    ``with MemorySnapshot("mem.pickle", enabled=bool(args.memory_snapshot)): train()``

    Recording starts on ``__enter__`` (or ``start()``) and the snapshot is written on
    ``__exit__`` (or ``stop()``), also when the block raised (an OOM is exactly when the
    snapshot is wanted). ``dump()`` writes an extra snapshot mid-run. Without CUDA it
    prints one line saying no snapshot is written and does nothing else.
    Recording costs some host time per allocation; keep ``max_entries`` bounded.
    """

    def __init__(self, path: str | Path | None, enabled: bool = True, *,
                 max_entries: int = 100_000, stacks: str = "python") -> None:
        self.path = Path(path) if path else None
        self.enabled = bool(enabled and path)
        self.max_entries = max_entries
        self.stacks = stacks
        self.recording = False
        self.written: list[Path] = []

    def start(self) -> "MemorySnapshot":
        if not self.enabled or self.recording:
            return self
        if not torch.cuda.is_available():
            print(f"note: memory snapshot {self.path} not written: CUDA memory snapshots "
                  "need a CUDA device", file=sys.stderr)
            self.enabled = False
            return self
        torch.cuda.memory._record_memory_history(
            max_entries=self.max_entries, stacks=self.stacks  # type: ignore[arg-type]
        )
        self.recording = True
        return self

    def dump(self, path: str | Path | None = None) -> Path | None:
        """Write the snapshot recorded so far (to ``path`` or the configured path)."""
        if not self.recording:
            return None
        target = Path(path) if path else self.path
        assert target is not None
        target.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(target))
        self.written.append(target)
        print(f"wrote memory snapshot {target} (drag it onto https://pytorch.org/memory_viz)",
              file=sys.stderr)
        return target

    def stop(self) -> Path | None:
        if not self.recording:
            return None
        try:
            return self.dump()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
            self.recording = False

    def __enter__(self) -> "MemorySnapshot":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "trace"


class TorchProfile:
    """torch.profiler over a window of steps, written as Chrome traces.

    ::

        with TorchProfile("runs/x/profile", enabled=True, wait=5, warmup=2, active=3) as prof:
            for step in range(max_steps):
                train_step(...)
                prof.step()

    Steps ``[0, wait)`` are ignored, ``[wait, wait + warmup)`` warm the profiler up and
    ``[wait + warmup, wait + warmup + active)`` are recorded; ``repeat`` windows in all
    (0: until the loop ends). Each finished window writes
    ``<out_dir>/<name>_step<N>.pt.trace.json`` and ``<name>_step<N>.txt`` (the top
    operators). A loop that ends mid-window still writes what was recorded. CPU activity
    is always recorded, CUDA kernels when a GPU is present.
    """

    def __init__(self, out_dir: str | Path | None, enabled: bool = True, *, wait: int = 1,
                 warmup: int = 1, active: int = 3, repeat: int = 1, name: str = "trace",
                 record_shapes: bool = True, profile_memory: bool = False,
                 with_stack: bool = False, row_limit: int = 30) -> None:
        self.out_dir = Path(out_dir) if out_dir else None
        self.enabled = bool(enabled and out_dir)
        if min(wait, warmup) < 0 or active < 1 or repeat < 0:
            raise ValueError("TorchProfile needs wait >= 0, warmup >= 0, active >= 1, repeat >= 0")
        self.wait, self.warmup, self.active, self.repeat = wait, warmup, active, repeat
        self.name = _safe_name(name)
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.row_limit = row_limit
        self.traces: list[Path] = []
        self._prof: torch.profiler.profile | None = None

    def _on_ready(self, prof: torch.profiler.profile) -> None:
        assert self.out_dir is not None
        stem = f"{self.name}_step{prof.step_num}"
        trace = self.out_dir / f"{stem}.pt.trace.json"
        prof.export_chrome_trace(str(trace))
        self.traces.append(trace)
        sort_by = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        try:
            table = prof.key_averages().table(sort_by=sort_by, row_limit=self.row_limit)
        except (KeyError, RuntimeError, ValueError):  # an unknown sort key on some builds
            table = prof.key_averages().table(sort_by="self_cpu_time_total",
                                              row_limit=self.row_limit)
        (self.out_dir / f"{stem}.txt").write_text(table, encoding="utf-8")
        print(f"wrote torch profiler trace {trace} (open in https://ui.perfetto.dev)",
              file=sys.stderr)

    def start(self) -> "TorchProfile":
        if not self.enabled or self._prof is not None:
            return self
        assert self.out_dir is not None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=self.wait, warmup=self.warmup,
                                             active=self.active, repeat=self.repeat),
            on_trace_ready=self._on_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
        )
        with _one_trace_per_window():
            self._prof.__enter__()
        return self

    def step(self) -> None:
        """Mark the end of one step (call once per iteration)."""
        if self._prof is not None:
            with _one_trace_per_window():
                self._prof.step()

    def stop(self) -> None:
        if self._prof is not None:
            prof, self._prof = self._prof, None
            with _one_trace_per_window():
                prof.__exit__(None, None, None)

    def __enter__(self) -> "TorchProfile":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def _one_trace_per_window() -> Iterator[None]:
    """Some torch versions (2.11) warn, as each profiling window starts, that its events
    replace the previous window's and suggest acc_events=True. Each window is written as a
    trace of its own before the next starts, which is what is wanted here, so the advice
    would only mislead: that one warning is kept quiet."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events")
        yield


def check_profile_paths(cfg: ProfileConfig) -> None:
    """A ConfigError naming the flag where --torch-profile's folder or --memory-snapshot's
    file could not be written (a folder that cannot be made, a file in the way, a file
    system with no room such as /proc): asked before the run, which would otherwise stop
    at its profiled step. Writes nothing."""
    for flag, value, folder in (("--torch-profile", cfg.torch_profile, True),
                                ("--memory-snapshot", cfg.memory_snapshot, False)):
        if not value:
            continue
        path = Path(value)
        where = path if folder else path.parent
        found = folder_problem(where)
        problem = (f"{found[0]} {found[1]}" if found is not None else
                   entry_problem(path, FOLDER if folder else REPLACED))
        if problem is None and free_bytes(where) == 0:
            problem = ("its file system has no room (0 B free: a full disk, or one that holds "
                       "no files, such as /proc)")
        elif problem is not None and found is None:
            problem = f"{path} {problem}"
        if problem is not None:
            raise ConfigError(f"{flag} {value}: cannot write there: {problem}; name another "
                              f"{'folder' if folder else 'file'}")


class Profiler:
    """Everything the trainer's profiling flags ask for, behind one object:

        with Profiler(cfg.profile, runtime, start_step) as profiler:
            for step in ...:
                with profiler.step(step):
                    ...one optimizer step...

    Each step runs inside an NVTX range (--nvtx); the CUDA profiler window and the
    torch.profiler trace cover steps [profile_start, profile_start + profile_steps); the
    memory snapshot (rank 0) records from start to exit. Disabled parts cost nothing.
    """

    def __init__(self, cfg: ProfileConfig, runtime: Runtime, start_step: int) -> None:
        self.nvtx = cfg.nvtx
        steps = max(1, cfg.profile_steps)
        self._snapshot = MemorySnapshot(cfg.memory_snapshot,
                                        enabled=bool(cfg.memory_snapshot) and runtime.is_master)
        self._window = CudaProfilerWindow(cfg.profile_start, steps, enabled=cfg.profile_steps > 0)
        self._trace = TorchProfile(cfg.torch_profile, enabled=bool(cfg.torch_profile),
                                   wait=max(0, cfg.profile_start - start_step - 1), warmup=1,
                                   active=steps, name=f"rank{runtime.rank}")

    def __enter__(self) -> "Profiler":
        self._snapshot.start()
        self._trace.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._trace.stop()
        self._window.close()
        self._snapshot.stop()

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        self._window.step(step)
        with nvtx_range(f"step {step}", self.nvtx):
            yield
        self._trace.step()
