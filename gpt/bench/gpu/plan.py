"""The plan `python -m gpt.bench gpu --plan` prints for a choice of stages: each stage's
cells with their estimated seconds (gpt/bench/gpu/estimates.py), what each stage needs,
and, under --budget, which cells would not fit. It runs nothing: the cells come from
gpt/bench/gpu/stages.py, built with paths that are never used (NOWHERE).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpt.bench.gpu.stages import FULL, NOWHERE, PYTEST_WORKERS, STAGES, same_command, stage_cells
from gpt.bench.runs import KILL_GRACE_S

# Of a --budget: stopping a cell (SIGTERM, its grace, SIGKILL) and writing the results,
# which the run keeps back from its cells
RESERVE_S = KILL_GRACE_S + 5.0


def plan(stages: list[str], budget_s: float | None, workers: int = PYTEST_WORKERS,
         only: list[str] | None = None) -> dict[str, Any]:
    """The chosen stages in order, their cells (those of `only`, if given) with their
    estimates, what each stage needs, and, under a budget, which cells would be skipped
    (the estimates taken as the times, RESERVE_S of the budget kept back as the run keeps
    it). A cell whose command an earlier stage's cell runs takes no time: the run reuses
    that measurement."""
    where = dataclasses.replace(NOWHERE, workers=workers)
    out: list[dict[str, Any]] = []
    used = 0.0
    planned: dict[str, str] = {}  # a command (same_command's key): the stage that runs it
    for name in stages:
        stage = STAGES[name]
        cells: list[dict[str, Any]] = []
        for c in stage_cells(name, FULL, where):
            if only and c.name not in only:
                continue
            key = same_command(c)
            if key in planned:
                cells.append({"name": c.name, "estimate_s": 0, "fits": True,
                              "same_as": planned[key]})
                continue
            fits = budget_s is None or used + c.estimate_s <= budget_s - RESERVE_S
            used += c.estimate_s if fits else 0.0
            if fits:
                planned[key] = name
            cells.append({"name": c.name, "estimate_s": round(c.estimate_s), "fits": fits})
        out.append({"stage": name, "title": stage.title, "question": stage.question,
                    "needs": list(stage.needs),
                    "optional_packages": list(stage.optional), "measured": stage.measured,
                    "cells": cells, "estimate_s": sum(c["estimate_s"] for c in cells)})
    return {"stages": out, "budget_s": budget_s, "total_s": sum(s["estimate_s"] for s in out),
            "estimates": "on one H100, compilation included; not measured: made in "
                         "gpt/bench/gpu/estimates.py from what each cell does, checked against "
                         "the GPU runs in benchmarks/gpu/ where a stage is marked measured"}


NEEDS = {"nanogpt": "--nanogpt PATH", "corpus": "--corpus DIR"}


def render_plan(p: dict[str, Any]) -> str:
    lines = [f"{len(p['stages'])} stage(s), about {p['total_s']} s ({p['total_s'] / 60:.1f} min) on one "
             f"H100 in all; seconds are estimates (* rough: no GPU run has checked them yet)"]
    for s in p["stages"]:
        needs = [NEEDS[n] for n in s["needs"]]
        lines += ["", f"{s['stage']}{'' if s['measured'] else ' *'}: {s['title']}  ~{s['estimate_s']} s",
                  f"  {s['question']}"]
        if needs:
            lines.append(f"  needs {', '.join(needs)}")
        if s["optional_packages"]:
            lines.append(f"  uses {', '.join(s['optional_packages'])} where importable or in --wheels "
                         "(the cells that need one are skipped without it)")
        lines += [f"    {c['name']:<45}{c['estimate_s']:5d} s"
                  + (f"   as measured in stage {c['same_as']}" if c.get("same_as") else
                     "" if c["fits"] else f"   skipped under --budget {p['budget_s']:.0f}")
                  for c in s["cells"]]
    if p["budget_s"] is not None:
        left = sum(c["estimate_s"] for s in p["stages"] for c in s["cells"] if not c["fits"])
        used = sum(c["estimate_s"] for s in p["stages"] for c in s["cells"] if c["fits"])
        lines += ["", f"--budget {p['budget_s']:.0f}: " + (
            "every cell fits" if not left else f"{left} s of cells would not fit and be skipped")
            + f" ({used} s of cells, {RESERVE_S:.0f} s kept for stopping a cell and writing)"]
    return "\n".join(lines) + "\n"
