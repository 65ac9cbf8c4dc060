"""`compile`: eager versus torch.compile, for attention and for the whole model.

Each compiled cell starts from a reset compiler cache, so its first call is a full
compilation. That first call is reported apart ("compile s" = first call minus one
steady-state call) and is never part of the steady-state statistics; "break-even" is how
many steps the compiled version needs to win its compilation time back.
"""

from __future__ import annotations

import argparse
from typing import Any, Iterator

from gpt.bench import report
from gpt.bench.args import DeviceDefault, add_common_args
from gpt.bench.step.attention import CELL_COLUMNS, attention_cell
from gpt.bench.step.common import MODES, PRECISIONS, Context, expand_sizes
from gpt.bench.step.model import MODEL_COLUMNS, model_cell
from gpt.bench.tables import STATUS, col, fmt, fmt_ms, fmt_x


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compile")
    p.add_argument("--parts", nargs="+", choices=["model", "attention"],
                   default=["model", "attention"], help="what to compare")
    g = p.add_argument_group("model")
    g.add_argument("--size", default=DeviceDefault("gpt2", "tiny"), help="preset (default %(default)s)")
    g.add_argument("--seq-len", type=int, default=DeviceDefault(1024, 64),
                   help="context (default %(default)s)")
    g.add_argument("--batch-size", type=int, default=DeviceDefault(8, 2),
                   help="batch (default %(default)s)")
    g.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    g.add_argument("--precision", choices=list(PRECISIONS), default=DeviceDefault("bf16", "fp32"),
                   help="default %(default)s")
    g = p.add_argument_group("attention")
    g.add_argument("--attn-impls", nargs="+", choices=["naive", "sdpa"], default=["naive", "sdpa"],
                   help="attention implementations compared eager vs compiled")
    for flag, cuda, other in (("--head-dim", 64, 16), ("--attn-seq-len", 1024, 64),
                              ("--attn-batch-size", 8, 2), ("--n-head", 12, 2)):
        g.add_argument(flag, type=int, default=DeviceDefault(cuda, other), help="default %(default)s")
    add_common_args(p)


def _resolve(ctx: Context) -> None:
    ctx.args.size = expand_sizes([ctx.args.size])[0]
    if ctx.device.type != "cuda":
        ctx.log("note: compiling on a CPU takes a while")


def _compare(part: str, what: str, eager: dict[str, Any], compiled: dict[str, Any],
             ms_key: str) -> dict[str, Any]:
    row: dict[str, Any] = {"part": part, "what": what,
                           "eager_status": eager["status"], "compiled_status": compiled["status"]}

    def ms(r: dict[str, Any]) -> float | None:
        if r["status"] != "ok":
            return None
        v = r[ms_key]
        return v["median"] if isinstance(v, dict) else v

    e, c = ms(eager), ms(compiled)
    row["eager_ms"], row["compiled_ms"] = e, c
    row["first_call_ms"] = compiled.get("first_call_ms")
    row["compile_s"] = compiled.get("compile_s")
    row["status"] = "ok" if e is not None and c is not None else (
        eager["status"] if eager["status"] != "ok" else compiled["status"])
    if row["status"] != "ok":
        bad = eager if eager["status"] != "ok" else compiled
        row["reason"] = bad.get("reason") or bad.get("error")
    if e is not None and c is not None:
        row["speedup"] = e / c
        saved = e - c
        cs = row["compile_s"]
        row["break_even_steps"] = (cs * 1e3 / saved) if (saved > 0 and cs is not None) else None
    return row


COMPARE_COLUMNS = [
    col("part", "part", align="left"),
    col("what", "what", align="left"),
    col("eager ms", "eager_ms", fmt_ms),
    col("compiled ms", "compiled_ms", fmt_ms),
    col("speed-up", "speedup", fmt_x),
    col("compile s", "compile_s", fmt(".1f")),
    col("break-even steps", "break_even_steps", fmt(",.0f")),
    STATUS,
]

ATTN_COLUMNS = [*CELL_COLUMNS, col("first call ms", "first_call_ms", fmt_ms), STATUS]


def run(ctx: Context) -> tuple[list[dict[str, Any]], list[report.Section]]:
    _resolve(ctx)
    comparisons: list[dict[str, Any]] = []
    ctx.extra["comparisons"] = comparisons

    def sections(results: list[dict[str, Any]]) -> list[report.Section]:
        out = [report.Section(
            "eager vs compiled", comparisons, COMPARE_COLUMNS,
            ["Median ms per call. compile s = compiled first call minus one steady-state "
             "call; break-even = compile time / time saved per call."])]
        for part, title, columns in (("model", "model cells", MODEL_COLUMNS),
                                     ("attention", "attention cells", ATTN_COLUMNS)):
            rows = [r for r in results if r["part"] == part]
            if rows:
                out.append(report.Section(title, rows, columns))
        return out

    return ctx.sweep(_pairs(ctx, comparisons), sections)


def _pairs(ctx: Context, comparisons: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The eager cell, then the compiled one, of each part and setting; the comparison of
    the pair is added before the compiled cell's row, so each save holds whole pairs."""
    a = ctx.args
    if "attention" in a.parts:
        dtype = "bf16" if ctx.device.type == "cuda" else "fp32"
        for impl in a.attn_impls:
            eager = attention_cell(ctx, impl, a.head_dim, a.attn_seq_len, a.attn_batch_size,
                                   a.n_head, dtype)
            yield {"part": "attention", **eager}
            comp = attention_cell(ctx, f"{impl}-compiled", a.head_dim, a.attn_seq_len,
                                  a.attn_batch_size, a.n_head, dtype)
            label = f"{impl} attention d={a.head_dim} T={a.attn_seq_len}"
            comparisons.append(_compare("attention", f"{label} fwd", eager, comp, "fwd_ms"))
            comparisons.append(_compare("attention", f"{label} fwd+bwd", eager, comp, "fwdbwd_ms"))
            yield {"part": "attention", **comp}
    if "model" in a.parts:
        for mode in a.modes:
            eager = model_cell(ctx, a.size, a.seq_len, a.batch_size, mode, a.precision, False)
            yield {"part": "model", **eager}
            comp = model_cell(ctx, a.size, a.seq_len, a.batch_size, mode, a.precision, True)
            comparisons.append(_compare(
                "model", f"{a.size} B={a.batch_size} T={a.seq_len} {a.precision} {mode}",
                eager, comp, "ms"))
            yield {"part": "model", **comp}
