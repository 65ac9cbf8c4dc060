"""The output folder: what it already holds (resume or refuse), and the shard writer
that cuts the token stream into val then train shards with metadata.json after each.

Without --val-tokens (val_tokens None) the writer holds the stream's first tokens, up to
VAL_SHARE x DEFAULT_VAL_TOKENS, before it writes anything: an input that reaches that
many gets the default validation split, a smaller one a VAL_SHARE-th of itself, cut where
its end showed its size (each shard's resume position is kept for that cut)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from gpt.core.fileio import atomic_write
from gpt.data.prepare.config import (DEFAULT_VAL_TOKENS, METADATA_NAME, VAL_SHARE, PrepareConfig,
                                     PrepareError)
from gpt.data.prepare.encode import Encoded
from gpt.data.prepare.pieces import Position
from gpt.data.shards import ShardError, shard_num_tokens, write_shard


_SHARD_FILE = re.compile(r"(train|val)_(\d{6,})\.bin")
_SHARD_TEMP = re.compile(r"\.(train|val)_\d{6,}\.bin\.tmp-\d+")



def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write_json_atomic(path: Path, obj: dict[str, Any]) -> None:
    data = (json.dumps(obj, indent=1) + "\n").encode()
    atomic_write(path, lambda fh: fh.write(data))


def _short_json(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _settings_diff(old: Any, new: dict[str, Any]) -> list[str]:
    """The settings that differ; a val_tokens of None (left to the run) matches any count
    recorded, the one the run settled on."""
    if not isinstance(old, dict):
        return ["no settings recorded"]
    return [
        f"{key}: {_short_json(old.get(key))} there, {_short_json(new[key])} now"
        for key in new
        if old.get(key) != new[key]
        and not (key == "val_tokens" and new[key] is None and isinstance(old.get(key), int))
    ]


@dataclass
class OutputFolder:
    shards: list[dict[str, Any]]  # complete shards on disk that a resume keeps
    complete: bool  # the recorded run finished and every shard is intact
    created: str
    to_delete: list[Path]  # removed just before the first new shard is written
    val_tokens: int | None = None  # the count recorded in its settings (a resume keeps it)


def inspect_output(out: Path, settings: dict[str, Any], overwrite: bool) -> OutputFolder:
    """What out_dir already holds; raises PrepareError rather than touch foreign data."""
    fresh = OutputFolder([], False, utc_now(), [])
    if not out.exists():
        return fresh
    if not out.is_dir():
        raise PrepareError(f"--out {out}: exists and is not a folder")
    meta_path = out / METADATA_NAME
    listing = list(out.iterdir())
    shard_files = sorted(p for p in listing if _SHARD_FILE.fullmatch(p.name))
    ours = shard_files + [p for p in listing if _SHARD_TEMP.fullmatch(p.name)]
    if overwrite:
        fresh.to_delete = ours + ([meta_path] if meta_path.exists() else [])
        return fresh
    if not meta_path.exists():
        if shard_files:
            raise PrepareError(
                f"--out {out}: holds {len(shard_files)} shard files but no {METADATA_NAME}, "
                f"so their tokenizer and settings are unknown; pass --overwrite to delete them, "
                f"or choose another --out"
            )
        return fresh
    try:
        meta = json.loads(meta_path.read_text())
        recorded = list(meta["shards"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PrepareError(f"{meta_path}: unreadable ({e}); pass --overwrite to start over") from None
    diffs = _settings_diff(meta.get("settings"), settings)
    if diffs:
        raise PrepareError(
            f"--out {out}: holds shards made with other settings ({'; '.join(diffs)}); "
            f"pass --overwrite to delete them and start over, or choose another --out"
        )
    kept: list[dict[str, Any]] = []
    for entry in recorded:  # keep the longest prefix of intact shards
        try:
            if not _SHARD_FILE.fullmatch(entry["name"]) or shard_num_tokens(out / entry["name"]) != entry["tokens"]:
                break
            Position(**entry["next"])
        except ShardError:
            break
        except (KeyError, TypeError) as e:
            raise PrepareError(f"{meta_path}: unreadable shard entry ({e!r}); pass --overwrite to start over") from None
        kept.append(entry)
    names = {e["name"] for e in kept}
    stale = [p for p in ours if p.name not in names]  # a crash's leftovers: rewritten anyway
    complete = bool(meta.get("complete")) and len(kept) == len(recorded)
    val = meta["settings"].get("val_tokens")
    return OutputFolder(kept, complete, str(meta.get("created", utc_now())), [] if complete else stale,
                        val if isinstance(val, int) else None)


def shard_totals(shards: list[dict[str, Any]]) -> dict[str, int]:
    """metadata.json's "totals" of a list of shard entries (its key order is the file's)."""
    val = sum(s["tokens"] for s in shards if s["split"] == "val")
    train = sum(s["tokens"] for s in shards if s["split"] == "train")
    return {
        "tokens": val + train,
        "val_tokens": val,
        "train_tokens": train,
        "documents": sum(s["documents"] for s in shards),
        "val_shards": sum(s["split"] == "val" for s in shards),
        "train_shards": sum(s["split"] == "train" for s in shards),
    }


class ShardWriter:
    """Cuts the token stream into val then train shards, each written atomically and
    followed by an atomic metadata.json update."""

    def __init__(
        self,
        out: Path,
        cfg: PrepareConfig,
        meta: dict[str, Any],
        existing: OutputFolder,
        on_shard: Callable[[dict[str, Any]], None] | None,
    ) -> None:
        self.out, self.cfg, self.meta, self.on_shard = out, cfg, meta, on_shard
        self.shards = list(existing.shards)
        self.to_delete = existing.to_delete
        totals = shard_totals(self.shards)
        # Tokens and shards on disk, kept up to date as shards are written.
        self.written = {"val": totals["val_tokens"], "train": totals["train_tokens"]}
        self.count = {"val": totals["val_shards"], "train": totals["train_shards"]}
        self.documents = totals["documents"]
        # Grown as a shard fills, up to one shard: a small input never reserves 100M tokens.
        self.buf = np.empty(min(cfg.shard_tokens, 1 << 20), dtype=np.uint16)
        self.filled = 0
        self.docs = 0  # documents starting in the current shard
        self.pos = Position(**self.shards[-1]["next"]) if self.shards else Position()
        self.val_tokens = cfg.val_tokens  # None: settled once the input's size shows (settle)
        # while it is unsettled: where each buffered token came from, and where documents start
        self.marks: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.doc_marks: list[np.ndarray] = []
        self.note: str | None = None  # how the split was sized, where it was left to the run
        self._begin()

    @property
    def total(self) -> int:
        """Tokens written or buffered so far."""
        return self.written["val"] + self.written["train"] + self.filled

    def _begin(self) -> None:
        if self.val_tokens is None:  # held until VAL_SHARE defaults' worth, or the end
            self.split, self.limit = "val", VAL_SHARE * DEFAULT_VAL_TOKENS
        elif self.written["val"] < self.val_tokens:
            self.split, self.limit = "val", min(self.cfg.shard_tokens, self.val_tokens - self.written["val"])
        else:
            self.split, self.limit = "train", self.cfg.shard_tokens


    def _room(self) -> int:
        room = self.limit - self.filled
        if self.cfg.max_tokens is not None:
            room = min(room, self.cfg.max_tokens - self.total)
        return room

    def done(self) -> bool:
        return self.cfg.max_tokens is not None and self.total >= self.cfg.max_tokens

    def feed(self, encoded: Encoded, skip: int = 0) -> None:
        """Append an encoded task's tokens from index `skip` on, writing every shard that fills."""
        tokens, lens, records, pieces = encoded
        ends = np.cumsum(lens)
        starts = ends - lens
        doc_starts = starts[pieces == 0]
        if self.val_tokens is None:  # unsettled: the buffer starts the stream (nothing kept)
            self.marks.append((self.filled - skip, ends, starts, records, pieces))
            self.doc_marks.append(self.filled - skip + doc_starts[doc_starts >= skip])
        p = skip
        while p < tokens.size and not self.done():
            take = min(self._room(), tokens.size - p)
            if self.filled + take > self.buf.size:
                self._grow(self.filled + take)
            self.buf[self.filled : self.filled + take] = tokens[p : p + take]
            self.docs += int(np.searchsorted(doc_starts, p + take) - np.searchsorted(doc_starts, p))
            self.filled += take
            p += take
            j = int(np.searchsorted(ends, p, side="left"))  # the piece holding token p - 1
            self.pos = Position(int(records[j]), int(pieces[j]), int(p - starts[j]))
            if self.filled == self.limit:
                if self.val_tokens is None:
                    self.settle(DEFAULT_VAL_TOKENS, ended=False)
                else:
                    self._flush()

    def settle(self, val: int, ended: bool) -> None:
        """The validation split decided at `val` tokens: the held tokens written as val
        shards up to it and train shards after it, each of at most --shard-tokens (the
        last train one kept in the buffer unless the input `ended`)."""
        held, total = self.buf[: self.filled].copy(), self.filled
        self.val_tokens = val
        self.meta = {**self.meta, "settings": {**self.meta["settings"], "val_tokens": val}}
        docs = np.concatenate(self.doc_marks) if self.doc_marks else np.empty(0, np.int64)
        cuts = [*range(0, val, self.cfg.shard_tokens), val,
                *range(val + self.cfg.shard_tokens, total, self.cfg.shard_tokens), total]
        pieces = [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]
        if not ended and pieces and pieces[-1][0] >= val:
            pieces.pop()  # the train shard being filled stays in the buffer
        for a, b in pieces:
            self.split = "val" if b <= val else "train"
            self.buf[: b - a] = held[a:b]
            self.filled = b - a
            self.docs = int(np.searchsorted(docs, b) - np.searchsorted(docs, a))
            self._write(self._position_at(b))
            if self.on_shard is not None:
                self.on_shard(self.shards[-1])
        self.marks, self.doc_marks = [], []
        self._begin()
        done = pieces[-1][1] if pieces else 0
        self.buf[: total - done] = held[done:]
        self.filled = total - done
        self.docs = int(len(docs) - np.searchsorted(docs, done))

    def _position_at(self, t: int) -> Position:
        """Where the stream stands after its held token t - 1 (from the marks)."""
        for offset, ends, starts, records, pieces in reversed(self.marks):
            if offset < t:
                j = int(np.searchsorted(ends, t - offset, side="left"))
                return Position(int(records[j]), int(pieces[j]), int(t - offset - starts[j]))
        return Position()

    def _grow(self, need: int) -> None:
        most = max(self.cfg.shard_tokens, self.limit)  # an unsettled split holds more than a shard
        bigger = np.empty(min(most, max(need, 2 * self.buf.size)), dtype=np.uint16)
        bigger[: self.filled] = self.buf[: self.filled]
        self.buf = bigger

    def finish(self) -> None:
        """Write the last, partial shard (an unsettled split settled on a VAL_SHARE-th of
        the input); remove files a finished run must not leave."""
        if self.val_tokens is None:
            total = self.filled
            self.settle(total // VAL_SHARE, ended=True)
            self.note = (f"--val-tokens {self.val_tokens:,}: a tenth of the input's {total:,} "
                         f"tokens (the default {DEFAULT_VAL_TOKENS:,} is for inputs of "
                         f"{VAL_SHARE * DEFAULT_VAL_TOKENS:,} or more); --val-tokens N chooses")
        elif self.filled:
            self._flush()
        self._delete_old()

    def _delete_old(self) -> None:
        # --overwrite's old shards, or a crashed run's unrecorded ones: deleted only once
        # new data is ready, so a failing run leaves the folder as it was.
        for path in self.to_delete:
            path.unlink(missing_ok=True)
        self.to_delete = []

    def _flush(self) -> None:
        self._write(self.pos)
        self._begin()
        if self.on_shard is not None:
            self.on_shard(self.shards[-1])

    def _write(self, next_pos: Position) -> None:
        """The buffer written as the split's next shard, `next_pos` where its stream ends."""
        self._delete_old()
        if not self.shards:
            # The run's settings are on disk before its first shard: a kill between the two
            # leaves a folder that the same command resumes (the shard is unrecorded, so
            # it is written again), never one it refuses as foreign data.
            self.write_metadata(complete=False)
        name = f"{self.split}_{self.count[self.split]:06d}.bin"
        write_shard(self.out / name, self.buf[: self.filled])
        entry = {"name": name, "split": self.split, "tokens": self.filled, "documents": self.docs,
                 "next": asdict(next_pos)}
        self.shards.append(entry)
        self.written[self.split] += self.filled
        self.count[self.split] += 1
        self.documents += self.docs
        self.filled = self.docs = 0
        self.write_metadata(complete=False)

    def discard(self, kept: int) -> None:
        """Remove what this run wrote after the `kept` shards it found (a refused input
        leaves nothing behind), metadata.json too where it kept none."""
        for entry in self.shards[kept:]:
            (self.out / entry["name"]).unlink(missing_ok=True)
        del self.shards[kept:]
        if not kept:
            (self.out / METADATA_NAME).unlink(missing_ok=True)

    def write_metadata(self, complete: bool) -> None:
        meta = dict(self.meta)
        meta.update(
            complete=complete,
            updated=utc_now(),
            shards=self.shards,
            totals=shard_totals(self.shards),
        )
        try:
            _write_json_atomic(self.out / METADATA_NAME, meta)
        except OSError as e:  # a full disk, a quota, a file-size limit
            raise PrepareError(f"{self.out / METADATA_NAME}: cannot write it ({e.strerror or e}); "
                               f"the shards written so far are kept: fix it and run the same "
                               f"command to resume") from None
