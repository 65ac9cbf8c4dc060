"""gpt/eval/rank_agreement.py: the harness's ranks fail together, with the same line. One
process for the rules of a single rank; two gloo processes for the agreement itself (lm-eval
is not needed for either: the harness's own tests, which need it, drive it through a model)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from gpt.eval.harness_tasks import HarnessError
from gpt.eval.rank_agreement import agreed, first_failure, refuse_together


def test_one_rank_raises_its_own_error_and_names_the_first_problem() -> None:
    assert agreed(lambda: 7, world_size=1) == 7
    with pytest.raises(ValueError, match="its own"):  # alone, nothing to agree: as it was
        agreed(lambda: (_ for _ in ()).throw(ValueError("its own")), world_size=1)
    assert first_failure(None, 1) is None and first_failure("why", 1) == (0, "why")
    refuse_together([], world_size=1)  # nothing to refuse
    with pytest.raises(HarnessError, match=r"^doc 3 is too long \(1 more such request\(s\)\); "
                                           r"refused before scoring"):
        refuse_together(["doc 3 is too long", "doc 9 is too long"], world_size=1)


def _rank(rank: int, folder: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{folder}/pg", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    try:
        def share() -> str:  # rank 1's share fails; rank 0's would return
            if rank == 1:
                raise RuntimeError("out of memory\n  on this share")
            return "scores"

        outcomes = []
        for attempt in (lambda: agreed(share, 2),
                        lambda: refuse_together(["doc 5 is empty"] if rank == 1 else [], 2)):
            try:
                outcomes.append(f"returned {attempt()}")
            except HarnessError as e:
                outcomes.append(str(e))
        Path(folder, f"rank{rank}.txt").write_text("\n".join(outcomes))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_raise_the_same_line_when_one_fails(tmp_path: Path) -> None:
    """Rank 0's scoring succeeds and rank 1's fails: both raise the line naming rank 1 (rank 0
    returning would leave rank 1 alone, and the harness's next gather waiting); a problem only
    rank 1 found is refused on both."""
    mp.spawn(_rank, args=(str(tmp_path),), nprocs=2, join=True)
    zero, one = ((tmp_path / f"rank{r}.txt").read_text() for r in (0, 1))
    assert zero == one == ("scoring failed on rank 1: RuntimeError: out of memory on this share\n"
                           "doc 5 is empty; refused before scoring: fix the task's data or its "
                           "settings")
