"""The shard file format: header, write, read, validate, find. Numpy only (no torch), so
fineweb.py and its tokenizer workers start fast and small.

Shard file format
-----------------
A shard is a 1024-byte header followed by the token ids.  The header is 256
little-endian int32 slots:

* ``[0]`` ``SHARD_MAGIC`` (0x47505432), ``[1]`` ``SHARD_VERSION`` (1)
* ``[2]``, ``[3]`` token count as a 64-bit integer: low, high 32-bit halves
  (read as unsigned), so shards may hold more than 2**31 tokens
* ``[4]`` token dtype code (``1`` = uint16 little-endian), see ``DTYPE_CODES``
* the rest are zero.

Shards of a split live in one folder as ``{split}_*`` (e.g.
``train_000000.bin``), ``split`` being ``"train"`` or ``"val"``. fineweb.py writes
``metadata.json`` beside them (its settings and shards, and ``"complete": true`` once it
has finished; gpt/data/prepare/writer.py) and holds the folder's lock (gpt/core/fileio.py) while it
writes.

Other trainers' shards, read as they are (detected from the file, validated as strictly)
-------------------------------------------------------------------------------------
* llm.c (``*_train_*.bin``, ``*_val_*.bin``): 256 little-endian int32 slots, ``[0]``
  ``LLMC_MAGIC`` (20240520), ``[1]`` version (1: uint16 tokens, 2: uint32), ``[2]`` token
  count; then the tokens.
* build-nanogpt (``*_train_*.npy``, ``*_val_*.npy``): a ``.npy`` file as ``np.save``
  writes it, one 1-D array of integer token ids (uint16 there).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from gpt.core.errors import UserError
from gpt.core.fileio import atomic_write, lock_holder


SHARD_MAGIC = 0x47505432
LLMC_MAGIC = 20240520
LLMC_DTYPES: dict[int, np.dtype] = {1: np.dtype("<u2"), 2: np.dtype("<u4")}
NPY_MAGIC = b"\x93NUMPY"
SHARD_VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
DTYPE_CODES: dict[int, np.dtype] = {1: np.dtype("<u2")}
SPLITS = ("train", "val")
METADATA_NAME = "metadata.json"  # fineweb.py's record of a shard folder

_WRITE_CODE = 1  # dtype code used by write_shard
_MAX_TOKEN = 65535
_SCAN_CHUNK = 4 * 1024 * 1024  # tokens per vocab scan chunk: bounds memory
_RECREATE_HINT = "re-create it with fineweb.py"


class DataError(UserError, ValueError):
    """A problem with the data folder or the loader's data."""


class ShardError(DataError):
    """A problem with one shard file; the message starts with its path."""


# ---- one shard file


def _make_header(num_tokens: int, dtype_code: int) -> np.ndarray:
    """Build the 256-slot header (stored as uint32, bit-identical to int32)."""
    header = np.zeros(HEADER_INTS, dtype="<u4")
    header[0] = SHARD_MAGIC
    header[1] = SHARD_VERSION
    header[2] = num_tokens & 0xFFFFFFFF
    header[3] = num_tokens >> 32
    header[4] = dtype_code
    return header


def _as_token_array(path: Path, tokens: np.ndarray | Iterable[int]) -> np.ndarray:
    """Convert tokens to a flat integer array, or raise ShardError."""
    if isinstance(tokens, np.ndarray):
        arr = tokens
    elif isinstance(tokens, Sequence):
        arr = np.asarray(tokens)
    else:  # an iterator/generator: np.asarray would make a 0-d object array
        arr = np.fromiter(tokens, dtype=np.int64)
    arr = arr.reshape(-1)
    if arr.size == 0:
        return np.zeros(0, dtype="<u2")
    if arr.dtype.kind not in "iu":
        raise ShardError(f"{path}: tokens must be integers, got dtype {arr.dtype}")
    bad = (arr < 0) | (arr > _MAX_TOKEN)
    if bad.any():
        idx = int(np.flatnonzero(bad)[0])
        raise ShardError(
            f"{path}: token {int(arr[idx])} at index {idx} does not fit in uint16 "
            f"(allowed 0..{_MAX_TOKEN})"
        )
    return np.ascontiguousarray(arr, dtype="<u2")


def write_shard(path: str | os.PathLike, tokens: np.ndarray | Iterable[int]) -> None:
    """Write tokens (ints in 0..65535) to a shard, atomically."""
    path = Path(path)
    arr = _as_token_array(path, tokens)
    header = _make_header(arr.size, _WRITE_CODE)

    def write(f) -> None:
        f.write(header.data)
        f.write(arr.data)

    try:
        atomic_write(path, write)
    except OSError as exc:
        raise ShardError(f"{path}: cannot write shard: {exc}") from exc


@dataclass(frozen=True)
class Layout:
    """Where a shard file's tokens are: how many, of which dtype, from which byte."""

    num_tokens: int
    dtype: np.dtype
    offset: int
    kind: str  # "gpt2-trainer", "llm.c" or "npy"


def read_layout(path: Path) -> Layout:
    """Validate a shard file of any of the formats read here (this trainer's, llm.c's, a
    build-nanogpt .npy; see the module docstring) and its exact size; say where its tokens
    are. Every failure is a ShardError naming the file."""
    if not path.exists():
        raise ShardError(f"{path}: shard file not found")
    if not path.is_file():
        raise ShardError(f"{path}: is not a regular file")
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
            if raw.startswith(NPY_MAGIC):
                f.seek(0)
                layout = _npy_layout(path, f)
            else:
                layout = _header_layout(path, raw)
    except OSError as exc:
        raise ShardError(f"{path}: cannot read shard: {exc.strerror or exc}") from exc
    expected = layout.offset + layout.num_tokens * layout.dtype.itemsize
    if size < expected:
        raise ShardError(
            f"{path}: truncated data: header says {layout.num_tokens} tokens, expected "
            f"{expected} bytes but file has {size}; {_RECREATE_HINT}"
        )
    if size > expected:
        raise ShardError(
            f"{path}: {size - expected} trailing bytes: header says {layout.num_tokens} "
            f"tokens, expected {expected} bytes but file has {size}; {_RECREATE_HINT}"
        )
    return layout


def _header_layout(path: Path, raw: bytes) -> Layout:
    """This trainer's header or llm.c's, both 256 little-endian int32 slots."""
    if len(raw) < HEADER_BYTES and int.from_bytes(raw[:4], "little") not in (SHARD_MAGIC,
                                                                            LLMC_MAGIC):
        # short, and not even the start of a shard: a file that only bears a shard's name
        raise ShardError(
            f"{path}: not a shard (a file of {len(raw)} bytes that starts with neither this "
            f"trainer's magic nor llm.c's, nor is a .npy array), only named like one: is "
            f"--data-dir the folder of the shards? Else move it out of the data folder")
    if len(raw) < HEADER_BYTES:
        raise ShardError(
            f"{path}: truncated header ({len(raw)} bytes, need {HEADER_BYTES}); "
            f"{_RECREATE_HINT}"
        )
    header = np.frombuffer(raw, dtype="<u4")
    magic, version = int(header[0]), int(header[1])
    if magic == LLMC_MAGIC:
        if version not in LLMC_DTYPES:
            raise ShardError(f"{path}: llm.c shard of unknown version {version} (this code reads "
                             f"versions {sorted(LLMC_DTYPES)})")
        return Layout(int(header[2]), LLMC_DTYPES[version], HEADER_BYTES, "llm.c")
    if magic != SHARD_MAGIC:
        raise ShardError(
            f"{path}: bad magic {magic:#010x}, expected {SHARD_MAGIC:#010x}; not a gpt2-trainer "
            f"shard (nor llm.c's, magic {LLMC_MAGIC}, nor a .npy array), {_RECREATE_HINT}"
        )
    if version != SHARD_VERSION:
        raise ShardError(
            f"{path}: unknown shard version {version} (this code reads version "
            f"{SHARD_VERSION}); {_RECREATE_HINT}"
        )
    code = int(header[4])
    if code not in DTYPE_CODES:
        raise ShardError(
            f"{path}: unknown token dtype code {code} (known: {sorted(DTYPE_CODES)}); "
            f"{_RECREATE_HINT}"
        )
    num_tokens = int(header[2]) | (int(header[3]) << 32)
    return Layout(num_tokens, DTYPE_CODES[code], HEADER_BYTES, "gpt2-trainer")


def _npy_layout(path: Path, f: BinaryIO) -> Layout:
    """A .npy file as np.save writes it (build-nanogpt's shards): one 1-D array of integers."""
    try:
        major, _ = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read(f)
    except ValueError as exc:
        raise ShardError(f"{path}: not a readable .npy file ({exc})") from None
    if len(shape) != 1 or dtype.kind not in "iu" or dtype.byteorder == ">":
        raise ShardError(f"{path}: a .npy shard must hold one 1-D array of little-endian integer "
                         f"token ids; this one holds shape {shape}, dtype {dtype}")
    return Layout(int(shape[0]), dtype, f.tell(), "npy")


def shard_num_tokens(path: str | os.PathLike) -> int:
    """Token count of a shard, from its (validated) header only."""
    return read_layout(Path(path)).num_tokens


def bad_token_error(path: Path, tokens: np.ndarray, bad: np.ndarray, offset: int, what: str,
                    hint: str = f"wrong tokenizer or corrupt shard, {_RECREATE_HINT}") -> ShardError:
    """The error for the first token where `bad` (a mask over `tokens`, which start at
    index `offset` of the shard) is set; `what` says why that id is wrong, `hint` what to
    do."""
    idx = int(np.flatnonzero(bad)[0])
    return ShardError(f"{path}: token id {int(tokens[idx])} at index {offset + idx} is {what}; "
                      f"{hint}")


def check_token_range(path: Path, tokens: np.ndarray, offset: int, vocab_size: int | None) -> None:
    """Raise on the first id in `tokens` (index `offset` of the shard on) outside
    0..vocab_size-1, the rows of the embedding (only below 0 if vocab_size is None):
    above, or negative, which a signed .npy shard can hold (torch would fail on either deep
    inside the embedding)."""
    if not tokens.size:
        return
    if tokens.dtype.kind == "i" and int(tokens.min()) < 0:
        raise bad_token_error(path, tokens, tokens < 0, offset, "negative (ids start at 0)")
    if vocab_size is not None and int(tokens.max()) >= vocab_size:
        # the model is too small for the data far more often than the data is wrong
        raise bad_token_error(path, tokens, tokens >= vocab_size, offset,
                              f">= --vocab-size {vocab_size}, beyond the model's vocabulary",
                              f"raise --vocab-size to hold the data's ids (GPT-2's tokenizer "
                              f"has 50,257; the default 50,304 pads them), or the shard is of "
                              f"another tokenizer or corrupt ({_RECREATE_HINT})")


def check_first_tokens(path: str | os.PathLike, vocab_size: int) -> None:
    """check_token_range over the first _SCAN_CHUNK tokens of a shard: in milliseconds, a
    vocabulary too small for the data (the usual case of ids beyond it) is found before a
    run, which would stop at its first batch; --check-tokens scans every token."""
    shard = Shard(path)
    try:
        check_token_range(shard.path, shard.read(0, min(shard.num_tokens, _SCAN_CHUNK)), 0,
                          vocab_size)
    finally:
        shard.close()


def _check_vocab(path: Path, tokens: np.ndarray, vocab_size: int) -> None:
    """check_token_range over a whole shard, in chunks (bounded memory)."""
    for start in range(0, tokens.size, _SCAN_CHUNK):
        check_token_range(path, np.asarray(tokens[start : start + _SCAN_CHUNK]), start, vocab_size)


class Shard:
    """One shard opened for reading: its header validated once, then token ranges read with
    pread. A read that comes back short (the file was truncated or replaced while a run
    reads it) is a ShardError naming the file, where a memory map would kill the process
    with SIGBUS."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.layout = read_layout(self.path)
        self.num_tokens, self.dtype = self.layout.num_tokens, self.layout.dtype
        self._fd: int | None = None

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the shard, as a read-only array of the stored dtype."""
        size = self.dtype.itemsize
        want = (stop - start) * size
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY)
            data = os.pread(self._fd, want, self.layout.offset + start * size)
        except OSError as exc:
            raise ShardError(f"{self.path}: cannot read shard: {exc.strerror or exc}") from exc
        if len(data) != want:
            raise ShardError(
                f"{self.path}: holds fewer tokens than its header said when the run started "
                f"({self.num_tokens}): it was truncated or replaced while training read it; "
                f"restore it, or {_RECREATE_HINT}")
        return np.frombuffer(data, dtype=self.dtype)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_shard(path: str | os.PathLike, vocab_size: int | None = None) -> np.ndarray:
    """Validate a shard and return a read-only memmap of its tokens."""
    path = Path(path)
    layout = read_layout(path)
    tokens = np.memmap(path, dtype=layout.dtype, mode="r", offset=layout.offset, shape=(layout.num_tokens,))
    if vocab_size is not None:
        _check_vocab(path, tokens, vocab_size)
    return tokens


# ---- a split's shards in a folder


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")


def is_shard_name(name: str, split: str) -> bool:
    """``{split}_*`` (this trainer), or ``*_{split}_*.bin`` / ``.npy`` (llm.c's and
    build-nanogpt's, e.g. fineweb_train_000001.bin, edufineweb_val_000000.npy), or llm.c's
    single-file ``*_{split}.bin`` (tiny_shakespeare_val.bin, TinyStories_train.bin)."""
    return name.startswith(f"{split}_") or (
        name.endswith((".bin", ".npy")) and (f"_{split}_" in name or name.endswith(f"_{split}.bin")))


def find_shards(folder: str | os.PathLike, split: str) -> list[Path]:
    """The shard files of a split in folder (see is_shard_name), sorted by name."""
    check_split(split)
    folder = Path(folder)
    if not folder.exists():
        raise DataError(f"{folder}: data folder does not exist; run fineweb.py to create shards")
    if not folder.is_dir():
        raise DataError(f"{folder}: is not a directory; pass the folder that holds the shards")
    try:
        # Names starting with '.' are write_shard temp files (or other hidden files).
        entries = sorted((p for p in folder.iterdir() if not p.name.startswith(".")), key=lambda p: p.name)
    except OSError as e:
        raise DataError(f"{folder}: cannot list the data folder ({e.strerror or e})") from None
    for p in entries:  # a shard that cannot be read must not drop out of the data in silence
        if p.is_symlink() and not p.exists():
            raise ShardError(f"{p}: a symlink to {os.readlink(p)}, which does not exist")
        if p.name.endswith((".bin", ".npy")) and is_shard_name(p.name, split) and not p.is_file():
            raise ShardError(f"{p}: named like a shard but not a file; move it out of the "
                             f"data folder")
    names = [p.name for p in entries if p.is_file()]  # sub-folders are not shards
    shards = [folder / n for n in names if is_shard_name(n, split)]
    if not shards:
        prefixes = sorted({n.split("_", 1)[0] + "_*" for n in names if "_" in n})
        found = f"found only {', '.join(prefixes)}" if prefixes else "found no shards"
        raise DataError(
            f"{folder}: no {split}_* shards ({found}); run fineweb.py to create them"
        )
    return shards


def check_not_being_written(folder: str | os.PathLike, allow: bool) -> str | None:
    """Refuse a data folder that another process (fineweb.py) is writing now: the shards
    there are only part of the data, and more appear (or, with its --overwrite, go) while a
    run reads them. With `allow`, a warning instead. A folder whose metadata.json says it is
    incomplete but that nobody writes (fineweb.py was stopped) gets a warning too. Returns
    the warning, or None."""
    folder = Path(folder)
    holder = lock_holder(folder)
    try:
        meta = json.loads((folder / METADATA_NAME).read_text(encoding="utf-8"))
        done, shards = bool(meta["complete"]), len(meta["shards"])
    except (OSError, ValueError, KeyError, TypeError):  # none, or not fineweb.py's: no opinion
        done, shards = None, 0
    so_far = f" ({METADATA_NAME}: {shards} shards so far)" if done is False else ""
    if holder is not None:
        if not allow:
            raise DataError(f"--data-dir {folder} is still being written, by {holder}{so_far}: "
                            f"wait for it to finish, or pass --allow-incomplete-data to train on "
                            f"the shards there now")
        return (f"--data-dir {folder} is still being written, by {holder}{so_far}; training on "
                f"the shards there now (--allow-incomplete-data)")
    if done is False:
        return (f"--data-dir {folder}: {METADATA_NAME} says fineweb.py stopped before it finished "
                f"({shards} shards); training on those; the same fineweb.py command completes it")
    return None
