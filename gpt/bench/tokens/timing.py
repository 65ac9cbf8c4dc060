"""The tokens bench's timing phase: time to the target from step times measured side by side.

The bench's runs are made at different times, and with the run cache (cache.py) in
different invocations, on a machine that other jobs share: summing their own training times
(train_seconds) puts whatever load each met into the ratio. So at the end of the bench the
recipes compared (the GPT-2 recipe of the target, the best new recipe, its tied-head
variant) run again, --timing-steps steps each, alternately (each first in turn, see
gpt.bench.runs.rotated), --timing-repeats times: a drift in load falls on all of them alike.
These runs are never cached: their point is to be made together, now.

A run's step time is the median of the trainer's per-step ``ms`` (metrics.jsonl, logged
every step here) from step WARMUP_STEPS on; a recipe's is the median of its repeats', with
their min and max as the spread. Then

    seconds to target = tokens_to_target / tokens per step x the recipe's median step s
    time_ratio = (baseline steps x its median step s) / (new steps to target x its step s)

and per seed from each seed's tokens to the target.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from gpt.bench.runs import read_metrics, rotated, run_trainer
from gpt.bench.tokens import recipes
from gpt.bench.tokens.bench import spread, trainer_flags
from gpt.core.errors import UserError

WARMUP_STEPS = 5  # steps 0-4 (allocation, first-call costs) are not timed
Recipe = tuple[tuple[str, ...], float]  # parts, learning rate


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timing-steps", type=int, default=30,
                   help=f"steps of each timing run (median step time from step {WARMUP_STEPS} on)")
    p.add_argument("--timing-repeats", type=int, default=3,
                   help="timing runs per recipe, alternating between the recipes (0: no timing "
                   "phase, time_ratio_from_run_times alone: for a machine no other job shares)")


def check_flags(args: argparse.Namespace) -> None:
    if args.timing_repeats < 0:
        raise UserError(f"--timing-repeats {args.timing_repeats}: must be >= 0 (0: no timing phase)")
    if args.timing_repeats and args.timing_steps <= WARMUP_STEPS:
        raise UserError(f"--timing-steps {args.timing_steps}: must be more than {WARMUP_STEPS} "
                        f"(steps 0-{WARMUP_STEPS - 1} are warm-up, not timed)")


def timing_flags(args: argparse.Namespace, parts: tuple[str, ...], lr: float,
                 out: Path) -> list[str]:
    """A timing run's trainer flags: the bench's, with a line (and its step time) every step
    and no evaluation (its time is not a step's)."""
    flags = [*trainer_flags(args, args.timing_steps),
             *recipes.flags(parts, args.timing_steps, lr, args.new_max_lr, args.new_muon_lr)]
    for name, value in (("--log-every", "1"), ("--val-every", "0")):
        i = flags.index(name)
        flags[i + 1] = value
    return [*flags, "--out-dir", str(out)]


def step_ms(records: list[dict[str, Any]]) -> list[float]:
    """The per-step times (ms) of a run logged every step, warm-up left out."""
    return [r["ms"] for r in records if r.get("type") == "train" and r["step"] >= WARMUP_STEPS]


def time_one(flags: list[str], what: str, out: Path) -> float:
    """One timing run: its median step time in seconds."""
    run_trainer(flags, what)
    ms = step_ms(read_metrics(out))
    if not ms:
        raise UserError(f"{what}: the trainer logged no step from step {WARMUP_STEPS} on")
    return statistics.median(ms) / 1000


def time_recipes(args: argparse.Namespace, work: Path,
                 todo: dict[str, Recipe]) -> dict[str, Any]:
    """Each recipe's step time, the recipes run in turn --timing-repeats times."""
    got: dict[str, list[float]] = {name: [] for name in todo}
    for i in range(args.timing_repeats):
        for name in rotated(list(todo), i):
            parts, lr = todo[name]
            out = work / f"timing-{list(todo).index(name)}-{i}"
            what = f"timing {name} (repeat {i + 1}/{args.timing_repeats})"
            got[name].append(time_one(timing_flags(args, parts, lr, out), what, out))
            print(f"{what}: {got[name][-1] * 1000:.1f} ms/step", flush=True)
    return {name: {"parts": list(todo[name][0]), "lr": todo[name][1],
                   "median_step_s": statistics.median(s), "min_step_s": min(s),
                   "max_step_s": max(s), "repeats_step_s": s} for name, s in got.items()}


def side_by_side(c: dict[str, Any], base: dict[str, Any], tokens_per_step: int,
                 base_t: dict[str, Any], new_t: dict[str, Any]) -> dict[str, Any]:
    """A crossing's seconds and time_ratio from the step times measured side by side, with
    the per-seed spread, and the ratio's range over the repeats' slowest and fastest."""
    base_s = base["steps"] * base_t["median_step_s"]

    def seconds(tokens: float | None, step_s: float) -> float | None:
        return tokens / tokens_per_step * step_s if tokens else None

    secs = seconds(c["tokens_to_target"], new_t["median_step_s"])
    per_seed = [seconds(t, new_t["median_step_s"]) for t in c["tokens_to_target_per_seed"]]
    lo = seconds(c["tokens_to_target"], new_t["max_step_s"])
    hi = seconds(c["tokens_to_target"], new_t["min_step_s"])
    return {"baseline_seconds": base_s, "seconds_to_target": secs,
            "time_ratio": base_s / secs if secs else None,
            "time_ratio_per_seed": spread([base_s / s if s else None for s in per_seed]),
            "time_ratio_range": ([base["steps"] * base_t["min_step_s"] / lo,
                                  base["steps"] * base_t["max_step_s"] / hi] if lo and hi
                                 else None)}
