"""`ladder`: the GPT-2 speed ladder, one optimisation at a time, each on top of the last.

At a fixed model, batch and context, full training steps (zero grads, forward, backward,
clip, AdamW) are timed for:

    1. fp32             naive attention, vocab 50257, plain AdamW (torch's default kernel:
                        foreach on CUDA), TF32 off
    2. + tf32           TF32 tensor-core matmuls (CUDA only)
    3. + bf16 autocast
    4. + torch.compile
    5. + flash (SDPA)   the model's scaled_dot_product_attention instead of naive attention
    6. + vocab 50304    GPT-2's 50257 padded to a multiple of 128
    7. + fused AdamW
    8. trainer default  what train_gpt2.py does with no flags on this device, through
                        gpt.engine.step's forward_backward and optimizer_step

A rung the device cannot do is shown as skipped with the reason, and the rungs after it
build on the last rung that ran (e.g. on CPU: no tf32; bf16 autocast runs). Speed-ups are
over the previous rung that ran and over fp32.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from gpt.bench import report
from gpt.bench.args import DeviceDefault, add_common_args
from gpt.bench.step.common import (
    Context,
    bench_model_config,
    build_model,
    compile_skip_reason,
    expand_sizes,
    make_batch,
    make_step_fn,
    tf32_mode,
)
from gpt.bench.tables import MFU, PEAK_MEM, Column, col, fmt_int, fmt_ms, fmt_x, status_text
from gpt.bench.timing import compiled_warmup, run_guarded
from gpt.core.config import ConfigError, ModelConfig, OptimConfig, TrainConfig
from gpt.data.tokenizer import GPT2_VOCAB
from gpt.engine.step import forward_backward, optimizer_step
from gpt.optim.optimizer import build_optimizer
from gpt.runtime.device import DTYPE_NAMES, DTYPES, bf16_supported, resolve_dtype


@dataclass(frozen=True)
class Settings:
    tf32: bool = False
    autocast: str | None = None  # "bf16" / "fp16" / None
    compile: bool = False
    attention: str = "naive"
    vocab_size: int = GPT2_VOCAB
    fused_adamw: bool = False
    trainer_step: bool = False  # run the trainer's own step functions

    def describe(self) -> str:
        return (f"{'tf32' if self.tf32 else 'no tf32'}, "
                f"{self.autocast + ' autocast' if self.autocast else 'fp32'}, "
                f"{'compiled' if self.compile else 'eager'}, {self.attention} attention, "
                f"vocab {self.vocab_size}, {'fused' if self.fused_adamw else 'plain'} AdamW")


RUNGS: list[tuple[str, str]] = [
    ("fp32", "fp32 baseline"),
    ("tf32", "+ TF32 matmuls"),
    ("bf16", "+ bf16 autocast"),
    ("compile", "+ torch.compile"),
    ("flash", "+ flash attention (SDPA)"),
    ("vocab", "+ vocab 50257 -> 50304"),
    ("fused", "+ fused AdamW"),
    ("trainer", "trainer full default"),
]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ladder")
    p.add_argument("--size", default=DeviceDefault("gpt2", "tiny"),
                   help="model preset (default %(default)s)")
    p.add_argument("--seq-len", type=int, default=DeviceDefault(1024, 128),
                   help="context (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=DeviceDefault(16, 4),
                   help="batch (default %(default)s)")
    p.add_argument("--no-compile-rungs", action="store_true",
                   help="never torch.compile (the compile rung is shown as skipped)")
    add_common_args(p)


def _resolve(ctx: Context) -> None:
    a = ctx.args
    cuda = ctx.device.type == "cuda"
    a.size = expand_sizes([a.size])[0]
    if a.seq_len < 1 or a.batch_size < 1:
        raise ConfigError("--seq-len and --batch-size must be >= 1")
    if not cuda and not a.no_compile_rungs:
        ctx.log("note: torch.compile on a CPU takes a minute or so per compiled rung "
                "(--no-compile-rungs skips them)")


def trainer_defaults(device: torch.device, allow_compile: bool) -> tuple[Settings, str | None]:
    """What train_gpt2.py does with no flags on this device."""
    t, o, m = TrainConfig(), OptimConfig(), ModelConfig()
    dtype = resolve_dtype(t.dtype, device)
    compile_on = t.compile_on(device.type)
    note = None
    if compile_on and not allow_compile:
        compile_on, note = False, "compile off (--no-compile-rungs)"
    fused = o.fused if o.fused is not None else True  # build_optimizer falls back if it must
    return Settings(tf32=t.tf32 and device.type == "cuda",
                    autocast=None if dtype == torch.float32 else DTYPE_NAMES[dtype],
                    compile=compile_on, attention="sdpa", vocab_size=m.vocab_size,
                    fused_adamw=fused, trainer_step=True), note


class _FixedBatch:
    """A stand-in for the trainer's ShardLoader: the same random batch every step."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x, self.y


def _rung_cell(ctx: Context, s: Settings) -> dict[str, Any]:
    a, device = ctx.args, ctx.device
    cfg = bench_model_config(a.size, a.seq_len, s.vocab_size)
    dtype = DTYPES[s.autocast] if s.autocast else None
    warmup = compiled_warmup(a.warmup, s.compile)
    optim_cfg = OptimConfig()

    def cell() -> dict[str, Any]:
        with tf32_mode(s.tf32, device):
            torch.manual_seed(a.seed)
            model = build_model(cfg, device, s.attention, nvtx=ctx.nvtx)
            runner = ctx.compiled(model, s.compile)
            x, y = make_batch(a.batch_size, a.seq_len, cfg.vocab_size, device, a.seed)
            scaler = torch.amp.GradScaler(device.type, enabled=dtype is torch.float16)
            if s.trainer_step:
                optimizer, fused = build_optimizer(model, optim_cfg, device)
                loader = _FixedBatch(x, y)

                def fn() -> None:
                    _, norm = forward_backward(runner, scaler, optimizer, loader, 1,
                                               optim_cfg.grad_clip, device.type,
                                               dtype if dtype is not None else torch.float32)
                    optimizer_step(optimizer, scaler, optim_cfg.max_lr, norm)
            else:
                # The trainer's own AdamW: fused when the rung says so, otherwise torch's
                # default (foreach on CUDA), as the rung's description says.
                try:
                    optimizer, fused = build_optimizer(
                        model, dataclasses.replace(optim_cfg, fused=s.fused_adamw), device)
                except ConfigError as e:  # fused asked for, and not available here
                    raise _Skip(str(e)) from None
                fn = make_step_fn(runner, "step", device, dtype, x, y, params_model=model,
                                  optimizer=optimizer, grad_clip=optim_cfg.grad_clip,
                                  scaler=scaler if scaler.is_enabled() else None, nvtx=ctx.nvtx)
            timing = ctx.time(fn, label=f"ladder_{a.size}", warmup=warmup)
        out = {"params": model.num_params(), "fused_adamw": fused, **timing.to_dict(),
               "ms_per_step": timing.stats.median,
               **ctx.throughput(timing, cfg, a.batch_size, a.seq_len, "step")}
        if s.compile:
            out["compile_s"] = timing.compile_s
        return out

    def classify(exc: BaseException) -> dict[str, Any] | None:
        if isinstance(exc, _Skip):
            return {"status": "skipped", "reason": str(exc)}
        if s.compile and _is_compile_failure(exc):
            return {"status": "skipped",
                    "reason": "torch.compile failed here: " + " ".join(str(exc).split())[:300]}
        return None

    return run_guarded(cell, device, classify=classify, compiled=s.compile)


class _Skip(Exception):
    pass


def _is_compile_failure(exc: BaseException) -> bool:
    name = f"{type(exc).__module__}.{type(exc).__name__}"
    return "torch._dynamo" in name or "torch._inductor" in name or "BackendCompilerFailed" in name


def run(ctx: Context) -> tuple[list[dict[str, Any]], list[report.Section]]:
    _resolve(ctx)
    a = ctx.args
    notes = [
        f"Model {a.size}, batch {a.batch_size} x {a.seq_len} tokens, one full training step "
        "per iteration (zero grads, forward, backward, clip 1.0, AdamW). ms = median over "
        "the measured steps; tokens/s from it. Speed-ups are over the previous rung that "
        "ran and over the fp32 rung; skipped rungs change nothing for the rungs after them.",
    ]
    ctx.extra["ladder"] = {"size": a.size, "seq_len": a.seq_len, "batch_size": a.batch_size}
    return ctx.sweep(_rungs(ctx), lambda results: [
        report.Section("speed ladder", results, COLUMNS, notes)])


def _rungs(ctx: Context) -> Iterator[dict[str, Any]]:
    """Each rung's row in turn, each rung's settings on top of the last rung that ran."""
    a, device = ctx.args, ctx.device
    state = Settings()
    prev_ok: dict[str, Any] | None = None
    base_ok: dict[str, Any] | None = None
    for i, (key, title) in enumerate(RUNGS, start=1):
        skip: str | None = None
        note: str | None = None
        new = state
        if key == "tf32":
            if device.type != "cuda":
                skip = "tf32 needs CUDA"
            new = dataclasses.replace(state, tf32=True)
        elif key == "bf16":
            if not bf16_supported(device):
                skip = f"no hardware bf16 on {ctx.info['device']}"
            new = dataclasses.replace(state, autocast="bf16")
        elif key == "compile":
            skip = ("disabled by --no-compile-rungs" if a.no_compile_rungs
                    else compile_skip_reason(device))
            new = dataclasses.replace(state, compile=True)
        elif key == "flash":
            new = dataclasses.replace(state, attention="sdpa")
            note = "compared with naive attention (the previous rung)"
        elif key == "vocab":
            new = dataclasses.replace(state, vocab_size=50304)
        elif key == "fused":
            new = dataclasses.replace(state, fused_adamw=True)
        elif key == "trainer":
            new, note = trainer_defaults(device, allow_compile=not a.no_compile_rungs)
        row: dict[str, Any] = {"rung": i, "key": key, "title": title,
                               "settings": dataclasses.asdict(new),
                               "description": new.describe()}
        if note:
            row["note"] = note
        if skip:
            row.update(status="skipped", reason=skip)
            ctx.log(f"[ladder] {i}. {title}: skipped ({skip})")
        else:
            ctx.log(f"[ladder] {i}. {title} ({new.describe()}) ...")
            row.update(_rung_cell(ctx, new))
            if row["status"] == "ok":
                if key != "trainer":
                    state = new
                if prev_ok is not None:
                    row["speedup_vs_prev"] = prev_ok["ms_per_step"] / row["ms_per_step"]
                    row["prev_rung"] = prev_ok["rung"]
                if base_ok is not None:
                    row["speedup_vs_fp32"] = base_ok["ms_per_step"] / row["ms_per_step"]
                elif key == "fp32":
                    row["speedup_vs_fp32"] = 1.0
                    base_ok = row
                prev_ok = row
            elif key != "trainer":
                # A rung that failed leaves the state as it was (if fp32 itself failed,
                # no rung has a speed-up over fp32).
                row.setdefault("note", "later rungs build on the rung before this one")
        yield row


COLUMNS = [
    col("#", "rung"),
    col("rung", "title", align="left"),
    col("ms/step", "ms_per_step", fmt_ms),
    col("tokens/s", "tokens_per_s", fmt_int),
    col("vs prev", "speedup_vs_prev", fmt_x),
    col("vs fp32", "speedup_vs_fp32", fmt_x),
    MFU, PEAK_MEM,
    Column("status", lambda r: "skipped: " + r["reason"] if r.get("status") == "skipped"
           else status_text(r, 80), "left"),
]
