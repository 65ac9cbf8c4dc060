"""The signals that ask a run to save a checkpoint and stop, instead of dying mid-step."""

from __future__ import annotations

import signal
from typing import Any

# SIGTERM (preemption, scancel), SIGINT (Ctrl-C), SIGHUP (a closed terminal) and SIGUSR1
# (what schedulers such as SLURM's --signal send ahead of a kill) all mean: save and stop.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1")
                     if hasattr(signal, name))


class StopSignal:
    """Any of STOP_SIGNALS sets a flag; the loop finishes its step, checkpoints and exits.
    A second SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopSignal":
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
