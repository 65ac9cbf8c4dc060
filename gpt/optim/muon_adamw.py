"""Muon for the blocks' weight matrices, AdamW for everything else, as one torch
optimizer (what --optimizer muon runs; gpt/optim/muon.py says the rest of Muon).

torch.optim.Muon does the Muon part and torch.optim.AdamW (fused where it can be) the
rest; MuonAdamW holds both behind one torch.optim.Optimizer whose param_groups and state
are theirs, shared, so a state_dict, DCP's name-keyed state dicts, ZeroRedundancyOptimizer
(which builds one per rank from param groups) and the LR schedule see one ordinary
optimizer.

Each group says which optimizer it belongs to ("muon": True or False) and its learning
rate relative to --max-lr ("lr_ratio"): the schedule's learning rate times that ratio.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch


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

