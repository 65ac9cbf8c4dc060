"""Sources: local .txt/.jsonl/.json(.gz)/.parquet files and Hugging Face datasets, read
in order as records and turned into tasks; resumable from any record."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from glob import glob, has_magic
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from gpt.data.prepare import config
from gpt.data.prepare.config import (DEFAULT_DATASET, DEFAULT_SUBSET, DEMO_SOURCE, PrepareConfig,
                                     PrepareError)
from gpt.data.prepare.hf_source import HFSource
from gpt.data.prepare.pieces import (JsonlTask, Position, Record, Task, TextTaskBuilder,
                                     record_text, split_paragraphs)
from gpt.data.tokenizer import SHAKESPEARE


_TXT_SUFFIXES = (".txt", ".txt.gz")
_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz")
_PARQUET_SUFFIXES = (".parquet",)
_LOCAL_SUFFIXES = _TXT_SUFFIXES + _JSONL_SUFFIXES + _PARQUET_SUFFIXES
_HF_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclass(frozen=True)
class SkippedRecords:
    """n records a reader skipped (resume) without parsing them."""

    n: int


@dataclass(frozen=True)
class JsonLinesBlock:
    """Complete JSON lines read from a file, for a JsonlTask."""

    data: bytes
    lines: int
    first_lineno: int


@contextlib.contextmanager
def read_errors_named(path: Path) -> Iterator[None]:
    """A file that cannot be read or decompressed becomes a PrepareError naming it."""
    try:
        yield
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:  # before OSError: BadGzipFile is one
        raise PrepareError(f"{path}: corrupt or truncated compressed file ({e or type(e).__name__})") from None
    except OSError as e:
        raise PrepareError(f"{path}: cannot read: {e.strerror or e}") from None


def _chunks(path: Path, text: TextIO) -> Iterator[str]:
    """A text file in READ_CHARS pieces, read as the consumer asks (outside _read's frame,
    so its read errors are named here)."""
    with read_errors_named(path):
        while chunk := text.read(config.READ_CHARS):
            yield chunk


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
        texts = TextTaskBuilder(start, piece_chars, task_chars)
        index = 0  # record index of the next record
        self._done_bytes = 0
        for path, size in zip(self.files, self._sizes):
            for item in self._read(path, max(0, start.record - index), task_chars):
                if isinstance(item, SkippedRecords):
                    index += item.n
                elif isinstance(item, JsonLinesBlock):
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

    def _read(self, path: Path, skip: int, block_bytes: int) -> Iterator[Record | SkippedRecords | JsonLinesBlock]:
        """The file's records (or blocks of JSON lines), the first `skip` records skipped."""
        name = path.name.lower()
        with read_errors_named(path):
            if name.endswith(_PARQUET_SUFFIXES):
                yield from self._parquet(path, skip)
            elif name.endswith(_TXT_SUFFIXES):
                yield from self._txt(path, skip)
            else:
                yield from self._json(path, skip, block_bytes)

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

    def _txt(self, path: Path, skip: int) -> Iterator[Record | SkippedRecords]:
        if skip > 0 and not self.split_blank_lines:
            yield SkippedRecords(1)  # a whole file is one record: no need to open it
            return
        with open(path, "rb") as raw:
            # utf-8-sig drops a byte-order mark; universal newlines turn \r\n into \n.
            text = io.TextIOWrapper(self._open_binary(path, raw), encoding="utf-8-sig", errors="replace")
            if not self.split_blank_lines:
                yield _chunks(path, text)  # consumed before the next record
                return
            for i, paragraph in enumerate(split_paragraphs(text)):
                yield SkippedRecords(1) if i < skip else (paragraph,)

    def _json(self, path: Path, skip: int, block_bytes: int) -> Iterator[Record | SkippedRecords | JsonLinesBlock]:
        with open(path, "rb") as raw:
            fh = self._open_binary(path, raw)
            head = fh.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")  # BOM, whitespace
            fh.seek(0)
            # .jsonl is always JSON lines; a .json file may also be one array of objects.
            if ".jsonl" in path.name.lower() or not head.startswith(b"["):
                yield from json_line_blocks(fh, skip, block_bytes)
                return
            try:  # a JSON array is parsed whole (.jsonl is the format for big data)
                items = json.load(fh)
            except ValueError as e:
                raise PrepareError(f"{path}: not valid JSON ({e})") from None
            for i, item in enumerate(items):
                yield SkippedRecords(1) if i < skip else (record_text(item, self.text_field, f"{path}[{i}]"),)

    def _parquet(self, path: Path, skip: int) -> Iterator[Record | SkippedRecords]:
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
                yield SkippedRecords(rows)
                continue
            for batch in pf.iter_batches(batch_size=1024, row_groups=[group], columns=[self.text_field]):
                for text in batch.column(0).to_pylist():
                    rows_done += 1
                    if skip > 0:
                        skip -= 1
                        yield SkippedRecords(1)
                    else:
                        yield (text or "",)


def json_line_blocks(fh: BinaryIO, skip: int, block_bytes: int) -> Iterator[SkippedRecords | JsonLinesBlock]:
    """Blocks of about block_bytes of complete lines; the first `skip` lines are skipped
    by counting newlines, without parsing."""
    lineno = 1

    def emit(data: bytes) -> Iterator[SkippedRecords | JsonLinesBlock]:
        nonlocal skip, lineno
        n = _count_lines(data)
        if skip >= n:
            skip -= n
            lineno += n
            yield SkippedRecords(n)
            return
        if skip:
            pos = 0
            for _ in range(skip):
                pos = data.index(b"\n", pos) + 1
            yield SkippedRecords(skip)
            data, n, lineno, skip = data[pos:], n - skip, lineno + skip, 0
        yield JsonLinesBlock(data, n, lineno)
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


Source = LocalSource | HFSource


def looks_like_hf_dataset(spec: str) -> bool:
    if spec.startswith("hf:"):
        return True
    if Path(spec).exists() or has_magic(spec) or spec.lower().endswith(_LOCAL_SUFFIXES):
        return False
    return bool(_HF_NAME.fullmatch(spec)) and not spec.startswith(".")


def _files_in_folder(folder: Path, exclude: Path) -> list[Path]:
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
                found = _files_in_folder(p, exclude)
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
    hf = [s for s in cfg.sources if looks_like_hf_dataset(s)]
    if hf:
        if len(cfg.sources) > 1:
            raise PrepareError(
                f"--source {' '.join(cfg.sources)}: give one Hugging Face dataset, or only local files"
            )
        name = hf[0].removeprefix("hf:")
        subset = cfg.subset if cfg.subset is not None else (DEFAULT_SUBSET if name == DEFAULT_DATASET else None)
        return HFSource(name, subset, cfg.split, cfg.streaming, cfg.text_field)
    specs = [str(SHAKESPEARE) if s == DEMO_SOURCE and not Path(s).exists() else s for s in cfg.sources]
    files = local_files(specs, exclude=Path(cfg.out_dir))
    return LocalSource(files, cfg.text_field, cfg.txt_split_on_blank_lines)
