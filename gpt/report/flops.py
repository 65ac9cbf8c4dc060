"""How fast a run computes and how much it holds: model FLOPs per token, MFU against the
device's bf16 dense peak (the peak table), and the peak memory a step used."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import psutil
import torch

from gpt.core.config import ModelConfig


# bf16 dense (no sparsity) tensor-core peaks in TFLOP/s, from the vendors' datasheets
# (GeForce/RTX: the Ampere and Ada architecture whitepapers, "BF16 with FP32 accumulate").
# Matched against the device name (torch.cuda.get_device_name()) in this order, so
# specific names come before the names they contain ("H100 PCIe" before "H100", "L40S"
# before "L40" before "L4"). A key matches as a whole word, case-insensitively: "A10"
# does not match "A100" or "A10G", and "RTX 4090" does not match "RTX 4090 D", "Ti",
# "SUPER" or laptop parts, whose peaks differ. GPUs without bf16 tensor cores (V100, T4)
# are absent on purpose, as is any part whose number we could not check: pass
# --peak-tflops for those.
PEAK_BF16_TFLOPS: list[tuple[str, float]] = [
    # Hopper
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM ("NVIDIA H100 80GB HBM3")
    ("GH200", 989.0),
    ("H200 NVL", 835.0),
    ("H200", 989.0),  # SXM
    # Ampere data centre
    ("A100", 312.0),  # SXM and PCIe alike
    ("A30", 165.0),
    ("A40", 149.7),
    ("A10", 125.0),
    # Ada data centre
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    # Workstation
    ("RTX 6000 Ada", 364.2),
    ("RTX A6000", 154.8),
    # GeForce
    ("RTX 4090", 165.2),
    ("RTX 3090", 71.0),
    # AMD Instinct (ROCm builds report these names)
    ("MI300X", 1307.4),
]

# A key followed by one of these words names a different part (e.g. "RTX 4090 D").
_VARIANT_SUFFIX = r"(?:Ti|SUPER|D|Laptop|Mobile|Max-Q)\b"


def _name_pattern(key: str) -> re.Pattern[str]:
    return re.compile(
        rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])(?![ -]{_VARIANT_SUFFIX})",
        re.IGNORECASE,
    )


_PEAK_PATTERNS = [(_name_pattern(key), tflops) for key, tflops in PEAK_BF16_TFLOPS]


def peak_tflops(device_name: str) -> float | None:
    """The device's bf16 dense peak, or None when we do not know it (no MFU then)."""
    for pattern, tflops in _PEAK_PATTERNS:
        if pattern.search(device_name or ""):
            return tflops
    return None


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward), PaLM appendix B style:

        6 * N  +  12 * n_layer * n_embd * seq_len

    N counts every weight a token's matmuls touch: the blocks plus the (tied) token
    embedding, which is the LM head's matmul; the position embedding is a lookup, not a
    matmul, and is left out. The second term is attention's QK^T and AV products
    (2 * 2 * T * d per layer forward, x3 for forward + backward), counted without the
    causal mask's saving, as is the convention for MFU; nor an attention window's or
    document mask's (--attn-window, --doc-mask), so with them this is an upper bound.
    Value embeddings are lookups (no matmul) and U-net skips and value mixing a few
    element-wise products per token: none is counted, as the position embedding is not.
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


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: the CUDA allocator's, or elsewhere the process's peak RSS where the
    OS allows it (Linux: /proc/self/clear_refs; elsewhere the peak stays since start)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # 5: reset the peak resident set size (VmHWM)
    except OSError:
        pass


def peak_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, what was measured): on CUDA the most memory tensors held (the caching
    allocator's max_memory_allocated); on CPU and MPS, where that does not exist, the
    process's peak resident set size (RSS: everything the process holds in RAM)."""
    if device.type == "cuda":  # the allocator's own count: no need to wait for the device
        return int(torch.cuda.max_memory_allocated(device)), "cuda max_memory_allocated"
    return _peak_rss(), "peak RSS"


def resident_memory() -> int:
    """The process's resident set size now (bytes): what it holds in RAM."""
    return int(psutil.Process().memory_info().rss)


def _peak_rss() -> int:
    try:  # Linux: VmHWM, which clear_refs can reset
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource  # POSIX only

        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(maxrss if sys.platform == "darwin" else maxrss * 1024)  # bytes on macOS, KiB elsewhere
    except ImportError:  # Windows
        return int(getattr(psutil.Process().memory_info(), "peak_wset", 0))
