"""`model`: sizes x context x batch x mode x precision x compile; `components`: the parts.

Every cell builds a fresh model (and, when compiled, compiles it afresh), so cells do not
share warm caches and one cell's OOM cannot poison the next.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterator
from typing import Any, Callable

import torch
import torch.nn.functional as F

from gpt.bench import report
from gpt.bench.args import DeviceDefault, add_common_args
from gpt.bench.step.common import (
    ARCHS,
    MODES,
    PRECISION,
    PRECISIONS,
    Context,
    autocast,
    bench_model_config,
    build_model,
    cell_skip_reason,
    expand_sizes,
    make_batch,
    make_step_fn,
    tf32_mode,
)
from gpt.bench.step.sweep_plan import plan_sweep
from gpt.bench.tables import MFU, PEAK_MEM, STATUS, Column, col, fmt, fmt_int, fmt_ms, fmt_pct
from gpt.bench.timing import compiled_warmup, run_guarded
from gpt.core.config import ConfigError, OptimConfig
from gpt.optim.optimizer import build_optimizer

# --------------------------------------------------------------------------------------
# CLI


def add_model_args(p: argparse.ArgumentParser, with_modes: bool = True) -> None:
    p.add_argument("--sizes", nargs="+", default=DeviceDefault(["gpt2"], ["tiny"]), metavar="SIZE",
                   help="presets from gpt.core.config.PRESETS, or 'all' (gpt2, gpt2-medium, "
                        "gpt2-large, gpt2-xl, 2.7B); default %(default)s")
    p.add_argument("--seq-len", nargs="+", type=int, default=DeviceDefault([1024], [128]),
                   metavar="T", help="context lengths (default %(default)s)")
    p.add_argument("--batch-size", nargs="+", type=int, default=DeviceDefault([8], [4]),
                   metavar="B", help="micro-batch sizes (default %(default)s)")
    if with_modes:
        p.add_argument("--arch", choices=list(ARCHS), default="gpt2",
                       help="the model's block: GPT-2's, or the speedrun-era one (rotary, "
                            "RMSNorm, QK-norm, ReLU^2, untied head, soft-capped logits); the "
                            "step mode's optimizer is AdamW either way (default gpt2)")
        p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES),
                       help="fwd: forward with loss; fwdbwd: + backward; step: + grad clip "
                            "and fused AdamW step (the trainer's step)")
    p.add_argument("--precision", nargs="+", choices=list(PRECISIONS),
                   default=DeviceDefault(["bf16"], ["fp32"]),
                   help="fp32; tf32 (fp32 + TF32 matmuls, CUDA only); bf16 autocast "
                        "(default %(default)s)")
    p.add_argument("--compile", nargs="+", choices=["off", "on"], default=["off"],
                   help="torch.compile off and/or on")
    p.add_argument("--attention", nargs="+", choices=["sdpa", "naive"], default=["sdpa"],
                   help="the model's SDPA attention, or naive attention swapped in")
    p.add_argument("--vocab-size", type=int, default=50304,
                   help="embedding rows (50304 = GPT-2's 50257 padded, as the trainer uses)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model")
    add_model_args(p)
    add_common_args(p)
    p = sub.add_parser("components")
    add_model_args(p, with_modes=False)
    add_common_args(p)


def resolve_grid(args: argparse.Namespace, ctx: Context) -> None:
    args.sizes = expand_sizes(args.sizes)
    if any(t < 1 for t in args.seq_len) or any(b < 1 for b in args.batch_size):
        raise ConfigError("--seq-len and --batch-size must be >= 1")


# --------------------------------------------------------------------------------------
# One cell of the model grid


def cell_label(size: str, T: int, B: int, mode: str, precision: str, compiled: bool,
               attention: str) -> str:
    return (f"{size}_T{T}_B{B}_{mode}_{precision}_{'compiled' if compiled else 'eager'}"
            f"{'' if attention == 'sdpa' else '_' + attention}")


def model_cell(ctx: Context, size: str, T: int, B: int, mode: str, precision: str,
               compiled: bool, attention: str = "sdpa", vocab_size: int = 50304) -> dict[str, Any]:
    """Measure one configuration; never raises (OOM / errors become the status)."""
    device = ctx.device
    arch = getattr(ctx.args, "arch", "gpt2")  # the compile bench's cells are GPT-2's
    cfg = bench_model_config(size, T, vocab_size, arch)
    prec = PRECISION[precision]
    result: dict[str, Any] = {
        "size": size, "arch": arch, "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.n_embd,
        "vocab_size": cfg.vocab_size, "seq_len": T, "batch_size": B, "tokens": B * T,
        "mode": mode, "precision": precision, "tf32": prec.tf32 and device.type == "cuda",
        "autocast": "bf16" if prec.autocast is torch.bfloat16 else None,
        "compile": compiled, "attention": attention,
    }
    label = cell_label(size, T, B, mode, precision, compiled, attention)
    warmup = compiled_warmup(ctx.args.warmup, compiled)
    skip = cell_skip_reason(precision, device, compiled)
    if skip is None:
        result["warmup"] = warmup

    def cell() -> dict[str, Any]:
        with tf32_mode(prec.tf32, device):
            torch.manual_seed(ctx.args.seed)
            model = build_model(cfg, device, attention, nvtx=ctx.nvtx)
            runner = ctx.compiled(model, compiled)
            x, y = make_batch(B, T, cfg.vocab_size, device, ctx.args.seed)
            optimizer = fused = None
            if mode == "step":
                optimizer, fused = build_optimizer(model, OptimConfig(), device)
            fn = make_step_fn(runner, mode, device, prec.autocast, x, y, params_model=model,
                              optimizer=optimizer, grad_clip=OptimConfig().grad_clip,
                              nvtx=ctx.nvtx)
            timing = ctx.time(fn, label=label, warmup=warmup)
        out = {
            "params": model.num_params(),
            "fused_adamw": fused,
            **timing.to_dict(),
            **ctx.throughput(timing, cfg, B, T, mode, tflops=True),
        }
        if compiled:
            out["compile_s"] = timing.compile_s
        return out

    return ctx.cell(label, result, cell, skip=skip, compiled=compiled)


# The grid's coordinates, as the model and components tables show them
COL_SIZE, COL_T, COL_B = (col("size", "size", align="left"), col("T", "seq_len"),
                          col("B", "batch_size"))
COL_PREC = col("prec", "precision", align="left")
COL_COMPILE = col("compile", "compile", lambda on: "on" if on else "off", "left")

MODEL_COLUMNS = [
    COL_SIZE, COL_T, COL_B,
    col("mode", "mode", align="left"),
    COL_PREC, COL_COMPILE,
    col("attn", "attention", align="left"),
    *(col(f"{stat} ms", "ms", lambda ms, stat=stat: fmt_ms((ms or {}).get(stat)))
      for stat in ("median", "mean", "std")),
    col("tokens/s", "tokens_per_s", fmt_int),
    col("TFLOP/s", "tflops", fmt(".2f")),
    MFU, PEAK_MEM, STATUS,
]


MODEL_NOTES = [
    "Times per iteration (one micro-batch of B x T tokens) over the measured steps, after "
    "warm-up; tokens/s uses the median. fwd is the training forward (autograd on, loss "
    "included); step adds backward, clipping and the optimizer. MFU = tokens/s x FLOPs per token / bf16 dense "
    "peak, with FLOPs per token = 6N + 12 L d T for fwdbwd and step and a third of it for "
    "fwd (gpt.report.flops.flops_per_token). fp32/tf32 rows are measured against the bf16 peak "
    "too. Peak memory over the measured steps: torch.cuda.max_memory_allocated on CUDA, the "
    "process's peak resident memory on CPU and MPS (gpt.report.flops.peak_memory).",
]


def _grid(args: Any) -> Iterator[tuple[Any, ...]]:
    """Every (size, T, B, precision, compile, attention) cell of a sweep, in order."""
    return itertools.product(args.sizes, args.seq_len, args.batch_size, args.precision,
                             args.compile, args.attention)


def run_model(ctx: Context) -> tuple[list[dict[str, Any]], list[report.Section]]:
    args = ctx.args
    resolve_grid(args, ctx)
    grid = [(size, T, B, mode, precision, comp == "on", attention)
            for size, T, B, precision, comp, attention in _grid(args) for mode in args.modes]
    # the cells, what is skipped here, what the precisions mean here, the time: said first
    ctx.progress = plan_sweep(ctx, grid, args.vocab_size, args.arch, cell_label)
    cells = (model_cell(ctx, size, T, B, mode, precision, compiled, attention, args.vocab_size)
             for size, T, B, mode, precision, compiled, attention in grid)
    return ctx.sweep(cells, lambda results: [
        report.Section("model", results, MODEL_COLUMNS, MODEL_NOTES)])


# --------------------------------------------------------------------------------------
# Components: embeddings, blocks, head + loss, each timed on its own

COMPONENTS = ("embedding", "blocks", "head+loss", "full model")


def _component_fns(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                   device: torch.device, dtype: torch.dtype | None
                   ) -> tuple[dict[str, tuple[Callable[[], Any], bool]], torch.Tensor, torch.Tensor]:
    """(name -> (forward fn, whether it returns a scalar loss), the blocks'/head's input,
    a gradient for non-scalar outputs). Inputs are random and, where the real model's
    would be, require grad, so backward does the same work it does in training."""
    tr = model.transformer
    B, T = x.shape
    C = model.config.n_embd
    gen = torch.Generator(device="cpu").manual_seed(1)
    pos = torch.arange(T, device=device)
    h_in = torch.randn(B, T, C, generator=gen).to(device).requires_grad_(True)
    g_out = torch.randn(B, T, C, generator=gen).to(device)

    def emb_fwd() -> torch.Tensor:
        with autocast(device, dtype):
            return tr.drop(tr.wte(x) + tr.wpe(pos))

    def blocks_fwd() -> torch.Tensor:
        with autocast(device, dtype):
            h = h_in
            for block in tr.h:
                h = block(h)
            return h

    def head_fwd() -> torch.Tensor:
        with autocast(device, dtype):
            logits = model.lm_head(tr.ln_f(h_in))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    def full_fwd() -> torch.Tensor:
        with autocast(device, dtype):
            return model(x, y)[1]

    return {
        "embedding": (emb_fwd, False),
        "blocks": (blocks_fwd, False),
        "head+loss": (head_fwd, True),
        "full model": (full_fwd, True),
    }, h_in, g_out


def _with_backward(model: torch.nn.Module, fwd: Callable[[], torch.Tensor], scalar: bool,
                   inputs: list[torch.Tensor], grad: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        model.zero_grad(set_to_none=True)
        for t in inputs:
            t.grad = None
        out = fwd()
        if scalar:
            out.backward()
        else:
            out.backward(grad.to(out.dtype))
    return run


def component_cells(ctx: Context, size: str, T: int, B: int, precision: str, compiled: bool,
                    attention: str, vocab_size: int) -> list[dict[str, Any]]:
    device = ctx.device
    cfg = bench_model_config(size, T, vocab_size)
    prec = PRECISION[precision]
    base = {"size": size, "seq_len": T, "batch_size": B, "precision": precision,
            "tf32": prec.tf32 and device.type == "cuda", "compile": compiled,
            "attention": attention, "vocab_size": cfg.vocab_size}
    skip = cell_skip_reason(precision, device, compiled)
    if skip is not None:
        return [{**base, "component": c, "status": "skipped", "reason": skip} for c in COMPONENTS]
    warmup = compiled_warmup(ctx.args.warmup, compiled)
    label = cell_label(size, T, B, "parts", precision, compiled, attention)
    results: list[dict[str, Any]] = []
    state: dict[str, Any] = {}

    def setup_model() -> dict[str, Any]:
        torch.manual_seed(ctx.args.seed)
        model = build_model(cfg, device, attention, nvtx=ctx.nvtx)
        x, y = make_batch(B, T, cfg.vocab_size, device, ctx.args.seed)
        state["fns"], state["h_in"], state["g_out"] = _component_fns(
            model, x, y, device, prec.autocast)
        state["model"] = model
        return {}

    ctx.log(f"[components] {label} ...")
    with tf32_mode(prec.tf32, device):
        built = run_guarded(setup_model, device)
        if built["status"] != "ok":
            return [{**base, "component": c, **built} for c in COMPONENTS]
        for comp in COMPONENTS:
            fwd, scalar = state["fns"][comp]

            def cell(fwd: Callable[[], Any] = fwd, scalar: bool = scalar,
                     comp: str = comp) -> dict[str, Any]:
                fwd = ctx.compiled(fwd, compiled)
                fwdbwd = _with_backward(state["model"], fwd, scalar, [state["h_in"]],
                                        state["g_out"])
                t_f = ctx.time(fwd, label=f"{label}_{comp}_fwd", warmup=warmup)
                t_fb = ctx.time(fwdbwd, label=f"{label}_{comp}_fwdbwd", warmup=warmup)
                return {
                    "fwd": t_f.to_dict(), "fwdbwd": t_fb.to_dict(),
                    "fwd_median_ms": t_f.stats.median, "fwdbwd_median_ms": t_fb.stats.median,
                    "peak_mem_bytes": t_fb.peak_mem_bytes,
                }

            results.append({**base, "component": comp,
                            **run_guarded(cell, device, compiled=compiled)})
        state.clear()
    full = next((r for r in results if r["component"] == "full model" and r["status"] == "ok"), None)
    parts = [r for r in results if r["component"] not in ("full model",)]
    if full:
        for r in results:
            if r["status"] == "ok":
                r["share_of_full_fwdbwd"] = r["fwdbwd_median_ms"] / full["fwdbwd_median_ms"]
    if all(r["status"] == "ok" for r in parts):
        fwd_sum = sum(r["fwd_median_ms"] for r in parts)
        fb_sum = sum(r["fwdbwd_median_ms"] for r in parts)
        results.append({**base, "component": "sum of parts", "status": "ok",
                        "fwd_median_ms": fwd_sum, "fwdbwd_median_ms": fb_sum,
                        "share_of_full_fwdbwd": fb_sum / full["fwdbwd_median_ms"] if full else None,
                        "derived": True})
    return results


COMPONENT_COLUMNS = [
    COL_SIZE, COL_T, COL_B, COL_PREC, COL_COMPILE,
    col("component", "component", align="left"),
    col("fwd ms", "fwd_median_ms", fmt_ms),
    col("fwd+bwd ms", "fwdbwd_median_ms", fmt_ms),
    col("share", "share_of_full_fwdbwd", lambda x: fmt_pct(x, "-")),
    Column("peak mem", lambda r: "-" if r.get("derived") else PEAK_MEM.cell(r)),
    STATUS,
]

COMPONENT_NOTES = [
    "embedding = wte(idx) + wpe(pos); blocks = every transformer block on a random "
    "(B, T, d) input that requires grad; head+loss = ln_f + lm_head + cross-entropy. "
    "Median ms; share = fwd+bwd time over the full model's fwd+bwd time. The parts run "
    "separately, so their sum can differ from the full model a little.",
]


def run_components(ctx: Context) -> tuple[list[dict[str, Any]], list[report.Section]]:
    args = ctx.args
    resolve_grid(args, ctx)
    cells = (component_cells(ctx, size, T, B, precision, comp == "on", attention, args.vocab_size)
             for size, T, B, precision, comp, attention in _grid(args))
    return ctx.sweep(cells, lambda results: [
        report.Section("components", results, COMPONENT_COLUMNS, COMPONENT_NOTES)])
