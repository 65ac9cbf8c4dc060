"""Turn text into the token shards train_gpt2.py reads (format: gpt/shards.py).

One pass over the input, in bounded memory:

    records -> pieces -> tasks -> worker processes (tokenize) -> in-order results -> shards

* A *record* is one input document: a ``.txt`` file (or one paragraph of it with
  ``txt_split_on_blank_lines``), one line of a JSON-lines file, one JSON array element,
  one parquet row, one Hugging Face dataset example. Records whose text is empty or null
  (and blank lines) are skipped.
* A record's text is cut into *pieces* of about ``PIECE_CHARS`` characters, only at points
  where GPT-2's pre-tokenizer always splits anyway (see ``split_pieces``), so encoding the
  pieces one by one gives exactly the tokens of the whole text. A huge ``.txt`` file is
  therefore never held in memory, and one long document still spreads over all workers.
* Pieces are grouped into *tasks* of about ``TASK_CHARS`` characters; JSON-lines files go
  to the workers as raw blocks of about ``TASK_CHARS`` bytes of whole lines, which the
  workers parse and cut themselves, so the main process does little more than read files.
  Workers return each task as one compact uint16 array with GPT-2's end-of-text token
  (EOT) before every document, and the results are consumed in input order, so the output
  is byte-identical for any worker count. At most a few tasks are in flight, which bounds
  memory.
* The token stream is cut into ``val_*`` shards (the first ``val_tokens`` tokens) and then
  ``train_*`` shards of ``shard_tokens`` tokens; the last shard may be partial. Each shard
  is written atomically, then ``metadata.json`` is rewritten atomically with the shard and
  the stream position (record, piece, token offset) where the next shard starts. A re-run
  with the same settings keeps the finished shards and skips that part of the input
  without tokenizing it; the result is byte-identical to an uninterrupted run.
"""

from __future__ import annotations

import gc
import gzip
import io
import itertools
import json
import math
import multiprocessing as mp
import os
import re
import signal
import sys
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from glob import glob, has_magic
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import numpy as np

from gpt.shards import DataError, ShardError, shard_num_tokens, write_shard
from gpt.fileio import atomic_write

__all__ = [
    "DEFAULT_DATASET",
    "DEFAULT_OUT",
    "DEFAULT_SHARD_TOKENS",
    "DEFAULT_SUBSET",
    "DEFAULT_VAL_TOKENS",
    "METADATA_NAME",
    "PrepareConfig",
    "PrepareError",
    "PrepareResult",
    "encode_pieces",
    "parse_count",
    "prepare",
    "split_pieces",
]

DEFAULT_DATASET = "HuggingFaceFW/fineweb-edu"
DEFAULT_SUBSET = "sample-10BT"  # the subset used when --source is DEFAULT_DATASET
DEFAULT_OUT = "data/fineweb-edu-10B"  # the trainer's default --data-dir
# One full validation of the trainer's defaults on 8 GPUs: 20 val steps x 8 ranks x B=64 x
# T=1024 = 10,485,760 tokens, plus 1 because each window also needs its last target token;
# with exactly 10,485,760 the loader would serve only 19 steps per pass.
DEFAULT_VAL_TOKENS = 20 * 8 * 64 * 1024 + 1
DEFAULT_SHARD_TOKENS = 100_000_000
METADATA_NAME = "metadata.json"
TOKENIZER_NAME = "gpt2"

PIECE_CHARS = 1 << 18  # a document longer than this is encoded in pieces
TASK_CHARS = 1 << 19  # characters per worker task: few IPC round trips, still balanced
READ_CHARS = 1 << 20  # .txt files are read in chunks of this many characters
_CUT_WINDOW = 1 << 12  # how far back split_pieces looks for a safe cut at a time
_IN_FLIGHT_PER_WORKER = 2  # tasks queued per worker: keeps workers busy, bounds memory
# Bumped whenever pieces, tasks or the stream layout change: a resume across such a change
# could mis-skip input, so metadata written by another layout counts as other settings.
LAYOUT_VERSION = 1
METADATA_VERSION = 1

_SHARD_FILE = re.compile(r"(train|val)_(\d{6,})\.bin")
_SHARD_TEMP = re.compile(r"\.(train|val)_\d{6,}\.bin\.tmp-\d+")
_TXT_SUFFIXES = (".txt", ".txt.gz")
_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz")
_PARQUET_SUFFIXES = (".parquet",)
_LOCAL_SUFFIXES = _TXT_SUFFIXES + _JSONL_SUFFIXES + _PARQUET_SUFFIXES
_HF_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class PrepareError(DataError):
    """A user-facing problem with the input, the flags or the output folder (one line)."""


@dataclass(frozen=True)
class PrepareConfig:
    """Settings of one preparation run; see fineweb.py --help for each flag."""

    sources: tuple[str, ...] = (DEFAULT_DATASET,)
    out_dir: str = DEFAULT_OUT
    val_tokens: int = DEFAULT_VAL_TOKENS
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    max_tokens: int | None = None  # stop after this many tokens (val + train)
    subset: str | None = None  # HF dataset config; DEFAULT_SUBSET for DEFAULT_DATASET
    split: str = "train"  # HF dataset split
    text_field: str = "text"  # field holding the text in json/jsonl/parquet/HF records
    streaming: bool = False  # HF only: stream instead of downloading the whole dataset
    txt_split_on_blank_lines: bool = False  # .txt: one document per paragraph, not per file
    workers: int = 0  # tokenizer processes; 0 means one per available CPU core
    overwrite: bool = False  # delete shards already in out_dir and start over
    progress: bool = True  # print progress lines to stderr


@dataclass(frozen=True)
class PrepareResult:
    out_dir: Path
    shards: list[dict[str, Any]]  # metadata.json's shard entries
    val_tokens: int
    train_tokens: int
    documents: int
    kept_shards: int  # shards that were already complete on disk (resume)
    seconds: float

    @property
    def tokens(self) -> int:
        return self.val_tokens + self.train_tokens


# --------------------------------------------------------------------------
# Small helpers


_COUNT_SUFFIXES = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def parse_count(text: str) -> int:
    """Parse a token count such as '30000', '10_485_761', '100M', '1.5B' or '1e9'."""
    s = text.strip().replace("_", "").replace(",", "")
    scale = 1
    if s and s[-1].lower() in _COUNT_SUFFIXES:
        scale, s = _COUNT_SUFFIXES[s[-1].lower()], s[:-1]
    try:
        value = float(s) * scale if any(c in s for c in ".eE") else int(s) * scale
    except ValueError:
        raise ValueError(f"{text!r} is not a count (examples: 30000, 100M, 1.5B, 1e9)") from None
    if not math.isfinite(value) or value != int(value):
        raise ValueError(f"{text!r} is not a whole number of tokens")
    return int(value)


def available_cpus() -> int:
    """CPU cores this process may run on (the affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def _human(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


# --------------------------------------------------------------------------
# Pieces: cutting long texts where GPT-2's tokenizer would split anyway

# GPT-2's pre-tokenizer regex never joins a letter with a following ' ' + letter (a word
# ends at the space, and ' ?\p{L}+' starts the next one), nor a non-space, '\n' with the
# non-space after it ('\n' then forms a token piece of its own, alone at the end of a text
# or not). Every regex match ends before such a point in the text and starts after it in
# the same way, so encoding both sides separately gives the same tokens as the whole.
# The classes here are ASCII letters and Python's \S, which are subsets of the Unicode
# classes tiktoken uses, so the rule errs on the safe side.
_SAFE_CUT = re.compile(r"(?<=[A-Za-z])(?= [A-Za-z])|(?<=\S\n)(?=\S)")


def _find_cut(buf: str, start: int, target: int) -> int | None:
    """A safe cut in buf at index >= start: the last one at or before target, else the
    first one after it; None if there is none yet."""
    hi = min(target, len(buf) - 1)
    lo = hi
    while lo > start:
        lo = max(start, lo - _CUT_WINDOW)
        cut = None
        # endpos hi + 2 lets the lookahead see the two characters after a cut at hi.
        for m in _SAFE_CUT.finditer(buf, lo, min(len(buf), hi + 2)):
            if 0 < m.start() <= hi:
                cut = m.start()
        if cut is not None:
            return cut
        hi = lo  # the next window ends where this one started
    m = _SAFE_CUT.search(buf, max(start, target))
    return m.start() if m is not None and 0 < m.start() < len(buf) else None


def split_pieces(chunks: Iterable[str], piece_chars: int = PIECE_CHARS) -> Iterator[str]:
    """Re-cut a document given as consecutive text chunks into pieces of about
    piece_chars characters, only at safe points (see _SAFE_CUT). Empty text yields nothing.
    A text with no safe point at all (no spaces between ASCII letters, no line breaks) is
    kept in one piece, whatever its length."""
    buf = ""
    scan_from = 1  # index from which buf has not been searched in vain yet
    for chunk in chunks:
        if not chunk:
            continue
        buf = buf + chunk if buf else chunk
        while len(buf) >= piece_chars:
            cut = _find_cut(buf, scan_from, piece_chars)
            if cut is None:
                # Only new text can hold a cut (the last char may pair with the next chunk).
                scan_from = max(1, len(buf) - 1)
                break
            yield buf[:cut]
            buf, scan_from = buf[cut:], 1
    if buf:
        yield buf


def split_paragraphs(lines: Iterable[str]) -> Iterator[str]:
    """Documents in a text given as lines: the runs of non-blank lines (a blank line holds
    only whitespace), each without its last newline. Linear time; a paragraph is held in
    memory while it is read."""
    paragraph: list[str] = []
    for line in lines:
        if line.strip():
            paragraph.append(line)
        elif paragraph:
            yield "".join(paragraph).removesuffix("\n")
            paragraph = []
    if paragraph:
        yield "".join(paragraph).removesuffix("\n")


# --------------------------------------------------------------------------
# Tasks: what the workers get

Record = Iterable[str]  # one document as consecutive text chunks; empty means no text


@dataclass
class TextTask:
    """Pieces cut in the main process (txt, parquet, JSON arrays, HF datasets)."""

    texts: list[str] = field(default_factory=list)
    records: list[int] = field(default_factory=list)
    pieces: list[int] = field(default_factory=list)
    chars: int = 0


@dataclass
class JsonlTask:
    """Whole JSON lines, parsed and cut in the worker: the main process only reads bytes,
    so it stays light however many workers there are."""

    path: str
    data: bytes
    first_record: int  # record index of the block's first line (every line is a record)
    first_lineno: int  # its 1-based line number in the file, for messages
    text_field: str
    skip_pieces: int  # pieces of the first record written before an interruption
    piece_chars: int


Task = TextTask | JsonlTask


@dataclass(frozen=True)
class Position:
    """Where the token stream resumes: token `offset` of piece `piece` of record `record`
    (the offset counts the document's EOT, and may be the piece's whole length)."""

    record: int = 0
    piece: int = 0
    offset: int = 0


class _TextTasks:
    """Groups the pieces of numbered records into TextTasks of about task_chars."""

    def __init__(self, start: Position, piece_chars: int, task_chars: int) -> None:
        self.start, self.piece_chars, self.task_chars = start, piece_chars, task_chars
        self.task = TextTask()

    def add(self, index: int, record: Record) -> Iterator[TextTask]:
        for piece, text in enumerate(split_pieces(record, self.piece_chars)):
            if index == self.start.record and piece < self.start.piece:
                continue  # written before the interruption
            t = self.task
            t.texts.append(text)
            t.records.append(index)
            t.pieces.append(piece)
            t.chars += len(text)
            if t.chars >= self.task_chars:
                yield from self.flush()

    def flush(self) -> Iterator[TextTask]:
        if self.task.texts:
            yield self.task
            self.task = TextTask()


# --------------------------------------------------------------------------
# Sources


@dataclass(frozen=True)
class _Skipped:
    """n records a reader skipped (resume) without parsing them."""

    n: int


@dataclass(frozen=True)
class _Block:
    """Complete JSON lines read from a file, for a JsonlTask."""

    data: bytes
    lines: int
    first_lineno: int


def _text_of(record: object, text_field: str, where: str) -> str:
    """The text field of a parsed record, '' for null; raises PrepareError otherwise."""
    if not isinstance(record, dict):
        raise PrepareError(
            f"{where}: a record must be an object with a {text_field!r} field, "
            f"got {type(record).__name__}"
        )
    if text_field not in record:
        fields = ", ".join(map(str, record)) or "none"
        raise PrepareError(
            f"{where}: no field {text_field!r} (fields there: {fields}); choose one with --text-field"
        )
    value = record[text_field]
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PrepareError(
            f"{where}: field {text_field!r} holds {type(value).__name__}, not text; "
            f"choose a text field with --text-field"
        )
    return value


def _count_lines(data: bytes) -> int:
    """Lines in a block; the last one may lack its newline (the end of a file)."""
    return data.count(b"\n") + (0 if not data or data.endswith(b"\n") else 1)


class LocalSource:
    """Local .txt, .jsonl/.json (optionally .gz) and .parquet files, read in order."""

    def __init__(self, files: list[Path], text_field: str, split_blank_lines: bool) -> None:
        self.files = files
        self.text_field = text_field
        self.split_blank_lines = split_blank_lines
        self._sizes = [f.stat().st_size for f in files]
        self._total_bytes = sum(self._sizes)
        self._done_bytes = 0  # bytes of the files already read
        self._position: Callable[[], float] = lambda: 0.0  # bytes read of the current file

    def identity(self) -> dict[str, Any]:
        """What a resume must find unchanged: the files, in order, and their sizes."""
        return {"kind": "local", "files": [[str(f), s] for f, s in zip(self.files, self._sizes)]}

    def describe(self) -> str:
        return str(self.files[0]) if len(self.files) == 1 else f"{len(self.files)} local files"

    def fraction(self) -> float | None:
        if not self._total_bytes:
            return None
        return min(1.0, (self._done_bytes + self._position()) / self._total_bytes)

    def tasks(self, start: Position, piece_chars: int, task_chars: int) -> Iterator[Task]:
        """Tasks from record start.record on; earlier records are skipped cheaply."""
        texts = _TextTasks(start, piece_chars, task_chars)
        index = 0  # record index of the next record
        self._done_bytes = 0
        for path, size in zip(self.files, self._sizes):
            for item in self._read(path, max(0, start.record - index), task_chars):
                if isinstance(item, _Skipped):
                    index += item.n
                elif isinstance(item, _Block):
                    yield from texts.flush()  # keep the input order
                    skip = start.piece if index == start.record else 0
                    yield JsonlTask(str(path), item.data, index, item.first_lineno,
                                    self.text_field, skip, piece_chars)
                    index += item.lines
                else:
                    yield from texts.add(index, item)
                    index += 1
            self._done_bytes += size
            self._position = lambda: 0.0
        yield from texts.flush()

    def _read(self, path: Path, skip: int, block_bytes: int) -> Iterator[Record | _Skipped | _Block]:
        """The file's records (or blocks of JSON lines), the first `skip` records skipped."""
        name = path.name.lower()
        try:
            if name.endswith(_PARQUET_SUFFIXES):
                yield from self._parquet(path, skip)
            elif name.endswith(_TXT_SUFFIXES):
                yield from self._txt(path, skip)
            else:
                yield from self._json(path, skip, block_bytes)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:  # before OSError: BadGzipFile is one
            raise PrepareError(f"{path}: corrupt compressed file ({e})") from None
        except OSError as e:
            raise PrepareError(f"{path}: cannot read: {e.strerror or e}") from None

    def _open_binary(self, path: Path, raw: BinaryIO) -> BinaryIO:
        """The file's bytes (decompressed for .gz); progress follows the raw position."""
        last = 0.0

        def position() -> float:
            nonlocal last
            if not raw.closed:  # asked for again after a stop, it keeps the last value
                last = raw.tell()
            return last

        self._position = position
        return gzip.GzipFile(fileobj=raw) if path.name.lower().endswith(".gz") else raw

    def _txt(self, path: Path, skip: int) -> Iterator[Record | _Skipped]:
        if skip > 0 and not self.split_blank_lines:
            yield _Skipped(1)  # a whole file is one record: no need to open it
            return
        with open(path, "rb") as raw:
            # utf-8-sig drops a byte-order mark; universal newlines turn \r\n into \n.
            text = io.TextIOWrapper(self._open_binary(path, raw), encoding="utf-8-sig", errors="replace")
            if not self.split_blank_lines:
                yield iter(lambda: text.read(READ_CHARS), "")  # consumed before the next record
                return
            for i, paragraph in enumerate(split_paragraphs(text)):
                yield _Skipped(1) if i < skip else (paragraph,)

    def _json(self, path: Path, skip: int, block_bytes: int) -> Iterator[Record | _Skipped | _Block]:
        with open(path, "rb") as raw:
            fh = self._open_binary(path, raw)
            head = fh.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")  # BOM, whitespace
            fh.seek(0)
            # .jsonl is always JSON lines; a .json file may also be one array of objects.
            if ".jsonl" in path.name.lower() or not head.startswith(b"["):
                yield from _line_blocks(fh, skip, block_bytes)
                return
            try:  # a JSON array is parsed whole (.jsonl is the format for big data)
                items = json.load(fh)
            except ValueError as e:
                raise PrepareError(f"{path}: not valid JSON ({e})") from None
            for i, item in enumerate(items):
                yield _Skipped(1) if i < skip else (_text_of(item, self.text_field, f"{path}[{i}]"),)

    def _parquet(self, path: Path, skip: int) -> Iterator[Record | _Skipped]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
        except (pa.ArrowException, ValueError) as e:
            raise PrepareError(f"{path}: not a readable parquet file ({e})") from None
        schema = pf.schema_arrow
        if self.text_field not in schema.names:
            raise PrepareError(
                f"{path}: no column {self.text_field!r} (columns: {', '.join(schema.names)}); "
                f"choose one with --text-field"
            )
        kind = schema.field(self.text_field).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise PrepareError(
                f"{path}: column {self.text_field!r} holds {kind}, not text; "
                f"choose a text column with --text-field"
            )
        total_rows = max(1, pf.metadata.num_rows)
        size = path.stat().st_size
        rows_done = 0
        self._position = lambda: size * rows_done / total_rows
        for group in range(pf.num_row_groups):
            rows = pf.metadata.row_group(group).num_rows
            if skip >= rows:  # skip whole row groups without reading them
                skip -= rows
                rows_done += rows
                yield _Skipped(rows)
                continue
            for batch in pf.iter_batches(batch_size=1024, row_groups=[group], columns=[self.text_field]):
                for text in batch.column(0).to_pylist():
                    rows_done += 1
                    if skip > 0:
                        skip -= 1
                        yield _Skipped(1)
                    else:
                        yield (text or "",)


def _line_blocks(fh: BinaryIO, skip: int, block_bytes: int) -> Iterator[_Skipped | _Block]:
    """Blocks of about block_bytes of complete lines; the first `skip` lines are skipped
    by counting newlines, without parsing."""
    lineno = 1

    def emit(data: bytes) -> Iterator[_Skipped | _Block]:
        nonlocal skip, lineno
        n = _count_lines(data)
        if skip >= n:
            skip -= n
            lineno += n
            yield _Skipped(n)
            return
        if skip:
            pos = 0
            for _ in range(skip):
                pos = data.index(b"\n", pos) + 1
            yield _Skipped(skip)
            data, n, lineno, skip = data[pos:], n - skip, lineno + skip, 0
        yield _Block(data, n, lineno)
        lineno += n

    pending: list[bytes] = []  # the start of a line longer than a block
    while chunk := fh.read(block_bytes):
        cut = chunk.rfind(b"\n") + 1
        if cut == 0:
            pending.append(chunk)
            continue
        yield from emit(b"".join([*pending, chunk[:cut]]))
        pending = [chunk[cut:]] if cut < len(chunk) else []
    if pending:
        yield from emit(b"".join(pending))


class HFSource:
    """A Hugging Face dataset through datasets.load_dataset (downloaded or streamed)."""

    def __init__(self, name: str, subset: str | None, split: str, streaming: bool, text_field: str) -> None:
        self.name, self.subset, self.split = name, subset, split
        self.streaming, self.text_field = streaming, text_field
        self._total: int | None = None
        self._seen = 0

    def identity(self) -> dict[str, Any]:
        return {"kind": "huggingface", "dataset": self.name, "subset": self.subset,
                "split": self.split, "streaming": self.streaming}

    def describe(self) -> str:
        sub = f" ({self.subset})" if self.subset else ""
        return f"{self.name}{sub} split {self.split}{', streaming' if self.streaming else ''}"

    def fraction(self) -> float | None:
        return min(1.0, self._seen / self._total) if self._total else None

    def _load(self) -> Any:
        import datasets  # looked up at call time, so tests can stand in for load_dataset

        try:
            return datasets.load_dataset(self.name, name=self.subset, split=self.split,
                                         streaming=self.streaming)
        except Exception as e:  # hub, network and config errors come in many types
            detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise PrepareError(
                f"--source {self.name}: cannot load the Hugging Face dataset "
                f"(subset {self.subset!r}, split {self.split!r}): {detail}; check the name, "
                f"--subset, --split and the network (there is no local file or folder of "
                f"that name either)"
            ) from None

    def _count(self, ds: Any) -> int | None:
        """Number of examples if known: len() when downloaded, else the dataset card's."""
        if not self.streaming:
            try:
                return len(ds)
            except TypeError:
                pass
        try:
            return int(ds.info.splits[self.split].num_examples) or None
        except Exception:  # no info or no split sizes on the card: the total is unknown
            return None

    def records(self, skip: int = 0) -> Iterator[Record]:
        """Examples from index `skip` on, as records."""
        ds = self._load()
        features = getattr(ds, "features", None)
        if features is not None and self.text_field not in features:
            raise PrepareError(
                f"--source {self.name}: no field {self.text_field!r} (fields: "
                f"{', '.join(features)}); choose one with --text-field"
            )
        self._total = self._count(ds)
        if features is not None and hasattr(ds, "select_columns"):
            ds = ds.select_columns([self.text_field])  # do not decode the other columns
        if skip:
            ds = ds.skip(skip) if hasattr(ds, "skip") else itertools.islice(ds, skip, None)
        self._seen = skip
        if features is None or not hasattr(ds, "iter"):  # a plain iterable of dicts
            for i, example in enumerate(ds, skip):
                self._seen = i + 1
                yield (_text_of(example, self.text_field, f"--source {self.name} example {i}"),)
            return
        # Batches of one column: far cheaper than a Python dict per example.
        for batch in ds.iter(batch_size=1024):
            for text in batch[self.text_field]:
                if text is not None and not isinstance(text, str):  # _text_of raises the error
                    _text_of({self.text_field: text}, self.text_field,
                             f"--source {self.name} example {self._seen}")
                self._seen += 1
                yield (text or "",)

    def tasks(self, start: Position, piece_chars: int, task_chars: int) -> Iterator[Task]:
        texts = _TextTasks(start, piece_chars, task_chars)
        for index, record in enumerate(self.records(start.record), start.record):
            yield from texts.add(index, record)
        yield from texts.flush()


Source = LocalSource | HFSource


def _looks_like_hf(spec: str) -> bool:
    if spec.startswith("hf:"):
        return True
    if Path(spec).exists() or has_magic(spec) or spec.lower().endswith(_LOCAL_SUFFIXES):
        return False
    return bool(_HF_NAME.fullmatch(spec)) and not spec.startswith(".")


def _folder_files(folder: Path, exclude: Path) -> list[Path]:
    """Supported files under folder (recursive, sorted), skipping hidden ones and `exclude`."""
    found = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).parts
        if any(part.startswith(".") for part in rel) or not p.is_file():
            continue
        if p.name.lower().endswith(_LOCAL_SUFFIXES) and exclude not in p.resolve().parents:
            found.append(p)
    return found


def local_files(specs: Iterable[str], exclude: Path | None = None) -> list[Path]:
    """Expand files, globs and folders into the list of input files, in order.
    Files inside `exclude` (the output folder) are never inputs."""
    exclude = (exclude or Path(os.devnull)).resolve()
    kinds = ", ".join(_LOCAL_SUFFIXES)
    files: list[Path] = []
    for spec in specs:
        if has_magic(spec) and not Path(spec).exists():
            matches = sorted(Path(m) for m in glob(spec, recursive=True))
            if not matches:
                raise PrepareError(f"--source {spec}: no files match")
        else:
            matches = [Path(spec)]
        for p in matches:
            if p.is_dir():
                found = _folder_files(p, exclude)
                if not found:
                    raise PrepareError(f"--source {p}: folder holds no {kinds} files")
                files.extend(found)
            elif p.is_file():
                if not p.name.lower().endswith(_LOCAL_SUFFIXES):
                    if has_magic(spec):
                        continue  # a glob may also match other files
                    raise PrepareError(f"--source {p}: unsupported file type; use {kinds}")
                files.append(p)
            else:
                raise PrepareError(f"--source {p}: no such file or folder")
    if not files:
        raise PrepareError(f"--source {' '.join(specs)}: matches no {kinds} files")
    return [f.resolve() for f in files]


def open_source(cfg: PrepareConfig) -> Source:
    """The configured input; raises PrepareError for missing files before any work."""
    hf = [s for s in cfg.sources if _looks_like_hf(s)]
    if hf:
        if len(cfg.sources) > 1:
            raise PrepareError(
                f"--source {' '.join(cfg.sources)}: give one Hugging Face dataset, or only local files"
            )
        name = hf[0].removeprefix("hf:")
        subset = cfg.subset if cfg.subset is not None else (DEFAULT_SUBSET if name == DEFAULT_DATASET else None)
        return HFSource(name, subset, cfg.split, cfg.streaming, cfg.text_field)
    files = local_files(cfg.sources, exclude=Path(cfg.out_dir))
    return LocalSource(files, cfg.text_field, cfg.txt_split_on_blank_lines)


# --------------------------------------------------------------------------
# Tokenizing: tasks encoded in worker processes, results in input order

_encoder: Any = None  # each worker process's tiktoken encoding, loaded on first use


def _get_encoder() -> Any:
    global _encoder
    if _encoder is None:
        from gpt.tokenizer import gpt2_tokenizer

        _encoder = gpt2_tokenizer()
    return _encoder


def _init_worker() -> None:
    # Ctrl-C goes to the whole process group; only the parent should handle it (and then
    # terminate the pool), not every worker with its own traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def encode_pieces(texts: list[str], doc_starts: list[bool]) -> tuple[np.ndarray, np.ndarray]:
    """Encode pieces into one uint16 array, with EOT before each piece that starts a
    document; also return each piece's token count (its EOT included)."""
    enc = _get_encoder()
    eot = enc.eot_token
    # encode_to_numpy (tiktoken >= 0.8) skips building Python int lists; with nothing
    # allowed or disallowed it encodes exactly as encode_ordinary.
    to_numpy = getattr(enc, "encode_to_numpy", None)
    arrays = [
        to_numpy(t, disallowed_special=()) if to_numpy else np.asarray(enc.encode_ordinary(t))
        for t in texts
    ]
    lens = np.fromiter((a.size + s for a, s in zip(arrays, doc_starts)), dtype=np.int64, count=len(texts))
    out = np.empty(int(lens.sum()), dtype=np.uint16)
    pos = 0
    for a, start in zip(arrays, doc_starts):
        if start:
            out[pos] = eot
            pos += 1
        out[pos : pos + a.size] = a
        pos += a.size
    return out, lens


_JSON = json.JSONDecoder()


def _parse_line(line: str, where: str) -> Any:
    """A JSON line that the fast path could not take as is (whitespace around, or bad)."""
    try:
        return json.loads(line)
    except ValueError as e:
        raise PrepareError(
            f"{where}: not valid JSON ({e}); a .jsonl/.json file must hold one JSON object "
            f"per line, or one JSON array"
        ) from None


def _jsonl_pieces(task: JsonlTask) -> TextTask:
    """Parse a block of JSON lines and cut the texts into pieces (in the worker)."""
    out = TextTask()
    texts, records, pieces = out.texts, out.records, out.pieces
    # One decode per block, not per line; bad UTF-8 becomes U+FFFD, as in .txt files.
    block = task.data.decode("utf-8", errors="replace")
    if task.first_lineno == 1:
        block = block.removeprefix("\ufeff")  # a byte-order mark
    lines = block.split("\n")
    if block.endswith("\n") or not block:
        lines.pop()
    raw_decode, field_name, piece_chars = _JSON.raw_decode, task.text_field, task.piece_chars
    for i, line in enumerate(lines):
        try:
            obj, end = raw_decode(line)  # json.loads minus its per-call checks
            if end != len(line) and not line[end:].isspace():
                raise ValueError
        except ValueError:
            if not line.strip():
                continue  # a blank line: an empty record
            obj = _parse_line(line, f"{task.path}:{task.first_lineno + i}")
        try:
            text = obj[field_name]  # the usual case; anything else is sorted out below
            if not isinstance(text, str):
                raise TypeError
        except (KeyError, TypeError, IndexError):
            text = _text_of(obj, field_name, f"{task.path}:{task.first_lineno + i}")
        if not text:
            continue
        index = task.first_record + i
        if len(text) < piece_chars and not (i == 0 and task.skip_pieces):
            texts.append(text)  # one piece: most documents
            records.append(index)
            pieces.append(0)
            continue
        for piece, chunk in enumerate(split_pieces((text,), piece_chars)):
            if i == 0 and piece < task.skip_pieces:
                continue
            texts.append(chunk)
            records.append(index)
            pieces.append(piece)
    return out


Encoded = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def encode_task(task: Task) -> Encoded:
    """(tokens, tokens per piece, record of each piece, piece index of each piece).
    Module-level, so 'spawn' workers (macOS, Windows) can import it."""
    if isinstance(task, JsonlTask):
        task = _jsonl_pieces(task)
    tokens, lens = encode_pieces(task.texts, [p == 0 for p in task.pieces])
    return tokens, lens, np.asarray(task.records, dtype=np.int64), np.asarray(task.pieces, dtype=np.int64)


def _encoded(tasks: Iterator[Task], workers: int) -> Iterator[Encoded]:
    """Encoded tasks in task order, by `workers` processes (in this one for 1).

    apply_async with a bounded queue, not Pool.imap: imap's feeder thread would read the
    whole input ahead of the workers, and memory would grow with the input.
    """
    if workers <= 1:
        for task in tasks:
            yield encode_task(task)
        return
    # Forked workers share the parent's memory until they write to it, and a garbage
    # collection in a worker writes to every object it scans: frozen objects are skipped.
    gc.freeze()
    try:
        pool = mp.get_context().Pool(workers, initializer=_init_worker)
    finally:
        gc.unfreeze()
    with pool:  # exit terminates the workers
        pending: deque[Any] = deque()
        for task in tasks:
            pending.append(pool.apply_async(encode_task, (task,)))
            if len(pending) >= _IN_FLIGHT_PER_WORKER * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# --------------------------------------------------------------------------
# Progress


class _Progress:
    """Rate-limited progress lines on stderr: documents/s, tokens/s and an ETA."""

    def __init__(self, enabled: bool, stream: TextIO, what: str, max_tokens: int | None) -> None:
        self.enabled, self.stream, self.what, self.max_tokens = enabled, stream, what, max_tokens
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.interval = 0.5 if self.tty else 15.0
        self.t0 = time.perf_counter()
        self.last = self.t0
        self.f0: float | None = None  # the fraction done when timing started (resumes)
        self.t_f0 = self.t0
        self.said_no_eta = False

    def update(self, docs: int, tokens: int, total_tokens: int, fraction: float | None, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.max_tokens:  # the run ends at max_tokens, or earlier when the input ends
            by_tokens = total_tokens / self.max_tokens
            fraction = by_tokens if fraction is None else max(fraction, by_tokens)
        if self.f0 is None:  # a resume starts part-way: the ETA times only the new part
            self.f0, self.t_f0 = fraction or 0.0, now
        if not final and now - self.last < self.interval:
            return
        self.last = now
        dt = max(now - self.t0, 1e-9)
        line = f"{self.what}: {_human(total_tokens)} tokens, {docs:,} docs | {_human(tokens / dt)} tok/s, {_human(docs / dt)} docs/s"
        if fraction is not None:
            line += f" | {100 * fraction:.1f}%"
            if not final and fraction > self.f0:
                line += f" ETA {_duration((now - self.t_f0) * (1 - fraction) / (fraction - self.f0))}"
        elif not self.said_no_eta and not final:
            line += " | no ETA: streaming, total unknown (--max-tokens gives one)"
            self.said_no_eta = True
        if self.tty:
            self.stream.write("\r" + line.ljust(100) + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def say(self, text: str) -> None:
        if self.enabled:
            self.stream.write(text + "\n")
            self.stream.flush()


# --------------------------------------------------------------------------
# Output folder: metadata, checks, resume


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    data = (json.dumps(obj, indent=1) + "\n").encode()
    atomic_write(path, lambda fh: fh.write(data))


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _settings_diff(old: Any, new: dict[str, Any]) -> list[str]:
    if not isinstance(old, dict):
        return ["no settings recorded"]
    return [
        f"{key}: {_short(old.get(key))} there, {_short(new[key])} now"
        for key in new
        if old.get(key) != new[key]
    ]


@dataclass
class _Existing:
    shards: list[dict[str, Any]]  # complete shards on disk that a resume keeps
    complete: bool  # the recorded run finished and every shard is intact
    created: str
    to_delete: list[Path]  # removed just before the first new shard is written


def _existing(out: Path, settings: dict[str, Any], overwrite: bool) -> _Existing:
    """What out_dir already holds; raises PrepareError rather than touch foreign data."""
    fresh = _Existing([], False, _now(), [])
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
    return _Existing(kept, complete, str(meta.get("created", _now())), [] if complete else stale)


def _totals(shards: list[dict[str, Any]]) -> dict[str, int]:
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


class _ShardWriter:
    """Cuts the token stream into val then train shards, each written atomically and
    followed by an atomic metadata.json update."""

    def __init__(
        self,
        out: Path,
        cfg: PrepareConfig,
        meta: dict[str, Any],
        existing: _Existing,
        on_shard: Callable[[dict[str, Any]], None] | None,
    ) -> None:
        self.out, self.cfg, self.meta, self.on_shard = out, cfg, meta, on_shard
        self.shards = list(existing.shards)
        self.to_delete = existing.to_delete
        totals = _totals(self.shards)
        # Tokens and shards on disk, kept up to date as shards are written.
        self.written = {"val": totals["val_tokens"], "train": totals["train_tokens"]}
        self.count = {"val": totals["val_shards"], "train": totals["train_shards"]}
        self.documents = totals["documents"]
        # Grown as a shard fills, up to one shard: a small input never reserves 100M tokens.
        self.buf = np.empty(min(cfg.shard_tokens, 1 << 20), dtype=np.uint16)
        self.filled = 0
        self.docs = 0  # documents starting in the current shard
        self.pos = Position(**self.shards[-1]["next"]) if self.shards else Position()
        self._begin()

    @property
    def total(self) -> int:
        """Tokens written or buffered so far."""
        return self.written["val"] + self.written["train"] + self.filled

    def _begin(self) -> None:
        if self.written["val"] < self.cfg.val_tokens:
            self.split, self.limit = "val", min(self.cfg.shard_tokens, self.cfg.val_tokens - self.written["val"])
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
                self._flush()

    def _grow(self, need: int) -> None:
        bigger = np.empty(min(self.cfg.shard_tokens, max(need, 2 * self.buf.size)), dtype=np.uint16)
        bigger[: self.filled] = self.buf[: self.filled]
        self.buf = bigger

    def finish(self) -> None:
        """Write the last, partial shard; remove files a finished run must not leave."""
        if self.filled:
            self._flush()
        self._delete_old()

    def _delete_old(self) -> None:
        # --overwrite's old shards, or a crashed run's unrecorded ones: deleted only once
        # new data is ready, so a failing run leaves the folder as it was.
        for path in self.to_delete:
            path.unlink(missing_ok=True)
        self.to_delete = []

    def _flush(self) -> None:
        self._delete_old()
        self.out.mkdir(parents=True, exist_ok=True)
        name = f"{self.split}_{self.count[self.split]:06d}.bin"
        write_shard(self.out / name, self.buf[: self.filled])
        entry = {"name": name, "split": self.split, "tokens": self.filled, "documents": self.docs,
                 "next": asdict(self.pos)}
        self.shards.append(entry)
        self.written[self.split] += self.filled
        self.count[self.split] += 1
        self.documents += self.docs
        self.filled = self.docs = 0
        self.write_metadata(complete=False)
        self._begin()
        if self.on_shard is not None:
            self.on_shard(entry)

    def write_metadata(self, complete: bool) -> None:
        meta = dict(self.meta)
        meta.update(
            complete=complete,
            updated=_now(),
            shards=self.shards,
            totals=_totals(self.shards),
        )
        _write_json(self.out / METADATA_NAME, meta)


# --------------------------------------------------------------------------
# The run


def _check_config(cfg: PrepareConfig) -> None:
    if cfg.val_tokens < 0:
        raise PrepareError(f"--val-tokens must be >= 0, got {cfg.val_tokens}")
    if cfg.shard_tokens < 1:
        raise PrepareError(f"--shard-tokens must be >= 1, got {cfg.shard_tokens}")
    if cfg.workers < 0:
        raise PrepareError(f"--workers must be >= 0 (0: one per CPU core), got {cfg.workers}")
    if cfg.max_tokens is not None and cfg.max_tokens <= cfg.val_tokens:
        raise PrepareError(
            f"--max-tokens {cfg.max_tokens} leaves nothing for training after --val-tokens "
            f"{cfg.val_tokens}; raise --max-tokens or lower --val-tokens"
        )
    if not cfg.sources:
        raise PrepareError("--source: give at least one file, folder, glob or dataset name")


def _load_tokenizer() -> Any:
    try:
        return _get_encoder()
    except RuntimeError as e:
        raise PrepareError(str(e)) from None


def prepare(
    cfg: PrepareConfig,
    *,
    on_shard: Callable[[dict[str, Any]], None] | None = None,
    log: TextIO | None = None,
) -> PrepareResult:
    """Tokenize cfg's source into shards in cfg.out_dir, resuming a previous run.

    on_shard is called with each new shard's metadata entry once it is on disk (tests use
    it to simulate an interruption). Raises PrepareError (a DataError) for user mistakes.
    """
    t0 = time.perf_counter()
    _check_config(cfg)
    enc = _load_tokenizer()
    source = open_source(cfg)
    out = Path(cfg.out_dir)
    settings = {
        "tokenizer": f"tiktoken/{TOKENIZER_NAME}",
        "shard_tokens": cfg.shard_tokens,
        "val_tokens": cfg.val_tokens,
        "max_tokens": cfg.max_tokens,
        "source": source.identity(),
        "text_field": cfg.text_field,
        "txt_split_on_blank_lines": cfg.txt_split_on_blank_lines,
        "layout": {"version": LAYOUT_VERSION, "piece_chars": PIECE_CHARS, "read_chars": READ_CHARS},
    }
    existing = _existing(out, settings, cfg.overwrite)
    progress = _Progress(cfg.progress, log or sys.stderr, f"{out}", cfg.max_tokens)
    if existing.complete:
        progress.say(f"{out}: already complete ({len(existing.shards)} shards); --overwrite redoes it")
        return _result(out, existing.shards, len(existing.shards), t0)
    meta = {
        "format": "gpt2-trainer token shards (see gpt/shards.py)",
        "version": METADATA_VERSION,
        "created": existing.created,
        "tool": "fineweb.py",
        "source": {**source.identity(), "text_field": cfg.text_field},
        "tokenizer": {"name": TOKENIZER_NAME, "library": "tiktoken", "eot_token": enc.eot_token,
                      "vocab_size": enc.n_vocab, "dtype": "uint16"},
        "settings": settings,
    }
    writer = _ShardWriter(out, cfg, meta, existing, on_shard)
    kept = len(existing.shards)
    start = writer.pos
    workers = cfg.workers or available_cpus()
    if kept:
        progress.say(f"{out}: resuming after {kept} complete shards ({_human(writer.total)} tokens)")
    progress.say(f"reading {source.describe()}; {workers} tokenizer worker{'s' * (workers > 1)}")

    tasks = source.tasks(start, PIECE_CHARS, TASK_CHARS)
    encoded = _encoded(tasks, workers)
    new_tokens = 0
    found_start = not kept  # a resume must find the piece it stopped in, or the input changed
    docs_before = writer.documents
    try:
        for result in encoded:
            tokens, lens, records, pieces = result
            if tokens.size == 0:
                continue  # a block of empty records
            skip = 0
            if not found_start:
                found_start = True
                if (records[0], pieces[0]) != (start.record, start.piece) or start.offset > lens[0]:
                    raise _input_changed(out, start)
                skip = start.offset
            before = writer.total
            writer.feed(result, skip)
            new_tokens += writer.total - before
            docs = writer.documents + writer.docs - docs_before
            progress.update(docs, new_tokens, writer.total, source.fraction())
            if writer.done():
                break
    finally:
        encoded.close()  # stops the workers (also on errors and Ctrl-C)
        tasks.close()
    if not found_start:
        raise _input_changed(out, start)
    if writer.total == 0:  # checked first: with --overwrite, the old shards stay
        raise PrepareError(f"--source {source.describe()}: no text found (every record is empty)")
    writer.finish()
    progress.update(writer.documents - docs_before, new_tokens, writer.total, source.fraction(), final=True)
    if writer.written["train"] == 0:
        raise PrepareError(
            f"--source {source.describe()}: the input has only {writer.total} tokens and "
            f"--val-tokens {cfg.val_tokens} took them all; lower --val-tokens and re-run with --overwrite"
        )
    writer.write_metadata(complete=True)
    return _result(out, writer.shards, kept, t0)


def _input_changed(out: Path, start: Position) -> PrepareError:
    return PrepareError(
        f"--out {out}: the input changed since the interrupted run (piece {start.piece} of "
        f"record {start.record} is not where it was); pass --overwrite to start over"
    )


def _result(out: Path, shards: list[dict[str, Any]], kept: int, t0: float) -> PrepareResult:
    totals = _totals(shards)
    return PrepareResult(out, shards, totals["val_tokens"], totals["train_tokens"],
                         totals["documents"], kept, time.perf_counter() - t0)
