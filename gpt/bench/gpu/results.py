"""The GPU acceptance run's figures: each cell's output read into numbers, the memory
planner's prediction beside the measured peak, ours against build-nanogpt at each
micro-batch, each variant against its baseline in the same stage (the chunked heads + losses
against the whole logits, FP8 against bf16, the speedrun recipe against GPT-2's), FP8's losses against
bf16's step by step, and the markdown summary of a stage."""

from __future__ import annotations

import importlib
import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import torch

from gpt.bench import trace_summary
from gpt.bench.gpu import loss_bench, nanogpt
from gpt.bench.gpu.estimates import WARMUP
from gpt.bench.gpu.stages import Cell, Sizes
from gpt.bench.runs import read_metrics
from gpt.bench.tables import Column, fmt_pct, md_table
from gpt.bench.timing import summarize
from gpt.core.cli import parse_args
from gpt.core.config import model_preset
from gpt.report.flops import flops_per_token, mfu, peak_tflops
from gpt.runtime.device import device_name

BASELINE_MODEL = "gpt2"  # build-nanogpt trains GPT-2 124M (vocab 50304, T=1024), as our gpt2 preset


def step_figures(steps: list[dict[str, float]], tokens_per_step: int, model: str,
                 seq_len: int, device: str) -> dict[str, Any]:
    """Median and spread of step time after the warm-up steps, tokens/s and MFU."""
    measured = [s["ms"] for s in steps[WARMUP:]]
    if not measured:
        raise ValueError(f"only {len(steps)} steps logged; need more than {WARMUP}")
    stats = summarize(measured)
    ms = stats.median
    tok_s = tokens_per_step / (ms / 1e3)
    peak = peak_tflops(device)
    util = mfu(tok_s, flops_per_token(model_preset(model), seq_len), peak)
    return {
        "steps_logged": len(steps), "warmup_steps_excluded": WARMUP,
        "step_ms": stats.to_dict(),
        "tokens_per_step": tokens_per_step, "tokens_per_s_median": tok_s,
        "mfu_median": util, "peak_tflops": peak,
        "compile_s_estimate": max(0.0, (steps[0]["ms"] - ms) / 1e3),
        "losses": [s["loss"] for s in steps], "final_loss": steps[-1]["loss"],
    }


def trainer_result(cell: Cell, proc: subprocess.CompletedProcess, sizes: Sizes, tmp: Path) -> dict[str, Any]:
    records = read_metrics(cell.params["out"])
    header = next(r for r in records if r["type"] == "run")
    steps = [r for r in records if r["type"] == "train"]
    cfg = header["config"]
    out = step_figures(steps, cfg["data"]["total_batch_tokens"], cfg["preset"],
                       cfg["data"]["seq_len"], header["device_name"])
    out.update(peak_mem_gb=max(r["peak_mem_gb"] for r in steps), peak_mem_source=header["peak_mem_source"],
               compile=header["compile"], fused_adamw=header["fused_adamw"], dtype=header["dtype"],
               params=header["params"], trainer_mfu=[r["mfu"] for r in steps],
               layout=header.get("layout"), grad_accum=header.get("grad_accum"))
    if cell.params.get("profile_dir"):  # the profile stage: per micro-batch, and per step of the run's
        out["profile"] = trace_summary.summarize_dir(Path(cell.params["profile_dir"]),
                                                     per_step=header.get("grad_accum"))
    return out


def nanogpt_result(cell: Cell, proc: subprocess.CompletedProcess, sizes: Sizes, tmp: Path) -> dict[str, Any]:
    steps = nanogpt.parse_steps(proc.stdout)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return step_figures(steps, sizes.tokens_per_step, BASELINE_MODEL, 1024, device_name(device))


def pytest_result(cell: Cell, proc: subprocess.CompletedProcess, sizes: Sizes, tmp: Path) -> dict[str, Any]:
    suite = ET.parse(tmp / "junit.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    cases = suite.findall("testcase")
    failures = []
    for case in cases:
        for bad in case.findall("failure") + case.findall("error"):
            failures.append({"test": f"{case.get('classname')}::{case.get('name')}",
                             "message": (bad.get("message") or "")[:500],
                             "detail": (bad.text or "")[-3000:]})
    skipped = sum(1 for c in cases if c.find("skipped") is not None)
    # each test's seconds, named as gpt/bench/gpu/estimates.py's CUDA_TESTS names them: the
    # file below tests/ (JUnit's classname "tests.runs.test_cuda": tests/runs/test_cuda.py)
    durations = {f"{(c.get('classname') or '').removeprefix('tests.').replace('.', '/')}.py"
                 f"::{c.get('name')}": float(c.get("time") or 0) for c in cases}
    return {"tests": len(cases), "failed": len(failures), "skipped": skipped,
            "passed": len(cases) - len(failures) - skipped, "failures": failures,
            "durations_s": durations,
            "seconds": float(suite.get("time", 0)),
            "summary": proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""}


def ladder_result(cell: Cell, proc: subprocess.CompletedProcess, sizes: Sizes, tmp: Path) -> dict[str, Any]:
    return json.loads((tmp / "ladder" / "ladder.json").read_text())


def tokens_result(cell: Cell, proc: subprocess.CompletedProcess, sizes: Sizes, tmp: Path) -> dict[str, Any]:
    return json.loads((tmp / "tokens" / "tokens.json").read_text())


def loss_bench_result(cell: Cell, proc: subprocess.CompletedProcess, sizes: Sizes,
                      tmp: Path) -> dict[str, Any]:
    """gpt/bench/gpu/loss_bench.py's JSON: each variant's forward and backward times, its
    traffic over its time, its peak memory and its distance from the compiled loss."""
    return json.loads(Path(cell.params["out"]).read_text())


RESULTS = {"trainer": trainer_result, "nanogpt": nanogpt_result, "pytest": pytest_result,
           "ladder": ladder_result, "tokens": tokens_result, "loss-bench": loss_bench_result}


# ---------------------------------------------------------------------------------------
# memory: the planner's prediction beside what the run measured


def predicted_memory(cell: Cell) -> dict[str, Any]:
    """gpt.plan.memory's prediction of a trainer cell's peak, made before the cell runs (so an
    out-of-memory cell still has it beside it). The planner is imported here, lazily: a
    checkout without it still runs every cell, and says why there is no prediction."""
    try:
        memory = importlib.import_module("gpt.plan.memory")
    except ImportError as e:
        return {"predicted_peak_bytes": None, "planner": f"planner unavailable: {e}"}
    if "auto" in cell.params["trainer_argv"]:  # the trainer plans its own choice; its header has it
        return {"predicted_peak_bytes": None,
                "planner": "gpt.plan.layout (the trainer's own plan of the layout it chose)"}
    try:
        cfg = parse_args(cell.params["trainer_argv"])
        plan = memory.plan(cfg, world_size=cell.params["world_size"],
                           device_type=cell.params["device_type"])
        return {"predicted_peak_bytes": int(plan.peak_bytes), "planner": "gpt.plan.memory.plan",
                "components": {k: int(v) for k, v in plan.components.items()}}
    except SystemExit as e:  # the trainer's parser refused the cell's flags (it printed why)
        return {"predicted_peak_bytes": None,
                "planner": f"planner failed: the trainer's parser refused the flags (exit {e.code})"}
    except Exception as e:  # noqa: BLE001 -- a planner bug must not stop the acceptance run
        return {"predicted_peak_bytes": None, "planner": f"planner failed: {type(e).__name__}: {e}"}


def with_measured(memory: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """The prediction with the run's measured peak (the trainer's peak_mem_gb, GiB: CUDA's
    max_memory_allocated on a GPU, peak RSS on CPU) and measured / predicted; a cell whose
    layout the trainer chose is compared with the trainer's own plan (its metrics header)."""
    if "peak_mem_gb" not in result:
        return memory
    measured = round(result["peak_mem_gb"] * 2**30)
    predicted = memory.get("predicted_peak_bytes") or (result.get("layout") or {}).get(
        "planned_peak_bytes")
    return {**memory, "predicted_peak_bytes": predicted, "measured_peak_bytes": measured,
            "measured_source": result["peak_mem_source"],
            "measured_over_predicted": measured / predicted if predicted else None}


# ---------------------------------------------------------------------------------------
# ours against build-nanogpt, and the summary


def comparisons(cells: list[dict[str, Any]],
                earlier: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Each 124M trainer cell against build-nanogpt at its micro-batch, where both ran: the
    stage's own, then those of the invocation's earlier stages (`earlier`, each with its
    "stage": the loss kernels' cells, say), so that the fastest of ours at a micro-batch,
    whatever its head + loss, is set beside the baseline ("fastest")."""
    base = {c["params"]["batch_size"]: c for c in cells
            if c["kind"] == "nanogpt" and c["status"] == "ok"}
    names = {c["name"] for c in cells}
    out = []
    for c in [*cells, *(c for c in earlier or [] if c["name"] not in names)]:
        b = base.get(c["params"].get("batch_size"))
        if c["kind"] != "trainer" or c["status"] != "ok" or b is None \
                or c["params"].get("model") != BASELINE_MODEL:
            continue
        ours, theirs = c["result"]["tokens_per_s_median"], b["result"]["tokens_per_s_median"]
        # the same tokens and learning rate at each step: the losses should agree to bf16's noise
        out.append({"cell": c["name"], "baseline": b["name"], "batch_size": c["params"]["batch_size"],
                    **({"stage": c["stage"]} if c["name"] not in names else {}),
                    "loss": c["params"].get("loss", "default"),
                    "ours_tokens_per_s": ours, "baseline_tokens_per_s": theirs,
                    "ours_over_baseline": ours / theirs,
                    **loss_agreement(c["result"]["losses"], b["result"]["losses"])})
    for batch in {r["batch_size"] for r in out}:
        best = max((r for r in out if r["batch_size"] == batch), key=lambda r: r["ours_over_baseline"])
        best["fastest"] = True
    return out


def loss_agreement(ours: list[float], theirs: list[float]) -> dict[str, Any]:
    """Two runs' losses step by step (the same tokens and learning rate at each step): the
    largest difference, the mean difference (ours - theirs) over all steps and over the last
    quarter, where the start's transient is over."""
    pairs = list(zip(ours, theirs))
    diffs = [x - y for x, y in pairs]
    tail = diffs[len(diffs) - max(1, len(diffs) // 4):] if diffs else []
    return {"losses_compared": len(pairs),
            "max_abs_loss_diff": max((abs(d) for d in diffs), default=None),
            "mean_loss_diff": sum(diffs) / len(diffs) if diffs else None,
            "last_quarter_mean_loss_diff": sum(tail) / len(tail) if tail else None}


def side_by_side(cells: list[dict[str, Any]], field: str, base: str,
                 losses: bool = False) -> list[dict[str, Any]]:
    """Each trainer cell whose params[field] is not `base` against the cell that has `base`
    at the same model, micro-batch, compile mode and steps, where both ran: median step
    time, tokens/s and peak memory, and each as a ratio to the base's ("ours"); with
    `losses`, how their losses agree step by step (where both see the same tokens at the
    same learning rate, and only the arithmetic differs)."""
    def key(c: dict[str, Any]) -> tuple:
        return tuple(c["params"].get(k) for k in ("model", "batch_size", "compile_mode", "steps"))

    ran = [c for c in cells if c["kind"] == "trainer" and c["status"] == "ok" and field in c["params"]]
    ours = {key(c): c for c in ran if c["params"][field] == base}
    out = []
    for c in ran:
        b = ours.get(key(c))
        if c["params"][field] == base or b is None:
            continue
        r, o = c["result"], b["result"]
        ms, ours_ms = r["step_ms"]["median"], o["step_ms"]["median"]
        tok, ours_tok = r["tokens_per_s_median"], o["tokens_per_s_median"]
        mem, ours_mem = r["peak_mem_gb"], o["peak_mem_gb"]
        out.append({"cell": c["name"], field: c["params"][field], "ours": b["name"],
                    "step_ms": ms, "ours_step_ms": ours_ms, "step_ms_over_ours": ms / ours_ms,
                    "tokens_per_s": tok, "ours_tokens_per_s": ours_tok,
                    "tokens_per_s_over_ours": tok / ours_tok, "peak_mem_gb": mem,
                    "ours_peak_mem_gb": ours_mem,
                    "peak_mem_over_ours": mem / ours_mem if ours_mem else None,
                    **(loss_agreement(r["losses"], o["losses"]) if losses else {})})
    return out


def loss_comparisons(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each cell with a head + loss kernel (a library's chunked one, or fused) against the
    trainer's default (on CUDA, the whole logits) beside it."""
    return side_by_side(cells, "loss", "default")


# Each comparison of a variant against its baseline in one stage: its JSON key, the field
# of a cell's params that tells them apart and the baseline's value, and the summary's words.
COMPARED = {"loss_comparison": ("loss", "default", "Each head + loss kernel against the whole "
                                "logits (the trainer's default on CUDA), in the same stage:"),
            "fp8_comparison": ("fp8", "off", "FP8 matmuls against bf16, in the same stage (loss "
                               "diff: FP8 - bf16 at each step, mean over the last quarter of the steps):"),
            "recipe_comparison": ("recipe", "gpt2", "The speedrun recipe against the GPT-2 recipe, "
                                  "in the same stage:")}


def comparisons_of(cells: list[dict[str, Any]],
                   earlier: list[dict[str, Any]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """A stage's every comparison, as its JSON holds them (`earlier`: see comparisons)."""
    return {"comparison": comparisons(cells, earlier), "loss_comparison": loss_comparisons(cells),
            "fp8_comparison": side_by_side(cells, "fp8", "off", losses=True),
            "recipe_comparison": side_by_side(cells, "recipe", "gpt2")}


def side_by_side_columns(field: str) -> list[Column]:
    columns = [Column("cell", lambda c: c["cell"], "left"), Column(field, lambda c: c[field], "left"),
               Column("step ms (/ ours)", lambda c: f"{c['step_ms']:.1f} ({c['step_ms_over_ours']:.3f}x)"),
               Column("tokens/s (/ ours)",
                      lambda c: f"{c['tokens_per_s']:,.0f} ({c['tokens_per_s_over_ours']:.3f}x)"),
               Column("peak GiB (/ ours)", lambda c: f"{c['peak_mem_gb']:.2f} ("
                      + (f"{c['peak_mem_over_ours']:.3f}x)" if c["peak_mem_over_ours"] else "-)"))]
    if field == "fp8":
        columns += [Column("steps", lambda c: str(c["losses_compared"])),
                    Column("loss diff, max abs", lambda c: f"{c['max_abs_loss_diff']:.4f}"),
                    Column("loss diff, last quarter", lambda c: f"{c['last_quarter_mean_loss_diff']:+.4f}")]
    return columns


# The summary's columns: a cell, what it took, then its figures
STEP = "step ms (median, min-max)"
SUMMARY_COLUMNS = [Column(h, lambda row, h=h: row.get(h, ""),
                          "left" if h in ("cell", "status") else "right")
                   for h in ("cell", "status", "s (est.)", STEP, "tokens/s", "ours / build-nanogpt",
                             "MFU", "peak GiB (predicted, ratio)", "compile s", "final loss")]


def summary(report: dict[str, Any]) -> str:
    env = report["env"]
    ratio = {c["cell"]: c["ours_over_baseline"] for c in report.get("comparison", [])}
    rows: list[dict[str, str]] = []
    for c in report["cells"]:
        r = c.get("result") or {}
        secs = f"{c['seconds']:.0f}" if "seconds" in c else ""
        secs += f" ({c['estimate_s']})" if c.get("estimate_s") else ""
        status = c["status"] + (f", as in {c['same_as']}" if c.get("same_as") else "")
        row = {"cell": c["name"], "status": status, "s (est.)": secs}
        rows.append(row)
        if "step_ms" in r:
            s = r["step_ms"]
            row.update({STEP: f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})",
                        "tokens/s": f"{r['tokens_per_s_median']:,.0f}",
                        "ours / build-nanogpt": f"{ratio[c['name']]:.3f}x" if c["name"] in ratio else "-",
                        "MFU": fmt_pct(r.get("mfu_median"), "-"), "peak GiB (predicted, ratio)": memory_text(c),
                        "compile s": f"{r['compile_s_estimate']:.1f}",
                        "final loss": f"{r['final_loss']:.4f}"})
        elif "results" in r:  # the ladder: one rung per row
            row[STEP] = "see the rungs below"
            for rung in r["results"]:
                if rung.get("status") != "ok":
                    rows.append({"cell": f"- {rung['title']}", "status": str(rung.get("status")),
                                 STEP: rung.get("reason", "")})
                    continue
                mem = rung.get("peak_mem_bytes")
                rows.append({"cell": f"- {rung['title']}", "status": "ok",
                             STEP: f"{rung['ms_per_step']:.1f}",
                             "tokens/s": f"{rung['tokens_per_s']:,.0f}", "MFU": fmt_pct(rung.get("mfu"), "-"),
                             "peak GiB (predicted, ratio)":
                                 f"{mem / 2**30 if mem else float('nan'):.2f}"})
        elif "variants" in r:  # the loss bench: one variant a row
            row[STEP] = "see the variants below (forward + backward ms)"
            rows += [loss_variant_row(v) for v in r["variants"]]
        elif "tests" in r:
            row[STEP] = f"{r['passed']} passed, {r['failed']} failed, {r['skipped']} skipped"
        else:
            row[STEP] = c.get("reason", "")
            if "memory" in c:
                row["peak GiB (predicted, ratio)"] = memory_text(c)
    notes = sorted({c["memory"]["planner"] for c in report["cells"]
                    if "memory" in c and c["memory"].get("predicted_peak_bytes") is None})
    budget = f" of a {report['budget_s']:.0f} s budget" if report.get("budget_s") else ""
    lines = [f"# GPU acceptance, stage {report['stage']}{' (smoke, CPU)' if report['smoke'] else ''}", "",
             f"{env['device']} | torch {env['torch']} | CUDA {env['cuda']} | commit {env['commit']} | "
             f"{report['seconds']} s{budget}"
             + ("" if report.get("finished", True) else " | partial: the stage has not finished"), "",
             f"`{report['command']}`", "", md_table(rows, SUMMARY_COLUMNS), "",
             "s (est.): seconds the cell took (the plan's estimate); peak GiB: measured "
             "(gpt.plan.memory.plan's prediction, measured / predicted)"]
    lines += [f"No prediction: {note}" for note in notes]
    lines += baseline_lines(report.get("comparison", []))
    if report.get("packages"):
        lines += ["", "Packages: " + "; ".join(f"{m} {how}" for m, how in report["packages"].items())]
    for name, (field, _, words) in COMPARED.items():
        if report.get(name):
            lines += ["", words, "", md_table(report[name], side_by_side_columns(field))]
    lines += [profile_line(c) for c in report["cells"] if (c.get("result") or {}).get("profile")]
    for c in report["cells"]:
        if "variants" in (c.get("result") or {}):
            lines += loss_bench.summary_lines(c["name"], c["result"])
    return "\n".join(lines) + "\n"


def baseline_lines(found: list[dict[str, Any]]) -> list[str]:
    """Where ours was measured against build-nanogpt beyond the table's own cells (the
    invocation's earlier stages): each at the baseline's micro-batch, and the fastest."""
    if not any("stage" in r for r in found):
        return []
    lines = []
    for batch in sorted({r["batch_size"] for r in found}):
        rows = [r for r in found if r["batch_size"] == batch]
        best = next(r for r in rows if r.get("fastest"))
        each = "; ".join(f"{r['cell']}{' (' + r['stage'] + ')' if 'stage' in r else ''} "
                         f"{r['ours_over_baseline']:.3f}x" for r in rows)
        lines += ["", f"Ours against build-nanogpt at micro-batch {batch}, every cell of this "
                  f"invocation: {each}. The fastest: {best['cell']} (loss {best['loss']}), "
                  f"{best['ours_over_baseline']:.3f}x, its losses within "
                  f"{best['max_abs_loss_diff']:.2g} of build-nanogpt's over "
                  f"{best['losses_compared']} steps."]
    return lines


def profile_line(cell: dict[str, Any]) -> str:
    """A profiled cell's trace in a line: per micro-batch where the trace's micro-batches
    were counted (gpt/bench/trace_summary.py), per step of the run's."""
    p = cell["result"]["profile"]
    if p.get("micro_batches"):
        step = (f", {p['gpu_span_ms_per_step']:.1f} ms a step of {p['micro_batches_per_step']}"
                if p.get("gpu_span_ms_per_step") is not None else "")
        where = (f"{p['micro_batches']} micro-batches in the trace: "
                 f"{p['gpu_span_ms_per_micro_batch']:.1f} ms of GPU span each{step}")
    else:
        where = f"{p['gpu_span_ms_per_step']:.1f} ms of GPU span a profiler step"
    kinds = ", ".join(f"{k} {v['share']:.1%}" for k, v in p["kinds"].items())
    return f"\nProfile of {cell['name']}: {where}, busy {p['busy_fraction']:.1%}; {kinds}"


def loss_variant_row(v: dict[str, Any]) -> dict[str, str]:
    """A loss-bench variant as a summary row (gpt/bench/gpu/loss_bench.py's summary_row): its
    times in the step's column, its traffic's rate in the tokens/s column's place, its time
    over the compiled loss's in the ratio's, its peak memory in the memory's, its
    distances from the compiled loss in the final loss's."""
    row = loss_bench.summary_row(v)
    return {"cell": row["variant"], "status": row["status"], STEP: row["time"],
            "tokens/s": row.get("rate", ""), "ours / build-nanogpt": row.get("ratio", ""),
            "peak GiB (predicted, ratio)": row.get("peak", ""), "final loss": row.get("distance", "")}


def memory_text(cell: dict[str, Any]) -> str:
    """'measured (predicted, measured/predicted)' in GiB; '-' where a figure is missing."""
    m = cell.get("memory") or {}
    measured, predicted = m.get("measured_peak_bytes"), m.get("predicted_peak_bytes")
    text = f"{measured / 2**30:.2f}" if measured is not None else "-"
    text += f" ({predicted / 2**30:.2f}" if predicted is not None else " (-"
    ratio = m.get("measured_over_predicted")
    return text + (f", {ratio:.2f})" if ratio is not None else ")")
