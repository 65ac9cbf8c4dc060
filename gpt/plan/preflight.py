"""Will this run start, and what will it do? The one answer, before anything is built.

preflight(cfg) takes a config from any source (flags, a TOML file, and on resume the
checkpoint's saved config) and returns a Plan: the settled config (--init-from's shape,
the automatic layout's values), the launch and the device, the precision, the gradient
accumulation, the data's facts, the resume point and, when asked, the memory plan; or
every problem found, each one line. The trainer (gpt/train/trainer.py) raises the first problem
and builds from the plan; the dry run (gpt/plan/dry_run.py) prints the plan and every problem.
Both call it once and check nothing of their own, so a dry run's "the run would start"
is the run's own verdict. The readers of checkpoints (generate, evaluate, export,
gpt2-lm-eval, a resume) judge a saved config's size with the same arithmetic
(gpt/model/sizing.py) before they build a model.

In order, each check where what it needs is known:
  launch     the torchrun environment (a broken one is the whole answer)
  optimizer  its own fields and the layouts it refuses (gpt/optim/optimizer.py's check)
  extras     the optional packages the flags need, imported as the run imports them
             (gpt/core/extras.py): --tensorboard, --wandb-project, --fp8, a CUDA loss kernel
  model      --init-from's depth and width (gpt/checkpoint/weights.py)
  device     the device of this rank, the precision it runs; on a CPU, a warning where other
             processes already hold the cores its threads need (gpt/runtime/machine_load.py)
  start      fresh or the checkpoint --resume continues from (gpt/checkpoint/files.py)
  layout     --parallel/--activation-checkpointing/--batch-size auto (gpt/plan/layout.py)
  run        the parallel mode against the launch, the loss kernel and FP8 against the
             device, the batch against the world, the parameters against the device's
             memory (gpt/model/sizing.py)
  data       enough tokens in each split for one step of every rank; the first shard's
             first token ids (with --check-tokens every one) within the vocabulary; a
             folder fineweb.py is still writing
  files      --out-dir and the files the run opens there (gpt/checkpoint/run_folder.py),
             the --torch-profile and --memory-snapshot paths, --sample-prompt's tokens
  disk       the checkpoints the run keeps at once against the space free at --out-dir
             (gpt/plan/expected.py)
  evaluate   each evaluation the run makes (gpt/eval/evaluations.py): its files, the hosts
             it downloads from, the packages it needs
  time       on rank 0, its share of the run's step timed on a slice of the model
             (gpt/plan/speed.py: about a second of the device's, the slice freed
             after); a recipe of hours on a CPU that --device auto fell back to, a warning
  memory     (when asked) the planner's peak against the device's memory (gpt/plan/memory.py)
Nothing else is built on the device, no process group is started and nothing is written.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, TypeVar

import torch

from gpt.checkpoint import run_folder, weights
from gpt.checkpoint.files import ResumePoint, resume_differences, resume_point
from gpt.core.config import Config, ConfigError
from gpt.core.config_check import grad_accum_steps
from gpt.core.errors import UserError
from gpt.core.units import format_duration
from gpt.data.loader import steps_per_pass
from gpt.data.tokenizer import gpt2_tokenizer
from gpt.data.shards import (check_first_tokens, check_not_being_written, find_shards,
                             read_shard, shard_num_tokens)
from gpt.engine.parallel import check_mode
from gpt.eval import evaluations
from gpt.eval.sampling import prompt_ids
from gpt.model import fp8, loss_kernels, sizing
from gpt.optim import optimizer
from gpt.plan import expected, layout, memory, speed
from gpt.report.flops import resident_memory
from gpt.report.profiling import check_profile_paths
from gpt.report.trackers import check_tracking
from gpt.runtime import machine_load
from gpt.runtime.device import device_name, pick_device, resolve_dtype
from gpt.runtime.launch import Launch, check_launch_device, launch_environment
from gpt.runtime.world import Runtime


GiB = 2**30
T = TypeVar("T")


class WillNotFit(UserError):
    """The memory planner's peak exceeds the device's memory: the run would start and
    then run out of memory in its first step."""


@dataclass(frozen=True)
class DataFacts:
    """What the data folder holds for this run: shards and tokens of each split (val None
    where validation is off or there are no val_* shards) and the steps one pass covers."""

    train_shards: int
    train_tokens: int
    steps_per_pass: int
    val_shards: int | None = None
    val_tokens: int | None = None


@dataclass
class Plan:
    """What preflight() found: the settled plan, as far as the checks got, and every
    problem (each one line). A field is None where the check that gives it failed or
    could not run (a later check that needs it is then left out, its problem already
    said)."""

    cfg: Config
    launch: Launch | None = None
    runtime: Runtime | None = None  # planned: no process group yet
    dtype: torch.dtype | None = None
    layout: layout.Choice | None = None
    accum: int | None = None
    data: DataFacts | None = None
    start: ResumePoint | None = None
    memory: memory.MemoryPlan | None = None
    capacity: int | None = None  # one device's memory, where it can be read
    estimate: speed.Estimate | None = None  # how long it takes here (timed on rank 0)
    time_line: str | None = None  # that, or the GPU bench's time, in words (rank 0)
    step_s: float | None = None  # one optimizer step's seconds in that (None: untimed)
    resident: int | None = None  # the process's resident bytes before the timing (CPU, MPS)
    warnings: list[str] = field(default_factory=list)
    problems: list[UserError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def settled(self) -> Plan:
        """This plan, if every check passed; else the first problem, raised."""
        if self.problems:
            raise self.problems[0]
        return self


def preflight(cfg: Config, env: Mapping[str, str] | None = None, verify_resume: bool = False,
              plan_memory: bool = False) -> Plan:
    """Every check a run makes before it builds anything (see the module docstring), in
    the environment `env` (os.environ by default: the torchrun variables). verify_resume:
    read the checkpoint to resume from whole, as the resume will (the dry run); the
    trainer leaves that to its resume, which makes it under the run folder's lock on rank
    0. plan_memory: trace the memory plan (the dry run). Returns the Plan; its problems
    are the errors, in the order found."""
    plan = Plan(cfg=cfg)

    def attempt(what: Callable[[], T]) -> T | None:
        """A check: its value, or None with its problem noted in the plan."""
        try:
            return what()
        except UserError as e:
            plan.problems.append(e)
            return None

    plan.launch = attempt(lambda: launch_environment(os.environ if env is None else env))
    if plan.problems:
        return plan  # a broken launch environment is the whole answer
    launch = plan.launch
    t = cfg.train
    # the optimizer's own fields, and its layout: first, as the config's checks come first
    attempt(lambda: optimizer.check(cfg.optim, t.parallel))
    attempt(lambda: check_tracking(t.tensorboard, t.wandb_project))
    if t.init_from:  # the model's shape is the checkpoint's on the hub or in the folder
        shaped = attempt(lambda: weights.pretrained_shape(cfg.model, t.init_from))
        plan.cfg = dataclasses.replace(cfg, model=shaped) if shaped is not None else cfg
    device = attempt(lambda: pick_device(t.device, launch.local_rank if launch else 0))
    if device is not None and attempt(lambda: check_launch_device(device, launch) or True):
        plan.runtime = Runtime(device=device, rank=launch.rank if launch else 0,
                               local_rank=launch.local_rank if launch else 0,
                               world_size=launch.world_size if launch else 1,
                               distributed=launch is not None)
        plan.dtype = attempt(lambda: resolve_dtype(t.dtype, device))
        plan.capacity = sizing.device_memory(device)
        if device.type == "cpu":  # other processes on the cores its threads would use
            busy = machine_load.busy_warning(machine_load.read_load(env))
            plan.warnings += [busy] if busy else []
    plan.start = attempt(lambda: resume_point(Path(t.out_dir), cfg.checkpoint.resume,
                                            verify_resume))
    if plan.runtime is not None:
        _settle_layout(plan, attempt)
    if plan.runtime is not None and not layout.unsettled(plan.cfg):
        plan.accum = attempt(lambda: check_run(plan.cfg, plan.runtime, plan.capacity))
        plan.data = attempt(lambda: check_data(plan.cfg, plan.runtime.world_size, plan.warnings))
    attempt(lambda: check_out_dir(cfg))
    if plan.accum is not None:  # the model's size judged: its checkpoint can be counted
        attempt(lambda: expected.check_disk(plan.cfg, plan.start.step if plan.start else 0))
    for ev in evaluations.enabled(cfg.eval):  # their files, hosts and packages
        attempt(lambda ev=ev: ev.check(cfg))
    attempt(lambda: check_profile_paths(cfg.profile))
    if cfg.eval.sample_every:  # the prompt the run samples from, as the run encodes it
        attempt(lambda: prompt_ids(gpt2_tokenizer(), cfg.eval.sample_prompt,
                                   plan.cfg.model.vocab_size, "--sample-prompt"))
    if plan.start is not None and plan.start.path is not None:
        _check_resume(plan, attempt)
    # timed before the memory plan, as the run times it (no plan traced first): what the
    # process holds, and what the timed step grows it by, are then the run's too
    if plan.runtime is not None and plan.runtime.device_type != "cuda":
        plan.resident = resident_memory()
    _estimate_time(plan, env)
    if plan_memory and plan.accum is not None and plan.dtype is not None:
        with memory.Progress("the memory of a step", sys.stdout) as progress:
            progress(f"{plan.cfg.model.n_layer} blocks")  # said if it takes seconds
            plan.memory = (plan.layout.plan if plan.layout is not None and plan.layout.plan else
                           attempt(lambda: memory.plan(plan.cfg,
                                                       world_size=plan.runtime.world_size,
                                                       device_type=plan.runtime.device_type)))
        if plan.memory is not None:
            attempt(lambda: check_peak(plan.cfg, plan.runtime, plan.capacity, plan.memory))
    return plan


def _settle_layout(plan: Plan, attempt: Callable) -> None:
    """The automatic layout's values, from the checkpoint resumed from where they can run
    here, else from the planner against the device's memory."""
    runtime, start = plan.runtime, plan.start
    saved = start.saved if start is not None else None
    # on stdout, before the layout line it leads to: stderr is for what went wrong
    with memory.Progress("the layout (auto)", sys.stdout) as progress:
        settled = attempt(lambda: layout.settle(
            plan.cfg, runtime.world_size, runtime.device_type, plan.capacity, saved,
            runtime.distributed, progress=progress if runtime.is_master else memory.quiet))
    if settled is not None:
        plan.cfg, plan.layout = settled


def _estimate_time(plan: Plan, env: Mapping[str, str] | None = None) -> None:
    """How long the run takes on this device, on rank 0: the GPU bench's measurement of
    this recipe on this GPU, else rank 0's share of the step timed here (the others print
    nothing); and the line that says it, also where the run is too short to time. A
    recipe that takes hours on a CPU that --device auto fell back to is a warning."""
    rt, cfg = plan.runtime, plan.cfg
    if rt is None or plan.accum is None or plan.dtype is None or not rt.is_master:
        return
    start, name = (plan.start.step if plan.start else 0), device_name(rt.device)
    measured = expected.measured_for(cfg, name, rt.device_type, rt.world_size)
    if measured is None:
        env = os.environ if env is None else env
        local = env.get("LOCAL_WORLD_SIZE", "1")
        plan.estimate = speed.estimate(
            cfg, rt.device, plan.dtype, plan.accum, start,
            val=plan.data is None or plan.data.val_tokens is not None, world=rt.world_size,
            local=int(local) if local.isdigit() and int(local) > 0 else 1)
        if cfg.train.device == "auto" and plan.estimate.meant_for_gpu(rt.device_type):
            plan.warnings.append(
                f"--device auto found no GPU and falls back to {rt.device}, where this recipe "
                f"takes about {format_duration(plan.estimate.total_s or 0)} "
                f"({plan.estimate.tokens_per_s:,.0f} tokens/s, timed here): it is meant for a "
                f"GPU; run it on one, or train the README's first run (configs/cpu-speedrun.toml) here")
        plan.step_s = plan.estimate.step_s
    else:
        plan.step_s = cfg.data.total_batch_tokens / measured.tokens_per_s
    plan.time_line = expected.time_line(cfg, rt.device, name, rt.world_size, plan.estimate, start)


def _check_resume(plan: Plan, attempt: Callable) -> None:
    """The checkpoint is one of this model, with this optimizer (a refusal); settings
    changed since are said (from a verified checkpoint: its resume says them otherwise)."""
    start = plan.start
    notes = attempt(lambda: resume_differences(start.saved, plan.cfg, start.path))
    if start.contents is not None:
        plan.warnings += list(start.notes)
        plan.warnings += [f"setting changed since the checkpoint: {n}" for n in notes or []]
        if start.step >= plan.cfg.train.max_steps:
            plan.warnings.append(f"step {start.step:,} is already --max-steps "
                                 f"{plan.cfg.train.max_steps:,}: nothing would be trained")


# ---------------------------------------------------------------------------------------
# the checks, each also callable alone (the memory planner, tests)


def check_run(cfg: Config, runtime: Runtime, capacity: int | None) -> int:
    """The settled config against the launch and the device: the parallel mode, the loss
    kernel, FP8, the batch over the world, the parameters against the device's memory.
    Returns the gradient accumulation steps."""
    check_mode(cfg.train.parallel, runtime)
    loss_kernels.check(cfg.train.loss_kernel, runtime.device_type,
                       cfg.train.chunked_loss_on(runtime.device_type))
    fp8.check(cfg.train, runtime.device)
    d = cfg.data
    accum = grad_accum_steps(d.total_batch_tokens, d.batch_size, d.seq_len, runtime.world_size)
    sizing.check_fits(cfg, runtime.world_size, capacity, str(runtime.device),
                      optimizer.chosen(cfg.optim).least_state_bytes)
    return accum


def check_data(cfg: Config, world_size: int, warnings: list[str] | None = None) -> DataFacts:
    """The data's facts, each split checked with the loader's own rule: one step of every
    rank needs batch x seq_len x world + 1 tokens. Reads the shards' headers only, unless
    --check-tokens asks for every token id to be within --vocab-size (the run's one scan:
    its loaders do not repeat it). A folder that fineweb.py is still writing is refused
    first (with --allow-incomplete-data, or one it stopped writing: a warning, appended to
    `warnings`)."""
    d = cfg.data
    note = check_not_being_written(d.data_dir, d.allow_incomplete_data)  # first: it says why
    if note and warnings is not None:
        warnings.append(note)

    def tokens(paths: list[Path]) -> int:
        if d.check_tokens:
            return sum(read_shard(p, cfg.model.vocab_size).size for p in paths)
        if paths:  # a vocabulary too small for the data, found before the first batch
            check_first_tokens(paths[0], cfg.model.vocab_size)
        return sum(shard_num_tokens(p) for p in paths)

    train_shards = find_shards(d.data_dir, "train")
    train = tokens(train_shards)
    steps = steps_per_pass(d.data_dir, "train", train, d.batch_size, d.seq_len, world_size)
    facts = DataFacts(len(train_shards), train, steps)
    if not cfg.eval.val_every:
        return facts
    try:
        val_shards = find_shards(d.data_dir, "val")
    except UserError:
        return facts  # no val_* shards: validation is off, as the trainer says
    val = tokens(val_shards)
    steps_per_pass(d.data_dir, "val", val, d.batch_size, d.seq_len, world_size)
    return dataclasses.replace(facts, val_shards=len(val_shards), val_tokens=val)


def check_out_dir(cfg: Config) -> None:
    """--out-dir and the files the run opens there, judged by the function the run itself
    calls as it takes the folder (gpt/checkpoint/run_folder.py): the folder can be made
    and written, its disk is not full, its lock is free, and no folder, FIFO or broken
    symlink stands where the run writes a file. Nothing is created: the run makes the
    folder when it takes it, the dry run never."""
    t = cfg.train
    run_folder.check_run_folder(Path(t.out_dir), t.tensorboard, bool(t.wandb_project))


def check_peak(cfg: Config, runtime: Runtime, capacity: int | None,
               plan: memory.MemoryPlan) -> None:
    """The memory planner's peak per device fits the device, or WillNotFit naming the
    largest --batch-size that does."""
    world = runtime.world_size
    if capacity is None or plan.fits(capacity):
        return
    d = cfg.data
    with memory.Progress("the largest --batch-size that fits", sys.stdout) as say:
        b, _ = memory.largest_batch(cfg, capacity, world, runtime.device_type,
                                    limit=d.batch_size,
                                    progress=say if runtime.is_master else memory.quiet)
    while b > 1 and d.total_batch_tokens % (b * d.seq_len * world):
        b -= 1  # the batch must still divide --total-batch-tokens
    lower = (f"lower --batch-size to {b} (the largest that fits; accumulation keeps "
             f"--total-batch-tokens)" if b else "no --batch-size fits")
    raise WillNotFit(f"memory: the planned peak will not fit {runtime.device} "
                     f"({capacity / GiB:.1f} GiB): {lower}; --activation-checkpointing or "
                     f"--parallel fsdp over more devices lower it further")
