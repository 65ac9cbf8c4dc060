"""How long a run should take on the device it is on, timed before it starts (the dry
run's and the run's "time:" line), and what its step adds to the process's memory.

The trainer's own step (gpt/engine/parallel.py's model, loss and optimizer, and
gpt/engine/step.py's forward_backward and optimizer_step) is timed on a slice of the
model small enough to take a fraction of a second: the micro-batch halved down to one
sequence, then the blocks (at most MAX_BLOCKS) to one, then the sequence halved (never
below 256 tokens), until one forward+backward costs at most BUDGET_FLOPS of the
device's; a model so wide that even that costs more than twice as much, or whose slice
would hold more than MEMORY_SHARE of the device's memory, is timed narrower (fewer
heads, then narrower ones: an 8192-wide block of 1.2B parameters, once 78 s and 21 GB to
time, is timed 512 wide). Several short passes are timed (at least MIN_PASSES where they
fit in HARD_LIMIT_S) and their median taken: on a busy machine one pass can take several
times as long as the next, and where the fastest and the slowest differ by more than
DISAGREE the estimate is said as a range. The slice's FLOP rate (gpt/report/flops.py's
count) is then taken as the whole model's: a micro-batch costs its FLOPs at that rate,
an optimizer step its slice's time scaled by the parameters, and validation a third of a
forward+backward per micro-batch (no backward pass). It runs eager, in one process: a
compiled run is usually faster; under torchrun rank 0 times its own share of the step
(the all-reduce between the ranks is not timed), and on a CPU whose cores the local
ranks' threads oversubscribe the time is scaled by how far. A run too short to be worth
timing (under MIN_FLOPS of training) is said to be so. The run compares its first steps
with the estimate and says when they differ by more than a factor (compare_steps).

Where the slice is the whole model and micro-batch (a small run on a CPU), the growth of
the process's resident memory over the timed passes is measured too: what the run's
step will add to it, the CPU allocator's keep included (the dry run's memory line).

The timing draws its inputs and weights from generators of its own (the run's seed is
untouched) and frees the slice before the run builds anything.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from gpt.core.config import Config, ModelConfig
from gpt.core.units import format_duration
from gpt.data.tokenizer import GPT2_VOCAB
from gpt.engine.parallel import parallelize
from gpt.engine.step import forward_backward, optimizer_step
from gpt.model import sizing
from gpt.model.transformer import GPT
from gpt.report.flops import flops_per_token, resident_memory
from gpt.runtime.device import reuse_freed_memory, synchronize
from gpt.runtime.world import Runtime


# One timed forward+backward costs at most this (0.4 s of a 2-core CPU at 100 GFLOP/s), or
# one block at MIN_SEQ tokens where even that costs more (GPT-2 124M: 72 GFLOP), up to
# WIDEN times it; on a GPU, one sequence of GPT-2 124M's whole model.
BUDGET_FLOPS = {"cuda": 2e12}
DEFAULT_BUDGET = 4e10
# and its logits at most this many values (a CPU: 1,024 tokens of GPT-2's, 0.2 GB): a thin
# model is bound by memory, not FLOPs (4 x 1,024 tokens 16 wide: 5.5 s for 20 GFLOP)
LOGITS_BUDGET = {"cuda": 16 * 1024 * 50304}
DEFAULT_LOGITS = 1024 * 50304
WIDEN = 2.0  # a slice may cost this many budgets before it is timed narrower
MEMORY_SHARE = 1 / 8  # of the device's memory (the host's on a CPU) a slice may hold
MIN_WIDTH = 64  # a slice is never narrower than this
MAX_BLOCKS = 12  # a block's kernels cost their launches, whatever its FLOPs (1,000 thin ones)
MIN_FLOPS = 2e11  # of training: seconds on a laptop's CPU, not worth a second of timing
MIN_SEQ = 256  # shorter passes run a CPU's matmuls at about 60% of the rate of longer ones
TIMED_PASSES = 5  # at most
MIN_PASSES = 3  # at least, where they fit in HARD_LIMIT_S
TIME_LIMIT_S = 1.0  # no pass begins once the passes have taken this long (after MIN_PASSES)
HARD_LIMIT_S = 3.0  # nor one that would end beyond this, at the passes' mean so far
DISAGREE = 1.5  # slowest / fastest pass beyond which the estimate is a range
DIFFERS = 2.0  # the run's steps against the estimate: a note beyond this factor either way
HOURS_MEANS_GPU = 3600.0  # a run this long on a CPU is a recipe meant for a GPU


@dataclass(frozen=True)
class Estimate:
    """A run's expected time: training and validation seconds, the tokens per second of
    training, and what it rests on (None for a run too short to time: `basis` says so);
    `spread`, training's seconds at the fastest and the slowest pass where they differ by
    more than DISAGREE; `step_s`, one optimizer step's seconds; `step_memory`, the bytes
    the timed step grew the process's resident memory by where it was the whole model
    and micro-batch on a CPU (or MPS), else None."""

    train_s: float | None
    val_s: float
    tokens_per_s: float | None
    basis: str
    spread: tuple[float, float] | None = None
    step_s: float | None = None
    step_memory: int | None = None

    @property
    def total_s(self) -> float | None:
        return None if self.train_s is None else self.train_s + self.val_s

    def meant_for_gpu(self, device_type: str) -> bool:
        """Whether the run takes hours on this CPU (or MPS): a recipe meant for a GPU."""
        return device_type != "cuda" and (self.total_s or 0.0) >= HOURS_MEANS_GPU

    def about(self) -> str:
        """The training time in words: "about 2m10s", with its range where the timed
        passes disagreed ("about 2m10s (1m30s to 4m05s)")."""
        if self.train_s is None:
            return "not timed"
        out = f"about {format_duration(self.train_s)}"
        if self.spread is not None:
            out += f" ({format_duration(self.spread[0])} to {format_duration(self.spread[1])})"
        return out

    def line(self, device: str, device_type: str) -> str:
        """The "time:" line: how long, on what, from what."""
        if self.train_s is None:
            return f"time: not timed on {device}: {self.basis}"
        val = (f" + {format_duration(self.val_s)} of validation" if self.val_s >= 1 else "")
        spread = ""
        if self.spread is not None:
            spread = (f"; the timed passes differed {self.spread[1] / self.spread[0]:.1f}x, as "
                      f"on a busy machine: the log's ETA follows the steps themselves")
        gpu = ("; hours on this machine: the recipe is meant for a GPU"
               if self.meant_for_gpu(device_type) else "")
        return (f"time: {self.about()} of training{val} on {device}, "
                f"{self.tokens_per_s:,.0f} tokens/s ({self.basis}{spread}); samples, other "
                f"evaluations and checkpoints come on top{gpu}")


@dataclass(frozen=True)
class Slice:
    """The part of the model and batch that is timed (n_embd and n_head: its width)."""

    n_layer: int
    batch_size: int
    seq_len: int
    n_embd: int | None = None  # the model's own where None
    n_head: int | None = None

    def model(self, m: ModelConfig) -> ModelConfig:
        return dataclasses.replace(m, n_layer=self.n_layer, n_embd=self.n_embd or m.n_embd,
                                   n_head=self.n_head or m.n_head)

    def whole(self, cfg: Config) -> bool:
        """Whether the slice is the run's whole model and micro-batch."""
        m, d = cfg.model, cfg.data
        return (self.model(m) == m
                and (self.batch_size, self.seq_len) == (d.batch_size, d.seq_len))

    def words(self, cfg: Config, passes: int) -> str:
        m = cfg.model
        sliced = self.model(m)
        what = ("the whole model" if self.n_layer == m.n_layer else
                f"{self.n_layer} of {m.n_layer} blocks with the embeddings and the head")
        if sliced.n_embd != m.n_embd:
            what += (f", {sliced.n_embd} wide ({sliced.n_head} heads) in place of "
                     f"{m.n_embd} ({m.n_head})")
        how = "" if self.whole(cfg) else ", scaled to the run's micro-batch by FLOPs"
        timed = ("1 forward+backward pass" if passes == 1 else
                 f"the median of {passes} forward+backward passes")
        return (f"{timed} of {what} timed at "
                f"{self.batch_size} x {self.seq_len} tokens{how}; eager, one process")


@dataclass
class Timing:
    """What time_slice measured: each forward+backward's seconds, one optimizer step's,
    the slice's parameters, and how much the passes grew the process's resident memory."""

    passes: list[float]
    update_s: float
    params: int
    memory_growth: int | None = None
    median_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.median_s = statistics.median(self.passes)


def run_steps(cfg: Config, start_step: int) -> tuple[int, int]:
    """The run's steps from where it starts (a resume's step) to where it stops
    (--max-steps, or --stop-at-step if sooner), and how many validations come in them
    (at the start, every --val-every steps and at the end, as the loop runs them)."""
    t, e = cfg.train, cfg.eval
    end = min(t.max_steps, cfg.checkpoint.stop_at_step or t.max_steps)
    steps = max(end - start_step, 0)
    if not e.val_every or not steps:
        return steps, 0
    v = e.val_every  # the multiples of it from start_step to end, and end itself
    return steps, end // v - (start_step - 1) // v + (end % v != 0)


def slice_flops(m: ModelConfig, s: Slice) -> float:
    """One forward+backward of the slice."""
    return flops_per_token(s.model(m), s.seq_len) * s.batch_size * s.seq_len


def slice_bytes(m: ModelConfig, s: Slice) -> int:
    """What timing the slice holds, about: fp32 weights, gradients and two optimizer
    moments (16 bytes a parameter), and fp32 activations (some 34 values a token a block
    of the width, and the logits with their gradient and softmax)."""
    sm = s.model(m)
    tokens = s.batch_size * s.seq_len
    return int(16 * sizing.param_count(sm)
               + 4 * tokens * (34 * sm.n_layer * sm.n_embd + 3 * sm.vocab_size))


def _narrower(s: Slice, m: ModelConfig) -> Slice | None:
    """The slice at half the width: half the heads where they halve, else heads half as
    wide (rotary needs an even head); None where it cannot narrow further."""
    width, heads = s.n_embd or m.n_embd, s.n_head or m.n_head
    if width // 2 < MIN_WIDTH:
        return None
    if heads % 2 == 0:
        return dataclasses.replace(s, n_embd=width // 2, n_head=heads // 2)
    head = width // heads
    if head % 2 or (m.rotary and (head // 2) % 2):
        return None
    return dataclasses.replace(s, n_embd=width // 2, n_head=heads)


def choose_slice(cfg: Config, device_type: str, capacity: int | None = None) -> Slice:
    """The largest part of a micro-batch whose forward+backward costs at most the
    device's budget (and whose logits fit its LOGITS_BUDGET): at most MAX_BLOCKS blocks,
    fewer sequences down to one, then fewer
    blocks down to one, then shorter sequences;
    then, where it still costs more than WIDEN budgets or holds more than MEMORY_SHARE of
    `capacity` (the device's memory, where known), narrower."""
    m, d = cfg.model, cfg.data
    budget = BUDGET_FLOPS.get(device_type, DEFAULT_BUDGET)

    def cost(s: Slice) -> float:
        return slice_flops(m, s)

    # value embeddings and U-net skips pair early blocks with late ones: all are kept
    paired = m.value_embeds or m.unet_skips
    s = Slice(m.n_layer if paired else min(m.n_layer, MAX_BLOCKS), d.batch_size, d.seq_len)
    logits = LOGITS_BUDGET.get(device_type, DEFAULT_LOGITS)
    while s.batch_size > 1 and (cost(s) > budget
                                or s.batch_size * s.seq_len * m.vocab_size > logits):
        s = dataclasses.replace(s, batch_size=max(1, s.batch_size // 2))
    if not paired:
        layers = s.n_layer
        while layers > 1 and cost(dataclasses.replace(s, n_layer=layers)) > budget:
            layers = max(1, layers // 2)
        s = dataclasses.replace(s, n_layer=layers)
    while s.seq_len > MIN_SEQ and cost(s) > budget:
        s = dataclasses.replace(s, seq_len=max(MIN_SEQ, s.seq_len // 2))
    limit = capacity * MEMORY_SHARE if capacity else None
    while cost(s) > WIDEN * budget or (limit is not None and slice_bytes(m, s) > limit):
        narrower = _narrower(s, m)
        if narrower is None:
            break
        s = narrower
    return s


class _RandomBatches:
    """Token ids drawn once from a generator of its own: the loader forward_backward reads."""

    def __init__(self, s: Slice, vocab: int, device: torch.device) -> None:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (s.batch_size, s.seq_len + 1), generator=g)
        self.x, self.y = ids[:, :-1].to(device), ids[:, 1:].to(device)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x, self.y


def more_passes(passes: list[float]) -> bool:
    """Whether to time another pass: up to TIMED_PASSES, at least MIN_PASSES where the
    next would end within HARD_LIMIT_S, more while TIME_LIMIT_S is not spent."""
    if len(passes) >= TIMED_PASSES:
        return False
    spent = sum(passes)
    if len(passes) < MIN_PASSES:
        return not passes or spent + spent / len(passes) <= HARD_LIMIT_S
    return spent < TIME_LIMIT_S


def time_slice(cfg: Config, s: Slice, device: torch.device, dtype: torch.dtype) -> Timing:
    """The slice's forward+backward passes timed (after a warm-up pass and update), one
    optimizer step over its parameters, its parameters, and (on a CPU or MPS) how much
    the process's resident memory grew from before the slice was built, with the
    trainer's step in one process."""
    sliced = dataclasses.replace(
        cfg, model=dataclasses.replace(s.model(cfg.model), dropout=0.0),
        train=dataclasses.replace(cfg.train, parallel="ddp", compile=False))
    if device.type == "cpu" and cfg.train.cpu_malloc_reuse:
        reuse_freed_memory()  # as the run does before it builds (about half a small step)
    before = resident_memory() if device.type != "cuda" else None
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        with torch.device("meta"):
            model = GPT(sliced.model)
        par = parallelize(model, sliced.train, sliced.optim, Runtime(device=device), dtype)
        batches = _RandomBatches(s, min(cfg.model.vocab_size, GPT2_VOCAB), device)
        norms: list[torch.Tensor] = []  # the last pass's gradient norm, for the update
        resident = [before or 0]  # after each pass and update: the allocator keeps a step's

        def forward_and_backward() -> None:
            norms[:] = [forward_backward(par.train_model, par.scaler, par.optimizer, batches, 1,
                                         cfg.optim.grad_clip, device.type, dtype)[1]]

        def update() -> None:
            optimizer_step(par.optimizer, par.scaler, cfg.optim.max_lr, norms[0])

        def timed(fn: Callable[[], None]) -> float:
            synchronize(device)
            started = time.perf_counter()
            fn()
            synchronize(device)
            took = time.perf_counter() - started
            if before is not None:
                resident.append(resident_memory())
            return took

        timed(forward_and_backward)  # warm-up: first-call allocations and dispatch
        timed(update)  # and the optimizer's state
        passes: list[float] = []
        while more_passes(passes):  # each followed by an update, as in a step: the memory the
            passes.append(timed(forward_and_backward))  # allocator keeps grows as the run's
            opt = timed(update)
        params = sum(p.numel() for p in model.parameters())
    growth = max(resident) - before if before is not None else None
    return Timing(passes, opt, params, growth)


def threads_scale(world: int, local: int, device_type: str) -> tuple[float, str]:
    """Under torchrun on a CPU: how much slower each rank runs than the one timed alone,
    where the local ranks' threads are more than the cores (1 otherwise), and why."""
    if device_type != "cpu" or local <= 1:
        return 1.0, ""
    threads, cores = torch.get_num_threads(), os.cpu_count() or 1
    scale = max(1.0, local * threads / cores)
    if scale == 1.0:
        return 1.0, ""
    return scale, (f", x{scale:.1f} for the {local} local processes' {local * threads} "
                   f"threads on {cores} cores")


def estimate(cfg: Config, device: torch.device, dtype: torch.dtype, accum: int,
             start_step: int = 0, val: bool = True, world: int = 1,
             local: int = 1) -> Estimate:
    """How long the run takes from `start_step` on `device`, timed on a slice (see the
    module docstring). val: whether the run validates (it has val shards). world, local:
    the run's processes, and those on this host; `accum` is each one's share."""
    m, d = cfg.model, cfg.data
    steps, vals = run_steps(cfg, start_step)
    vals = vals if val else 0
    micro_flops = flops_per_token(m, d.seq_len) * d.batch_size * d.seq_len
    total = steps * accum * micro_flops * world
    if not steps:
        return Estimate(None, 0.0, None, "nothing to train")
    if total < MIN_FLOPS:
        return Estimate(None, 0.0, None, f"a short run, {total / 1e12:.2f} TFLOP of training: "
                        f"not worth a second of timing")
    s = choose_slice(cfg, device.type, sizing.device_memory(device))
    try:
        t = time_slice(cfg, s, device, dtype)
    except Exception as e:  # noqa: BLE001 - out of memory, a kernel missing: the estimate
        # is advice, and the run's own build says what is wrong with the run itself
        return Estimate(None, 0.0, None, f"timing a slice failed ({' '.join(str(e).split())[:120]})")
    scale, oversubscribed = threads_scale(world, local, device.type)
    per_flop = scale / slice_flops(m, s)

    def step_seconds(pass_s: float) -> float:
        micro = pass_s * micro_flops * per_flop
        return accum * micro + t.update_s * scale * sizing.param_count(m) / max(t.params, 1)

    step_s = step_seconds(t.median_s)
    # a validation micro-batch is a forward alone: a third of a forward+backward's FLOPs
    val_s = vals * cfg.eval.val_steps * t.median_s * micro_flops * per_flop / 3
    spread = None
    if max(t.passes) > DISAGREE * min(t.passes):
        spread = (steps * step_seconds(min(t.passes)), steps * step_seconds(max(t.passes)))
    compiled = "; the run compiles its step, usually faster" if cfg.train.compile_on(
        device.type) else ""
    ranks = (f"; each of the {world} processes' share, their all-reduce not timed"
             f"{oversubscribed}" if world > 1 else "")
    memory = t.memory_growth if s.whole(cfg) else None
    return Estimate(steps * step_s, val_s, d.total_batch_tokens / step_s,
                    s.words(cfg, len(t.passes)) + compiled + ranks, spread, step_s, memory)


def compare_steps(expected_s: float, measured_s: float, steps_left: int) -> str | None:
    """The note when a run's steps take more than DIFFERS times (or less than 1/DIFFERS
    of) what the start's estimate timed, with the time left at the steps' pace; else None."""
    if expected_s <= 0 or measured_s <= 0:
        return None
    ratio = measured_s / expected_s
    if 1 / DIFFERS <= ratio <= DIFFERS:
        return None
    how = f"{ratio:.1f}x" if ratio > 1 else f"1/{1 / ratio:.1f}"
    return (f"the steps take {measured_s:.3g} s each, {how} of the {expected_s:.3g} s the "
            f"start's estimate timed: at this pace the {steps_left:,} steps left take about "
            f"{format_duration(steps_left * measured_s)} of training (the ETA on each log "
            f"line follows the steps)")
