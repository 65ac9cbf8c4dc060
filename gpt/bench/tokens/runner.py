"""The tokens bench's runs: a point (a recipe's parts, steps and learning rate) trained over
seeds, each run once (from the run cache when it is there), at most --jobs trainer runs at a
time however many points, seeds and variants are asked for at once (Bench.together).

Why a slot per run rather than a pool per point: a point has 3 seeds and a 2-core machine 2
slots, so a point at a time leaves a core idle for its third seed; asking for the points
that do not depend on each other together keeps every slot busy."""

from __future__ import annotations

import argparse
import copy
import signal
import statistics
import threading
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from functools import partial
from pathlib import Path
from typing import Any, Callable, TypeVar

from gpt.bench.runs import read_metrics, run_trainer, signal_group
from gpt.bench.tokens import recipes
from gpt.bench.tokens.bench import trainer_flags
from gpt.bench.tokens.cache import ORIGIN, RunCache
from gpt.core.errors import UserError

T = TypeVar("T")


class NotCached(Exception):
    """With --cached-only: a run the cache does not hold (the message says which)."""


class Bench:
    """Runs points (parts, steps, learning rate) over seeds, each once, in a work folder."""

    def __init__(self, args: argparse.Namespace, work: Path, cache: RunCache) -> None:
        self.args, self.work, self.cache, self.runs = args, work, cache, []
        self.points: dict[tuple, dict[str, Any]] = {}  # in the order they completed
        self.pending: dict[tuple, Future] = {}  # a point asked for twice is trained once
        # what the threads of together() share is taken under the lock
        self.lock = threading.Lock()
        self.slots = threading.Semaphore(args.jobs)  # trainer runs going on at most
        self.started = 0  # trainer runs started: each its own work folder
        self.live: set[int] = set()  # the process groups of the runs going on now
        self.stopping = False  # set on Ctrl-C or a failure: no run starts after it

    def together(self, calls: list[Callable[[], T]], at_most: int | None = None) -> list[T]:
        """Each call's result, in order: the calls side by side in threads (at most `at_most`
        at once; the trainer runs among them share the --jobs slots), or one after another
        with --jobs 1. On Ctrl-C (or the SIGTERM made one), which only the main thread sees,
        or any call's failure, every run going on is killed and none starts after it."""
        if self.args.jobs == 1 or len(calls) < 2:
            return [c() for c in calls]
        with ThreadPoolExecutor(max_workers=at_most or len(calls)) as pool:
            futures = [pool.submit(c) for c in calls]
            try:  # the first failure ends them all, whichever call it is
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                for f in futures:
                    if f in done and f.exception() is not None:
                        raise f.exception()  # type: ignore[misc]
                return [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                self.stop()
                raise

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            for pgid in self.live:
                signal_group(pgid, signal.SIGKILL)

    def point(self, label: str, parts: tuple[str, ...], steps: int, lr: float) -> dict[str, Any]:
        """A recipe at a budget and learning rate over --seeds seeds: their mean final
        validation loss and its standard deviation, times and peak memory, and each run."""
        key = (tuple(sorted(parts)), steps, lr)
        with self.lock:
            future, mine = self.pending.get(key), key not in self.pending
            if mine:
                future = self.pending[key] = Future()
        assert future is not None
        if not mine:
            return future.result()
        try:
            seeds = self.together([partial(self.train, label, parts, steps, lr,
                                           self.args.seed + i) for i in range(self.args.seeds)])
        except BaseException as e:
            future.set_exception(e)
            raise
        losses = [r["final_val_loss"] for r in seeds]
        p = {"label": label, "parts": list(parts), "steps": steps, "lr": lr,
             "tokens": steps * self.args.total_batch_tokens,
             "final_val_loss": statistics.mean(losses),
             "final_val_loss_std": statistics.stdev(losses) if len(losses) > 1 else 0.0,
             "train_seconds": statistics.mean(r["train_seconds"] for r in seeds),
             "wall_seconds": statistics.mean(r["wall_seconds"] for r in seeds),
             "peak_mem_gb": max(r["peak_mem_gb"] for r in seeds), "seeds": seeds}
        with self.lock:
            self.points[key] = p
        future.set_result(p)
        print(f"{label:28s} {steps:5d} steps, lr {lr:g}: final val "
              f"{p['final_val_loss']:.4f} +- {p['final_val_loss_std']:.4f}", flush=True)
        return p

    def train(self, label: str, parts: tuple[str, ...], steps: int, lr: float,
              seed: int) -> dict[str, Any]:
        """One run: from the cache if a run with the same flags and data is there, else
        trained and appended to it at once (so that an interrupt loses no finished run)."""
        args = copy.copy(self.args)
        args.seed = seed
        what = f"{label} ({steps} steps, lr {lr:g}, seed {seed})"
        flags = [*trainer_flags(args, steps),
                 *recipes.flags(parts, steps, lr, args.new_max_lr, args.new_muon_lr)]
        key = self.cache.key(flags)
        entry = self.cache.get(key)
        reused = entry is not None
        if entry is None and self.args.cached_only:
            raise NotCached(what)
        if entry is None:
            run = {"label": label, "seed": seed, "steps": steps, "lr": lr,
                   **self.measure(flags, what)}
            with self.lock:
                entry = self.cache.add(key, run)
        else:
            print(f"reused {what}: run at {entry.get('time')}, commit "
                  f"{str(entry.get('commit'))[:12]} ({self.cache.path})", flush=True)
        # the label is this bench's name for the point (an ablation's may differ)
        run = {**entry["run"], "label": label, "reused": reused,
               "origin": {k: entry.get(k) for k in ORIGIN}}
        with self.lock:
            self.runs.append(run)
        return run

    def measure(self, flags: list[str], what: str) -> dict[str, Any]:
        """Train one run in the work folder, in one of the --jobs slots: what its metrics say."""
        with self.slots:
            with self.lock:
                if self.stopping:
                    raise UserError(f"{what}: not started (the bench is stopping)")
                out = self.work / f"run{self.started:04d}"
                self.started += 1
            mine: list[int] = []

            def started(pgid: int) -> None:
                with self.lock:
                    mine.append(pgid)
                    self.live.add(pgid)
                    if self.stopping:
                        signal_group(pgid, signal.SIGKILL)

            try:
                wall = run_trainer([*flags, "--out-dir", str(out)], what, on_start=started)
            finally:
                with self.lock:
                    self.live.difference_update(mine)
        records = read_metrics(out)
        curve = [[r["step"] * self.args.total_batch_tokens, r["val_loss"]] for r in records
                 if r.get("type") == "val"]
        if not curve:
            raise UserError(f"{what}: the trainer logged no validation loss (--val-every and "
                            f"--trainer-flags must leave evaluation on)")
        return {"curve": curve, "final_val_loss": curve[-1][1],
                "train_seconds": round(train_seconds(records), 3),
                "wall_seconds": round(wall, 2), "flags": flags,
                # the process's peak resident memory on CPU (the allocator's on a GPU)
                "peak_mem_gb": max((r.get("peak_mem_gb") or 0.0 for r in records
                                    if r.get("type") == "train"), default=0.0)}


def train_seconds(records: list[dict[str, Any]]) -> float:
    """A run's training time from its step records: each gives the mean step time since
    the one before (the trainer leaves evaluation and checkpoints out of it)."""
    total, prev = 0.0, -1
    for r in records:
        if r.get("type") == "train":
            total += r["ms"] / 1000 * (r["step"] - prev)
            prev = r["step"]
    return total
