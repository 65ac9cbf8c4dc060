"""`python -m gpt.bench`'s command line (gpt/bench/cli.py): every float flag is finite where
it is typed, and the tokens bench's --trainer-flags parse as its help writes them."""

from __future__ import annotations

import argparse

import pytest

from gpt.bench import cli as bench_cli

from helpers import error_line


@pytest.mark.parametrize("argv", [
    ["tokens", "--data-dir", "d", "--new-max-lr", "nan"],
    ["tokens", "--data-dir", "d", "--new-budgets", "0.5", "inf"],
    ["prepare", "--mb", "inf"],
    ["comm", "allreduce", "--sizes-mb", "nan"],
    ["model", "--peak-tflops", "inf"],
])
def test_the_benchmarks_float_flags_are_finite(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as e:
        bench_cli.main(argv)
    assert e.value.code == 2 and "must be" in error_line(capsys.readouterr().err)


@pytest.mark.parametrize("argv", [["--trainer-flags", "--no-compile"],
                                  ["--trainer-flags=--no-compile"]])
def test_trainer_flags_parse_as_the_help_writes_them(argv: list[str]) -> None:
    full = ["tokens", "--data-dir", "d", *argv, "--steps", "3"]
    args = bench_cli.build_parser(full).parse_args(full)
    assert args.trainer_flags == "--no-compile" and args.steps == 3
    assert isinstance(args, argparse.Namespace)
