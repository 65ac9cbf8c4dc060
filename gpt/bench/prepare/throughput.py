"""`prepare`: shard-preparation throughput, gpt.data.prepare against the obvious
multiprocessing baseline.

    python -m gpt.bench prepare                       # writes runs/bench/prepare_cpu<N>.json
    python -m gpt.bench prepare --mb 8 --repeats 1    # a quick look
    python -m gpt.bench prepare --out benchmarks      # to record a result (prepare_cpu2.json)

Both methods read the same jsonl file, in one run, with the same number of worker
processes, and must produce the same token stream (checked by hash):

* baseline: ``multiprocessing.Pool.imap(encode_ordinary, documents, chunksize=16)``, one
  document per item, each result appended (with its EOT) to one growing numpy buffer.
* ours: ``gpt.data.prepare.prepare`` end to end, shard files written and fsynced included, with
  ``--shard-tokens`` 1M so its bounded memory shows (100M shards hold 200 MB each).

The inputs are tiny shakespeare cut into documents and repeated to ``--mb`` megabytes:
``paragraphs`` (blank-line-separated, ~150 characters each: many small documents) and
``4k-docs`` (paragraphs joined into ~4 KB documents, nearer FineWeb-Edu's typical length).
Each measurement runs in a fresh subprocess, methods alternating, so other load on the
machine affects both alike; tokens/s is the median over repeats, timed from the first
input byte read to the last token stored (interpreter start-up and the ~1 s load of the
BPE tables excluded). Also recorded: CPU seconds of the main process and of the workers,
and a *ceiling*, run in the same rotation: the same number of forked processes encoding
their shares of the documents, already in memory, with no IPC at all, i.e. what any
method could reach on these cores at that time.

Memory is the peak over repeats of the process tree's summed RSS and PSS (PSS sampled 1
time in 5), every 20 ms. Every child runs gpt/bench/prepare/child.py (``python -m
gpt.bench.prepare.child --child ...``), which imports gpt.data.prepare and no torch, so all
start from the same floor; PSS counts the pages forked workers share only once. ``--scale``
reruns each method on a 3x larger input: a flat line there is what bounded memory means.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import tiktoken

from gpt.bench.args import standalone_parser
from gpt.bench.record import REPO, header, write_json
from gpt.bench.runs import rotated
from gpt.bench.tables import Column, col, fmt, fmt_x, md_table
from gpt.core.cli import finite_float
from gpt.core.errors import UserError
from gpt.data.prepare import available_cpus
from gpt.data.tokenizer import SHAKESPEARE

INPUTS = ("paragraphs", "4k-docs")


# --------------------------------------------------------------------------
# Inputs


def build_input(kind: str, mb: float, folder: Path) -> Path:
    """tiny shakespeare as jsonl documents, repeated to about `mb` megabytes."""
    text = SHAKESPEARE.read_text(encoding="utf-8")
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    if kind == "paragraphs":
        docs = paragraphs
    else:
        docs, cur = [], ""
        for p in paragraphs:
            cur = f"{cur}\n\n{p}" if cur else p
            if len(cur) >= 4000:
                docs.append(cur)
                cur = ""
        docs.append(cur)
    block = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    path = folder / f"{kind}.jsonl"
    with open(path, "wb") as f:
        for _ in range(max(1, round(mb * 1e6 / len(block)))):
            f.write(block)
    return path


def describe_input(path: Path) -> dict:
    docs = chars = 0
    with open(path, "rb") as f:
        for line in f:
            docs += 1
            chars += len(json.loads(line)["text"])
    return {"file_bytes": path.stat().st_size, "documents": docs, "text_chars": chars,
            "mean_doc_chars": round(chars / docs)}


# --------------------------------------------------------------------------
# The parent: runs children, samples their memory


def measure(method: str, path: Path, workers: int, work: Path) -> dict:
    cmd = [sys.executable, "-m", "gpt.bench.prepare.child", "--child", method, "--input", str(path),
           "--workers", str(workers), "--work", str(work)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    peak_rss = peak_pss = 0
    tick = 0
    while proc.poll() is None:
        # RSS is cheap to read; PSS (from smaps) is not, so it is sampled 1 time in 5.
        full = tick % 5 == 0
        tick += 1
        rss = pss = 0
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for p in procs:
            try:
                if full:
                    info = p.memory_full_info()
                    pss += getattr(info, "pss", info.rss)
                else:
                    info = p.memory_info()
                rss += info.rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        peak_rss = max(peak_rss, rss)
        peak_pss = max(peak_pss, pss)
        time.sleep(0.02)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{method} failed:\n{err}")
    result = json.loads(out.strip().splitlines()[-1])
    result.update(peak_rss_mb=round(peak_rss / 2**20, 1), peak_pss_mb=round(peak_pss / 2**20, 1))
    return result


def environment() -> dict:
    """The machine and versions. gpt.runtime.device's cpu_name imports torch, so only the
    parent calls this: the measured children stay torch-free."""
    from gpt.runtime.device import cpu_name

    return {
        "machine": {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "usable_cpus": available_cpus(),
                    "platform": platform.platform()},
        "versions": {"python": platform.python_version(), "tiktoken": tiktoken.__version__,
                     "numpy": np.__version__},
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mb", type=finite_float(0, above=True), default=30.0, help="input size per kind in MB (default 30)")
    p.add_argument("--workers", type=int, default=2, help="worker processes for both methods (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="runs per method and input (default 3)")
    p.add_argument("--inputs", nargs="+", choices=INPUTS, default=list(INPUTS))
    p.add_argument("--scale", type=finite_float(0), default=3.0,
                   help="memory check: one more run of each method on the first input made this "
                        "many times larger (default 3; 0 skips it)")
    p.add_argument("--out", default="runs/bench",
                   help="folder for prepare_cpu<workers>.json (default runs/bench, the scratch "
                        "folder every benchmark writes to; the recorded results in benchmarks/ "
                        "are only written when it is named here)")


def _both(header: str, key: str, spec: str = "") -> Column:
    """A figure of the baseline and of ours, side by side."""
    return Column(header, lambda e: f"{e['baseline'][key]:{spec}} / {e['ours'][key]:{spec}}")


COLUMNS = [
    col("input", "kind", align="left"),
    Column("docs", lambda e: f"{e['input']['documents']:,}"),
    Column("mean doc chars", lambda e: str(e["input"]["mean_doc_chars"])),
    col("tokens", "tokens", fmt(",")),
    Column("baseline tok/s", lambda e: f"{e['baseline']['tokens_per_s_median']:,}"),
    Column("ours tok/s", lambda e: f"{e['ours']['tokens_per_s_median']:,}"),
    col("speedup", "speedup", fmt_x),
    col("ceiling tok/s", "ceiling_tokens_per_s_median", fmt(",")),
    _both("tok per CPU-s base / ours", "tokens_per_cpu_s_median", ","),
    _both("main-process CPU s base / ours", "main_cpu_s_median"),
    _both("peak RSS MB base / ours", "peak_rss_mb"),
    _both("peak PSS MB base / ours", "peak_pss_mb"),
    col("same tokens", "same_tokens", align="left"),
]


def default_out(out: str | None, workers: int) -> Path:
    """Where the result goes: prepare_cpu<workers>.json in the folder --out, else in the
    scratch folder every benchmark writes to."""
    return Path(out or Path("runs") / "bench") / f"prepare_cpu{workers}.json"


def add_parser(sub: argparse._SubParsersAction) -> None:
    add_arguments(standalone_parser(sub, "prepare", __doc__, run))


def run(args: argparse.Namespace) -> int:
    """The parent: builds the inputs, runs and samples the children, writes the report."""
    if not SHAKESPEARE.is_file():
        raise UserError(f"{SHAKESPEARE} not found: the benchmark input is built from it")

    out_path = default_out(args.out, args.workers)
    report = {
        **header(args.argv),
        **environment(),
        "workers": args.workers,
        "repeats": args.repeats,
        "load_average_before": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "inputs": {},
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_prepare_") as tmp:
        tmp = Path(tmp)
        for kind in args.inputs:
            path = build_input(kind, args.mb, tmp)
            info = describe_input(path)
            methods = ["baseline", "ours", "ceiling"]
            runs: dict[str, list[dict]] = {m: [] for m in methods}
            for r in range(args.repeats):
                for method in rotated(methods, r):
                    res = measure(method, path, args.workers, tmp)
                    res["tokens_per_s"] = res["tokens"] / res["seconds"]
                    runs[method].append(res)
                    print(f"{kind:10s} {method:8s} run {r + 1}: {res['tokens_per_s'] / 1e6:.3f}M tok/s, "
                          f"peak RSS {res['peak_rss_mb']} MB, PSS {res['peak_pss_mb']} MB", file=sys.stderr)
            ceiling = runs.pop("ceiling")
            hashes = {res["sha256"] for m in runs.values() for res in m}
            entry = {"input": info, "same_tokens": len(hashes) == 1, "tokens": runs["ours"][0]["tokens"],
                     "ceiling_tokens_per_s_median": round(statistics.median(x["tokens_per_s"] for x in ceiling)),
                     "ceiling_tokens_per_s_runs": [round(x["tokens_per_s"]) for x in ceiling]}
            for method, results in runs.items():
                entry[method] = {
                    "tokens_per_s_median": round(statistics.median(x["tokens_per_s"] for x in results)),
                    "tokens_per_s_runs": [round(x["tokens_per_s"]) for x in results],
                    "seconds_runs": [round(x["seconds"], 3) for x in results],
                    # CPU time is less sensitive than wall time to other load on the machine
                    "main_cpu_s_median": round(statistics.median(x["main_cpu_s"] for x in results), 3),
                    "workers_cpu_s_median": round(statistics.median(x["workers_cpu_s"] for x in results), 3),
                    "tokens_per_cpu_s_median": round(statistics.median(
                        x["tokens"] / (x["main_cpu_s"] + x["workers_cpu_s"]) for x in results)),
                    "peak_rss_mb": max(x["peak_rss_mb"] for x in results),
                    "peak_pss_mb": max(x["peak_pss_mb"] for x in results),
                }
            entry["speedup"] = round(entry["ours"]["tokens_per_s_median"] / entry["baseline"]["tokens_per_s_median"], 3)
            entry["cpu_efficiency_ratio"] = round(
                entry["ours"]["tokens_per_cpu_s_median"] / entry["baseline"]["tokens_per_cpu_s_median"], 3)
            report["inputs"][kind] = entry
            rows.append((kind, info, entry))
        if args.scale > 0:
            kind = args.inputs[0]
            path = build_input(kind, args.mb * args.scale, tmp)
            scaled = {"input": kind, "file_bytes": path.stat().st_size}
            for method in ("baseline", "ours"):
                res = measure(method, path, args.workers, tmp)
                first = report["inputs"][kind][method]
                scaled[method] = {
                    "peak_rss_mb": [first["peak_rss_mb"], res["peak_rss_mb"]],
                    "peak_pss_mb": [first["peak_pss_mb"], res["peak_pss_mb"]],
                    "tokens_per_s": round(res["tokens"] / res["seconds"]),
                }
                print(f"{kind} x{args.scale:g} {method}: peak RSS {res['peak_rss_mb']} MB, "
                      f"PSS {res['peak_pss_mb']} MB", file=sys.stderr)
            report["memory_scaling"] = scaled
    report["load_average_after"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    write_json(out_path, report)

    print(f"\n{args.workers} workers, {report['machine']['cpu']} ({report['machine']['usable_cpus']} usable CPUs), "
          f"median of {args.repeats}")
    print(md_table([{"kind": kind, **entry} for kind, _, entry in rows], COLUMNS))
    if "memory_scaling" in report:
        m = report["memory_scaling"]
        print(f"\npeak PSS MB, {m['input']} at {args.mb:g} MB -> {args.mb * args.scale:g} MB of input: "
              f"baseline {m['baseline']['peak_pss_mb'][0]} -> {m['baseline']['peak_pss_mb'][1]}, "
              f"ours {m['ours']['peak_pss_mb'][0]} -> {m['ours']['peak_pss_mb'][1]}")
    print(f"\nwrote {out_path}")
    return 0
