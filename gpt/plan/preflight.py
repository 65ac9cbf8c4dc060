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
  extras     the optional packages the flags need, imported as the run imports them
             (gpt/core/extras.py): --tensorboard, --wandb-project, --fp8, a CUDA loss kernel,
             --eval-tasks
  model      --init-from's depth and width (gpt/checkpoint/weights.py)
  device     the device of this rank, the precision it runs
  start      fresh or the checkpoint --resume continues from (gpt/checkpoint/files.py)
  layout     --parallel/--activation-checkpointing/--batch-size auto (gpt/plan/layout.py)
  run        the parallel mode against the launch, the loss kernel and FP8 against the
             device, the batch against the world, the parameters against the device's
             memory (gpt/model/sizing.py)
  data       enough tokens in each split for one step of every rank; with --check-tokens
             every token id within the vocabulary; a folder fineweb.py is still writing
  files      --out-dir, --hellaswag-file, --eval-tasks' names
  memory     (when asked) the planner's peak against the device's memory (gpt/plan/memory.py)
Nothing is built on the device, no process group is started and nothing is written.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, TypeVar

import torch

from gpt.checkpoint import weights
from gpt.checkpoint.files import ResumePoint, resume_differences, resume_point
from gpt.core.config import Config, ConfigError
from gpt.core.config_check import grad_accum_steps
from gpt.core.errors import UserError
from gpt.data.loader import steps_per_pass
from gpt.data.shards import check_not_being_written, find_shards, read_shard, shard_num_tokens
from gpt.engine.parallel import check_mode
from gpt.eval import harness_tasks
from gpt.model import fp8, loss_kernels, sizing
from gpt.plan import layout, memory
from gpt.report.trackers import check_tracking
from gpt.runtime.device import pick_device, resolve_dtype
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

    def check(what: Callable[[], T]) -> T | None:
        try:
            return what()
        except UserError as e:
            plan.problems.append(e)
            return None

    plan.launch = check(lambda: launch_environment(os.environ if env is None else env))
    if plan.problems:
        return plan  # a broken launch environment is the whole answer
    launch = plan.launch
    t = cfg.train
    check(lambda: check_tracking(t.tensorboard, t.wandb_project))
    plan.cfg = check(lambda: weights.with_pretrained_shape(cfg)) or cfg
    device = check(lambda: pick_device(t.device, launch.local_rank if launch else 0))
    if device is not None and check(lambda: check_launch_device(device, launch) or True):
        plan.runtime = Runtime(device=device, rank=launch.rank if launch else 0,
                               local_rank=launch.local_rank if launch else 0,
                               world_size=launch.world_size if launch else 1,
                               distributed=launch is not None)
        plan.dtype = check(lambda: resolve_dtype(t.dtype, device))
        plan.capacity = sizing.device_memory(device)
    plan.start = check(lambda: resume_point(Path(t.out_dir), cfg.checkpoint.resume,
                                            verify_resume))
    if plan.runtime is not None:
        _settle_layout(plan, check)
    if plan.runtime is not None and not layout.unsettled(plan.cfg):
        plan.accum = check(lambda: check_run(plan.cfg, plan.runtime, plan.capacity))
        plan.data = check(lambda: check_data(plan.cfg, plan.runtime.world_size, plan.warnings))
    check(lambda: check_out_dir(t.out_dir))
    check(lambda: check_hellaswag_file(cfg))
    check(lambda: check_eval_tasks(cfg))
    if plan.start is not None and plan.start.path is not None:
        _check_resume(plan, check)
    if plan_memory and plan.accum is not None and plan.dtype is not None:
        plan.memory = (plan.layout.plan if plan.layout is not None and plan.layout.plan else
                       check(lambda: memory.plan(plan.cfg, world_size=plan.runtime.world_size,
                                                 device_type=plan.runtime.device_type)))
        if plan.memory is not None:
            check(lambda: check_peak(plan.cfg, plan.runtime, plan.capacity, plan.memory))
    return plan


def _settle_layout(plan: Plan, check: Callable) -> None:
    """The automatic layout's values, from the checkpoint resumed from where they can run
    here, else from the planner against the device's memory."""
    runtime, start = plan.runtime, plan.start
    saved = start.saved if start is not None else None
    settled = check(lambda: layout.settle(plan.cfg, runtime.world_size, runtime.device_type,
                                          plan.capacity, saved, runtime.distributed))
    if settled is not None:
        plan.cfg, plan.layout = settled


def _check_resume(plan: Plan, check: Callable) -> None:
    """The checkpoint is one of this model, with this optimizer (a refusal); settings
    changed since are said (from a verified checkpoint: its resume says them otherwise)."""
    start = plan.start
    notes = check(lambda: resume_differences(start.saved, plan.cfg, start.path))
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
    sizing.check_fits(cfg, runtime.world_size, capacity, str(runtime.device))
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


def check_out_dir(out_dir: str) -> None:
    """--out-dir names a folder, or a path where one can be made and written: a file
    there (or in its way) is refused before anything is built. Nothing is created: the
    run makes the folder when it takes it (gpt/checkpoint/checkpointer.py), the dry run never."""
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


def check_hellaswag_file(cfg: Config) -> None:
    """--hellaswag-file, where HellaSwag runs and it names a local file, exists (an http(s)
    address, or none for the official set, is fetched when the run starts)."""
    e = cfg.eval
    source = e.hellaswag_file
    if not e.hellaswag_every or source is None or source.startswith(("http://", "https://")):
        return
    if source == "val" and not Path(source).exists():
        return  # the official validation set's name
    if not Path(source).is_file():
        raise ConfigError(f"--hellaswag-file {source}: no such file; give a local HellaSwag "
                          f"jsonl, or leave the flag out to download the validation set")


def check_eval_tasks(cfg: Config) -> None:
    """--eval-tasks: lm-eval importable, --eval-tasks-include a folder, every task a name
    the harness knows. No task's data is loaded (that may download): a task whose data
    cannot be loaded is a warning when the run starts, and the run goes on without it."""
    e = cfg.eval
    if e.eval_tasks_every:
        harness_tasks.check_tasks(e.eval_tasks, e.eval_tasks_include, flag="--eval-tasks",
                                  include_flag="--eval-tasks-include")


def check_peak(cfg: Config, runtime: Runtime, capacity: int | None,
               plan: memory.MemoryPlan) -> None:
    """The memory planner's peak per device fits the device, or WillNotFit naming the
    largest --batch-size that does."""
    world = runtime.world_size
    if capacity is None or plan.fits(capacity):
        return
    d = cfg.data
    b, _ = memory.largest_batch(cfg, capacity, world, runtime.device_type, limit=d.batch_size)
    while b > 1 and d.total_batch_tokens % (b * d.seq_len * world):
        b -= 1  # the batch must still divide --total-batch-tokens
    lower = (f"lower --batch-size to {b} (the largest that fits; accumulation keeps "
             f"--total-batch-tokens)" if b else "no --batch-size fits")
    raise WillNotFit(f"memory: the planned peak will not fit {runtime.device} "
                     f"({capacity / GiB:.1f} GiB): {lower}; --activation-checkpointing or "
                     f"--parallel fsdp over more devices lower it further")
