"""The tokens bench's run cache, `<--out>/tokens-runs.jsonl`: every run the bench completes,
one JSON object a line, so that a bench stopped part-way (a batch job's time limit, Ctrl-C, SIGTERM)
starts again where it was: a run whose key is in the file is read back, not trained again.

Each line (format 1) holds:

- ``key``: what determines the run's result, and all of it that is compared:
  ``flags``, the trainer's flags exactly as the bench passes them, ``--out-dir`` (a
  temporary folder) and ``--data-dir`` left out (see without_places); ``data``, the data folder's fingerprint (data_fingerprint):
  ``shards``, each train_/val_ shard file's name and the SHA-256 of its bytes (not
  metadata.json: it names the day and the temporary file a corpus was prepared from, so
  the same tokens prepared again later would not match); ``threads``, the
  OMP_NUM_THREADS the trainer runs inherit (unset: null), since the number of threads
  changes the order of the sums and so, slightly, the result.
- ``run``: the run's record as Bench.train returns it (label, seed, steps, lr, curve,
  final_val_loss, train_seconds, wall_seconds, flags, peak_mem_gb).
- where and when it ran (origin): ``commit`` and ``commit_dirty`` (the checkout, as
  gpt.bench.record.git_commit says), ``torch`` (its version), ``cpu`` (the CPU's model
  name), ``cpu_count`` (os.cpu_count()), ``platform``, ``time`` (UTC, ISO 8601).

The commit is recorded, not compared: a run is reused across commits (the bench's point is
to resume across invocations), so after a change to the trainer or the model pass --no-reuse.
Lines are only ever appended, each in one write, fsynced, so a killed bench leaves every
completed run and at worst a truncated last line, which the next read skips with a warning
(the next append starts on a line of its own). A key written twice (--no-reuse) is read
as its last line.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Sequence

from gpt.bench.record import git_commit, now
from gpt.core.errors import UserError
from gpt.core.fileio import fsync_dir
from gpt.data.shards import is_shard_name

CACHE_NAME = "tokens-runs.jsonl"
FORMAT = 1
ORIGIN = ("commit", "commit_dirty", "torch", "cpu", "cpu_count", "platform", "time")


def data_fingerprint(data_dir: str | Path) -> dict[str, Any]:
    """What a run's data is: every shard's SHA-256. The tokens bench's corpora are a few
    MB (3.3M tokens: 20 ms to hash), and the hash holds across preparations of the same
    text, where metadata.json's date and paths do not."""
    folder = Path(data_dir)
    try:
        shards = {p.name: _sha256(p) for p in sorted(folder.iterdir())
                  if p.is_file() and not p.name.startswith(".")
                  and (is_shard_name(p.name, "train") or is_shard_name(p.name, "val"))}
    except OSError as e:
        raise UserError(f"--data-dir {folder}: cannot read it for the run cache's "
                        f"fingerprint ({e.strerror or e})") from None
    return {"shards": shards}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo; else what platform knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def origin() -> dict[str, Any]:
    """This process's commit, torch and machine, and the time now: what a line records
    beside its run."""
    import torch  # the bench has loaded it already (its report header needs it)

    commit, dirty = git_commit()
    return {"commit": commit, "commit_dirty": dirty, "torch": torch.__version__,
            "cpu": cpu_model(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "time": now()}


PLACES = ("--out-dir", "--data-dir")  # where a run writes and reads: not what it computes


def without_places(flags: Sequence[str]) -> list[str]:
    """The flags less PLACES (``--out-dir DIR`` or ``--out-dir=DIR``, likewise --data-dir):
    the run's folder has no part in the result, and the data's is its fingerprint's, so the
    same corpus prepared into another folder later still matches."""
    out: list[str] = []
    skip = False
    for f in flags:
        if skip:
            skip = False
        elif f in PLACES:
            skip = True
        elif not f.startswith(tuple(f"{p}=" for p in PLACES)):
            out.append(f)
    return out


def _canonical(key: dict[str, Any]) -> str:
    """A key's text for lookups; flags without PLACES (also for lines written with them)."""
    return json.dumps({**key, "flags": without_places(key.get("flags") or [])}, sort_keys=True)


class RunCache:
    """The runs of `path`, by key, and appends to it. With reuse off the file is not read,
    only appended to."""

    def __init__(self, path: Path, data: dict[str, Any], reuse: bool = True) -> None:
        self.path, self.data, self.reuse = path, data, reuse
        self.lines: dict[str, dict[str, Any]] = self.read(path) if reuse else {}

    def key(self, flags: Sequence[str]) -> dict[str, Any]:
        return {"flags": without_places(flags), "data": self.data,
                "threads": os.environ.get("OMP_NUM_THREADS")}

    def origin(self) -> dict[str, Any]:
        """Where and when a run ended: asked again for every run, since each trainer run
        imports the checkout as it is then (a commit made while the bench runs is the next
        runs' commit)."""
        return origin()

    @staticmethod
    def read(path: Path) -> dict[str, dict[str, Any]]:
        """The lines of `path` by their key's canonical text (a later line wins); a line that
        is not a whole record (a killed writer's last) is skipped with a warning."""
        try:
            text = path.read_bytes().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise UserError(f"{path}: cannot read the run cache ({e.strerror or e}); move it "
                            f"away or pass --no-reuse") from None
        lines: dict[str, dict[str, Any]] = {}
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                if not (isinstance(entry, dict) and isinstance(entry.get("key"), dict)
                        and isinstance(entry.get("run"), dict)):
                    raise ValueError("not a cached run (no key and run)")
                if entry.get("format") != FORMAT:
                    raise ValueError(f"format {entry.get('format')!r}, not {FORMAT}")
            except ValueError as e:
                print(f"warning: {path} line {n}: skipped, not a whole cached run ({e}); "
                      f"a bench killed while writing leaves one", file=sys.stderr)
                continue
            lines[_canonical(entry["key"])] = entry
        return lines

    def get(self, key: dict[str, Any]) -> dict[str, Any] | None:
        """The cached line of `key` (with its run and origin), or None."""
        return self.lines.get(_canonical(key)) if self.reuse else None

    def add(self, key: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
        """Append the run's line and make it durable before returning it: one write (a
        newline first if a killed writer left the file without one), then fsync."""
        entry = {"format": FORMAT, "key": key, "run": run, **self.origin()}
        data = (json.dumps(entry) + "\n").encode()
        new = not self.path.exists()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                if os.fstat(fd).st_size and not _ends_with_newline(self.path):
                    data = b"\n" + data
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise UserError(f"{self.path}: cannot append to the run cache "
                            f"({e.strerror or e})") from None
        if new:
            fsync_dir(self.path.parent)
        self.lines[_canonical(key)] = entry
        return entry


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


def origins(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The distinct commits and machines the runs came from (time left out), with how many
    runs each, in the order first met."""
    seen: dict[str, dict[str, Any]] = {}
    for r in runs:
        o = {k: r.get("origin", {}).get(k) for k in ORIGIN if k != "time"}
        seen.setdefault(json.dumps(o, sort_keys=True), {**o, "runs": 0})["runs"] += 1
    return list(seen.values())
