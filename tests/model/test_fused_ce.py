"""--loss-kernel fused: the whole logits' cross-entropy in Triton (gpt/model/fused_ce.py).

On CPU, where Triton is installed: the kernels under Triton's interpreter (fp32 only, in
a worker process of its own: see the interpreted fixture) against F.cross_entropy of the
same logits in float64 (exact next to fp32, so every tolerance below is a bound on the
kernels' own fp32 arithmetic, derived in error_bounds()): odd shapes and block sizes,
large logits, ignored positions, GPT-2's padded vocabulary, the soft cap, an incoming
gradient other than 1, the in-place gradient, GPT.loss's wiring and the model compiled;
and the kernels compiled for an H100 (sm_90) by Triton's own compiler, which needs no GPU.
Planted by hand once, each of these bugs failed them: no max subtracted, no 1/n, the last
block's tail unmasked, the cap's slope left out, ignored rows counted in the mean, the
padded columns masked; in the forward mode (the gradient written in the forward, for the
incoming gradient expected), the backward's rescaling left out and a gradient written
where none was wanted. Both modes run every check above against float64, the forward mode
expecting its incoming gradient and expecting another; it is the backward mode's gradient,
bit for bit, when it expects right. Without Triton: the switch's one-line refusals. On a
GPU (-m cuda): bf16 at GPT-2's sizes, and a compiled trainer run.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import math
import multiprocessing
import os
import subprocess
import sys
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

from helpers import QUIET, REPO, TINY, cuda_run_losses, run_cli, write_random_shards

from gpt.core.cli import parse_args
from gpt.core.compat import version_tuple
from gpt.core.config import ModelConfig, TrainConfig
from gpt.core.errors import UserError
from gpt.model import loss_kernels
from gpt.model.transformer import GPT

HERE = Path(__file__).resolve().parent  # this file's folder: its child processes import it

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="Triton is not installed (pip install triton)")

Worker = Callable[..., Any]  # the interpreted fixture: calls a function of this module there
U = 2.0 ** -24  # fp32's unit roundoff: the relative error of one correctly rounded operation


@pytest.fixture(scope="module")
def interpreted() -> Iterator[Worker]:
    """Calls a function of this module in a process of its own under Triton's interpreter.
    TRITON_INTERPRET must be set before triton is first imported (its own library's
    functions, tl.sum, tl.max, tl.sigmoid, are jit functions decorated then), and this
    process may have imported it already (torch.compile's modules do): so one spawned
    worker, started with it set, runs every check; an assertion there fails the test here."""
    # the versions from the packages' metadata: importing Triton here would fix its
    # interpreter setting in this process
    triton, numpy = (version_tuple(importlib.metadata.version(p)) for p in ("triton", "numpy"))
    if triton < (3, 7) and numpy >= (2, 4):
        # Triton 3.5 and 3.6 (torch 2.9's and 2.11's) hand a kernel's int argument to
        # range() as a one-element array, and int() of one is an error from NumPy 2.4 on
        # ("only 0-dimensional arrays can be converted to Python scalars", a deprecation
        # warning before); Triton 3.7 squeezes it first
        pytest.skip(f"Triton {importlib.metadata.version('triton')}'s interpreter cannot run "
                    "kernels under NumPy 2.4 or newer; Triton 3.7 can (pip install -U triton)")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")  # inherited by the worker, started here
        pool = multiprocessing.get_context("spawn").Pool(1)
    try:
        pool.apply(warm)  # its imports (torch, the package, Triton): the fixture's time
        yield lambda fn, *args, **kwargs: pool.apply(in_worker, (fn, args, kwargs))
    finally:
        pool.close()
        pool.join()


def warm() -> None:
    kernels()


def in_worker(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """fn(*args, **kwargs) in the interpreter's worker, a failure of any kind raised back as
    an AssertionError with its traceback: pytest's own outcomes (pytest.raises's "DID NOT
    RAISE", pytest.fail) cannot be pickled, and the pool would wait for them forever."""
    try:
        return fn(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001 -- pytest's outcomes are BaseExceptions
        raise AssertionError(traceback.format_exc()) from None


def kernels() -> Any:
    """gpt.model.fused_ce, in the interpreter's worker."""
    from gpt.model import fused_ce

    assert fused_ce.interpreted(), "TRITON_INTERPRET=1 was not set before triton was imported"
    return fused_ce


def error_bounds(z: torch.Tensor, t: torch.Tensor, block: int, cap: float,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Bounds on the kernels' fp32 errors, per row: on a row's loss, and on each entry of
    its gradient, for the logits z (float64, before the cap).

    The log-sum-exp (_lse_kernel): each exp is within 4u of exact (numpy's float32 exp
    under the interpreter, ex2.approx times log2 e on a GPU), and its argument z - m is
    rounded, which moves exp(z - m) by u |z - m| exp(z - m): at most u times the row's range
    A relative to the sum, once for the terms and once more, over all blocks, for the
    rescalings by exp(m - m_new) (the max only grows, by A at most in all). A block's sum
    adds at most 16 terms in sequence a lane or accumulator and then log2(block) levels of a
    tree (numpy's pairwise sum; Triton's per-thread sums and shuffles); across the K blocks
    each step rescales, multiplies and adds (6 roundings). So the sum d is within
    u (4 + 2A + 16 + log2(block) + 6K) relative, which is its log's absolute error; log's own
    rounding (4u of |log d| <= log V) and m + log d's (u |lse|) follow. The soft cap's
    sigmoid form (2 cap s - cap, s within 6u) puts each capped logit within 16 cap u of
    cap * tanh(z / cap), which moves the log-sum-exp and the target's logit by as much.

    The gradient (_grad_kernel): p = exp(z - lse) is off by p (e_lse + dz + 4u) plus
    u |z - lse| p <= u / e; p - onehot, the cap's slope 4 s (1 - s) (within 27u, times
    |p - onehot| <= 1), and the scale (grad_output / rows, itself rounded) add a few u. So
    an entry is within |scale| (e_lse + dz + 8u + 27u [cap]) of exact."""
    v = z.size(1)
    capped = cap * torch.tanh(z / cap) if cap else z
    spread = capped.max(1).values - capped.min(1).values
    lse = torch.logsumexp(capped, 1)
    k = math.ceil(v / block)
    dz = 16 * cap * U if cap else 0.0
    e_lse = (U * (4 + 2 * spread + 16 + math.log2(block) + 6 * k)
             + U * (4 * math.log(v) + lse.abs()) + dz)
    picked = capped.gather(1, t.clamp(min=0).unsqueeze(1)).squeeze(1)
    e_loss = e_lse + dz + U * (lse - picked).abs()
    e_grad = abs(scale) * (e_lse + dz + 8 * U + (27 * U if cap else 0.0))
    return e_loss, e_grad


def check_against_reference(x: torch.Tensor, t: torch.Tensor, block: int | None = None,
                            cap: float = 0.0, grad_out: float = 0.37,
                            expected: float | None = None, launch: str | None = None) -> None:
    """The kernels' mean loss and its gradient (times grad_out) against float64's
    F.cross_entropy of the same fp32 logits, within error_bounds(); `block`: the kernels'
    columns a step (default: the launch's); `expected`: the forward mode, expecting that
    incoming gradient (None: the backward mode); `launch`: one of LAUNCHES by name (default:
    the mode's)."""
    fce = kernels()
    how = fce.LAUNCHES[launch] if launch else (
        fce.BACKWARD_LAUNCH if expected is None else fce.FORWARD_LAUNCH)
    block = block or how.block
    a = x.clone().requires_grad_()
    guess = None if expected is None else fce.expected_grad("cpu", expected)
    loss = fce.cross_entropy(a, t, cap, block=block, expected_grad=guess, launch=how)
    loss.backward(torch.tensor(grad_out))
    if guess is not None:
        assert guess.item() == pytest.approx(grad_out, rel=1e-7)  # the next call's expectation
    z = x.double().requires_grad_()
    ref = F.cross_entropy(cap * torch.tanh(z / cap) if cap else z, t)
    ref.backward(torch.tensor(grad_out, dtype=torch.float64))
    assert loss.dtype == torch.float32 and a.grad.dtype == torch.float32
    counted = t != -100
    if not counted.any():  # F.cross_entropy's mean over no rows: NaN, and a zero gradient
        assert loss.isnan() and ref.isnan() and (a.grad == 0).all() and (z.grad == 0).all()
        return
    n = int(counted.sum())
    e_loss, e_grad = error_bounds(x.double(), t, block, cap, grad_out / n)
    if expected is not None and expected != grad_out:
        # the forward wrote each entry for `expected` and the backward rescaled it by
        # grad_out / expected: that ratio's rounding, the product's, and the other scale's
        # rounding, each relative to an entry of at most |scale| (|p - onehot| x slope <= 1)
        e_grad = e_grad + 4 * U * abs(grad_out / n)
    # the mean: each counted row within its bound, then torch's sum of the rows (n - 1
    # additions of terms up to the largest row's loss) and the division, rounded
    rows = torch.where(counted, e_loss, torch.zeros_like(e_loss))
    bound = rows.max() + U * (n + 1) * ref.abs()
    assert abs(loss.double() - ref) <= bound, (loss.item(), ref.item(), bound.item())
    err = (a.grad.double() - z.grad).abs()
    assert (err <= e_grad.unsqueeze(1)).all(), (err.max().item(), e_grad.max().item())
    assert (a.grad[~counted] == 0).all()  # ignored rows: exactly nothing


def logits(n: int, v: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(n, v, generator=torch.Generator().manual_seed(seed)) * scale


# ---------------------------------------------------------------------------------------
# the kernels, under Triton's interpreter


# gpt/model/fused_ce.py's LAUNCHES, by name (importing it here would fix Triton's interpreter
# setting in this process: see the interpreted fixture)
LAUNCH_NAMES = ("8w-4096", "8w-4096-l2", "16w-8192-l2", "32w-8192", "32w-8192-l2")
# the backward mode; the forward mode expecting the incoming gradient it gets (the
# checks' 0.37), and expecting another (1.0, what expected_grad() starts from: rescaled)
MODES = {"backward": None, "forward": 0.37, "forward, rescaled": 1.0}


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n, v, block", [(7, 33, 16), (7, 33, 8), (5, 33, 64), (3, 1, 16),
                                         (6, 100, 32)])
def test_odd_shapes_and_blocks_that_do_not_divide_the_vocabulary(interpreted: Worker, n: int,
                                                                v: int, block: int,
                                                                mode: str) -> None:
    t = torch.randint(0, v, (n,), generator=torch.Generator().manual_seed(n + v))
    interpreted(check_against_reference, logits(n, v, seed=v), t, block, expected=MODES[mode])


@needs_triton
def test_large_logits_are_taken_relative_to_their_row_max(interpreted: Worker) -> None:
    """exp(z) overflows fp32 past z = 88.7: rows of logits around +-100 and one around
    1,000 leave no room for a kernel that skips the max."""
    x = logits(6, 50, seed=2, scale=40.0)
    x[0] += 100.0
    x[1] -= 100.0
    x[2] = x[2] * 10 + 1000.0
    interpreted(check_against_reference, x, torch.tensor([0, 3, 49, 7, 8, 9]), block=16)


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ignored", ["some", "all but one", "all"])
def test_ignored_positions_count_for_nothing(interpreted: Worker, ignored: str, mode: str) -> None:
    t = torch.randint(0, 40, (9,), generator=torch.Generator().manual_seed(4))
    if ignored == "some":
        t[[0, 4, 5]] = -100
    elif ignored == "all but one":
        t[torch.arange(9) != 6] = -100
    else:
        t[:] = -100
    interpreted(check_against_reference, logits(9, 40, seed=5), t, block=16, expected=MODES[mode])


@needs_triton
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cap", [5.0, 30.0])
def test_the_soft_cap(interpreted: Worker, cap: float, mode: str) -> None:
    t = torch.randint(0, 33, (7,), generator=torch.Generator().manual_seed(6))
    t[2] = -100
    interpreted(check_against_reference, logits(7, 33, seed=7, scale=6.0), t, block=16, cap=cap,
                expected=MODES[mode])


@needs_triton
@pytest.mark.parametrize("cap, mode", [(0.0, "backward"), (30.0, "backward"), (30.0, "forward")])
def test_gpt2s_padded_vocabulary(interpreted: Worker, cap: float, mode: str) -> None:
    """50,257 token ids in 50,304 columns, as GPT.logits makes them: the padded columns are
    not masked there (their weights learn to keep them improbable), so they take part here
    too, and get a gradient; 50,304 is not a multiple of the kernels' blocks (4,096, 8,192)."""
    x = logits(4, 50304, seed=8)
    x[:, 50257:] += 2.0  # mass the padded columns must be seen to carry
    t = torch.tensor([0, 50256, 17, -100])
    interpreted(check_against_reference, x, t, cap=cap, expected=MODES[mode])


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize("cap", [0.0, 30.0])
def test_every_launch_of_the_forward_mode_computes_the_same_function(interpreted: Worker,
                                                                     cap: float) -> None:
    """Each launch the GPU's loss bench sweeps (the block, and the l2 order: the second
    pass from the row's end with cache hints), at GPT-2's padded vocabulary, against
    float64 within the kernels' bound; and, at one block, the l2 order changes no bit."""
    x = logits(3, 50304, seed=13)
    t = torch.tensor([50303, 5, -100])
    for name in LAUNCH_NAMES:
        interpreted(check_against_reference, x, t, cap=cap, expected=0.37, launch=name)
    interpreted(the_l2_order_changes_no_bit, x, t, cap)


def the_l2_order_changes_no_bit(x: torch.Tensor, t: torch.Tensor, cap: float) -> None:
    fce = kernels()
    assert tuple(fce.LAUNCHES) == LAUNCH_NAMES
    out = []
    for l2 in (False, True):
        z = x.clone().requires_grad_()
        launch = fce.Launch(8192, 32, l2)
        loss = fce.cross_entropy(z, t, cap, expected_grad=fce.expected_grad("cpu", 0.5),
                                 launch=launch)
        loss.backward(torch.tensor(0.5))
        out.append((loss.detach(), z.grad))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


def written_over_the_logits() -> None:
    fce = kernels()
    x, t = logits(5, 33, seed=9), torch.tensor([1, 2, 3, 4, 5])
    apart = x.clone().requires_grad_()
    fce.cross_entropy(apart, t, block=16).backward()  # not asked: a buffer of its own
    assert torch.equal(apart.detach(), x)
    leaf = x.clone().requires_grad_()
    z = leaf * 1.0  # as the head's output: not a leaf, and no other op saved it
    before = z._version
    fce.cross_entropy(z, t, inplace=True, block=16).backward()
    assert z._version > before  # bumped: a backward that saved z would refuse it
    assert torch.equal(z.detach(), apart.grad) and torch.equal(leaf.grad, apart.grad)
    # another op that saved the logits fails loudly instead of reading a gradient as logits
    z = x.clone().requires_grad_() * 1.0
    other = (z ** 2).sum()  # pow keeps z for its backward
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (fce.cross_entropy(z, t, inplace=True, block=16) + 0 * other).backward()


@needs_triton
def test_the_gradient_is_written_over_the_logits_when_asked(interpreted: Worker) -> None:
    interpreted(written_over_the_logits)


def the_forward_mode_is_the_backward_modes_gradient_written_early() -> None:
    """Expecting the incoming gradient it gets, the forward mode's loss and gradient are the
    backward mode's bit for bit (the same arithmetic on each entry, in the same order); the
    gradient is there when the forward returns (over the logits, in place); a call expecting
    another gradient is rescaled by its backward and leaves the one it got as the next
    call's expectation; a forward that wants no gradient writes none."""
    fce = kernels()
    x, t = logits(6, 37, seed=11), torch.tensor([1, 2, -100, 4, 36, 0])
    for cap in (0.0, 15.0):
        a = x.clone().requires_grad_()
        backward = fce.cross_entropy(a, t, cap, block=16)
        backward.backward(torch.tensor(0.25))
        guess = fce.expected_grad("cpu", 0.25)
        z = x.clone().requires_grad_() * 1.0  # as the head's output
        before = z._version
        forward = fce.cross_entropy(z, t, cap, inplace=True, block=16, expected_grad=guess)
        assert z._version > before and torch.equal(z.detach(), a.grad)  # written, in the forward
        forward.backward(torch.tensor(0.25))
        assert torch.equal(forward, backward) and torch.equal(z.detach(), a.grad)
        # expecting 1 (a loop's first call), getting 0.25: rescaled, and 0.25 kept
        guess = fce.expected_grad("cpu")
        b = x.clone().requires_grad_()
        fce.cross_entropy(b, t, cap, block=16, expected_grad=guess).backward(torch.tensor(0.25))
        assert guess.item() == 0.25
        assert torch.allclose(b.grad, a.grad, rtol=4 * U, atol=0)  # see check_against_reference
        c = x.clone().requires_grad_()
        fce.cross_entropy(c, t, cap, block=16, expected_grad=guess).backward(torch.tensor(0.25))
        assert torch.equal(c.grad, a.grad)  # the second call expected right: no second rounding
    # two forwards before their backwards (two losses summed): each checked against what it
    # was written for, not what the other's backward left
    guess = fce.expected_grad("cpu", 0.5)
    d, e = x.clone().requires_grad_(), x.clone().requires_grad_()
    (fce.cross_entropy(d, t, block=16, expected_grad=guess)
     + 3 * fce.cross_entropy(e, t, block=16, expected_grad=guess)).backward()
    ref = x.clone().requires_grad_()
    fce.cross_entropy(ref, t, block=16).backward()
    assert torch.allclose(d.grad, ref.grad, rtol=4 * U, atol=0)
    assert torch.allclose(e.grad, 3 * ref.grad, rtol=4 * U, atol=0)
    # a zero incoming gradient: a zero gradient, and the expectation kept (a forward that
    # wrote its gradient times zero could not be rescaled by the next backward)
    guess = fce.expected_grad("cpu", 0.25)
    f = x.clone().requires_grad_()
    fce.cross_entropy(f, t, block=16, expected_grad=guess).backward(torch.tensor(0.0))
    assert (f.grad == 0).all() and guess.item() == 0.25
    g, h = x.clone().requires_grad_(), x.clone().requires_grad_()
    fce.cross_entropy(g, t, block=16, expected_grad=guess).backward(torch.tensor(0.25))
    fce.cross_entropy(h, t, block=16).backward(torch.tensor(0.25))
    assert torch.equal(g.grad, h.grad)  # written for 0.25, as expected: no rescaling
    # no gradient wanted (validation): nothing written over the logits
    y = x.clone()
    with torch.no_grad():
        loss = fce.cross_entropy(y, t, inplace=True, block=16, expected_grad=guess)
    assert torch.equal(y, x)
    assert torch.equal(loss, fce.cross_entropy(x.clone(), t, block=16).detach())
    with pytest.raises(ValueError, match="expected_grad must be one float on the logits' device"):
        fce.cross_entropy(x.clone(), t, expected_grad=torch.ones(2))


@needs_triton
def test_the_forward_mode_writes_the_backward_modes_gradient_early(interpreted: Worker) -> None:
    interpreted(the_forward_mode_is_the_backward_modes_gradient_written_early)


def the_forward_modes_edge_cases() -> None:
    """A second backward through one call (retain_graph) is refused, whether the first
    rescaled the gradient or not (after a rescaling, a second would scale it again: a
    quarter of the gradient where half was asked); under torch.no_grad, logits that require
    a gradient (a leaf, say) are not written over, and nothing is expected."""
    fce = kernels()
    x, t = logits(5, 33, seed=12), torch.tensor([1, 2, 3, -100, 32])
    for inplace in (False, True):
        for expected in (0.5, 1.0):  # expecting right, and a loop's first call
            guess = fce.expected_grad("cpu", expected)
            z = x.clone().requires_grad_() * 1.0
            loss = fce.cross_entropy(z, t, inplace=inplace, block=16, expected_grad=guess)
            loss.backward(torch.tensor(0.5), retain_graph=True)
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                loss.backward(torch.tensor(0.5))
    for inplace in (False, True):
        leaf = x.clone().requires_grad_()
        guess = fce.expected_grad("cpu", 0.5)
        with torch.no_grad():
            loss = fce.cross_entropy(leaf, t, inplace=inplace, block=16, expected_grad=guess)
        assert torch.equal(leaf.detach(), x) and leaf.grad is None and leaf._version == 0
        assert torch.equal(loss, fce.cross_entropy(x.clone(), t, block=16))
        assert guess.item() == 0.5


@needs_triton
def test_the_forward_mode_refuses_a_second_backward_and_writes_nothing_without_grad(
        interpreted: Worker) -> None:
    interpreted(the_forward_modes_edge_cases)


def gpt_loss_is_the_kernels_on_the_heads_logits(cap: float) -> None:
    fce = kernels()
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=97, block_size=16,
                            logit_softcap=cap))
    idx, targets = torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16))
    x = model.transformer.wte(idx).detach() + 1.0  # the last block's output, as GPT.loss gets it
    model.loss_kernel = "fused"
    fused = model.loss(x, targets)
    fused.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    assert "lm_head.weight" in grads or "transformer.wte.weight" in grads
    model.zero_grad()
    head = model.lm_head(model.transformer.ln_f(x))
    direct = fce.cross_entropy(head.reshape(-1, 97), targets.reshape(-1), cap)
    direct.backward()
    assert torch.equal(fused, direct)
    for name, p in model.named_parameters():
        assert (p.grad is None) == (name not in grads), name
        assert p.grad is None or torch.equal(grads[name], p.grad), name
    model.loss_kernel = "ours"  # chunked_loss is off: the whole logits and F.cross_entropy
    with torch.no_grad():
        whole = model.loss(x, targets)
    e_loss, _ = error_bounds(head.detach().double().reshape(-1, 97), targets.reshape(-1),
                             fce.BACKWARD_LAUNCH.block, cap, 1.0)
    # F.cross_entropy's fp32 has errors of the same kinds, within the same bound (its sums
    # are shorter), and each side's mean of 32 rows adds 33u of it
    assert abs(fused.item() - whole.item()) <= 2 * (e_loss.max().item() + 33 * U * whole.item())


@needs_triton
@pytest.mark.parametrize("cap", [0.0, 15.0])
def test_gpt_loss_runs_the_kernels_on_the_heads_logits(interpreted: Worker,
                                                       cap: float) -> None:
    """GPT.loss with loss_kernel "fused" is, bit for bit, the kernels on the head's logits
    with the model's cap (handed to them, not applied before): its loss and every
    parameter's gradient; and its loss is within the kernels' bound of the whole logits'."""
    interpreted(gpt_loss_is_the_kernels_on_the_heads_logits, cap)


# ---------------------------------------------------------------------------------------
# the forward mode in the model's loss: its expected incoming gradient, one a model


SMALL = ModelConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=97, block_size=16)


class Batches:
    """The same micro-batches for every run of a seed (random tokens of SMALL's vocabulary)."""

    def __init__(self, seed: int = 0) -> None:
        self.gen = torch.Generator().manual_seed(seed)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        # 18 rows: few, for the interpreter's time, and not a power of 2, so that a rescaling
        # by 1/3 rounds otherwise than the backward mode's 1/3 / rows
        x = torch.randint(0, 97, (3, 7), generator=self.gen)
        return x[:, :-1], x[:, 1:]


def in_mode(mode: str) -> Any:
    """gpt/model/loss_kernels.py's FUSED_MODE set for a block (the constant the GPU's
    measurement settles), put back after it."""
    import contextlib

    @contextlib.contextmanager
    def context() -> Iterator[None]:
        saved = loss_kernels.FUSED_MODE
        loss_kernels.FUSED_MODE = mode
        try:
            yield
        finally:
            loss_kernels.FUSED_MODE = saved

    return context()


def trained_grads(mode: str, accum: int, steps: int = 2, cap: float = 0.0, recompute: str = "none",
                  scale: float | None = None) -> tuple[list[dict[str, torch.Tensor]], GPT]:
    """Each of `steps` steps' gradients (gpt/engine/step.py's forward_backward: `accum`
    micro-batches, each loss / accum; fp16's GradScaler at `scale` where given) of SMALL
    with --loss-kernel fused in `mode`, and `recompute`'s activation checkpointing."""
    from gpt.engine.recompute import apply
    from gpt.engine.step import forward_backward, optimizer_step

    kernels()
    torch.manual_seed(0)
    model = GPT(replace(SMALL, logit_softcap=cap))
    model.loss_kernel = "fused"
    apply(model, recompute)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale or 1.0, enabled=scale is not None)
    batches, grads = Batches(), []
    with in_mode(mode):
        for _ in range(steps):
            _, norm = forward_backward(model, scaler, opt, batches, accum, 0.0, "cpu", torch.float32)
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
            optimizer_step(opt, scaler, 0.0, norm)  # at 0: the same weights every step
    return grads, model


def the_forward_mode_in_the_models_loss() -> None:
    """The model's loss in the forward mode gives the backward mode's gradients, bit for
    bit, with the soft cap, 2 micro-batches a step (its first backward rescales by 1/2,
    exactly, and corrects its expectation: the second micro-batch's is written right);
    under torch.no_grad (validation) it writes nothing and leaves its expectation alone."""
    ref, _ = trained_grads("backward", 2, steps=1, cap=15.0)
    got, model = trained_grads("forward", 2, steps=1, cap=15.0)
    assert model.expected_grad.tensor.item() == 0.5
    assert all(torch.equal(ref[0][n], got[0][n]) for n in ref[0])
    x, y = Batches(1).next_batch()
    with in_mode("forward"), torch.no_grad():
        loss = model(x, y)[1]
    with in_mode("backward"), torch.no_grad():
        assert torch.equal(loss, model(x, y)[1])
    assert model.expected_grad.tensor.item() == 0.5


def the_forward_mode_under_accumulation_checkpointing_and_the_scaler() -> None:
    """As above: with one micro-batch a step (it expects 1, as it starts) and 3 (1/3 rounds:
    the run's first micro-batch within a rounding, every later one bit for bit), under
    both kinds of activation checkpointing, and under fp16's GradScaler (its scale in the
    incoming gradient)."""
    ref, _ = trained_grads("backward", 1)
    got, model = trained_grads("forward", 1)
    assert model.expected_grad.tensor.item() == 1.0
    assert all(torch.equal(a[n], b[n]) for a, b in zip(ref, got) for n in a)
    ref, _ = trained_grads("backward", 3)
    got, model = trained_grads("forward", 3)
    assert model.expected_grad.tensor.item() == pytest.approx(1 / 3, rel=1e-7)
    # the first micro-batch's logits' gradient rescaled by 1/3 in fp32: each entry within
    # 4u of the backward mode's, which the backward through the head and the blocks carries
    # as a few u of each gradient's largest entry (3e-7 of it, seen): 1e-5 of it is room
    # for any CPU's sums, far under a rescaling left out (2/3 of the gradient) or doubled
    for n in ref[0]:
        assert (ref[0][n] - got[0][n]).abs().max() <= 1e-5 * ref[0][n].abs().max(), n
    assert all(torch.equal(ref[1][n], got[1][n]) for n in ref[1])
    plain, _ = trained_grads("backward", 2)
    for recompute in ("selective", "blocks"):
        got, _ = trained_grads("forward", 2, recompute=recompute)
        assert all(torch.equal(a[n], b[n]) for a, b in zip(plain, got) for n in a), recompute
    ref, _ = trained_grads("backward", 2, scale=1024.0)
    got, model = trained_grads("forward", 2, scale=1024.0)
    assert model.expected_grad.tensor.item() == 512.0  # the scale over the micro-batches
    assert all(torch.equal(a[n], b[n]) for a, b in zip(ref, got) for n in a)


@needs_triton
def test_the_forward_mode_in_the_models_loss_gives_the_backward_modes_gradients(
        interpreted: Worker) -> None:
    interpreted(the_forward_mode_in_the_models_loss)


@needs_triton
@pytest.mark.slow
def test_the_forward_mode_under_accumulation_checkpointing_and_the_scaler(
        interpreted: Worker) -> None:
    interpreted(the_forward_mode_under_accumulation_checkpointing_and_the_scaler)


def _ranks_worker(rank: int, folder: str, parallel: str) -> None:
    """One of two gloo ranks under the interpreter: SMALL under `parallel` (DDP, its first
    micro-batch under no_sync; FSDP2), 2 micro-batches a step, 2 steps, in each mode; its
    gradients (this rank's shards) written for the test to compare."""
    import torch.distributed as dist

    from gpt.core.config import OptimConfig
    from gpt.engine import parallel as engine
    from gpt.engine.step import forward_backward
    from gpt.runtime.world import Runtime

    kernels()
    dist.init_process_group("gloo", init_method=f"file://{folder}/pg", rank=rank, world_size=2)
    try:
        rt = Runtime(device=torch.device("cpu"), rank=rank, world_size=2, distributed=True,
                     control_group=dist.new_group(backend="gloo"))
        out = {}
        for mode in ("backward", "forward"):
            torch.manual_seed(0)
            with torch.device("meta"):
                model = GPT(SMALL)
            par = engine.parallelize(model, TrainConfig(parallel=parallel, compile=False,
                                                        loss_kernel="fused", chunked_loss=False),
                                     OptimConfig(), rt)
            assert model.loss_kernel == "fused"
            batches, grads = Batches(rank), []
            with in_mode(mode):
                for _ in range(2):
                    forward_backward(par.train_model, par.scaler, par.optimizer, batches, 2, 0.0,
                                     "cpu", torch.float32)
                    grads.append({n: engine.local_tensor(p.grad).clone()
                                  for n, p in model.named_parameters()})
            out[mode] = (grads, model.expected_grad.tensor)
        torch.save(out, Path(folder) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@needs_triton
@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_the_forward_mode_under_ddp_and_fsdp(parallel: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks (gloo, the kernels under the interpreter): DDP, whose first micro-batch of
    a step runs under no_sync, and FSDP2, sharded: each rank's gradients in the forward mode
    are the backward mode's, bit for bit (its one rescaling, by 1/2, is exact), and each
    rank's model expects 1/2 after."""
    import torch.multiprocessing as mp

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the ranks import Triton with it set
    mp.spawn(_ranks_worker, args=(str(tmp_path), parallel), nprocs=2, join=True)
    for rank in range(2):
        out = torch.load(tmp_path / f"rank{rank}.pt")
        (ref, _), (got, expected) = out["backward"], out["forward"]
        assert expected.item() == 0.5
        for a, b in zip(ref, got):
            assert all(torch.equal(a[n], b[n]) for n in a), (parallel, rank)


def compiled_as_eager() -> dict[str, int]:
    """The whole model under torch.compile (aot_eager: autograd's graphs, no code
    generation), the kernels a graph break between the head and the compiled backward, in
    both modes (the forward mode over two backwards, its expectation corrected by the
    first); dynamo's graph breaks, by reason, returned."""
    from torch._dynamo.utils import counters

    kernels()
    torch._dynamo.reset()
    counters.clear()
    for mode in ("backward", "forward"):
        for cap in (0.0, 15.0):
            torch.manual_seed(0)
            model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=97, block_size=16,
                                    logit_softcap=cap))
            model.loss_kernel = "fused"
            idx, targets = torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16))
            runs = {}
            with in_mode(mode):
                for name, run in (("eager", model), ("compiled", torch.compile(model, backend="aot_eager"))):
                    model.expected_grad.tensor = None  # each run starts expecting 1
                    out = []
                    for _ in range(2):
                        model.zero_grad()
                        loss = run(idx, targets)[1]
                        (loss * 0.5).backward()
                        out.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
                    runs[name] = out
            # the same ops on the same values in the same order: equal, not merely close
            for (a, ga), (b, gb) in zip(runs["eager"], runs["compiled"]):
                assert torch.equal(a, b), (mode, cap)
                assert all(torch.equal(ga[n], gb[n]) for n in ga), (mode, cap)
    return dict(counters["graph_break"])


@needs_triton
@pytest.mark.slow
def test_a_compiled_model_runs_them_between_its_graphs(interpreted: Worker) -> None:
    """... with one graph break in the model's forward: the kernels' call (torch.compiler.
    disable: Triton launches and a write over the logits, which compiled code must not see)."""
    breaks = interpreted(compiled_as_eager)
    assert len(breaks) == 1 and "disable" in next(iter(breaks)).lower(), breaks


H100_SMS, H100_L2 = 132, 50 * 2**20  # an H100 SXM's multiprocessors and L2 cache (bytes)
SM_WARPS, SM_REGISTERS = 64, 65536  # what one Hopper SM holds at once (CUDA's occupancy limits)
GPT2_ROW_BYTES = 50304 * 2  # a row of GPT-2's padded logits in bf16


def compile_for_an_h100() -> None:
    """Every kernel compiled by Triton for sm_90a (Hopper's own target; its GPUTarget of
    capability 90) in bf16, without and with the cap, each launch of the forward mode's
    kernel among them, with the specialisation a launch on GPT-2's logits gets (pointers,
    strides and the vocabulary divisible by 16); ptxas's resource report of each (Triton
    ships ptxas: no GPU needed), printed one JSON line a kernel. Run without the
    interpreter, in a process of its own."""
    import re
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    from gpt.model import fused_ce

    assert not fused_ce.interpreted()
    ptr, i32 = "*bf16", "i32"
    common = {"V": i32, "ignore_index": i32, "softcap": "fp32", "SOFTCAP": "constexpr",
              "BLOCK": "constexpr"}
    kernels = {  # name: (kernel, signature, launches)
        "_lse_kernel": (fused_ce._lse_kernel, {"x_ptr": ptr, "x_stride": i32, "t_ptr": "*i64",
                        "loss_ptr": "*fp32", "lse_ptr": "*fp32", **common},
                        {"backward": fused_ce.BACKWARD_LAUNCH}),
        "_grad_kernel": (fused_ce._grad_kernel, {"x_ptr": ptr, "x_stride": i32, "g_ptr": ptr,
                         "g_stride": i32, "t_ptr": "*i64", "lse_ptr": "*fp32",
                         "scale_ptr": "*fp32", **common}, {"backward": fused_ce.BACKWARD_LAUNCH}),
        "_loss_grad_kernel": (fused_ce._loss_grad_kernel, {"x_ptr": ptr, "x_stride": i32,
                              "g_ptr": ptr, "g_stride": i32, "t_ptr": "*i64", "loss_ptr": "*fp32",
                              "scale_ptr": "*fp32", **common, "L2": "constexpr"},
                              fused_ce.LAUNCHES),
        "_rescale_kernel": (fused_ce._rescale_kernel, {"g_ptr": ptr, "g_stride": i32,
                            "got_ptr": "*fp32", "want_ptr": "*fp32", "V": i32,
                            "BLOCK": "constexpr"}, {"forward": fused_ce.FORWARD_LAUNCH}),
    }
    print(json.dumps({"forward_launch": fused_ce.FORWARD_LAUNCH.name}))
    divisible = ("x_ptr", "x_stride", "g_ptr", "g_stride", "t_ptr", "loss_ptr", "lse_ptr",
                 "scale_ptr", "got_ptr", "want_ptr", "V")
    try:
        ptxas = get_ptxas(90).path  # Triton 3.6 on: the ptxas for an architecture
    except TypeError:
        ptxas = get_ptxas().path  # Triton 3.5 (torch 2.9's): one ptxas for all
    for name, (kernel, signature, launches) in kernels.items():
        names = list(signature)
        attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in divisible if a in names}
        for launch_name, launch in launches.items():
            for cap in (False, True) if "SOFTCAP" in signature else (False,):
                constexprs = {"BLOCK": launch.block, "SOFTCAP": cap, "L2": launch.l2}
                src = ASTSource(fn=kernel, signature=signature, attrs=attrs,
                                constexprs={k: v for k, v in constexprs.items() if k in signature})
                compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                          options={"num_warps": launch.warps})
                ptx = compiled.asm["ptx"]
                with tempfile.TemporaryDirectory() as folder:
                    path = Path(folder) / "k.ptx"
                    path.write_text(ptx)
                    report = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", str(path), "-o",
                                             str(path.with_suffix(".o"))], capture_output=True,
                                            text=True, check=True).stderr
                print(json.dumps({
                    "kernel": name, "launch": launch_name, "warps": launch.warps, "cap": cap,
                    "target": re.findall(r"\.target (\S+)", ptx),
                    "registers": int(re.search(r"Used (\d+) registers", report).group(1)),
                    "spill_bytes": sum(map(int, re.findall(r"(\d+) bytes spill", report))),
                    "shared_bytes": compiled.metadata.shared,
                    "accesses": sorted(set(re.findall(r"\b(?:ld|st)\.global[\w.:]*", ptx)))}))


def rows_in_flight(warps: int, registers: int, shared: int) -> int:
    """Programs (rows) an H100 runs at once, by CUDA's occupancy limits: an SM's warps, its
    registers (allocated 8 a thread at a time), its 228 KB of shared memory, 32 programs."""
    per_sm = min(SM_WARPS // warps, SM_REGISTERS // (warps * 32 * -(-registers // 8) * 8),
                 228 * 1024 // max(shared, 1), 32)
    return H100_SMS * per_sm


@needs_triton
@pytest.mark.slow
def test_the_kernels_compile_for_an_h100_and_the_forward_launch_keeps_its_rows_in_l2(
        tmp_path: Path) -> None:
    """Triton's compiler, without the interpreter, turns every kernel into sm_90a machine
    code in bf16 (what the interpreter accepts, the compiler may not: this is the check
    that it does), nothing spilled, every logit read and written 16 bytes at a time. Its
    registers and shared memory fix how many rows an H100 runs at once: the forward mode's
    launch holds them within L2, so each row's second read can come from there, where the
    launch it had (8 warps, BLOCK 4,096: 1,056 rows, 106 MB) could not; and its l2 order's
    hints are in the code (the first pass's loads kept in L2, the second's let go, the
    gradient stored streaming)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), str(HERE)]),
               TRITON_CACHE_DIR=str(tmp_path / "cache"), TRITON_DEFAULT_FP_FUSION="1")
    proc = subprocess.run([sys.executable, "-c", "import test_fused_ce as t; t.compile_for_an_h100()"],
                          env=env, capture_output=True, text=True, timeout=600, cwd=HERE)
    if "No module named 'triton.backends.nvidia'" in proc.stderr:
        pytest.skip("this Triton has no NVIDIA backend")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    chosen = lines[0]["forward_launch"]
    compiled = lines[1:]
    assert {c["kernel"] for c in compiled} == {"_lse_kernel", "_grad_kernel", "_loss_grad_kernel",
                                               "_rescale_kernel"}
    assert len(compiled) == 2 + 2 + 2 * len(LAUNCH_NAMES) + 1
    for c in compiled:
        print(c["kernel"], c["launch"], f"cap {c['cap']}:", c["registers"], "registers,",
              c["shared_bytes"], "bytes shared,", rows_in_flight(c["warps"], c["registers"],
                                                                 c["shared_bytes"]), "rows at once")
        assert c["target"] == ["sm_90a"] and c["spill_bytes"] == 0, c
        logits = [a for a in c["accesses"] if a.endswith(".v4.b32")]  # 8 bf16 at a time
        assert any(a.startswith("ld.") for a in logits), c
        if c["kernel"] != "_lse_kernel":
            assert any(a.startswith("st.") for a in logits), c
    forward = [c for c in compiled if c["kernel"] == "_loss_grad_kernel"]
    fits = {c["launch"] for c in forward} - {
        c["launch"] for c in forward  # a launch fits when it does with and without the cap
        if rows_in_flight(c["warps"], c["registers"], c["shared_bytes"]) * GPT2_ROW_BYTES > H100_L2}
    assert chosen in fits and "8w-4096" not in fits, (chosen, fits)
    for c in forward:
        if c["launch"].endswith("-l2"):
            assert {"st.global.cs.v4.b32", "ld.global.L1::evict_last.L2::cache_hint.v4.b32",
                    "ld.global.L1::evict_first.L2::cache_hint.v4.b32"} <= set(c["accesses"]), c


@needs_triton
@pytest.mark.slow
def test_the_gpu_loss_bench_runs_both_modes_under_the_interpreter(tmp_path: Path) -> None:
    """The GPU acceptance's loss-bench cell (gpt/bench/gpu/loss_bench.py), every variant
    run, on a CPU under Triton's interpreter, so that its GPU minutes are not the first to
    run the fused modes' code there, the forward mode at each launch it sweeps: each one's
    loss and gradient judged by the bench against the whole logits' loss's, in fp32 (its
    TOLERANCES: the fp32 differences), and its choice of launch and mode made."""
    out = tmp_path / "loss_bench.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "gpt.bench.gpu.loss_bench", "--out", str(out),
                           "--device", "cpu", "--rows", "16", "--vocab", "200", "--no-compile",
                           "--warmup", "0", "--repeats", "1"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    variants = report["variants"]
    forward = ["fused-forward"] * len(LAUNCH_NAMES)
    assert [(v["variant"], v["softcap"]) for v in variants] == [
        (name, cap) for cap in (0.0, 15.0)
        for name in ("compiled", "fused-backward", *forward, "fused-forward, expected wrong")]
    assert sorted(v["launch"] for v in variants[2:2 + len(forward)]) == sorted(LAUNCH_NAMES)
    for v in variants:
        assert v["status"] == "ok" and v["total_ms"] > 0, v
        if v["variant"] != "compiled":  # judged in fp32: within the fp32 differences
            assert v["loss_tolerance"] == 1e-5 and v["loss_rel_diff"] <= 1e-5, v
            assert v["grad_max_rel_diff"] <= v["grad_tolerance"] <= 1e-4 + 2 ** -22, v
    assert report["choice"]["launch"] in LAUNCH_NAMES and report["choice"]["mode"] in ("forward",
                                                                                     "backward")
    assert "choice: the forward mode's fastest right launch" in proc.stdout


# ---------------------------------------------------------------------------------------
# the switch (no Triton needed)


def test_fused_is_refused_off_cuda_and_without_triton_in_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for device in ("cpu", "mps"):
        with pytest.raises(UserError, match=f"^--loss-kernel fused runs Triton kernels on CUDA "
                           f"only, and this run is on {device}: drop --loss-kernel fused$"):
            loss_kernels.check("fused", device, chunked=False)
    monkeypatch.setitem(sys.modules, "triton", None)  # importing it now fails
    with pytest.raises(UserError, match=r"^--loss-kernel fused needs triton, which is not "
                       r"installed: pip install -e \"\.\[kernels\]\" in the checkout, or pip "
                       r"install triton$"):
        loss_kernels.check("fused", "cuda", chunked=False)


def test_fused_is_the_whole_logits_and_nobodys_default(capsys: pytest.CaptureFixture) -> None:
    train = parse_args(["--loss-kernel", "fused"]).train
    assert not train.chunked_loss_on("cuda") and not train.chunked_loss_on("cpu")
    assert parse_args(["--loss-kernel", "fused", "--no-chunked-loss"]).train.loss_kernel == "fused"
    assert TrainConfig().loss_kernel == "auto"
    assert {loss_kernels.resolve("auto", d) for d in ("cuda", "cpu", "mps")} == {"liger", "ours"}
    parse_args(["--loss-kernel", "fused", "--fp8", "tensorwise", "--fp8-head"])  # the head's own matmul
    with pytest.raises(SystemExit):
        parse_args(["--loss-kernel", "fused", "--chunked-loss"])
    said = [line for line in capsys.readouterr().err.splitlines() if "--loss-kernel" in line]
    assert said == ["train_gpt2.py: error: --loss-kernel fused is the whole logits' cross-entropy, "
                    "not a kernel of the chunked loss that --chunked-loss asks for: drop one of "
                    "the two"]


@pytest.mark.slow
def test_the_trainer_refuses_it_on_cpu_before_building_anything(tmp_path: Path) -> None:
    data = write_random_shards(tmp_path, seed=1, train=(3_000,))
    proc = run_cli(*TINY, *QUIET, "--max-steps", "1", "--loss-kernel", "fused",
                   "--data-dir", str(data), "--out-dir", str(tmp_path / "run"))
    assert proc.returncode == 1, proc.stdout[-1000:]
    said = [line for line in (proc.stderr + proc.stdout).splitlines() if "--loss-kernel fused" in line]
    assert said and said[0].endswith("runs Triton kernels on CUDA only, and this run is on cpu: "
                                     "drop --loss-kernel fused")
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# ---------------------------------------------------------------------------------------
# on a GPU


@needs_triton  # a CUDA torch brings it; --fake-cuda (tests/cuda_checks.py) may run without
@pytest.mark.cuda
@pytest.mark.parametrize("cap", [0.0, 15.0])
def test_on_cuda_in_bf16_it_equals_the_whole_logits(cap: float) -> None:
    """bf16 logits at GPT-2's vocabulary: the whole logits' path under autocast
    (F.cross_entropy in fp32, its gradient rounded to bf16) against the kernels (fp32
    inside, the gradient rounded to bf16): the same roundings, so within a few bf16 ulps."""
    from gpt.model.fused_ce import cross_entropy

    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(4096, 50304, device="cuda", generator=g) * 3).bfloat16()
    t = torch.randint(0, 50257, (4096,), device="cuda", generator=g)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    loss = cross_entropy(a * 1, t, cap, inplace=True)
    (loss * 3).backward()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        z = cap * torch.tanh(b.float() / cap) if cap else b
        ref = F.cross_entropy(z, t)
    (ref * 3).backward()
    assert abs(loss.item() - ref.item()) < 1e-4 * ref.item()
    # each entry rounded to bf16 on both sides: 2^-8 relative, plus fp32 differences
    err = (a.grad.float() - b.grad.float()).abs()
    assert (err <= 2 ** -7 * b.grad.float().abs() + 1e-9).all(), err.max().item()


@needs_triton
@pytest.mark.cuda
@pytest.mark.parametrize("expected", [0.37, 1.0])
@pytest.mark.parametrize("cap", [0.0, 15.0])
def test_on_cuda_the_forward_mode_in_bf16_against_float64(cap: float, expected: float) -> None:
    """The forward mode at its launch on bf16 logits at GPT-2's vocabulary, expecting the
    incoming gradient it gets (0.37) and expecting another (1.0: rescaled), against
    F.cross_entropy in float64 of the same bf16 values: the loss (fp32 inside) within the
    kernels' fp32 bound (error_bounds); each gradient entry within it plus one rounding to
    bf16 (2^-8 of the entry: to nearest on a GPU, where Triton's interpreter truncates, so
    this runs on a GPU only), and a second where the backward rescaled it."""
    from gpt.model.fused_ce import FORWARD_LAUNCH, cross_entropy, expected_grad

    g = torch.Generator(device="cuda").manual_seed(1)
    x = (torch.randn(2048, 50304, device="cuda", generator=g) * 3).bfloat16()
    t = torch.randint(0, 50257, (2048,), device="cuda", generator=g)
    t[::7] = -100
    z = x.clone().requires_grad_()
    guess = expected_grad("cuda", expected)
    loss = cross_entropy(z * 1, t, cap, inplace=True, expected_grad=guess)
    loss.backward(torch.tensor(0.37, device="cuda"))
    assert guess.item() == pytest.approx(0.37, rel=1e-7)
    ref_in = x.double().requires_grad_()
    ref = F.cross_entropy(cap * torch.tanh(ref_in / cap) if cap else ref_in, t)
    ref.backward(torch.tensor(0.37, device="cuda", dtype=torch.float64))
    counted = t != -100
    n = int(counted.sum())
    e_loss, e_grad = error_bounds(x.double(), t, FORWARD_LAUNCH.block, cap, 0.37 / n)
    bound = e_loss[counted].max() + U * (n + 1) * ref.abs()  # as check_against_reference's
    assert abs(loss.double() - ref) <= bound, (loss.item(), ref.item(), bound.item())
    # fp32's error e, then each rounding to bf16 (2^-8 of the value: of the exact one, plus
    # e, plus the first rounding's, hence the 1 + 2^-7); a rescaling's own fp32 ratio, 4u
    roundings = 1 if expected == 0.37 else 2
    e = e_grad.unsqueeze(1) + (4 * U * 0.37 / n if roundings == 2 else 0.0)
    exact = ref_in.grad
    allowed = (roundings * 2.0 ** -8 * exact.abs() + e) * (1 + 2.0 ** -7) + e
    err = (z.grad.double() - exact).abs()
    assert (err <= allowed).all(), (err - allowed).max().item()
    assert (z.grad[~counted] == 0).all()


@pytest.mark.cuda
def test_a_compiled_trainer_run_with_fused_logs_the_whole_logits_losses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """4 compiled steps of 2 micro-batches with the soft cap: --loss-kernel fused in each
    mode (the forward mode set as gpt/bench/gpu/fused_mode.py sets it; the trainer runs in
    this process) logs the whole logits' losses, to bf16's noise over 4 steps."""
    runs = cuda_run_losses(tmp_path, {"whole": ["--no-chunked-loss"],
                                      "fused": ["--loss-kernel", "fused"]}, 1024)
    assert "loss whole logits (fused)" in runs["fused"][1]
    assert runs["fused"][0] == pytest.approx(runs["whole"][0], rel=2e-2)
    monkeypatch.setattr(loss_kernels, "FUSED_MODE", "forward")
    (tmp_path / "forward").mkdir()
    forward = cuda_run_losses(tmp_path / "forward", {"fused": ["--loss-kernel", "fused"]}, 1024)
    assert "loss whole logits (fused, forward mode)" in forward["fused"][1]
    assert forward["fused"][0] == pytest.approx(runs["whole"][0], rel=2e-2)
