"""FLOP counts, model FLOPs utilisation (MFU), and the JSONL metrics log."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpt.config import ModelConfig

# bf16 dense (no sparsity) tensor-core peaks in TFLOP/s, from the vendors' datasheets.
# Matched against torch.cuda.get_device_name() in order, so specific names come first.
PEAK_BF16_TFLOPS: list[tuple[str, float]] = [
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM
    ("H200", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
]


def peak_tflops(device_name: str) -> float | None:
    """The device's bf16 dense peak, or None when we do not know it (no MFU then)."""
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in device_name:
            return tflops
    return None


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward), PaLM appendix B style:

        6 * N  +  12 * n_layer * n_embd * seq_len

    N counts every weight a token's matmuls touch: the blocks plus the (tied) token
    embedding, which is the LM head's matmul; the position embedding is a lookup, not a
    matmul, and is left out. The second term is attention's QK^T and AV products
    (2 * 2 * T * d per layer forward, x3 for forward + backward), counted without the
    causal mask's saving, as is the convention for MFU.
    """
    d, L, V = cfg.n_embd, cfg.n_layer, cfg.vocab_size
    per_block = 4 * d * d + 4 * d + 8 * d * d + 5 * d + 4 * d  # attn, mlp (w + b), 2 LayerNorms
    n = L * per_block + V * d + 2 * d  # + token embedding / head, final LayerNorm
    return 6.0 * n + 12.0 * L * d * seq_len


def mfu(tokens_per_second: float, flops_per_tok: float, peak: float | None) -> float | None:
    """Achieved training FLOP/s over the peak (TFLOP/s); None when the peak is unknown."""
    if not peak:
        return None
    return tokens_per_second * flops_per_tok / (peak * 1e12)


class MetricsLog:
    """Append-only JSONL file: one JSON object per line (a header record, then one per event).

    Each record is flushed as it is written, so a crashed run keeps everything up to
    its last step, and a reader can tail the file while training runs.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
