"""The GPT-2 tokenizer (tiktoken's BPE)."""

from __future__ import annotations

GPT2_VOCAB = 50257  # real GPT-2 token ids; a model may pad its vocabulary past this
GPT2_EOT = 50256  # <|endoftext|>, the delimiter between documents


def gpt2_tokenizer():
    """tiktoken's 'gpt2' encoding. It downloads its BPE files on first use; offline, set
    TIKTOKEN_CACHE_DIR to a folder that already holds them."""
    import tiktoken  # imported here so `import gpt...` stays light

    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # network failures surface as many exception types
        raise RuntimeError(
            f"could not load tiktoken's 'gpt2' encoding ({type(e).__name__}: {e}); offline, set "
            "TIKTOKEN_CACHE_DIR to a folder with its cached BPE files"
        ) from None
