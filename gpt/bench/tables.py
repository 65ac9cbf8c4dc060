"""Every table the subcommands print or write: rows are result dicts, columns say how each
cell of a row reads (Column, or col() for one field), and the same columns render as aligned
text for a terminal (text_table) or as markdown (md_table). The number formats live here too.

Torch-free: the standalone subcommands use it before (or without) torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence


def fmt(spec: str) -> Callable[[Any], str]:
    """A format spec (".2f", ",.0f", ...) as a cell's formatter; "-" for a missing value."""
    return lambda x: "-" if x is None else format(x, spec)


def fmt_ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if x < 10 else f"{x:.2f}" if x < 1000 else f"{x:,.0f}"


def fmt_int(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def fmt_mem(nbytes: int | None) -> str:
    if nbytes is None:
        return "n/a"
    if nbytes >= 1 << 30:
        return f"{nbytes / (1 << 30):.2f} GiB"
    return f"{nbytes / (1 << 20):.1f} MiB"


def fmt_pct(x: float | None, unknown: str = "unknown") -> str:
    return unknown if x is None else f"{100 * x:.1f}%"


def fmt_x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def status_text(r: dict[str, Any], limit: int = 60) -> str:
    status = r.get("status", "ok")
    if status == "ok":
        return "ok" + (" (launch-bound)" if r.get("launch_bound") else "")
    if status == "oom":
        return "OOM"
    detail = r.get("reason") or r.get("error") or ""
    text = f"{status}: {detail}" if detail else status
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[dict[str, Any]], str]
    align: str = "right"  # or "left"


def col(header: str, key: str, fmt: Callable[[Any], str] = str, align: str = "right", *,
        ok_only: bool = False) -> Column:
    """A column showing one field of each row through ``fmt``; with ``ok_only``, "-" in a
    row whose status is not ok (a failed cell's partial figures are not results)."""
    def cell(r: dict[str, Any]) -> str:
        return "-" if ok_only and r.get("status") != "ok" else fmt(r.get(key))
    return Column(header, cell, align)


# Columns several subcommands' tables share
STATUS = Column("status", status_text, "left")
PEAK_MEM = col("peak mem", "peak_mem_bytes", fmt_mem, ok_only=True)
MFU = col("MFU", "mfu", fmt_pct, ok_only=True)


def _rows(results: Sequence[dict[str, Any]], columns: Sequence[Column]) -> list[list[str]]:
    return [[c.cell(r) for c in columns] for r in results]


def text_table(results: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    rows = _rows(results, columns)
    widths = [max([len(c.header), *(len(row[i]) for row in rows)]) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, (text, c) in enumerate(zip(cells, columns)):
            last = i == len(columns) - 1
            if c.align == "left":
                out.append(text if last else text.ljust(widths[i]))
            else:
                out.append(text.rjust(widths[i]))
        return "  ".join(out).rstrip()

    return "\n".join([line([c.header for c in columns]),
                      line(["-" * w for w in widths]),
                      *(line(r) for r in rows)])


def md_table(results: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(esc(c.header) for c in columns) + " |"
    rule = "|" + "|".join("---:" if c.align == "right" else ":---" for c in columns) + "|"
    body = ["| " + " | ".join(esc(x) for x in row) + " |" for row in _rows(results, columns)]
    return "\n".join([head, rule, *body])
