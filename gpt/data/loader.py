"""A distributed, resumable loader over a split's token shards (format: gpt/data/shards.py).

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
from pathlib import Path

import numpy as np
import torch

from gpt.data.shards import (DataError, Shard, check_split, check_token_range, find_shards,
                             read_shard, shard_num_tokens)


STATE_VERSION = 1


def _check_int(name: str, value: object, minimum: int) -> int:
    """Return value if it is an int >= minimum, else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_loader_state(state: object) -> None:
    """Raise ValueError unless `state` has the fields and types ShardLoader.state_dict
    writes (whether it fits this run's data is load_state_dict's question)."""
    if not isinstance(state, dict):
        raise ValueError(f"loader state is a {type(state).__name__}, not a dict")
    required = ("version", "split", "batch_size", "seq_len", "world_size", "seed",
                "shuffle", "epoch", "step", "shards")
    missing = [k for k in required if k not in state]
    if missing:
        raise ValueError(f"loader state is missing fields: {', '.join(missing)}")
    if state["version"] != STATE_VERSION:
        raise ValueError(
            f"loader state has version {state['version']!r}, this code reads {STATE_VERSION}"
        )
    for name, minimum in (("batch_size", 1), ("seq_len", 1), ("world_size", 1), ("seed", 0),
                          ("epoch", 0), ("step", 0)):
        _check_int(f"saved {name}", state[name], minimum)
    if not isinstance(state["split"], str) or not isinstance(state["shuffle"], bool):
        raise ValueError("loader state's split must be a string and shuffle a bool")
    shards = state["shards"]
    if not isinstance(shards, (list, tuple)) or not all(
            isinstance(s, (list, tuple)) and len(s) == 2 and isinstance(s[0], str) for s in shards):
        raise ValueError("loader state's shards must be a list of [file name, token count]")


def windows_passed(state: dict) -> int:
    """At most how many windows (batches of batch_size x seq_len tokens) all ranks together
    can have drawn to reach a saved position (a state check_loader_state accepts): every
    earlier pass holds at most (N - 1) // (B*T) windows, whatever the world size was then,
    and the current one step x world_size. Each optimizer step draws at least one window,
    so a run's step count can never exceed this."""
    tokens = sum(int(count) for _, count in state["shards"])
    per_pass = max(0, tokens - 1) // (state["batch_size"] * state["seq_len"])
    return state["epoch"] * per_pass + state["step"] * state["world_size"]


def steps_per_pass(folder: str | os.PathLike, split: str, num_tokens: int, batch_size: int,
                   seq_len: int, world_size: int) -> int:
    """Steps one pass over a split of num_tokens serves (see the module docstring), or a
    DataError if not even one: the loader's rule, which the dry run applies as well."""
    per_step = batch_size * seq_len * world_size
    steps = (num_tokens - 1) // per_step
    if steps <= 0:
        raise DataError(
            f"{folder}: split {split!r} has {num_tokens} tokens but one step needs "
            f"batch_size*seq_len*world_size+1 = {per_step + 1}; use a smaller "
            f"--batch-size/--seq-len or more data"
        )
    return steps


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
        check_split(split)
        self._B = _check_int("batch_size", batch_size, 1)
        self._T = _check_int("seq_len", seq_len, 1)
        self._world_size = _check_int("world_size", world_size, 1)
        self._rank = _check_int("rank", rank, 0)
        if self._rank >= self._world_size:
            raise ValueError(f"rank must be < world_size ({self._world_size}), got {rank}")
        self._seed = _check_int("seed", seed, 0)  # SeedSequence needs seed >= 0
        if vocab_size is not None:
            _check_int("vocab_size", vocab_size, 1)
        # Cheap per-batch check (B*T tokens, on the host) that catches an id out of the
        # vocabulary (negative ones always, those above max_token if given) with a clear
        # message instead of an index error deep inside the embedding.
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
        self._steps_per_pass = steps_per_pass(self._folder, split, self._num_tokens, self._B,
                                              self._T, self._world_size)
        self._open: dict[int, Shard] = {}  # shard index -> open shard, opened on first read
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

    def _read(self, shard: int, start: int, stop: int) -> np.ndarray:
        if shard not in self._open:
            self._open[shard] = Shard(self._paths[shard])
        return self._open[shard].read(start, stop)

    def _fill_window(self, window: int, out: np.ndarray) -> None:
        """Copy window's B*T+1 stream tokens into out (int64), piece by piece."""
        start = window * self._B * self._T
        end = start + out.size
        i = int(np.searchsorted(self._offsets, start, side="right")) - 1
        pos = start
        while pos < end:
            base = int(self._offsets[i])
            stop = min(end, int(self._offsets[i + 1]))
            # Only this slice of the shard is read, then widened to int64.
            shard = int(self._order[i])
            piece = self._read(shard, pos - base, stop - base)
            check_token_range(self._paths[shard], piece, pos - base,
                              None if self._max_token is None else self._max_token + 1)
            out[pos - start : stop - start] = piece
            pos = stop
            i += 1

    # ---- batches

    def position(self) -> tuple[int, int]:
        """(pass, step): where the next batch comes from; see seek()."""
        return self._epoch, self._step

    def seek(self, position: tuple[int, int]) -> None:
        """Go back to a position() taken earlier in this run (e.g. the start of an optimizer
        step that could not finish)."""
        self._epoch, self._step = position

    def reset(self) -> None:
        """Go back to pass 0, step 0."""
        self._epoch = 0
        self._step = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Next (x, y), int64 tensors of shape (B, T) on the loader's device."""
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
        check_loader_state(state)
        self._check_same_data(state)
        saved_ws, epoch, step = (int(state[k]) for k in ("world_size", "epoch", "step"))
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
