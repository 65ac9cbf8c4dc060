"""The whole logits' cross-entropy as Triton kernels for CUDA (--loss-kernel fused): the
mean over rows of cross_entropy(softcap(logits), targets), as F.cross_entropy computes it,
and its gradient with respect to the logits, without a second logits-sized buffer and
without an fp32 copy of the logits.

The head's matmul stays cuBLAS's (F.linear in GPT.loss, under autocast); these kernels
take its (N, V) logits in their own dtype (bf16 on the GPU), do all of their arithmetic
in fp32, and write the gradient back in the logits' dtype, as autocast's F.cross_entropy
path rounds it. One program per row, the row in blocks of BLOCK columns, in one of two
modes:

- the backward mode (what --loss-kernel fused runs): the forward (_lse_kernel) reads each
  logit once, an online softmax (the block's max, the running sum rescaled whenever the
  max grows) giving the row's loss and log-sum-exp (4 bytes a row kept); the backward
  (_grad_kernel) reads each logit again and writes (softmax - one-hot) x (the soft cap's
  slope) x grad_output / (rows counted), over the logits where the caller says nothing
  else reads them (GPT.loss does). Each logit read twice and written once: 3 logits'
  worth of traffic, as inductor's compiled loss makes.
- the forward mode (llm.c's fused classifier; `expected_grad`): one kernel
  (_loss_grad_kernel) reads a row for its log-sum-exp, then reads it again, from L2 (a
  row is 100 KB in bf16; FORWARD_LAUNCH keeps the rows in flight within it), and writes
  its gradient, for the incoming gradient the caller expects (the trainer's is 1 /
  accumulation steps, known before the forward): each logit read once and written once
  from memory, 2 logits' worth. The backward (_rescale_kernel)
  reads two scalars on the device, no host sync: the incoming gradient and the one
  expected; only where they differ (the first call of a loop, GradScaler's scale moving
  in fp16) does it read and write the gradient once more, times their ratio (rounded a
  second time then: within 3 fp32 roundings of the backward mode's, in tests). The
  gradient exists from the forward on: in place, the logits are gone once it returns.

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
logits are 6.6 GB; the backward mode and inductor's compiled loss over the whole logits
(the CUDA default) move 19.8 GB a micro-batch, the forward mode 13.2, two micro-batches a
step at 2^17 tokens. The profile of benchmarks/gpu/2026-11-27-h100 (5 micro-batches in
its trace) has inductor's loss as an online-softmax reduction in the forward, 4.63 ms a
micro-batch (1.4 TB/s), and one kernel reading the logits and writing their gradient in
the backward, 4.82 ms (2.7 TB/s, near what an H100 moves): 9.45 ms a micro-batch, 7.2% of
the step's kernel time. PREDICTED for an H100 (not measured), at 2.8 TB/s: the backward
mode 7.1 ms a micro-batch (its forward as fast as the backward), 4.7 ms a step off the
266 ms step (1.8%) if the graph break below costs nothing else; the forward mode 4.7 ms a
micro-batch, 9.5 ms a step (3.6%). With the soft cap each logit also takes a sigmoid (an
exp and a reciprocal) in every pass, which may bind the kernels to the special-function
units rather than memory; eagerly, the whole logits' path then also makes an fp32 copy of
the capped logits (13 GB a micro-batch), which this one never does. `python -m gpt.bench
gpu loss-kernels` measures the modes against the compiled loss, with and without the cap
(its cell loss-bench, gpt/bench/gpu/loss_bench.py), and the backward mode in the trainer.

torch.compile: cross_entropy() is a graph break (torch.compiler.disable, as
gpt/model/loss_kernels.py's library kernels are). The gradient is written over the logits,
an output of the compiled graph that no compiled code reads afterwards; registered as a
custom op that mutates its input, functionalization would copy the logits first,
which is the buffer this saves. The compiled graph ends at the head's matmul; the
kernels run eagerly between it and the compiled backward.

Triton is optional: this module imports it, and gpt/model/loss_kernels.py imports this module
only when --loss-kernel fused runs (CUDA only; loss_kernels.check refuses it elsewhere).
On a CPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1, fp32 only), which
is how tests/model/test_fused_ce.py checks them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class Launch:
    """How a mode's kernels are launched: one program a row, `block` columns a step, `warps`
    warps a program; `l2` (the forward mode's kernel): its second pass reads the row from
    its end, where its first pass ended (the blocks likeliest still in L2), with cache
    hints: the first pass's loads kept in L2 (evict_last), the second's let go first, the
    gradient written with streaming stores (.cs: nothing reads it before the head's
    backward, after every row is done). Any block works: a row's last block is masked."""

    block: int
    warps: int
    l2: bool = False

    @property
    def name(self) -> str:
        return f"{self.warps}w-{self.block}{'-l2' if self.l2 else ''}"


# The backward mode's kernels each read a row once (nothing to keep in L2 between them): on
# an H100 a row of 50,304 is 13 blocks (the last one 1,152 wide), 16 fp32 values a thread.
BACKWARD_LAUNCH = Launch(4096, 8)
# The forward mode's kernel reads each row twice and counts on the second read coming from
# L2 (50 MB on an H100). Rows in flight: the SMs (132) times the programs an SM holds: at
# most 64 warps' worth, and its 65,536 registers' (ptxas gives these kernels about 32 a
# thread for sm_90a, so the warps are the limit). At 8 warps that is 8 programs, 1,056 rows
# of 100.6 KB in bf16: 106 MB, twice L2, so a row read front to back twice is gone from L2
# before its second read (a cache model gives no hits). At 32 warps (BLOCK 8,192: one
# 16-byte load a thread a step) 2 programs: 264 rows, 26.6 MB, within L2; the l2 order
# (llm.c's fused classifier's) helps at any size. tests/model/test_fused_ce.py compiles every
# launch for sm_90a and checks these counts. PREDICTED, not measured: the GPU acceptance's
# loss-bench cell sweeps LAUNCHES (gpt/bench/gpu/loss_bench.py) and names the fastest
# launch that is right, which FORWARD_LAUNCH then follows.
LAUNCHES = {launch.name: launch for launch in (
    Launch(4096, 8), Launch(4096, 8, l2=True), Launch(8192, 16, l2=True), Launch(8192, 32),
    Launch(8192, 32, l2=True))}
FORWARD_LAUNCH = LAUNCHES["32w-8192-l2"]


@triton.jit
def _capped(x, softcap, SOFTCAP: tl.constexpr):
    """x soft-capped (cap * tanh(x / cap), written with a sigmoid), and the sigmoid, in fp32."""
    if SOFTCAP:
        s = tl.sigmoid(x * (2.0 / softcap))
        return s * (2.0 * softcap) - softcap, s
    return x, x


@triton.jit
def _row_loss(x_row, t_ptr, row, loss_ptr, V, ignore_index, softcap, SOFTCAP: tl.constexpr,
              BLOCK: tl.constexpr, L2: tl.constexpr):
    """One row's pass for its loss: its log-sum-exp by an online softmax (the block's max, the
    running sum rescaled whenever the max grows), each logit read once (kept in L2 with
    L2), then the target's logit on its own; stores the row's loss, returns (log-sum-exp,
    target)."""
    offs = tl.arange(0, BLOCK)
    m = float("-inf")  # the running max and the sum of exp(z - m) so far
    d = 0.0
    for start in range(0, V, BLOCK):
        cols = start + offs
        inside = cols < V
        if L2:  # read again by this program's second pass
            x = tl.load(x_row + cols, mask=inside, other=0.0, eviction_policy="evict_last")
        else:
            x = tl.load(x_row + cols, mask=inside, other=0.0)
        z, _ = _capped(x.to(tl.float32), softcap, SOFTCAP)
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
    return lse, target


@triton.jit
def _row_grad(x_row, g_row, target, lse, scale, V, ignore_index, softcap, SOFTCAP: tl.constexpr,
              BLOCK: tl.constexpr, L2: tl.constexpr):
    """One row's pass for its gradient: each logit read and (softmax - one-hot) x (the soft
    cap's slope) x scale written, in the gradient's dtype; g_row may be x_row, each block
    read before it is written. L2: the blocks from the row's end, with Launch's hints.
    Each entry is computed on its own: the order changes no value."""
    counted = target != ignore_index
    offs = tl.arange(0, BLOCK)
    last = tl.cdiv(V, BLOCK) - 1
    for i in range(0, last + 1):
        if L2:
            start = (last - i) * BLOCK
        else:
            start = i * BLOCK
        cols = start + offs
        inside = cols < V
        if L2:  # its last read
            x = tl.load(x_row + cols, mask=inside, other=0.0, eviction_policy="evict_first")
        else:
            x = tl.load(x_row + cols, mask=inside, other=0.0)
        z, s = _capped(x.to(tl.float32), softcap, SOFTCAP)
        g = tl.exp(z - lse) - tl.where(cols == target, 1.0, 0.0)
        if SOFTCAP:  # d(cap tanh(x / cap))/dx = 1 - tanh^2 = 4 s (1 - s)
            g = g * (4.0 * s * (1.0 - s))
        # an ignored row: zero, also when no row counts (scale is then inf)
        g = tl.where(counted, g * scale, 0.0).to(g_row.dtype.element_ty)
        if L2:
            tl.store(g_row + cols, g, mask=inside, cache_modifier=".cs")
        else:
            tl.store(g_row + cols, g, mask=inside)


@triton.jit
def _lse_kernel(x_ptr, x_stride, t_ptr, loss_ptr, lse_ptr, V, ignore_index, softcap,
                SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    """The forward of the backward mode: each row's loss and log-sum-exp."""
    row = tl.program_id(0).to(tl.int64)  # int64: N x V passes 2^31 at GPT-2's sizes
    lse, _ = _row_loss(x_ptr + row * x_stride, t_ptr, row, loss_ptr, V, ignore_index, softcap,
                       SOFTCAP, BLOCK, False)
    tl.store(lse_ptr + row, lse)


@triton.jit
def _grad_kernel(x_ptr, x_stride, g_ptr, g_stride, t_ptr, lse_ptr, scale_ptr, V, ignore_index,
                 softcap, SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    """The backward of the backward mode: each row's gradient from its saved log-sum-exp."""
    row = tl.program_id(0).to(tl.int64)
    _row_grad(x_ptr + row * x_stride, g_ptr + row * g_stride, tl.load(t_ptr + row),
              tl.load(lse_ptr + row), tl.load(scale_ptr), V, ignore_index, softcap, SOFTCAP, BLOCK,
              False)


@triton.jit
def _loss_grad_kernel(x_ptr, x_stride, g_ptr, g_stride, t_ptr, loss_ptr, scale_ptr, V,
                      ignore_index, softcap, SOFTCAP: tl.constexpr, BLOCK: tl.constexpr,
                      L2: tl.constexpr):
    """The forward mode's one kernel: each row's loss, then its gradient for the incoming
    gradient expected (scale_ptr: expected / rows counted), the row read again while it is
    in L2 (100 KB in bf16 at GPT-2's vocabulary: see FORWARD_LAUNCH)."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    lse, target = _row_loss(x_row, t_ptr, row, loss_ptr, V, ignore_index, softcap, SOFTCAP, BLOCK,
                            L2)
    _row_grad(x_row, g_ptr + row * g_stride, target, lse, tl.load(scale_ptr), V, ignore_index,
              softcap, SOFTCAP, BLOCK, L2)


@triton.jit
def _rescale_kernel(g_ptr, g_stride, got_ptr, want_ptr, V, BLOCK: tl.constexpr):
    """The forward mode's backward: nothing but two scalars read, unless the incoming
    gradient (got) is not the one the forward wrote the gradient for (want); then each
    row's gradient times got / want."""
    got = tl.load(got_ptr)
    want = tl.load(want_ptr)
    if got != want:
        row = tl.program_id(0).to(tl.int64)
        g_row = g_ptr + row * g_stride
        ratio = got / want
        offs = tl.arange(0, BLOCK)
        for start in range(0, V, BLOCK):
            cols = start + offs
            inside = cols < V
            g = tl.load(g_row + cols, mask=inside, other=0.0).to(tl.float32) * ratio
            tl.store(g_row + cols, g.to(g_ptr.dtype.element_ty), mask=inside)


class _FusedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, softcap: float,
                ignore_index: int, inplace: bool, launch: Launch,
                expected: torch.Tensor | None, grad_mode: bool) -> torch.Tensor:
        n, v = logits.shape
        losses = torch.empty(n, dtype=torch.float32, device=logits.device)
        counted = (targets != ignore_index).sum()  # on the device: no sync
        common = dict(SOFTCAP=bool(softcap), BLOCK=launch.block, num_warps=launch.warps)
        ctx.softcap, ctx.ignore_index, ctx.inplace, ctx.launch = softcap, ignore_index, inplace, launch
        # a gradient is wanted only where autograd will record this call: the logits require
        # it (needs_input_grad says no more) and grad mode was on at the call (inside
        # forward it is always off), so under torch.no_grad nothing is written
        ctx.expected = expected if ctx.needs_input_grad[0] and grad_mode else None
        if ctx.expected is not None:  # the forward mode, where a gradient is wanted
            used = expected.detach().float().reshape(1).clone()  # as this forward wrote it
            grad = logits if inplace else torch.empty_like(logits)
            if n:
                _loss_grad_kernel[(n,)](logits, logits.stride(0), grad, grad.stride(0), targets,
                                        losses, used / counted, v, ignore_index, softcap,
                                        L2=launch.l2, **common)
            if inplace:
                # the logits now hold their gradient: a backward that saved them fails
                # loudly on the changed version instead of reading the gradient as logits
                torch.autograd.graph.increment_version(logits)
            ctx.save_for_backward(grad, used)
        else:
            lse = torch.empty_like(losses)
            if n:
                _lse_kernel[(n,)](logits, logits.stride(0), targets, losses, lse, v, ignore_index,
                                  softcap, **common)
            ctx.save_for_backward(logits, targets, lse, counted)
        return losses.sum() / counted  # 0 / 0 = NaN with every row ignored, as F.cross_entropy

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[Any, ...]:
        if ctx.expected is not None:
            grad, used = ctx.saved_tensors
            got = grad_loss.detach().float().reshape(1)
            if grad.shape[0]:
                _rescale_kernel[(grad.shape[0],)](grad, grad.stride(0), got, used, grad.shape[1],
                                                  BLOCK=ctx.launch.block,
                                                  num_warps=ctx.launch.warps)
            # the saved gradient now holds this backward's scale, no longer `used`'s: a second
            # backward (retain_graph) would rescale it again, so it is refused, as the
            # backward mode's in place is, by the version check of the saved tensors
            torch.autograd.graph.increment_version(grad)
            # the next forward expects what this backward got; not a zero (a forward that
            # wrote zeros could not be rescaled) nor a NaN or inf: those keep the last one
            ctx.expected.copy_(torch.where((got != 0) & got.isfinite(), got, ctx.expected))
            return grad, None, None, None, None, None, None, None
        logits, targets, lse, counted = ctx.saved_tensors
        n, v = logits.shape
        scale = (grad_loss.float() / counted).reshape(1)
        grad = logits if ctx.inplace else torch.empty_like(logits)
        if n:
            _grad_kernel[(n,)](logits, logits.stride(0), grad, grad.stride(0), targets, lse, scale,
                               v, ctx.ignore_index, ctx.softcap, SOFTCAP=bool(ctx.softcap),
                               BLOCK=ctx.launch.block, num_warps=ctx.launch.warps)
        if ctx.inplace:
            torch.autograd.graph.increment_version(logits)  # as in the forward mode's forward
        return grad, None, None, None, None, None, None, None


def interpreted() -> bool:
    """Whether the kernels run under Triton's interpreter (TRITON_INTERPRET=1 when this
    module was imported: triton.jit decides at decoration)."""
    return type(_lse_kernel).__name__ == "InterpretedFunction"


@torch.compiler.disable  # Triton launches and an in-place write: eager (see the docstring)
def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, softcap: float = 0.0,
                  ignore_index: int = -100, inplace: bool = False, block: int | None = None,
                  expected_grad: torch.Tensor | None = None,
                  launch: Launch | None = None) -> torch.Tensor:
    """F.cross_entropy(softcap(logits), targets, ignore_index=ignore_index) (the mean over
    counted rows, fp32), with softcap(z) = cap * tanh(z / cap) when `softcap` is not 0.
    logits: (N, V), any float dtype (fp32 only under the interpreter); targets: (N,).
    `inplace`: the gradient is written over the logits (their version is bumped), for a
    caller that never reads them again.
    `expected_grad`: the forward mode (see the module's docstring), a one-element float
    tensor on the logits' device: the loss's incoming gradient the caller expects (1 / the
    accumulation steps, say). Where a gradient is wanted, the forward writes it, for that
    incoming gradient (over the logits, with `inplace`: from the forward on they are gone);
    the backward checks on the device that the incoming gradient is that one, rescales
    the gradient where it is not, and stores it in `expected_grad`, the next call's
    expectation. A gradient is wanted where grad mode is on and the logits require one:
    under torch.no_grad nothing is written. A second backward through one call
    (retain_graph) is refused, as the backward mode's with `inplace` is: its gradient was
    rescaled in place by the first. None: the backward mode, the gradient written in the
    backward.
    `launch`: the mode's kernels' (default: FORWARD_LAUNCH or BACKWARD_LAUNCH); `block`, if
    given, its columns a step."""
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"cross_entropy takes logits (N, V) and targets (N,), got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    if logits.device.type != "cuda" and not interpreted():
        raise ValueError(f"the fused cross-entropy's kernels run on CUDA, and these logits are "
                         f"on {logits.device.type} (on a CPU only under TRITON_INTERPRET=1)")
    if expected_grad is not None and (expected_grad.numel() != 1
                                      or expected_grad.device != logits.device
                                      or not expected_grad.is_floating_point()):
        raise ValueError(f"expected_grad must be one float on the logits' device "
                         f"({logits.device}), got {expected_grad.numel()} "
                         f"{expected_grad.dtype} on {expected_grad.device}")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    launch = launch or (BACKWARD_LAUNCH if expected_grad is None else FORWARD_LAUNCH)
    if block is not None:
        launch = replace(launch, block=int(block))
    return _FusedCrossEntropy.apply(logits, targets.contiguous(), float(softcap), int(ignore_index),
                                    bool(inplace), launch, expected_grad, torch.is_grad_enabled())


def expected_grad(device: torch.device | str, value: float = 1.0) -> torch.Tensor:
    """A forward mode's expectation of the incoming gradient (`expected_grad`), to pass to
    every call of a loop: each backward leaves in it what it got, so every call after the
    first finds the gradient it wrote right (the trainer's 1 / accumulation steps, times
    GradScaler's scale in fp16, change seldom)."""
    return torch.full((1,), float(value), dtype=torch.float32, device=device)
