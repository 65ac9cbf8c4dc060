"""A sweep's plan, said as it starts, and its progress with an ETA (`model`).

At the start: how many cells the grid holds, which are skipped here and why, what the
precisions mean on this device (tf32 is a CUDA tensor-core mode; bf16 on a CPU runs its
matmuls with or without the CPU's bf16 instructions), and an estimate of the time: each
cell's warm-up and measured iterations costed by their FLOPs at the rate one timed
forward+backward pass of the first cell's model ran at here (a second or two; an eager
fp32 pass), compiling not included until a compiled cell has shown what it costs. Before
each cell: its place and the time left, the estimate corrected by how long the cells so
far really took against what it said of them (eager and compiled cells apart).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from gpt.bench.step.common import (Context, bench_model_config, build_model, cell_skip_reason,
                                   make_batch, make_step_fn, mode_flops_per_token)
from gpt.core.units import format_duration

CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo's names of bf16 instructions


@dataclass
class Cell:
    """One cell of the grid, as the plan sees it: its label, what it costs, whether it runs."""

    label: str
    size: str
    seq_len: int
    batch_size: int
    mode: str
    precision: str
    compiled: bool
    skip: str | None
    flops: float = 0.0  # of its warm-up and measured iterations


def cpu_bf16_instructions() -> bool | None:
    """Whether this CPU has bf16 instructions (Linux's /proc/cpuinfo); None where unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return any(flag in text.split() for flag in CPU_BF16_FLAGS)


def precision_notes(precisions: list[str], device: torch.device) -> list[str]:
    """What the asked precisions mean on this device, where it is not a GPU's."""
    if device.type == "cuda":
        return []
    notes = []
    if "tf32" in precisions:
        notes.append("tf32 is a CUDA tensor-core mode (fp32 inputs, 10-bit mantissa products): "
                     f"on {device.type} its cells would be the fp32 ones again, and are skipped")
    if "bf16" in precisions and device.type == "cpu":
        has = cpu_bf16_instructions()
        how = ("with this CPU's bf16 instructions" if has else
               "without bf16 instructions on this CPU (no avx512_bf16 or amx_bf16): its "
               "cells measure what emulating bf16 costs here, not a speed-up"
               if has is False else "with the CPU's bf16 instructions where it has them")
        notes.append(f"bf16 on a CPU is autocast to bfloat16 {how}")
    return notes


def timed_rate(ctx: Context, cell: Cell, vocab_size: int, arch: str) -> float:
    """FLOP/s of one forward+backward of `cell`'s model at its shape, eager fp32, after a
    warm-up pass (the model is built and dropped here)."""
    cfg = bench_model_config(cell.size, cell.seq_len, vocab_size, arch)
    torch.manual_seed(ctx.args.seed)
    model = build_model(cfg, ctx.device)
    x, y = make_batch(cell.batch_size, cell.seq_len, cfg.vocab_size, ctx.device, ctx.args.seed)
    fn = make_step_fn(model, "fwdbwd", ctx.device, None, x, y)
    fn()
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    started = time.perf_counter()
    fn()
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    seconds = time.perf_counter() - started
    flops = mode_flops_per_token(cfg, cell.seq_len, "fwdbwd") * cell.batch_size * cell.seq_len
    return flops / max(seconds, 1e-9)


@dataclass
class SweepProgress:
    """The sweep's cells, the rate they are costed at, and how long those done took."""

    cells: list[Cell]
    rate: float | None = None  # FLOP/s, timed at the start
    # seconds the cells done took, and what the rate said of them, by (compiled, precision)
    actual: dict[tuple[bool, str], float] = field(default_factory=dict)
    said: dict[tuple[bool, str], float] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    running: str | None = None  # the cell begun last: done when the next begins
    started: float | None = None  # when it began

    @property
    def runs(self) -> list[Cell]:
        return [c for c in self.cells if c.skip is None]

    def seconds(self, cell: Cell) -> float | None:
        """What the estimate says of a cell: its FLOPs at the rate, corrected by the cells
        done so far of its kind (compiled or not, and its precision: bf16 on a CPU without
        bf16 instructions runs at a fraction of fp32's rate), else of its compiling alone;
        None for a compiled cell before any was compiled."""
        if self.rate is None:
            return None
        base = cell.flops / self.rate
        for keys in ([(cell.compiled, cell.precision)],
                     [k for k in self.said if k[0] == cell.compiled]):
            said = sum(self.said.get(k, 0.0) for k in keys)
            if said > 0:
                return base * sum(self.actual.get(k, 0.0) for k in keys) / said
        return None if cell.compiled else base

    def left(self) -> tuple[float, int]:
        """(seconds the estimate gives the cells not done, compiled cells it cannot cost)."""
        total, unknown = 0.0, 0
        for cell in self.runs:
            if cell.label in self.done:
                continue
            s = self.seconds(cell)
            if s is None:
                unknown += 1
            else:
                total += s
        return total, unknown

    def eta_words(self) -> str:
        total, unknown = self.left()
        if self.rate is None:
            return "no estimate"
        out = f"about {format_duration(total)}"
        if unknown:
            out += f" + compiling {unknown} cell{'s' * (unknown > 1)} (costed once one is compiled)"
        return out

    def start_lines(self, command: str, rate_words: str) -> list[str]:
        runs = self.runs
        skipped = [c for c in self.cells if c.skip is not None]
        reasons = sorted({c.skip for c in skipped if c.skip})
        compiled = sum(c.compiled for c in runs)
        line = (f"[{command}] {len(self.cells)} cells: {len(runs)} to run"
                + (f" ({compiled} compiled)" if compiled else "")
                + (f", {len(skipped)} skipped here ({'; '.join(reasons)})" if skipped else "")
                + f"; {self.eta_words()}, {rate_words}")
        return [line]

    def before(self, label: str) -> str:
        """A cell begins (the one before it is done): its place and the time left, for
        its log line."""
        now = time.perf_counter()
        if self.running is not None:
            self.after(self.running, now)
        self.running, self.started = label, now
        runs = [c.label for c in self.runs]
        if label not in runs:
            return ""
        return f" (cell {runs.index(label) + 1} of {len(runs)}; left: {self.eta_words()})"

    def after(self, label: str, now: float) -> None:
        """A cell done at `now`: its time against what the estimate said of it."""
        cell = next((c for c in self.runs if c.label == label), None)
        if cell is None or self.started is None or self.rate is None:
            return
        self.done.add(label)
        key = (cell.compiled, cell.precision)
        self.actual[key] = self.actual.get(key, 0.0) + now - self.started
        self.said[key] = self.said.get(key, 0.0) + cell.flops / self.rate


def plan_sweep(ctx: Context, grid: list[tuple[Any, ...]], vocab_size: int, arch: str,
               label: Callable[..., str]) -> SweepProgress:
    """The sweep's plan: each (size, T, B, mode, precision, compiled, attention) cell, its
    skip reason and FLOPs, the rate timed on the first cell that runs; said on stderr."""
    if ctx.defaulted and ctx.device.type != "cuda":  # before the plan it shapes (not again)
        ctx.log(f"note: no CUDA device; using small defaults ({', '.join(ctx.defaulted)})")
        ctx.defaulted = []
    steps = ctx.args.warmup + ctx.args.steps
    cells = []
    for size, T, B, mode, precision, compiled, attention in grid:
        cfg = bench_model_config(size, T, vocab_size, arch)
        cells.append(Cell(label(size, T, B, mode, precision, compiled, attention), size, T, B,
                          mode, precision, compiled, cell_skip_reason(precision, ctx.device,
                                                                      compiled),
                          steps * mode_flops_per_token(cfg, T, mode) * B * T))
    progress = SweepProgress(cells)
    runs = progress.runs
    rate_words = "nothing to time"
    if runs:
        first = runs[0]
        try:
            progress.rate = timed_rate(ctx, first, vocab_size, arch)
            rate_words = (f"at the {progress.rate / 1e9:,.1f} GFLOP/s one eager fp32 "
                          f"forward+backward of {first.size} at {first.batch_size} x "
                          f"{first.seq_len} ran here")
        except (RuntimeError, MemoryError) as e:  # the cell itself will say what is wrong
            rate_words = f"untimed ({' '.join(str(e).split())[:80]})"
    for line in progress.start_lines(ctx.command, rate_words):
        ctx.log(line)
    for note in precision_notes(sorted({c.precision for c in cells}), ctx.device):
        ctx.log(f"note: {note}")
    return progress

