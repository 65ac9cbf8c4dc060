"""The ``python -m gpt.bench`` command line: one parser, one subcommand per benchmark.

Timing subcommands (model, components, attention, ladder, compile) share the common
flags and a Context (gpt.bench.step.common), and their results go through one writer.
Standalone subcommands (comm, prepare, gpu, cpu-malloc, memory, tokens, newton-schulz) own
their flags and run themselves: their parser sets `standalone`. `memory` also takes the
trainer's own flags. A UserError from any of them is one line and its exit code.

Each subcommand's module lives in one of the suite's parts (step/, tokens/, prepare/, gpu/)
and is named here as a path below gpt.bench: only this command line knows them all.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from gpt.bench.record import check_out
from gpt.core.cli import OneLineParser
from gpt.core.errors import UserError

# Each subcommand: the module below gpt.bench that defines its flags and runs it (imported
# only once the subcommand is named, so --help answers before torch loads), and its line
# in --help.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "model": ("step.model", "time forward / forward+backward / train step per model size, "
              "precision and compile setting"),
    "components": ("step.model", "time embeddings, the blocks and head+loss separately "
                   "(forward and forward+backward)"),
    "attention": ("step.attention", "naive vs SDPA backends vs compiled naive over head dim x "
                  "sequence length (forward, backward, memory)"),
    "ladder": ("step.ladder", "the GPT-2 speed ladder: fp32 -> tf32 -> bf16 -> compile -> flash -> "
               "vocab 50304 -> fused AdamW -> trainer default"),
    "compile": ("step.compile", "eager vs torch.compile for attention and the whole model, "
                "compile time reported apart"),
    "comm": ("step.comm", "all-reduce bandwidth and DDP compute vs communication (under torchrun)"),
    "prepare": ("prepare.throughput", "shard preparation throughput and memory vs a Pool baseline"),
    "gpu": ("gpu.accept", "GPU acceptance, stages by name: CUDA tests, 124M vs build-nanogpt, XL, "
            "loss kernels, profiles, FP8, recipes, ladder (--plan lists them)"),
    "cpu-malloc": ("step.malloc", "CPU step time and peak memory with and without "
                   "--cpu-malloc-reuse"),
    "memory": ("step.memory", "predict a training run's peak memory per device (takes the "
               "trainer's flags or --config)"),
    "newton-schulz": ("tokens.newton_schulz", "Muon's Newton-Schulz orthogonalisation in fp32 "
                      "vs bf16 on the tokens bench's matrix shapes"),
    "tokens": ("tokens.search", "tokens and seconds each recipe needs to reach the GPT-2 "
               "recipe's validation loss, over seeds (GPT-2 vs the speedrun-era recipe, LR and "
               "schedule sweeps, the tied-head variant, --ablation)"),
}
# The timing subcommands: a runner each, given the shared Context
RUNNERS = {"model": ("step.model", "run_model"), "components": ("step.model", "run_components"),
           "attention": ("step.attention", "run"), "ladder": ("step.ladder", "run"),
           "compile": ("step.compile", "run")}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with the full flags of the subcommand named in argv (if any); every
    other subcommand is listed by name and summary only."""
    parser = OneLineParser(
        prog="python -m gpt.bench",
        description="GPT-2 benchmark suite: warm-up, synchronised timing, OOM-safe sweeps, "
                    "JSON + markdown results. See benchmarks/README.md.",
    )
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)
    named = next((a for a in argv or () if a in SUBCOMMANDS), None)
    module = _module(named) if named else None
    if module is not None:
        module.add_parser(sub)
    for name, (_, summary) in SUBCOMMANDS.items():
        if name not in sub.choices:  # a placeholder: its flags are only read when named
            sub.add_parser(name, help=summary)
    return parser


def _module(name: str):
    return importlib.import_module(f"gpt.bench.{SUBCOMMANDS[name][0]}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    if argv[:1] == ["memory"]:  # the planner takes the trainer's flags beside its own
        args, args.trainer_argv = parser.parse_known_args(argv)
    else:
        args = parser.parse_args(argv)
    try:
        return run(args, argv)
    except UserError as e:  # a bad value, --device cuda without a GPU, ...
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


# What --out names, where it is a file (the other subcommands' --out is a folder)
OUT_FILES = {"memory": "the plan's JSON", "comm": "the JSON result"}
OUT_FOLDERS = {"tokens": "tokens.json, tokens.md and the run cache",
               "gpu": "each stage's JSON, markdown and log",
               "prepare": "prepare_cpu<workers>.json"}


def run(args: argparse.Namespace, argv: list[str]) -> int:
    out = getattr(args, "out", None)
    if out is not None and not getattr(args, "plan", False):  # --plan writes nothing
        name = args.command
        check_out(Path(out), "file" if name in OUT_FILES else "folder",
                  OUT_FILES.get(name) or OUT_FOLDERS.get(name, f"{name}'s JSON and markdown"))
    if getattr(args, "standalone", None) is not None:
        args.argv = argv  # for the command line its results record
        return args.standalone(args)
    from gpt.bench import report
    from gpt.bench.step.common import Context

    ctx = Context.create(args.command, args, argv)
    module, runner = RUNNERS[args.command]
    try:
        results, sections = getattr(importlib.import_module(f"gpt.bench.{module}"), runner)(ctx)
    except KeyboardInterrupt:
        print(f"\ninterrupted: the cells finished so far are in {ctx.args.out}/{ctx.name}.json "
              "and .md", file=sys.stderr)
        return 130
    json_path, md_path = ctx.save(results, sections)
    print(report.render_text(ctx.info, sections))
    print(f"\nwrote {json_path} and {md_path}")
    return 0
