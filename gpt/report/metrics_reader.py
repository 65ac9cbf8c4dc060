"""A run's metrics.jsonl read back: the plotted fields of its records by type and step
(the later record for a step wins; a resumed run's superseded records dropped; a line cut
short by a crash skipped and counted), and the run's recipe in a line, for a figure's
title. Only the standard library: reading needs no matplotlib.

The file is read a line at a time and only the figures the curves draw are kept, in
arrays of 8 bytes a value: a long run's log (hundreds of MB, a million steps) is read in
one pass and held in tens of MB, where its records as dicts took gigabytes. A value that
is NaN or infinite in the log (a diverging loss), or beyond HUGE (no axis can hold it), is
kept as non-finite (the figure marks it); a field a record lacks is left out. A line that
is not a record (cut short, nested past the parser's depth, a step outside 0 to MAX_STEP)
is skipped and counted. The run's events are kept for the figure to mark: each resume's
step and each stop's (a signal, --stop-at-step), with the header facts that make runs
compare (device, processes, threads, batch)."""

from __future__ import annotations

import bisect
import json
import math
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from gpt.core.config import Config
from gpt.core.config_io import from_dict
from gpt.core.errors import UserError
from gpt.core.units import human_count


# the record types every figure draws, and the fields of each that are kept; an
# evaluation's own records are kept where a Panel asks for them
FIELDS = {"train": ("loss", "lr", "tokens_per_s"), "val": ("val_loss",)}


@dataclass(frozen=True)
class Panel:
    """A panel of the curves' figure beside loss, learning rate and tokens/s: the fields
    of one record type, each a line. The caller says which (the evaluations' own:
    gpt/eval/evaluation.py's panels, passed down by gpt/train/run_curves.py), so this
    layer names none."""

    record: str  # the record type ("type" in metrics.jsonl)
    lines: tuple[tuple[str, str], ...]  # (field, legend word): the first solid, the rest dotted
    title: str
    ylabel: str
_MISSING = math.nan  # a field the record lacks (or holds as null): not drawn
_NONFINITE = math.inf  # a value that was NaN or +-inf in the log: drawn as a mark
HUGE = 1e30  # a value beyond this is drawn as a non-finite one: an axis cannot span it
MAX_STEP = 2**53  # steps are whole numbers a float holds exactly (and an int64 array)


class Table:
    """One record type's kept fields, by step, in step order: parallel arrays."""

    def __init__(self, fields: tuple[str, ...]) -> None:
        self.fields = fields
        self.steps = array("q")
        self.columns = {f: array("d") for f in fields}

    def __len__(self) -> int:
        return len(self.steps)

    def put(self, step: int, record: dict[str, Any]) -> None:
        """The record's fields at `step`, replacing what an earlier record said of it."""
        row = [_value(record.get(f)) for f in self.fields]
        steps, at = self.steps, len(self.steps)
        if at and step <= steps[-1]:  # out of order (a step logged again): find its place
            at = bisect.bisect_left(steps, step)
            if steps[at] == step:
                for f, v in zip(self.fields, row):
                    self.columns[f][at] = v
                return
            steps.insert(at, step)
            for f, v in zip(self.fields, row):
                self.columns[f].insert(at, v)
            return
        steps.append(step)
        for f, v in zip(self.fields, row):
            self.columns[f].append(v)

    def cut(self, step: int) -> None:
        """Forget every step from `step` on."""
        at = bisect.bisect_left(self.steps, step)
        del self.steps[at:]
        for column in self.columns.values():
            del column[at:]


def _value(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return _MISSING
    try:
        f = float(v)
    except OverflowError:  # an int beyond any float
        return _NONFINITE
    return f if math.isfinite(f) and abs(f) <= HUGE else _NONFINITE


@dataclass
class RunMetrics:
    """A run's plotted figures by type, each by step (the latest record for a step wins);
    its header records ("run", one per start) in order."""

    path: Path
    label: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    tables: dict[str, Table] = field(
        default_factory=lambda: {kind: Table(fields) for kind, fields in FIELDS.items()})
    panels: tuple[Panel, ...] = ()  # the evaluations' panels its tables were read for
    bad_lines: int = 0
    events: list[tuple[int, str]] = field(default_factory=list)  # (step, "resumed" / "stopped (why)")
    # The learning rates as the schedule set them at every step, by log field ("lr", and
    # an optimizer's own where it has others), where a caller that can compute the
    # schedule from the headers' config (gpt/optim/schedule.py: above this layer) has set
    # them; else None and the figure draws the learning rate the log sampled at its log
    # steps. lr_labels: each one's word in the legend, where there are several.
    lr_schedule: dict[str, tuple[list[int], list[float]]] | None = None
    lr_labels: dict[str, str] = field(default_factory=dict)

    def steps(self, kind: str) -> list[int]:
        """The steps that have a record of this type."""
        return list(self.tables[kind].steps) if kind in self.tables else []

    @property
    def empty(self) -> bool:
        return not any(len(t) for t in self.tables.values())

    def last_step(self, kind: str = "train") -> int | None:
        steps = self.tables[kind].steps if kind in self.tables else ()
        return steps[-1] if steps else None

    def series(self, kind: str, key: str) -> tuple[list[int], list[float]]:
        """Sorted (steps, values) of one field, skipping missing and non-finite values."""
        steps, values = [], []
        for s, v in self._column(kind, key):
            if math.isfinite(v):
                steps.append(s)
                values.append(v)
        return steps, values

    def nonfinite(self, kind: str, key: str) -> list[int]:
        """The steps where the field was NaN or infinite in the log (a diverging loss)."""
        return [s for s, v in self._column(kind, key) if v == _NONFINITE]

    def column(self, kind: str, key: str) -> tuple[array, array]:
        """(steps, values) as they are kept: NaN where a record lacked the field, inf where
        it was not finite; the arrays themselves (the figure reads them without copies)."""
        table = self.tables.get(kind)
        if table is None or key not in table.columns:
            return array("q"), array("d")
        return table.steps, table.columns[key]

    def _column(self, kind: str, key: str) -> Iterator[tuple[int, float]]:
        return zip(*self.column(kind, key))


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


def run_starts(headers: Sequence[Mapping[str, Any]]) -> list[tuple[int, Config]] | None:
    """A run's starts from its log's header records (one a start, each with its config and
    "start_step"): each start's step and config, in order, a start dropping the earlier
    ones at or after its step (a resume from an earlier checkpoint supersedes what ran
    from there). None where a header lacks what this needs (a log from elsewhere, or of
    another version's config)."""
    starts: list[tuple[int, Config]] = []
    for head in headers:
        start, cfg = head.get("start_step", 0 if not starts else None), head.get("config")
        if isinstance(start, bool) or not isinstance(start, int) or not isinstance(cfg, dict):
            return None
        try:
            config = from_dict(cfg)
        except (UserError, TypeError, ValueError, KeyError):  # another version's config
            return None
        starts = [(s, c) for s, c in starts if s < start]
        starts.append((start, config))
    return starts or None


def setup(run: RunMetrics) -> dict[str, str]:
    """What a run ran on, from its newest header, in words by field (device, processes,
    threads, batch): the facts that make two runs' tokens/s compare, or not."""
    head = run.runs[-1] if run.runs else {}
    cfg = head.get("config") if isinstance(head.get("config"), dict) else {}
    data = cfg.get("data") if isinstance(cfg.get("data"), dict) else {}
    world, threads = head.get("world_size"), head.get("threads")
    out = {"device": str(head.get("device_name") or head.get("device") or "unknown")[:60]}
    out["processes"] = str(world) if isinstance(world, int) else "unknown"
    out["threads"] = (f"{threads}{' each' if isinstance(world, int) and world > 1 else ''}"
                      if isinstance(threads, int) else "not logged")
    try:
        out["batch"] = (f"{int(data['batch_size'])} x {int(data['seq_len'])} x "
                        f"{int(head['grad_accum'])} accum, {human_count(int(data['total_batch_tokens']))}"
                        f" tokens/step")
    except (KeyError, TypeError, ValueError):
        out["batch"] = "unknown"
    return out


def differences(runs: list[RunMetrics]) -> list[str]:
    """For runs drawn together: one line a run naming what differs between them (of
    device, processes, threads, batch), or nothing where nothing does."""
    setups = [setup(run) for run in runs]
    differ = [key for key in setups[0] if len({s[key] for s in setups}) > 1] if setups else []
    if not differ:
        return []
    return [f"{run.label}: " + ", ".join(f"{key} {s[key]}" for key in differ)
            for run, s in zip(runs, setups)]


def resolve_path(path: str | Path) -> Path:
    p = Path(path)
    return p / "metrics.jsonl" if p.is_dir() else p


def read_records(path: str | Path) -> Iterator[dict[str, Any] | None]:
    """The JSON objects of a JSONL file in order, one line at a time; None for a line that
    is not one (cut short by a crash, or not an object). Blank lines are skipped."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, RecursionError):  # cut short, or nested too deep
                yield None
                continue
            yield rec if isinstance(rec, dict) else None


def _step(rec: dict[str, Any]) -> int | None:
    s = rec.get("step")
    if isinstance(s, bool):
        return None
    if isinstance(s, float) and s.is_integer():
        s = int(s)
    return s if isinstance(s, int) and 0 <= s < MAX_STEP else None


def load_metrics(path: str | Path, label: str | None = None,
                 panels: tuple[Panel, ...] = ()) -> RunMetrics:
    """The run's log read in one pass, with the records `panels` draw besides the
    figure's own (FIELDS). Each "run" record starts a segment (the first run or a
    resume): when its first plotted record comes, what an earlier attempt logged past the
    resume point is dropped (its training steps from the segment's start step on, which
    are redone; its evaluations after it: one at the start step itself scored the
    checkpointed weights and stays). The start step is the header's "start_step", else the
    segment's first plotted step."""
    path = resolve_path(path)
    out = RunMetrics(path=path, label=label or path.parent.name or path.stem, panels=panels)
    for panel in panels:
        kept = out.tables[panel.record].fields if panel.record in out.tables else ()
        wanted = tuple(dict.fromkeys((*kept, *(f for f, _ in panel.lines))))
        out.tables[panel.record] = Table(wanted)
    start: int | None = None  # the current segment's, until its first plotted record
    new_segment = False
    for rec in read_records(path):
        if rec is None:
            out.bad_lines += 1
            continue
        kind = rec.get("type")
        if kind == "run":
            out.runs.append(rec)
            start = _step({"step": rec.get("start_step")})
            new_segment = True
            if start:  # a resume: what an earlier attempt did past it is superseded
                out.events = [e for e in out.events if e[0] <= start] + [(start, "resumed")]
            continue
        if kind == "summary" and rec.get("stopped_by") and _step(rec) is not None:
            out.events.append((_step(rec), f"stopped ({str(rec['stopped_by'])[:40]})"))
            continue
        step = _step(rec) if kind in out.tables else None
        if step is None:
            if kind in out.tables:
                out.bad_lines += 1  # a step no run writes
            continue
        if new_segment:
            first = step if start is None else start
            for name, table in out.tables.items():
                table.cut(first if name == "train" else first + 1)
            new_segment = False
        out.tables[kind].put(step, rec)
    return out
