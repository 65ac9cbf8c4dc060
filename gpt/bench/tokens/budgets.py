"""Where a recipe's runs cross the target: the budgets the tokens bench trains a recipe at,
so that the crossing lies between two of them (the grid of --new-budgets, halvings below
its smallest, one more budget where the pair either side is coarse), and the tokens and
seconds to the target read from those runs, with the ratio to the GPT-2 recipe's and its
spread over seeds. gpt/bench/tokens/search.py decides which recipes and rates get budgets.
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

from gpt.bench.tokens.bench import either_side, spread, tokens_to_target
from gpt.bench.tokens.runner import Bench


def budget_steps(args: argparse.Namespace) -> list[int]:
    """The smaller budgets of --new-budgets, in steps, ascending (the full budget left out)."""
    return sorted({max(1, round(f * args.steps)) for f in args.new_budgets} - {args.steps})


def budgets(b: Bench, label: str, parts: tuple[str, ...], lr: float, target: float,
            full: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The points at --new-budgets and the full budget (`full` if given; asked for
    together), then halve's."""
    first = (lambda: full) if full else partial(b.point, label, parts, b.args.steps, lr)
    points = b.together([first, *(partial(b.point, label, parts, s, lr)
                                  for s in budget_steps(b.args))])
    return halve(b, label, parts, lr, target, points)


def bisect_budgets(b: Bench, label: str, parts: tuple[str, ...], lr: float,
                   target: float) -> list[dict[str, Any]]:
    """Only the points that bracket the crossing, on the grid budgets() would run: the full
    budget (ending above the target, no smaller budget reaches it), then a bisection of
    --new-budgets for the largest one ending above the target, then halvings below the
    smallest. The two points either side of the crossing are those budgets() would find
    when a larger budget ends lower (whole runs of one recipe do, to within the seeds'
    spread), at about half its runs: the ablation has some twenty variants."""
    full = b.point(label, parts, b.args.steps, lr)
    if full["final_val_loss"] > target:
        return [full]
    grid, points = budget_steps(b.args), [full]
    above, below = -1, len(grid)  # grid[below] (or the full budget) reached the target
    while below - above > 1:
        mid = (above + below) // 2
        points.append(b.point(label, parts, grid[mid], lr))
        if points[-1]["final_val_loss"] > target:
            above = mid
        else:
            below = mid
    return halve(b, label, parts, lr, target, points)


def halve(b: Bench, label: str, parts: tuple[str, ...], lr: float, target: float,
          points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`points`, and while their smallest budget reaches the target, half of it (at most
    --max-halvings times); then, where the crossing lies between a halving and the budget
    it halved, the budget halfway between them too (narrow_crossing). Sorted by budget."""
    for _ in range(b.args.max_halvings):
        smallest = min(points, key=lambda p: p["steps"])
        if smallest["final_val_loss"] > target or smallest["steps"] == 1:
            break
        points.append(b.point(label, parts, max(1, smallest["steps"] // 2), lr))
    points.sort(key=lambda p: p["steps"])
    halfway = narrow_crossing(points, target)
    if halfway is not None:
        points.append(b.point(label, parts, halfway, lr))
    return sorted(points, key=lambda p: p["steps"])


# Budgets further apart than this around the crossing get one more between them: the
# budgets of --new-budgets are at most 1.5x apart, a halving's 2x
COARSEST = 1.5


def narrow_crossing(points: list[dict[str, Any]], target: float) -> int | None:
    """The budget (steps) halfway between the two either side of the crossing when they
    are more than COARSEST x apart, else None. Tokens to the target are a straight line
    between those two runs, and the loss falls faster near the smaller one, so a coarse
    pair overstates the tokens (understates the ratio)."""
    lo, hi = either_side(points, target) or (None, None)
    if lo is None or hi is None:
        return None
    mid = (lo["steps"] + hi["steps"]) // 2
    if hi["steps"] > COARSEST * lo["steps"] and lo["steps"] < mid < hi["steps"]:
        return mid
    return None


def to_target(points: list[dict[str, Any]], target: float, seed: int | None = None,
              what: str = "tokens") -> tuple[float | None, str]:
    """Tokens (or training seconds) to the target from whole runs at several budgets: of
    the means, or of one seed's runs."""
    rows = []
    for p in points:
        loss = p["final_val_loss"] if seed is None else p["seeds"][seed]["final_val_loss"]
        secs = p["train_seconds"] if seed is None else p["seeds"][seed]["train_seconds"]
        rows.append({"tokens": p["tokens"] if what == "tokens" else secs, "final_val_loss": loss})
    return tokens_to_target(rows, target)


def crossing(points: list[dict[str, Any]], target: float, base: dict[str, Any],
             seeds: int) -> dict[str, Any]:
    """Tokens to the target and the ratio to the GPT-2 recipe's, with spread; seconds from
    the runs' own times (time_ratio and seconds_to_target stay None until the timing phase
    measures step times side by side: gpt.bench.tokens.timing.side_by_side)."""
    tokens, how = to_target(points, target)
    secs, _ = to_target(points, target, what="seconds")
    per_seed = [to_target(points, target, s)[0] for s in range(seeds)]
    per_seed_s = [to_target(points, target, s, "seconds")[0] for s in range(seeds)]
    base_s = [r["train_seconds"] for r in base["seeds"]]
    return {"tokens_to_target": tokens, "how": how, "tokens_to_target_per_seed": per_seed,
            "tokens_ratio": base["tokens"] / tokens if tokens else None,
            "tokens_ratio_per_seed": spread([base["tokens"] / t if t else None for t in per_seed]),
            "seconds_to_target": None, "time_ratio": None, "time_ratio_per_seed": None,
            "seconds_to_target_from_run_times": secs,
            "time_ratio_from_run_times": base["train_seconds"] / secs if secs else None,
            "time_ratio_from_run_times_per_seed": spread(
                [b / s if s else None for b, s in zip(base_s, per_seed_s)]),
            "points": [{k: p[k] for k in ("steps", "tokens", "final_val_loss",
                                          "final_val_loss_std", "train_seconds")} for p in points]}
