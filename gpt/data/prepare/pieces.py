"""Pieces: long texts cut where GPT-2's tokenizer would split anyway; and the tasks the
workers get (pieces cut here, or whole JSON lines for the worker to parse and cut)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from gpt.data.prepare.config import PIECE_CHARS, PrepareError


_CUT_WINDOW = 1 << 12  # how far back split_pieces looks for a safe cut at a time

# GPT-2's pre-tokenizer regex never joins a letter with a following ' ' + letter (a word
# ends at the space, and ' ?\p{L}+' starts the next one), nor a non-space, '\n' with the
# non-space after it ('\n' then forms a token piece of its own, alone at the end of a text
# or not). Every regex match ends before such a point in the text and starts after it in
# the same way, so encoding both sides separately gives the same tokens as the whole.
# The classes here are ASCII letters and Python's \S, which are subsets of the Unicode
# classes tiktoken uses, so the rule errs on the safe side.
_SAFE_CUT = re.compile(r"(?<=[A-Za-z])(?= [A-Za-z])|(?<=\S\n)(?=\S)")


def _find_safe_cut(buf: str, start: int, target: int) -> int | None:
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
            cut = _find_safe_cut(buf, scan_from, piece_chars)
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

    def __post_init__(self) -> None:  # it is read back from metadata.json
        for name in ("record", "piece", "offset"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise TypeError(f"position {name} must be a count, got {value!r}")


class TextTaskBuilder:
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


def record_text(record: object, text_field: str, where: str) -> str:
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
