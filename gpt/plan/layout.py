"""The layout a run takes when the user leaves it to the trainer: --parallel auto,
--activation-checkpointing auto and --batch-size auto, each settled before anything is
built, from the memory planner's peak (gpt/plan/memory.py: a step traced on fake tensors,
nothing allocated) against the device's memory.

The rule, cheapest first:
- parallel: in one process always ddp (plain single-device training): there is nothing
  to shard over, and FSDP on one device only adds its copies and casts. Over several
  processes ddp if a whole replica fits, else zero1 (AdamW's state sharded), else fsdp
  (never where the optimizer refuses it: OptimizerKind.layout_problem, gpt/optim/kind.py).
- activation checkpointing: none if it fits, else selective, else blocks. A layout
  with less recomputation is tried before one with more sharding: recomputation is
  compute the step waits for, while sharding's communication overlaps the compute.
- batch size: the largest micro-batch that fits and divides --total-batch-tokens over
  the processes (gradient accumulation keeps every step at --total-batch-tokens), with
  the chosen layout.
"Fits" is the planner's: the planned peak x1.05 + 1 GiB within the device's memory
(MemoryPlan.fits), the same test the dry run makes.

The choice is made once. The values are written as plain values wherever the run's
config goes (config.toml, every checkpoint, the metrics header), so a repeat with
--config config.toml runs the same layout, and a resume of a run whose flags say auto
takes the checkpoint's values rather than choosing again (unless they cannot run in the
new world: another process count that the batch does not divide, or a sharded mode in
one process). What was chosen, and why, is one line at the start of the run and of the
dry run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from gpt.core.config import AUTO, Config, ConfigError
from gpt.core.config_check import MAX_MICRO_TOKENS, validate
from gpt.model import sizing
from gpt.optim import optimizer
from gpt.plan import memory


GiB = 2**30
Planner = Callable[[Config, int, str], "memory.MemoryPlan"]
CHECKPOINTING = ("none", "selective", "blocks")  # cheapest first
FIELDS = {"parallel": "train", "activation_checkpointing": "train", "batch_size": "data"}


@dataclass(frozen=True)
class Choice:
    """What settle() decided: the three values, where they came from ("planned" or
    "checkpoint"), the planned peak of the chosen layout against the device's memory
    (planned only), and why, in words."""

    parallel: str
    activation_checkpointing: str
    batch_size: int
    source: str
    reasons: tuple[str, ...] = ()
    plan: memory.MemoryPlan | None = None
    capacity: int | None = None
    decided: tuple[str, ...] = ()  # the fields that were auto

    def line(self) -> str:
        """The start line's account of the choice."""
        values = (f"--parallel {self.parallel}, --activation-checkpointing "
                  f"{self.activation_checkpointing}, --batch-size {self.batch_size}")
        if self.source == "checkpoint":
            return f"layout (auto): {values}, as the checkpoint resumed from chose"
        peak = (f": planned peak {self.plan.peak_bytes / GiB:.1f} GiB of "
                f"{self.capacity / GiB:.1f} GiB" if self.plan and self.capacity else "")
        return f"layout (auto): {values}{peak} ({'; '.join(self.reasons)})"

    def to_json(self) -> dict[str, Any]:
        return {"parallel": self.parallel, "activation_checkpointing": self.activation_checkpointing,
                "batch_size": self.batch_size, "source": self.source, "auto": list(self.decided),
                "reasons": list(self.reasons), "capacity_bytes": self.capacity,
                "planned_peak_bytes": self.plan.peak_bytes if self.plan else None}


def unsettled(cfg: Config) -> list[str]:
    """The layout fields cfg leaves to the trainer (set to auto)."""
    return [name for name, section in FIELDS.items()
            if getattr(getattr(cfg, section), name) == AUTO]


def with_layout(cfg: Config, parallel: str, checkpointing: str, batch: int) -> Config:
    """cfg with these three layout values, validated as any config is."""
    out = dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, parallel=parallel,
                                       activation_checkpointing=checkpointing),
        data=dataclasses.replace(cfg.data, batch_size=batch))
    validate(out)
    return out


def settle(cfg: Config, world_size: int, device_type: str, capacity: int | None,
           saved: dict[str, Any] | None = None, distributed: bool = False,
           planner: Planner | None = None,
           progress: memory.Say = memory.quiet) -> tuple[Config, Choice | None]:
    """cfg with every auto layout value replaced by a plain one, and the Choice (None if
    nothing was auto). `saved`: the config dict of the checkpoint the run resumes from,
    whose values an auto field takes if they can still run here; `capacity`: the bytes
    of one device; `planner`: memory.plan (tests pass a stand-in); `progress`: told each
    layout before it is planned (memory.Progress says it on stderr when the search is long)."""
    auto = unsettled(cfg)
    if not auto:
        return cfg, None
    t, d = cfg.train, cfg.data
    if saved is not None:
        values = {name: saved[section][name] if name in auto else getattr(getattr(cfg, section), name)
                  for name, section in FIELDS.items()}
        if _runs_here(cfg, values, world_size, distributed):
            return (with_layout(cfg, values["parallel"], values["activation_checkpointing"],
                                values["batch_size"]),
                    Choice(values["parallel"], values["activation_checkpointing"],
                           values["batch_size"], "checkpoint", decided=tuple(auto)))
    if capacity is None:
        raise ConfigError(f"{' '.join(_flag(n) + ' auto' for n in auto)}: this device's memory "
                          f"cannot be read, so nothing can be fitted to it: give the values")
    planned = planner or (lambda c, w, dev: memory.plan(c, world_size=w, device_type=dev))

    def plan_fn(c: Config, w: int, dev: str) -> memory.MemoryPlan:
        progress(f"--parallel {c.train.parallel}, --activation-checkpointing "
                 f"{c.train.activation_checkpointing}, --batch-size {c.data.batch_size}")
        return planned(c, w, dev)
    batches = _batches(cfg, world_size) if d.batch_size == AUTO else [d.batch_size]
    state_bytes = optimizer.chosen(cfg.optim).least_state_bytes
    tried: list[str] = []
    for checkpointing in (CHECKPOINTING if t.activation_checkpointing == AUTO
                          else (t.activation_checkpointing,)):
        for parallel in _modes(cfg, world_size, distributed):
            trial = with_layout(cfg, parallel, checkpointing, batches[-1])
            if sizing.least_bytes(trial, world_size, state_bytes) > capacity:
                tried.append(f"{parallel}/{checkpointing}: its weights, gradients and optimizer "
                             f"state alone exceed it")
                continue
            smallest = plan_fn(trial, world_size, device_type)
            if not smallest.fits(capacity):
                tried.append(f"{parallel}/{checkpointing} at --batch-size {batches[-1]}: "
                             f"{smallest.peak_bytes / GiB:.1f} GiB planned")
                continue
            batch, plan = _largest(trial, batches, smallest, capacity, world_size, device_type,
                                   plan_fn)
            reasons = _reasons(cfg, auto, parallel, checkpointing, batch, world_size, tried)
            return (with_layout(cfg, parallel, checkpointing, batch),
                    Choice(parallel, checkpointing, batch, "planned", tuple(reasons), plan,
                           capacity, tuple(auto)))
    raise ConfigError(
        f"{' '.join(_flag(n) + ' ' + str(_value(cfg, n)) for n in FIELDS)}: no layout fits "
        f"{capacity / GiB:.1f} GiB per device with x{memory.MARGIN} + "
        f"{memory.RESERVE // GiB} GiB of margin ({'; '.join(tried)}): use more devices "
        f"(torchrun), a shorter --seq-len or a smaller model")


def _value(cfg: Config, name: str) -> Any:
    return getattr(getattr(cfg, FIELDS[name]), name)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _modes(cfg: Config, world_size: int, distributed: bool) -> tuple[str, ...]:
    """The --parallel values to try, least sharding first."""
    if cfg.train.parallel != AUTO:
        return (cfg.train.parallel,)
    if world_size == 1:
        return ("ddp",)
    kind = optimizer.chosen(cfg.optim)  # an optimizer may refuse a layout (whole matrices)
    return tuple(m for m in ("ddp", "zero1", "fsdp") if kind.layout_problem(m) is None)


def _batches(cfg: Config, world_size: int) -> list[int]:
    """The micro-batch sizes that divide the step's sequences per process, largest first."""
    d = cfg.data
    per_micro = d.seq_len * world_size
    if d.total_batch_tokens % per_micro:
        raise ConfigError(
            f"--batch-size auto: --total-batch-tokens {d.total_batch_tokens} is not a multiple "
            f"of --seq-len {d.seq_len} x {world_size} process(es) = {per_micro}, so no "
            f"micro-batch divides it: pick a total that is a multiple of {per_micro}")
    sequences = d.total_batch_tokens // per_micro
    most = MAX_MICRO_TOKENS // d.seq_len
    return [b for b in range(min(sequences, most), 0, -1) if sequences % b == 0]


def _largest(cfg: Config, batches: list[int], smallest: memory.MemoryPlan, capacity: int,
             world_size: int, device_type: str, plan_fn: Planner
             ) -> tuple[int, memory.MemoryPlan]:
    """The largest of `batches` (largest first) whose plan fits, given that the last one
    fits (its plan: `smallest`). The peak grows about linearly with the batch: two plans
    give the line, and plans at its estimate and beside it settle the exact value."""
    plans = {batches[-1]: smallest}

    def fits(b: int) -> bool:
        if b not in plans:
            plans[b] = plan_fn(with_layout(cfg, cfg.train.parallel,
                                           cfg.train.activation_checkpointing, b),
                               world_size, device_type)
        return plans[b].fits(capacity)

    if len(batches) == 1:
        return batches[0], smallest
    ascending = batches[::-1]
    second = ascending[1]
    if not fits(second):
        return ascending[0], smallest
    slope = max((plans[second].peak_bytes - smallest.peak_bytes) / (second - ascending[0]), 1)
    room = (capacity - memory.RESERVE) / memory.MARGIN - smallest.peak_bytes
    estimate = ascending[0] + room / slope
    i = max(i for i, b in enumerate(ascending) if b <= max(estimate, second))
    while i > 1 and not fits(ascending[i]):
        i -= 1
    while i + 1 < len(ascending) and fits(ascending[i + 1]):
        i += 1
    return ascending[i], plans[ascending[i]]


def _runs_here(cfg: Config, values: dict[str, Any], world_size: int, distributed: bool) -> bool:
    """Whether a checkpoint's layout can run in this launch: a sharded mode needs a
    process group, and the micro-batch must divide the step over the processes."""
    if values["parallel"] != "ddp" and not distributed:
        return False
    if not isinstance(values["batch_size"], int) or values["batch_size"] < 1:
        return False
    d = cfg.data
    return d.total_batch_tokens % (values["batch_size"] * d.seq_len * world_size) == 0


def _reasons(cfg: Config, auto: list[str], parallel: str, checkpointing: str, batch: int,
             world_size: int, tried: list[str]) -> list[str]:
    """Why each auto value is what it is, in words."""
    out = []
    if "parallel" in auto:
        out.append("one process: no FSDP, nothing to shard over" if world_size == 1 else
                   {"ddp": "a whole replica fits each device",
                    "zero1": "only with AdamW's state sharded",
                    "fsdp": "only fully sharded"}[parallel])
    if "activation_checkpointing" in auto:
        out.append({"none": "no recomputation needed",
                    "selective": "recomputing the pointwise work is enough",
                    "blocks": "only with whole blocks recomputed"}[checkpointing])
    if tried:
        out.append("did not fit: " + ", ".join(tried))
    if "batch_size" in auto:
        d = cfg.data
        sequences = d.total_batch_tokens // (d.seq_len * world_size)
        out.append(f"micro-batch {batch}: the largest that fits and divides the {sequences} "
                   f"sequences per process of a step")
    return out
