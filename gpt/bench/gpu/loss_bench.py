"""The whole logits' cross-entropy on its own, the GPU acceptance's loss-bench cell: inductor's
compiled loss (what the trainer's compiled model runs on the head's logits),
gpt/model/fused_ce.py's backward mode (the gradient written in the backward) and its
forward mode (llm.c's: written in the forward, for the incoming gradient expected) at each
of its launches (fused_ce.LAUNCHES: block, warps, the order that keeps a row in L2), each
without and with the speedrun recipe's soft cap, at GPT-2 124M's micro-batch (64 x 1024
rows of 50,304 columns in bf16, as the head makes them).

    python -m gpt.bench.gpu.loss_bench --out loss_bench.json            # on CUDA
    python -m gpt.bench.gpu.loss_bench --out x.json --device cpu --rows 64 --vocab 500 --no-compile

Per variant: the forward's and the backward's milliseconds (CUDA events around each, the
median of --repeats after --warmup iterations; the logits copied fresh before each, outside
the timing), the logits' traffic each makes at least (3 logits' worth, read twice and
written once; the forward mode 2) over its time, the peak memory above the logits, and its
loss and gradient against the compiled loss's on the same logits, judged (TOLERANCES): a
variant outside its tolerance is "wrong", and the bench exits 1. The incoming gradient is
1 / 2 (the trainer's 1 / accumulation steps at 2^17 tokens a step), which the forward mode
is told to expect; what it costs when it expects wrong (a loop's first call) is its
variant "expected wrong". Its "choice": the forward mode's fastest launch of those judged
right, and the faster of the two modes (fused_ce.FORWARD_LAUNCH and
loss_kernels.FUSED_MODE follow it). Off CUDA the fused modes run only under Triton's
interpreter (TRITON_INTERPRET=1, fp32), otherwise they are recorded as skipped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

GRAD_OUT = 0.5  # the trainer's 1 / accumulation steps: 2^17 tokens a step in 64 x 1024 rows
SOFTCAPS = (0.0, 15.0)  # none (the GPT-2 recipe), the speedrun recipe's (configs/gpt2-124m-speedrun.toml)
FORWARD, WRONG = "fused-forward", "fused-forward, expected wrong"
# How far a fused variant may be from the compiled loss, by the logits' dtype: (the loss,
# relative; each gradient entry, relative to itself; what a rescaling adds to that, where
# the forward mode expects wrong). Both sides compute in fp32 from the same logits, each
# within its fp32 error of exact (tests/model/test_fused_ce.py's error_bounds, at these sizes:
# each row's log-sum-exp within about 1.4e-5 absolute, 2.9e-5 more with the cap, so each
# gradient entry within 5e-5 relative and each row's loss within 5e-5 absolute, against a
# loss near 11). The loss, a mean of fp32 rows on both sides, within 1e-5 relative of the
# other's, so 1e-4: ten times that, while a row summed in bf16 or miscounted is off by
# 2^-9 (2e-3) or more. In bf16 each side rounds its fp32 gradient once, to nearest (a
# GPU's conversion; Triton's interpreter truncates instead), and two values within 1e-4
# of each other round to bf16 values at most one ulp apart: 2^-7 of the value at most,
# plus the 1e-4; a rescaling rounds ours once more, 2^-8. In fp32 (the interpreter, on a
# CPU) no side rounds to bf16: the fp32 differences alone, 1e-4, and 4 u for a rescaling.
TOLERANCES = {"bfloat16": (1e-4, 2.0 ** -7 + 1e-4, 2.0 ** -8),
              "float32": (1e-5, 1e-4, 2.0 ** -22)}
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def launch_names() -> list[str]:
    """The forward mode's launches by name (fused_ce.LAUNCHES), the one it runs first; none
    where Triton cannot be imported (its variant is then one, skipped)."""
    try:
        from gpt.model import fused_ce
    except ImportError:
        return []
    first = fused_ce.FORWARD_LAUNCH.name
    return [first, *(n for n in fused_ce.LAUNCHES if n != first)]


def variants() -> list[tuple[str, str | None, int]]:
    """(variant, launch, the logits' traffic it makes at least, in logits' worth): the
    compiled loss first (the others' reference), the backward mode, the forward mode at
    each launch, and expecting wrong at its own."""
    launches = launch_names()
    return [("compiled", None, 3), ("fused-backward", None, 3),
            *((FORWARD, name, 2) for name in launches or [None]),
            (WRONG, launches[0] if launches else None, 3)]


def whole_logits_loss(cap: float) -> LossFn:
    """GPT.logits then F.cross_entropy, as the trainer's compiled model runs them on the head's
    logits: the cap in fp32, the loss in fp32 (autocast's), the gradient back in the logits'
    dtype."""
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        z = logits.float()
        return F.cross_entropy(cap * torch.tanh(z / cap) if cap else z, targets)

    return loss


def loss_fn(variant: str, launch: str | None, cap: float, device: torch.device,
            compile_mode: str | None) -> LossFn:
    if variant == "compiled":
        fn = whole_logits_loss(cap)
        return torch.compile(fn, mode=compile_mode, dynamic=False) if compile_mode else fn
    from gpt.model import fused_ce

    if variant == "fused-backward":
        return lambda z, t: fused_ce.cross_entropy(z, t, cap, inplace=True)
    guess = fused_ce.expected_grad(device, GRAD_OUT)
    how = fused_ce.LAUNCHES[launch] if launch else None

    def forward_mode(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if variant == WRONG:
            guess.fill_(1.0)  # every call a loop's first: its backward rescales
        return fused_ce.cross_entropy(z, t, cap, inplace=True, expected_grad=guess, launch=how)

    return forward_mode


def skip_reason(variant: str, device: torch.device) -> str | None:
    if variant == "compiled" or device.type == "cuda":
        return None
    try:
        from gpt.model import fused_ce
    except ImportError as e:
        return f"Triton is not importable ({e}); the fused modes run on CUDA"
    return None if fused_ce.interpreted() else ("the fused modes run on CUDA (on a CPU only "
                                                "under TRITON_INTERPRET=1)")


class Clock:
    """Marks on the device's timeline: CUDA events where the work is queued, the host's clock
    elsewhere (where the work is done when the call returns)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ms(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3


def measure(fn: LossFn, src: torch.Tensor, targets: torch.Tensor, warmup: int,
            repeats: int) -> tuple[dict[str, float], torch.Tensor, torch.Tensor]:
    """Forward and backward times (medians), the peak memory above what was held before,
    and the last loss and gradient."""
    device = src.device
    clock = Clock(device)
    go = torch.tensor(GRAD_OUT, device=device)
    marks = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        held = torch.cuda.memory_allocated()
    for _ in range(warmup + repeats):
        z = src.clone().requires_grad_()  # the head's fresh output: written over in place
        a = clock.mark()
        loss = fn(z, targets)
        b = clock.mark()
        (grad,) = torch.autograd.grad(loss, [z], grad_outputs=go)
        c = clock.mark()
        marks.append((a, b, c))
    if device.type == "cuda":
        torch.cuda.synchronize()
    fwd = [clock.ms(a, b) for a, b, _ in marks[warmup:]]
    bwd = [clock.ms(b, c) for _, b, c in marks[warmup:]]
    out = {"forward_ms": statistics.median(fwd), "backward_ms": statistics.median(bwd),
           "total_ms": statistics.median(f + b for f, b in zip(fwd, bwd))}
    if device.type == "cuda":
        # the fresh copy of the logits is counted: it is what the head's output would be
        out["peak_above_gib"] = (torch.cuda.max_memory_allocated() - held) / 2**30
    return out, loss.detach(), grad.detach()


def distances(loss: torch.Tensor, grad: torch.Tensor, ref_loss: torch.Tensor,
              ref_grad: torch.Tensor, rows: int = 4096) -> dict[str, float]:
    """A variant's loss and gradient against the reference's: the loss's relative
    difference, the largest difference over the largest entry, and the largest of each
    entry's difference relative to itself (an entry of zero counted against the gradient's
    smallest normal fp32, so a zero where the reference has none shows); `rows` at a time,
    so that the fp32 copies stay small beside the logits (13 GB each whole, at 124M's
    micro-batch)."""
    largest_diff = largest = largest_rel = torch.zeros((), device=grad.device)
    for start in range(0, grad.shape[0], rows):
        g, r = grad[start:start + rows].float(), ref_grad[start:start + rows].float()
        diff = (g - r).abs()
        largest_diff = torch.maximum(largest_diff, diff.max())
        largest = torch.maximum(largest, r.abs().max())
        rel = diff / r.abs().clamp(min=torch.finfo(torch.float32).tiny)
        largest_rel = torch.maximum(largest_rel, rel.max())  # a NaN carries through
    return {"loss_rel_diff": abs(loss.item() - ref_loss.item()) / abs(ref_loss.item()),
            "grad_max_diff_over_max": largest_diff.item() / (largest.item() or 1.0),
            "grad_max_rel_diff": largest_rel.item()}


def judge(row: dict[str, Any], dtype: torch.dtype) -> None:
    """The row's verdict against TOLERANCES: status "wrong", with the reason, where the loss
    or a gradient entry is outside (NaN is outside)."""
    loss_tol, grad_tol, rescaled = TOLERANCES[str(dtype).removeprefix("torch.")]
    grad_tol += rescaled if row["variant"] == WRONG else 0.0
    row.update(loss_tolerance=loss_tol, grad_tolerance=grad_tol)
    wrong = [f"{what} {got:.3g} from the compiled loss's, tolerance {tol:.3g}"
             for what, got, tol in (("loss", row["loss_rel_diff"], loss_tol),
                                    ("a gradient entry", row["grad_max_rel_diff"], grad_tol))
             if not got <= tol]
    if wrong:
        row.update(status="wrong", reason="; ".join(wrong))


def choose(results: list[dict[str, Any]]) -> dict[str, Any]:
    """From the variants judged right under every cap: the forward mode's fastest launch
    (its total over the caps) and the faster of the modes, each with its total beside the
    compiled loss's; what is missing is said."""
    def total(variant: str, launch: str | None = None) -> float | None:
        rows = [r for r in results if r["variant"] == variant and r.get("launch") == launch]
        if len(rows) != len(SOFTCAPS) or any(r["status"] != "ok" for r in rows):
            return None
        return sum(r["total_ms"] for r in rows)

    launches = {r["launch"]: total(FORWARD, r["launch"]) for r in results
                if r["variant"] == FORWARD and r.get("launch")}
    right = {name: ms for name, ms in launches.items() if ms is not None}
    out: dict[str, Any] = {"over_softcaps": list(SOFTCAPS), "compiled_ms": total("compiled")}
    if not right:
        return {**out, "launch": None, "mode": None,
                "reason": "no launch of the forward mode ran and was right"}
    launch = min(right, key=right.__getitem__)
    modes = {"forward": right[launch], "backward": total("fused-backward")}
    mode = min((m for m in modes if modes[m] is not None), key=modes.__getitem__)
    return {**out, "launch": launch, "launch_ms": right, "mode": mode, "mode_ms": modes}


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # interpreter: fp32 only
    g = torch.Generator(device=device).manual_seed(0)
    src = (torch.randn(args.rows, args.vocab, device=device, generator=g) * 3).to(dtype)
    targets = torch.randint(0, args.vocab, (args.rows,), device=device, generator=g)
    logits_gb = src.numel() * src.element_size() / 1e9
    mode = None if args.no_compile else args.compile_mode
    results: list[dict[str, Any]] = []
    for cap in SOFTCAPS:
        reference: tuple[torch.Tensor, torch.Tensor] | None = None
        for variant, launch, traffic in variants():
            row: dict[str, Any] = {"variant": variant, "softcap": cap, "traffic_logits": traffic,
                                   **({"launch": launch} if launch else {})}
            results.append(row)
            reason = skip_reason(variant, device)
            if reason:
                row.update(status="skipped", reason=reason)
                continue
            figures, loss, grad = measure(loss_fn(variant, launch, cap, device, mode), src,
                                          targets, args.warmup, args.repeats)
            row.update(status="ok", **figures,
                       gb_per_s=traffic * logits_gb / (figures["total_ms"] / 1e3))
            if reference is None:
                reference = (loss, grad)  # the compiled loss: the others' reference
                continue
            row.update(distances(loss, grad, *reference))
            judge(row, dtype)
            del loss, grad
        del reference
    base = {r["softcap"]: r for r in results if r["variant"] == "compiled" and r["status"] == "ok"}
    for r in results:
        b = base.get(r["softcap"])
        if "total_ms" in r and b is not None and r is not b:
            r["total_over_compiled"] = r["total_ms"] / b["total_ms"]
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "rows": args.rows, "vocab": args.vocab,
            "dtype": str(dtype).removeprefix("torch."), "logits_gb": logits_gb,
            "grad_out": GRAD_OUT, "compile_mode": mode or "eager",
            "warmup": args.warmup, "repeats": args.repeats, "variants": results,
            "choice": choose(results)}


# ---------------------------------------------------------------------------------------
# its part of the stage's summary (gpt/bench/gpu/results.py)


def summary_row(v: dict[str, Any]) -> dict[str, str]:
    """A variant's figures in words: its name, status, times (forward + backward = total
    ms), its traffic's rate, its time over the compiled loss's, its peak memory above the
    logits, and its distances from the compiled loss (the loss relative, the largest
    gradient entry's relative to itself) beside their tolerances."""
    launch = f" {v['launch']}" if v.get("launch") else ""
    row = {"variant": f"- {v['variant']}{launch}, cap {v['softcap']:g}", "status": v["status"]}
    if "total_ms" not in v:
        return {**row, "time": v.get("reason", "")}
    peak = v.get("peak_above_gib")
    row.update(time=f"{v['forward_ms']:.2f} + {v['backward_ms']:.2f} = {v['total_ms']:.2f}",
               rate=f"{v['gb_per_s']:,.0f} GB/s",
               ratio=(f"{v['total_over_compiled']:.3f}x compiled" if "total_over_compiled" in v
                      else "-"),
               peak=f"{peak:.2f} above" if peak is not None else "-")
    if "loss_rel_diff" in v:
        row["distance"] = (f"loss {v['loss_rel_diff']:.1e} (<= {v['loss_tolerance']:.0e}), "
                           f"grad {v['grad_max_rel_diff']:.1e} (<= {v['grad_tolerance']:.1e})")
    return row


def summary_lines(cell: str, r: dict[str, Any]) -> list[str]:
    """What the loss-bench cell `cell` (its result `r`) judged, by what tolerance, and what
    it chose."""
    judged = [v for v in r["variants"] if "loss_rel_diff" in v]
    if not judged:
        return []
    wrong = [v for v in judged if v["status"] == "wrong"]
    rescaled = next((v["grad_tolerance"] for v in judged if v["variant"] == WRONG), None)
    lines = ["", f"Loss bench ({cell}): each fused variant judged against the compiled loss on "
             f"the same {r['dtype']} logits: the loss within {judged[0]['loss_tolerance']:.0e} "
             f"relative, each gradient entry within "
             f"{min(v['grad_tolerance'] for v in judged):.3g} of itself"
             + (f" ({rescaled:.3g} where the forward mode rescales)" if rescaled else "")
             + f" (gpt/bench/gpu/loss_bench.py's TOLERANCES): {len(judged) - len(wrong)} right, "
             f"{len(wrong)} wrong" + "".join(f"; wrong: {v['variant']} {v.get('launch', '')}, cap "
                                             f"{v['softcap']:g}: {v['reason']}" for v in wrong) + "."]
    choice = r.get("choice") or {}
    if choice.get("launch"):
        ms, compiled = choice["mode_ms"], choice.get("compiled_ms")
        backward = (f"{ms['backward']:.2f} ms" if ms.get("backward") is not None
                    else "not right or not run")
        lines.append(
            f"Choice (over caps {', '.join(f'{c:g}' for c in choice['over_softcaps'])}): the "
            f"forward mode's fastest right launch is {choice['launch']} "
            f"({choice['launch_ms'][choice['launch']]:.2f} ms"
            + (f", the compiled loss {compiled:.2f} ms" if compiled else "") + "); the faster "
            f"mode is {choice['mode']} (forward {ms['forward']:.2f} ms, backward {backward}): "
            f"gpt/model/fused_ce.py's FORWARD_LAUNCH and gpt/model/loss_kernels.py's FUSED_MODE "
            f"follow it.")
    elif choice:
        lines.append(f"Choice: none ({choice.get('reason')}).")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpt.bench.gpu.loss_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--rows", type=int, default=64 * 1024, help="rows of logits (tokens a micro-batch)")
    p.add_argument("--vocab", type=int, default=50304, help="columns (GPT-2's padded vocabulary)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--compile-mode", default="default",
                   choices=["default", "reduce-overhead", "max-autotune"],
                   help="torch.compile's mode for the compiled loss")
    p.add_argument("--no-compile", action="store_true", help="the whole logits' loss eagerly")
    args = p.parse_args(argv)
    if min(args.rows, args.vocab, args.repeats) < 1 or args.warmup < 0:
        p.error("--rows, --vocab and --repeats must be at least 1, --warmup at least 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here (--device cpu runs the compiled loss alone)")
    report = run(args)
    Path(args.out).write_text(json.dumps(report, indent=1), encoding="utf-8")
    for r in report["variants"]:
        name = f"{r['variant']}{' ' + r['launch'] if r.get('launch') else ''}"
        figures = (f"{r['forward_ms']:.2f} + {r['backward_ms']:.2f} = {r['total_ms']:.2f} ms"
                   if "total_ms" in r else "")
        verdict = "" if r["status"] == "ok" else f"{r['status']}: {r['reason']}"
        print(f"cap {r['softcap']:>4}: {name:<42} {figures} {verdict}".rstrip())
    choice = report["choice"]
    print(f"choice: the forward mode's fastest right launch {choice['launch']}, the faster "
          f"mode {choice['mode']}" if choice["launch"] else f"choice: {choice['reason']}")
    wrong = [r for r in report["variants"] if r["status"] == "wrong"]
    for r in wrong:
        print(f"loss-bench: {r['variant']} {r.get('launch', '')}, cap {r['softcap']:g}: wrong: "
              f"{r['reason']}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
