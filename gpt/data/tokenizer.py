"""The GPT-2 tokenizer (tiktoken's BPE), which never needs the network.

tiktoken downloads GPT-2's two BPE files on first use and caches them. When its cache
holds them, tiktoken's own `gpt2` encoding is used; otherwise (an offline machine, a
cluster node without internet, a fresh laptop) the same encoding is built from the copies
this package ships in gpt/assets/gpt2/, checked against the published sha256 first.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from functools import cache
from pathlib import Path

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

from gpt.core.errors import UserError


GPT2_VOCAB = 50257  # real GPT-2 token ids; a model may pad its vocabulary past this
GPT2_EOT = 50256  # <|endoftext|>, the delimiter between documents

ASSETS = Path(__file__).resolve().parents[1] / "assets"  # gpt/assets, shipped as package data
SHAKESPEARE = ASSETS / "tinyshakespeare.txt"  # the demo corpus (fineweb.py --source demo)
_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
_BPE_FILES = {  # name -> the sha256 tiktoken checks too
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}
# GPT-2's pre-tokenizer pattern (tiktoken's r50k_pat_str)
_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


class TokenizerError(UserError, RuntimeError):
    """GPT-2's BPE files cannot be had: neither in tiktoken's cache nor shipped intact."""


@cache
def gpt2_tokenizer() -> tiktoken.Encoding:
    """GPT-2's encoding: tiktoken's when its cache has the files, else built from the
    shipped copies. Never touches the network."""
    if _in_tiktoken_cache():
        return tiktoken.get_encoding("gpt2")
    for name, sha in _BPE_FILES.items():
        path = ASSETS / "gpt2" / name
        try:
            ok = hashlib.sha256(path.read_bytes()).hexdigest() == sha
        except OSError as e:
            raise TokenizerError(f"{path}: GPT-2's BPE file is missing from the package "
                                 f"({e.strerror or e}); reinstall gpt2-trainer") from None
        if not ok:
            raise TokenizerError(f"{path}: GPT-2's BPE file is damaged (sha256 differs); "
                                 f"reinstall gpt2-trainer")
    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=str(ASSETS / "gpt2" / "vocab.bpe"),
                                            encoder_json_file=str(ASSETS / "gpt2" / "encoder.json"))
    return tiktoken.Encoding(name="gpt2", pat_str=_PAT, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": GPT2_EOT}, explicit_n_vocab=GPT2_VOCAB)


def _in_tiktoken_cache() -> bool:
    """Whether tiktoken would find both files without downloading (its cache rules:
    TIKTOKEN_CACHE_DIR, else DATA_GYM_CACHE_DIR, else a folder in the temp dir; "" disables
    it; files named by the sha1 of their URL)."""
    folder = os.environ.get("TIKTOKEN_CACHE_DIR", os.environ.get("DATA_GYM_CACHE_DIR"))
    if folder == "":
        return False
    folder = folder or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return all(Path(folder, hashlib.sha1((_URL + name).encode()).hexdigest()).is_file()
               for name in _BPE_FILES)
