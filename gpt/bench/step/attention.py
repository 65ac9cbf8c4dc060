"""`attention`: causal attention implementations over head dim x sequence length.

Implementations: naive (scores, masked softmax, matmul, as in gpt/bench/step/naive.py), its
torch.compile'd version, SDPA with its default dispatch, and SDPA pinned to each backend
(flash, memory-efficient, cuDNN, math) with ``torch.nn.attention.sdpa_kernel``. A backend
that cannot run a configuration (dtype, head dim, device) is recorded as unsupported with
PyTorch's reason; an OOM is recorded per cell. Inputs are (B, H, T, d) random tensors that
require grad, as in training. Reported per cell: forward and backward ms (each timed on
its own; backward after an untimed forward), the memory a forward leaves held for the
backward (allocated after the forward minus before, output included), and the peak.
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpt.bench import report
from gpt.bench.args import DeviceDefault, add_common_args
from gpt.bench.step.common import Context, compile_skip_reason
from gpt.bench.step.naive import causal_mask, naive_attention
from gpt.bench.tables import PEAK_MEM, STATUS, col, fmt_mem, fmt_ms, fmt_x
from gpt.bench.timing import allocated_memory, compile_seconds, compiled_warmup, reset_dynamo
from gpt.core.config import ConfigError
from gpt.runtime.device import DTYPES, synchronize

SDPA_BACKENDS = {
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
    "sdpa-cudnn": "CUDNN_ATTENTION",
    "sdpa-math": "MATH",
}
IMPLS = ("naive", "naive-compiled", "sdpa", *SDPA_BACKENDS)
# Also accepted, not run by default: SDPA (default dispatch) under torch.compile.
EXTRA_IMPLS = ("sdpa-compiled",)

# Messages SDPA raises when no kernel of the allowed backends fits (CUDA; CPU).
_NO_KERNEL = ("no available kernel", "no viable backend")


class Unsupported(Exception):
    """This implementation cannot run this configuration (not a failure of the bench)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attention")
    p.add_argument("--impls", nargs="+", choices=[*IMPLS, *EXTRA_IMPLS],
                   default=DeviceDefault(list(IMPLS), [i for i in IMPLS if i != "naive-compiled"]),
                   help="implementations (default %(default)s)")
    p.add_argument("--head-dims", nargs="+", type=int, default=[16, 32, 64, 128], metavar="D",
                   help="head dims (default 16 32 64 128)")
    p.add_argument("--seq-lens", nargs="+", type=int, metavar="T",
                   default=DeviceDefault([256, 1024, 4096, 8192, 16384], [64, 256]),
                   help="sequence lengths (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=DeviceDefault(8, 2),
                   help="batch (default %(default)s)")
    p.add_argument("--n-head", type=int, default=DeviceDefault(12, 4),
                   help="heads (default %(default)s)")
    p.add_argument("--dtype", choices=list(DTYPES), default=DeviceDefault("bf16", "fp32"),
                   help="input dtype (default %(default)s)")
    add_common_args(p)


def _resolve(ctx: Context) -> None:
    a = ctx.args
    cuda = ctx.device.type == "cuda"
    if not cuda and max(a.seq_lens) >= 4096:
        ctx.log(f"warning: sequence length {max(a.seq_lens)} on {ctx.device.type}: naive "
                "attention builds B x H x T x T scores; this may take very long")
    if min(a.head_dims) < 1 or min(a.seq_lens) < 1 or a.batch_size < 1 or a.n_head < 1:
        raise ConfigError("--head-dims, --seq-lens, --batch-size, --n-head must be >= 1")


def make_attention(impl: str, T: int, device: torch.device, nvtx: bool, compile_mode: str
                   ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """(q, k, v) -> causal attention output, for one implementation ("X-compiled" is
    implementation X under torch.compile, compiled afresh)."""
    if impl.endswith("-compiled"):
        eager = make_attention(impl[: -len("-compiled")], T, device, nvtx, compile_mode)
        reset_dynamo()
        return torch.compile(eager, mode=compile_mode)
    if impl == "naive":
        mask = causal_mask(T, device)

        def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return naive_attention(q, k, v, mask, nvtx=nvtx)

        return naive
    if impl == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    backend = getattr(SDPBackend, SDPA_BACKENDS[impl])

    def pinned(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return pinned


def _skip_reason(impl: str, device: torch.device) -> str | None:
    if impl in SDPA_BACKENDS:
        if not hasattr(SDPBackend, SDPA_BACKENDS[impl]):
            return f"torch {torch.__version__} has no {SDPA_BACKENDS[impl]} backend"
    if impl.endswith("-compiled"):
        return compile_skip_reason(device)
    return None


def _classify(exc: BaseException) -> dict[str, Any] | None:
    if isinstance(exc, Unsupported):
        return {"status": "unsupported", "reason": str(exc)}
    return None


def attention_cell(ctx: Context, impl: str, head_dim: int, T: int, B: int, H: int,
                   dtype_name: str) -> dict[str, Any]:
    device = ctx.device
    dtype = DTYPES[dtype_name]
    result: dict[str, Any] = {"impl": impl, "head_dim": head_dim, "seq_len": T,
                              "batch_size": B, "n_head": H, "dtype": dtype_name}
    compiled = impl.endswith("-compiled")
    warmup = compiled_warmup(ctx.args.warmup, compiled)
    label = f"{impl}_d{head_dim}_T{T}_B{B}_H{H}_{dtype_name}"

    def cell() -> dict[str, Any]:
        gen = torch.Generator(device="cpu").manual_seed(ctx.args.seed)
        q, k, v = (torch.randn(B, H, T, head_dim, generator=gen, dtype=torch.float32)
                   .to(device=device, dtype=dtype).requires_grad_(True) for _ in range(3))
        dout = torch.randn(B, H, T, head_dim, generator=gen).to(device=device, dtype=dtype)
        attn = make_attention(impl, T, device, ctx.nvtx, ctx.args.compile_mode)

        def fwd() -> torch.Tensor:
            return attn(q, k, v)

        def setup() -> torch.Tensor:
            q.grad = k.grad = v.grad = None
            return fwd()

        def bwd(out: torch.Tensor) -> None:
            out.backward(dout)

        def fwdbwd() -> None:
            bwd(setup())

        # First call, timed on its own (the compilation for naive-compiled); with the
        # warnings PyTorch gives when a pinned backend cannot run this shape.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            synchronize(device)
            t0 = time.perf_counter()
            try:
                fwdbwd()
            except RuntimeError as e:
                if any(m in str(e).lower() for m in _NO_KERNEL):
                    why = "; ".join(dict.fromkeys(
                        " ".join(str(w.message).split()) for w in caught))
                    detail = why or " ".join(str(e).split())[:300]
                    backend = SDPA_BACKENDS.get(impl, impl)
                    raise Unsupported(f"{backend} cannot run this configuration on "
                                      f"{device.type} ({dtype_name}, d={head_dim}): {detail}"
                                      ) from None
                raise
            synchronize(device)
            first_ms = (time.perf_counter() - t0) * 1e3
        # Memory a forward leaves allocated for its backward (output included).
        q.grad = k.grad = v.grad = None
        before = allocated_memory(device)
        out = fwd()
        after = allocated_memory(device)
        held = None if before is None or after is None else after - before
        del out
        t_fwd = ctx.time(fwd, label=f"{label}_fwd", warmup=warmup)
        t_bwd = ctx.time(bwd, setup=setup, label=f"{label}_bwd", warmup=warmup,
                         profile_fn=fwdbwd)
        out_d: dict[str, Any] = {
            "fwd": t_fwd.to_dict(), "bwd": t_bwd.to_dict(),
            "fwd_ms": t_fwd.stats.median, "bwd_ms": t_bwd.stats.median,
            "fwdbwd_ms": t_fwd.stats.median + t_bwd.stats.median,
            "first_call_ms": first_ms,
            "mem_held_for_backward_bytes": held,
            "peak_mem_bytes": t_bwd.peak_mem_bytes,
        }
        if compiled:
            out_d["compile_s"] = compile_seconds(first_ms, out_d["fwdbwd_ms"])
        return out_d

    return ctx.cell(label, result, cell, skip=_skip_reason(impl, device), compiled=compiled,
                    classify=_classify)


def _speedup_vs_naive(results: list[dict[str, Any]]) -> None:
    naive = {(r["head_dim"], r["seq_len"]): r for r in results
             if r["impl"] == "naive" and r["status"] == "ok"}
    for r in results:
        base = naive.get((r["head_dim"], r["seq_len"]))
        if r["status"] == "ok" and base is not None:
            r["speedup_vs_naive"] = base["fwdbwd_ms"] / r["fwdbwd_ms"]


# A cell's coordinates and times, as this table and the compile bench's show them
CELL_COLUMNS = [col("impl", "impl", align="left"), col("d", "head_dim"), col("T", "seq_len"),
                col("fwd ms", "fwd_ms", fmt_ms), col("bwd ms", "bwd_ms", fmt_ms)]
COLUMNS = [
    *CELL_COLUMNS,
    col("fwd+bwd ms", "fwdbwd_ms", fmt_ms),
    col("vs naive", "speedup_vs_naive", fmt_x),
    col("held for bwd", "mem_held_for_backward_bytes", fmt_mem, ok_only=True),
    PEAK_MEM, STATUS,
]


def run(ctx: Context) -> tuple[list[dict[str, Any]], list[report.Section]]:
    _resolve(ctx)
    a = ctx.args
    notes = [f"Causal attention, batch {a.batch_size}, {a.n_head} heads, {a.dtype} inputs that "
             "require grad. Median ms; backward timed after an untimed forward. 'held for bwd' "
             "= memory allocated after a forward minus before (output included); n/a off CUDA."]

    ctx.extra["grid"] = {"impls": a.impls, "head_dims": a.head_dims, "seq_lens": a.seq_lens,
                         "batch_size": a.batch_size, "n_head": a.n_head, "dtype": a.dtype}
    cells = (attention_cell(ctx, impl, d, T, a.batch_size, a.n_head, a.dtype)
             for T in a.seq_lens for d in a.head_dims for impl in a.impls)
    return ctx.sweep(cells, lambda results: [report.Section("attention", results, COLUMNS, notes)],
                     after_row=_speedup_vs_naive)
