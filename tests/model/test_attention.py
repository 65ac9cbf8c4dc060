"""Attention's one home (gpt/model/attention.py): the only module of the package that calls
SDPA or FlexAttention, and the one that says what selective activation checkpointing
keeps of them (gpt/engine/recompute.py asks it). FlexAttention reaches the checkpointing
as a higher-order op: kept, not recomputed in the backward pass."""

from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy

from gpt.engine import recompute
from gpt.model import attention
from helpers import REPO

KERNELS = ("scaled_dot_product_attention", "flex_attention")


def callers() -> dict[str, list[str]]:
    """Each kernel's callers (f(...) or x.f(...)) among the package's modules, the
    benchmarks aside, and the exported model's own code (gpt/checkpoint/hf_model/): it is
    copied into an export folder and runs where this package is not installed, so it
    cannot call gpt/model/attention.py."""
    out: dict[str, list[str]] = {k: [] for k in KERNELS}
    for path in sorted((REPO / "gpt").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(("gpt/bench/", "gpt/checkpoint/hf_model/")):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if called in out and rel not in out[called]:
                    out[called].append(rel)
    return out


def test_only_the_attention_module_calls_the_kernels() -> None:
    assert callers() == {k: ["gpt/model/attention.py"] for k in KERNELS}


def test_selective_checkpointing_keeps_what_attention_declares() -> None:
    assert attention.SAVED_OPS <= recompute.KEPT_OPS
    assert torch._higher_order_ops.flex_attention in recompute.KEPT_OPS
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in recompute.KEPT_OPS


class Attends(nn.Module):
    """A block that is attention alone: its output times a weight (the weight is what
    needs a gradient; FlexAttention has no backward on a CPU, so q, k, v need none)."""

    def __init__(self, mask: object) -> None:
        super().__init__()
        self.mask, self.w = mask, nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return attention.masked(x, x, x, self.mask, 0.0) * self.w


def decisions(monkeypatch: pytest.MonkeyPatch, mask: object) -> dict[str, CheckpointPolicy]:
    """Op -> what --activation-checkpointing selective decided for it, in a forward pass of
    an Attends block checkpointed as the trainer's blocks are (recompute.apply)."""
    seen: dict[str, CheckpointPolicy] = {}
    policy = recompute._policy

    def recording(ctx, op, *args, **kwargs):
        seen[str(op)] = decided = policy(ctx, op, *args, **kwargs)
        return decided

    monkeypatch.setattr(recompute, "_policy", recording)
    model = SimpleNamespace(config=SimpleNamespace(dropout=0.0),
                            transformer=SimpleNamespace(h=[Attends(mask)]))
    recompute.apply(model, "selective")
    (block,) = model.transformer.h
    block(torch.randn(1, 2, 128, 16)).sum().backward()
    return seen


# Eager on purpose (the checkpointing's decision is under test, not the kernel): torch warns
# that FlexAttention uncompiled materialises the scores, which the trainer never does.
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")
def test_flex_attention_is_kept_under_selective_checkpointing(monkeypatch: pytest.MonkeyPatch) -> None:
    """--attn-window / --doc-mask run FlexAttention on CUDA under torch.compile: its forward
    must not run again in the backward pass. Its decision is the same op, decided by the
    same policy, eagerly on a CPU."""
    attention.load_flex()
    mask = attention.create_block_mask(lambda b, h, q, k: q >= k, None, None, 128, 128,
                                       device="cpu")
    seen = decisions(monkeypatch, mask)
    assert seen["flex_attention"] == CheckpointPolicy.MUST_SAVE
    assert seen["aten.mul.Tensor"] == CheckpointPolicy.PREFER_RECOMPUTE  # pointwise: redone


def test_sdpa_is_kept_under_selective_checkpointing(monkeypatch: pytest.MonkeyPatch) -> None:
    causal = torch.ones(128, 128, dtype=torch.bool).tril()
    seen = decisions(monkeypatch, causal)
    kept = [op for op, decided in seen.items() if decided == CheckpointPolicy.MUST_SAVE]
    assert kept and all("scaled_dot_product" in op for op in kept), seen


@pytest.mark.numerics
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")
def test_the_kernels_agree_on_a_mask() -> None:
    """The BlockMask FlexAttention runs and the boolean mask SDPA runs give one result."""
    attention.load_flex()
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
    window = 16
    block = attention.create_block_mask(lambda b, h, i, j: (i >= j) & (i - j < window),
                                        None, None, 128, 128, device="cpu")
    rows, cols = torch.arange(128).unsqueeze(1), torch.arange(128).unsqueeze(0)
    boolean = (rows >= cols) & (rows - cols < window)
    flex = attention.masked(q, k, v, block, 0.0)
    # fp32 on both sides, the same softmax over the same keys: only the order of the sums
    # differs (about 1e-7 of values of order 1), where a wrong mask differs by 1e-1
    assert torch.allclose(flex, attention.masked(q, k, v, boolean, 0.0), atol=1e-5)


@pytest.mark.numerics
def test_a_cache_s_new_queries_see_the_prefix_and_each_other_causally() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 10, 8) for _ in range(3))
    whole = attention.causal(q, k, v, 0.0)
    # the last 3 queries after a prefix of 7: the rows of the whole pass (same sums, in the
    # same order per row: allclose only for SDPA's kernel choosing another tiling)
    assert torch.allclose(attention.after_prefix(q[:, :, 7:], k, v, 7, 0.0), whole[:, :, 7:],
                          atol=1e-6)
    assert torch.allclose(attention.after_prefix(q[:, :, 9:], k, v, 9, 0.0), whole[:, :, 9:],
                          atol=1e-6)
    assert torch.equal(attention.after_prefix(q, k, v, 0, 0.0), whole)
