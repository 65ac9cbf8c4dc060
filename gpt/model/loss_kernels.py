"""Which fused head + cross-entropy the chunked loss runs (--loss-kernel): ours
(gpt/model/chunked_ce.py, every device) or, on CUDA, a library's Triton kernel: Liger Kernel's
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

--loss-kernel fused is not a chunked loss: the head's matmul makes the whole logits as
without --chunked-loss, and gpt/model/fused_ce.py's Triton kernels (CUDA only) compute their
cross-entropy with no fp32 copy, in one of two modes (FUSED_MODE): the backward mode reads
the logits twice and writes their gradient once, over them, in the backward; the forward
mode writes it in the forward, for the incoming gradient it expects, one pass over the
logits fewer. The model keeps that expectation (ExpectedGrad, one tensor a model): it
starts at 1 and each backward leaves in it the gradient it got, so from the first backward
on it is 1 / accumulation steps (times GradScaler's scale in fp16), and only a call whose
incoming gradient moved (the run's first, a scale's change) rescales its gradient. Both
are measured beside the others in `gpu loss-kernels` (its loss-bench cell alone, its
trainer cells in a step) before either is anyone's default.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from gpt.core import extras
from gpt.core.errors import UserError
from gpt.model.chunked_ce import linear_cross_entropy, linear_dtype


LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]

CHUNKED = ("ours", "liger", "cce")  # the chunked loss's kernels: "auto" resolves to one of them
# What --loss-kernel fused runs: gpt/model/fused_ce.py's backward mode or its forward mode.
# The forward mode moves a third fewer bytes (PREDICTED faster; nothing measured on a GPU
# yet): the GPU acceptance's loss-kernels stage measures both (loss_bench.py's choice, and
# the trainer cells ours-b64-default-fused and -fused-forward), and its result decides this;
# until then the backward mode, which --loss-kernel fused has always run.
FUSED_MODES = ("backward", "forward")
FUSED_MODE = "backward"
KERNELS = (*CHUNKED, "fused")  # fused: the whole logits' cross-entropy (gpt/model/fused_ce.py)
# the modules each library kernel imports (the first names the package), and its name
# on the package index
PACKAGES = {"liger": (("liger_kernel", "liger_kernel.transformers.functional"), "liger-kernel"),
            "cce": (("cut_cross_entropy",), "cut-cross-entropy")}


def resolve(kernel: str, device_type: str) -> str:
    """--loss-kernel as given; auto: liger on CUDA, ours elsewhere. A Triton kernel is made
    ready here, before a model that calls it is compiled (see _eager)."""
    chosen = kernel if kernel != "auto" else "liger" if device_type == "cuda" else "ours"
    if chosen != "ours":
        (fused if chosen == "fused" else loss_fn(chosen)).prepare()  # type: ignore[attr-defined]
    return chosen


def describe(chunked: bool, kernel: str) -> str:
    """The start line's and the dry run's words for a run's head + loss (`kernel`
    resolved)."""
    if chunked:
        return f"chunked ({kernel})"
    if kernel == "fused":
        return "whole logits (fused)" if FUSED_MODE == "backward" else "whole logits (fused, forward mode)"
    return "whole logits"


def check(kernel: str, device_type: str, chunked: bool = True) -> None:
    """Refuse a chunked loss's kernel where it cannot run (`chunked`: whether the run uses
    the chunked loss at all): ours on CUDA (withdrawn there, see above), a library's off
    CUDA or not installed; and fused (the whole logits', never chunked) off CUDA or
    without Triton."""
    if kernel == "fused":
        if device_type != "cuda":
            raise UserError(f"--loss-kernel fused runs Triton kernels on CUDA only, and this run "
                            f"is on {device_type}: drop --loss-kernel fused")
        # as the kernels import it (CUDA builds of torch bring Triton)
        extras.require(("triton", "triton.language"), "--loss-kernel fused", "kernels", "triton")
        return
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
    modules, package = PACKAGES[chosen]
    if device_type != "cuda":
        raise UserError(f"--loss-kernel {chosen} runs Triton kernels on CUDA only, and this "
                        f"run is on {device_type}: use --loss-kernel ours (the default)")
    what = ("--chunked-loss on CUDA (Liger Kernel's fused linear cross-entropy; or "
            "--no-chunked-loss, the whole logits, the default there)" if kernel == "auto"
            else f"--loss-kernel {chosen}")
    extras.require(modules, what, "kernels", package)  # as the kernel imports it


def _in_compute_dtype(h: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """h as (N, C) rows and both in the dtype autocast's F.linear would use (the casts are
    differentiable, so the gradients reach the fp32 weights as through F.linear)."""
    dtype = linear_dtype(h, weight)
    return h.reshape(-1, h.size(-1)).to(dtype).contiguous(), weight.to(dtype)


def _eager(fn: LossFn) -> LossFn:
    """`fn` run eagerly inside a compiled model (Triton launches, a library's or
    gpt/model/fused_ce.py's; the model stays compiled): torch.compiler.disable(fn), made at the
    first call (or by resolve), because it imports torch._dynamo, a third of the trainer's
    start-up (2 s of 6 on a CPU), which a run that never calls these kernels need not pay."""
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


class ExpectedGrad:
    """A model's expectation of its fused loss's incoming gradient (the forward mode's
    `expected_grad`, gpt/model/fused_ce.py): one tensor, made on the logits' device at the
    first call, at 1, and corrected by each backward to the gradient it got, which the
    trainer keeps steady (1 / accumulation steps, times GradScaler's scale in fp16) whatever
    wraps the model (DDP and its no_sync, FSDP2, checkpointing, torch.compile: the loss runs
    eagerly between the compiled graphs). Not a buffer: no checkpoint holds it, and a model
    read back starts at 1 again (its first backward rescales once)."""

    def __init__(self) -> None:
        self.tensor: torch.Tensor | None = None

    def on(self, device: torch.device) -> torch.Tensor:
        if self.tensor is None or self.tensor.device != device:
            self.tensor = torch.ones(1, dtype=torch.float32, device=device)
        return self.tensor


@_eager  # Triton launches and an in-place write (gpt/model/fused_ce.py)
def fused(logits: torch.Tensor, targets: torch.Tensor, softcap: float = 0.0,
          expected: ExpectedGrad | None = None) -> torch.Tensor:
    """--loss-kernel fused: the mean cross-entropy of softcap(logits) (..., V) against
    targets, by gpt/model/fused_ce.py's kernels (Triton, imported here, when it runs), in
    FUSED_MODE (the forward mode with `expected`, the caller's expectation; without it, the
    backward mode). Its gradient is written over the logits: GPT.loss hands it the head's
    output, which nothing else reads (the matmul's backward keeps its inputs, not its
    output)."""
    from gpt.model.fused_ce import cross_entropy

    logits = logits.reshape(-1, logits.size(-1))
    guess = expected.on(logits.device) if expected is not None and FUSED_MODE == "forward" else None
    return cross_entropy(logits, targets.reshape(-1), softcap, inplace=True, expected_grad=guess)


def loss_fn(kernel: str) -> LossFn:
    """The function GPT.loss calls for the chunked loss's `kernel` (one of CHUNKED:
    resolved, not auto)."""
    return {"ours": linear_cross_entropy, "liger": liger, "cce": cce}[kernel]
