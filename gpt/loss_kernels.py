"""Which fused head + cross-entropy the chunked loss runs (--loss-kernel): ours
(gpt/chunked_ce.py, every device) or, on CUDA, a library's Triton kernel: Liger Kernel's
fused linear cross-entropy or Apple's Cut Cross-Entropy. All three compute the mean of
cross_entropy(softcap(h @ weight.T), targets) without holding the whole logits.

The libraries are optional (`pip install liger-kernel` / `cut-cross-entropy`, or the
`kernels` extra) and CUDA-only: their kernels are Triton's. The GPU acceptance measures
them side by side (`python -m gpt.bench gpu loss-kernels`): on an H200 at GPT-2 124M,
micro-batch 64, compiled, a step took 254.6 ms with Liger's, 264.9 with ours (its chunk
loop then still traced into the graph) and 371.2 with Cut Cross-Entropy's
(benchmarks/gpu/README.md). So `auto`, the default, is Liger's on CUDA where it is
installed and ours everywhere else.

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

KERNELS = ("ours", "liger", "cce")  # and "auto", which resolve() turns into one of them
# the module each library kernel imports, and how to install it
PACKAGES = {"liger": ("liger_kernel", "pip install liger-kernel"),
            "cce": ("cut_cross_entropy", "pip install cut-cross-entropy")}


def resolve(kernel: str, device_type: str) -> str:
    """--loss-kernel as given; auto: liger on CUDA where liger_kernel is installed, else ours."""
    if kernel != "auto":
        return kernel
    liger_here = device_type == "cuda" and importlib.util.find_spec(PACKAGES["liger"][0]) is not None
    return "liger" if liger_here else "ours"


def check(kernel: str, device_type: str) -> None:
    """Refuse a library kernel where it cannot run: off CUDA, or not installed."""
    if kernel in ("auto", "ours"):
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
    """The function GPT.loss calls for `kernel` (one of KERNELS: resolved, not auto)."""
    return {"ours": linear_cross_entropy, "liger": liger, "cce": cce}[kernel]
