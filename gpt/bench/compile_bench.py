"""`compile`: eager versus torch.compile, for attention and for the whole model.

Each compiled cell starts from a reset compiler cache, so its first call is a full
compilation. That first call is reported apart ("compile s" = first call minus one
steady-state call) and is never part of the steady-state statistics; "break-even" is how
many steps the compiled version needs to win its compilation time back.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpt.bench import report
from gpt.bench.attention import attention_cell
from gpt.bench.common import MODES, PRECISIONS, Context, add_common_args, expand_sizes
from gpt.bench.model_bench import MODEL_COLUMNS, model_cell
from gpt.bench.report import Column, fmt_ms, fmt_x, status_text


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compile")
    p.add_argument("--parts", nargs="+", choices=["model", "attention"],
                   default=["model", "attention"], help="what to compare")
    g = p.add_argument_group("model")
    g.add_argument("--size", default=None, help="preset (default gpt2 on CUDA, tiny elsewhere)")
    g.add_argument("--seq-len", type=int, default=None, help="context (default 1024 on CUDA, 64 elsewhere)")
    g.add_argument("--batch-size", type=int, default=None, help="batch (default 8 on CUDA, 2 elsewhere)")
    g.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    g.add_argument("--precision", choices=list(PRECISIONS), default=None,
                   help="default bf16 on CUDA, fp32 elsewhere")
    g = p.add_argument_group("attention")
    g.add_argument("--attn-impls", nargs="+", choices=["naive", "sdpa"], default=["naive", "sdpa"],
                   help="attention implementations compared eager vs compiled")
    g.add_argument("--head-dim", type=int, default=None, help="default 64 on CUDA, 16 elsewhere")
    g.add_argument("--attn-seq-len", type=int, default=None, help="default 1024 on CUDA, 64 elsewhere")
    g.add_argument("--attn-batch-size", type=int, default=None, help="default 8 on CUDA, 2 elsewhere")
    g.add_argument("--n-head", type=int, default=None, help="default 12 on CUDA, 2 elsewhere")
    add_common_args(p)


def _resolve(ctx: Context) -> None:
    a = ctx.args
    cuda = ctx.device.type == "cuda"
    defaults = {"size": "gpt2" if cuda else "tiny", "seq_len": 1024 if cuda else 64,
                "batch_size": 8 if cuda else 2, "precision": "bf16" if cuda else "fp32",
                "head_dim": 64 if cuda else 16, "attn_seq_len": 1024 if cuda else 64,
                "attn_batch_size": 8 if cuda else 2, "n_head": 12 if cuda else 2}
    used = []
    for key, value in defaults.items():
        if getattr(a, key) is None:
            setattr(a, key, value)
            used.append(key)
    a.size = expand_sizes([a.size])[0]
    if not cuda and used:
        ctx.log("note: no CUDA device; small defaults (model "
                f"{a.size} B={a.batch_size} T={a.seq_len}; attention d={a.head_dim} "
                f"T={a.attn_seq_len}). Compiling on a CPU takes a while.")


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
    Column("part", lambda r: r["part"], "left"),
    Column("what", lambda r: r["what"], "left"),
    Column("eager ms", lambda r: fmt_ms(r.get("eager_ms"))),
    Column("compiled ms", lambda r: fmt_ms(r.get("compiled_ms"))),
    Column("speed-up", lambda r: fmt_x(r.get("speedup"))),
    Column("compile s", lambda r: "-" if r.get("compile_s") is None else f"{r['compile_s']:.1f}"),
    Column("break-even steps", lambda r: "-" if r.get("break_even_steps") is None
           else f"{r['break_even_steps']:,.0f}"),
    Column("status", status_text, "left"),
]

ATTN_COLUMNS = [
    Column("impl", lambda r: r["impl"], "left"),
    Column("d", lambda r: str(r["head_dim"])),
    Column("T", lambda r: str(r["seq_len"])),
    Column("fwd ms", lambda r: fmt_ms(r.get("fwd_ms"))),
    Column("bwd ms", lambda r: fmt_ms(r.get("bwd_ms"))),
    Column("first call ms", lambda r: fmt_ms(r.get("first_call_ms"))),
    Column("status", status_text, "left"),
]


def run(ctx: Context) -> tuple[list[dict[str, Any]], list[report.Section]]:
    _resolve(ctx)
    a = ctx.args
    model_rows: list[dict[str, Any]] = []
    attn_rows: list[dict[str, Any]] = []
    comparisons: list[dict[str, Any]] = []
    ctx.extra["comparisons"] = comparisons

    def sections() -> list[report.Section]:
        out = [report.Section(
            "eager vs compiled", comparisons, COMPARE_COLUMNS,
            ["Median ms per call. compile s = compiled first call minus one steady-state "
             "call; break-even = compile time / time saved per call."])]
        if model_rows:
            out.append(report.Section("model cells", model_rows, MODEL_COLUMNS))
        if attn_rows:
            out.append(report.Section("attention cells", attn_rows, ATTN_COLUMNS))
        return out

    def results() -> list[dict[str, Any]]:
        return [*({"part": "model", **r} for r in model_rows),
                *({"part": "attention", **r} for r in attn_rows)]

    with ctx.memory_snapshot():
        # Each pair is saved after its eager cell, then with the compiled cell and the
        # comparison together.
        if "attention" in a.parts:
            def attn_cell(impl: str) -> dict[str, Any]:
                r = attention_cell(ctx, impl, a.head_dim, a.attn_seq_len, a.attn_batch_size,
                                   a.n_head, "bf16" if ctx.device.type == "cuda" else "fp32")
                attn_rows.append(r)
                return r

            for impl in a.attn_impls:
                eager = attn_cell(impl)
                ctx.save(results(), sections())
                comp = attn_cell(f"{impl}-compiled")
                label = f"{impl} attention d={a.head_dim} T={a.attn_seq_len}"
                comparisons.append(_compare("attention", f"{label} fwd", eager, comp, "fwd_ms"))
                comparisons.append(_compare("attention", f"{label} fwd+bwd", eager, comp,
                                            "fwdbwd_ms"))
                ctx.save(results(), sections())
        if "model" in a.parts:
            def cell(mode: str, compiled: bool) -> dict[str, Any]:
                r = model_cell(ctx, a.size, a.seq_len, a.batch_size, mode, a.precision, compiled)
                model_rows.append(r)
                return r

            for mode in a.modes:
                eager = cell(mode, False)
                ctx.save(results(), sections())
                comp = cell(mode, True)
                comparisons.append(_compare(
                    "model", f"{a.size} B={a.batch_size} T={a.seq_len} {a.precision} {mode}",
                    eager, comp, "ms"))
                ctx.save(results(), sections())
    return results(), sections()
