"""Muon for the blocks' weight matrices, AdamW for everything else, as one optimizer.

Muon (Jordan et al., 2024) replaces each 2-D weight's momentum update by its nearest
semi-orthogonal matrix (a few Newton-Schulz iterations), so every direction of the update
moves at the same rate. It is meant for the hidden matrices only: the token embedding,
the head (tied or not), biases and norm gains stay with AdamW. torch.optim.Muon does the
Muon part and torch.optim.AdamW (fused where it can be) the rest; MuonAdamW holds both
behind one torch.optim.Optimizer whose param_groups and state are theirs, shared, so a
state_dict, DCP's name-keyed state dicts, ZeroRedundancyOptimizer (which builds one per
rank from param groups) and the LR schedule see one ordinary optimizer.

Each group says which optimizer it belongs to ("muon": True or False) and its learning
rate relative to --max-lr ("lr_ratio"): the schedule's learning rate times that ratio.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
import torch.nn as nn


# Muon's own hyper-parameters that are not AdamW's (Muon ignores betas/eps, AdamW these)
MUON_KEYS = ("momentum", "nesterov", "ns_coefficients", "ns_steps", "adjust_lr_fn")


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The blocks' 2-D weights (attention and MLP matmuls): Muon's parameters."""
    blocks = getattr(model, "transformer").h
    return [p for p in blocks.parameters() if p.dim() == 2 and p.requires_grad]


def muon_param_groups(model: nn.Module, weight_decay: float, muon_weight_decay: float,
                      muon_lr_ratio: float) -> list[dict[str, Any]]:
    """Muon's group (the hidden matrices), then AdamW's decay group (embeddings and an
    untied head) and its no-decay group (biases, gains)."""
    hidden = {id(p) for p in hidden_matrices(model)}
    params = [p for p in model.parameters() if p.requires_grad]  # a tied weight once
    return [
        {"params": [p for p in params if id(p) in hidden], "weight_decay": muon_weight_decay,
         "muon": True, "lr_ratio": muon_lr_ratio},
        {"params": [p for p in params if id(p) not in hidden and p.dim() >= 2],
         "weight_decay": weight_decay, "muon": False},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "muon": False},
    ]


class MuonAdamW(torch.optim.Optimizer):
    """torch.optim.Muon over the groups marked "muon", torch.optim.AdamW over the others.

    adamw: AdamW's keyword arguments (lr, betas, eps, fused); muon: Muon's (momentum, ...).
    Group dicts and per-parameter state are shared with the two inner optimizers (the
    parameters are disjoint), and re-shared after load_state_dict, which replaces both."""

    def __init__(self, params: Iterable[dict[str, Any]], adamw: dict[str, Any],
                 muon: dict[str, Any]) -> None:
        # Groups stay in their order, empty ones too: ZeroRedundancyOptimizer matches a
        # rank's groups to the global ones by position.
        groups = list(params)
        if [bool(g.get("muon")) for g in groups] != sorted((bool(g.get("muon")) for g in groups),
                                                            reverse=True):
            raise ValueError("MuonAdamW: Muon's groups come first")
        lr = adamw.get("lr", 1e-3)
        self._muon = torch.optim.Muon([g for g in groups if g.get("muon")] or [{"params": []}],
                                      lr=lr, **muon)
        self._adamw = torch.optim.AdamW([g for g in groups if not g.get("muon")] or [{"params": []}],
                                        **adamw)
        # "fused": False tells gpt.engine.step to skip a non-finite step by reading the flag on the
        # host: Muon's step has no found-inf input, unlike the fused AdamW's
        super().__init__([*self._muon.param_groups, *self._adamw.param_groups],
                         {"lr": lr, "fused": False})
        self._share()

    def _share(self) -> None:
        """Point the inner optimizers at this one's groups and state."""
        for inner, marked in ((self._muon, True), (self._adamw, False)):
            inner.param_groups = [g for g in self.param_groups if bool(g.get("muon")) == marked]
            inner.state = self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._share()

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._muon.step()
        self._adamw.step()
        return loss


def momentum_at(step: int, final: float, warmup_steps: int, start: float = 0.85) -> float:
    """Muon's momentum at `step`: from `start` up to `final` over warmup_steps (the
    speedrun's warm-up, which steadies the first steps), then `final`."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return final
    return start + (final - start) * step / warmup_steps
