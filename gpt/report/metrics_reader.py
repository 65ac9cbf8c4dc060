"""A run's metrics.jsonl read back: its records by type and step (the later record for a
step wins; a resumed run's superseded records dropped; a line cut short by a crash
skipped and counted), and the run's recipe in a line, for a figure's title. Only the
standard library: reading needs no matplotlib."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt.core.units import human_count


PLOTTED = ("train", "val", "hellaswag")


@dataclass
class RunMetrics:
    """A run's records by type, each keyed by step (the latest record for a step wins)."""

    path: Path
    label: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    records: dict[str, dict[int, dict[str, Any]]] = field(
        default_factory=lambda: {k: {} for k in PLOTTED})
    bad_lines: int = 0

    def series(self, kind: str, key: str) -> tuple[list[int], list[float]]:
        """Sorted (steps, values) of one field, skipping missing and non-finite values."""
        steps, values = [], []
        for step in sorted(self.records.get(kind, {})):
            v = self.records[kind][step].get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                steps.append(step)
                values.append(float(v))
        return steps, values


def run_title(run: RunMetrics) -> str:
    """The run's folder and its recipe, from the newest header record: model, parameters,
    tokens (steps x tokens a step), peak learning rate, optimizer, device."""
    head = run.runs[-1] if run.runs else {}
    cfg = head.get("config")
    if not isinstance(cfg, dict):
        return str(run.path.parent)
    try:
        train, data, optim = cfg["train"], cfg["data"], cfg["optim"]
        steps, batch = int(train["max_steps"]), int(data["total_batch_tokens"])
        parts = [f"{cfg.get('preset') or 'custom'} model"]
        if isinstance(head.get("params"), int):
            parts[0] += f", {human_count(head['params'])} params"
        parts.append(f"{human_count(steps * batch)} tokens ({steps:,} steps x {human_count(batch)})")
        parts.append(f"max lr {float(optim['max_lr']):g}, {optim.get('optimizer', 'adamw')}")
        if head.get("device_name"):
            parts.append(f"{head['device_name']} x {head.get('world_size', 1)}")
    except (KeyError, TypeError, ValueError):  # a header from another version: the folder
        return str(run.path.parent)
    return f"{run.path.parent}: " + "; ".join(parts)


def resolve_path(path: str | Path) -> Path:
    p = Path(path)
    return p / "metrics.jsonl" if p.is_dir() else p


def read_records(path: str | Path) -> tuple[list[dict[str, Any]], int]:
    """(the JSON objects of a JSONL file in order, number of unreadable lines)."""
    records, bad = [], 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(rec, dict):
                records.append(rec)
            else:
                bad += 1
    return records, bad


def _step(rec: dict[str, Any]) -> int | None:
    s = rec.get("step")
    if isinstance(s, bool):
        return None
    if isinstance(s, int):
        return s
    if isinstance(s, float) and s.is_integer():
        return int(s)
    return None


def load_metrics(path: str | Path, label: str | None = None) -> RunMetrics:
    path = resolve_path(path)
    records, bad = read_records(path)
    out = RunMetrics(path=path, label=label or path.parent.name or path.stem, bad_lines=bad)
    # Split at "run" records: each segment is one start (first run or a resume).
    segments: list[list[dict[str, Any]]] = [[]]
    for rec in records:
        if rec.get("type") == "run" and segments[-1]:
            segments.append([])
        segments[-1].append(rec)
    for seg in segments:
        head = seg[0] if seg and seg[0].get("type") == "run" else None
        if head is not None:
            out.runs.append(head)
        steps = [s for r in seg if r.get("type") in PLOTTED and (s := _step(r)) is not None]
        if steps:
            start = head.get("start_step") if head is not None else None
            first = start if isinstance(start, int) and not isinstance(start, bool) else min(steps)
            # Drop what an earlier attempt logged past the resume point: its training steps
            # from `first` on (they are redone), its evaluations after `first` (an
            # evaluation at `first` itself scored the checkpointed weights, still valid).
            for kind, by_step in out.records.items():
                cut = first if kind == "train" else first + 1
                for s in [s for s in by_step if s >= cut]:
                    del by_step[s]
        for r in seg:
            kind, s = r.get("type"), _step(r)
            if kind in PLOTTED and s is not None:
                out.records[kind][s] = r
    return out
