"""`train_gpt2.py --dry-run`: what a command would do, checked without doing it.

It validates the flags and recipe, resolves the data folder (shards, tokens, how many
steps one pass covers), says whether the run would start fresh or resume (and from which
checkpoint), prints the resolved config, the parameter count, tokens per step and the
accumulation, and the memory planner's predicted peak per device (gpt.memory) against
the device's memory, with what to lower if it will not fit. It builds no model on the
device, starts no process group and writes nothing (the run folder's lock is not taken).
Under torchrun, rank 0 answers for the world (WORLD_SIZE processes); the others exit.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from gpt import memory, weights
from gpt.checkpoint import check_resume_config, choose
from gpt.checkpoint_contents import stored_step
from gpt.config import Config, describe
from gpt.config_check import grad_accum_steps
from gpt.dist import DTYPE_NAMES, device_name, pick_device, resolve_dtype
from gpt.errors import UserError
from gpt.metrics import check_tracking
from gpt.model import GPT
from gpt.shards import check_not_being_written, find_shards, shard_num_tokens
from gpt.units import human_count

GiB = 2**30


def main(cfg: Config) -> int:
    """Print the dry run's report; exit status 0 if the command would start, else the
    first problem's (every problem is printed, one line each)."""
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun rank 0 answers for everyone
    problems: list[UserError] = []

    def check(what) -> object:
        try:
            return what()
        except UserError as e:
            problems.append(e)
            sys.stdout.flush()  # in order with the report, when both go to one file
            print(f"error: {e}", file=sys.stderr, flush=True)
            return None

    print("dry run: nothing is built on the device, started or written")
    check(lambda: check_tracking(cfg.train.tensorboard, cfg.train.wandb_project))
    cfg = check(lambda: weights.with_pretrained_shape(cfg)) or cfg
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    device = check(lambda: pick_device(cfg.train.device, int(os.environ.get("LOCAL_RANK", "0"))))
    dtype = check(lambda: resolve_dtype(cfg.train.dtype, device)) if device is not None else None
    accum = check(lambda: grad_accum_steps(cfg.data.total_batch_tokens, cfg.data.batch_size,
                                           cfg.data.seq_len, world))
    print(describe(cfg))
    with torch.device("meta"):
        params = GPT(cfg.model).num_params()
    print(f"params:     {params:,} ({memory.model_name(cfg)} model)")
    if device is not None:
        print(f"device:     {device} ({device_name(device)}) x {world} process(es) | parallel "
              f"{cfg.train.parallel} | precision {DTYPE_NAMES.get(dtype, '?')} | compile "
              f"{cfg.train.compile_on(device.type)}")
    if world == 1 and cfg.train.parallel in ("zero1", "fsdp"):
        print(f"note:       --parallel {cfg.train.parallel} runs under torchrun; this plans one "
              f"process. Run the dry run under the same torchrun command to plan its world")
    d = cfg.data
    if accum is not None:
        print(f"batch:      {d.batch_size} x {d.seq_len} tokens per micro-batch x {world} "
              f"process(es) x {accum} accumulation step(s) = {d.total_batch_tokens:,} tokens "
              f"per step; {cfg.train.max_steps:,} steps = "
              f"{human_count(cfg.train.max_steps * d.total_batch_tokens)} tokens")
    check(lambda: _data(cfg))
    check(lambda: _start(cfg))
    if device is not None and dtype is not None:
        check(lambda: _memory(cfg, world, device))
    if problems:
        print(f"dry run: {len(problems)} problem(s) above; the run would not start",
              file=sys.stderr)
        return problems[0].exit_code
    print("dry run: the run would start")
    return 0


def _data(cfg: Config) -> None:
    d = cfg.data
    note = check_not_being_written(d.data_dir, d.allow_incomplete_data)
    if note:
        print(f"warning: {note}", file=sys.stderr)
    train = find_shards(d.data_dir, "train")
    tokens = sum(shard_num_tokens(p) for p in train)
    passes = cfg.train.max_steps * d.total_batch_tokens / max(tokens, 1)
    print(f"data:       {d.data_dir}: {len(train)} train shard(s), {tokens:,} tokens; one pass "
          f"is {tokens // d.total_batch_tokens:,} steps, the run {passes:.2f} pass(es)")
    if cfg.eval.val_every:
        try:
            val = find_shards(d.data_dir, "val")
            print(f"            {len(val)} val shard(s), "
                  f"{sum(shard_num_tokens(p) for p in val):,} tokens")
        except UserError:
            print(f"note:       {d.data_dir} has no val_* shards; validation would be off")
    if cfg.eval.hellaswag_every and cfg.eval.hellaswag_file:
        if not Path(cfg.eval.hellaswag_file).is_file():
            print(f"warning: --hellaswag-file {cfg.eval.hellaswag_file}: no such file",
                  file=sys.stderr)


def _start(cfg: Config) -> None:
    out = Path(cfg.train.out_dir)
    path, ckpt, notes = choose(out, cfg.checkpoint.resume)
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    if path is None:
        print(f"start:      fresh, in {out}")
        return
    step = stored_step(ckpt)
    print(f"start:      would resume from {path} at step {step:,}")
    for note in check_resume_config(ckpt, cfg, path):
        print(f"note:       setting changed since the checkpoint: {note}")
    if step >= cfg.train.max_steps:
        print(f"note:       step {step:,} is already --max-steps {cfg.train.max_steps:,}: "
              "nothing would be trained")


def _memory(cfg: Config, world: int, device: torch.device) -> None:
    print("memory:     planning the peak with fake tensors ...", flush=True)
    plan = memory.plan(cfg, world_size=world, device_type=device.type)
    print("\n".join("            " + line for line in plan.table().splitlines()))
    capacity = _capacity(device)
    if capacity is None:
        return
    name = f"{device} ({capacity / GiB:.1f} GiB)"
    if plan.fits(capacity):
        print(f"memory:     fits {name}")
        return
    d = cfg.data
    b, _ = memory.largest_batch(cfg, capacity, world, device.type, limit=d.batch_size)
    while b > 1 and d.total_batch_tokens % (b * d.seq_len * world):
        b -= 1  # the batch must still divide --total-batch-tokens
    lower = (f"lower --batch-size to {b} (the largest that fits; accumulation keeps "
             f"--total-batch-tokens)" if b else "no --batch-size fits")
    print(f"memory:     will not fit {name}: {lower}; --activation-checkpointing or "
          f"--parallel fsdp over more devices lower it further")


def _capacity(device: torch.device) -> int | None:
    """The device's memory: the GPU's, or (CPU, and MPS's unified memory) the host's."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        import psutil
        return int(psutil.virtual_memory().total)
    except ImportError:
        return None

