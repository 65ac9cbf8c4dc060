"""The memory planner: peak device memory of one training step, per component, predicted
with fake tensors, so nothing is allocated (GPT-2 XL on 8 GPUs is planned on a laptop).

How: the model is built on the meta device, and the trainer's own code then runs under
FakeTensorMode (tensors with shapes, dtypes and sizes but no storage): gpt.engine.parallel's
parallelize (activation checkpointing, FSDP2 sharding over a fake process group of the
planned world size, mixed precision, the optimizer) and gpt.engine.step's forward_backward. One
untracked step creates the optimizer state first, as it exists from the second step on;
then torch's memory tracker (FSDPMemTracker under FSDP, MemTracker otherwise) follows a
step of two micro-batches (so accumulated gradients count) and attributes every live byte
to a component. The plan is its snapshot at the peak.

What the fake run cannot see is added by rule, each one listed in the plan's
`assumptions`: DDP's and ZeRO-1's cross-rank layout (measured as one process, then
gradients held in DDP's buckets throughout, and the largest rank's share of ZeRO-1's
optimizer state), and the unfused optimizer's temporaries. A CUDA step is stood in for by
the CPU's (same shapes and dtypes, so the same bytes; fp16 is planned as bf16, its equal
in size). What it counts is what torch.cuda.max_memory_allocated counts; the CUDA context,
cuBLAS workspaces and the caching allocator's fragmentation are the margin that fits()
adds. The GPU acceptance run (python -m gpt.bench gpu) records each prediction beside
the measured peak."""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

import torch

from gpt.core.config import AUTO, Config, ConfigError
from gpt.core.config_check import grad_accum_steps
from gpt.model import loss_kernels, sizing
from gpt.optim import optimizer
from gpt.plan.memory_trace import CATEGORY, head_and_loss_peak, measure_step


GiB = 2**30
MiB = 2**20
# Total memory as torch reports it (torch.cuda.get_device_properties().total_memory) for a
# 24 GB RTX 4090, a 40 GB A100 and an 80 GB H100.
CAPACITIES = {"24GB": 24564 * MiB, "40GB": 40536 * MiB, "80GB": 81559 * MiB}
MARGIN = 1.05  # x the planned peak: fragmentation of the caching allocator
RESERVE = 1 * GiB  # + this: CUDA context, cuBLAS/cuDNN workspaces, NCCL buffers

COMPONENTS = ("parameters", "gathered parameters", "gradients", "optimizer state",
              "activations", "temporary buffers", "collective buffers")


_ALWAYS = ("eager: torch.compile's fused kernels usually hold fewer activations, so a "
           "compiled run needs at most this",
           "the CPU's kernels stand in for the GPU's: same shapes and dtypes, same bytes",
           "allocated bytes, as torch.cuda.max_memory_allocated counts them; fits() adds "
           f"x{MARGIN} + {RESERVE // GiB} GiB for the CUDA context, workspaces and "
           "fragmentation",
           "the training step only: the evaluations hold no gradients or backward "
           "activations, so they need less")

# Why an --fp8 step is planned as the same step without FP8, an upper bound: torchao's
# float8 linear keeps the same high-precision input for its backward pass as nn.Linear
# does (and the fp32 weight itself where autocast keeps a bf16 copy of it); its FP8 casts
# of the input, weight and output gradient are transient, one layer's at a time. The
# fake run does not convert: on a CPU torchao's float8 could only run emulated, whose
# high-precision temporaries a GPU never holds.
FP8_PLANNED = ("--fp8: planned as the step without FP8, an upper bound (its matmuls keep "
               "the same high-precision inputs for the backward pass; the FP8 casts are "
               "transient, one layer at a time)")


@dataclass(frozen=True)
class MemoryPlan:
    """A predicted per-device peak. components sum to peak_bytes; logits_and_loss_bytes
    is the part of activations and temporary buffers that the head, its 50k-wide logits
    and the cross-entropy hold at that moment."""

    peak_bytes: int
    components: dict[str, int]
    logits_and_loss_bytes: int
    setup: dict[str, Any]  # what was planned: model, batch, world size, mode, dtype, ...
    assumptions: tuple[str, ...] = field(default=_ALWAYS)

    def fits(self, capacity_bytes: int) -> bool:
        return self.peak_bytes * MARGIN + RESERVE <= capacity_bytes

    def to_json(self) -> dict[str, Any]:
        return {"peak_bytes": self.peak_bytes, "peak_gib": round(self.peak_bytes / GiB, 3),
                "components": dict(self.components),
                "logits_and_loss_bytes": self.logits_and_loss_bytes,
                "fits": {name: self.fits(cap) for name, cap in CAPACITIES.items()},
                "margin": {"factor": MARGIN, "reserve_bytes": RESERVE},
                "setup": dict(self.setup), "assumptions": list(self.assumptions)}

    def table(self) -> str:
        s = self.setup
        head = (f"{s['model']} ({s['params'] / 1e6:.0f}M parameters), --batch-size "
                f"{s['batch_size']} x --seq-len {s['seq_len']}, {s['dtype']}, --parallel "
                f"{s['parallel']} on {s['world_size']} device(s)"
                + (f", {s['activation_checkpointing']} activation checkpointing"
                   if s['activation_checkpointing'] != "none" else "")
                + (f", fp8 {s['fp8']} planned as its bf16 step" if s.get('fp8', 'none') != "none"
                   else ""))
        rows = [(name, b) for name, b in self.components.items() if b]
        lines = [head, f"  {'component':<30}{'GiB':>9}"]
        for name, b in rows:
            lines.append(f"  {name:<30}{b / GiB:>9.3f}")
        lines.append(f"  {'peak per device':<30}{self.peak_bytes / GiB:>9.3f}")
        lines.append(f"  of the activations and temporary buffers, the head's logits and the loss "
                     f"hold {self.logits_and_loss_bytes / GiB:.3f} GiB")
        if s.get("device_type", "cuda") == "cuda":  # the GPUs' sizes mean nothing elsewhere
            fits = ", ".join(f"{name}: {'fits' if self.fits(cap) else 'does not fit'}"
                             for name, cap in CAPACITIES.items())
            lines.append(f"  {fits} (with x{MARGIN} + {RESERVE // GiB} GiB of margin)")
        return "\n".join(lines)


# Tracing costs time per block (a tenth of a second and more each, growing with the
# depth); every block of a GPT holds the same, so a deeper model is traced at two depths
# of its own kind (its parity: the U-net pairs its blocks) and extrapolated block by block.
TRACED_LAYERS = 64
EXTRAPOLATED_FROM = (8, 16)


def plan(cfg: Config, world_size: int = 1, device_type: str = "cuda") -> MemoryPlan:
    """The predicted peak memory per device of training `cfg` on `world_size` devices of
    `device_type` (cuda, mps or cpu: which autocast dtype "auto" means)."""
    if AUTO in (cfg.train.parallel, cfg.train.activation_checkpointing, cfg.data.batch_size):
        raise ConfigError("the planner plans one concrete layout: settle --parallel, "
                          "--activation-checkpointing and --batch-size auto first "
                          "(gpt.plan.layout.settle)")
    # The trainer's own rules first: no plan for a batch it refuses, and an absurd model
    # is refused by arithmetic (gpt/model/sizing.py) before anything is traced
    accum = grad_accum_steps(cfg.data.total_batch_tokens, cfg.data.batch_size,
                             cfg.data.seq_len, world_size)
    sizing.check_fits(cfg, world_size, *sizing.most_memory(device_type, CAPACITIES.values()),
                      optimizer.chosen(cfg.optim).least_state_bytes)
    if cfg.model.n_layer > TRACED_LAYERS:
        return _extrapolated(cfg, world_size, device_type)
    # What the trainer would run on device_type (gpt.engine.parallel), pinned: the fake run is on
    # the CPU, where an unset --chunked-loss always means on
    chunked = cfg.train.chunked_loss_on(device_type)
    kernel = loss_kernels.resolve(cfg.train.loss_kernel, device_type) if chunked else None
    # inductor's fused loss over the whole logits cannot be traced eagerly: planned as the
    # chunked step plus the logits it holds (below)
    compiled_whole = not chunked and device_type == "cuda" and cfg.train.compile_on(device_type)
    # a library's Triton kernel cannot run on fake CPU tensors: planned as ours. FP8 is
    # planned as the step without it (see FP8_PLANNED below)
    fp8 = cfg.train.fp8
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, chunked_loss=chunked or compiled_whole, loss_kernel="ours", fp8="none",
        fp8_head=False))
    d, t = cfg.data, cfg.train
    dtype = _planned_dtype(t.dtype, device_type)
    fused = optimizer.want_fused(cfg.optim, device_type)
    if t.parallel == "fsdp" and dtype is torch.float16:
        fused = False  # as gpt.engine.parallel does: the sharded fp16 scaler needs the unfused AdamW
    fsdp = t.parallel == "fsdp"
    measured, params, groups = measure_step(cfg, world_size if fsdp else 1, dtype, min(accum, 2))
    components = {name: 0 for name in COMPONENTS}
    for category, b in measured.items():
        components[CATEGORY.get(category, "temporary buffers")] += b
    assumptions = list(_ALWAYS)
    whole_logits = 0
    if compiled_whole:
        whole_logits = d.batch_size * d.seq_len * cfg.model.vocab_size * dtype.itemsize
        components["activations"] += whole_logits
        assumptions.append(
            "compiled on CUDA without the chunked loss: inductor's fused cross-entropy holds "
            "the whole logits once, in the compute dtype, on top of the chunked step (an H200 "
            "at GPT-2 124M, micro-batch 64, measured 31.09 GB against 31.79 planned; "
            "benchmarks/gpu/README.md)")
    if t.dtype == "fp16" or dtype is torch.float16:
        assumptions.append("fp16 planned as bf16: the same bytes")
    if fp8 != "none":
        assumptions.append(FP8_PLANNED)
    if kernel not in (None, "ours"):
        assumptions.append("the library's loss kernel planned as ours (gpt/model/chunked_ce.py): "
                           "both hold a chunk of the logits, not the whole")
    if not fsdp and world_size > 1:
        _replicated_layout(components, params, groups, world_size, t.parallel, assumptions)
    peak = sum(components.values())
    if not fused:
        # The unfused AdamW's step makes about one temporary copy of the parameters it
        # updates; by then the activations are gone, so it only matters if it is larger.
        local = components["parameters"] + components["gradients"] + components["optimizer state"]
        step_peak = local + components["parameters"]
        assumptions.append("unfused AdamW: its step holds one temporary copy of the "
                           "parameters (the fused kernel holds none)")
        if step_peak > peak:
            components = {**{k: 0 for k in COMPONENTS},
                          "parameters": components["parameters"],
                          "gradients": components["gradients"],
                          "optimizer state": components["optimizer state"],
                          "temporary buffers": components["parameters"]}
            peak = step_peak
    head = min(head_and_loss_peak(cfg, dtype) + whole_logits,
               components["activations"] + components["temporary buffers"])
    setup = {"model": model_name(cfg), "params": _count(params),
             "n_layer": cfg.model.n_layer, "n_embd": cfg.model.n_embd,
             "batch_size": d.batch_size, "seq_len": d.seq_len, "grad_accum_steps": accum,
             "measured_micro_steps": min(accum, 2), "world_size": world_size,
             "parallel": t.parallel, "activation_checkpointing": t.activation_checkpointing,
             "dtype": str(dtype).removeprefix("torch."), "device_type": device_type,
             "fused_adamw": fused, "chunked_loss": chunked, "loss_kernel": kernel,
             "fsdp_param_dtype": t.fsdp_param_dtype if fsdp else None, "fp8": fp8}
    return MemoryPlan(int(peak), components, int(head), setup, tuple(assumptions))


def _extrapolated(cfg: Config, world_size: int, device_type: str) -> MemoryPlan:
    """The plan of a model deeper than TRACED_LAYERS: its plans at two depths, each
    component grown by the blocks beyond the deeper one at the rate between them (a
    step's memory is affine in the depth while the same moment of it peaks). The peak
    can only move to a moment that grows faster per block: the end of the backward pass,
    when every gradient is held at once, which is counted too."""
    n = cfg.model.n_layer
    lo, hi = (depth + n % 2 for depth in EXTRAPOLATED_FROM)
    a, b = (plan(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layer=depth)),
                 world_size, device_type) for depth in (lo, hi))

    def grow(x: int, y: int) -> int:
        return max(0, round(y + (y - x) * (n - hi) / (hi - lo)))

    components = {name: grow(a.components[name], b.components[name]) for name in COMPONENTS}
    held = ("parameters", "optimizer state", "gathered parameters", "collective buffers")
    end_of_backward = {name: components[name] for name in held}
    end_of_backward["gradients"] = max(components["gradients"], components["parameters"])
    if sum(end_of_backward.values()) > sum(components.values()):
        components = {name: end_of_backward.get(name, 0) for name in COMPONENTS}
    params = grow(a.setup["params"], b.setup["params"])
    setup = {**b.setup, "model": model_name(cfg), "params": params, "n_layer": n}
    assumptions = (*b.assumptions,
                   f"{n} blocks: traced at {lo} and {hi} and extrapolated block by block "
                   f"(every block holds the same; tracing each one costs seconds per hundred)")
    return MemoryPlan(sum(components.values()), components,
                      min(b.logits_and_loss_bytes,
                          components["activations"] + components["temporary buffers"]),
                      setup, assumptions)


class Progress:
    """What a search over plans is doing, on stderr while it runs long: a plan of a large
    model takes seconds (of a busy machine's, many more), and a search makes several.
    Told each candidate before it is planned; says the one being planned once the search
    has run FIRST_S, then again every EVERY_S: a short search says nothing, a long one is
    never silent for long (not even inside one slow plan, while it is open as a context:
    a thread of its own looks every POLL_S), and neither floods the terminal."""

    FIRST_S = 2.0
    EVERY_S = 5.0
    POLL_S = 0.5

    def __init__(self, what: str, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.stream, self.clock = what, stream, clock
        self.started = clock()
        self.last = self.started - (self.EVERY_S - self.FIRST_S)
        self.candidate: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def __call__(self, candidate: str) -> None:
        self.candidate = candidate
        self.tick()

    def tick(self) -> None:
        """Say the candidate being planned, if the time for a line has come."""
        with self._lock:
            now = self.clock()
            if self.candidate is None or now - self.last < self.EVERY_S:
                return
            self.last = now
            print(f"planning {self.what}: {self.candidate} ({now - self.started:.0f} s so far)",
                  file=self.stream or sys.stderr, flush=True)

    def __enter__(self) -> Progress:
        def watch() -> None:
            while not self._stop.wait(self.POLL_S):
                self.tick()

        self._watcher = threading.Thread(target=watch, name="planner-progress", daemon=True)
        self._watcher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()


Say = Callable[[str], None]


def quiet(candidate: str) -> None:
    """A search's progress, unsaid (tests, and searches whose caller says nothing)."""


def largest_batch(cfg: Config, capacity_bytes: int, world_size: int = 1,
                  device_type: str = "cuda", limit: int = 512,
                  progress: Say = quiet) -> tuple[int, MemoryPlan | None]:
    """The largest --batch-size whose plan fits capacity_bytes (0 and None if not even 1
    does). Peak memory is close to affine in the batch size: two plans give the line, and
    plans at its estimate and beside it settle the exact value. progress: told each
    batch size before it is planned (a Progress says it on stderr when the search is long)."""
    plans: dict[int, MemoryPlan] = {}

    d = cfg.data
    accumulates = d.total_batch_tokens > d.batch_size * d.seq_len * world_size

    def at(b: int) -> MemoryPlan:
        if b not in plans:  # with accumulation if the run has it (gradients are held then)
            progress(f"--batch-size {b}")
            tokens = b * d.seq_len * world_size * (2 if accumulates else 1)
            data = dataclasses.replace(d, batch_size=b, total_batch_tokens=tokens)
            plans[b] = plan(dataclasses.replace(cfg, data=data), world_size, device_type)
        return plans[b]

    if not at(1).fits(capacity_bytes):
        return 0, None
    slope = max(at(2).peak_bytes - at(1).peak_bytes, 1)
    room = (capacity_bytes - RESERVE) / MARGIN - at(1).peak_bytes
    b = max(1, min(limit, 1 + int(room // slope)))
    while b > 1 and not at(b).fits(capacity_bytes):
        b -= 1
    while b < limit and at(b + 1).fits(capacity_bytes):
        b += 1
    return b, at(b)


def _planned_dtype(requested: str, device_type: str) -> torch.dtype:
    if requested == "auto":
        return torch.bfloat16 if device_type in ("cuda", "mps") else torch.float32
    # fp16 holds the same bytes as bf16, and CPU autocast (the stand-in) has bf16
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.bfloat16}[requested]


def _replicated_layout(components: dict[str, int], params: list[torch.Tensor],
                       groups: list[list[int]], world_size: int, mode: str,
                       assumptions: list[str]) -> None:
    """Turn a one-process plan into one rank's of DDP or ZeRO-1 over world_size ranks."""
    # gradient_as_bucket_view: every gradient lives in DDP's buckets from the first step
    # on, so all of them are held at the peak, whichever were freed in one process.
    components["gradients"] = sum(p.numel() * 4 for p in params)
    assumptions.append("DDP: all gradients held in its all-reduce buckets throughout")
    if mode == "zero1":
        # ZeroRedundancyOptimizer gives each parameter, largest first, to the rank holding
        # the fewest elements so far; the largest share is the one that matters.
        loads = [0] * world_size
        for group in groups:  # its weight-decay groups, in turn
            for n in sorted(group, reverse=True):
                loads[loads.index(min(loads))] += n
        total = sum(loads)
        components["optimizer state"] = math.ceil(
            components["optimizer state"] * max(loads) / total)
        assumptions.append("ZeRO-1: the optimizer state of the rank given the most "
                           "parameters (largest first, to the least loaded rank)")


def _count(params: list[torch.Tensor]) -> int:
    return sum(p.numel() for p in params)


def model_name(cfg: Config) -> str:
    """The preset's name if the model is that preset's; the preset and what differs where
    only a few fields do ("tiny preset, block size 128"); else "custom" and its shape."""
    from gpt.core.config import model_preset
    m = cfg.model
    try:
        preset = model_preset(cfg.preset)
    except ConfigError:
        preset = None
    if preset == m:
        return cfg.preset
    shape = ("n_layer", "n_head", "n_embd")
    if preset is None or any(getattr(preset, f) != getattr(m, f) for f in shape):
        return f"custom: {m.n_layer} layers, {m.n_head} heads, {m.n_embd} wide"
    changed = [f.name for f in dataclasses.fields(m) if getattr(m, f.name) != getattr(preset, f.name)]
    words = [f.name.replace("_", " ") + ("" if getattr(m, f.name) is True else
                                        f" {getattr(m, f.name)}")
             for f in dataclasses.fields(m) if f.name in changed[:3]]
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return f"{cfg.preset} preset, {', '.join(words)}{more}"
