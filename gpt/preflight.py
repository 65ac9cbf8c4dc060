"""What a run must meet before anything is built, beyond its config's own rules
(gpt/config_check.py): the sharded modes' process group, the batch divided over the
world it runs in, enough tokens in each split for one step of every rank (and, with
--check-tokens, every token id within the vocabulary), the memory its parameters alone
need against the device's, an --out-dir that can be a run folder, and --eval-tasks the
harness knows.

The trainer (gpt/train.py), its dry run (gpt/dry_run.py) and the memory planner
(gpt/memory.py) all call these functions (the planner those that need no device or
data), so a dry run's "would start" and a plan are answers the run agrees with: none of
them can accept what another refuses.
The memory test is arithmetic on the config (no model is built, nothing is traced), so
an absurd size is refused in milliseconds, not after minutes of building it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import torch

from gpt import fp8, harness_tasks, loss_kernels, value_embeds
from gpt.config import Config, ConfigError, ModelConfig
from gpt.config_check import grad_accum_steps
from gpt.data import steps_per_pass
from gpt.dist import Runtime
from gpt.errors import UserError
from gpt.parallel import check_mode
from gpt.shards import check_not_being_written, find_shards, read_shard, shard_num_tokens

GiB = 2**30


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


def least_bytes(cfg: Config, world_size: int) -> int:
    """Bytes one device holds during training at the very least: the fp32 weights and
    gradients and the optimizer's state (AdamW: two fp32 moments a weight; Muon keeps
    one for its matrices, counted as one throughout), each divided over the world where
    --parallel shards it, plus the micro-batch's int64 token ids. Activations, logits
    and workspaces come on top: the real peak is larger (gpt.memory plans it)."""
    n = param_count(cfg.model)
    mode = cfg.train.parallel
    shard = world_size if mode == "fsdp" else 1
    state_shard = world_size if mode in ("fsdp", "zero1") else 1
    state = 4 if cfg.optim.optimizer == "muon" else 8
    tokens = cfg.data.batch_size * cfg.data.seq_len + 1
    return 8 * n // shard + state * n // state_shard + 8 * tokens


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


def most_memory(device_type: str, gpus: Iterable[int]) -> tuple[int | None, str]:
    """The most memory one device of this type can have, as far as a plan for it knows,
    and what that is: the largest of `gpus` (and of this machine's GPUs) for CUDA, else
    this host's memory."""
    if device_type != "cuda":
        return device_memory(torch.device("cpu")), "this host"
    visible = [torch.cuda.get_device_properties(i).total_memory
               for i in range(torch.cuda.device_count())]
    return max([*gpus, *visible]), "the largest GPU planned for"


def check_fits(cfg: Config, world_size: int, capacity: int | None, where: str) -> None:
    """A ConfigError if what the parameters alone need (least_bytes) exceeds capacity."""
    need = least_bytes(cfg, world_size)
    if capacity is None or need <= capacity:
        return
    m = cfg.model
    raise ConfigError(
        f"the model (--n-layer {m.n_layer} --n-embd {m.n_embd} --vocab-size {m.vocab_size}: "
        f"{param_count(m):,} parameters) needs at least {need / GiB:,.1f} GiB per device for "
        f"its weights, gradients and optimizer state before any activation, and {where} has "
        f"{capacity / GiB:,.1f} GiB: choose a smaller model, or --parallel fsdp over more "
        f"devices")


def check_world(cfg: Config, world_size: int) -> int:
    """The gradient accumulation steps of cfg's batch on world_size processes, or the
    trainer's ConfigError: the batch must divide into whole micro-batches on every rank."""
    if world_size < 1:
        raise ConfigError(f"--world-size {world_size}: a run has at least one process")
    d = cfg.data
    return grad_accum_steps(d.total_batch_tokens, d.batch_size, d.seq_len, world_size)


def check_data(cfg: Config, world_size: int) -> tuple[int, int | None]:
    """Tokens in the train split, and in the val split if validation would run on one
    (None if not), each checked with the loader's own rule: one step of every rank needs
    batch x seq_len x world + 1 tokens. Reads the shards' headers only, unless
    --check-tokens asks for every token id to be within --vocab-size (the run's one scan:
    its loaders do not repeat it); a folder that fineweb.py is still writing is refused
    first (its warning is the callers' to print)."""
    d = cfg.data
    check_not_being_written(d.data_dir, d.allow_incomplete_data)  # first: it says why

    def tokens(paths: list[Path]) -> int:
        if d.check_tokens:
            return sum(read_shard(p, cfg.model.vocab_size).size for p in paths)
        return sum(shard_num_tokens(p) for p in paths)

    train = tokens(find_shards(d.data_dir, "train"))
    steps_per_pass(d.data_dir, "train", train, d.batch_size, d.seq_len, world_size)
    if not cfg.eval.val_every:
        return train, None
    try:
        val_shards = find_shards(d.data_dir, "val")
    except UserError:
        return train, None  # no val_* shards: validation is off, as the trainer says
    val = tokens(val_shards)
    steps_per_pass(d.data_dir, "val", val, d.batch_size, d.seq_len, world_size)
    return train, val


def check_start(cfg: Config, runtime: Runtime) -> int:
    """Everything a run checks before it builds anything, in one place: the parallel mode
    against the launch, the loss kernel against the device, the batch against the world,
    the parameters against the device's memory. Returns the gradient accumulation steps."""
    check_mode(cfg.train.parallel, runtime)
    loss_kernels.check(cfg.train.loss_kernel, runtime.device_type,
                       cfg.train.chunked_loss_on(runtime.device_type))
    fp8.check(cfg.train, runtime.device)
    accum = check_world(cfg, runtime.world_size)
    check_fits(cfg, runtime.world_size, device_memory(runtime.device), str(runtime.device))
    return accum


def check_out_dir(out_dir: str) -> None:
    """--out-dir names a folder, or a path where one can be made and written: a file
    there (or in its way) is refused before anything is built. Nothing is created: the
    run makes the folder when it takes it (gpt/checkpoint.py), the dry run never."""
    path = Path(out_dir)
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        what = "it" if probe == path else str(probe)
        raise ConfigError(f"--out-dir {out_dir}: cannot write there: {what} is a file, not a "
                          f"folder; name a folder for the run's log, metrics and checkpoints")
    if not os.access(probe, os.W_OK | os.X_OK):
        inside = "" if probe == path else f" (in {probe}, where it would be made)"
        raise ConfigError(f"--out-dir {out_dir}: cannot write there{inside}: permission denied")


def check_eval_tasks(cfg: Config) -> None:
    """--eval-tasks: lm-eval importable, --eval-tasks-include a folder, every task a name
    the harness knows. No task's data is loaded (that may download): a task whose data
    cannot be loaded is a warning when the run starts, and the run goes on without it."""
    e = cfg.eval
    if e.eval_tasks_every:
        harness_tasks.check_tasks(e.eval_tasks, e.eval_tasks_include, flag="--eval-tasks",
                                  include_flag="--eval-tasks-include")
