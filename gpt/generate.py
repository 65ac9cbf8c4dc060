"""Sampling from a GPT model (used by the trainer's periodic samples)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpt.model import GPT


@torch.no_grad()
def sample(
    model: GPT,
    prompt_ids: list[int],
    max_new_tokens: int,
    num_samples: int = 1,
    temperature: float = 1.0,
    top_k: int | None = 50,
    valid_vocab: int | None = None,
    generator: torch.Generator | None = None,
    autocast_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Return (num_samples, len(prompt) + max_new_tokens) token ids.

    Ids >= valid_vocab (the padding rows of a padded vocabulary) are never sampled.
    temperature 0 means greedy. The context is cropped to the model's block_size.
    """
    device = next(model.parameters()).device
    idx = torch.tensor([prompt_ids] * num_samples, dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            context = idx[:, -model.config.block_size :]
            with torch.autocast(
                device.type, dtype=autocast_dtype, enabled=autocast_dtype != torch.float32
            ):
                logits, _ = model(context)
            logits = logits[:, -1, :].float()
            if valid_vocab is not None:
                logits[:, valid_vocab:] = float("-inf")
            if temperature == 0:
                next_id = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = F.softmax(logits, dim=-1)
                # Sample on the CPU generator's terms so a seed gives the same text anywhere.
                next_id = torch.multinomial(probs.cpu(), 1, generator=generator).to(device)
            idx = torch.cat([idx, next_id], dim=1)
    finally:
        model.train(was_training)
    return idx
