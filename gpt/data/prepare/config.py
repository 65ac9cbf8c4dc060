"""fineweb.py's settings, defaults and results, and the constants every stage shares.
The bottom of the package: it imports none of the other stages."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpt.data.shards import METADATA_NAME, DataError


DEFAULT_DATASET = "HuggingFaceFW/fineweb-edu"
DEFAULT_SUBSET = "sample-10BT"  # the subset used when --source is DEFAULT_DATASET
DEFAULT_OUT = "data/fineweb-edu-10B"  # the trainer's default --data-dir
DEMO_SOURCE = "demo"  # --source demo: the tiny shakespeare corpus the package ships
# One full validation of the trainer's defaults on 8 GPUs: 20 val steps x 8 ranks x B=64 x
# T=1024 = 10,485,760 tokens, plus 1 because each window also needs its last target token;
# with exactly 10,485,760 the loader would serve only 19 steps per pass.
DEFAULT_VAL_TOKENS = 20 * 8 * 64 * 1024 + 1
# Without --val-tokens, an input of fewer than VAL_SHARE x DEFAULT_VAL_TOKENS tokens gives
# 1/VAL_SHARE of itself to validation (its own text: 61k tokens would otherwise all go to
# validation and none to training); the run holds up to that many tokens before it knows.
VAL_SHARE = 10
DEFAULT_SHARD_TOKENS = 100_000_000
TOKENIZER_NAME = "gpt2"

PIECE_CHARS = 1 << 18  # a document longer than this is encoded in pieces
TASK_CHARS = 1 << 19  # characters per worker task: few IPC round trips, still balanced
READ_CHARS = 1 << 20  # .txt files are read in chunks of this many characters
# Bumped whenever pieces, tasks or the stream layout change: a resume across such a change
# could mis-skip input, so metadata written by another layout counts as other settings.
LAYOUT_VERSION = 1
METADATA_VERSION = 1


class PrepareError(DataError):
    """A user-facing problem with the input, the flags or the output folder (one line)."""


@dataclass(frozen=True)
class PrepareConfig:
    """Settings of one preparation run; see fineweb.py --help for each flag."""

    sources: tuple[str, ...] = (DEFAULT_DATASET,)
    out_dir: str = DEFAULT_OUT
    val_tokens: int | None = None  # None: DEFAULT_VAL_TOKENS, or a VAL_SHARE-th of a smaller input
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
    note: str | None = None  # how the validation split was sized, where --val-tokens was left out

    @property
    def tokens(self) -> int:
        return self.val_tokens + self.train_tokens


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
