"""Run records (device, versions, flags, commit) and the stdout / markdown / JSON outputs."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from gpt.dist import device_name

REPO_ROOT = Path(__file__).resolve().parents[2]


def git_commit() -> tuple[str | None, bool | None]:
    """(commit of the checkout this package runs from, whether it has local changes)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None, None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
        return head.stdout.strip() or None, dirty
    except (OSError, subprocess.SubprocessError):
        return None, None


def tf32_flags() -> dict[str, Any]:
    return {
        "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def run_info(command: str, device: torch.device, argv: Sequence[str] | None = None,
             peak_tflops: float | None = None, peak_source: str | None = None) -> dict[str, Any]:
    """The header every result file carries."""
    commit, dirty = git_commit()
    info: dict[str, Any] = {
        "bench": command,
        "command": " ".join(["python -m gpt.bench", *(argv if argv is not None else sys.argv[1:])]),
        "device": device_name(device),
        "device_type": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "tf32": tf32_flags(),
        "commit": commit,
        "commit_dirty": dirty,
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "peak_tflops": peak_tflops,
        "peak_tflops_source": peak_source,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu_memory_bytes"] = int(props.total_memory)
        info["compute_capability"] = f"{props.major}.{props.minor}"
        info["gpu_count"] = torch.cuda.device_count()
    else:
        info["cpu_threads"] = torch.get_num_threads()
        info["cpu_count"] = os.cpu_count()
    return info


# --------------------------------------------------------------------------------------
# Formatting


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


@dataclass
class Section:
    title: str
    results: Sequence[dict[str, Any]]
    columns: Sequence[Column]
    notes: Sequence[str] = ()


def md_header(info: dict[str, Any]) -> str:
    tf32 = info.get("tf32", {})
    lines = [
        f"# gpt.bench {info.get('bench')}",
        "",
        f"- command: `{info.get('command')}`",
        f"- device: {info.get('device')} ({info.get('device_type')})",
        f"- torch {info.get('torch')}, CUDA {info.get('cuda')}, cuDNN {info.get('cudnn')}, "
        f"Python {info.get('python')}",
        f"- tf32 at start: matmul {tf32.get('cuda_matmul_allow_tf32')}, cudnn "
        f"{tf32.get('cudnn_allow_tf32')} (each row records its own setting)",
        f"- commit: {info.get('commit')}" + (" (with local changes)" if info.get("commit_dirty") else ""),
        f"- time: {info.get('time')}",
        "- peak bf16 TFLOP/s for MFU: "
        + (f"{info['peak_tflops']:g} ({info.get('peak_tflops_source')})"
           if info.get("peak_tflops") else "unknown (MFU not reported; set --peak-tflops)"),
    ]
    return "\n".join(lines)


def render_markdown(info: dict[str, Any], sections: Sequence[Section]) -> str:
    parts = [md_header(info)]
    for s in sections:
        parts.append(f"\n## {s.title}\n")
        parts.append(md_table(s.results, s.columns))
        for note in s.notes:
            parts.append(f"\n{note}")
    return "\n".join(parts) + "\n"


def render_text(info: dict[str, Any], sections: Sequence[Section]) -> str:
    peak = info.get("peak_tflops")
    parts = [f"device: {info.get('device')} | torch {info.get('torch')} | CUDA {info.get('cuda')}"
             f" | commit {str(info.get('commit'))[:12]} | peak "
             + (f"{peak:g} TFLOP/s" if peak else "unknown (MFU unknown)")]
    for s in sections:
        parts.append(f"\n== {s.title} ==")
        parts.append(text_table(s.results, s.columns))
        parts.extend(s.notes)
    return "\n".join(parts)


def write_outputs(out_dir: str | Path, name: str, payload: dict[str, Any],
                  markdown: str) -> tuple[Path, Path]:
    """Write ``<out>/<name>.json`` and ``<out>/<name>.md`` (via a temporary file + rename,
    so a sweep killed while writing never leaves a truncated file behind)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / f"{name}.json", out / f"{name}.md"
    for path, text in ((json_path, json.dumps(payload, indent=2, default=_json_default) + "\n"),
                       (md_path, markdown)):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return json_path, md_path


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (torch.dtype, torch.device, Path)):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
