"""One preparation run: source -> pieces -> worker encoding -> shards, with progress."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from gpt.core.fileio import FolderLock, remove_dead_temp_files
from gpt.core.units import format_duration, human_count
from gpt.data.prepare import config
from gpt.data.prepare.config import (LAYOUT_VERSION, METADATA_VERSION, TOKENIZER_NAME,
                                     PrepareConfig, PrepareError, PrepareResult, available_cpus)
from gpt.data.prepare.encode import encode_in_order, get_encoder
from gpt.data.prepare.pieces import Position
from gpt.data.prepare.sources import open_source
from gpt.data.prepare.writer import ShardWriter, inspect_output, shard_totals


class Progress:
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
        line = f"{self.what}: {human_count(total_tokens)} tokens, {docs:,} docs | {human_count(tokens / dt)} tok/s, {human_count(docs / dt)} docs/s"
        if fraction is not None:
            line += f" | {100 * fraction:.1f}%"
            if not final and fraction > self.f0:
                line += f" ETA {format_duration((now - self.t_f0) * (1 - fraction) / (fraction - self.f0))}"
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



def check_config(cfg: PrepareConfig) -> None:
    if cfg.val_tokens is not None and cfg.val_tokens < 0:
        raise PrepareError(f"--val-tokens must be >= 0, got {cfg.val_tokens}")
    if cfg.shard_tokens < 1:
        raise PrepareError(f"--shard-tokens must be >= 1, got {cfg.shard_tokens}")
    if cfg.workers < 0:
        raise PrepareError(f"--workers must be >= 0 (0: one per CPU core), got {cfg.workers}")
    if cfg.max_tokens is not None and cfg.val_tokens is not None and cfg.max_tokens <= cfg.val_tokens:
        raise PrepareError(
            f"--max-tokens {cfg.max_tokens} leaves nothing for training after --val-tokens "
            f"{cfg.val_tokens}; raise --max-tokens or lower --val-tokens"
        )
    if not cfg.sources:
        raise PrepareError("--source: give at least one file, folder, glob or dataset name")


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
    check_config(cfg)
    enc = get_encoder()
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
        "layout": {"version": LAYOUT_VERSION, "piece_chars": config.PIECE_CHARS,
                   "read_chars": config.READ_CHARS},
    }
    lock = take_folder(out)
    finished = False
    try:
        existing = inspect_output(out, settings, cfg.overwrite)
        if cfg.val_tokens is None and existing.val_tokens is not None and existing.shards:
            # a resume of a split the run left to itself: the count it settled on
            cfg = dataclasses.replace(cfg, val_tokens=existing.val_tokens)
            settings["val_tokens"] = cfg.val_tokens
        progress = Progress(cfg.progress, log or sys.stderr, f"{out}", cfg.max_tokens)
        if existing.complete:
            progress.say(f"{out}: already complete ({len(existing.shards)} shards); --overwrite redoes it")
            finished = True
            return result_from_shards(out, existing.shards, len(existing.shards), t0)
        meta = {
            "format": "gpt2-trainer token shards (see gpt/data/shards.py)",
            "version": METADATA_VERSION,
            "created": existing.created,
            "tool": "fineweb.py",
            "source": {**source.identity(), "text_field": cfg.text_field},
            "tokenizer": {"name": TOKENIZER_NAME, "library": "tiktoken", "eot_token": enc.eot_token,
                          "vocab_size": enc.n_vocab, "dtype": "uint16"},
            "settings": settings,
        }
        writer = ShardWriter(out, cfg, meta, existing, on_shard)
        kept = len(existing.shards)
        start = writer.pos
        workers = cfg.workers or available_cpus()
        if kept:
            progress.say(f"{out}: resuming after {kept} complete shards ({human_count(writer.total)} tokens)")
        progress.say(f"reading {source.describe()}; {workers} tokenizer worker{'s' * (workers > 1)}")

        tasks = source.tasks(start, config.PIECE_CHARS, config.TASK_CHARS)
        encoded = encode_in_order(tasks, workers)
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
                        raise input_changed_error(out, start)
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
            raise input_changed_error(out, start)
        if writer.total == 0:  # checked first: with --overwrite, the old shards stay
            raise PrepareError(f"--source {source.describe()}: no text found (every record is empty)")
        if writer.val_tokens is not None and writer.written["train"] + (
                writer.filled if writer.split == "train" else 0) == 0:
            # checked before the last shard is written; one written already is taken back
            writer.discard(kept)
            raise PrepareError(
                f"--source {source.describe()}: the input has only {writer.total:,} tokens and "
                f"--val-tokens {writer.val_tokens:,} would take them all, leaving none to train "
                f"on; lower --val-tokens, or leave it out (a tenth of a small input validates)"
            )
        writer.finish()
        progress.update(writer.documents - docs_before, new_tokens, writer.total, source.fraction(), final=True)
        writer.write_metadata(complete=True)
        finished = True
        result = result_from_shards(out, writer.shards, kept, t0)
        return dataclasses.replace(result, note=writer.note)
    finally:  # a run that wrote nothing leaves no folder behind
        lock.release(remove_folder_if_unused=not finished)


def take_folder(out: Path) -> FolderLock:
    """The output folder for this run alone (created if need be), cleared of the temporary
    files of killed writes."""
    if out.exists() and not out.is_dir():
        raise PrepareError(f"--out {out}: exists and is not a folder")
    try:
        lock = FolderLock(out, "fineweb.py run").acquire()
        remove_dead_temp_files(out)
    except OSError as e:
        raise PrepareError(f"--out {out}: cannot create or write there ({e.strerror or e})") from None
    return lock


def input_changed_error(out: Path, start: Position) -> PrepareError:
    return PrepareError(
        f"--out {out}: the input changed since the interrupted run (piece {start.piece} of "
        f"record {start.record} is not where it was); pass --overwrite to start over"
    )


def result_from_shards(out: Path, shards: list[dict[str, Any]], kept: int, t0: float) -> PrepareResult:
    totals = shard_totals(shards)
    return PrepareResult(out, shards, totals["val_tokens"], totals["train_tokens"],
                         totals["documents"], kept, time.perf_counter() - t0)
