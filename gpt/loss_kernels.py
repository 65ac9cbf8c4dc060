"""Which fused head + cross-entropy the chunked loss runs (--loss-kernel): ours
(gpt/chunked_ce.py, every device) or, on CUDA, a library's Triton kernel: Liger Kernel's
fused linear cross-entropy or Apple's Cut Cross-Entropy. All three compute the mean of
cross_entropy(softcap(h @ weight.T), targets) without holding the whole logits.

The libraries are optional (`pip install liger-kernel` / `cut-cross-entropy`, or the
`kernels` extra) and CUDA-only: their kernels are Triton's. `python -m gpt.bench gpu
loss-kernels` measures them side by side. On an H100 at GPT-2 124M, micro-batch 64,
compiled (benchmarks/gpu/2026-11-27-h100), a step took 266.5 ms with the whole logits,
278.7 with Liger's (5.7 GiB less), 386.4 with ours and 392.9 with Cut Cross-Entropy's,
ours and Liger's at the same memory. So ours is not offered on CUDA: there the chunked
loss is Liger's (auto), or Cut Cross-Entropy's when named, and ours runs on the CPU and
MPS, where it is the default.

Each library kernel gets what ours gets: under autocast, the hidden states and the head
weight cast to autocast's dtype (what F.linear would do), the loss in fp32, and the head
weight's gradient summed in fp32 where the library offers it (Liger's accum_dtype). Cut
Cross-Entropy's gradient filter (it skips entries it judges too small to matter) is off,
so every kernel computes the same gradients to rounding.
"""

from __future__ import annotations

import functools
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
    """--loss-kernel as given; auto: liger on CUDA, ours elsewhere. A library's kernel is
    made ready here, before a model that calls it is compiled (see _eager)."""
    chosen = kernel if kernel != "auto" else "liger" if device_type == "cuda" else "ours"
    if chosen in ("liger", "cce"):
        loss_fn(chosen).prepare()  # type: ignore[attr-defined]
    return chosen


def check(kernel: str, device_type: str, chunked: bool = True) -> None:
    """Refuse a chunked loss's kernel where it cannot run (`chunked`: whether the run uses
    the chunked loss at all): ours on CUDA (withdrawn there, see above), a library's off
    CUDA or not installed."""
    if not chunked:
        return
    chosen = resolve(kernel, device_type)
    if chosen == "ours":
        if device_type == "cuda":
            raise UserError("--loss-kernel ours is not offered on CUDA: it measured 1.45x the "
                            "step time of the whole logits there, Liger Kernel's 1.05x at the "
                            "same memory; use --loss-kernel liger (pip install liger-kernel), "
                            "or --no-chunked-loss")
        return
    module, hint = PACKAGES[chosen]
    if device_type != "cuda":
        raise UserError(f"--loss-kernel {chosen} runs Triton kernels on CUDA only, and this "
                        f"run is on {device_type}: use --loss-kernel ours (the default)")
    if importlib.util.find_spec(module) is None:
        what = ("--chunked-loss on CUDA runs Liger Kernel's fused linear cross-entropy, which "
                "needs" if kernel == "auto" else f"--loss-kernel {chosen} needs")
        raise UserError(f"{what} the {module} package: {hint} (or pip install "
                        f"'gpt2-trainer[kernels]'), or use --no-chunked-loss (the whole "
                        f"logits, the default on CUDA)")


def _in_compute_dtype(h: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """h as (N, C) rows and both in the dtype autocast's F.linear would use (the casts are
    differentiable, so the gradients reach the fp32 weights as through F.linear)."""
    dtype = linear_dtype(h, weight)
    return h.reshape(-1, h.size(-1)).to(dtype).contiguous(), weight.to(dtype)


def _eager(fn: LossFn) -> LossFn:
    """`fn` run eagerly inside a compiled model (a library's Triton launches; the model stays
    compiled): torch.compiler.disable(fn), made at the first call, because it imports
    torch._dynamo, a third of the trainer's start-up (2 s of 6 on a CPU), which a run that
    never calls a library kernel need not pay."""
    disabled: list[LossFn] = []

    def prepare() -> None:
        if not disabled:
            disabled.append(torch.compiler.disable(fn))

    @functools.wraps(fn)
    def run(*args, **kwargs):
        prepare()
        return disabled[0](*args, **kwargs)

    run.prepare = prepare  # type: ignore[attr-defined]
    return run


@_eager
def liger(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
          softcap: float = 0.0) -> torch.Tensor:
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    h2, w = _in_compute_dtype(h, weight)
    with torch.autocast(h.device.type, enabled=False):
        return liger_fused_linear_cross_entropy(
            h2, w, targets.reshape(-1), softcap=softcap or None, reduction="mean",
            accum_dtype=torch.float32 if w.dtype != torch.float32 else None).float()


@_eager
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
