"""What fineweb.py writes (gpt/data/prepare/writer.py): the shards, then metadata.json; a
kill between the two resumes to the same files, and a metadata.json that cannot be written
is one line."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_fineweb_killed_between_first_shard_and_metadata_resumes(tmp_path: Path, monkeypatch) -> None:
    from gpt.data.prepare import PrepareConfig, prepare
    from gpt.data.prepare import writer as prep_writer

    src = tmp_path / "in.txt"
    src.write_text(" ".join(f"word{i}" for i in range(3000)))
    cfg = dict(sources=(str(src),), val_tokens=100, shard_tokens=1000, progress=False, workers=1)
    reference = prepare(PrepareConfig(out_dir=str(tmp_path / "ref"), **cfg))

    real = prep_writer.write_shard

    def killed_after_writing(path, tokens):
        real(path, tokens)
        raise KeyboardInterrupt  # as a kill right after the first shard, before its metadata

    monkeypatch.setattr(prep_writer, "write_shard", killed_after_writing)
    with pytest.raises(KeyboardInterrupt):
        prepare(PrepareConfig(out_dir=str(tmp_path / "out"), **cfg))
    monkeypatch.setattr(prep_writer, "write_shard", real)
    again = prepare(PrepareConfig(out_dir=str(tmp_path / "out"), **cfg))  # the same command
    assert again.shards == reference.shards
    for entry in reference.shards:
        assert (tmp_path / "out" / entry["name"]).read_bytes() == (tmp_path / "ref" / entry["name"]).read_bytes()


def test_metadata_write_failure(tmp_path: Path, monkeypatch) -> None:
    from gpt.data.prepare import PrepareConfig, PrepareError, prepare
    from gpt.data.prepare import writer as prep_writer

    def full(path, obj):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prep_writer, "_write_json_atomic", full)
    src = tmp_path / "in.txt"
    src.write_text("hello world " * 300)
    with pytest.raises(PrepareError, match="metadata.json: cannot write it \\(No space left on device\\)"):
        prepare(PrepareConfig((str(src),), str(tmp_path / "o"), val_tokens=10, progress=False))
