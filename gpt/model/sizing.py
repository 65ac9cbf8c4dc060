"""A model's size by arithmetic on its config, and the judgement of it that comes before
any model is built: the parameter count, the least memory a training run needs per
device, a device's memory (and what is free of it for a reader's batch), and the checks
that refuse a size that cannot be.

Building even a meta-device GPT costs time and host memory in proportion to its layers,
so a config from any source (flags, a TOML file, a checkpoint's saved config) is judged
here first: the trainer's preflight (gpt/plan/preflight.py), the layout and the memory planner
compare least_bytes with a device's memory, and every reader of a checkpoint compares
the weights the file holds with the parameters its config describes (check_weights_size)
before it builds the model those weights are checked against, and the model with the
device's memory before it allocates it (check_weights_fit_memory). An absurd size is
refused in milliseconds, whichever way it arrives.

Parameters are not the whole cost: building a model, and the memory planner's tracing of
its step, cost time and host memory per block whatever its width (about 13 modules a
block; the planner traces each block's operators one by one on fake tensors, the larger
cost by far). So a model of more than MAX_LAYERS blocks, thin enough to pass every
parameter bound, is refused by the same checks (check_build_cost, after the parameter
bound): 80,000 blocks 2 wide take minutes and gigabytes to build, and far longer to plan.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch

from gpt.core.config import Config, ConfigError, ModelConfig
from gpt.model import value_embeds


GiB = 2**30
HEAD = "lm_head.weight"  # a tied head shares the embedding's storage and counts once
# Blocks a model may have: real models have up to a few hundred (GPT-2 XL 48, GPT-3 96).
# Building and planning time grow in proportion to the blocks: a model of this many is
# built in seconds, but ten times deeper ones keep a dry run or a reader busy for hours.
MAX_LAYERS = 1000


def param_count(m: ModelConfig) -> int:
    """GPT(m).num_params(), by formula: no module is built (a test holds the two equal)."""
    C, V = m.n_embd, m.vocab_size
    norm = C if m.rmsnorm else 2 * C  # RMSNorm: a gain; LayerNorm: a gain and a bias
    # attention: qkv (C x 3C + 3C) and its projection (C x C + C); MLP: C x 4C + 4C and
    # 4C x C + C; two norms. Q/K-norm and rotary hold no parameters.
    block = 12 * C * C + 9 * C + 2 * norm
    # value embeddings: k tables shared by the first and the last k blocks, each of those
    # blocks with two mixing scalars; U-net skips: a weight for each mirrored pair
    k = value_embeds.tables(m)
    return (V * C + (0 if m.rotary else m.block_size * C) + m.n_layer * block + norm
            + (V * C if m.untied_head else 0) + k * (V * C + 2 * 2)
            + (m.n_layer // 2 if m.unet_skips else 0))


def least_bytes(cfg: Config, world_size: int, state_bytes: int) -> int:
    """Bytes one device holds during training at the very least: the fp32 weights and
    gradients and the optimizer's state (`state_bytes` a parameter, the least its
    optimizer keeps: the caller asks the optimizer, gpt/optim/kind.py's
    least_state_bytes), each divided over the world where --parallel shards it, plus the
    micro-batch's int64 token ids. Activations, logits and workspaces come on top: the
    real peak is larger (gpt.plan.memory plans it)."""
    n = param_count(cfg.model)
    mode = cfg.train.parallel
    shard = world_size if mode == "fsdp" else 1
    state_shard = world_size if mode in ("fsdp", "zero1") else 1
    tokens = cfg.data.batch_size * cfg.data.seq_len + 1
    return 8 * n // shard + state_bytes * n // state_shard + 8 * tokens


def device_memory(device: torch.device) -> int | None:
    """The device's memory: the GPU's, or (CPU, and MPS's unified memory) the host's;
    None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().total)


def free_memory(device: torch.device) -> tuple[int | None, str]:
    """What a reader may still allocate on `device`, and where that is: the GPU's free
    memory, or (CPU, and MPS's unified memory) the host's available memory; None where it
    cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0], str(device)
    try:
        import psutil
    except ImportError:
        return None, "this host"
    return int(psutil.virtual_memory().available), "this host"


def check_free_memory(need: int, device: torch.device, what: str, fix: str) -> None:
    """A ConfigError if `need` bytes (a reader's batch: its logits, its cache, by
    arithmetic) exceed what `device` has free, in one line naming `what` (the flags and
    what they make) and `fix`: said before anything is allocated, not a kill by the
    kernel or the allocator's traceback after it."""
    free, where = free_memory(device)
    if free is None or need <= free:
        return
    raise ConfigError(f"{what} needs at least {need / GiB:,.1f} GiB, and {where} has "
                      f"{free / GiB:,.1f} GiB free: {fix}")


def most_memory(device_type: str, gpus: Iterable[int]) -> tuple[int | None, str]:
    """The most memory one device of this type can have, as far as a plan for it knows,
    and what that is: the largest of `gpus` (and of this machine's GPUs) for CUDA, else
    this host's memory."""
    if device_type != "cuda":
        return device_memory(torch.device("cpu")), "this host"
    visible = [torch.cuda.get_device_properties(i).total_memory
               for i in range(torch.cuda.device_count())]
    return max([*gpus, *visible]), "the largest GPU planned for"


def build_cost_problem(m: ModelConfig, field: str = "--n-layer") -> str | None:
    """Why building the model would cost more than any real model's (more than MAX_LAYERS
    blocks), naming `field` (the flag, or a file's field); None where it would not.
    Arithmetic: nothing is built."""
    if m.n_layer <= MAX_LAYERS:
        return None
    fix = (f"choose --n-layer {MAX_LAYERS} or fewer" if field.startswith("--") else
           "the config was changed, or is not of a model this package trains")
    return (f"{field} {m.n_layer}: a model of more than {MAX_LAYERS:,} blocks cannot be "
            f"built or planned in reasonable time (each block is about 13 modules to build, "
            f"and the memory planner traces each block's operations; GPT-2 XL has 48): {fix}")


def check_build_cost(m: ModelConfig, field: str = "--n-layer") -> None:
    """build_cost_problem as a ConfigError."""
    problem = build_cost_problem(m, field)
    if problem is not None:
        raise ConfigError(problem)


def _model_words(m: ModelConfig) -> str:
    return (f"--n-layer {m.n_layer} --n-embd {m.n_embd} --vocab-size {m.vocab_size}: "
            f"{param_count(m):,} parameters")


def check_fits(cfg: Config, world_size: int, capacity: int | None, where: str,
               state_bytes: int) -> None:
    """A ConfigError if what training's parameters alone need (least_bytes, with the
    optimizer's `state_bytes` a parameter) exceeds capacity, or else if the model costs
    too much to build (check_build_cost): the judgement of a config to train."""
    need = least_bytes(cfg, world_size, state_bytes)
    if capacity is None or need <= capacity:
        check_build_cost(cfg.model)  # thin enough to fit, and still too deep to build
        return
    raise ConfigError(
        f"the model ({_model_words(cfg.model)}) needs at least {need / GiB:,.1f} GiB per "
        f"device for its weights, gradients and optimizer state before any activation, and "
        f"{where} has {capacity / GiB:,.1f} GiB: choose a smaller model, or --parallel fsdp "
        f"over more devices")


def check_weights_fit_memory(m: ModelConfig, capacity: int | None, where: str,
                             source: str) -> None:
    """A ConfigError naming `source` if the model's fp32 weights alone exceed capacity,
    or else if it costs too much to build (check_build_cost): the judgement of a config
    to read (generate, evaluate, export), before the model is built."""
    need = 4 * param_count(m)
    if capacity is None or need <= capacity:
        check_build_cost(m, f"{source}: n_layer")  # thin enough to fit, too deep to build
        return
    raise ConfigError(f"{source}: the model ({_model_words(m)}) needs {need / GiB:,.1f} GiB "
                      f"for its weights alone, and {where} has {capacity / GiB:,.1f} GiB: "
                      f"read it on a device with more memory")


def check_weights_size(m: ModelConfig, weights: Mapping[str, torch.Tensor]) -> None:
    """A ValueError if the config describes a model of more than twice the parameters the
    weights hold (a tied head, listed or not, counts once): an edited config, refused by
    arithmetic. Within that bound a reader may build the config's model (on the meta
    device) to compare names and shapes, which then says exactly what differs: building
    it costs at most twice what building the weights' own model does, and no more than
    check_build_cost allows."""
    held = sum(v.numel() for k, v in weights.items() if m.untied_head or k != HEAD)
    expected = param_count(m)
    if expected > 2 * held:
        raise ValueError(f"its weights hold {held:,} values, but its config describes a "
                         f"model of {expected:,} (--n-layer {m.n_layer} --n-embd {m.n_embd} "
                         f"--vocab-size {m.vocab_size}): the config or the weights were "
                         f"changed")
    problem = build_cost_problem(m, "its config's n_layer")  # within the size, too deep
    if problem is not None:
        raise ValueError(problem)
