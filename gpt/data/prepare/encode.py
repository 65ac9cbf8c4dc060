"""Tokenizing: tasks encoded in worker processes, results consumed in input order."""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import signal
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from gpt.data.prepare.config import PrepareError
from gpt.data.prepare.pieces import JsonlTask, Task, TextTask, record_text, split_pieces
from gpt.data.tokenizer import gpt2_tokenizer


_IN_FLIGHT_PER_WORKER = 2  # tasks queued per worker: keeps workers busy, bounds memory

_encoder: Any = None  # each worker process's tiktoken encoding, loaded on first use


def get_encoder() -> Any:
    global _encoder
    if _encoder is None:
        _encoder = gpt2_tokenizer()
    return _encoder


def _ignore_sigint_in_worker() -> None:
    # Ctrl-C goes to the whole process group; only the parent should handle it (and then
    # terminate the pool), not every worker with its own traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def without_surrogates(text: str) -> str:
    """`text` with each lone surrogate (a half of a UTF-16 pair, which JSON's \\ud800
    escapes can give and UTF-8 cannot hold) as U+FFFD, as invalid UTF-8 bytes are read;
    a whole pair becomes its character."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def encode_pieces(texts: list[str], doc_starts: list[bool]) -> tuple[np.ndarray, np.ndarray]:
    """Encode pieces into one uint16 array, with EOT before each piece that starts a
    document; also return each piece's token count (its EOT included)."""
    enc = get_encoder()
    eot = enc.eot_token
    # encode_to_numpy (tiktoken >= 0.8) skips building Python int lists; with nothing
    # allowed or disallowed it encodes exactly as encode_ordinary.
    to_numpy = getattr(enc, "encode_to_numpy", None)

    def encode(text: str) -> np.ndarray:
        return (to_numpy(text, disallowed_special=()) if to_numpy else
                np.asarray(enc.encode_ordinary(text)))

    arrays = []
    for t in texts:
        try:
            arrays.append(encode(t))
        except UnicodeEncodeError:  # a lone surrogate (a JSON "\ud800"): not text in UTF-8
            arrays.append(encode(without_surrogates(t)))
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


_JSON_DECODER = json.JSONDecoder()


def _parse_json_line(line: str, where: str) -> Any:
    """A JSON line that the fast path could not take as is (whitespace around, or bad)."""
    try:
        return json.loads(line)
    except ValueError as e:
        raise PrepareError(
            f"{where}: not valid JSON ({e}); a .jsonl/.json file must hold one JSON object "
            f"per line, or one JSON array"
        ) from None


def _jsonl_task_pieces(task: JsonlTask) -> TextTask:
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
    raw_decode, field_name, piece_chars = _JSON_DECODER.raw_decode, task.text_field, task.piece_chars
    for i, line in enumerate(lines):
        try:
            obj, end = raw_decode(line)  # json.loads minus its per-call checks
            if end != len(line) and not line[end:].isspace():
                raise ValueError
        except ValueError:
            if not line.strip():
                continue  # a blank line: an empty record
            obj = _parse_json_line(line, f"{task.path}:{task.first_lineno + i}")
        try:
            text = obj[field_name]  # the usual case; anything else is sorted out below
            if not isinstance(text, str):
                raise TypeError
        except (KeyError, TypeError, IndexError):
            text = record_text(obj, field_name, f"{task.path}:{task.first_lineno + i}")
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
        task = _jsonl_task_pieces(task)
    tokens, lens = encode_pieces(task.texts, [p == 0 for p in task.pieces])
    return tokens, lens, np.asarray(task.records, dtype=np.int64), np.asarray(task.pieces, dtype=np.int64)


def encode_in_order(tasks: Iterator[Task], workers: int) -> Iterator[Encoded]:
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
        pool = mp.get_context().Pool(workers, initializer=_ignore_sigint_in_worker)
    finally:
        gc.unfreeze()
    with pool:  # exit terminates the workers
        pending: deque[Any] = deque()
        try:
            for task in tasks:
                pending.append(pool.apply_async(encode_task, (task,)))
                if len(pending) >= _IN_FLIGHT_PER_WORKER * workers:
                    yield pending.popleft().get()
            while pending:
                yield pending.popleft().get()
        finally:
            # Stopped early (an error, Ctrl-C, --max-tokens): let the few tasks in flight
            # finish before terminate() kills the workers. A worker killed while it puts a
            # result can leave the result queue's lock held, and terminate() then waits on
            # it forever (seen once in this suite, under load).
            for result in pending:
                result.wait(timeout=60)
