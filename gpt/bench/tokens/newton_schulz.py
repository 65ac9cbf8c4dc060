"""`newton-schulz`: Muon's orthogonalisation alone, in fp32 against bf16, per matrix shape.

    python -m gpt.bench newton-schulz --out benchmarks/tokens

torch.optim.Muon runs its Newton-Schulz iterations in bf16, which is what a GPU wants;
a CPU without bf16 matmul units may do them faster in fp32. This times the iterations
(5 of them, torch's coefficients) on the weight shapes of the tokens bench's model (the
blocks' matrices, d = --n-embd), each --repeats times after a warm-up, and reports the
median per shape and the sum over one optimizer step's matrices: whether a CPU should
leave torch's bf16 iterations rests on a measurement (benchmarks/tokens/
newton_schulz_1threads.json found bf16 faster on this CI's CPU, so gpt/optim/muon.py keeps torch's).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("newton-schulz", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/bench/newton_schulz", help="folder for the JSON and .md")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads for torch (default 0: torch's own choice)")
    p.set_defaults(standalone=run)


def shapes(n_embd: int) -> dict[str, tuple[int, int]]:
    """One block's Muon matrices (nn.Linear weights are out x in)."""
    d = n_embd
    return {"attn.c_attn": (3 * d, d), "attn.c_proj": (d, d),
            "mlp.c_fc": (4 * d, d), "mlp.c_proj": (d, 4 * d)}


def newton_schulz(g, dtype, coefficients: tuple[float, float, float] = (3.4445, -4.775, 2.0315),
                  steps: int = 5, eps: float = 1e-7):
    """torch.optim.Muon's quintic Newton-Schulz iteration (its coefficients, steps and eps;
    bit for bit in bf16, tests/optim/test_muon.py checks) in any `dtype`: torch's is fixed to bf16."""
    import torch

    a, b, c = coefficients
    x = g.to(dtype)
    wide = g.size(0) > g.size(1)
    if wide:  # iterate on the smaller Gram matrix
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if wide else x


def time_one(shape: tuple[int, int], dtype, repeats: int, device) -> float:
    """Median seconds of one orthogonalisation of a random matrix of `shape` in `dtype`."""
    import torch

    g = torch.randn(shape, device=device)
    for _ in range(3):  # warm-up: allocator, thread pool
        newton_schulz(g, dtype)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        newton_schulz(g, dtype)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(args: argparse.Namespace) -> int:
    import torch

    from gpt.bench.record import write_outputs
    from gpt.bench.report import run_info
    from gpt.runtime.device import pick_device

    device = pick_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows: list[dict[str, Any]] = []
    for name, shape in shapes(args.n_embd).items():
        ms = {str(dt).removeprefix("torch."): 1e3 * time_one(shape, dt, args.repeats, device)
              for dt in (torch.float32, torch.bfloat16)}
        rows.append({"matrix": name, "shape": list(shape), "median_ms": ms})
    step = {dt: args.n_layer * sum(r["median_ms"][dt] for r in rows) for dt in ("float32", "bfloat16")}
    faster = min(step, key=step.get)
    report = {**run_info("newton-schulz", device, args.argv), "n_layer": args.n_layer,
              "n_embd": args.n_embd, "repeats": args.repeats,
              "threads": torch.get_num_threads(), "rows": rows,
              "per_step_ms": step, "faster": faster}
    lines = [f"# Muon's Newton-Schulz (5 steps) on {report['device']}, torch {report['torch']}, "
             f"{report['threads']} threads",
             "", f"`{report['command']}` at {report['commit']}", "",
             "| matrix | shape | fp32 ms | bf16 ms |", "|---|---|---|---|"]
    lines += [f"| {r['matrix']} | {r['shape'][0]}x{r['shape'][1]} | {r['median_ms']['float32']:.3f} "
              f"| {r['median_ms']['bfloat16']:.3f} |" for r in rows]
    lines += ["", f"One optimizer step ({args.n_layer} blocks): fp32 {step['float32']:.2f} ms, "
              f"bf16 {step['bfloat16']:.2f} ms (medians of {args.repeats}); faster: **{faster}**.", ""]
    markdown = "\n".join(lines)
    name = f"newton_schulz_{report['threads']}threads"
    write_outputs(Path(args.out), name, report, markdown)
    print(markdown)
    return 0
