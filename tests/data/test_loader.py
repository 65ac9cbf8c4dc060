"""Tests for gpt.data.loader: shard format, validation, discovery and the loader."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from gpt.data import shards
from gpt.data.loader import ShardLoader
from gpt.data.shards import (
    HEADER_BYTES,
    SHARD_MAGIC,
    SHARD_VERSION,
    DataError,
    ShardError,
    find_shards,
    read_shard,
    shard_num_tokens,
    write_shard,
)

B, T = 2, 3
BT = B * T


# --------------------------------------------------------------------------
# helpers


def make_stream(folder: Path, sizes: list[int], split: str = "train") -> np.ndarray:
    """Write shards of the given sizes holding arange(N); return the stream."""
    folder.mkdir(parents=True, exist_ok=True)
    stream = np.arange(sum(sizes), dtype=np.int64)
    assert stream.size < 65536  # values identify stream positions
    start = 0
    for i, n in enumerate(sizes):
        write_shard(folder / f"{split}_{i:06d}.bin", stream[start : start + n])
        start += n
    return stream


def patch_header(path: Path, slot: int, value: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[slot * 4 : slot * 4 + 4] = int(value).to_bytes(4, "little")
    path.write_bytes(bytes(raw))


def draw(loader: ShardLoader, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [loader.next_batch() for _ in range(n)]


def roundtrip_state(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    path = tmp_path / "train_000000.bin"
    write_shard(path, np.arange(10))
    return path


# --------------------------------------------------------------------------
# shard format


@pytest.mark.parametrize("n", [0, 1, 2, 1000, 70_000])
def test_roundtrip_sizes(tmp_path: Path, n: int) -> None:
    tokens = np.arange(n) % 65536
    if n >= 2:
        tokens[0], tokens[-1] = 0, 65535
    path = tmp_path / "s.bin"
    write_shard(path, tokens)
    got = read_shard(path)
    assert isinstance(got, np.memmap)
    assert not got.flags.writeable
    assert got.dtype == np.uint16
    np.testing.assert_array_equal(got, tokens)
    assert shard_num_tokens(path) == n
    assert path.stat().st_size == HEADER_BYTES + 2 * n


def test_roundtrip_from_list_and_generator(tmp_path: Path) -> None:
    write_shard(tmp_path / "a.bin", [5, 0, 65535])
    write_shard(tmp_path / "b.bin", (i for i in [7, 8]))
    assert read_shard(tmp_path / "a.bin").tolist() == [5, 0, 65535]
    assert read_shard(tmp_path / "b.bin").tolist() == [7, 8]


def test_header_fields(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    write_shard(path, np.arange(70_000) % 65536)
    header = np.fromfile(path, dtype="<i4", count=256)
    assert header[0] == SHARD_MAGIC == 0x47505432
    assert header[1] == SHARD_VERSION == 1
    assert header[2] == 70_000 and header[3] == 0
    assert header[4] == 1
    assert not header[5:].any()


def test_high_half_of_token_count_is_used(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    write_shard(path, [1, 2, 3])
    patch_header(path, 3, 1)  # claims 2**32 + 3 tokens
    expected = HEADER_BYTES + 2 * (2**32 + 3)
    with pytest.raises(ShardError, match=f"expected {expected} bytes"):
        shard_num_tokens(path)


def test_header_splits_64bit_count() -> None:
    header = shards._make_header(3 * 2**32 + 5, 1)
    assert (int(header[2]), int(header[3])) == (5, 3)


def test_write_rejects_out_of_range(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    with pytest.raises(ShardError, match="65536 at index 2"):
        write_shard(path, [0, 1, 65536])
    with pytest.raises(ShardError, match="-1 at index 0"):
        write_shard(path, np.array([-1, 3]))
    with pytest.raises(ShardError, match="integers"):
        write_shard(path, np.array([1.5]))
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


def test_write_to_missing_folder_is_clear(tmp_path: Path) -> None:
    path = tmp_path / "nope" / "s.bin"
    with pytest.raises(ShardError) as exc:
        write_shard(path, [1])
    assert str(exc.value).startswith(str(path))


def test_atomic_write_failed_replace_keeps_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.bin"
    write_shard(path, [1, 2, 3])

    def boom(*args: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(shards.os, "replace", boom)
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_shard(path, [9, 9, 9, 9])
    assert read_shard(path).tolist() == [1, 2, 3]
    assert [p.name for p in tmp_path.iterdir()] == ["s.bin"]


def test_atomic_write_failure_mid_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.bin"
    write_shard(path, [1, 2, 3])
    seen: list[bool] = []

    def failing_fsync(fd: int) -> None:
        seen.append(any(p.name.startswith(".") for p in tmp_path.iterdir()))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shards.os, "fsync", failing_fsync)
    with pytest.raises(ShardError, match="No space left"):
        write_shard(path, [9, 9])
    assert seen == [True]  # the temp file existed when the failure hit
    monkeypatch.undo()
    assert read_shard(path).tolist() == [1, 2, 3]
    assert [p.name for p in tmp_path.iterdir()] == ["s.bin"]


def test_atomic_write_generator_raises(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    write_shard(path, [1, 2, 3])

    def gen():
        yield 4
        raise KeyError("bad source")

    with pytest.raises(KeyError):
        write_shard(path, gen())
    assert read_shard(path).tolist() == [1, 2, 3]
    assert [p.name for p in tmp_path.iterdir()] == ["s.bin"]


# --------------------------------------------------------------------------
# shard validation


def assert_shard_error(path: Path, match: str, **kwargs: object) -> str:
    with pytest.raises(ShardError, match=match) as exc:
        read_shard(path, **kwargs)
    msg = str(exc.value)
    assert msg.startswith(str(path))
    assert "\n" not in msg
    return msg


def test_missing_file(tmp_path: Path) -> None:
    assert_shard_error(tmp_path / "nope.bin", "not found")
    with pytest.raises(ShardError, match="not found"):
        shard_num_tokens(tmp_path / "nope.bin")


def test_truncated_header(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    path.write_bytes(np.array([SHARD_MAGIC, 1], dtype="<u4").tobytes() + b"\0" * 92)
    assert_shard_error(path, "truncated header")


def test_a_short_file_that_is_not_a_shard_is_not_called_truncated(tmp_path: Path) -> None:
    """train_gpt2.py in the folder --data-dir names (the current one, for '.') is named
    like a shard: what it is, and the flag to look at, not "truncated"."""
    path = tmp_path / "train_gpt2.py"
    path.write_text("import sys\n")
    msg = assert_shard_error(path, r"not a shard \(a file of 11 bytes that starts with neither")
    assert "is --data-dir the folder of the shards?" in msg and "truncated" not in msg


def test_wrong_magic(shard: Path) -> None:
    patch_header(shard, 0, 12345678)  # neither ours nor llm.c's (20240520), which is read now
    msg = assert_shard_error(shard, "bad magic")
    assert "0x47505432" in msg and "0x00bc614e" in msg
    assert "not a gpt2-trainer shard" in msg and "fineweb.py" in msg


def test_unknown_version(shard: Path) -> None:
    patch_header(shard, 1, 7)
    assert_shard_error(shard, "unknown shard version 7")


def test_unknown_dtype_code(shard: Path) -> None:
    patch_header(shard, 4, 9)
    assert_shard_error(shard, "unknown token dtype code 9")


def test_truncated_data(shard: Path) -> None:
    shard.write_bytes(shard.read_bytes()[:-3])
    msg = assert_shard_error(shard, "truncated data")
    assert f"expected {HEADER_BYTES + 20} bytes" in msg and f"has {HEADER_BYTES + 17}" in msg
    with pytest.raises(ShardError, match="truncated data"):
        shard_num_tokens(shard)


def test_trailing_bytes(shard: Path) -> None:
    shard.write_bytes(shard.read_bytes() + b"\0\0")
    assert_shard_error(shard, "2 trailing bytes")


def test_token_out_of_vocab(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    tokens = np.zeros(50, dtype=np.int64)
    tokens[37], tokens[40] = 50257, 60000
    write_shard(path, tokens)
    msg = assert_shard_error(path, "token id 50257 at index 37", vocab_size=50257)
    assert "--vocab-size 50257" in msg and "raise --vocab-size" in msg  # the flag to change
    assert read_shard(path, vocab_size=60001).size == 50


def test_vocab_scan_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shards, "_SCAN_CHUNK", 7)
    path = tmp_path / "s.bin"
    tokens = np.zeros(30, dtype=np.int64)
    tokens[23] = 100
    write_shard(path, tokens)
    assert_shard_error(path, "token id 100 at index 23", vocab_size=100)


# --------------------------------------------------------------------------
# finding shards


def test_find_shards_sorted_and_filtered(tmp_path: Path) -> None:
    for name in ["train_000002.bin", "train_000000.bin", "val_000000.bin", "train_000001.dat"]:
        write_shard(tmp_path / name, [1])
    (tmp_path / ".train_000003.bin.tmp-123").write_bytes(b"x")
    (tmp_path / "train_dir").mkdir()
    names = [p.name for p in find_shards(tmp_path, "train")]
    assert names == ["train_000000.bin", "train_000001.dat", "train_000002.bin"]
    assert [p.name for p in find_shards(tmp_path, "val")] == ["val_000000.bin"]


def test_find_shards_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist") as exc:
        find_shards(tmp_path / "nope", "train")
    assert str(tmp_path / "nope") in str(exc.value)


def test_find_shards_not_a_dir(shard: Path) -> None:
    with pytest.raises(DataError, match="not a directory"):
        find_shards(shard, "train")


def test_find_shards_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no train_\\* shards.*fineweb.py"):
        find_shards(tmp_path, "train")


def test_find_shards_lists_what_is_there(tmp_path: Path) -> None:
    write_shard(tmp_path / "val_000000.bin", [1])
    with pytest.raises(DataError, match=r"found only val_\*"):
        find_shards(tmp_path, "train")


def test_find_shards_bad_split(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="split"):
        find_shards(tmp_path, "test")


# --------------------------------------------------------------------------
# loader: coverage


UNEVEN = [37, 5, 0, 61, 23, 50]  # N = 176, N-1 not a multiple of BT*W for W in 1..4
EXACT = [20, 0, 31, 22]  # N = 73, N-1 = 72 is a multiple of BT*W for W in 1..4


@pytest.mark.parametrize("sizes", [UNEVEN, EXACT], ids=["uneven", "exact"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_all_ranks_cover_stream_once(tmp_path: Path, sizes: list[int], world_size: int) -> None:
    stream = make_stream(tmp_path, sizes)
    n = stream.size
    loaders = [ShardLoader(tmp_path, "train", B, T, rank=r, world_size=world_size)
               for r in range(world_size)]
    steps = loaders[0].steps_per_pass
    assert steps == (n - 1) // (BT * world_size)
    assert all(ld.steps_per_pass == steps for ld in loaders)
    assert loaders[0].num_tokens == n
    assert loaders[0].tokens_per_pass == steps * BT * world_size

    boundaries = set(np.cumsum(sizes)[:-1].tolist())
    served: list[np.ndarray] = []
    crossed = False
    for s in range(steps):
        for r, ld in enumerate(loaders):
            x, y = ld.next_batch()
            assert x.dtype == y.dtype == torch.int64
            assert x.shape == y.shape == (B, T)
            g = s * world_size + r
            start = g * BT
            np.testing.assert_array_equal(x.numpy().ravel(), stream[start : start + BT])
            np.testing.assert_array_equal(y.numpy().ravel(), stream[start + 1 : start + BT + 1])
            crossed |= any(start < b < start + BT + 1 for b in boundaries)
            served.append(x.numpy().ravel())
    assert crossed  # some window spanned a shard boundary

    flat = np.concatenate(served)
    assert len(np.unique(flat)) == flat.size  # no overlap between ranks or steps
    # Served inputs are an exact prefix of the stream; the remainder is < one global batch.
    np.testing.assert_array_equal(np.sort(flat), stream[: flat.size])
    remainder = (n - 1) - flat.size
    assert 0 <= remainder < BT * world_size
    if sizes is EXACT:
        assert remainder == 0  # every token but the last was an input


def test_pass_wraps_to_next_epoch(tmp_path: Path) -> None:
    stream = make_stream(tmp_path, UNEVEN)
    ld = ShardLoader(tmp_path, "train", B, T)
    first = draw(ld, ld.steps_per_pass)
    assert (ld.epoch, ld.step) == (1, 0)
    second = draw(ld, ld.steps_per_pass)
    for (x1, y1), (x2, y2) in zip(first, second):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    np.testing.assert_array_equal(second[0][0].numpy().ravel(), stream[:BT])


def test_reset(tmp_path: Path) -> None:
    make_stream(tmp_path, UNEVEN)
    ld = ShardLoader(tmp_path, "train", B, T, shuffle=True)
    x0, _ = ld.next_batch()
    draw(ld, ld.steps_per_pass + 3)
    ld.reset()
    assert (ld.epoch, ld.step) == (0, 0)
    assert torch.equal(ld.next_batch()[0], x0)


SHUFFLE_SIZES = [11, 17, 9, 23, 14, 8, 19, 12]  # 8 shards, N = 113


def shard_runs(tokens: np.ndarray, starts: np.ndarray) -> list[tuple[int, int]]:
    """Split stream values into [lo, hi) runs of consecutive values within one shard."""
    cuts = np.flatnonzero((np.diff(tokens) != 1) | np.isin(tokens[1:], starts)) + 1
    return [(int(r[0]), int(r[-1]) + 1) for r in np.split(tokens, cuts)]


def pass_stream(ld: ShardLoader) -> np.ndarray:
    """Draw one pass (world_size 1) and return the stream segment it served."""
    batches = draw(ld, ld.steps_per_pass)
    xs = np.concatenate([x.numpy().ravel() for x, _ in batches])
    seg = np.append(xs, batches[-1][1].numpy().ravel()[-1])
    for g, (x, y) in enumerate(batches):  # y is x shifted by one stream position
        np.testing.assert_array_equal(y.numpy().ravel(), seg[g * BT + 1 : g * BT + BT + 1])
    return seg


def test_shuffle_deterministic_and_covering(tmp_path: Path) -> None:
    make_stream(tmp_path, SHUFFLE_SIZES)
    starts = np.concatenate([[0], np.cumsum(SHUFFLE_SIZES)])
    whole = {(int(a), int(b)) for a, b in zip(starts, starts[1:])}

    a = ShardLoader(tmp_path, "train", B, T, seed=1, shuffle=True)
    b = ShardLoader(tmp_path, "train", B, T, seed=1, shuffle=True)
    c = ShardLoader(tmp_path, "train", B, T, seed=2, shuffle=True)
    passes = []
    for epoch in range(2):
        seg_a, seg_b, seg_c = pass_stream(a), pass_stream(b), pass_stream(c)
        np.testing.assert_array_equal(seg_a, seg_b)
        assert not np.array_equal(seg_a, seg_c)
        for seg in (seg_a, seg_c):
            assert len(np.unique(seg)) == seg.size
            assert seg.size == a.tokens_per_pass + 1
            runs = shard_runs(seg, starts)
            # Whole shards in some order, then a prefix of one more shard.
            assert all(r in whole for r in runs[:-1])
            assert any(r[0] == runs[-1][0] and runs[-1][1] <= r[1] for r in whole)
        passes.append(seg_a)
    assert not np.array_equal(passes[0], passes[1])  # a new order each pass
    plain = ShardLoader(tmp_path, "train", B, T)
    assert not np.array_equal(pass_stream(plain), passes[0])


# --------------------------------------------------------------------------
# loader: state


def assert_same_batches(a: ShardLoader, b: ShardLoader, n: int) -> None:
    for _ in range(n):
        (xa, ya), (xb, yb) = a.next_batch(), b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("k", [0, 3, 28])
def test_state_roundtrip(tmp_path: Path, shuffle: bool, k: int) -> None:
    make_stream(tmp_path, UNEVEN)
    kw = dict(rank=1, world_size=2, seed=5, shuffle=shuffle)
    a = ShardLoader(tmp_path, "train", B, T, **kw)
    assert a.steps_per_pass == 14
    draw(a, k)
    state = roundtrip_state(a.state_dict())
    assert state["shards"] == [[f"train_{i:06d}.bin", n] for i, n in enumerate(UNEVEN)]
    b = ShardLoader(tmp_path, "train", B, T, **kw)
    b.load_state_dict(state)
    assert (b.epoch, b.step) == (a.epoch, a.step)
    assert_same_batches(a, b, 2 * a.steps_per_pass)  # crosses a pass boundary


def test_state_mismatch_lists_fields(tmp_path: Path) -> None:
    make_stream(tmp_path / "d1", UNEVEN)
    make_stream(tmp_path / "d2", UNEVEN[:-1] + [51])
    state = ShardLoader(tmp_path / "d1", "train", B, T).state_dict()
    other = ShardLoader(tmp_path / "d2", "train", B + 1, T, seed=3)
    with pytest.raises(ValueError) as exc:
        other.load_state_dict(state)
    msg = str(exc.value)
    assert "batch_size: saved 2, current 3" in msg
    assert "seed: saved 0, current 3" in msg
    assert "shards:" in msg and "train_000005.bin (50 tokens)" in msg
    assert "seq_len" not in msg


def test_state_missing_fields(tmp_path: Path) -> None:
    make_stream(tmp_path, UNEVEN)
    ld = ShardLoader(tmp_path, "train", B, T)
    with pytest.raises(ValueError, match="missing fields: step"):
        state = ld.state_dict()
        del state["step"]
        ld.load_state_dict(state)


def test_world_size_change_divisible(tmp_path: Path) -> None:
    make_stream(tmp_path, SHUFFLE_SIZES)  # N = 113: 18 windows of BT for W=1
    kw = dict(seed=4, shuffle=True)
    old = ShardLoader(tmp_path, "train", B, T, rank=1, world_size=2, **kw)
    draw(old, 3)  # 6 global windows consumed
    state = roundtrip_state(old.state_dict())
    ref = ShardLoader(tmp_path, "train", B, T, **kw)
    draw(ref, 6)
    expected = draw(ref, 6)  # windows 6..11
    new = [ShardLoader(tmp_path, "train", B, T, rank=r, world_size=3, **kw) for r in range(3)]
    for ld in new:
        ld.load_state_dict(state)
        assert ld.step == 2
    got = [ld.next_batch() for ld in new] + [ld.next_batch() for ld in new]
    for (xg, yg), (xe, ye) in zip(got, expected):
        assert torch.equal(xg, xe) and torch.equal(yg, ye)


def test_world_size_change_at_end_of_pass_moves_on(tmp_path: Path) -> None:
    make_stream(tmp_path, EXACT)  # 12 windows; W=1: 12 steps, W=4: 3 steps
    old = ShardLoader(tmp_path, "train", B, T)
    draw(old, 11)
    state = old.state_dict()
    state["step"] = 11
    new = ShardLoader(tmp_path, "train", B, T, world_size=4, rank=0)
    with pytest.raises(ValueError, match="11 windows"):
        new.load_state_dict(state)
    state["step"], state["world_size"], state["epoch"] = 4, 3, 0  # 12 consumed of 12
    new.load_state_dict(state)
    assert (new.epoch, new.step) == (1, 0)


def test_world_size_change_not_divisible(tmp_path: Path) -> None:
    make_stream(tmp_path, UNEVEN)
    old = ShardLoader(tmp_path, "train", B, T, world_size=2)
    draw(old, 1)  # 2 global windows consumed
    new = ShardLoader(tmp_path, "train", B, T, world_size=4)
    with pytest.raises(ValueError, match="world_size 4.*consumed 2 windows.*not divisible by 4"):
        new.load_state_dict(old.state_dict())


# --------------------------------------------------------------------------
# loader: errors


def test_too_little_data(tmp_path: Path) -> None:
    make_stream(tmp_path, [3, 3])
    with pytest.raises(DataError) as exc:
        ShardLoader(tmp_path, "train", B, T)
    msg = str(exc.value)
    assert str(tmp_path) in msg and "'train'" in msg and "6 tokens" in msg and "= 7" in msg
    ShardLoader(tmp_path, "train", 1, 5)  # 6 tokens are exactly enough for 5+1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(batch_size=0), "batch_size must be >= 1"),
        (dict(seq_len=0), "seq_len must be >= 1"),
        (dict(batch_size=2.5), "batch_size must be an integer"),
        (dict(world_size=0), "world_size must be >= 1"),
        (dict(rank=-1), "rank must be >= 0"),
        (dict(rank=2, world_size=2), "rank must be < world_size"),
        (dict(split="test"), "split must be one of"),
        (dict(seed=-1), "seed must be >= 0"),
        (dict(device="nonsense"), "not a valid torch device"),
    ],
)
def test_bad_constructor_args(tmp_path: Path, kwargs: dict, match: str) -> None:
    make_stream(tmp_path, UNEVEN)
    args = dict(folder=tmp_path, split="train", batch_size=B, seq_len=T) | kwargs
    with pytest.raises(ValueError, match=match):
        ShardLoader(**args)


def test_vocab_checked_at_construction(tmp_path: Path) -> None:
    make_stream(tmp_path, UNEVEN)  # max token 175
    ShardLoader(tmp_path, "train", B, T, vocab_size=176)
    with pytest.raises(ShardError, match="train_000005.bin: token id 150 at index 24"):
        ShardLoader(tmp_path, "train", B, T, vocab_size=150)


def test_corrupt_shard_found_at_construction(tmp_path: Path) -> None:
    make_stream(tmp_path, UNEVEN)
    bad = tmp_path / "train_000003.bin"
    bad.write_bytes(bad.read_bytes()[:-1])
    with pytest.raises(ShardError, match="train_000003.bin: truncated data"):
        ShardLoader(tmp_path, "train", B, T)


def test_state_is_plain_python(tmp_path: Path) -> None:
    make_stream(tmp_path, UNEVEN)
    state = ShardLoader(tmp_path, "train", B, T, shuffle=True).state_dict()

    def plain(v: object) -> bool:
        if isinstance(v, list):
            return all(plain(i) for i in v)
        return type(v) in (int, str, bool)

    assert all(plain(v) for v in state.values())
    assert roundtrip_state(state) == state
    assert os.fspath(tmp_path) not in repr(state)  # names only, no machine paths


# --------------------------------------------------------------------------
# other trainers' shards: llm.c's .bin and build-nanogpt's .npy, read as they are


def write_llmc(path: Path, tokens: np.ndarray, version: int = 1) -> Path:
    """llm.c's format (dev/data/data_common.py): 256 int32 slots, then the tokens."""
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = 20240520, version, tokens.size
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2" if version == 1 else "<u4").tobytes())
    return path


def test_llmc_and_npy_shards_give_the_same_batches_as_ours(tmp_path: Path) -> None:
    stream = np.random.default_rng(0).integers(0, 50257, 9_001).astype(np.uint16)
    ours, llmc, npy = (tmp_path / n for n in ("ours", "llmc", "npy"))
    for d in (ours, llmc, npy):
        d.mkdir()
    write_shard(ours / "train_000000.bin", stream[:4000])
    write_shard(ours / "train_000001.bin", stream[4000:])
    write_llmc(llmc / "fineweb_train_000001.bin", stream[:4000])
    write_llmc(llmc / "fineweb_train_000002.bin", stream[4000:], version=2)
    write_llmc(llmc / "fineweb_val_000000.bin", stream[:500])
    np.save(npy / "edufineweb_train_000000.npy", stream[:4000])
    np.save(npy / "edufineweb_train_000001.npy", stream[4000:])
    assert [p.name for p in find_shards(llmc, "val")] == ["fineweb_val_000000.bin"]
    single = tmp_path / "single"  # llm.c's one-file datasets: tiny_shakespeare_train.bin
    single.mkdir()
    write_llmc(single / "tiny_shakespeare_train.bin", stream)
    write_llmc(single / "tiny_shakespeare_val.bin", stream[:500])
    assert [p.name for p in find_shards(single, "val")] == ["tiny_shakespeare_val.bin"]
    loaders = [ShardLoader(d, "train", 2, 16) for d in (ours, llmc, npy, single)]
    assert [ld.num_tokens for ld in loaders] == [9_001] * 4
    loaders.pop()
    assert [ld.num_tokens for ld in loaders] == [9_001] * 3
    for _ in range(loaders[0].steps_per_pass + 3):  # past a pass: the same stream in each
        (x0, y0), (x1, y1), (x2, y2) = (ld.next_batch() for ld in loaders)
        assert torch.equal(x0, x1) and torch.equal(x0, x2) and torch.equal(y0, y2)


@pytest.mark.parametrize("damage,words", [
    ("version", "llm.c shard of unknown version 9"),
    ("truncate", "truncated data: header says 100 tokens"),
    ("trailing", "2 trailing bytes"),
])
def test_llmc_shards_are_validated(tmp_path: Path, damage: str, words: str) -> None:
    path = write_llmc(tmp_path / "fineweb_train_000001.bin", np.arange(100))
    data = bytearray(path.read_bytes())
    if damage == "version":
        data[4:8] = np.array([9], dtype="<i4").tobytes()
    elif damage == "truncate":
        data = data[:-10]
    else:
        data += b"xx"
    path.write_bytes(bytes(data))
    assert_shard_error(path, words)


@pytest.mark.parametrize("array,words", [
    (np.zeros((4, 4), dtype=np.uint16), "one 1-D array"),
    (np.zeros(10, dtype=np.float32), "one 1-D array"),
])
def test_npy_shards_are_validated(tmp_path: Path, array: np.ndarray, words: str) -> None:
    path = tmp_path / "edufineweb_train_000000.npy"
    np.save(path, array)
    assert_shard_error(path, words)
    np.save(path, np.arange(50, dtype=np.uint16))
    path.write_bytes(path.read_bytes()[:-6])
    assert_shard_error(path, "truncated data")
