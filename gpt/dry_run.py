"""`train_gpt2.py --dry-run`: what a command would do, checked without doing it.

It validates the flags and recipe, resolves the data folder (shards, tokens, how many
steps one pass covers), says whether the run would start fresh or resume (and from which
checkpoint), prints the resolved config, the parameter count, tokens per step and the
accumulation, and the memory planner's predicted peak per device (gpt.memory) against
the device's memory, with what to lower if it will not fit. It builds no model on the
device, starts no process group and writes nothing (the run folder's lock is not taken).
Under torchrun, rank 0 answers for the world (WORLD_SIZE processes); the others exit.
Its checks are the run's own (the launch environment, gpt/preflight.py: the batch, the
data and its token ids, the run folder, the --eval-tasks names), so "the run would
start" is a promise the run keeps; a planned peak beyond the device's memory is a problem
too (the run would stop in its first step).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from gpt import expected, fp8, layout, loss_kernels, memory, weights
from gpt.checkpoint import check_resume_config, choose
from gpt.checkpoint_contents import stored_step
from gpt.config import Config, describe
from gpt.dist import DTYPE_NAMES, Runtime, device_name, launch_environment, pick_device, resolve_dtype
from gpt.errors import UserError
from gpt.metrics import check_tracking
from gpt.preflight import (check_data, check_eval_tasks, check_out_dir, check_start,
                           device_memory, param_count)
from gpt.shards import check_not_being_written, find_shards
from gpt.units import human_count

GiB = 2**30


class WillNotFit(UserError):
    """The memory planner's peak exceeds the device's memory: the run would start and
    then run out of memory, so the dry run does not promise that it would start."""


def main(cfg: Config) -> int:
    """Print the dry run's report; exit status 0 if the command would start, else the
    first problem's (every problem is printed, one line each). The run's own checks
    decide (the launch environment, gpt/preflight.py, the data loader's rule), so the
    two cannot disagree."""
    try:  # what the run reads first: a broken launch environment is the whole answer
        launch = launch_environment(os.environ)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        print("dry run: the run would not start", file=sys.stderr)
        return e.exit_code
    if launch is not None and launch.rank != 0:
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
    world = launch.world_size if launch is not None else 1
    device = check(lambda: pick_device(cfg.train.device, launch.local_rank if launch else 0))
    dtype = check(lambda: resolve_dtype(cfg.train.dtype, device)) if device is not None else None
    accum, choice = None, None
    if device is not None:
        runtime = Runtime(device=device, world_size=world, distributed=launch is not None)
        cfg, choice = check(lambda: layout.settle_for(cfg, runtime)) or (cfg, None)
        if choice is not None:
            print(choice.line(), flush=True)
        if not layout.unsettled(cfg):  # what follows needs the layout's values
            accum = check(lambda: check_start(cfg, runtime))
    print(describe(cfg))
    print(f"params:     {param_count(cfg.model):,} ({memory.model_name(cfg)} model)")
    if device is not None:
        chunked = cfg.train.chunked_loss_on(device.type)
        loss = (f"chunked ({loss_kernels.resolve(cfg.train.loss_kernel, device.type)})"
                if chunked else "whole logits")
        print(f"device:     {device} ({device_name(device)}) x {world} process(es) | parallel "
              f"{cfg.train.parallel} | precision {DTYPE_NAMES.get(dtype, '?')} | compile "
              f"{cfg.train.compile_on(device.type)} | loss {loss}"
              + (f" | fp8 {cfg.train.fp8}{' (emulated)' if fp8.emulated(device.type) else ''}"
                 if cfg.train.fp8 != "none" else ""))
    d = cfg.data
    if accum is not None:
        print(f"batch:      {d.batch_size} x {d.seq_len} tokens per micro-batch x {world} "
              f"process(es) x {accum} accumulation step(s) = {d.total_batch_tokens:,} tokens "
              f"per step; {cfg.train.max_steps:,} steps = "
              f"{human_count(cfg.train.max_steps * d.total_batch_tokens)} tokens")
    if not layout.unsettled(cfg):
        check(lambda: _data(cfg, world))
    if accum is not None:  # tokens, time where measured, disk (gpt/expected.py)
        print("\n".join(expected.lines(cfg, device, device_name(device), world)))
    check(lambda: check_out_dir(cfg.train.out_dir))
    check(lambda: check_eval_tasks(cfg))
    check(lambda: _start(cfg))
    if accum is not None and dtype is not None:  # the planner refuses what check_start did
        check(lambda: _memory(cfg, world, device, choice.plan if choice else None))
    if problems:
        print(f"dry run: {len(problems)} problem(s) above; the run would not start"
              + (" (or would run out of memory in its first step)"
                 if any(isinstance(p, WillNotFit) for p in problems) else ""),
              file=sys.stderr)
        return problems[0].exit_code
    print("dry run: the run would start")
    return 0


def _data(cfg: Config, world: int) -> None:
    d = cfg.data
    note = check_not_being_written(d.data_dir, d.allow_incomplete_data)
    if note:
        print(f"warning: {note}", file=sys.stderr)
    tokens, val = check_data(cfg, world)  # the trainer's check, before its ranks meet
    passes = cfg.train.max_steps * d.total_batch_tokens / max(tokens, 1)
    print(f"data:       {d.data_dir}: {len(find_shards(d.data_dir, 'train'))} train shard(s), "
          f"{tokens:,} tokens; one pass is {tokens // d.total_batch_tokens:,} steps, the run "
          f"{passes:.2f} pass(es)")
    if val is not None:
        print(f"            {len(find_shards(d.data_dir, 'val'))} val shard(s), {val:,} tokens")
    elif cfg.eval.val_every:
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


def _memory(cfg: Config, world: int, device: torch.device,
            plan: memory.MemoryPlan | None = None) -> None:
    if plan is None:  # (the auto layout's own plan, if it made one)
        print("memory:     planning the peak with fake tensors ...", flush=True)
        plan = memory.plan(cfg, world_size=world, device_type=device.type)
    print("\n".join("            " + line for line in plan.table().splitlines()))
    capacity = device_memory(device)
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
    raise WillNotFit(f"memory: the planned peak will not fit {name}: {lower}; "
                     f"--activation-checkpointing or --parallel fsdp over more devices lower "
                     f"it further")
