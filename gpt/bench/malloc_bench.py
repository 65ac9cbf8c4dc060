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
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpt.bench.report import git_commit
from gpt.config import ConfigError
from gpt.dist import cpu_name

REPO = Path(__file__).resolve().parents[2]
WARMUP = 5
VARIANTS = {
    "reuse": ([], {}),
    "no-reuse": (["--no-cpu-malloc-reuse"], {}),
    "env": (["--no-cpu-malloc-reuse"], {"MALLOC_MMAP_THRESHOLD_": str(1 << 30),
                                         "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}),
    "unchunked": (["--no-chunked-loss"], {}),
    "no-reuse-unchunked": (["--no-cpu-malloc-reuse", "--no-chunked-loss"], {}),
}


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.variants.split(",") if args.variants else list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or "no-reuse" not in names:
        raise ConfigError(f"--variants {args.variants}: choose among {', '.join(VARIANTS)}, "
                         f"no-reuse included (the speed-ups are against it)")
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in names}
    with tempfile.TemporaryDirectory(prefix="cpu_malloc_") as tmp:
        data = Path(tmp) / "data"
        subprocess.run([sys.executable, str(REPO / "fineweb.py"), "--source", "demo", "--out", str(data),
                        "--val-tokens", "30000", "--quiet"], check=True, cwd=REPO, capture_output=True)
        for rep in range(args.repeats):
            for name in names[rep % len(names):] + names[: rep % len(names)]:  # rotate the order
                flags, env = VARIANTS[name]
                run_dir = Path(tmp) / f"{name}_{rep}"
                cmd = [sys.executable, str(REPO / "train_gpt2.py"), "--config",
                       str(REPO / "configs" / "cpu-demo.toml"), "--data-dir", str(data),
                       "--out-dir", str(run_dir), "--max-steps", str(args.steps), "--val-every", "0",
                       "--sample-every", "0", "--checkpoint-every", "0", "--log-every", "1", *flags]
                subprocess.run(cmd, check=True, cwd=REPO, capture_output=True, env={**os.environ, **env})
                steps = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
                         if r["type"] == "train"]
                runs[name].append({"step_ms_median": statistics.median(r["ms"] for r in steps[WARMUP:]),
                                   "peak_rss_gib": max(r["peak_mem_gb"] for r in steps)})
                print(f"{name:9s} run {rep + 1}: {runs[name][-1]['step_ms_median']:.1f} ms/step, "
                      f"peak RSS {runs[name][-1]['peak_rss_gib']:.2f} GiB", flush=True)
    commit, dirty = git_commit()
    report: dict[str, Any] = {
        "command": " ".join(["python -m gpt.bench", *args.argv]), "cpu": cpu_name(),
        "cpu_count": os.cpu_count(), "commit": commit, "commit_dirty": dirty,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "steps": args.steps, "warmup_excluded": WARMUP,
        "variants": {name: {"step_ms_median": statistics.median(r["step_ms_median"] for r in rs),
                            "step_ms_runs": [round(r["step_ms_median"], 1) for r in rs],
                            "peak_rss_gib_max": max(r["peak_rss_gib"] for r in rs),
                            "peak_rss_gib_runs": [round(r["peak_rss_gib"], 3) for r in rs]}
                     for name, rs in runs.items()},
    }
    base = report["variants"]["no-reuse"]["step_ms_median"]
    for v in report["variants"].values():
        v["speedup_vs_no_reuse"] = round(base / v["step_ms_median"], 3)
    (out / "cpu_malloc.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = ["| variant | step ms (median of run medians) | runs | speed-up | peak RSS GiB |",
             "|---|---|---|---|---|"]
    for name, v in report["variants"].items():
        lines.append(f"| {name} | {v['step_ms_median']:.1f} | {v['step_ms_runs']} | "
                     f"{v['speedup_vs_no_reuse']:.2f}x | {v['peak_rss_gib_max']:.2f} |")
    (out / "cpu_malloc.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cpu-malloc", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="runs per variant (default 3)")
    p.add_argument("--steps", type=int, default=30, help="steps per run (default 30)")
    p.add_argument("--out", default="runs/bench", help="folder for cpu_malloc.json and .md")
    p.add_argument("--variants", default=None,
                   help=f"comma-separated, among {', '.join(VARIANTS)} (default: all)")
    p.set_defaults(standalone=run)
