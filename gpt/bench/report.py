"""A timing subcommand's run: its header (device, versions, TF32 flags, commit; see
benchmarks/README.md) and its sections rendered for stdout and markdown."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from gpt.bench.record import header
from gpt.bench.tables import Column, md_table, text_table
from gpt.core.compat import tf32_switches
from gpt.runtime.device import device_name


def tf32_flags() -> dict[str, Any]:
    matmul, cudnn = tf32_switches()
    return {
        "cuda_matmul_allow_tf32": matmul,
        "cudnn_allow_tf32": cudnn,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def machine(device: torch.device) -> dict[str, Any]:
    """The device and the versions a result was measured with (the timing runs', tokens',
    comm's and the GPU acceptance's records share these fields)."""
    info: dict[str, Any] = {
        "device": device_name(device),
        "device_type": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu_memory_bytes"] = int(props.total_memory)
        info["compute_capability"] = f"{props.major}.{props.minor}"
        info["gpu_count"] = torch.cuda.device_count()
    else:
        info["cpu_threads"] = torch.get_num_threads()
    return info


def run_info(command: str, device: torch.device, argv: Sequence[str],
             peak_tflops: float | None = None, peak_source: str | None = None) -> dict[str, Any]:
    """The header every timing result file carries (and `tokens`' too)."""
    return {"bench": command, **header(argv), **machine(device), "tf32": tf32_flags(),
            "peak_tflops": peak_tflops, "peak_tflops_source": peak_source}


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
