"""Data parallelism: how the model is spread over the ranks, and the mode-independent
full state dicts that checkpoints hold.

Modes (`--parallel`):
- ddp:   every rank holds the whole model and optimizer; gradients are all-reduced once
         per optimizer step. With one process it is plain single-device training.
- zero1: DDP for the model, with the optimizer's state sharded across ranks
         (ZeroRedundancyOptimizer): about 2/3 less optimizer memory per GPU with AdamW.
- fsdp:  parameters, gradients and optimizer state sharded (FSDP2, one unit per
         transformer block), for models whose replicas do not fit, e.g. gpt2-xl.

parallelize() applies, in this order: FP8 layers (--fp8, gpt/model/fp8.py) -> activation
checkpointing (gpt/engine/recompute.py) -> torch.compile -> the
mode's wrapper -> the weights (a model built on the meta device is materialised on its
device, and initialised, only now: after sharding under FSDP) -> the optimizer (which
must see the sharded parameters under FSDP). Checkpoints store the full (unsharded)
model and optimizer state keyed by parameter name, so a checkpoint written under one
mode or world size loads under another.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gpt.core.compat import needs_torch
from gpt.core.config import AUTO, ConfigError, OptimConfig, TrainConfig
from gpt.engine import recompute
from gpt.model import fp8, loss_kernels
from gpt.model.transformer import GPT, unwrap
from gpt.optim.optimizer import build_optimizer, build_zero1
from gpt.runtime.world import Runtime


if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

# torch.distributed's FSDP, ZeRO, DTensor and state-dict modules are imported where they are
# used, not here: together they pull in DTensor and sympy, over a second of every start-up
# (the dry run, a refused flag) that a one-process run without them never needs.

# torch.compile's backend. Tests that check the graphs (not the kernels) set "aot_eager":
# the same graphs and recompiles, without inductor's code generation.
COMPILE_BACKEND = "inductor"
# Modes that capture CUDA graphs: a graph cannot hold FSDP's collectives between blocks.
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


@dataclass
class Parallelized:
    """What parallelize() returns: the modules the loop calls, and the optimizer."""

    train_model: nn.Module  # compiled and/or wrapped; the bare model is sharded in place under FSDP
    eval_model: nn.Module  # what the evaluations call (see parallelize)
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler  # fp16's loss scaler; disabled (a no-op) otherwise
    fused: bool  # the optimizer runs the fused AdamW kernel
    compiled: bool
    fp8: str = "none"  # --fp8 as it runs, in words (gpt.model.fp8.describe)


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


def parallelize(model: GPT, train: TrainConfig, optim: OptimConfig, runtime: Runtime,
                autocast_dtype: torch.dtype = torch.float32,
                mesh: DeviceMesh | None = None) -> Parallelized:
    """Make `model` ready to train under train.parallel: activation checkpointing,
    compile, wrapper, weights, then the optimizer and fp16's scaler. `model` is either on
    its device with its weights loaded, or on the meta device, to be initialised here
    (GPT.init_weights: the same weights as a CPU build from the same seed). FSDP shards
    over `mesh` (default: all ranks, one dimension); the memory planner passes one it
    built outside its fake-tensor mode."""
    if AUTO in (train.parallel, train.activation_checkpointing):
        raise ValueError("an auto layout reached parallelize: gpt.plan.layout.settle() gives its "
                         "values first")
    check_mode(train.parallel, runtime)
    compile_mode = train.compile_mode if train.compile_on(runtime.device_type) else None
    if train.parallel == "fsdp" and compile_mode in CUDA_GRAPH_MODES:
        raise ConfigError(
            f"--compile-mode {compile_mode} captures CUDA graphs, which cannot hold FSDP's "
            f"all-gathers between the blocks: use --compile-mode default or "
            f"max-autotune-no-cudagraphs with --parallel fsdp")
    model.chunked_loss = train.chunked_loss_on(runtime.device_type)  # before compile: traced
    model.loss_kernel = loss_kernels.resolve(train.loss_kernel, runtime.device_type)
    # FP8 layers in place of the linear ones: before checkpointing, compile and sharding,
    # which must all see the modules that will run
    kept = fp8.convert(model, train.fp8, train.fp8_head, runtime.device_type)
    fp8_note = fp8.describe(train.fp8, train.fp8_head, kept, len(fp8.converted(model)),
                            runtime.device_type)
    if train.activation_checkpointing != "none":
        apply_activation_checkpointing(model, train.activation_checkpointing)
    if train.parallel == "fsdp":
        if mesh is None:
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh(runtime.device_type, (runtime.world_size,))
        train_model = eval_model = _shard(model, mesh, train.fsdp_param_dtype, compile_mode)
        materialize(model, runtime.device)
    else:
        materialize(model, runtime.device)
        train_model = _replicate(model, runtime, compile_mode)
        # Evaluation gets a compiled callable of its own (inductor's usual kernels, static
        # shapes): its no-grad graph and each evaluation's shapes are compiled beside the
        # training graph, never in its place, and no CUDA graph outlives an eval call.
        eval_model = compiled(model, "default") if compile_mode else model
    fp16 = autocast_dtype == torch.float16
    optimizer, fused = _make_optimizer(model, train.parallel, optim, runtime, fp16)
    return Parallelized(train_model, eval_model, optimizer,
                        grad_scaler(train.parallel, runtime.device_type, fp16), fused,
                        compile_mode is not None, fp8_note)


def compiled(fn: Callable[..., Any], mode: str) -> Any:
    """torch.compile with static shapes: each shape the run uses (the training batch,
    the validation batch, an evaluation's padded batch) gets a graph of its own, so no call
    ever turns another's graph into a dynamic-shape one."""
    if COMPILE_BACKEND == "inductor":
        return torch.compile(fn, mode=mode, dynamic=False)
    return torch.compile(fn, backend=COMPILE_BACKEND, dynamic=False)


def materialize(model: GPT, device: torch.device) -> None:
    """Give a model built on the meta device real storage on `device`, and its initial
    weights; a model that has them already is left alone. Under FSDP this runs after
    sharding: each rank writes its own shard of each tensor (implicit replication lets
    a full CPU tensor be copied into a sharded one, locally)."""
    if not any(p.is_meta for p in model.parameters()):
        return
    model.to_empty(device=device)
    if any(hasattr(p, "to_local") for p in model.parameters()):  # DTensors: sharded
        from torch.distributed.tensor.experimental import implicit_replication
        with implicit_replication():
            model.init_weights()
    else:
        model.init_weights()


def samples_on_this_rank(mode: str, runtime: Runtime) -> bool:
    """Whether this rank runs generation: under FSDP the forward pass is a collective, so
    every rank samples (the same text); otherwise rank 0 samples alone."""
    return runtime.is_master or mode == "fsdp"


def apply_activation_checkpointing(model: GPT, mode: str = "blocks") -> None:
    """--activation-checkpointing `mode` on each block (gpt/engine/recompute.py)."""
    recompute.apply(model, mode)


def _shard(model: GPT, mesh: DeviceMesh, param_dtype: str, compile_mode: str | None) -> GPT:
    """FSDP2, one unit per block and the rest (embeddings, final LayerNorm, head) in the
    root's. Compiling the whole root would not work: FSDP's hooks are not traceable, so
    the root's frame would fall back to eager. Instead each block is compiled before it
    is sharded (as torchtitan does), and so are the final LayerNorm, head and loss
    (GPT.loss), which would otherwise run eagerly and hold fp32 copies of the logits."""
    # Gradients are reduced in fp32 whatever the parameters are gathered in. fp32
    # (default): the parameters stay fp32 and autocast does the bf16 compute, as in the
    # other modes, so all three train the same numbers. bf16: gathered and used in bf16
    # (half the all-gather traffic and unsharded memory), torchtitan's default.
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if param_dtype == "bf16" else None,
                                  reduce_dtype=torch.float32)
    for block in model.transformer.h:
        if compile_mode is not None:
            block.compile(**_compile_kwargs(compile_mode))  # in place: names unchanged
        fully_shard(block, mesh=mesh, mp_policy=policy)
    if compile_mode is not None:
        model.loss = compiled(model.loss, compile_mode)  # type: ignore[method-assign]
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def _compile_kwargs(mode: str) -> dict[str, Any]:
    if COMPILE_BACKEND == "inductor":
        return {"mode": mode, "dynamic": False}
    return {"backend": COMPILE_BACKEND, "dynamic": False}


def _replicate(model: GPT, runtime: Runtime, compile_mode: str | None) -> nn.Module:
    """The module the loop calls under ddp and zero1: compiled (unless compile_mode is
    None), and wrapped in DDP when there is more than one rank."""
    wrapped = model if compile_mode is None else compiled(model, compile_mode)
    if runtime.distributed and runtime.world_size > 1:
        device_ids = [runtime.local_rank] if runtime.device_type == "cuda" else None
        # Gradients as views into DDP's all-reduce buckets: no copy of every gradient into
        # a bucket and back each step, and no second copy of the gradients in memory.
        # (static_graph is left off: it would have to be proven with the no-sync
        # accumulation steps, and the reducer's bucketing is settled after one step anyway.)
        wrapped = DDP(wrapped, device_ids=device_ids, gradient_as_bucket_view=True)
    return wrapped


def grad_scaler(mode: str, device_type: str, enabled: bool) -> torch.amp.GradScaler:
    """fp16's loss scaler (a no-op when not enabled). Under FSDP each rank holds other
    gradient shards, so an overflow found on one rank must skip the step on all: the
    sharded scaler all-reduces its found-inf flag. The plain one would let ranks disagree
    on skipping, and their scales drift apart."""
    if mode == "fsdp" and enabled:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
        return ShardedGradScaler(device_type, enabled=True)
    return torch.amp.GradScaler(device_type, enabled=enabled)


def _make_optimizer(model: GPT, mode: str, cfg: OptimConfig, runtime: Runtime,
                    fp16: bool) -> tuple[torch.optim.Optimizer, bool]:
    """The chosen optimizer (gpt/optim/optimizer.py) for the mode, over the (possibly
    sharded) parameters."""
    if mode == "fsdp" and fp16:
        # torch's sharded scaler hands a fused AdamW its overflow flag with the wrong shape
        # (one element, not a scalar), which the fused kernel's step count rejects; the
        # unfused AdamW reads the flag on the host instead.
        if cfg.fused:
            raise ConfigError("--fused: fused AdamW cannot take torch's sharded fp16 scaler "
                              "under --parallel fsdp; drop --fused (or use --dtype bf16)")
        cfg = dataclasses.replace(cfg, fused=False)
    if mode != "zero1":
        return build_optimizer(model, cfg, runtime.device)
    return build_zero1(model, cfg, runtime.device)  # one per rank, over its share


def set_grad_sync(model: nn.Module, enabled: bool) -> None:
    """Whether the coming backward pass all-reduces gradients across ranks, under DDP:
    skipping it on all but the last accumulation micro-step saves (k-1)/k of the
    communication. DDP reads the flag in its forward, so set it before the forward.

    Under FSDP every micro-step reduce-scatters its gradients, on purpose: skipping
    that would keep the whole model's unsharded fp32 gradients through accumulation
    (+5.8 GiB per rank at gpt2-xl), and FSDP is chosen for memory; the reduce-scatters
    overlap the backward pass."""
    if isinstance(model, DDP):
        model.require_backward_grad_sync = enabled


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP) gathered into a plain tensor; plain tensors pass through."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP); plain tensors pass through."""
    return t.to_local() if hasattr(t, "to_local") else t


def local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer holding this rank's state: ZeroRedundancyOptimizer's inner one."""
    return optimizer.optim if _is_zero(optimizer) else optimizer


def _is_zero(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer` is a ZeroRedundancyOptimizer: never where its module was not
    imported, which gpt/optim/optimizer.py's build_zero1 does before building one."""
    zero = sys.modules.get("torch.distributed.optim")
    return zero is not None and isinstance(optimizer, zero.ZeroRedundancyOptimizer)


# ---- checkpoint state: full, keyed by parameter name, on rank 0


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full model state on rank 0 (collective under FSDP: every rank must call)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, runtime: Runtime) -> dict[str, Any]:
    """Full optimizer state keyed by parameter name, on rank 0 (every rank must call)."""
    if _is_zero(optimizer):
        optimizer.consolidate_state_dict(to=0)  # type: ignore[attr-defined]
        if not runtime.is_master:
            return {}
        return _index_to_names(optimizer.state_dict(), model, optimizer)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a full, name-keyed optimizer state (every rank passes the whole state)."""
    if _is_zero(optimizer):
        optimizer.load_state_dict(_names_to_index(state, model, optimizer))
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def check_optimizer_state(state: Any, param_shapes: dict[str, tuple[int, ...]]) -> None:
    """Raise ValueError unless `state` is a full, name-keyed optimizer state that
    load_optimizer_state can load into a model with these parameters (name -> shape):
    groups that list the parameters by name with numeric settings (an Adam group's betas
    and eps, a momentum group's momentum), and per-parameter state (all of it, or none
    yet) of the parameters' shapes."""
    if not isinstance(state, dict) or not isinstance(state.get("state"), dict) \
            or not isinstance(state.get("param_groups"), list):
        raise ValueError("it is not an optimizer state dict (state and param_groups)")
    grouped: list[str] = []
    for group in state["param_groups"]:
        if not isinstance(group, dict) or not isinstance(group.get("params"), list):
            raise ValueError("a param group is not a dict with a list of params")
        grouped += group["params"]
        # a momentum optimizer's group holds a momentum and no betas
        momentum = "momentum" in group and "betas" not in group
        for key in ("lr", "weight_decay", "momentum" if momentum else "eps"):
            if not _real(group.get(key)):
                raise ValueError(f"a param group's {key} is {group.get(key)!r}, not a number")
        betas = group.get("betas")
        if not momentum and (not isinstance(betas, (list, tuple)) or len(betas) != 2
                             or not all(map(_real, betas))):
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


def _param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the order the optimizer's groups list them (its state's indices)."""
    names = {id(p): n for n, p in unwrap(model).named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def _index_to_names(state: dict[str, Any], model: nn.Module,
                    optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    names = _param_names(model, optimizer)
    groups = [dict(g, params=[names[i] for i in g["params"]]) for g in state["param_groups"]]
    return {"state": {names[i]: s for i, s in state["state"].items()}, "param_groups": groups}


def _names_to_index(state: dict[str, Any], model: nn.Module,
                    optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    index = {n: i for i, n in enumerate(_param_names(model, optimizer))}
    groups = [dict(g, params=[index[n] for n in g["params"]]) for g in state["param_groups"]]
    return {"state": {index[n]: s for n, s in state["state"].items()}, "param_groups": groups}
