"""Data parallelism: how the model is spread over the ranks, and the mode-independent
full state dicts that checkpoints hold.

Modes (`--parallel`):
- ddp:   every rank holds the whole model and optimizer; gradients are all-reduced once
         per optimizer step. With one process it is plain single-device training.
- zero1: DDP for the model, with the AdamW state sharded across ranks
         (ZeroRedundancyOptimizer): about 2/3 less optimizer memory per GPU.
- fsdp:  parameters, gradients and optimizer state sharded (FSDP2, one unit per
         transformer block), for models whose replicas do not fit, e.g. gpt2-xl.

parallelize() applies, in this order, activation checkpointing -> torch.compile ->
the mode's wrapper -> the optimizer (which must see the sharded parameters under FSDP).
Checkpoints store the full (unsharded) model and optimizer state keyed by parameter
name, so a checkpoint written under one mode or world size loads under another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from gpt.compat import needs_torch
from gpt.config import ConfigError, OptimConfig, TrainConfig
from gpt.dist import Runtime
from gpt.model import GPT, unwrap
from gpt.optim import adamw_kwargs, build_optimizer, param_groups, want_fused


@dataclass
class Parallelized:
    """What parallelize() returns: the module the loop calls and its optimizer."""

    train_model: nn.Module  # compiled and/or wrapped; the bare model is sharded in place under FSDP
    optimizer: torch.optim.Optimizer
    fused: bool  # the optimizer runs the fused AdamW kernel
    compiled: bool


def check_mode(mode: str, runtime: Runtime) -> None:
    """The sharded modes need a process group (the mode names themselves are the
    config's choices, checked when the flag is parsed)."""
    if mode != "ddp" and not runtime.distributed:
        raise ConfigError(
            f"--parallel {mode} needs a process group: start with torchrun "
            f"(e.g. torchrun --standalone --nproc_per_node=N train_gpt2.py --parallel {mode})"
        )
    if mode == "fsdp" and runtime.device_type == "cpu":
        needs_torch("--parallel fsdp on CPU", (2, 9), "older gloo sums FSDP2's gradients "
                    "where it asks for their mean (pytorch#162338)")


def parallelize(model: GPT, train: TrainConfig, optim: OptimConfig, runtime: Runtime) -> Parallelized:
    """Make `model` (already on its device, weights loaded) ready to train under
    train.parallel: activation checkpointing, compile, wrapper, then the optimizer."""
    check_mode(train.parallel, runtime)
    if train.activation_checkpointing:
        apply_activation_checkpointing(model)
    compiled = train.compile_on(runtime.device_type)
    train_model = _wrap(model, train.parallel, runtime, train.compile_mode if compiled else None)
    optimizer, fused = _make_optimizer(model, train.parallel, optim, runtime)
    return Parallelized(train_model, optimizer, fused, compiled)


def samples_on_this_rank(mode: str, runtime: Runtime) -> bool:
    """Whether this rank runs generation: under FSDP the forward pass is a collective, so
    every rank samples (the same text); otherwise rank 0 samples alone."""
    return runtime.is_master or mode == "fsdp"


def apply_activation_checkpointing(model: GPT) -> None:
    """Recompute each block's activations in the backward pass instead of storing them:
    roughly one extra forward of compute for most of the activation memory."""
    for block in model.transformer.h:
        forward = block.forward
        # An instance attribute shadows the method, so module hooks (FSDP's) still run
        # around __call__ and the parameter names do not change.
        block.forward = lambda *a, _f=forward, **kw: checkpoint(_f, *a, use_reentrant=False, **kw)


def _wrap(model: GPT, mode: str, runtime: Runtime, compile_mode: str | None) -> nn.Module:
    """The module the training loop calls: compiled (unless compile_mode is None) and/or
    wrapped for the mode."""

    def compiled(m: nn.Module) -> nn.Module:
        return m if compile_mode is None else torch.compile(m, mode=compile_mode)

    if mode == "fsdp":
        # Parameters stay fp32 (the optimizer's master copy); autocast in the loop does
        # the bf16 compute, as in the other modes, so all three train the same numbers.
        policy = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=torch.float32)
        for block in model.transformer.h:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return compiled(model)
    wrapped = compiled(model)
    if runtime.distributed and runtime.world_size > 1:
        device_ids = [runtime.local_rank] if runtime.device_type == "cuda" else None
        wrapped = DDP(wrapped, device_ids=device_ids)
    return wrapped


def _make_optimizer(model: GPT, mode: str, cfg: OptimConfig,
                    runtime: Runtime) -> tuple[torch.optim.Optimizer, bool]:
    """AdamW for the mode, over the (possibly sharded) parameters."""
    if mode != "zero1":
        return build_optimizer(model, cfg, runtime.device)
    fused = want_fused(cfg, runtime.device)
    opt = ZeroRedundancyOptimizer(param_groups(model, cfg.weight_decay),
                                  optimizer_class=torch.optim.AdamW, fused=fused,
                                  **adamw_kwargs(cfg))
    return opt, fused


def set_grad_sync(model: nn.Module, enabled: bool) -> None:
    """Whether the coming backward pass reduces gradients across ranks. Skipping it on
    all but the last accumulation micro-step saves (k-1)/k of the communication. DDP reads
    the flag in its forward, so set it before the forward."""
    if isinstance(model, DDP):
        model.require_backward_grad_sync = enabled
        return
    inner = unwrap(model)
    if hasattr(inner, "set_requires_gradient_sync"):  # an FSDP2-sharded root module
        inner.set_requires_gradient_sync(enabled)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP) gathered into a plain tensor; plain tensors pass through."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP); plain tensors pass through."""
    return t.to_local() if hasattr(t, "to_local") else t


def local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer holding this rank's state: ZeroRedundancyOptimizer's inner AdamW."""
    return optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer


# ---- checkpoint state: full, keyed by parameter name, on rank 0


def _full_options() -> StateDictOptions:
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full model state on rank 0 (collective under FSDP: every rank must call)."""
    return get_model_state_dict(model, options=_full_options())


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, runtime: Runtime) -> dict[str, Any]:
    """Full optimizer state keyed by parameter name, on rank 0 (every rank must call)."""
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.consolidate_state_dict(to=0)
        if not runtime.is_master:
            return {}
        return _index_to_names(optimizer.state_dict(), model)
    return get_optimizer_state_dict(model, optimizer, options=_full_options())


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a full, name-keyed optimizer state (every rank passes the whole state)."""
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.load_state_dict(_names_to_index(state, model))
        return
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def check_optimizer_state(state: Any, param_shapes: dict[str, tuple[int, ...]]) -> None:
    """Raise ValueError unless `state` is a full, name-keyed AdamW state that
    load_optimizer_state can load into a model with these parameters (name -> shape):
    groups that list the parameters by name with numeric settings, and per-parameter
    state (all of it, or none yet) of the parameters' shapes."""
    if not isinstance(state, dict) or not isinstance(state.get("state"), dict) \
            or not isinstance(state.get("param_groups"), list):
        raise ValueError("it is not an optimizer state dict (state and param_groups)")
    grouped: list[str] = []
    for group in state["param_groups"]:
        if not isinstance(group, dict) or not isinstance(group.get("params"), list):
            raise ValueError("a param group is not a dict with a list of params")
        grouped += group["params"]
        for key in ("lr", "weight_decay", "eps"):
            if not _real(group.get(key)):
                raise ValueError(f"a param group's {key} is {group.get(key)!r}, not a number")
        betas = group.get("betas")
        if not isinstance(betas, (list, tuple)) or len(betas) != 2 or not all(map(_real, betas)):
            raise ValueError(f"a param group's betas are {betas!r}, not two numbers")
    if sorted(map(str, grouped)) != sorted(param_shapes):
        unknown = sorted(set(map(str, grouped)) ^ set(param_shapes))[:3]
        raise ValueError(f"its param groups do not list this model's parameters (e.g. {unknown})")
    per_param = state["state"]
    if per_param and sorted(per_param) != sorted(param_shapes):
        unknown = sorted(set(per_param) ^ set(param_shapes))[:3]
        raise ValueError(f"its state is not that of this model's parameters (e.g. {unknown})")
    for name, entry in per_param.items():
        if not isinstance(entry, dict):
            raise ValueError(f"the state of {name} is not a dict")
        for key, value in entry.items():
            if key == "step":
                if not (_real(value) or (torch.is_tensor(value) and value.numel() == 1)):
                    raise ValueError(f"the step count of {name} is {value!r}")
            elif not torch.is_tensor(value) or tuple(value.shape) != param_shapes[name]:
                got = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
                raise ValueError(f"{name}'s {key} is {got}, not a tensor of the parameter's "
                                 f"shape {param_shapes[name]}")


def _real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _param_names(model: nn.Module) -> list[str]:
    """Parameter names in the order param_groups() lists them (decay group first)."""
    names = {id(p): n for n, p in unwrap(model).named_parameters()}
    return [names[id(p)] for g in param_groups(model, 0.0) for p in g["params"]]


def _index_to_names(state: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    names = _param_names(model)
    groups = [dict(g, params=[names[i] for i in g["params"]]) for g in state["param_groups"]]
    return {"state": {names[i]: s for i, s in state["state"].items()}, "param_groups": groups}


def _names_to_index(state: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    index = {n: i for i, n in enumerate(_param_names(model))}
    groups = [dict(g, params=[index[n] for n in g["params"]]) for g in state["param_groups"]]
    return {"state": {index[n]: s for n, s in state["state"].items()}, "param_groups": groups}
