"""The signals that ask a run to save a checkpoint and stop, instead of dying mid-step,
and how the ranks of a job agree on the step to stop at."""

from __future__ import annotations

import signal
from typing import Any

import torch
import torch.distributed as dist

from gpt.runtime.world import Runtime


# SIGTERM (preemption, scancel), SIGINT (Ctrl-C), SIGHUP (a closed terminal) and SIGUSR1
# (what schedulers such as SLURM's --signal send ahead of a kill) all mean: save and stop.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1")
                     if hasattr(signal, name))


class StopSignal:
    """Any of STOP_SIGNALS sets a flag; the loop finishes its step, checkpoints and exits.
    A second SIGINT interrupts at once."""

    def __init__(self, runtime: Runtime | None = None) -> None:
        self.signum: int | None = None
        self._runtime = runtime
        self._previous: dict[int, Any] = {}
        self._vote: tuple[Any, torch.Tensor] | None = None  # the all-reduce in flight

    def __enter__(self) -> "StopSignal":
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def agreed(self) -> bool:
        """Whether to stop now: the same answer on every rank at the same step. One process
        stops at the step a signal came in. Ranks vote without waiting for each other:
        each call starts a non-blocking all-reduce of this rank's flag on the host-side
        group and returns the result of the previous call's, which has long arrived; so
        a job stops one step after the signal, and no step waits on a collective."""
        rt = self._runtime
        if rt is None or not rt.distributed:
            return self.signum is not None
        stop = False
        if self._vote is not None:
            work, flag = self._vote
            work.wait()
            stop = bool(flag.item())
        flag = torch.tensor([int(self.signum is not None)], dtype=torch.int32)
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=rt.control_group, async_op=True)
        self._vote = (work, flag)
        return stop

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self._vote is not None and exc_type is None:
            self._vote[0].wait()  # every rank started it; none may leave it behind
        self._vote = None
