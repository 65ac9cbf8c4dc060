"""Which fused head + cross-entropy the chunked loss runs (--loss-kernel): ours
(gpt/chunked_ce.py, every device) or, on CUDA, a library's Triton kernel: Liger Kernel's
fused linear cross-entropy or Apple's Cut Cross-Entropy. All three compute the mean of
cross_entropy(softcap(h @ weight.T), targets) without holding the whole logits.

The libraries are optional (`pip install liger-kernel` / `cut-cross-entropy`, or the
`kernels` extra) and CUDA-only: their kernels are Triton's. Whichever is faster on a
GPU is what the GPU acceptance measures side by side (`python -m gpt.bench gpu`, the
loss-kernel stage); until it has, ours is the default everywhere.

Each library kernel gets what ours gets: under autocast, the hidden states and the head
weight cast to autocast's dtype (what F.linear would do), the loss in fp32, and the head
weight's gradient summed in fp32 where the library offers it (Liger's accum_dtype). Cut
Cross-Entropy's gradient filter (it skips entries it judges too small to matter) is off,
so every kernel computes the same gradients to rounding.
"""

from __future__ import annotations

import importlib.util
from typing import Callable

import torch

from gpt.chunked_ce import linear_cross_entropy, linear_dtype
from gpt.errors import UserError

LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]

KERNELS = ("ours", "liger", "cce")
# the module each library kernel imports, and how to install it
PACKAGES = {"liger": ("liger_kernel", "pip install liger-kernel"),
            "cce": ("cut_cross_entropy", "pip install cut-cross-entropy")}


def check(kernel: str, device_type: str) -> None:
    """Refuse a library kernel where it cannot run: off CUDA, or not installed."""
    if kernel == "ours":
        return
    module, hint = PACKAGES[kernel]
    if device_type != "cuda":
        raise UserError(f"--loss-kernel {kernel} runs Triton kernels on CUDA only, and this "
                        f"run is on {device_type}: use --loss-kernel ours (the default)")
    if importlib.util.find_spec(module) is None:
        raise UserError(f"--loss-kernel {kernel} needs the {module} package: {hint} "
                        f"(or pip install 'gpt2-trainer[kernels]'), or use --loss-kernel ours")


def _in_compute_dtype(h: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """h as (N, C) rows and both in the dtype autocast's F.linear would use (the casts are
    differentiable, so the gradients reach the fp32 weights as through F.linear)."""
    dtype = linear_dtype(h, weight)
    return h.reshape(-1, h.size(-1)).to(dtype).contiguous(), weight.to(dtype)


@torch.compiler.disable  # a library's Triton launches: run eagerly, the model stays compiled
def liger(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
          softcap: float = 0.0) -> torch.Tensor:
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    h2, w = _in_compute_dtype(h, weight)
    with torch.autocast(h.device.type, enabled=False):
        return liger_fused_linear_cross_entropy(
            h2, w, targets.reshape(-1), softcap=softcap or None, reduction="mean",
            accum_dtype=torch.float32 if w.dtype != torch.float32 else None).float()


@torch.compiler.disable
def cce(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
        softcap: float = 0.0) -> torch.Tensor:
    from cut_cross_entropy import linear_cross_entropy as cut_cross_entropy

    h2, w = _in_compute_dtype(h, weight)
    with torch.autocast(h.device.type, enabled=False):
        return cut_cross_entropy(h2, w, targets.reshape(-1), softcap=softcap or None,
                                 reduction="mean", filter_eps=None).float()


def loss_fn(kernel: str) -> LossFn:
    """The function GPT.loss calls for `kernel` (one of KERNELS)."""
    return {"ours": linear_cross_entropy, "liger": liger, "cce": cce}[kernel]
