"""Token shards on disk and a distributed, resumable loader over them.

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
``train_000000.bin``), ``split`` being ``"train"`` or ``"val"``.

Loader semantics (``ShardLoader``)
----------------------------------
* The split's non-empty shards, in an order, form one token stream of N
  tokens.  Without shuffle the order is sorted file name order; with shuffle
  the shard order of pass (epoch) ``e`` is the permutation drawn from
  ``numpy.random.default_rng([seed, e])``, so it is deterministic for a seed.
* With B = batch_size and T = seq_len, window ``g`` of a pass is the
  ``B*T+1`` stream tokens starting at offset ``g*B*T``:
  ``x = window[:-1].view(B, T)``, ``y = window[1:].view(B, T)``.  Consecutive
  windows overlap by one target token, so every stream token but the last is
  an input once per pass.  Windows cross shard boundaries freely.
* ``steps_per_pass = (N - 1) // (B*T*world_size)``.  Rank ``r`` at step ``s``
  gets window ``s*world_size + r``: ranks are disjoint and every rank takes
  the same number of steps per pass (DDP needs lockstep).  The remainder,
  fewer than ``B*T*world_size`` tokens at the end of a pass, is not served in
  that pass; with shuffle it is a different part of the data each pass.
* After the last step of a pass the next batch starts pass ``e+1``.
* ``state_dict``/``load_state_dict`` save and restore the exact position
  (pass, step).  On restore the world size may change only if the windows
  already consumed in the pass divide evenly among the new ranks.
* ``x`` and ``y`` are int64 views of one ``B*T+1`` buffer (they share
  storage); a fresh buffer is made per batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gpt.errors import UserError
from gpt.fileio import atomic_write

if TYPE_CHECKING:  # torch is imported where the loader needs it, so shard tools
    import torch  # (fineweb.py and its workers) start fast and small

__all__ = [
    "DTYPE_CODES",
    "HEADER_BYTES",
    "SHARD_MAGIC",
    "SHARD_VERSION",
    "DataError",
    "ShardError",
    "ShardLoader",
    "find_shards",
    "read_shard",
    "shard_num_tokens",
    "write_shard",
]

SHARD_MAGIC = 0x47505432
SHARD_VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
DTYPE_CODES: dict[int, np.dtype] = {1: np.dtype("<u2")}
SPLITS = ("train", "val")
STATE_VERSION = 1

_WRITE_CODE = 1  # dtype code used by write_shard
_MAX_TOKEN = 65535
_SCAN_CHUNK = 4 * 1024 * 1024  # tokens per vocab scan chunk: bounds memory
_RECREATE_HINT = "re-create it with fineweb.py"


class DataError(UserError, ValueError):
    """A problem with the data folder or the loader's data."""


class ShardError(DataError):
    """A problem with one shard file; the message starts with its path."""


# --------------------------------------------------------------------------
# Shard files


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


def _read_header(path: Path) -> tuple[int, np.dtype]:
    """Validate a shard's header and size; return (num_tokens, dtype)."""
    if not path.exists():
        raise ShardError(f"{path}: shard file not found")
    if not path.is_file():
        raise ShardError(f"{path}: is not a regular file")
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
    except OSError as exc:
        raise ShardError(f"{path}: cannot read shard: {exc.strerror or exc}") from exc
    if len(raw) < HEADER_BYTES:
        raise ShardError(
            f"{path}: truncated header ({len(raw)} bytes, need {HEADER_BYTES}); "
            f"{_RECREATE_HINT}"
        )
    header = np.frombuffer(raw, dtype="<u4")
    magic = int(header[0])
    if magic != SHARD_MAGIC:
        raise ShardError(
            f"{path}: bad magic {magic:#010x}, expected {SHARD_MAGIC:#010x}; "
            f"not a gpt2-trainer shard, {_RECREATE_HINT}"
        )
    version = int(header[1])
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
    dtype = DTYPE_CODES[code]
    num_tokens = int(header[2]) | (int(header[3]) << 32)
    expected = HEADER_BYTES + num_tokens * dtype.itemsize
    if size < expected:
        raise ShardError(
            f"{path}: truncated data: header says {num_tokens} tokens, expected "
            f"{expected} bytes but file has {size}; {_RECREATE_HINT}"
        )
    if size > expected:
        raise ShardError(
            f"{path}: {size - expected} trailing bytes: header says {num_tokens} "
            f"tokens, expected {expected} bytes but file has {size}; {_RECREATE_HINT}"
        )
    return num_tokens, dtype


def shard_num_tokens(path: str | os.PathLike) -> int:
    """Token count of a shard, from its (validated) header only."""
    return _read_header(Path(path))[0]


def _bad_token_error(path: Path, tokens: np.ndarray, bad: np.ndarray, offset: int, what: str) -> ShardError:
    """The error for the first token where `bad` (a mask over `tokens`, which start at
    index `offset` of the shard) is set; `what` says why that id is wrong."""
    idx = int(np.flatnonzero(bad)[0])
    return ShardError(
        f"{path}: token id {int(tokens[idx])} at index {offset + idx} is {what}; "
        f"wrong tokenizer or corrupt shard, {_RECREATE_HINT}"
    )


def _check_vocab(path: Path, tokens: np.ndarray, vocab_size: int) -> None:
    """Raise on the first token id >= vocab_size, scanning in chunks."""
    for start in range(0, tokens.size, _SCAN_CHUNK):
        chunk = np.asarray(tokens[start : start + _SCAN_CHUNK])
        if int(chunk.max()) < vocab_size:
            continue
        raise _bad_token_error(path, chunk, chunk >= vocab_size, start, f">= vocab_size {vocab_size}")


def read_shard(path: str | os.PathLike, vocab_size: int | None = None) -> np.ndarray:
    """Validate a shard and return a read-only memmap of its tokens."""
    path = Path(path)
    num_tokens, dtype = _read_header(path)
    tokens = np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(num_tokens,))
    if vocab_size is not None:
        _check_vocab(path, tokens, vocab_size)
    return tokens


# --------------------------------------------------------------------------
# Finding shards


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")


def find_shards(folder: str | os.PathLike, split: str) -> list[Path]:
    """The ``{split}_*`` shard files in folder, sorted by name."""
    _check_split(split)
    folder = Path(folder)
    if not folder.exists():
        raise DataError(f"{folder}: data folder does not exist; run fineweb.py to create shards")
    if not folder.is_dir():
        raise DataError(f"{folder}: is not a directory; pass the folder that holds the shards")
    # Names starting with '.' are write_shard temp files (or other hidden files).
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith(".") and p.is_file())
    shards = [folder / n for n in names if n.startswith(f"{split}_")]
    if not shards:
        prefixes = sorted({n.split("_", 1)[0] + "_*" for n in names if "_" in n})
        found = f"found only {', '.join(prefixes)}" if prefixes else "found no shards"
        raise DataError(
            f"{folder}: no {split}_* shards ({found}); run fineweb.py to create them"
        )
    return shards


# --------------------------------------------------------------------------
# Loader


def _check_int(name: str, value: object, minimum: int) -> int:
    """Return value if it is an int >= minimum, else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


class ShardLoader:
    """Serves (x, y) int64 batches of shape (B, T) from a split's shards.

    See the module docstring for the exact stream, rank and resume semantics.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        split: str,
        batch_size: int,
        seq_len: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = False,
        device: str | torch.device = "cpu",
        vocab_size: int | None = None,
        max_token: int | None = None,
    ) -> None:
        _check_split(split)
        self._B = _check_int("batch_size", batch_size, 1)
        self._T = _check_int("seq_len", seq_len, 1)
        self._world_size = _check_int("world_size", world_size, 1)
        self._rank = _check_int("rank", rank, 0)
        if self._rank >= self._world_size:
            raise ValueError(f"rank must be < world_size ({self._world_size}), got {rank}")
        self._seed = _check_int("seed", seed, 0)  # SeedSequence needs seed >= 0
        if vocab_size is not None:
            _check_int("vocab_size", vocab_size, 1)
        # Cheap per-batch check (B*T tokens, on the host) that catches an out-of-vocabulary
        # id with a clear message instead of an index error deep inside the embedding.
        self._max_token = None if max_token is None else _check_int("max_token", max_token, 0)
        self._device = self._parse_device(device)
        self._split = split
        self._shuffle = bool(shuffle)
        self._folder = Path(folder)

        self._paths = find_shards(self._folder, split)
        if vocab_size is None:
            self._counts = [shard_num_tokens(p) for p in self._paths]
        else:
            self._counts = [read_shard(p, vocab_size).size for p in self._paths]
        self._num_tokens = sum(self._counts)
        per_step = self._B * self._T * self._world_size
        self._steps_per_pass = (self._num_tokens - 1) // per_step
        if self._steps_per_pass <= 0:
            raise DataError(
                f"{self._folder}: split {split!r} has {self._num_tokens} tokens but one "
                f"step needs batch_size*seq_len*world_size+1 = {per_step + 1}; "
                f"use a smaller batch_size/seq_len or more data"
            )
        self._maps: dict[int, np.ndarray] = {}  # shard index -> memmap, opened lazily
        self._layout_epoch = -1
        self._order = np.zeros(0, dtype=np.int64)
        self._offsets = np.zeros(1, dtype=np.int64)
        # CUDA only: two pinned buffers used alternately, with the event of the
        # last async copy out of each, so a buffer is never refilled mid-copy.
        self._pinned: list[torch.Tensor] = []
        self._events: list[torch.cuda.Event | None] = [None, None]
        self._next_buf = 0
        self.reset()

    @staticmethod
    def _parse_device(device: str | torch.device) -> torch.device:
        import torch

        try:
            return torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device {device!r} is not a valid torch device") from exc

    # ---- properties

    @property
    def shards(self) -> list[Path]:
        """All shard paths of the split, in file name order."""
        return list(self._paths)

    @property
    def num_tokens(self) -> int:
        """N, the total number of tokens in the split."""
        return self._num_tokens

    @property
    def steps_per_pass(self) -> int:
        """Batches each rank serves per pass over the data."""
        return self._steps_per_pass

    @property
    def tokens_per_pass(self) -> int:
        """Input tokens served per pass, summed over all ranks."""
        return self._steps_per_pass * self._B * self._T * self._world_size

    @property
    def epoch(self) -> int:
        """Current pass number."""
        return self._epoch

    @property
    def step(self) -> int:
        """Next step within the current pass."""
        return self._step

    # ---- stream layout

    def _shard_order(self, epoch: int) -> np.ndarray:
        """Indices into self._paths giving the shard order of a pass."""
        if not self._shuffle:
            return np.arange(len(self._paths))
        return np.random.default_rng([self._seed, epoch]).permutation(len(self._paths))

    def _set_layout(self, epoch: int) -> None:
        """Compute the pass's stream: non-empty shards in order + cumulative offsets."""
        if epoch == self._layout_epoch:
            return
        order = [int(i) for i in self._shard_order(epoch) if self._counts[i] > 0]
        self._order = np.asarray(order, dtype=np.int64)
        counts = np.asarray([self._counts[i] for i in order], dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(counts)])
        self._layout_epoch = epoch

    def _tokens(self, shard: int) -> np.ndarray:
        if shard not in self._maps:
            self._maps[shard] = read_shard(self._paths[shard])
        return self._maps[shard]

    def _fill_window(self, window: int, out: np.ndarray) -> None:
        """Copy window's B*T+1 stream tokens into out (int64), piece by piece."""
        start = window * self._B * self._T
        end = start + out.size
        i = int(np.searchsorted(self._offsets, start, side="right")) - 1
        pos = start
        while pos < end:
            base = int(self._offsets[i])
            stop = min(end, int(self._offsets[i + 1]))
            # Only this slice of the memmap is read and widened to int64.
            shard = int(self._order[i])
            piece = self._tokens(shard)[pos - base : stop - base]
            if self._max_token is not None and piece.size and int(piece.max()) > self._max_token:
                self._bad_token(shard, piece, pos - base)
            out[pos - start : stop - start] = piece
            pos = stop
            i += 1

    def _bad_token(self, shard: int, piece: np.ndarray, offset: int) -> None:
        raise _bad_token_error(self._paths[shard], piece, piece > self._max_token, offset,
                               f"beyond the model's vocabulary (largest id {self._max_token})")

    # ---- batches

    def reset(self) -> None:
        """Go back to pass 0, step 0."""
        self._epoch = 0
        self._step = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Next (x, y), int64 tensors of shape (B, T) on the loader's device."""
        import torch

        self._set_layout(self._epoch)
        window = self._step * self._world_size + self._rank
        n = self._B * self._T + 1
        if self._device.type == "cuda":
            buf = self._to_cuda(window, n)
        else:
            host = np.empty(n, dtype=np.int64)
            self._fill_window(window, host)
            buf = torch.from_numpy(host)
            if self._device.type != "cpu":
                buf = buf.to(self._device)
        self._advance()
        x = buf[:-1].view(self._B, self._T)
        y = buf[1:].view(self._B, self._T)
        return x, y

    def _to_cuda(self, window: int, n: int) -> torch.Tensor:
        """Fill a pinned buffer and start an async copy of it to the GPU."""
        import torch

        if not self._pinned:
            self._pinned = [torch.empty(n, dtype=torch.int64, pin_memory=True) for _ in range(2)]
        k = self._next_buf
        self._next_buf = 1 - k
        event = self._events[k]
        if event is not None:
            event.synchronize()  # the previous copy out of this buffer must finish first
        self._fill_window(window, self._pinned[k].numpy())
        out = self._pinned[k].to(self._device, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self._device))
        self._events[k] = event
        return out

    def _advance(self) -> None:
        self._step += 1
        if self._step >= self._steps_per_pass:
            self._epoch += 1
            self._step = 0

    # ---- checkpointing

    def _fingerprint(self) -> list[list[str | int]]:
        return [[p.name, n] for p, n in zip(self._paths, self._counts)]

    def state_dict(self) -> dict:
        """Position and identity of the loader, as plain python types."""
        return {
            "version": STATE_VERSION,
            "split": self._split,
            "batch_size": self._B,
            "seq_len": self._T,
            "world_size": self._world_size,
            "rank": self._rank,
            "seed": self._seed,
            "shuffle": self._shuffle,
            "epoch": self._epoch,
            "step": self._step,
            "shards": self._fingerprint(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the position saved by state_dict (rank stays this loader's)."""
        required = ("version", "split", "batch_size", "seq_len", "world_size", "seed",
                    "shuffle", "epoch", "step", "shards")
        missing = [k for k in required if k not in state]
        if missing:
            raise ValueError(f"loader state is missing fields: {', '.join(missing)}")
        if state["version"] != STATE_VERSION:
            raise ValueError(
                f"loader state has version {state['version']!r}, this code reads {STATE_VERSION}"
            )
        self._check_same_data(state)
        saved_ws = _check_int("saved world_size", state["world_size"], 1)
        epoch = _check_int("saved epoch", state["epoch"], 0)
        step = _check_int("saved step", state["step"], 0)
        consumed = step * saved_ws  # global windows already served in this pass
        if consumed % self._world_size:
            raise ValueError(
                f"cannot resume with world_size {self._world_size}: the saved state "
                f"(world_size {saved_ws}, step {step}) consumed {consumed} windows of "
                f"the pass, not divisible by {self._world_size}"
            )
        new_step = consumed // self._world_size
        if new_step >= self._steps_per_pass:
            if saved_ws == self._world_size:
                raise ValueError(
                    f"loader state step {step} is out of range for {self._steps_per_pass} "
                    f"steps per pass"
                )
            # The rest of this pass is the new world size's remainder.
            epoch, new_step = epoch + 1, 0
        self._epoch = epoch
        self._step = new_step

    def _check_same_data(self, state: dict) -> None:
        """Raise ValueError listing every field where state differs from self."""
        current = self.state_dict()
        diffs = []
        for key in ("split", "batch_size", "seq_len", "seed", "shuffle"):
            if state[key] != current[key]:
                diffs.append(f"{key}: saved {state[key]!r}, current {current[key]!r}")
        saved_shards = [list(s) for s in state["shards"]]
        if saved_shards != current["shards"]:
            diffs.append(f"shards: {_describe_shard_diff(saved_shards, current['shards'])}")
        if diffs:
            raise ValueError("loader state does not match this loader: " + "; ".join(diffs))


def _describe_shard_diff(saved: list, current: list) -> str:
    """One-line summary of how two shard fingerprints differ."""
    if len(saved) != len(current):
        return f"saved {len(saved)} shards, current {len(current)}"
    for s, c in zip(saved, current):
        if s != c:
            return f"saved {s[0]} ({s[1]} tokens), current {c[0]} ({c[1]} tokens)"
    return "differ"
