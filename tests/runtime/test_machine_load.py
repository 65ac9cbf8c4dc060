"""A busy machine (gpt/runtime/machine_load.py): the warning at a CPU run's start and in
its dry run, and the one note when its steps slow down under load. The judgements take
the load, the cores and the threads as arguments; the hooks are checked with a load
average put in place of the machine's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpt.runtime import machine_load
from gpt.runtime.machine_load import IGNORE, Load, SlowdownWatch, busy_warning, read_load
import gpt.train.loop as loop

from helpers import QUIET, TINY, run_cli


@pytest.mark.parametrize("load,says", [
    (Load(0.2, 2, 2), None),  # idle
    (Load(0.9, 2, 2), None),  # less than a core's worth of others
    (Load(1.2, 16, 8), None),  # others leave the threads their cores
    (Load(8.0, 2, 2), "OMP_NUM_THREADS=1 before the command"),  # the demo at load 7-11
    (Load(2.0, 16, 16), "OMP_NUM_THREADS=14 before the command"),
    (Load(3.0, 2, 1), "run it when the machine is quieter"),  # one thread already
    (Load(3.0, 4, 2, processes=2), "OMP_NUM_THREADS=1 before the command"),  # torchrun's ranks
    (Load(6.0, 4, 1, processes=2), "run it with fewer processes"),
    (None, None),  # no load average here
])
def test_the_start_warns_when_others_hold_the_cores_its_threads_need(load: Load | None,
                                                                    says: str | None) -> None:
    line = busy_warning(load)
    if says is None:
        assert line is None
        return
    assert line is not None and "\n" not in line and says in line
    assert line.startswith(f"the machine is busy: load average {load.average:.1f} on "
                           f"{load.cores} cores, and torch runs {load.threads} thread")


def test_the_slowdown_is_said_once_and_only_under_load() -> None:
    busy = lambda: Load(7.5, 2, 2)  # noqa: E731
    idle = lambda: Load(2.1, 2, 2)  # noqa: E731 - our own two threads
    watch = SlowdownWatch()
    assert watch.observe(0.9, busy) is None  # the first: the warm-up's, the fastest so far
    assert watch.observe(0.3, busy) is None  # faster: the new fastest
    assert watch.observe(0.5, busy) is None  # slower, not twice as slow
    assert watch.observe(0.9, idle) is None  # three times as slow, but the machine is ours
    note = watch.observe(0.9, busy)
    assert note is not None and note.startswith("steps now take 3.0x as long as the fastest "
                                                "so far, and the machine is busy (load "
                                                "average 7.5 on 2 cores")
    assert "OMP_NUM_THREADS=1" in note
    assert watch.observe(2.0, busy) is None  # said once


def test_the_load_is_not_read_while_the_steps_keep_their_pace() -> None:
    def unread() -> Load:
        raise AssertionError("read although the steps did not slow down")

    watch = SlowdownWatch()
    for seconds in (0.5, 0.4, 0.45, 0.7):
        assert watch.observe(seconds, unread) is None


def test_the_load_is_read_from_the_machine_unless_turned_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(os, "getloadavg", lambda: (5.5, 4.0, 3.0))
    load = read_load({"LOCAL_WORLD_SIZE": "2"})
    assert load == Load(5.5, os.cpu_count() or 1, torch.get_num_threads(), processes=2)
    assert read_load({IGNORE: "1"}) is None
    assert read_load({"LOCAL_WORLD_SIZE": "x"}).processes == 1

    def unavailable() -> tuple[float, float, float]:
        raise OSError("no load average")

    monkeypatch.setattr(os, "getloadavg", unavailable)
    assert read_load({}) is None


@pytest.fixture
def busy_machine(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A load average of 50 (the suite turns the check off: on here)."""
    monkeypatch.delenv(IGNORE, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (50.0, 50.0, 50.0))
    return monkeypatch


def test_a_cpu_run_and_its_dry_run_say_the_machine_is_busy(
        busy_machine: pytest.MonkeyPatch, random_data_dir: Path, tmp_path: Path) -> None:
    args = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(random_data_dir),
            "--out-dir", str(tmp_path / "r")]
    for proc in (run_cli(*args, "--dry-run"), run_cli(*args)):
        assert proc.returncode == 0, proc.stderr
        busy = [line for line in proc.stderr.splitlines() if "the machine is busy" in line]
        assert len(busy) == 1 and busy[0].startswith("warning: the machine is busy: load "
                                                     "average 50.0 on "), proc.stderr


def test_a_run_whose_steps_slow_under_load_says_so_once(
        busy_machine: pytest.MonkeyPatch, random_data_dir: Path, tmp_path: Path) -> None:
    """The run's watch, handed step times that triple after the second log step (the
    steps' real times vary: not a thing a test can count on)."""
    times = iter([0.5, 0.2, 0.6, 0.7, 0.8, 0.9])

    class Watch(SlowdownWatch):
        def observe(self, seconds_per_step, load):
            return super().observe(next(times), load)

    busy_machine.setattr(loop, "SlowdownWatch", Watch)
    proc = run_cli(*TINY, *QUIET, "--max-steps", "6", "--log-every", "1", "--data-dir",
                   str(random_data_dir), "--out-dir", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stdout.splitlines() if line.startswith("note: steps now")]
    assert len(notes) == 1 and notes[0].startswith("note: steps now take 3.0x as long as the "
                                                   "fastest so far"), proc.stdout
    assert machine_load.SLOWER == 2.0


def test_the_test_suite_says_once_at_its_start_that_the_machine_is_busy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's workers judged as the trainer judges its threads: at load 5 on 2
    cores, 2 workers of 1 thread each wait for cores (the fast tier took about twice its
    idle time there); a quiet machine, or GPT2_TRAINER_IGNORE_LOAD, says nothing."""
    from conftest import busy_note

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (5.0, 4.0, 3.0))
    note = busy_note({}, workers=2)
    assert note is not None and "\n" not in note
    assert note.startswith("note: the machine is busy: load average 5.0 on 2 cores, and torch "
                           "runs 1 thread each in 2 processes (the suite's workers)")
    assert busy_note({IGNORE: "1"}, workers=2) is None
    monkeypatch.setattr(os, "getloadavg", lambda: (0.4, 0.4, 0.4))
    assert busy_note({}, workers=2) is None


def test_the_last_progress_line_ends_before_the_next_message(request: pytest.FixtureRequest
                                                             ) -> None:
    """pytest ends its progress line only after the session's finishing hooks: the
    suite's own line there (the modules it imported) starts a line of its own."""
    import io

    from _pytest.terminal import TerminalReporter

    from conftest import end_progress_line

    out = io.StringIO()
    reporter = TerminalReporter(request.config, file=out)
    reporter.write("....    [100%]")
    end_progress_line(reporter)
    reporter.write_line("the package's modules this run imported: all")
    assert out.getvalue().splitlines() == ["....    [100%]",
                                           "the package's modules this run imported: all"]
    end_progress_line(reporter)  # a line already ended: no blank line
    assert out.getvalue().endswith("imported: all\n")
