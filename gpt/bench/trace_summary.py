"""Where a profiled step's GPU time goes, from a torch.profiler Chrome trace (what the
trainer's --torch-profile writes): the GPU's busy time against the span its kernels cover
(the gaps are launch and host time), each kind of kernel's share, and the top kernels.

    python -m gpt.bench.trace_summary TRACE.pt.trace.json      # prints the summary as JSON

Kernels are told apart by name: matmuls (cuBLAS/CUTLASS GEMMs), attention (flash and
memory-efficient SDPA), collectives (NCCL), copies and fills (memcpy/memset events),
inductor's generated Triton kernels (`triton_`), and the rest. A trace with no GPU kernels
(a CPU run) is summarised from its outermost operators on each thread instead.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

# The first kind whose pattern matches a kernel's name is its kind.
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("matmul", re.compile(r"gemm|cutlass|xmma|nvjet|sm\d+_.*mma|cublas|matmul|aten::(mm|addmm|bmm|linear)$",
                          re.I)),
    ("collective", re.compile(r"nccl", re.I)),
    ("triton", re.compile(r"^triton_", re.I)),
)
GPU_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "copy/fill", "gpu_memset": "copy/fill"}
TOP = 15


def kind(name: str, category: str) -> str:
    if GPU_CATEGORIES.get(category) == "copy/fill":
        return "copy/fill"
    return next((k for k, pattern in KINDS if pattern.search(name)), "other")


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Microseconds covered by the union of [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def outermost(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events not inside another on the same thread (a CPU trace's operators nest)."""
    out: list[dict[str, Any]] = []
    ends: dict[Any, float] = {}
    for e in sorted(events, key=lambda e: (str(e.get("tid")), float(e["ts"]), -float(e["dur"]))):
        end = float(e["ts"]) + float(e["dur"])
        if end <= ends.get(e.get("tid"), float("-inf")):
            continue
        ends[e.get("tid")] = end
        out.append(e)
    return out


def profiler_steps(events: list[dict[str, Any]]) -> int:
    """How many steps a trace covers: its distinct ProfilerStep#N ranges. A CUDA trace holds
    each twice or more, once on the CPU row (user_annotation) and again on every GPU stream
    that ran the step's kernels (gpu_user_annotation), so the ranges are not counted."""
    return len({str(e["name"]) for e in events
                if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")})


def summarize(trace: dict[str, Any], steps: int | None = None) -> dict[str, Any]:
    """The summary of one Chrome trace (its parsed JSON). `steps`: how many training steps
    it covers, to report per-step times (default: its distinct ProfilerStep#N ranges)."""
    timed = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("dur") is not None]
    gpu = [e for e in timed if e.get("cat") in GPU_CATEGORIES]
    device = "cuda" if gpu else "cpu"
    if not gpu:
        gpu = outermost([e for e in timed if e.get("cat") == "cpu_op"])
    if not gpu:
        raise ValueError("the trace holds neither GPU kernels nor CPU operators")
    if steps is None:
        steps = profiler_steps(trace["traceEvents"])
    steps = max(1, steps)
    intervals = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in gpu]
    span = max(b for _, b in intervals) - min(a for a, _ in intervals)
    busy = busy_us(intervals)
    kernel_us = sum(float(e["dur"]) for e in gpu)
    kinds: dict[str, float] = {}
    names: dict[tuple[str, str], list[float]] = {}  # (name, kind): durations
    for e in gpu:
        name = str(e.get("name", ""))
        k = kind(name, e["cat"])
        kinds[k] = kinds.get(k, 0.0) + float(e["dur"])
        names.setdefault((name, k), []).append(float(e["dur"]))
    top = sorted(names.items(), key=lambda kv: -sum(kv[1]))[:TOP]
    return {
        "device": device, "steps": steps,
        "gpu_span_ms_per_step": round(span / 1e3 / steps, 3),
        "gpu_busy_ms_per_step": round(busy / 1e3 / steps, 3),
        "busy_fraction": round(busy / span, 4) if span else None,
        "kernels": len(gpu),
        "kinds": {k: {"ms_per_step": round(us / 1e3 / steps, 3), "share": round(us / kernel_us, 4)}
                  for k, us in sorted(kinds.items(), key=lambda kv: -kv[1])},
        "top": [{"name": name[:160], "kind": k, "calls": len(d),
                 "ms_per_step": round(sum(d) / 1e3 / steps, 3),
                 "share": round(sum(d) / kernel_us, 4)} for (name, k), d in top],
    }


def summarize_dir(folder: Path) -> dict[str, Any]:
    """The summary of the last trace the trainer wrote into `folder` (rank 0's)."""
    traces = sorted(folder.glob("rank0_step*.pt.trace.json"),
                    key=lambda p: int(re.search(r"step(\d+)", p.name).group(1)))  # type: ignore[union-attr]
    if not traces:
        raise ValueError(f"no torch profiler trace (rank0_step*.pt.trace.json) in {folder}")
    with open(traces[-1], encoding="utf-8") as f:
        return {"trace": traces[-1].name, **summarize(json.load(f))}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m gpt.bench.trace_summary TRACE.pt.trace.json")
    with open(sys.argv[1], encoding="utf-8") as f:
        print(json.dumps(summarize(json.load(f)), indent=1))
