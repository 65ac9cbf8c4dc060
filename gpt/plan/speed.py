"""How long a run should take on the device it is on, timed before it starts (the dry
run's and the run's "time:" line).

The trainer's own step (gpt/engine/parallel.py's model, loss and optimizer, and
gpt/engine/step.py's forward_backward and optimizer_step) is timed on a slice of the
model small enough to take about a second: the micro-batch cut to one sequence,
then the blocks to one, then the sequence halved (never below 256 tokens), until one
forward+backward costs at most BUDGET_FLOPS of the device's. The slice's achieved FLOP
rate (gpt/report/flops.py's count) is then taken as the whole model's: a micro-batch
costs its FLOPs at that rate, an optimizer step its slice's time scaled by the
parameters, and validation a third of a forward+backward per micro-batch (no backward
pass). It runs eager, in one process: a compiled run is usually faster, and several
processes are not timed. A run too short to be worth timing (under MIN_FLOPS of
training) is said to be so.

The timing draws its inputs and weights from generators of its own (the run's seed is
untouched) and frees the slice before the run builds anything.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import torch

from gpt.core.config import Config
from gpt.core.units import format_duration
from gpt.data.tokenizer import GPT2_VOCAB
from gpt.engine.parallel import parallelize
from gpt.engine.step import forward_backward, optimizer_step
from gpt.model import sizing
from gpt.model.transformer import GPT
from gpt.report.flops import flops_per_token
from gpt.runtime.device import reuse_freed_memory, synchronize
from gpt.runtime.world import Runtime


# One timed forward+backward costs at most this (0.4 s of a 2-core CPU at 100 GFLOP/s), or
# one block at MIN_SEQ tokens where even that costs more (GPT-2 124M: 72 GFLOP); on a GPU,
# one sequence of GPT-2 124M's whole model.
BUDGET_FLOPS = {"cuda": 2e12}
DEFAULT_BUDGET = 4e10
MIN_FLOPS = 1e12  # of training: under a minute on a laptop's CPU, not worth timing
MIN_SEQ = 256  # shorter passes run a CPU's matmuls at about 60% of the rate of longer ones
TIMED_PASSES = 3  # at most: fewer once TIME_LIMIT_S is spent (a slow or busy machine)
TIME_LIMIT_S = 1.0
HOURS_MEANS_GPU = 3600.0  # a run this long on a CPU is a recipe meant for a GPU


@dataclass(frozen=True)
class Estimate:
    """A run's expected time: training and validation seconds, the tokens per second of
    training, and what it rests on (None for a run too short to time: `basis` says so)."""

    train_s: float | None
    val_s: float
    tokens_per_s: float | None
    basis: str

    @property
    def total_s(self) -> float | None:
        return None if self.train_s is None else self.train_s + self.val_s

    def meant_for_gpu(self, device_type: str) -> bool:
        """Whether the run takes hours on this CPU (or MPS): a recipe meant for a GPU."""
        return device_type != "cuda" and (self.total_s or 0.0) >= HOURS_MEANS_GPU

    def line(self, device: str, device_type: str) -> str:
        """The "time:" line: how long, on what, from what."""
        if self.train_s is None:
            return f"time: not timed on {device}: {self.basis}"
        val = (f" + {format_duration(self.val_s)} of validation" if self.val_s >= 1 else "")
        gpu = ("; hours on this machine: the recipe is meant for a GPU"
               if self.meant_for_gpu(device_type) else "")
        return (f"time: about {format_duration(self.train_s)} of training{val} on {device}, "
                f"{self.tokens_per_s:,.0f} tokens/s ({self.basis}); samples, other evaluations "
                f"and checkpoints come on top{gpu}")


@dataclass(frozen=True)
class Slice:
    """The part of the model and batch that is timed."""

    n_layer: int
    batch_size: int
    seq_len: int

    def words(self, cfg: Config, passes: int) -> str:
        m, d = cfg.model, cfg.data
        whole = (self.n_layer, self.batch_size, self.seq_len) == (m.n_layer, d.batch_size,
                                                                  d.seq_len)
        what = ("the whole model" if self.n_layer == m.n_layer else
                f"{self.n_layer} of {m.n_layer} blocks with the embeddings and the head")
        how = "" if whole else ", scaled to the run's micro-batch by FLOPs"
        timed = ("1 forward+backward pass" if passes == 1 else
                 f"the fastest of {passes} forward+backward passes")
        return (f"{timed} of {what} timed at "
                f"{self.batch_size} x {self.seq_len} tokens{how}; eager, one process")


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


def choose_slice(cfg: Config, device_type: str) -> Slice:
    """The largest part of a micro-batch whose forward+backward costs at most the
    device's budget: one sequence, then one block, then shorter sequences."""
    m, d = cfg.model, cfg.data
    budget = BUDGET_FLOPS.get(device_type, DEFAULT_BUDGET)

    def cost(s: Slice) -> float:
        return flops_per_token(dataclasses.replace(m, n_layer=s.n_layer), s.seq_len) \
            * s.batch_size * s.seq_len

    s = Slice(m.n_layer, d.batch_size, d.seq_len)
    if cost(s) > budget:
        s = dataclasses.replace(s, batch_size=1)
    # value embeddings and U-net skips pair early blocks with late ones: all are kept
    if cost(s) > budget and not (m.value_embeds or m.unet_skips):
        layers = s.n_layer
        while layers > 1 and cost(dataclasses.replace(s, n_layer=layers)) > budget:
            layers = max(1, layers // 2)
        s = dataclasses.replace(s, n_layer=layers)
    while s.seq_len > MIN_SEQ and cost(s) > budget:
        s = dataclasses.replace(s, seq_len=max(MIN_SEQ, s.seq_len // 2))
    return s


class _RandomBatches:
    """Token ids drawn once from a generator of its own: the loader forward_backward reads."""

    def __init__(self, s: Slice, vocab: int, device: torch.device) -> None:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (s.batch_size, s.seq_len + 1), generator=g)
        self.x, self.y = ids[:, :-1].to(device), ids[:, 1:].to(device)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x, self.y


def time_slice(cfg: Config, s: Slice, device: torch.device,
               dtype: torch.dtype) -> tuple[float, float, int, int]:
    """(seconds of one forward+backward of the slice (the fastest of the passes timed: the
    device's own speed, which other processes on a busy machine only lower),
    of one optimizer step over its parameters, its parameters, the passes timed), with
    the trainer's step in one process."""
    sliced = dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, n_layer=s.n_layer, dropout=0.0),
        train=dataclasses.replace(cfg.train, parallel="ddp", compile=False))
    if device.type == "cpu" and cfg.train.cpu_malloc_reuse:
        reuse_freed_memory()  # as the run does before it builds (about half a small step)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        with torch.device("meta"):
            model = GPT(sliced.model)
        par = parallelize(model, sliced.train, sliced.optim, Runtime(device=device), dtype)
        batches = _RandomBatches(s, min(cfg.model.vocab_size, GPT2_VOCAB), device)
        norms: list[torch.Tensor] = []  # the last pass's gradient norm, for the update

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
            return time.perf_counter() - started

        forward_and_backward()  # warm-up: first-call allocations and dispatch
        update()  # and the optimizer's state
        passes: list[float] = []
        while len(passes) < TIMED_PASSES and (not passes or sum(passes) < TIME_LIMIT_S):
            passes.append(timed(forward_and_backward))
        opt = timed(update)
        params = sum(p.numel() for p in model.parameters())
    return min(passes), opt, params, len(passes)


def estimate(cfg: Config, device: torch.device, dtype: torch.dtype, accum: int,
             start_step: int = 0, val: bool = True) -> Estimate:
    """How long the run takes from `start_step` on `device` (one process), timed on a
    slice (see the module docstring). val: whether the run validates (it has val shards)."""
    m, d = cfg.model, cfg.data
    steps, vals = run_steps(cfg, start_step)
    vals = vals if val else 0
    micro_flops = flops_per_token(m, d.seq_len) * d.batch_size * d.seq_len
    total = steps * accum * micro_flops
    if total < MIN_FLOPS:
        return Estimate(None, 0.0, None, f"a short run, {total / 1e12:.2f} TFLOP of training: "
                        f"not worth a second of timing")
    s = choose_slice(cfg, device.type)
    try:
        fb, opt, params, passes = time_slice(cfg, s, device, dtype)
    except Exception as e:  # noqa: BLE001 - out of memory, a kernel missing: the estimate
        # is advice, and the run's own build says what is wrong with the run itself
        return Estimate(None, 0.0, None, f"timing a slice failed ({' '.join(str(e).split())[:120]})")
    slice_flops = flops_per_token(dataclasses.replace(m, n_layer=s.n_layer), s.seq_len) \
        * s.batch_size * s.seq_len
    micro_s = fb * micro_flops / slice_flops
    step_s = accum * micro_s + opt * sizing.param_count(m) / max(params, 1)
    val_s = vals * cfg.eval.val_steps * micro_s / 3  # a forward is a third of the FLOPs
    compiled = "; the run compiles its step, usually faster" if cfg.train.compile_on(
        device.type) else ""
    return Estimate(steps * step_s, val_s, d.total_batch_tokens / step_s,
                    s.words(cfg, passes) + compiled)
