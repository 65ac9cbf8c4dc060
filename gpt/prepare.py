"""Turn text into token shards the trainer reads.

This version handles local plain-text files: each file is one document, and every
document is preceded by GPT-2's end-of-text token, the delimiter the model learns
document boundaries from. The first `val_tokens` tokens go to val_* shards, the rest
to train_* shards of at most `shard_tokens` tokens each.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from gpt.data import DataError, write_shard


@dataclass(frozen=True)
class PrepareConfig:
    sources: tuple[str, ...]
    out_dir: str
    val_tokens: int = 10_000
    shard_tokens: int = 100_000_000


def text_files(sources: Iterable[str]) -> list[Path]:
    """Expand files and folders (their *.txt files, sorted) into a list of files."""
    files: list[Path] = []
    for src in sources:
        p = Path(src)
        if p.is_dir():
            found = sorted(p.rglob("*.txt"))
            if not found:
                raise DataError(f"--source {p}: folder holds no .txt files")
            files.extend(found)
        elif p.is_file():
            if p.suffix != ".txt":
                raise DataError(f"--source {p}: only plain .txt files are supported here")
            files.append(p)
        else:
            raise DataError(f"--source {p}: no such file or folder")
    return files


def token_stream(files: Iterable[Path], encoder) -> Iterator[np.ndarray]:
    """Yield each document's tokens, EOT first, as uint16."""
    eot = encoder.eot_token
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        ids = encoder.encode_ordinary(text)
        yield np.asarray([eot, *ids], dtype=np.uint16)


def write_shards(chunks: Iterable[np.ndarray], cfg: PrepareConfig) -> list[Path]:
    """Cut the token stream into val then train shards; returns the paths written."""
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    buf: list[np.ndarray] = []
    filled = total = 0
    split, index, limit = ("val", 0, cfg.val_tokens) if cfg.val_tokens > 0 else ("train", 0, cfg.shard_tokens)

    def flush() -> None:
        nonlocal buf, filled, index
        path = out / f"{split}_{index:06d}.bin"
        write_shard(path, np.concatenate(buf))
        written.append(path)
        buf, filled, index = [], 0, index + 1

    for chunk in chunks:
        total += chunk.size
        while chunk.size:
            take = min(chunk.size, limit - filled)
            buf.append(chunk[:take])
            filled += take
            chunk = chunk[take:]
            if filled == limit:
                flush()
                if split == "val":
                    split, index, limit = "train", 0, cfg.shard_tokens
    if filled:
        flush()
    if not any(p.name.startswith("train_") for p in written):
        raise DataError(
            f"{out}: the input has only {total} tokens and --val-tokens {cfg.val_tokens} took "
            f"them all; lower --val-tokens"
        )
    return written
