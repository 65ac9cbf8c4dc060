"""Bits per byte: validation loss in units that do not depend on the tokenizer.

bits per byte = (loss summed over the target tokens, in nats) / (ln 2 x the UTF-8 bytes
of those tokens) = mean loss / (ln 2 x mean bytes per target token). The EOT token has no
bytes of text, so its loss counts and its bytes do not: a document boundary is part of
what the model predicts. Ids past GPT-2's vocabulary (a padded vocabulary's rows) have no
bytes either; they never occur as targets.
"""

from __future__ import annotations

import functools
import math

import torch

from gpt.data.tokenizer import GPT2_EOT, GPT2_VOCAB, gpt2_tokenizer


@functools.lru_cache(maxsize=4)  # built once per run, not at each validation
def token_bytes(vocab_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(vocab_size,) float tensor: the UTF-8 byte length of each GPT-2 token id."""
    enc = gpt2_tokenizer()
    lengths = [0.0] * vocab_size
    for i in range(min(vocab_size, GPT2_VOCAB)):
        if i != GPT2_EOT:
            lengths[i] = float(len(enc.decode_single_token_bytes(i)))
    return torch.tensor(lengths, device=device)


def bits_per_byte(mean_loss: float, bytes_per_token: float) -> float:
    """Bits per byte from a mean loss (nats per target token) and the mean UTF-8 bytes per
    target token over the same tokens."""
    return mean_loss / (math.log(2) * bytes_per_token)
