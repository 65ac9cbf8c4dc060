"""`memory`: the memory planner (gpt.plan.memory) from the command line. It takes the
trainer's own flags, or a recipe, and predicts the peak device memory of a training step
per component, without allocating anything:

    python -m gpt.bench memory --model gpt2-xl --batch-size 8 --seq-len 1024 \\
        --parallel fsdp --activation-checkpointing --json
    python -m gpt.bench memory --config configs/gpt2-xl-fsdp.toml --world-size 8
    python -m gpt.bench memory --config configs/gpt2-124m.toml --largest-batch

--world-size is the number of devices the run will use (torchrun's nproc_per_node x
nnodes); --device-type what they are (it decides what --dtype auto means). With
--largest-batch it also searches the largest --batch-size that fits each of the 24, 40
and 80 GB GPUs (RTX 4090, A100 40GB, H100). A search that runs long says on stderr what
it is planning, every few seconds. Nothing is written unless --out names a file.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from gpt.bench.record import header, write_json
from gpt.core.cli import finite_float


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("memory", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       allow_abbrev=False)  # --device is the trainer's, not --device-type
    p.add_argument("--world-size", type=int, default=1,
                   help="devices the run will use (default 1)")
    p.add_argument("--device-type", choices=("cuda", "mps", "cpu"),
                   help="what the devices are (default: the trainer's --device, else cuda)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--largest-batch", action="store_true",
                   help="also find the largest --batch-size that fits 24, 40 and 80 GB")
    p.add_argument("--out", help="also write the JSON here (a file path)")
    p.add_argument("--capacity-gib", type=finite_float(0, above=True), default=None,
                   help="the device memory that auto layout values (--parallel, "
                   "--activation-checkpointing, --batch-size auto) are fitted to (default: "
                   "an 80 GB H100's)")
    p.set_defaults(standalone=run, takes_trainer_flags=True)


def run(args: argparse.Namespace) -> int:
    import torch

    from gpt.core.cli import parse_args
    from gpt.plan import layout, memory

    # The trainer's own parser: the same flags and the same errors, under this command's name
    cfg = parse_args(args.trainer_argv, prog="python -m gpt.bench memory")
    device_type = args.device_type or (cfg.train.device if cfg.train.device != "auto" else "cuda")
    started = time.perf_counter()
    capacity = (int(args.capacity_gib * 2**30) if args.capacity_gib
                else memory.CAPACITIES["80GB"])
    with memory.Progress("the layout (auto)") as progress:  # on stderr: --json's stdout stays JSON
        cfg, choice = layout.settle(cfg, args.world_size, device_type, capacity,
                                    distributed=args.world_size > 1, progress=progress)
    if choice is not None and not args.json:
        print(choice.line())
    plan = choice.plan if choice and choice.plan else memory.plan(
        cfg, world_size=args.world_size, device_type=device_type)
    report: dict[str, Any] = {**header(args.argv), "torch": torch.__version__, **plan.to_json()}
    if choice is not None:
        report["layout"] = choice.to_json()
    largest: dict[str, Any] = {}
    if args.largest_batch:
        for name, capacity in memory.CAPACITIES.items():
            with memory.Progress(f"the largest --batch-size on {name}") as progress:
                b, at = memory.largest_batch(cfg, capacity, args.world_size, device_type,
                                             progress=progress)
            largest[name] = {"batch_size": b, "peak_bytes": at.peak_bytes if at else None}
        report["largest_batch"] = largest
    report["planner_seconds"] = round(time.perf_counter() - started, 1)
    if args.out:
        write_json(Path(args.out), report, indent=1)  # --out checked by gpt.bench.cli
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(plan.table())
    for name, row in largest.items():
        b = row["batch_size"]
        print(f"  largest --batch-size on {name}: {b}" if b else
              f"  {name}: not even --batch-size 1 fits; add --activation-checkpointing, "
              "--parallel fsdp or more devices")
    if not plan.fits(max(memory.CAPACITIES.values())):
        print("  to fit: lower --batch-size (gradient accumulation keeps --total-batch-tokens), "
              "add --activation-checkpointing, or shard with --parallel fsdp over more devices")
    if args.out:
        print(f"wrote {args.out}")
    return 0
