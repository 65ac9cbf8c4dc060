"""Under torchrun, the harness model's ranks fail together: each holds its share of the
requests, and a rank that stopped alone would leave the others waiting in the harness's
next collective. So the ranks agree first, and every one raises the same line."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import torch.distributed as dist

from gpt.eval.harness_tasks import HarnessError


T = TypeVar("T")


def refuse_together(problems: list[str], world_size: int) -> None:
    """Raise one line naming the first request that cannot be scored (and how many
    more there are), before any is. Under torchrun each rank holds its share of the
    requests, and one that stopped alone would leave the others waiting in the next
    collective: the ranks agree first, and all raise the same line."""
    first, count = (problems[0] if problems else None), len(problems)
    if world_size > 1:
        every: list[Any] = [None] * world_size
        dist.all_gather_object(every, (first, count))
        first = next((f for f, _ in every if f is not None), None)
        count = sum(c for _, c in every)
    if first is not None:
        more = f" ({count - 1} more such request(s))" if count > 1 else ""
        raise HarnessError(f"{first}{more}; refused before scoring: fix the task's data "
                           f"or its settings")


def agreed(score: Callable[[], T], world_size: int) -> T:
    """score() over this rank's share of the requests. Under torchrun a rank whose
    scoring fails must not leave the others waiting in the harness's next gather: the
    ranks agree whether each finished, and all raise the same line if one did not."""
    result, failure = None, None
    try:
        result = score()
    except Exception as e:  # noqa: BLE001 - whatever stopped this rank's share
        if world_size == 1:
            raise
        failure = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    found = first_failure(failure, world_size)
    if found is not None:
        raise HarnessError(f"scoring failed on rank {found[0]}: {found[1]}")
    return result  # type: ignore[return-value]


def first_failure(why: str | None, world_size: int) -> tuple[int, str] | None:
    """The first rank that failed, and why (None: no rank did): the same answer on every
    rank, each giving its own `why` (None where it did not fail)."""
    if world_size == 1:
        return None if why is None else (0, why)
    every: list[Any] = [None] * world_size
    dist.all_gather_object(every, why)
    return next(((r, w) for r, w in enumerate(every) if w is not None), None)
