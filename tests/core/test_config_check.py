"""A value typed that cannot be meant is refused where it is typed, in one line naming the
flag (gpt/core/config_check.py, and the flags' own types in gpt/core/cli.py): an infinite
learning rate would poison the weights and every checkpoint after them, a soft-cap or eps
at a float's edge makes training degenerate, and --eval-tasks the run would never score
would be dropped without a word."""

from __future__ import annotations

import pytest

from gpt.core.cli import parse_args
from gpt.entry import train_main

from helpers import TINY, error_line, one_line_error, run_cli


@pytest.mark.parametrize("flags,words", [
    (["--max-lr", "inf"], "--max-lr must be <= 1.0, got inf"),
    (["--max-lr", "1e39"], "--max-lr must be <= 1.0"),
    (["--max-lr", "1e6"], "--max-lr must be <= 1.0"),
    (["--grad-clip", "inf"], "--grad-clip must be a finite number"),
    (["--eps", "inf"], "--eps must be a finite number"),
    (["--weight-decay", "2000"], "must be < 1"),
    (["--seed", "-1"], "--seed must be in [0, 2**32), got -1"),
    (["--seed", "99999999999"], "--seed must be in [0, 2**32)"),
    (["--dist-timeout", "1e300"], "--dist-timeout must be > 0 and at most 604800 seconds"),
    (["--num-samples", "10000000"], "--num-samples must be <= 64"),
    (["--sample-tokens", "1000000"], "--sample-tokens must be <= 4096"),
])
def test_values_that_cannot_be_meant_are_refused(flags: list[str], words: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(flags)
    assert exc.value.code == 2 and words in capsys.readouterr().err


def test_refusal_is_one_line_naming_the_flag() -> None:
    proc = run_cli("--max-lr", "inf")
    assert "--max-lr must be <= 1.0, got inf" in one_line_error(proc, 2)


@pytest.mark.parametrize("flags, words", [
    (["--logit-softcap", "1e-40"], "--logit-softcap 1e-40: must be 0 (off) or a cap of at least 1"),
    (["--eps", "1e300"], "--eps must be a finite number in [1e-30, 1]"),
])
def test_values_that_make_training_degenerate_are_refused(flags: list[str], words: str,
                                                          capsys) -> None:
    with pytest.raises(SystemExit):
        parse_args([*TINY, *flags])
    assert words in error_line(capsys.readouterr().err)


@pytest.mark.usefixtures("hub_offline")
@pytest.mark.parametrize("flags, words", [
    (["--eval-tasks", "hellaswag"], "--eval-tasks hellaswag is scored every --eval-tasks-every "
                                    "N steps (and at the end), and that is 0 (off)"),
    (["--eval-tasks", ",,,", "--eval-tasks-every", "5"], "--eval-tasks ',,,' names no task"),
])
def test_the_trainer_refuses_tasks_it_would_drop(flags: list[str], words: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        train_main([*TINY, *flags, "--dry-run"])
    assert e.value.code == 2 and words in error_line(capsys.readouterr().err)
