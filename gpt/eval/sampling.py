"""Sampling from a GPT model with a KV cache: the trainer's periodic samples, and what
`python -m gpt.generate` (gpt/generate.py) prints.

The prompt is run through the model once (prefill), then each new token attends to the
cached keys and values of the earlier ones. Once a sequence is longer than the model's
block size, the window of positions slides, so cached keys (computed at other positions)
no longer apply: from there on every token is a full forward over the last block_size
tokens, exactly what sampling without the cache does.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt.core.errors import UserError
from gpt.core.text import one_line
from gpt.data.tokenizer import GPT2_EOT
from gpt.model.transformer import GPT, unwrap
from gpt.runtime.device import autocast


def _next_token(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None,
    valid_vocab: int | None,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """(B, V) logits of the last position -> (B, 1) chosen ids."""
    logits = logits.float()
    if valid_vocab is not None:
        logits[:, valid_vocab:] = float("-inf")
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None and top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    # Sample on the CPU generator's terms so a seed gives the same text on any device.
    return torch.multinomial(probs.cpu(), 1, generator=generator).to(logits.device)


class PromptError(UserError):
    """A prompt the model cannot start from; the message names the flag."""


def prompt_ids(tokenizer: Any, text: str, vocab_size: int, flag: str = "--prompt") -> list[int]:
    """The token ids sampling starts from: the prompt's, or <|endoftext|> alone for an
    empty one (a document's start, as GPT-2 was trained); a PromptError naming `flag` if
    one is beyond the model's vocabulary (a model trained with a --vocab-size below the
    tokenizer's), which the embedding could not look up."""
    ids = list(tokenizer.encode_ordinary(text)) or [tokenizer.eot_token]
    if max(ids) >= vocab_size:
        start = (f"an empty prompt starts from <|endoftext|> (id {ids[0]}), which is" if not
                 text else f"token id {max(ids)} is")
        raise PromptError(f"{flag} {one_line(repr(text), 60)}: {start} beyond the model's "
                          f"vocabulary of {vocab_size} ids: give a prompt whose GPT-2 tokens "
                          f"are all below {vocab_size}")
    return ids


def sampling_bytes(gpt: GPT, prompt_len: int, max_new_tokens: int, num_samples: int = 1,
                   autocast_dtype: torch.dtype = torch.float32, use_cache: bool = True) -> int:
    """What sample() allocates beyond the model, by arithmetic, at the least: the ids
    (int64), the KV cache (every layer's keys and values, in the autocast precision), the
    prompt's logits and the last position's fp32 copies as a token is drawn."""
    m = gpt.config
    width = 2 if autocast_dtype in (torch.bfloat16, torch.float16) else 4
    length = prompt_len + max_new_tokens
    cache = 0
    if use_cache and prompt_len < m.block_size:
        cache = 2 * m.n_layer * num_samples * min(m.block_size, length) * m.n_embd * width
    prefill = num_samples * min(prompt_len, m.block_size) * m.vocab_size * width
    return 8 * num_samples * length + cache + prefill + 3 * num_samples * m.vocab_size * 4


@torch.no_grad()
def sample(
    model: nn.Module,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    num_samples: int = 1,
    temperature: float = 1.0,
    top_k: int | None = 50,
    valid_vocab: int | None = None,
    generator: torch.Generator | None = None,
    autocast_dtype: torch.dtype = torch.float32,
    *,
    use_cache: bool = True,
    stop_at_eot: bool = False,
    eot_id: int = GPT2_EOT,
) -> torch.Tensor:
    """Return (num_samples, len(prompt) + max_new_tokens) token ids.

    Ids >= valid_vocab (the padding rows of a padded vocabulary) are never sampled.
    temperature 0 means greedy; top_k None or 0 keeps every token. The context is cropped
    to the model's block_size. use_cache=False recomputes the whole context each token
    (the reference the KV cache must match). With stop_at_eot, a row stops at its first
    generated eot_id and the rest of it is filled with eot_id; generation ends early once
    every row has stopped (the shape stays the same). See `until_eot` for trimming.
    """
    if len(prompt_ids) == 0:
        raise ValueError("the prompt must hold at least one token (e.g. the EOT token)")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    gpt = unwrap(model)
    if not isinstance(gpt, GPT):
        raise TypeError(f"expected a GPT model, got {type(gpt).__name__}")
    device = next(gpt.parameters()).device
    block = gpt.config.block_size
    idx = torch.tensor([list(prompt_ids)] * num_samples, dtype=torch.long, device=device)
    out = torch.full((num_samples, idx.size(1) + max_new_tokens), eot_id, dtype=torch.long,
                     device=device)
    out[:, : idx.size(1)] = idx
    done = torch.zeros(num_samples, 1, dtype=torch.bool, device=device)
    cache = None
    if use_cache and idx.size(1) < block:
        cache = gpt.new_kv_cache(min(block, idx.size(1) + max_new_tokens))
    was_training = gpt.training
    gpt.eval()
    try:
        length = idx.size(1)  # tokens so far
        for step in range(max_new_tokens):
            with autocast(device.type, autocast_dtype):
                if cache is not None and length <= cache.max_len:
                    # First step: the prompt; then only the newest token.
                    new = out[:, cache.length : length]
                    logits, _ = gpt(new, kv_cache=cache)
                else:  # no cache, or past the block size: recompute over the window
                    logits, _ = gpt(out[:, max(0, length - block) : length])
            next_id = _next_token(logits[:, -1, :], temperature, top_k, valid_vocab, generator)
            if stop_at_eot:
                next_id = next_id.masked_fill(done, eot_id)
                done |= next_id == eot_id
            out[:, length : length + 1] = next_id
            length += 1
            # Checking `done` reads it back from the device, so only when it can matter.
            if stop_at_eot and step % 8 == 7 and bool(done.all()):
                break
    finally:
        gpt.train(was_training)
    return out


def until_eot(ids: Sequence[int], prompt_len: int, eot_id: int = GPT2_EOT) -> list[int]:
    """A sample's ids up to (not including) the first EOT after the prompt."""
    ids = list(ids)
    for i in range(prompt_len, len(ids)):
        if ids[i] == eot_id:
            return ids[:i]
    return ids
