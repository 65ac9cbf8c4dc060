"""`comm`: communication benchmarks, run under torchrun (gloo on CPU, NCCL on GPUs).

    torchrun --standalone --nproc_per_node=8 -m gpt.bench comm allreduce
    torchrun --standalone --nproc_per_node=8 -m gpt.bench comm ddp --model gpt2 --batch-size 16

allreduce: time of one all-reduce of 1 MB, 10 MB, 100 MB and 1 GB fp32 buffers, as
  algorithm bandwidth (bytes / time) and bus bandwidth (x 2(n-1)/n, the convention of
  nccl-tests: the per-link traffic of a ring all-reduce, comparable across rank counts).
ddp: where a DDP step's time goes. It times forward+backward with gradient sync off
  (compute only) and on (compute plus the all-reduce DDP overlaps with backward), and
  a bare all-reduce of all gradients; exposed communication = synced - compute.

Every figure is the median over measured iterations after warm-up, with min and max;
rank 0 prints a table and writes the JSON given by --out.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gpt.bench.args import standalone_parser
from gpt.bench.record import header, write_json
from gpt.bench.report import machine
from gpt.bench.tables import col, fmt, text_table
from gpt.core.cli import finite_float
from gpt.core.config import PRESETS, model_preset
from gpt.core.errors import UserError
from gpt.data.tokenizer import GPT2_VOCAB
from gpt.engine.parallel import set_grad_sync
from gpt.model.transformer import GPT, unwrap
from gpt.runtime.device import autocast, synchronize
from gpt.runtime.world import Runtime, init_runtime, shutdown

SIZES_MB = (1, 10, 100, 1000)


class NotUnderTorchrun(UserError):
    exit_code = 2


def time_it(fn: Callable[[], None], runtime: Runtime, warmup: int, iters: int) -> list[float]:
    """Seconds per call: warm-up first, then each call timed between barriers and syncs."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        synchronize(runtime.device)
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        synchronize(runtime.device)
        samples.append(time.perf_counter() - t0)
    # The slowest rank decides a collective's time: take each iteration's max over ranks.
    t = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def stats(samples: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(samples) * 1e3, "min_ms": min(samples) * 1e3,
            "max_ms": max(samples) * 1e3, "n": len(samples)}


def bench_allreduce(runtime: Runtime, sizes_mb: list[float], warmup: int, iters: int) -> list[dict]:
    n = runtime.world_size
    rows = []
    for mb in sizes_mb:
        numel = int(mb * 1e6) // 4
        buf = torch.randn(numel, device=runtime.device)
        samples = time_it(functools.partial(dist.all_reduce, buf), runtime, warmup, iters)
        s = stats(samples)
        seconds = s["median_ms"] / 1e3
        algbw = numel * 4 / seconds / 1e9
        rows.append({"size_mb": mb, **s, "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (n - 1) / n})
        del buf
    return rows


def bench_ddp(runtime: Runtime, preset: str, batch_size: int, seq_len: int, warmup: int,
              iters: int) -> dict[str, Any]:
    torch.manual_seed(0)
    cfg = model_preset(preset, block_size=seq_len)
    model = DDP(GPT(cfg).to(runtime.device),
                device_ids=[runtime.local_rank] if runtime.device_type == "cuda" else None)
    x = torch.randint(0, GPT2_VOCAB, (batch_size, seq_len), device=runtime.device)
    dtype = torch.bfloat16 if runtime.device_type == "cuda" else torch.float32

    def fwd_bwd(sync: bool) -> None:
        set_grad_sync(model, sync)
        with autocast(runtime.device_type, dtype):
            _, loss = model(x, x)
        loss.backward()
        model.zero_grad(set_to_none=True)

    compute = stats(time_it(lambda: fwd_bwd(False), runtime, warmup, iters))
    synced = stats(time_it(lambda: fwd_bwd(True), runtime, warmup, iters))
    n_params = unwrap(model).num_params()
    flat = torch.randn(n_params, device=runtime.device)
    comm = stats(time_it(lambda: dist.all_reduce(flat), runtime, warmup, iters))
    exposed = max(0.0, synced["median_ms"] - compute["median_ms"])
    return {
        "model": preset, "params": n_params, "batch_size": batch_size, "seq_len": seq_len,
        "dtype": str(dtype).replace("torch.", ""),
        "compute_fwd_bwd": compute, "synced_fwd_bwd": synced, "grad_allreduce": comm,
        "exposed_comm_ms": exposed,
        "hidden_comm_fraction": (1 - exposed / comm["median_ms"]) if comm["median_ms"] else None,
    }


def environment(runtime: Runtime, argv: Sequence[str]) -> dict[str, Any]:
    return {**header(argv, prog="torchrun -m gpt.bench"), "backend": dist.get_backend(),
            "world_size": runtime.world_size, **machine(runtime.device)}


ALLREDUCE_COLUMNS = [col("size MB", "size_mb", fmt("g")), col("median ms", "median_ms", fmt(".3f")),
                     col("min ms", "min_ms", fmt(".3f")), col("max ms", "max_ms", fmt(".3f")),
                     col("algbw GB/s", "algbw_GBps", fmt(".3f")),
                     col("busbw GB/s", "busbw_GBps", fmt(".3f"))]


def format_table(result: dict[str, Any]) -> str:
    head = (f"{result['backend']} x {result['world_size']} on {result['device']} "
            f"(torch {result['torch']})")
    if "allreduce" in result:
        return head + "\n" + text_table(result["allreduce"], ALLREDUCE_COLUMNS)
    d = result["ddp"]
    frac = d["hidden_comm_fraction"]
    hidden = (f"{frac * 100:.0f}% of the all-reduce hidden behind backward" if frac is not None
              and frac >= 0 else "none hidden: overlapping slowed the step by more than the "
              "bare all-reduce takes, as when ranks share CPU cores")
    return "\n".join([
        head,
        f"model {d['model']} ({d['params']:,} params), B={d['batch_size']} T={d['seq_len']} {d['dtype']}",
        f"forward+backward, no gradient sync : {d['compute_fwd_bwd']['median_ms']:.2f} ms",
        f"forward+backward, DDP all-reduce   : {d['synced_fwd_bwd']['median_ms']:.2f} ms",
        f"all-reduce of all gradients alone  : {d['grad_allreduce']['median_ms']:.2f} ms",
        f"exposed communication              : {d['exposed_comm_ms']:.2f} ms ({hidden})",
    ])


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = standalone_parser(sub, "comm", __doc__, run)
    p.add_argument("what", choices=("allreduce", "ddp"))
    p.add_argument("--sizes-mb", type=finite_float(0, above=True), nargs="+",
                   default=list(SIZES_MB),
                   help="allreduce: message sizes in MB (default: 1 MB to 1 GB)")
    p.add_argument("--model", default=None, choices=list(PRESETS),
                   help="ddp: model preset (default gpt2 on CUDA, tiny on CPU)")
    p.add_argument("--batch-size", type=int, default=None, help="ddp: micro-batch (default 8 / 4)")
    p.add_argument("--seq-len", type=int, default=None, help="ddp: sequence length (default 1024 / 64)")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first (default: 3)")
    p.add_argument("--iters", type=int, default=10, help="timed iterations (default: 10)")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                   help="auto: cuda with NCCL, else cpu with gloo (default: auto)")
    p.add_argument("--out", default=None, help="write the JSON result here")


def run(args: argparse.Namespace) -> int:
    if "RANK" not in os.environ:
        raise NotUnderTorchrun("run under torchrun, e.g. torchrun --standalone "
                               "--nproc_per_node=2 -m gpt.bench comm allreduce")
    runtime = init_runtime(args.device)
    clean = False
    try:
        # Only rank 0 reports: the others skip the git calls.
        result: dict[str, Any] = environment(runtime, args.argv) if runtime.is_master else {}
        if args.what == "allreduce":
            result["allreduce"] = bench_allreduce(runtime, args.sizes_mb, args.warmup, args.iters)
        else:
            gpu = runtime.device_type == "cuda"
            result["ddp"] = bench_ddp(runtime, args.model or ("gpt2" if gpu else "tiny"),
                                      args.batch_size or (8 if gpu else 4),
                                      args.seq_len or (1024 if gpu else 64), args.warmup, args.iters)
        if runtime.is_master:
            print(format_table(result))
            if args.out:
                write_json(Path(args.out), result)
        clean = True
    finally:
        shutdown(runtime, clean)
    return 0
