"""The whole logits' cross-entropy as two Triton kernels for CUDA (--loss-kernel fused):
the mean over rows of cross_entropy(softcap(logits), targets), as F.cross_entropy
computes it, and its gradient with respect to the logits, without a second logits-sized
buffer and without an fp32 copy of the logits.

The head's matmul stays cuBLAS's (F.linear in GPT.loss, under autocast); these kernels
take its (N, V) logits in their own dtype (bf16 on the GPU), do all of their arithmetic
in fp32, and write the gradient back in the logits' dtype, as autocast's F.cross_entropy
path rounds it.

Passes over the logits, one program per row, the row in blocks of BLOCK columns:
- forward (_lse_kernel): each logit read once. An online softmax (the block's max, the
  running sum rescaled whenever the max grows) gives the row's log-sum-exp; the target's
  logit is read again on its own (one element a row). Out: the row's loss and its
  log-sum-exp, N floats each. The forward writes nothing logits-sized.
- backward (_grad_kernel): each logit read once more and written once, with
  (softmax - one-hot) x (the soft cap's slope) x grad_output / (rows counted), in place
  over the logits where the caller says nothing else reads them (GPT.loss does).
So each logit is read twice and written once in all, and what the step holds between the
passes is the logits themselves (which the head's output is anyway) and each row's
log-sum-exp (4 bytes a row).

llm.c's fused classifier writes the gradient during the forward instead, the second
pass over a row finding it in L2, which needs the loss's incoming gradient known
beforehand (there, 1 / tokens). Here it is not: the trainer divides the loss by the
accumulation steps, and GradScaler multiplies it, after the model returns. Writing
(softmax - one-hot) / n in the forward would leave the backward a multiplication by
grad_output, one more read and write of every logit (4 logits' worth of traffic, against
3 here); deferring the gradient's pass to the backward folds that factor in for free (read
from a device scalar: no host sync). llm.c's order would beat this one only if the
trainer handed the loss its 1 / accumulation steps before the forward (2 logits' worth).

What it matches: the model's whole logits (GPT.logits then F.cross_entropy). GPT-2's
vocabulary is padded from 50,257 to 50,304 columns and the model does not mask the
padded ones (their weights learn to keep them improbable), so every column of the
logits takes part here too; llm.c, which masks them, computes a different function. The
soft cap is applied inside the kernels in fp32 as cap * (2 sigmoid(2u / cap) - 1), which
is tanh's value to ~1e-6 of the cap (the form gpt/model/chunked_ce.py uses), its slope as
4 s (1 - s). Ignored positions (ignore_index) count for nothing and get a zero gradient;
the mean is over the others, so with every position ignored the loss is NaN and the
gradient zero, as F.cross_entropy's mean gives. A target outside [0, V) that is not the
ignore index gives a NaN loss (F.cross_entropy raises; a kernel cannot).

Bytes, GPT-2 124M at micro-batch 64 x 1024 in bf16 (N = 65,536 rows, V = 50,304): the
logits are 6.6 GB; forward reads 6.6 GB, backward reads 6.6 and writes 6.6: 19.8 GB a
micro-batch, two a step at 2^17 tokens. Inductor's fused loss over the whole logits (the
CUDA default) makes the same passes: the profile of benchmarks/gpu/2026-11-27-h100 has an
online-softmax reduction in the forward (5.8 ms a micro-batch: 1.1 TB/s) and one kernel
reading the logits and writing their gradient in the backward (6.0 ms: 2.2 TB/s), 7.2% of
the step's kernel time. So the lever here is bandwidth, not fewer bytes. PREDICTED for an
H100 (not measured): at 2.5-3 TB/s in both passes, 6.6-7.9 ms a micro-batch against
11.8, so 8-10 ms (3-4%) off the 266.5 ms step, if the graph break below costs nothing
else. With the soft cap each logit also takes a sigmoid (an exp and a reciprocal) in both
passes, which may bind the kernels to the special-function units rather than memory;
eagerly, the whole logits' path then also makes an fp32 copy of the capped logits (13 GB
a micro-batch), which this one never does. `python -m gpt.bench gpu loss-kernels` measures it
(cell ours-b64-default-fused), without the cap.

torch.compile: cross_entropy() is a graph break (torch.compiler.disable, as
gpt/model/loss_kernels.py's library kernels are). The backward writes over the logits, an
output of the compiled graph that no compiled code reads afterwards; registered as a
custom op that mutates its input, functionalization would copy the logits first,
which is the buffer this saves. The compiled graph ends at the head's matmul; the
kernels run eagerly between it and the compiled backward.

Triton is optional: this module imports it, and gpt/model/loss_kernels.py imports this module
only when --loss-kernel fused runs (CUDA only; loss_kernels.check refuses it elsewhere).
On a CPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1, fp32 only), which
is how tests/test_fused_ce.py checks them.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl


# Columns a program handles at a time. Not tuned: on an H100 a row of 50,304 is 13 blocks
# (the last one 1,152 wide), 16 fp32 values a thread at 8 warps; the GPU run is where to
# tune it. Any size works: the last block of a row is masked.
BLOCK = 4096
NUM_WARPS = 8


@triton.jit
def _capped(x, softcap, SOFTCAP: tl.constexpr):
    """x soft-capped (cap * tanh(x / cap), written with a sigmoid), and the sigmoid, in fp32."""
    if SOFTCAP:
        s = tl.sigmoid(x * (2.0 / softcap))
        return s * (2.0 * softcap) - softcap, s
    return x, x


@triton.jit
def _lse_kernel(x_ptr, x_stride, t_ptr, loss_ptr, lse_ptr, V, ignore_index, softcap,
                SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # int64: N x V passes 2^31 at GPT-2's sizes
    x_row = x_ptr + row * x_stride
    offs = tl.arange(0, BLOCK)
    m = float("-inf")  # the running max and the sum of exp(z - m) so far
    d = 0.0
    for start in range(0, V, BLOCK):
        cols = start + offs
        inside = cols < V
        z, _ = _capped(tl.load(x_row + cols, mask=inside, other=0.0).to(tl.float32), softcap,
                       SOFTCAP)
        z = tl.where(inside, z, float("-inf"))  # the last block's tail: no mass
        m_new = tl.maximum(m, tl.max(z, 0))
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), 0)
        m = m_new
    lse = m + tl.log(d)
    target = tl.load(t_ptr + row)
    valid = (target >= 0) & (target < V)
    z_t, _ = _capped(tl.load(x_row + tl.where(valid, target, 0)).to(tl.float32), softcap, SOFTCAP)
    loss = tl.where(valid, lse - z_t, float("nan"))
    tl.store(loss_ptr + row, tl.where(target == ignore_index, 0.0, loss))
    tl.store(lse_ptr + row, lse)


@triton.jit
def _grad_kernel(x_ptr, x_stride, g_ptr, g_stride, t_ptr, lse_ptr, scale_ptr, V, ignore_index,
                 softcap, SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    g_row = g_ptr + row * g_stride  # may be x_row: each block is read before it is written
    target = tl.load(t_ptr + row)
    lse = tl.load(lse_ptr + row)
    scale = tl.load(scale_ptr)  # grad_output / rows counted
    counted = target != ignore_index
    offs = tl.arange(0, BLOCK)
    for start in range(0, V, BLOCK):
        cols = start + offs
        inside = cols < V
        z, s = _capped(tl.load(x_row + cols, mask=inside, other=0.0).to(tl.float32), softcap,
                       SOFTCAP)
        g = tl.exp(z - lse) - tl.where(cols == target, 1.0, 0.0)
        if SOFTCAP:  # d(cap tanh(x / cap))/dx = 1 - tanh^2 = 4 s (1 - s)
            g = g * (4.0 * s * (1.0 - s))
        # an ignored row: zero, also when no row counts (scale is then inf)
        g = tl.where(counted, g * scale, 0.0)
        tl.store(g_row + cols, g.to(g_ptr.dtype.element_ty), mask=inside)


class _FusedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, softcap: float,
                ignore_index: int, inplace: bool, block: int) -> torch.Tensor:
        n, v = logits.shape
        losses = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(losses)
        if n:
            _lse_kernel[(n,)](logits, logits.stride(0), targets, losses, lse, v, ignore_index,
                              softcap, SOFTCAP=bool(softcap), BLOCK=block, num_warps=NUM_WARPS)
        counted = (targets != ignore_index).sum()  # on the device: no sync
        ctx.save_for_backward(logits, targets, lse, counted)
        ctx.softcap, ctx.ignore_index, ctx.inplace, ctx.block = softcap, ignore_index, inplace, block
        return losses.sum() / counted  # 0 / 0 = NaN with every row ignored, as F.cross_entropy

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[Any, ...]:
        logits, targets, lse, counted = ctx.saved_tensors
        n, v = logits.shape
        scale = (grad_loss.float() / counted).reshape(1)
        grad = logits if ctx.inplace else torch.empty_like(logits)
        if n:
            _grad_kernel[(n,)](logits, logits.stride(0), grad, grad.stride(0), targets, lse, scale,
                               v, ctx.ignore_index, ctx.softcap, SOFTCAP=bool(ctx.softcap),
                               BLOCK=ctx.block, num_warps=NUM_WARPS)
        if ctx.inplace:
            # the logits now hold their gradient: any other backward that saved them fails
            # loudly on the changed version instead of reading the gradient as logits
            torch.autograd.graph.increment_version(logits)
        return grad, None, None, None, None, None


def interpreted() -> bool:
    """Whether the kernels run under Triton's interpreter (TRITON_INTERPRET=1 when this
    module was imported: triton.jit decides at decoration)."""
    return type(_lse_kernel).__name__ == "InterpretedFunction"


@torch.compiler.disable  # Triton launches and an in-place write: eager (see the docstring)
def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, softcap: float = 0.0,
                  ignore_index: int = -100, inplace: bool = False,
                  block: int = BLOCK) -> torch.Tensor:
    """F.cross_entropy(softcap(logits), targets, ignore_index=ignore_index) (the mean over
    counted rows, fp32), with softcap(z) = cap * tanh(z / cap) when `softcap` is not 0.
    logits: (N, V), any float dtype (fp32 only under the interpreter); targets: (N,).
    `inplace`: the backward writes the gradient over the logits (their version is bumped),
    for a caller that never reads them again."""
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"cross_entropy takes logits (N, V) and targets (N,), got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    if logits.device.type != "cuda" and not interpreted():
        raise ValueError(f"the fused cross-entropy's kernels run on CUDA, and these logits are "
                         f"on {logits.device.type} (on a CPU only under TRITON_INTERPRET=1)")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    return _FusedCrossEntropy.apply(logits, targets.contiguous(), float(softcap), int(ignore_index),
                                    bool(inplace), int(block))
