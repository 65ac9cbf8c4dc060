"""The language-model head and its cross-entropy, fused and computed a chunk of rows at a
time, so that neither the forward nor the backward pass ever holds the whole (N, V)
logits, their fp32 copy or their gradient.

For GPT-2's 50,304-wide vocabulary those three are most of a small model's step memory
(at micro-batch 64 x 1024 they are tens of GiB). Here each chunk's logits are made, turned
into that chunk's loss and its gradient with respect to the logits, and pushed through
the head's two backward matmuls at once: the gradients of the hidden states and of the
head weight are accumulated chunk by chunk during the forward pass and only scaled by
the incoming gradient in the backward pass. So the head's matmuls are done once each, as
in the unfused path (no recomputation), and what outlives a chunk is (N, C) and (V, C).

The per-chunk gradient is that of the summed loss (softmax - one-hot, in [-1, 1]), not
the mean's: it is cast to the autocast dtype for the matmuls, and dividing by N first
would push fp16's small probabilities below its range (GradScaler's scale is only
applied later, in the backward pass). The division happens in fp32 afterwards.

The chunk size, what the numerics match, and why the head weight's gradient is
accumulated in fp32: see linear_cross_entropy() and chunk_rows().
"""

from __future__ import annotations

import math
from typing import Any

import torch


# A chunk's fp32 logits are kept near the size of the hidden states they come from (as
# Liger Kernel's fused loss does), but never below this many elements: on a 2-core CPU
# the head's matmuls over 128-256 rows of GPT-2's vocabulary ran 1.5-3.5x slower per row
# than over 1,024 or more (2^23 elements, 167 rows, made a step slower than the unfused one).
MIN_CHUNK_ELEMENTS = 2**25  # 128 MiB of fp32 logits: 667 rows of 50,304


def chunk_rows(n_rows: int, n_embd: int, vocab: int) -> int:
    """Rows per chunk: the chunk's logits (rows x vocab) hold about as many elements as the
    hidden states (n_rows x n_embd), and at least MIN_CHUNK_ELEMENTS (or all the rows);
    then evened out over the chunks that makes."""
    target = max(n_rows * n_embd, MIN_CHUNK_ELEMENTS)
    rows = max(1, min(n_rows, math.ceil(target / vocab)))
    return math.ceil(n_rows / math.ceil(n_rows / rows))  # equal chunks: no small last one


def _chunk_loss(z: torch.Tensor, targets: torch.Tensor, softcap: float,
                grads: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The summed loss of a chunk's fp32 logits z (rows, V), before the cap, and (if
    `grads`) its gradient with respect to them, made in z's own memory: softmax - one-hot,
    times the cap's derivative. Every step is in place (torch.logsumexp would allocate a
    second (rows, V) buffer, unseen by the memory planner's fake tensors)."""
    slope = None
    if softcap:  # in fp32, as GPT.logits does
        # cap * tanh(u / cap) as 2 cap * sigmoid(2u / cap) - cap: on CPU torch's tanh took
        # 71 ms over a 667 x 50,304 chunk, sigmoid 7 ms (one thread); the logits move by
        # ~1e-6 at most, far below what the loss can see
        s = z.mul_(2.0 / softcap).sigmoid_()
        # d(cap * tanh(u / cap))/du = 1 - tanh^2 = 4 s (1 - s); 1 - s is exact for s >= 0.5
        slope = (1.0 - s).mul_(s).mul_(4.0) if grads else None
        z = s.mul_(2.0 * softcap).sub_(softcap)
    picked = z.gather(1, targets.unsqueeze(1)).squeeze(1)
    top = z.amax(dim=1, keepdim=True)
    e = z.sub_(top).exp_()
    total = e.sum(dim=1, keepdim=True)
    loss = (top + total.log()).squeeze(1).sub_(picked).sum()
    if not grads:
        return loss, None
    g = e.div_(total)
    g.scatter_add_(1, targets.unsqueeze(1), torch.full_like(picked, -1.0).unsqueeze(1))
    return loss, (g.mul_(slope) if slope is not None else g)


def _chunks(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, softcap: float,
            compute_dtype: torch.dtype, rows: int,
            need_grads: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The summed loss over every chunk of `rows` rows, and (if `need_grads`, else empty
    tensors) the gradients of that sum with respect to h and to weight (fp32)."""
    w = weight.to(compute_dtype)  # what autocast's F.linear would cast it to
    loss_sum = torch.zeros((), dtype=torch.float32, device=h.device)
    grad_h = torch.empty_like(h) if need_grads else h.new_empty(0)
    # fp32 whatever the compute dtype: the sum over every chunk's contribution is where
    # rounding would accumulate (the unfused path sums inside one matmul)
    grad_w = (torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if need_grads
              else h.new_empty(0, dtype=torch.float32))
    for start in range(0, h.size(0), rows):
        hc = h[start:start + rows].to(compute_dtype)
        loss, g = _chunk_loss((hc @ w.t()).float(), targets[start:start + rows], softcap,
                              need_grads)
        loss_sum = loss_sum + loss
        if g is not None:
            g = g.to(compute_dtype)
            grad_h[start:start + rows] = g @ w
            grad_w += g.t() @ hc
    return loss_sum, grad_h, grad_w


# What torch.compile sees of the loop: one op, run eagerly inside the compiled graph.
# Traced, the loop is unrolled and inductor is free to reorder it: on CUDA (H200, GPT-2
# 124M, micro-batch 64) it kept about every chunk's gradient alive at once, a peak 5.7 GiB
# above the plan and no lower than the whole logits' (benchmarks/gpu/2026-11-26-h200,
# the loss kernels' stage); on CPU, 3.21 GiB of peak RSS against 0.58 eagerly
# (benchmarks/chunked_loss/compiled-rss.json).
_opaque_chunks = torch.library.custom_op("gpt2_trainer::linear_cross_entropy_chunks",
                                         _chunks, mutates_args=())


@_opaque_chunks.register_fake
def _chunks_fake(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, softcap: float,
                 compute_dtype: torch.dtype, rows: int,
                 need_grads: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    loss = h.new_empty((), dtype=torch.float32)
    if not need_grads:
        return loss, h.new_empty(0), h.new_empty(0, dtype=torch.float32)
    return loss, torch.empty_like(h), weight.new_empty(weight.shape, dtype=torch.float32)


class _LinearCrossEntropy(torch.autograd.Function):
    """mean over rows of cross_entropy(softcap(h @ weight.T), targets), chunk by chunk."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                softcap: float, compute_dtype: torch.dtype, rows: int,
                need_grads: bool) -> torch.Tensor:
        # Under torch.compile the loop is one opaque op (see _opaque_chunks); eagerly, and
        # under the memory planner's fake tensors, it runs as written, so every chunk's
        # buffers are seen.
        run = _opaque_chunks if torch.compiler.is_compiling() else _chunks
        loss_sum, grad_h, grad_w = run(h, weight, targets, softcap, compute_dtype, rows, need_grads)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.n, ctx.h_dtype, ctx.w_dtype = h.size(0), h.dtype, weight.dtype
        return loss_sum / h.size(0)

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[Any, ...]:
        grad_h, grad_w = ctx.saved_tensors
        scale = grad_loss.float() / ctx.n
        gh = (grad_h * scale).to(ctx.h_dtype) if ctx.needs_input_grad[0] else None
        gw = (grad_w * scale).to(ctx.w_dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None, None, None, None


def linear_dtype(h: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype F.linear(h, weight) would compute in: autocast's where it is on."""
    if torch.is_autocast_enabled(h.device.type):
        return torch.get_autocast_dtype(h.device.type)
    return torch.promote_types(h.dtype, weight.dtype)


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         softcap: float = 0.0, rows: int | None = None) -> torch.Tensor:
    """The mean cross-entropy of softcap(h @ weight.T) against targets, as
    F.cross_entropy(F.linear(h, weight), targets) computes it, a chunk of `rows` rows at a
    time (default: chunk_rows()). h: (..., C); weight: (V, C); targets: h's leading shape,
    any layout, every target counted (no ignore index: the trainer has no padding).

    Under autocast the matmuls run in autocast's dtype and the loss in fp32, as the
    unfused path does. In fp32 loss and gradients equal the unfused path's to rounding
    (tests/model/test_chunked_ce.py); in bf16 the head weight's gradient is summed over chunks
    in fp32 from per-chunk bf16 matmuls, so it can differ from the unfused path's single
    bf16 matmul by about bf16's rounding (2^-8 relative)."""
    h2 = h.reshape(-1, h.size(-1))
    t = targets.reshape(-1)
    dtype = linear_dtype(h, weight)
    if rows is None:
        rows = chunk_rows(h2.size(0), h2.size(1), weight.size(0))
    # Under no_grad (validation) the inputs may still require grad: no gradient buffers then.
    need_grads = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    # The function runs outside autocast: it casts exactly where F.linear would have.
    with torch.autocast(h.device.type, enabled=False):
        return _LinearCrossEntropy.apply(h2, weight, t, float(softcap), dtype, rows, need_grads)
