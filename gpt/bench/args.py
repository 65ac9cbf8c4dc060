"""The flags the subcommands share: the timing subcommands' common and profiling flags
(gpt.bench.step.common.Context is made from them), and the parser of a standalone subcommand
(its module's docstring as its description, its runner as `standalone`).

Torch-free: the parsers are built before torch loads, so --help answers at once.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

from gpt.core.cli import finite_float


@dataclass(frozen=True)
class DeviceDefault:
    """A flag's default that depends on the device (a CPU cannot run GPT-2 at 8 x 1024 in
    useful time), said once: --help shows it (``%(default)s``), and Context fills it in
    once the device is known."""

    cuda: Any
    other: Any

    def __str__(self) -> str:
        return f"{shown(self.cuda)} on CUDA, {shown(self.other)} elsewhere"

    def pick(self, device_type: str) -> Any:
        return self.cuda if device_type == "cuda" else self.other


def shown(value: Any) -> str:
    """A value as it is typed on the command line (a list: its items, space-separated)."""
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def standalone_parser(sub: argparse._SubParsersAction, name: str, doc: str | None,
                      run: Callable[[argparse.Namespace], int],
                      **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand that owns its flags and runs itself (gpt.bench.cli calls ``run``)."""
    p = sub.add_parser(name, description=doc,
                       formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
    p.set_defaults(standalone=run)
    return p


def add_common_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("common")
    g.add_argument("--device", default="auto", choices=["auto", "cuda", "mps", "cpu"],
                   help="device (auto: cuda > mps > cpu)")
    g.add_argument("--warmup", type=int, default=5, help="warm-up iterations per cell, not measured (default: 5)")
    g.add_argument("--steps", type=int, default=10, help="measured iterations per cell (default: 10)")
    g.add_argument("--out", default="runs/bench", help="folder for <name>.json and <name>.md")
    g.add_argument("--name", default=None,
                   help="file stem of the outputs (default: <subcommand>_<device>_<time>)")
    g.add_argument("--peak-tflops", type=finite_float(0, above=True), default=None,
                   help="the device's bf16 dense peak in TFLOP/s for MFU (default: looked up "
                        "from the device name; unknown on CPU)")
    g.add_argument("--seed", type=int, default=0, help="seed for weights and random inputs")
    g.add_argument("--compile-mode", default="default",
                   choices=["default", "reduce-overhead", "max-autotune",
                            "max-autotune-no-cudagraphs"],
                   help="torch.compile mode for compiled cells")
    g = p.add_argument_group("profiling")
    g.add_argument("--nvtx", action="store_true",
                   help="NVTX ranges (step, forward, backward, optimizer, attn.*) and a CUDA "
                        "profiler range around the measured steps (for launch/profile_nsys.sh)")
    g.add_argument("--cuda-profiler-range", action="store_true",
                   help="cudaProfilerStart/Stop around the measured steps only (no NVTX)")
    g.add_argument("--memory-snapshot", metavar="FILE", default=None,
                   help="write a torch.cuda.memory snapshot of the whole run to FILE "
                        "(open at https://pytorch.org/memory_viz); CUDA only")
    g.add_argument("--torch-profile", metavar="DIR", default=None,
                   help="after timing each cell, profile a few more iterations with "
                        "torch.profiler and write a Chrome trace per cell into DIR")
