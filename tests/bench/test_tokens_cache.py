"""gpt/bench/tokens/cache.py: the tokens bench's run cache, its key and its lines. (The
bench reusing runs from it, and an interrupted bench, are in test_tokens_search.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpt.bench.tokens.cache import RunCache, data_fingerprint, origins, without_places
from gpt.core.errors import UserError
from helpers import write_random_shards


def test_the_key_leaves_out_the_out_dir_and_holds_the_data_fingerprint(tmp_path: Path) -> None:
    data = write_random_shards(tmp_path, seed=0, train=(1000,), val=(500,))
    fp = data_fingerprint(data)
    assert set(fp["shards"]) == {"train_000000.bin", "val_000000.bin"}
    (data / "metadata.json").write_text('{"created": "another day"}')
    assert data_fingerprint(data) == fp  # the same tokens prepared again: the same data
    raw = bytearray((data / "val_000000.bin").read_bytes())
    raw[-1] ^= 1  # one token changed, the size the same
    (data / "val_000000.bin").write_bytes(bytes(raw))
    assert data_fingerprint(data)["shards"]["val_000000.bin"] != fp["shards"]["val_000000.bin"]
    fp = data_fingerprint(data)
    (data / "notes.txt").write_text("not a shard")
    assert data_fingerprint(data)["shards"] == fp["shards"]
    flags = ["--a", "1", "--out-dir", "x", "--b", "--out-dir=y", "--data-dir", "d", "--data-dir=e"]
    assert without_places(flags) == ["--a", "1", "--b"]


def test_a_run_is_found_by_exactly_its_flags_and_data(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    cache = RunCache(path, {"shards": {"train_000000.bin": 10}})
    key = cache.key(["--seed", "1", "--out-dir", "/tmp/a"])
    cache.add(key, {"final_val_loss": 3.0})
    again = RunCache(path, {"shards": {"train_000000.bin": 10}})
    hit = again.get(again.key(["--seed", "1", "--out-dir", "/tmp/b"]))
    assert hit["run"] == {"final_val_loss": 3.0}
    assert again.get(again.key(["--seed", "2", "--out-dir", "/tmp/b"])) is None
    other_data = RunCache(path, {"shards": {"train_000000.bin": 12}})
    assert other_data.get(other_data.key(["--seed", "1"])) is None
    assert RunCache(path, again.data, reuse=False).get(key) is None
    # a key written twice (--no-reuse) reads as its last line
    again.add(key, {"final_val_loss": 2.5})
    assert RunCache(path, again.data).get(key)["run"] == {"final_val_loss": 2.5}


def test_lines_that_are_not_whole_runs_are_skipped_and_an_append_starts_a_new_line(
        tmp_path: Path, capsys) -> None:
    path = tmp_path / "runs.jsonl"
    cache = RunCache(path, {})
    cache.add(cache.key(["--seed", "1"]), {"x": 1})
    with open(path, "a") as fh:
        fh.write('{"no": "key"}\n{"format": 0, "key": {}, "run": {}}\n{"format": 1, "key": {"fl')
    cache = RunCache(path, {})
    err = capsys.readouterr().err
    assert all(f"{path} line {n}: skipped" in err for n in (2, 3, 4)) and "format 0" in err
    assert len(cache.lines) == 1
    cache.add(cache.key(["--seed", "2"]), {"x": 2})
    lines = path.read_text().splitlines()
    assert lines[3] == '{"format": 1, "key": {"fl' and json.loads(lines[4])["run"] == {"x": 2}
    assert len(RunCache(path, {}).lines) == 2


def test_an_unreadable_cache_is_a_one_line_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "runs.jsonl").mkdir()
    with pytest.raises(UserError, match="runs.jsonl: cannot read the run cache"):
        RunCache(tmp_path / "runs.jsonl", {})


def test_origins_are_the_distinct_commits_and_machines(tmp_path: Path) -> None:
    a = {"commit": "a", "commit_dirty": False, "torch": "2.5", "cpu": "x", "cpu_count": 2,
         "platform": "p"}
    runs = [{"origin": {**a, "time": "t1"}}, {"origin": {**a, "time": "t2"}},
            {"origin": {**a, "commit": "b", "time": "t3"}}]
    assert origins(runs) == [{**a, "runs": 2}, {**a, "commit": "b", "runs": 1}]


def test_runs_at_another_thread_count_are_not_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = {"shards": {"train_000000.bin": "ab"}}
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cache = RunCache(tmp_path / "runs.jsonl", data)
    cache.add(cache.key(["--seed", "1"]), {"final_val_loss": 3.0})
    assert RunCache(tmp_path / "runs.jsonl", data).get(cache.key(["--seed", "1"])) is not None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    again = RunCache(tmp_path / "runs.jsonl", data)
    assert again.get(again.key(["--seed", "1"])) is None


def test_a_line_written_with_its_data_folder_matches_the_same_data_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    data = {"shards": {"train_000000.bin": "ab"}}
    path = tmp_path / "runs.jsonl"
    old = {"flags": ["--seed", "1", "--data-dir", "/tmp/pydoc"], "data": data, "threads": None}
    path.write_text(json.dumps({"format": 1, "key": old, "run": {"final_val_loss": 3.0}}) + "\n")
    cache = RunCache(path, data)
    assert cache.get(cache.key(["--seed", "1", "--data-dir", "/elsewhere"]))["run"]["final_val_loss"] == 3.0
    assert cache.get(cache.key(["--seed", "2", "--data-dir", "/tmp/pydoc"])) is None
