"""`cpu-malloc`: the trainer's CPU step with and without --cpu-malloc-reuse, side by side.

    python -m gpt.bench cpu-malloc --repeats 3 --steps 30 --out benchmarks/cpu_malloc

Each repeat runs train_gpt2.py once per variant, in alternating order, on the CPU demo
recipe (configs/cpu-demo.toml: the tiny model, B=8, T=128) over tiny shakespeare shards it
prepares first. Reported per variant: the median step time after WARMUP steps (from the
trainer's own per-step log) and the peak resident memory of the process, with every run's
figures. Variants: `reuse` (the default: mallopt keeps freed blocks for reuse), `no-reuse`
(--no-cpu-malloc-reuse: glibc's defaults) and `env` (glibc's MALLOC_MMAP_THRESHOLD_ and
MALLOC_TRIM_THRESHOLD_ set before the process starts, the same settings from outside),
and `unchunked` / `no-reuse-unchunked` (the same two with --no-chunked-loss: the whole logits,
as before the chunked loss). `--variants` picks some of them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from gpt.bench.args import standalone_parser
from gpt.bench.record import REPO, header, write_json, write_text
from gpt.bench.runs import read_metrics, rotated, run_fineweb, run_trainer
from gpt.bench.tables import col, fmt, fmt_x, md_table
from gpt.core.config import ConfigError
from gpt.runtime.device import cpu_name

WARMUP = 5
VARIANTS = {
    "reuse": ([], {}),
    "no-reuse": (["--no-cpu-malloc-reuse"], {}),
    "env": (["--no-cpu-malloc-reuse"], {"MALLOC_MMAP_THRESHOLD_": str(1 << 30),
                                         "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}),
    "unchunked": (["--no-chunked-loss"], {}),
    "no-reuse-unchunked": (["--no-cpu-malloc-reuse", "--no-chunked-loss"], {}),
}
COLUMNS = [
    col("variant", "variant", align="left"),
    col("step ms (median of run medians)", "step_ms_median", fmt(".1f")),
    col("runs", "step_ms_runs", align="left"),
    col("speed-up", "speedup_vs_no_reuse", fmt_x),
    col("peak RSS GiB", "peak_rss_gib_max", fmt(".2f")),
]


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    names = args.variants.split(",") if args.variants else list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or "no-reuse" not in names:
        raise ConfigError(f"--variants {args.variants}: choose among {', '.join(VARIANTS)}, "
                          f"no-reuse included (the speed-ups are against it)")
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in names}
    with tempfile.TemporaryDirectory(prefix="cpu_malloc_") as tmp:
        data = Path(tmp) / "data"
        run_fineweb(["--source", "demo", "--out", str(data), "--val-tokens", "30000", "--quiet"],
                    "preparing tiny shakespeare's shards")
        for rep in range(args.repeats):
            for name in rotated(names, rep):
                flags, env = VARIANTS[name]
                run_dir = Path(tmp) / f"{name}_{rep}"
                run_trainer(["--config", str(REPO / "configs" / "cpu-demo.toml"), "--data-dir",
                             str(data), "--out-dir", str(run_dir), "--max-steps", str(args.steps),
                             "--val-every", "0", "--sample-every", "0", "--checkpoint-every", "0",
                             "--log-every", "1", *flags], f"the {name} run {rep + 1}", env)
                steps = read_metrics(run_dir, "train")
                runs[name].append({"step_ms_median": statistics.median(r["ms"] for r in steps[WARMUP:]),
                                   "peak_rss_gib": max(r["peak_mem_gb"] for r in steps)})
                print(f"{name:9s} run {rep + 1}: {runs[name][-1]['step_ms_median']:.1f} ms/step, "
                      f"peak RSS {runs[name][-1]['peak_rss_gib']:.2f} GiB", flush=True)
    report: dict[str, Any] = {
        **header(args.argv), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
        "steps": args.steps, "warmup_excluded": WARMUP,
        "variants": {name: {"step_ms_median": statistics.median(r["step_ms_median"] for r in rs),
                            "step_ms_runs": [round(r["step_ms_median"], 1) for r in rs],
                            "peak_rss_gib_max": max(r["peak_rss_gib"] for r in rs),
                            "peak_rss_gib_runs": [round(r["peak_rss_gib"], 3) for r in rs]}
                     for name, rs in runs.items()},
    }
    base = report["variants"]["no-reuse"]["step_ms_median"]
    for v in report["variants"].values():
        v["speedup_vs_no_reuse"] = round(base / v["step_ms_median"], 3)
    write_json(out / "cpu_malloc.json", report, indent=1)
    table = md_table([{"variant": n, **v} for n, v in report["variants"].items()], COLUMNS)
    write_text(out / "cpu_malloc.md", table + "\n")
    print(table)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = standalone_parser(sub, "cpu-malloc", __doc__, run)
    p.add_argument("--repeats", type=int, default=3, help="runs per variant (default 3)")
    p.add_argument("--steps", type=int, default=30, help="steps per run (default 30)")
    p.add_argument("--out", default="runs/bench", help="folder for cpu_malloc.json and .md")
    p.add_argument("--variants", default=None,
                   help=f"comma-separated, among {', '.join(VARIANTS)} (default: all)")
