"""The ``python -m gpt.bench`` command line: one parser, one subcommand per benchmark.

Timing subcommands (model, components, attention, ladder, compile) share the common
flags and a Context, and their results go through one writer. Standalone subcommands
(comm, prepare, gpu, cpu-malloc) own their flags and run themselves: their parser sets
`standalone`. A UserError from any of them is one line and its exit code.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from gpt.bench import (attention, comm, compile_bench, gpu, ladder, malloc_bench, model_bench,
                       prepare_bench, report)
from gpt.bench.common import Context
from gpt.cli import OneLineParser
from gpt.errors import UserError

Runner = Callable[[Context], tuple[list[dict[str, Any]], list[report.Section]]]

RUNNERS: dict[str, Runner] = {
    "model": model_bench.run_model,
    "components": model_bench.run_components,
    "attention": attention.run,
    "ladder": ladder.run,
    "compile": compile_bench.run,
}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m gpt.bench",
        description="GPT-2 benchmark suite: warm-up, synchronised timing, OOM-safe sweeps, "
                    "JSON + markdown results. See benchmarks/README.md.",
    )
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)
    for module in (model_bench, attention, ladder, compile_bench, comm, prepare_bench, gpu,
                   malloc_bench):
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        return run(args, argv)
    except UserError as e:  # a bad value, --device cuda without a GPU, ...
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


def run(args: argparse.Namespace, argv: list[str]) -> int:
    if getattr(args, "standalone", None) is not None:
        args.argv = argv  # for the command line its results record
        return args.standalone(args)
    ctx = Context.create(args.command, args, argv)
    try:
        results, sections = RUNNERS[args.command](ctx)
    except KeyboardInterrupt:
        print(f"\ninterrupted: the cells finished so far are in {ctx.args.out}/{ctx.name}.json "
              "and .md", file=sys.stderr)
        return 130
    json_path, md_path = ctx.save(results, sections)
    print(report.render_text(ctx.info, sections))
    print(f"\nwrote {json_path} and {md_path}")
    return 0
