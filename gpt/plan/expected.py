"""What a run should take, said before it starts (the dry run's "expect:" lines, and the
time line at the run's start): the tokens it trains on from where it starts (a resume's
step, not step 0), its time, and its disk (the data folder, the checkpoints it keeps at
once, against the space free where --out-dir is: a shortfall is a preflight problem,
check_disk).

A time is only ever from a measurement: MEASURED holds the throughput of the GPT-2 124M
recipe as `python -m gpt.bench gpu` measured it (the file of each figure named), matched
by GPU name, micro-batch and one process; any other run is timed on the device it is
on (gpt/plan/speed.py: the trainer's step on a slice of the model, scaled by FLOPs;
under torchrun, rank 0's share of the step). The evaluations other than validation,
samples and checkpoints come on top.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt.checkpoint.files import list_checkpoints
from gpt.core.config import Config, ConfigError, OptimConfig, model_preset
from gpt.core.errors import UserError
from gpt.core.file_checks import free_bytes
from gpt.core.text import one_line
from gpt.core.units import format_duration, human_bytes, human_count
from gpt.data.shards import find_shards
from gpt.optim import optimizer
from gpt.plan import speed


WEIGHT_BYTES = 4  # fp32 master weights, whatever the autocast precision


@dataclass(frozen=True)
class Measured:
    """One measured throughput of the GPT-2 124M recipe (bf16 autocast, TF32, compiled,
    the whole logits, fused AdamW, T=1024) on one GPU."""

    gpu: str  # as torch.cuda.get_device_name() names it
    batch_size: int
    tokens_per_s: float
    source: str  # the result file, under benchmarks/gpu/
    conditions: str


# Medians over 10 steps after 3 of warm-up, at 2^17 tokens a step (the recipe's 2^19 runs
# its optimizer a quarter as often per token, so a time from these is, if anything, long).
MEASURED = (
    Measured("NVIDIA H100 80GB HBM3", 64, 493_276,
             "benchmarks/gpu/2026-11-27-h100/call1-gpu_stage1.json", "torch 2.11, commit dcbf0fc"),
    Measured("NVIDIA H100 80GB HBM3", 32, 488_566,
             "benchmarks/gpu/2026-11-27-h100/call3-gpu_stage3.json", "torch 2.11, commit dcbf0fc"),
    Measured("NVIDIA H100 80GB HBM3", 16, 462_802,
             "benchmarks/gpu/2026-11-27-h100/call3-gpu_stage3.json", "torch 2.11, commit dcbf0fc"),
    Measured("NVIDIA H200", 64, 526_471,  # its --no-chunked-loss cell: today's CUDA default
             "benchmarks/gpu/2026-11-26-h200/stage7/gpu_stage7.json", "torch 2.11, commit f77e599"),
)


def as_measured(cfg: Config, device_type: str) -> bool:
    """Whether the run's step costs what the measured cells' did: GPT-2 124M as the preset
    has it, T=1024, bf16 autocast with TF32, compiled in the default mode, the whole
    logits, the default optimizer (AdamW), no FP8, no activation checkpointing."""
    t, o = cfg.train, cfg.optim
    return (device_type == "cuda" and cfg.model == model_preset("gpt2")
            and cfg.data.seq_len == 1024 and t.dtype in ("auto", "bf16") and t.tf32
            and t.compile_on(device_type) and t.compile_mode == "default"
            and not t.chunked_loss_on(device_type) and t.fp8 == "none"
            and t.activation_checkpointing == "none" and o.optimizer == OptimConfig().optimizer)


def measured_for(cfg: Config, gpu: str, device_type: str, world: int) -> Measured | None:
    if world != 1 or not as_measured(cfg, device_type):
        return None
    return next((m for m in MEASURED if m.gpu == gpu and m.batch_size == cfg.data.batch_size),
                None)


def checkpoint_bytes(cfg: Config) -> int:
    """A checkpoint's size, about: the fp32 weights and the optimizer's state (as its
    state_bytes counts it: AdamW's two moments a weight), counted on a model built on the
    meta device (no memory); the rest (loader positions, RNG states, config) is
    kilobytes."""
    from gpt.model.transformer import GPT

    with torch.device("meta"):
        model = GPT(dataclasses.replace(cfg.model, dropout=0.0))
    params = list(model.parameters())  # each tied tensor once, as a checkpoint holds it
    return (sum(p.numel() for p in params) * WEIGHT_BYTES
            + optimizer.chosen(cfg.optim).state_bytes(model))


def validates(cfg: Config) -> bool:
    """Whether the run validates (--val-every and val_* shards, as the trainer decides;
    a data folder not made yet is counted as one that will have them): only then can a
    best checkpoint be kept beside the newest."""
    if not cfg.eval.val_every:
        return False
    if not Path(cfg.data.data_dir).is_dir():
        return True
    try:
        return bool(find_shards(cfg.data.data_dir, "val"))
    except UserError:
        return False


def checkpoints_at_once(cfg: Config, start_step: int = 0) -> int:
    """The most checkpoint files the run folder holds at one time: the newest
    --keep-checkpoints, the best by validation loss (where the run validates), and the
    one being written, of the saves from `start_step` (a resume's) to the end."""
    c = cfg.checkpoint
    steps, _ = speed.run_steps(cfg, start_step)
    if not c.save_checkpoints or not steps:
        return 0
    end = start_step + steps
    every = c.checkpoint_every
    saves = (end // every - start_step // every + (end % every != 0)) if every else 1
    return min(saves, c.keep_checkpoints + 1 + validates(cfg))


def disk_needed(cfg: Config, start_step: int = 0) -> tuple[int, int, int]:
    """(bytes the run's checkpoints need beyond what its folder's checkpoints hold now,
    the checkpoints at once, one checkpoint's bytes)."""
    n = checkpoints_at_once(cfg, start_step)
    if not n:
        return 0, 0, 0
    each = checkpoint_bytes(cfg)
    try:
        held = sum(p.stat().st_size for _, p in list_checkpoints(Path(cfg.train.out_dir)))
    except (UserError, OSError):  # a folder that cannot be listed: the preflight says so
        held = 0
    return max(n * each - held, 0), n, each


def check_disk(cfg: Config, start_step: int = 0) -> None:
    """The run's checkpoints fit the free space where --out-dir is (or would be made), or
    a ConfigError naming --out-dir, what they need and what is free: a run that would
    stop at its first checkpoint does not start."""
    need, n, each = disk_needed(cfg, start_step)
    free = free_bytes(Path(cfg.train.out_dir))
    if not need or free is None or need <= free:
        return
    raise ConfigError(
        f"--out-dir {cfg.train.out_dir}: the run needs about {human_bytes(need)} of disk for "
        f"up to {n} checkpoint(s) of {human_bytes(each)} at once and {human_bytes(free)} is "
        f"free there: free some space, name a folder on a larger disk, lower "
        f"--keep-checkpoints, or pass --no-save-checkpoints")


def folder_bytes(folder: Path) -> int | None:
    """The bytes of the regular files in `folder` (the data's shards), or None without one."""
    if not folder.is_dir():
        return None
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def lines(cfg: Config, device: torch.device, gpu: str, world: int,
          estimate: speed.Estimate | None = None, start_step: int = 0) -> list[str]:
    """The dry run's lines: tokens, time, disk, from `start_step` (a resume's) on."""
    steps, _ = speed.run_steps(cfg, start_step)
    per_step = cfg.data.total_batch_tokens
    tokens = steps * per_step
    span = f", steps {start_step:,} to {start_step + steps:,}" if start_step else ""
    out = [f"expect:     {human_count(tokens)} tokens ({steps:,} steps x {per_step:,}{span})",
           "            " + time_line(cfg, device, gpu, world, estimate, start_step)]
    data = folder_bytes(Path(cfg.data.data_dir))
    # paths from a config file are anyone's text: printed escaped, as every error line is
    data_dir, out_dir = one_line(cfg.data.data_dir, None), one_line(cfg.train.out_dir, None)
    disk = [f"{data_dir} holds {human_bytes(data)}" if data is not None else
            f"{data_dir} does not exist yet"]
    need, n, each = disk_needed(cfg, start_step)
    if n:
        disk.append(f"{out_dir} needs about {human_bytes(n * each)} for up to {n} checkpoint(s) "
                    f"of {human_bytes(each)} at once (--keep-checkpoints "
                    f"{cfg.checkpoint.keep_checkpoints}, "
                    f"{'the best, ' if validates(cfg) else ''}the one being written)"
                    + (f", {human_bytes(need)} more than its checkpoints hold now"
                       if need < n * each else ""))
    elif not cfg.checkpoint.save_checkpoints:
        disk.append(f"{out_dir}: no checkpoints (--no-save-checkpoints)")
    free = free_bytes(Path(cfg.train.out_dir))
    out.append("            disk: " + "; ".join(disk)
               + (f"; {human_bytes(free)} free there" if free is not None else ""))
    return out


def time_line(cfg: Config, device: torch.device, gpu: str, world: int,
              estimate: speed.Estimate | None = None, start_step: int = 0) -> str:
    """How long the run should take from `start_step`: from the GPU bench's measurement
    of this recipe on this GPU, else from `estimate` (gpt/plan/speed.py's timing here)."""
    steps, _ = speed.run_steps(cfg, start_step)
    tokens = steps * cfg.data.total_batch_tokens
    where = (f"{gpu} x {world}" if device.type == "cuda" else f"{device.type} ({gpu})"
             + (f" x {world} processes" if world > 1 else ""))
    m = measured_for(cfg, gpu, device.type, world)
    if m is not None:
        return (f"time: about {format_duration(tokens / m.tokens_per_s)} of "
                f"training at the {m.tokens_per_s:,.0f} tokens/s the GPU bench measured on "
                f"one {m.gpu} at micro-batch {m.batch_size} ({m.source}; {m.conditions}); "
                f"evaluation and checkpoints come on top")
    if estimate is not None:
        return estimate.line(where, device.type)
    return (f"time: not timed on {where}{'' if steps else ' (nothing to train)'}; the log's "
            f"ETA says once the run is going")


def verdict(cfg: Config, device: torch.device, gpu: str, world: int,
            estimate: speed.Estimate | None = None, start_step: int = 0) -> str:
    """The dry run's last line where the run would start: what it would do, and for how
    long on this device (as the time line says it)."""
    steps, _ = speed.run_steps(cfg, start_step)
    if not steps:
        return (f"dry run: the run would start and find nothing to train (step {start_step:,} "
                f"is where it stops)")
    where = (f"{gpu} x {world}" if device.type == "cuda" else f"this {device.type} ({gpu})"
             + (f" in {world} processes" if world > 1 else ""))
    span = f"steps {start_step:,} to {start_step + steps:,}" if start_step else f"{steps:,} steps"
    out = f"dry run: the run would start and train {span}"
    m = measured_for(cfg, gpu, device.type, world)
    if m is not None:
        tokens = steps * cfg.data.total_batch_tokens
        return f"{out}, about {format_duration(tokens / m.tokens_per_s)} on {where} (as measured)"
    if estimate is None or estimate.train_s is None:
        why = f": {estimate.basis}" if estimate is not None else ""
        return f"{out} on {where}; not timed{why}"
    gpu_note = ": a recipe meant for a GPU" if estimate.meant_for_gpu(device.type) else ""
    return f"{out}, taking {estimate.about()} of training on {where}{gpu_note}"
