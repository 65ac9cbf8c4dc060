"""AdamW (gpt/optim/adamw.py): weight decay on the matrices only, and the fused build."""

from __future__ import annotations

import torch

from gpt.core.config import OptimConfig, model_preset
from gpt.model.transformer import GPT
from gpt.optim.adamw import param_groups
from gpt.optim.optimizer import build_optimizer


def test_weight_decay_only_on_matrices() -> None:
    model = GPT(model_preset("tiny", block_size=16))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() < 2 for p in no_decay["params"])
    # every parameter exactly once (the tied embedding/head too)
    ids = [id(p) for p in decay["params"] + no_decay["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    assert any(p is model.transformer.wte.weight for p in decay["params"])


def test_fused_adamw_on_cpu_and_explicit_off() -> None:
    model = GPT(model_preset("tiny", block_size=16))
    opt, fused = build_optimizer(model, OptimConfig(), torch.device("cpu"))
    assert fused and opt.defaults["fused"]
    assert opt.defaults["betas"] == (0.9, 0.95) and opt.defaults["eps"] == 1e-8
    opt, fused = build_optimizer(model, OptimConfig(fused=False), torch.device("cpu"))
    assert not fused and not opt.defaults["fused"]
