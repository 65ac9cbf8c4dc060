"""A busy machine: other processes that want the cores torch's threads will use. torch
runs one thread a core by default, and its parallel sections wait for their slowest
thread, so a core taken by another process slows every step: a CPU run on 2 cores under a
load average of 7 to 11 took 6.5x as long as on the idle machine, and one thread
(OMP_NUM_THREADS=1) was 1.8x faster there than two.

Two judgements, both pure (the load average, the cores and the threads are handed in, so
they are tested without a busy machine):

  busy           the load average already takes the cores our threads would use: said
                 at the start of a CPU run and in its dry run (busy_warning, from
                 gpt/plan/preflight.py), and by the test suite at its start
  SlowdownWatch  during the run (gpt/train/loop.py): the steps have become much slower
                 than the fastest so far while the load is high; said once

The load average counts the processes running or waiting to run, over the machine's
cores (os.cpu_count()); it is the 1-minute figure, so a load that has just begun or ended
shows late. Where it cannot be read (Windows), nothing is said. GPT2_TRAINER_IGNORE_LOAD=1
turns both off (the test suite sets it for the runs it starts: their output must not
depend on the machine's load)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping

IGNORE = "GPT2_TRAINER_IGNORE_LOAD"
SLOWER = 2.0  # steps this many times the fastest so far, under load: worth a note


@dataclass(frozen=True)
class Load:
    """The machine's load: its 1-minute load average, its cores, the threads torch runs
    (each of this machine's processes of the run: torchrun's ranks on one host)."""

    average: float
    cores: int
    threads: int
    processes: int = 1

    @property
    def ours(self) -> int:
        return self.threads * self.processes

    def free_cores(self, running: bool) -> float:
        """The cores other processes leave free: before the run computes, the load is
        theirs alone; while it runs, our own threads are in it too."""
        others = self.average - (self.ours if running else 0)
        return self.cores - max(0.0, others)

    def fewer_threads(self, running: bool) -> int:
        """The threads a process of the run would have a core each with."""
        return max(1, int(self.free_cores(running) + 0.5) // self.processes)

    def describe(self) -> str:
        each = " each" if self.processes > 1 else ""
        ranks = f" in {self.processes} processes" if self.processes > 1 else ""
        return (f"load average {self.average:.1f} on {self.cores} core"
                f"{'s' if self.cores != 1 else ''}, and torch runs {self.threads} "
                f"thread{'s' if self.threads != 1 else ''}{each}{ranks}")


def read_load(env: Mapping[str, str] | None = None) -> Load | None:
    """This machine's load now, with torch's threads and the run's processes on this host
    (torchrun's LOCAL_WORLD_SIZE in `env`, os.environ by default); None where the load
    average cannot be read or GPT2_TRAINER_IGNORE_LOAD is set."""
    env = os.environ if env is None else env
    if env.get(IGNORE, "") not in ("", "0") or not hasattr(os, "getloadavg"):
        return None
    try:
        average = os.getloadavg()[0]
    except OSError:  # no load average on this system
        return None
    import torch  # the threads its parallel sections use (OMP_NUM_THREADS, set_num_threads)

    local = env.get("LOCAL_WORLD_SIZE", "1")
    processes = int(local) if local.isdigit() and int(local) > 0 else 1
    return Load(average, os.cpu_count() or 1, torch.get_num_threads(), processes)


def _advice(load: Load, running: bool) -> str:
    n = load.fewer_threads(running)
    if n < load.threads:
        return (f"run it with fewer threads (OMP_NUM_THREADS={n} before the command), or when "
                f"the machine is quieter")
    if load.processes > 1:
        return "run it with fewer processes, or when the machine is quieter"
    return "run it when the machine is quieter"


def busy(load: Load | None) -> bool:
    """Whether, before the work computes, other processes already take cores its threads
    need: a load average of at least one core's worth, and more of our threads than the
    cores it leaves free (half a core of slack: a load average is an average)."""
    return (load is not None and load.average >= 1.0
            and load.ours > load.free_cores(running=False) + 0.5)


def busy_warning(load: Load | None) -> str | None:
    """The run's one line where the machine is busy (busy())."""
    if load is None or not busy(load):
        return None
    return (f"the machine is busy: {load.describe()}; the run's threads will wait for the "
            f"cores other processes hold, so its steps can take several times as long as on "
            f"an idle machine; {_advice(load, running=False)}")


class SlowdownWatch:
    """The run's steps against the fastest seen so far: one note, the first time a log
    step's time per step is SLOWER times that while the machine is busier than our own
    threads (others hold at least one core)."""

    def __init__(self, slower: float = SLOWER) -> None:
        self.slower = slower
        self.fastest: float | None = None
        self.said = False

    def observe(self, seconds_per_step: float, load: Callable[[], Load | None]) -> str | None:
        """The note to print, once; None otherwise. `load` reads the machine's load, only
        when the steps have slowed."""
        if seconds_per_step <= 0 or self.said:
            return None
        if self.fastest is None or seconds_per_step < self.fastest:
            self.fastest = seconds_per_step
            return None
        ratio = seconds_per_step / self.fastest
        if ratio < self.slower:
            return None
        now = load()
        if now is None or now.free_cores(running=True) > now.cores - 1:
            return None  # the machine is ours: slower for another reason (a longer window)
        self.said = True
        return (f"steps now take {ratio:.1f}x as long as the fastest so far, and the machine "
                f"is busy ({now.describe()}): other processes hold cores this run's threads "
                f"need; {_advice(now, running=True)}")
