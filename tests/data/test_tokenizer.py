"""GPT-2's tokenizer offline: tiktoken's cache first, else the BPE files the package ships,
checked by sha256; a damaged or missing shipped file is a one-line error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tiktoken

from helpers import REPO, SHAKESPEARE
from gpt.data import tokenizer
from gpt.data.prepare import encode as prep_encode
from gpt.data.prepare.cli import main as fineweb_main
from gpt.data.shards import read_shard


@pytest.fixture()
def no_tiktoken_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """tiktoken's cache points at an empty folder, and the tokenizer is built afresh (by
    gpt2_tokenizer, and by fineweb.py's encoder, which keeps the one it first got)."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty_cache"))
    monkeypatch.setattr(prep_encode, "_encoder", None)
    tokenizer.gpt2_tokenizer.cache_clear()
    yield
    tokenizer.gpt2_tokenizer.cache_clear()


def tiktokens_own() -> tiktoken.Encoding:
    if not tokenizer._in_tiktoken_cache():
        pytest.skip("tiktoken's own cache of GPT-2's files is not here to compare with "
                    "(set TIKTOKEN_CACHE_DIR)")
    return tiktoken.get_encoding("gpt2")


def test_tiktokens_cache_is_used_when_it_has_the_files() -> None:
    reference = tiktokens_own()
    tokenizer.gpt2_tokenizer.cache_clear()
    try:
        assert tokenizer.gpt2_tokenizer() is reference
    finally:
        tokenizer.gpt2_tokenizer.cache_clear()


def test_the_shipped_files_give_tiktokens_encoding_token_for_token(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    reference = tiktokens_own()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty_cache"))
    tokenizer.gpt2_tokenizer.cache_clear()
    try:
        assert not tokenizer._in_tiktoken_cache()
        shipped = tokenizer.gpt2_tokenizer()
    finally:
        tokenizer.gpt2_tokenizer.cache_clear()
    assert shipped is not reference
    text = SHAKESPEARE.read_text(encoding="utf-8")
    ids = shipped.encode_ordinary(text)
    assert ids == reference.encode_ordinary(text) and len(ids) == 338_025
    tricky = "  naïve café 😀 1234567 don't\n\n\tx<|endoftext|>y's"
    assert shipped.encode(tricky, allowed_special="all") == reference.encode(tricky, allowed_special="all")
    assert shipped.decode(ids) == text
    assert (shipped.n_vocab, shipped.eot_token) == (reference.n_vocab, reference.eot_token) == (50257, 50256)


def test_fineweb_runs_offline_with_an_empty_tiktoken_cache(tmp_path: Path) -> None:
    """No cache and no network (a proxy on a closed port): the shipped files are used."""
    src = tmp_path / "in.txt"
    src.write_text("hello")
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty_cache"),
           "HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}
    proc = subprocess.run([sys.executable, str(REPO / "fineweb.py"), "--source", str(src),
                           "--out", str(tmp_path / "o"), "--val-tokens", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    tokens = np.concatenate([read_shard(tmp_path / "o" / "val_000000.bin"),
                             read_shard(tmp_path / "o" / "train_000000.bin")])
    assert tokens.tolist() == [50256, 31373]  # <|endoftext|> "hello"


@pytest.mark.parametrize("harm,words", [
    ("damage", "vocab.bpe: GPT-2's BPE file is damaged (sha256 differs); reinstall gpt2-trainer"),
    ("remove", "vocab.bpe: GPT-2's BPE file is missing from the package"),
])
def test_a_damaged_or_missing_shipped_file_is_a_one_line_error(
        harm: str, words: str, no_tiktoken_cache: None, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assets = Path(shutil.copytree(tokenizer.ASSETS / "gpt2", tmp_path / "assets" / "gpt2")).parent
    if harm == "damage":
        with open(assets / "gpt2" / "vocab.bpe", "ab") as fh:
            fh.write(b"x")
    else:
        (assets / "gpt2" / "vocab.bpe").unlink()
    monkeypatch.setattr(tokenizer, "ASSETS", assets)
    src = tmp_path / "in.txt"
    src.write_text("hello")
    out = tmp_path / "o"
    code = fineweb_main(["--source", str(src), "--out", str(out), "--val-tokens", "1",
                         "--workers", "1", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert words in err and str(assets / "gpt2" / "vocab.bpe") in err
    assert not (out.exists() and list(out.glob("*.bin")))
