"""The GPT-2 tokenizer (tiktoken's BPE)."""

from __future__ import annotations

import tiktoken

from gpt.errors import UserError

GPT2_VOCAB = 50257  # real GPT-2 token ids; a model may pad its vocabulary past this
GPT2_EOT = 50256  # <|endoftext|>, the delimiter between documents


class TokenizerError(UserError, RuntimeError):
    """GPT-2's BPE files cannot be had (offline, with no cache)."""


def gpt2_tokenizer() -> tiktoken.Encoding:
    """tiktoken's 'gpt2' encoding. It downloads its BPE files on first use; offline, set
    TIKTOKEN_CACHE_DIR to a folder that already holds them."""
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # network failures surface as many exception types
        raise TokenizerError(
            f"could not load tiktoken's 'gpt2' encoding ({type(e).__name__}: {e}); offline, set "
            "TIKTOKEN_CACHE_DIR to a folder with its cached BPE files"
        ) from None
