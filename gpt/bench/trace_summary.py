"""Where a profiled step's GPU time goes, from a torch.profiler Chrome trace (what the
trainer's --torch-profile writes): the GPU's busy time against the span its kernels cover
(the gaps are launch and host time), each kind of kernel's share, and the top kernels.

    python -m gpt.bench.trace_summary TRACE.pt.trace.json      # prints the summary as JSON
    python -m gpt.bench.trace_summary TRACE --micro-batches-per-step 2

The figures are per micro-batch, and per step from those: the kernels a trace holds are
not its profiler steps' own. The GPU runs behind the host, so the kernels of the step
before the first traced one are still running when tracing starts (GPT-2 124M's H100 trace
of two steps of two micro-batches each holds five micro-batches' kernels, and dividing by
its steps made a 266 ms step look like 333). So the micro-batches are counted from the
kernels: those of the whole logits' loss, which runs once a micro-batch (MICRO_BATCH:
inductor's or eager's loss backward, the fused cross-entropy's forward kernels), the calls
of the one called most often. A step's figures are a micro-batch's times the micro-batches a
step (--micro-batches-per-step; the GPU acceptance reads it from the run); where no loss
kernel is found (a chunked loss, a CPU trace) they are per profiler step, as a trace
without them can only be read.

Kernels are told apart by name: matmuls (cuBLAS/CUTLASS GEMMs), attention (flash and
memory-efficient SDPA), collectives (NCCL), copies and fills (memcpy/memset events),
inductor's generated Triton kernels (`triton_`), and the rest. A trace with no GPU kernels
(a CPU run) is summarised from its outermost operators on each thread instead.
"""

from __future__ import annotations

import argparse
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
# Kernels that run once a micro-batch: the whole logits' loss backward (inductor names its fused kernel after the ops in it,
# ..._nll_loss_backward_nll_loss_forward_...; eager's is nll_loss_backward_reduce_cuda_kernel_2d;
# a CPU trace's operator NllLossBackward0), and gpt/model/fused_ce.py's forward kernels
MICRO_BATCH: tuple[re.Pattern[str], ...] = (re.compile(r"nll_?loss_?backward", re.I),
                                            re.compile(r"^_(lse|loss_grad)_kernel$"))


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


def micro_batches(events: list[dict[str, Any]]) -> tuple[int, str] | None:
    """How many micro-batches the kernels cover, and the kernel counted: the calls of the
    most called kernel that MICRO_BATCH names (one that ran once in all, a kernel of a
    scalar's, does not outvote the loss's own); None where there is none."""
    calls: dict[str, int] = {}
    for e in events:
        name = str(e.get("name", ""))
        if any(pattern.search(name) for pattern in MICRO_BATCH):
            calls[name] = calls.get(name, 0) + 1
    if not calls:
        return None
    name, n = max(calls.items(), key=lambda kv: kv[1])
    return n, name


def summarize(trace: dict[str, Any], steps: int | None = None,
              per_step: int | None = None) -> dict[str, Any]:
    """The summary of one Chrome trace (its parsed JSON). `steps`: how many training steps
    it covers (default: its distinct ProfilerStep#N ranges); `per_step`: the micro-batches a
    step, for per-step figures from the micro-batches counted (see the module's
    docstring)."""
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
    counted = micro_batches(gpu)
    # what each figure is divided by: micro-batches where they are counted, else steps
    per_micro = counted[0] if counted else None
    if per_micro is not None and per_step:
        step_div = per_micro / per_step  # the steps' worth of micro-batches the kernels cover
    elif per_micro is None:
        step_div = steps
    else:
        step_div = None  # counted, but a step's count unknown: per micro-batch only
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

    def ms(us: float, by: float | None) -> float | None:
        return round(us / 1e3 / by, 3) if by else None

    return {
        "device": device, "steps": steps,
        "micro_batches": per_micro, "micro_batches_counted_from": counted[1][:160] if counted else None,
        "micro_batches_per_step": per_step if per_micro else None,
        "per_step_from": ("micro-batches" if per_micro and per_step else
                          "profiler steps" if not per_micro else None),
        "gpu_span_ms_per_micro_batch": ms(span, per_micro),
        "gpu_busy_ms_per_micro_batch": ms(busy, per_micro),
        "gpu_span_ms_per_step": ms(span, step_div),
        "gpu_busy_ms_per_step": ms(busy, step_div),
        "busy_fraction": round(busy / span, 4) if span else None,
        "kernels": len(gpu),
        "kinds": {k: {"ms_per_micro_batch": ms(us, per_micro), "ms_per_step": ms(us, step_div),
                      "share": round(us / kernel_us, 4)}
                  for k, us in sorted(kinds.items(), key=lambda kv: -kv[1])},
        "top": [{"name": name[:160], "kind": k, "calls": len(d),
                 "ms_per_micro_batch": ms(sum(d), per_micro), "ms_per_step": ms(sum(d), step_div),
                 "share": round(sum(d) / kernel_us, 4)} for (name, k), d in top],
    }


def summarize_dir(folder: Path, per_step: int | None = None) -> dict[str, Any]:
    """The summary of the last trace the trainer wrote into `folder` (rank 0's); `per_step`:
    the run's micro-batches a step."""
    traces = sorted(folder.glob("rank0_step*.pt.trace.json"),
                    key=lambda p: int(re.search(r"step(\d+)", p.name).group(1)))  # type: ignore[union-attr]
    if not traces:
        raise ValueError(f"no torch profiler trace (rank0_step*.pt.trace.json) in {folder}")
    with open(traces[-1], encoding="utf-8") as f:
        return {"trace": traces[-1].name, **summarize(json.load(f), per_step=per_step)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpt.bench.trace_summary",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="a torch.profiler Chrome trace (*.pt.trace.json)")
    p.add_argument("--micro-batches-per-step", type=int, default=None, metavar="N",
                   help="the run's micro-batches a step (gradient accumulation), for per-step "
                        "figures from the micro-batches the kernels cover")
    args = p.parse_args(argv)
    if args.micro_batches_per_step is not None and args.micro_batches_per_step < 1:
        p.error("--micro-batches-per-step must be at least 1")
    try:
        with open(args.trace, encoding="utf-8") as f:
            trace = json.load(f)
    except (OSError, ValueError) as e:
        p.error(f"{args.trace}: {e}")
    print(json.dumps(summarize(trace, per_step=args.micro_batches_per_step), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
