"""What the timing subcommands (model, components, attention, ladder, compile) share:
precision modes, model construction, inputs, the training-step functions, FLOP counts per
mode, and the run context (Context: device, defaults, compiling, guarded cells, the sweep
and its outputs)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
import torch.nn as nn

from gpt.bench import report
from gpt.bench.args import DeviceDefault, shown
from gpt.bench.record import write_outputs
from gpt.bench.step.naive import use_naive_attention
from gpt.bench.timing import Timing, bind_setup, reset_dynamo, run_guarded, time_fn
from gpt.core.compat import set_tf32, tf32_switches
from gpt.core.config import PRESETS, ConfigError, ModelConfig, model_preset
from gpt.data.tokenizer import GPT2_VOCAB
from gpt.model.transformer import GPT
from gpt.report.flops import flops_per_token, mfu, peak_tflops
from gpt.report.profiling import MemorySnapshot, TorchProfile, nvtx_range
from gpt.runtime.device import bf16_supported, pick_device
from gpt.runtime.device import autocast as _autocast

# --------------------------------------------------------------------------------------
# Precision

PRECISIONS = ("fp32", "tf32", "bf16")


@dataclass(frozen=True)
class Precision:
    """fp32: plain fp32, TF32 off. tf32: fp32 tensors, TF32 tensor-core matmuls (CUDA).
    bf16: bf16 autocast with TF32 on for what stays fp32 (the trainer's setting)."""

    name: str
    tf32: bool
    autocast: torch.dtype | None


PRECISION = {
    "fp32": Precision("fp32", False, None),
    "tf32": Precision("tf32", True, None),
    "bf16": Precision("bf16", True, torch.bfloat16),
}


def precision_skip_reason(name: str, device: torch.device) -> str | None:
    if name == "tf32" and device.type != "cuda":
        return "tf32 needs CUDA (on this device it would be the fp32 run again)"
    if name == "bf16" and not bf16_supported(device):
        what = (torch.cuda.get_device_name(device) if device.type == "cuda" else str(device))
        return f"bf16 not supported in hardware on {what}"
    return None


@contextlib.contextmanager
def tf32_mode(enabled: bool, device: torch.device) -> Iterator[None]:
    """Set TF32 for matmuls and cuDNN (CUDA) for the block; restore the old flags after."""
    if device.type != "cuda":
        yield
        return
    old = tf32_switches()
    set_tf32(enabled, enabled)
    try:
        yield
    finally:
        set_tf32(*old)


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    """gpt.runtime.device.autocast, with None meaning no autocast (as fp32 does)."""
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return _autocast(device.type, dtype)


def compile_skip_reason(device: torch.device) -> str | None:
    """Why torch.compile cannot run here, when that is known without trying."""
    if not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    try:
        from torch._dynamo.eval_frame import is_dynamo_supported

        if not is_dynamo_supported():
            return f"torch.compile is not supported on Python {sys.version.split()[0]} by torch {torch.__version__}"
    except ImportError:
        pass
    if device.type == "cuda" and not torch.version.hip and importlib.util.find_spec("triton") is None:
        return "torch.compile on CUDA needs triton (pip install triton)"
    return None


def cell_skip_reason(precision: str, device: torch.device, compiled: bool) -> str | None:
    """Why a (precision, compile) cell cannot run here: the precision's reason first, then
    torch.compile's (asked only for a compiled cell)."""
    skip = precision_skip_reason(precision, device)
    if skip is None and compiled:
        skip = compile_skip_reason(device)
    return skip


# --------------------------------------------------------------------------------------
# Models and inputs

SIZE_GROUPS = {
    # GPT-2's four sizes and the 2.7B benchmark size (small/medium/... are aliases)
    "all": ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "2.7B"],
}


def expand_sizes(names: Sequence[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        for n in SIZE_GROUPS.get(name, [name]):
            if n not in PRESETS:
                raise ConfigError(f"--sizes {n!r} is not a preset; choose from "
                                 f"{', '.join([*PRESETS, *SIZE_GROUPS])}")
            if n not in out:
                out.append(n)
    return out


# --arch: the block GPT-2 has, or the speedrun-era one (configs/gpt2-124m-speedrun.toml's)
ARCHS: dict[str, dict[str, Any]] = {
    "gpt2": {},
    "speedrun": {"rotary": True, "rmsnorm": True, "qk_norm": True, "relu2": True,
                 "untied_head": True, "zero_init_proj": True, "logit_softcap": 15.0},
}


def bench_model_config(size: str, seq_len: int, vocab_size: int = 50304,
                       arch: str = "gpt2") -> ModelConfig:
    """The preset at this context length (block_size grows past 1024 when asked to)."""
    return model_preset(size, block_size=max(1024, seq_len), vocab_size=vocab_size, **ARCHS[arch])


def build_model(cfg: ModelConfig, device: torch.device, attention: str = "sdpa",
                nvtx: bool = False) -> GPT:
    """A GPT built directly on the device (initialising 2.7B parameters on a CPU is slow)."""
    with torch.device(device):
        model = GPT(cfg)
    if attention == "naive":
        use_naive_attention(model, nvtx=nvtx)
    elif attention != "sdpa":
        raise ValueError(f"unknown attention {attention!r} (naive or sdpa)")
    model.train()
    return model


def make_batch(batch_size: int, seq_len: int, vocab_size: int, device: torch.device,
               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and targets (never zeros: real data does not look like that)."""
    gen = torch.Generator().manual_seed(seed)
    high = min(vocab_size, GPT2_VOCAB)
    x = torch.randint(0, high, (batch_size, seq_len), generator=gen)
    y = torch.randint(0, high, (batch_size, seq_len), generator=gen)
    return x.to(device), y.to(device)


MODES = ("fwd", "fwdbwd", "step")


def mode_flops_per_token(cfg: ModelConfig, seq_len: int, mode: str) -> float:
    """Model FLOPs per token for a timed mode: the training count (gpt.report.flops.
    flops_per_token: 6N + 12 L d T) for forward+backward and a full step, a third of it
    (2N + 4 L d T) for the forward alone."""
    full = flops_per_token(cfg, seq_len)
    return full / 3.0 if mode == "fwd" else full


def make_step_fn(
    model: nn.Module,
    mode: str,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    params_model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    grad_clip: float = 1.0,
    scaler: torch.amp.GradScaler | None = None,
    nvtx: bool = False,
) -> Callable[[], Any]:
    """The function a model benchmark times: forward, forward+backward, or the trainer's
    full step (zero grads, forward under autocast, backward, clip, optimizer step).

    ``model`` is what is called (maybe compiled); ``params_model`` the module that owns
    the parameters (the uncompiled model).
    """
    owner = params_model if params_model is not None else model

    def forward() -> torch.Tensor:
        with nvtx_range("forward", nvtx), autocast(device, autocast_dtype):
            _, loss = model(x, y)
        return loss

    if mode == "fwd":
        return forward

    def fwdbwd() -> None:
        owner.zero_grad(set_to_none=True)
        loss = forward()
        with nvtx_range("backward", nvtx):
            loss.backward()

    if mode == "fwdbwd":
        return fwdbwd
    if mode != "step":
        raise ValueError(f"unknown mode {mode!r}")
    if optimizer is None:
        raise ValueError("mode 'step' needs an optimizer")
    params = [p for p in owner.parameters() if p.requires_grad]

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = forward()
        with nvtx_range("backward", nvtx):
            (scaler.scale(loss) if scaler is not None else loss).backward()
        with nvtx_range("optimizer", nvtx):
            if scaler is not None:
                scaler.unscale_(optimizer)
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()

    return step


# --------------------------------------------------------------------------------------
# Run context: a timing subcommand's flags (gpt.bench.args), device, cells and outputs


@dataclass
class Context:
    """What a subcommand needs: parsed args, device, MFU peak, the run record, outputs."""

    command: str
    args: argparse.Namespace
    argv: list[str]
    device: torch.device
    peak: float | None = None
    peak_source: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    quiet: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # more top-level JSON fields
    defaulted: list[str] = field(default_factory=list)  # "--flag value": a device's default
    progress: Any = None  # a sweep's plan (gpt.bench.step.sweep_plan): each cell's place, the ETA

    @classmethod
    def create(cls, command: str, args: argparse.Namespace, argv: list[str]) -> "Context":
        device = pick_device(args.device)
        if args.warmup < 0 or args.steps < 1:
            raise ConfigError("--warmup must be >= 0 and --steps >= 1")
        if args.peak_tflops is not None and args.peak_tflops <= 0:
            raise ConfigError("--peak-tflops must be > 0")
        ctx = cls(command=command, args=args, argv=list(argv), device=device)
        for key, value in vars(args).items():  # the flags left at a DeviceDefault
            if isinstance(value, DeviceDefault):
                setattr(args, key, value.pick(device.type))
                ctx.defaulted.append(f"--{key.replace('_', '-')} {shown(getattr(args, key))}")
        if args.peak_tflops:
            ctx.peak, ctx.peak_source = float(args.peak_tflops), "--peak-tflops"
        elif device.type == "cuda":
            ctx.peak = peak_tflops(torch.cuda.get_device_name(device))
            ctx.peak_source = "gpt.report.flops.PEAK_BF16_TFLOPS" if ctx.peak else None
        ctx.info = report.run_info(command, device, argv, ctx.peak, ctx.peak_source)
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        ctx.name = args.name or f"{command}_{device.type}_{stamp}"
        return ctx

    # -- profiling switches
    @property
    def nvtx(self) -> bool:
        return bool(self.args.nvtx)

    @property
    def profiler_range(self) -> bool:
        return bool(self.args.nvtx or self.args.cuda_profiler_range)

    def memory_snapshot(self) -> MemorySnapshot:
        return MemorySnapshot(self.args.memory_snapshot, enabled=bool(self.args.memory_snapshot))

    def mfu(self, tokens_per_s: float | None, flops_tok: float) -> float | None:
        if tokens_per_s is None:
            return None
        return mfu(tokens_per_s, flops_tok, self.peak)

    def throughput(self, timing: Timing, cfg: ModelConfig, batch_size: int, seq_len: int,
                   mode: str, *, tflops: bool = False) -> dict[str, Any]:
        """tokens_per_s (from the median), flops_per_token for the mode, achieved TFLOP/s
        when ``tflops`` is asked for, and MFU against this run's peak."""
        tok_s = batch_size * seq_len / (timing.stats.median / 1e3)
        flops_tok = mode_flops_per_token(cfg, seq_len, mode)
        out: dict[str, Any] = {"tokens_per_s": tok_s, "flops_per_token": flops_tok}
        if tflops:
            out["tflops"] = tok_s * flops_tok / 1e12
        out["mfu"] = self.mfu(tok_s, flops_tok)
        return out

    def log(self, message: str) -> None:
        if not self.quiet:
            print(message, file=sys.stderr, flush=True)

    def time(self, fn: Callable[..., Any], *, label: str, setup: Callable[[], Any] | None = None,
             warmup: int | None = None, profile_fn: Callable[[], Any] | None = None) -> Timing:
        """The timing helper with this run's warm-up/steps/profiling switches applied.

        With --torch-profile, ``profile_fn`` (default: ``fn``) runs a few more iterations
        under torch.profiler after the timing, so the profiler's overhead never enters
        the reported numbers.
        """
        with nvtx_range(f"bench:{label}", self.nvtx):
            timing = time_fn(fn, self.device,
                             warmup=self.args.warmup if warmup is None else warmup,
                             steps=self.args.steps, setup=setup, nvtx=self.nvtx,
                             profiler_range=self.profiler_range)
        if self.args.torch_profile:
            self.torch_profile(profile_fn or fn, label, setup=setup if profile_fn is None else None)
        return timing

    def torch_profile(self, fn: Callable[..., Any], label: str,
                      setup: Callable[[], Any] | None = None) -> None:
        active = max(1, min(self.args.steps, 3))
        with TorchProfile(self.args.torch_profile, wait=0, warmup=1, active=active,
                          name=f"{self.command}_{label}") as prof:
            for _ in range(1 + active):
                bind_setup(fn, setup)()
                prof.step()

    # -- outputs
    def payload(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        return {**self.info, "warmup": self.args.warmup, "steps": self.args.steps,
                **self.extra, "results": results}

    def save(self, results: list[dict[str, Any]],
             sections: Sequence[report.Section]) -> tuple[Path, Path]:
        """(Re)write <out>/<name>.json and .md; called after every cell, so a sweep that
        dies half-way keeps what it measured."""
        return write_outputs(self.args.out, self.name, self.payload(results),
                             report.render_markdown(self.info, sections))

    # -- the shape every timing subcommand shares: defaults, compiling, guarded cells, sweeps
    def compiled(self, fn: Callable[..., Any], on: bool) -> Callable[..., Any]:
        """``fn`` under torch.compile (--compile-mode) from an empty compiler cache (each
        compiled cell compiles afresh: timing.reset_dynamo) when ``on``; else ``fn``."""
        if not on:
            return fn
        reset_dynamo()
        return torch.compile(fn, mode=self.args.compile_mode)

    def cell(self, label: str, base: dict[str, Any], measure: Callable[[], dict[str, Any]], *,
             skip: str | None = None, compiled: bool = False,
             classify: Callable[[BaseException], dict[str, Any] | None] | None = None
             ) -> dict[str, Any]:
        """One cell's row: ``base`` (what the cell is) with "skipped" and the reason when
        ``skip`` says it cannot run here, else with what ``measure`` returns, guarded
        (timing.run_guarded: an OOM or error is its status, and the sweep goes on)."""
        if skip is not None:
            return {**base, "status": "skipped", "reason": skip}
        place = self.progress.before(label) if self.progress is not None else ""
        self.log(f"[{self.command}] {label} ...{place}")
        return {**base, **run_guarded(measure, self.device, classify=classify, compiled=compiled)}

    def sweep(self, rows: Iterable[dict[str, Any] | list[dict[str, Any]]],
              sections: Callable[[list[dict[str, Any]]], list[report.Section]],
              after_row: Callable[[list[dict[str, Any]]], None] | None = None
              ) -> tuple[list[dict[str, Any]], list[report.Section]]:
        """Run the cells ``rows`` yields (a row, or a cell's list of rows) under
        --memory-snapshot, saving the results after each; ``after_row`` updates what
        depends on earlier rows (speed-ups) before the save."""
        if self.defaulted and self.device.type != "cuda":  # said once the flags are checked
            self.log(f"note: no CUDA device; using small defaults ({', '.join(self.defaulted)})")
        results: list[dict[str, Any]] = []
        with self.memory_snapshot():
            for row in rows:
                if isinstance(row, list):
                    results.extend(row)
                else:
                    results.append(row)
                if after_row is not None:
                    after_row(results)
                self.save(results, sections(results))
        return results, sections(results)
