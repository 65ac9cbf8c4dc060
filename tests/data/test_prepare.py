"""fineweb.py / gpt.data.prepare: exact round trips, determinism, shard sizes, resume, errors."""

from __future__ import annotations

import gzip
import io
import json
import random
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpt.core.fileio import LOCK_NAME
import gpt.data.prepare as prep
from gpt.data.prepare import cli as prep_cli
from gpt.data.prepare import config as prep_config
from gpt.data.prepare import encode as prep_encode
from gpt.data.prepare import sources as prep_sources
from gpt.data.prepare import PrepareConfig, PrepareError, parse_count, prepare, split_paragraphs, split_pieces
from gpt.data.shards import DataError, find_shards, read_shard, write_shard

from helpers import SHAKESPEARE

# --------------------------------------------------------------------------
# Helpers and fixtures (`enc`, the GPT-2 tokenizer, comes from conftest)


_WORDS = ["the", "quick", "brown", "fox", "Jumps", "over", "lazy", "dog's", "we'll", "naïve",
          "café", "日本語", "🙂", "<|endoftext|>", "123", "4.5", "--", "\n", "\n\n", "  ", "\t",
          "Hello,", "world!", "\r\n"]


def make_docs(n: int, seed: int = 0, max_words: int = 300) -> list[str]:
    """Varied documents: unicode, digits, runs of spaces and newlines, the literal EOT text."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, max_words))) for _ in range(n)]


def write_jsonl(path: Path, docs: list[Any], field: str = "text") -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"id": i, field: d}) + "\n")
    return path


def expected_stream(enc, docs: list[Any]) -> np.ndarray:
    """EOT + tokens of every non-empty document, in order."""
    out: list[int] = []
    for d in docs:
        if d:
            out.append(enc.eot_token)
            out.extend(enc.encode_ordinary(d))
    return np.asarray(out, dtype=np.uint16)


def read_stream(out: Path) -> np.ndarray:
    parts = [read_shard(p) for p in sorted(out.glob("val_*.bin"))]
    parts += [read_shard(p) for p in sorted(out.glob("train_*.bin"))]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint16)


def decode_docs(enc, stream: np.ndarray) -> list[str]:
    """Split a token stream at EOT ids (each document starts with one) and decode."""
    assert stream[0] == enc.eot_token
    cuts = np.flatnonzero(stream == enc.eot_token)
    return [enc.decode(stream[a + 1 : b].tolist()) for a, b in zip(cuts, list(cuts[1:]) + [stream.size])]


def run(src: Path | str | list, out: Path, **kw: Any) -> prep.PrepareResult:
    sources = tuple(str(s) for s in src) if isinstance(src, list) else (str(src),)
    kw.setdefault("progress", False)
    kw.setdefault("workers", 1)
    return prepare(PrepareConfig(sources=sources, out_dir=str(out), **kw))


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.bin"))}


def metadata(out: Path) -> dict[str, Any]:
    return json.loads((out / "metadata.json").read_text())


@pytest.fixture()
def small_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny pieces and tasks, so small inputs exercise many tasks and split documents."""
    monkeypatch.setattr(prep_config, "PIECE_CHARS", 2000)
    monkeypatch.setattr(prep_config, "TASK_CHARS", 5000)


# --------------------------------------------------------------------------
# Building blocks


def test_parse_count() -> None:
    assert parse_count("30000") == 30000
    assert parse_count("10_485_761") == 10_485_761
    assert parse_count("100M") == 100_000_000
    assert parse_count("1.5B") == 1_500_000_000
    assert parse_count("1e9") == 10**9
    assert parse_count("2k") == 2000
    for bad in ("abc", "1.5", "12x", ""):
        with pytest.raises(ValueError):
            parse_count(bad)


def test_encode_pieces_matches_encode_ordinary(enc) -> None:
    texts = ["hello <|endoftext|> world", "  spaces\n\n", "日本語 🙂"]
    tokens, lens = prep.encode_pieces(texts, [True, False, True])
    want = [enc.eot_token, *enc.encode_ordinary(texts[0]), *enc.encode_ordinary(texts[1]),
            enc.eot_token, *enc.encode_ordinary(texts[2])]
    assert tokens.dtype == np.uint16 and tokens.tolist() == want
    assert lens.tolist() == [1 + len(enc.encode_ordinary(texts[0])), len(enc.encode_ordinary(texts[1])),
                             1 + len(enc.encode_ordinary(texts[2]))]


def _chunked(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 3000)
        out.append(text[i : i + n])
        i += n
    return out


def test_pieces_encode_exactly_like_the_whole_text(enc) -> None:
    rng = random.Random(1)
    texts = ["\n".join(make_docs(40, seed=3)), "".join(rng.choice(_WORDS + ["a", "b", " "]) for _ in range(20000))]
    if SHAKESPEARE.is_file():
        texts.append(SHAKESPEARE.read_text(encoding="utf-8")[:300_000])
    for text in texts:
        whole = enc.encode_ordinary(text)
        for piece_chars in (50, 777, 5000):
            pieces = list(split_pieces(_chunked(text, rng), piece_chars))
            assert "".join(pieces) == text
            assert len(pieces) > 1
            assert [t for p in pieces for t in enc.encode_ordinary(p)] == whole
    # No safe cut at all (no spaces between ASCII letters, no line breaks): one piece.
    assert list(split_pieces(["x" * 5000, "y" * 5000], 100)) == ["x" * 5000 + "y" * 5000]
    assert list(split_pieces(["", ""], 100)) == []


def test_paragraphs_are_runs_of_non_blank_lines() -> None:
    text = "\n\nfirst para\nline two\n\n\n  \nsecond  \n \t\n  indented third\n\n" * 3 + "last"
    got = list(split_paragraphs(io.StringIO(text)))
    assert got == ["first para\nline two", "second  ", "  indented third"] * 3 + ["last"]
    assert list(split_paragraphs(io.StringIO(" \n\n"))) == []


# --------------------------------------------------------------------------
# Round trips


def test_jsonl_round_trip_gives_back_the_documents(tmp_path: Path, enc, small_layout) -> None:
    docs = make_docs(60) + ["", None] + make_docs(20, seed=5) + ["x" * 9000]  # empty/null skipped
    src = write_jsonl(tmp_path / "in.jsonl", docs)
    res = run(src, tmp_path / "out", val_tokens=500, shard_tokens=2000)
    stream = read_stream(tmp_path / "out")
    assert np.array_equal(stream, expected_stream(enc, docs))
    kept = [d for d in docs if d]
    assert decode_docs(enc, stream) == kept
    assert res.documents == len(kept) == metadata(tmp_path / "out")["totals"]["documents"]
    assert sum(s["documents"] for s in res.shards) == len(kept)


def test_shakespeare_txt_is_one_document(tmp_path: Path, shakespeare_tokens: np.ndarray) -> None:
    res = run(SHAKESPEARE, tmp_path / "out", val_tokens=30_000, shard_tokens=100_000, workers=2)
    assert np.array_equal(read_stream(tmp_path / "out"), shakespeare_tokens)
    assert res.documents == 1
    assert [s["tokens"] for s in res.shards] == [30_000, 100_000, 100_000, 100_000, len(shakespeare_tokens) - 330_000]


def test_every_local_format_folder_and_glob(tmp_path: Path, enc) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "in"
    (d / "sub").mkdir(parents=True)
    docs = make_docs(12, seed=7)
    (d / "a.txt").write_text(docs[0], encoding="utf-8")
    write_jsonl(d / "b.jsonl", docs[1:4])
    (d / "c.json").write_text(json.dumps([{"text": t} for t in docs[4:6]]), encoding="utf-8")
    pq.write_table(pa.table({"text": docs[6:9], "n": [1, 2, 3]}), d / "d.parquet", row_group_size=2)
    with gzip.open(d / "e.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps({"text": t}) + "\n" for t in docs[9:11]))
    (d / "sub" / "f.txt").write_text(docs[11], encoding="utf-8")
    (d / "notes.md").write_text("ignored: not an input type")
    (d / ".hidden.txt").write_text("ignored: hidden")
    run(d, tmp_path / "out", val_tokens=10, shard_tokens=500)
    # universal newlines: a .txt's \r\n reads as \n, as Python's open() gives it
    want = [docs[0].replace("\r\n", "\n").replace("\r", "\n")] + docs[1:11] + [docs[11].replace("\r\n", "\n").replace("\r", "\n")]
    assert decode_docs(enc, read_stream(tmp_path / "out")) == want

    # A glob over the jsonl files only; several --source values keep their order.
    run([d / "*.jsonl*", d / "a.txt"], tmp_path / "out2", val_tokens=10, shard_tokens=500)
    assert decode_docs(enc, read_stream(tmp_path / "out2")) == docs[1:4] + docs[9:11] + [want[0]]


def test_jsonl_details(tmp_path: Path, enc) -> None:
    # A byte-order mark, whitespace around objects, CRLF, bad UTF-8 (read as U+FFFD, as in
    # .txt files), blank lines and no final newline.
    data = (b'\xef\xbb\xbf{"text": "first"}\r\n  {"text": "second"}  \n\n'
            b'{"text": "bad \xff byte", "n": 1}\n{"text": "last"}')
    (tmp_path / "in.jsonl").write_bytes(data)
    run(tmp_path / "in.jsonl", tmp_path / "out", val_tokens=0, shard_tokens=100)
    assert decode_docs(enc, read_stream(tmp_path / "out")) == ["first", "second", "bad \ufffd byte", "last"]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_lone_surrogate_is_read_as_bad_utf8_is(tmp_path: Path, enc, workers: int) -> None:
    """JSON's \\ud800 escape gives a half of a UTF-16 pair, which UTF-8 cannot hold: read
    as U+FFFD, as a bad UTF-8 byte is, not a UnicodeEncodeError from the tokenizer; an
    escaped whole pair is its character. In a .jsonl file and a .json array alike."""
    lines = [r'{"text": "lone \ud800 surrogate"}', r'{"text": "a pair \ud83d\ude00 ok"}',
             r'{"text": "low \udc00 first"}', '{"text": "plain"}']
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "in.json").write_text("[" + ",".join(lines) + "]")
    want = ["lone \ufffd surrogate", "a pair \U0001F600 ok", "low \ufffd first", "plain"]
    for name in ("in.jsonl", "in.json"):
        out = tmp_path / f"out-{name}"
        run(tmp_path / name, out, val_tokens=0, shard_tokens=100, workers=workers)
        assert decode_docs(enc, read_stream(out)) == want


def test_txt_paragraph_mode(tmp_path: Path, enc) -> None:
    src = tmp_path / "in.txt"
    src.write_text("First doc\nline 2\n\n\nSecond doc\n   \nThird doc\n", encoding="utf-8")
    run(src, tmp_path / "out", val_tokens=0, shard_tokens=100, txt_split_on_blank_lines=True)
    assert decode_docs(enc, read_stream(tmp_path / "out")) == ["First doc\nline 2", "Second doc", "Third doc"]


def test_one_and_two_workers_write_identical_shards(tmp_path: Path, small_layout) -> None:
    docs = make_docs(400, seed=11) + ["long " * 3000]
    src = write_jsonl(tmp_path / "in.jsonl", docs)
    a = run(src, tmp_path / "w1", val_tokens=3000, shard_tokens=7000, workers=1)
    b = run(src, tmp_path / "w2", val_tokens=3000, shard_tokens=7000, workers=2)
    assert len(a.shards) > 5
    assert shard_bytes(tmp_path / "w1") == shard_bytes(tmp_path / "w2")
    assert a.shards == b.shards


@pytest.mark.parametrize(
    ("val", "shard", "max_tokens"),
    [(1000, 3000, None), (2500, 1000, None), (0, 4000, None), (1000, 3000, 8500), (5000, 3000, 7000)],
)
def test_val_and_train_sizes(tmp_path: Path, enc, val: int, shard: int, max_tokens: int | None) -> None:
    docs = make_docs(150, seed=2)
    total = expected_stream(enc, docs).size
    src = write_jsonl(tmp_path / "in.jsonl", docs)
    res = run(src, tmp_path / "out", val_tokens=val, shard_tokens=shard, max_tokens=max_tokens)
    n = total if max_tokens is None else max_tokens
    assert total > 12_000

    def sizes(count: int) -> list[int]:
        return [shard] * (count // shard) + ([count % shard] if count % shard else [])

    val_sizes = [s["tokens"] for s in res.shards if s["split"] == "val"]
    train_sizes = [s["tokens"] for s in res.shards if s["split"] == "train"]
    assert val_sizes == sizes(val)
    assert train_sizes == sizes(n - val)
    assert res.val_tokens == val and res.train_tokens == n - val
    out = tmp_path / "out"
    assert [p.name for p in find_shards(out, "train")] == [f"train_{i:06d}.bin" for i in range(len(train_sizes))]
    if val:
        assert [p.name for p in find_shards(out, "val")] == [f"val_{i:06d}.bin" for i in range(len(val_sizes))]
    else:
        assert not list(out.glob("val_*"))
    assert np.array_equal(read_stream(out), expected_stream(enc, docs)[:n])
    meta = metadata(out)
    assert meta["complete"] and meta["totals"]["tokens"] == n
    assert meta["totals"]["val_tokens"] == val and meta["tokenizer"]["eot_token"] == enc.eot_token


# --------------------------------------------------------------------------
# Resume


class Interrupt(Exception):
    pass


def _stop_after(n: int, exc: type[BaseException] = Interrupt):
    seen = []

    def hook(entry: dict) -> None:
        seen.append(entry)
        if len(seen) == n:
            raise exc("simulated crash")

    return hook


@pytest.mark.slow
@pytest.mark.parametrize(("stop_after", "workers"), [(1, 1), (3, 2), (6, 1)])
def test_interrupted_run_resumes_byte_identical(tmp_path: Path, small_layout, stop_after: int, workers: int) -> None:
    docs = make_docs(200, seed=4) + ["long " * 2000] + make_docs(50, seed=8)
    src = write_jsonl(tmp_path / "in.jsonl", docs)
    kw = dict(val_tokens=2500, shard_tokens=3000)
    ref = run(src, tmp_path / "ref", **kw)
    out = tmp_path / "out"
    with pytest.raises(Interrupt):
        prepare(PrepareConfig((str(src),), str(out), workers=workers, progress=False, **kw),
                on_shard=_stop_after(stop_after))
    assert len(list(out.glob("*.bin"))) == stop_after
    assert not metadata(out)["complete"]
    # Count what the resumed run tokenizes: the finished part is skipped, not re-encoded.
    encoded_chars = []
    real = prep.encode_pieces

    def counting(texts, starts):
        encoded_chars.append(sum(map(len, texts)))
        return real(texts, starts)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(prep, "encode_pieces", counting)
        res = run(src, out, **kw)
    assert res.kept_shards == stop_after
    assert shard_bytes(out) == shard_bytes(tmp_path / "ref")
    assert res.shards == ref.shards and metadata(out)["complete"]
    total_chars = sum(len(d) for d in docs)
    assert sum(encoded_chars) < total_chars * (1 - stop_after / (2 * len(ref.shards)))


@pytest.mark.slow
def test_resume_from_every_shard_boundary(tmp_path: Path, small_layout) -> None:
    # Mixed sources; long documents split into pieces, so shards end inside pieces > 0, in
    # worker-parsed JSON lines, main-process txt and JSON arrays alike.
    d = tmp_path / "in"
    d.mkdir()
    lines = [json.dumps({"text": t}) for t in make_docs(30, seed=14)]
    lines[3:3] = ["", "  ", json.dumps({"text": None}), json.dumps({"text": "word " * 2500})]
    (d / "a.jsonl").write_text("\r\n".join(lines))  # CRLF, no final newline
    (d / "b.txt").write_text("\n".join(make_docs(12, seed=15)), encoding="utf-8")
    (d / "c.json").write_text(json.dumps([{"text": t} for t in ["line\n" * 1500, "short", ""]]))
    kw = dict(val_tokens=700, shard_tokens=900)
    ref = run(d, tmp_path / "ref", **kw)
    assert len(ref.shards) > 12 and any(s["next"]["piece"] > 0 for s in ref.shards)
    want = shard_bytes(tmp_path / "ref")
    for k in range(1, len(ref.shards)):
        out = tmp_path / f"out{k}"
        with pytest.raises(Interrupt):
            prepare(PrepareConfig((str(d),), str(out), workers=1, progress=False, **kw),
                    on_shard=_stop_after(k))
        res = run(d, out, **kw)
        assert res.kept_shards == k
        assert shard_bytes(out) == want, k
        assert res.shards == ref.shards


def test_line_blocks_cover_every_line_once() -> None:
    rng = random.Random(3)
    lines = [rng.choice([b"", b"  ", b"x" * rng.randint(1, 300), b'{"a": 1}\r']) for _ in range(299)]
    lines.append(b"last")  # a file ending in a newline has no empty line after it
    for tail in (b"\n", b""):
        data = b"\n".join(lines) + tail
        for block in (1, 7, 64, 1000, 10**6):
            for skip in (0, 1, 5, 150, 299, 300):
                items = list(prep_sources.json_line_blocks(io.BytesIO(data), skip, block))
                skipped = sum(i.n for i in items if isinstance(i, prep_sources.SkippedRecords))
                blocks = [i for i in items if isinstance(i, prep_sources.JsonLinesBlock)]
                assert skipped == skip
                got = [ln for b in blocks for ln in b.data.split(b"\n")[: b.lines]]
                assert got == lines[skip:]
                assert sum(b.lines for b in blocks) == len(lines) - skip
                lineno = skip + 1
                for b in blocks:
                    assert b.first_lineno == lineno
                    lineno += b.lines


def test_crash_between_shard_and_metadata_and_damaged_shard(tmp_path: Path, small_layout) -> None:
    docs = make_docs(200, seed=9)
    src = write_jsonl(tmp_path / "in.jsonl", docs)
    kw = dict(val_tokens=1000, shard_tokens=4000)
    ref = run(src, tmp_path / "ref", **kw)
    out = tmp_path / "out"
    run(src, out, **kw)
    # The last two shards are on disk but not recorded (a crash before the metadata write),
    # and shard 2 lost its tail (only possible outside this tool; it must be redone).
    meta = metadata(out)
    meta["shards"] = meta["shards"][:-2]
    meta["complete"] = False
    (out / "metadata.json").write_text(json.dumps(meta))
    damaged = out / meta["shards"][2]["name"]
    damaged.write_bytes(damaged.read_bytes()[:-10])
    res = run(src, out, **kw)
    assert res.kept_shards == 2
    assert shard_bytes(out) == shard_bytes(tmp_path / "ref")
    assert res.shards == ref.shards


def test_complete_run_is_not_redone_and_overwrite_redoes_it(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(50))
    out = tmp_path / "out"
    first = run(src, out, val_tokens=100, shard_tokens=1000)
    # Every file but the lock, which each run takes (and stamps with its pid) anew.
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != LOCK_NAME}
    again = run(src, out, val_tokens=100, shard_tokens=1000)
    assert again.kept_shards == len(first.shards) and again.shards == first.shards
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != LOCK_NAME} == stamps
    # --overwrite with other settings: old shards (more of them) are all gone.
    res = run(src, out, val_tokens=100, shard_tokens=5000, overwrite=True)
    assert sorted(p.name for p in out.glob("*.bin")) == sorted(s["name"] for s in res.shards)
    assert len(res.shards) < len(first.shards)


def test_keyboard_interrupt_with_workers_then_resume(tmp_path: Path, small_layout) -> None:
    docs = make_docs(300, seed=12)
    src = write_jsonl(tmp_path / "in.jsonl", docs)
    kw = dict(val_tokens=500, shard_tokens=3000)
    run(src, tmp_path / "ref", **kw)
    with pytest.raises(KeyboardInterrupt):
        prepare(PrepareConfig((str(src),), str(tmp_path / "out"), workers=2, progress=False, **kw),
                on_shard=_stop_after(2, KeyboardInterrupt))
    run(src, tmp_path / "out", workers=2, **kw)
    assert shard_bytes(tmp_path / "out") == shard_bytes(tmp_path / "ref")


# --------------------------------------------------------------------------
# Errors: raised as PrepareError (a DataError) with a message naming what to fix


def test_missing_inputs(tmp_path: Path) -> None:
    assert issubclass(PrepareError, DataError)  # what the trainer and CLI catch
    with pytest.raises(PrepareError, match=r"nope\.jsonl: no such file"):
        run(tmp_path / "nope.jsonl", tmp_path / "out")
    with pytest.raises(PrepareError, match="no files match"):
        run(tmp_path / "*.jsonl", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PrepareError, match="folder holds no"):
        run(tmp_path / "empty", tmp_path / "out")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(PrepareError, match="unsupported file type"):
        run(tmp_path / "x.csv", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_text_field_lists_the_fields(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = write_jsonl(tmp_path / "in.jsonl", make_docs(3), field="content")
    with pytest.raises(PrepareError, match=r"in\.jsonl:1: no field 'text' \(fields there: id, content\).*--text-field"):
        run(src, tmp_path / "out")
    run(src, tmp_path / "ok", val_tokens=0, text_field="content")  # the right field works
    pq.write_table(pa.table({"body": ["a"], "id": [1]}), tmp_path / "in.parquet")
    with pytest.raises(PrepareError, match=r"no column 'text' \(columns: body, id\)"):
        run(tmp_path / "in.parquet", tmp_path / "out")
    with pytest.raises(PrepareError, match="holds int64, not text"):
        run(tmp_path / "in.parquet", tmp_path / "out", text_field="id")
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"text": 5}\n')
    with pytest.raises(PrepareError, match=r"bad\.jsonl:2: field 'text' holds int"):
        run(tmp_path / "bad.jsonl", tmp_path / "out")
    (tmp_path / "broken.jsonl").write_text('{"text": "a"}\n{"text": \n')
    with pytest.raises(PrepareError, match=r"broken\.jsonl:2: not valid JSON"):
        run(tmp_path / "broken.jsonl", tmp_path / "out")
    (tmp_path / "extra.jsonl").write_text('{"text": "a"}\n\n{"text": "b"} {"text": "c"}\n')
    with pytest.raises(PrepareError, match=r"extra\.jsonl:3: not valid JSON \(Extra data"):
        run(tmp_path / "extra.jsonl", tmp_path / "out")
    (tmp_path / "list.jsonl").write_text('["text", "a"]\n')
    with pytest.raises(PrepareError, match=r"list\.jsonl:1: a record must be an object with a 'text' field"):
        run(tmp_path / "list.jsonl", tmp_path / "out")


def test_input_with_no_text(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", ["", None, ""])
    with pytest.raises(PrepareError, match="no text found"):
        run(src, tmp_path / "out")
    (tmp_path / "e.txt").write_text("")
    with pytest.raises(PrepareError, match="no text found"):
        run(tmp_path / "e.txt", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_val_tokens_taking_everything(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", ["a short text"])
    with pytest.raises(PrepareError, match="lower --val-tokens"):
        run(src, tmp_path / "out", val_tokens=1000)
    with pytest.raises(PrepareError, match="--max-tokens 10 leaves nothing"):
        run(src, tmp_path / "out2", val_tokens=10, max_tokens=10)


@pytest.mark.parametrize("shard_tokens", [100_000, 300])  # one val shard, or several written
def test_a_refused_split_leaves_nothing_behind(tmp_path: Path, enc, shard_tokens: int) -> None:
    """--val-tokens that takes the whole input: refused in one line, and the folder is as
    it was (no metadata.json or val shard that would make the next try need --overwrite),
    even where val shards were already written; the next try runs as written."""
    docs = make_docs(20, seed=3)
    src = write_jsonl(tmp_path / "in.jsonl", docs)
    n = len(expected_stream(enc, docs))
    out = tmp_path / "out"
    with pytest.raises(PrepareError, match=rf"only {n:,} tokens and --val-tokens 100,000,000 "
                                           rf"would take them all.*leave it out"):
        run(src, out, val_tokens=100_000_000, shard_tokens=shard_tokens)
    assert not out.exists()
    (out / "keep").mkdir(parents=True)  # a folder of the user's stays, and stays theirs
    with pytest.raises(PrepareError, match="would take them all"):
        run(src, out, val_tokens=n, shard_tokens=shard_tokens)  # exactly all of it
    assert sorted(p.name for p in out.iterdir()) == ["keep"]
    res = run(src, out, shard_tokens=shard_tokens)  # no --overwrite needed
    assert res.train_tokens > 0


def test_without_val_tokens_a_small_input_gives_a_tenth_to_validation(
        tmp_path: Path, enc, capsys: pytest.CaptureFixture[str]) -> None:
    """Your own text of a few thousand tokens: the default's 10.5M would take it all; left
    out, --val-tokens is a tenth of the input, said in one line, the stream byte for byte
    as with that count given, and the same command again finds the folder complete."""
    docs = make_docs(40, seed=4)
    src = write_jsonl(tmp_path / "in.jsonl", docs)
    stream = expected_stream(enc, docs)
    n = len(stream)
    code = prep_cli.main(["--source", str(src), "--out", str(tmp_path / "auto"), "--workers", "1",
                          "--quiet", "--shard-tokens", "700"])
    assert code == 0
    err = capsys.readouterr().err
    assert err == (f"note: --val-tokens {n // 10:,}: a tenth of the input's {n:,} tokens (the "
                   f"default 10,485,761 is for inputs of 104,857,610 or more); --val-tokens N "
                   f"chooses\n")
    assert np.array_equal(read_stream(tmp_path / "auto"), stream)
    given = run(src, tmp_path / "given", val_tokens=n // 10, shard_tokens=700)
    assert shard_bytes(tmp_path / "auto") == shard_bytes(tmp_path / "given")
    meta, meta_given = metadata(tmp_path / "auto"), metadata(tmp_path / "given")
    assert meta["shards"] == meta_given["shards"]  # the same resume positions and documents
    assert meta["settings"]["val_tokens"] == n // 10 and given.val_tokens == n // 10
    again = run(src, tmp_path / "auto", shard_tokens=700)
    assert again.kept_shards == len(meta["shards"])  # complete: nothing redone


def test_a_split_left_to_the_run_resumes_byte_identical(tmp_path: Path, enc,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A large input (the default made 60 tokens here, so 600 tokens is 'large'): the
    default count exactly; killed after its first shards, the same command resumes to
    the bytes an unbroken run writes."""
    from gpt.data.prepare import writer as prep_writer

    monkeypatch.setattr(prep_writer, "DEFAULT_VAL_TOKENS", 60)
    docs = make_docs(40, seed=5)
    src = write_jsonl(tmp_path / "in.jsonl", docs)
    whole = run(src, tmp_path / "whole", shard_tokens=250)
    assert whole.val_tokens == 60 and whole.note is None
    calls = []

    def kill(entry: dict) -> None:
        calls.append(entry)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare(PrepareConfig(sources=(str(src),), out_dir=str(tmp_path / "cut"), shard_tokens=250,
                              workers=1, progress=False), on_shard=kill)
    resumed = run(src, tmp_path / "cut", shard_tokens=250)
    assert resumed.kept_shards == 3
    assert shard_bytes(tmp_path / "cut") == shard_bytes(tmp_path / "whole")
    assert np.array_equal(read_stream(tmp_path / "whole"), expected_stream(enc, docs))


def test_output_folder_with_other_shards_is_left_alone(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(30))
    out = tmp_path / "out"
    run(src, out, val_tokens=100, shard_tokens=1000)
    before = shard_bytes(out) | {"metadata.json": (out / "metadata.json").read_bytes()}

    def unchanged() -> None:
        assert shard_bytes(out) | {"metadata.json": (out / "metadata.json").read_bytes()} == before

    with pytest.raises(PrepareError, match=r"other settings \(shard_tokens: 1000 there, 2000 now\).*--overwrite"):
        run(src, out, val_tokens=100, shard_tokens=2000)
    unchanged()
    meta = metadata(out)
    meta["settings"]["tokenizer"] = "tiktoken/cl100k_base"
    (out / "metadata.json").write_text(json.dumps(meta))
    before["metadata.json"] = (out / "metadata.json").read_bytes()
    with pytest.raises(PrepareError, match=r"other settings \(tokenizer: \"tiktoken/cl100k_base\" there"):
        run(src, out, val_tokens=100, shard_tokens=1000)
    unchanged()
    # Shards with no metadata (e.g. from another tool) are never touched.
    bare = tmp_path / "bare"
    bare.mkdir()
    write_shard(bare / "train_000000.bin", np.arange(10))
    with pytest.raises(PrepareError, match="no metadata.json.*--overwrite"):
        run(src, bare, val_tokens=100)
    assert read_shard(bare / "train_000000.bin").tolist() == list(range(10))
    run(src, bare, val_tokens=100, overwrite=True)
    assert metadata(bare)["complete"]
    # A changed input file is another source: refused as well.
    with open(src, "a") as f:
        f.write(json.dumps({"text": "one more"}) + "\n")
    with pytest.raises(PrepareError, match="source:"):
        run(src, bare, val_tokens=100)


def test_cli_prints_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cli = prep_cli
    assert cli.main(["--source", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --source") and "missing.txt" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as exc:
        cli.main(["--shard-tokens", "lots"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        cli.main(["--val-tokens", "-5"])
    assert exc.value.code == 2
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(20))
    assert cli.main(["--source", str(src), "--out", str(tmp_path / "o"), "--val-tokens", "100",
                     "--shard-tokens", "1k", "--workers", "1", "--quiet"]) == 0
    assert "shards" in capsys.readouterr().out
    assert metadata(tmp_path / "o")["settings"]["shard_tokens"] == 1000


def test_defaults() -> None:
    cli = prep_cli
    args = cli.build_parser().parse_args([])
    assert args.source == ["HuggingFaceFW/fineweb-edu"] and args.out == "data/fineweb-edu-10B"
    assert args.val_tokens is None and args.shard_tokens == 100_000_000  # None: the run's choice
    assert prep.DEFAULT_VAL_TOKENS == 20 * 8 * 64 * 1024 + 1
    src = prep_sources.open_source(PrepareConfig())
    assert isinstance(src, prep_sources.HFSource) and src.subset == "sample-10BT" and src.split == "train"
    assert prep_sources.looks_like_hf_dataset("someone/corpus") and prep_sources.looks_like_hf_dataset("hf:someone/corpus")
    for local in ("data/x.jsonl", "./a/b", "my_texts/*.jsonl", "input.txt", "/abs/path"):
        assert not prep_sources.looks_like_hf_dataset(local), local


# --------------------------------------------------------------------------
# Hugging Face datasets, offline: datasets.load_dataset is stood in for


def test_hf_dataset_through_load_dataset(tmp_path: Path, enc, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    docs = make_docs(80, seed=21)
    data = write_jsonl(tmp_path / "hub.jsonl", docs, field="content")
    calls = []
    real = datasets.load_dataset

    def fake(path, name=None, split=None, streaming=False, **kw):
        calls.append((path, name, split, streaming))
        # the same builder a hub dataset of json files goes through, on local files
        return real("json", data_files=str(data), split="train", streaming=streaming,
                    cache_dir=str(tmp_path / "hf_cache"))

    monkeypatch.setattr(datasets, "load_dataset", fake)
    log = io.StringIO()
    for streaming in (False, True):
        out = tmp_path / f"out{streaming}"
        cfg = PrepareConfig(("someone/corpus",), str(out), val_tokens=300, shard_tokens=2000,
                            subset="en", split="train", text_field="content", streaming=streaming,
                            workers=2)
        prepare(cfg, log=log)
        assert decode_docs(enc, read_stream(out)) == docs
        assert metadata(out)["source"]["dataset"] == "someone/corpus"
    assert calls[0] == ("someone/corpus", "en", "train", False) and calls[-1][3] is True
    assert shard_bytes(tmp_path / "outFalse") == shard_bytes(tmp_path / "outTrue")
    assert "tok/s" in log.getvalue() and "docs/s" in log.getvalue()
    # Resume: the dataset's examples before the stop are skipped with .skip().
    for streaming in (False, True):
        out = tmp_path / f"resumed{streaming}"
        cfg = PrepareConfig(("someone/corpus",), str(out), val_tokens=300, shard_tokens=2000, subset="en",
                            text_field="content", streaming=streaming, workers=1, progress=False)
        with pytest.raises(Interrupt):
            prepare(cfg, on_shard=_stop_after(3))
        assert prepare(cfg).kept_shards == 3
        assert shard_bytes(out) == shard_bytes(tmp_path / "outFalse")
    with pytest.raises(PrepareError, match=r"no field 'text' \(fields: id, content\)"):
        prepare(PrepareConfig(("someone/corpus",), str(tmp_path / "o3"), progress=False))


def test_hf_streaming_stops_at_max_tokens(tmp_path: Path, enc, monkeypatch: pytest.MonkeyPatch,
                                          small_layout) -> None:
    import datasets

    pulled = []

    def endless():
        i = 0
        while True:
            pulled.append(i)
            yield {"text": f"document number {i} " * 20, "url": "x"}
            i += 1

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: endless())
    log = io.StringIO()
    cfg = PrepareConfig((prep.DEFAULT_DATASET,), str(tmp_path / "out"), val_tokens=1000,
                        shard_tokens=4000, max_tokens=10_000, streaming=True, workers=2)
    res = prepare(cfg, log=log)
    assert res.tokens == 10_000 and res.val_tokens == 1000
    # ~100 documents are needed; the rest are the few tasks (of ~11 documents) in flight.
    assert len(pulled) < 300
    want = expected_stream(enc, [f"document number {i} " * 20 for i in range(200)])[:10_000]
    assert np.array_equal(read_stream(tmp_path / "out"), want)
    assert "%" in log.getvalue()  # progress against --max-tokens

    def missing(*a, **k):
        return iter([{"body": "x", "url": "y"}])

    monkeypatch.setattr(datasets, "load_dataset", missing)
    with pytest.raises(PrepareError, match=r"example 0: no field 'text' \(fields there: body, url\)"):
        prepare(PrepareConfig(("a/b",), str(tmp_path / "o2"), streaming=True, progress=False))

    def offline(*a, **k):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(PrepareError, match="cannot load the Hugging Face dataset.*no network"):
        prepare(PrepareConfig(("a/b",), str(tmp_path / "o3"), progress=False))


@pytest.mark.slow
def test_spawn_workers_give_the_same_shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_layout) -> None:
    # macOS and Windows start workers with 'spawn': they import gpt.data.prepare afresh and get
    # their tasks pickled, with nothing inherited from the parent.
    import multiprocessing

    docs = make_docs(150, seed=31) + ["long " * 3000]
    src = write_jsonl(tmp_path / "in.jsonl", docs)
    (tmp_path / "b.txt").write_text("\n".join(make_docs(20, seed=32)), encoding="utf-8")
    run([src, tmp_path / "b.txt"], tmp_path / "fork", val_tokens=500, shard_tokens=4000, workers=1)
    spawn = multiprocessing.get_context("spawn")
    monkeypatch.setattr(prep_encode.mp, "get_context", lambda method=None: spawn)
    run([src, tmp_path / "b.txt"], tmp_path / "spawn", val_tokens=500, shard_tokens=4000, workers=2)
    assert shard_bytes(tmp_path / "spawn") == shard_bytes(tmp_path / "fork")


# --------------------------------------------------------------------------
# Memory and the end-to-end round trip


def _peak_traced(src: Path, out: Path) -> tuple[int, int]:
    tracemalloc.start()
    try:
        res = run(src, out, val_tokens=1000, shard_tokens=50_000)
        return tracemalloc.get_traced_memory()[1], res.tokens
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_memory_stays_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, enc) -> None:
    # (enc: the BPE tables, ~30 MB of Python objects, are loaded before tracing starts)
    monkeypatch.setattr(prep_config, "TASK_CHARS", 1 << 17)
    docs = make_docs(1500, seed=3, max_words=400)
    small = write_jsonl(tmp_path / "small.jsonl", docs)
    big = tmp_path / "big.jsonl"
    big.write_bytes(small.read_bytes() * 3)
    peak_small, _ = _peak_traced(small, tmp_path / "o1")
    peak_big, tokens_big = _peak_traced(big, tmp_path / "o2")
    assert big.stat().st_size > 6_000_000
    # Python allocations (numpy's included) stay near one shard buffer plus a task or two,
    # far below the input or its tokens, and do not grow with the input.
    assert peak_big < 0.5 * tokens_big * 2, (peak_big, tokens_big)
    assert peak_big < 1.3 * peak_small + 200_000, (peak_small, peak_big)


@pytest.mark.slow
def test_progress_shows_rate_and_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ETA times only what this run did: a resume that starts 20% in and reaches 60%
    in 20 s has 40% left, so 20 s more."""
    from gpt.data.prepare import run as prep_run

    clock = iter([0.0, 0.0, 20.0, 25.0])
    monkeypatch.setattr(prep_run.time, "perf_counter", lambda: next(clock))
    log = io.StringIO()
    progress = prep_run.Progress(True, log, "out", None)
    progress.update(docs=0, tokens=0, total_tokens=0, fraction=0.2)  # too soon to print
    progress.update(docs=40, tokens=2_000, total_tokens=2_000, fraction=0.6)
    progress.update(docs=50, tokens=2_500, total_tokens=2_500, fraction=1.0, final=True)
    first, final = log.getvalue().splitlines()
    assert first == "out: 2.00k tokens, 40 docs | 100 tok/s, 2 docs/s | 60.0% ETA 20s"
    assert final == "out: 2.50k tokens, 50 docs | 100 tok/s, 2 docs/s | 100.0%"
