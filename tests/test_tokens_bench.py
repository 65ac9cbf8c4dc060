"""python -m gpt.bench tokens: tokens to the GPT-2 recipe's final validation loss."""

from __future__ import annotations

import pytest

from gpt.bench.tokens_bench import crossing, tokens_to_target


def test_a_curve_crossing_is_interpolated() -> None:
    curve = [[0, 10.0], [100, 6.0], [200, 4.0], [300, 3.0]]
    assert crossing(curve, 5.0) == pytest.approx(150.0)
    assert crossing(curve, 6.0) == 100
    assert crossing(curve, 2.0) is None


def test_tokens_to_target_come_from_whole_runs_at_each_budget() -> None:
    runs = [{"tokens": t, "final_val_loss": v} for t, v in ((100, 5.0), (200, 4.0), (400, 3.0))]
    assert tokens_to_target(runs, 3.5) == (pytest.approx(300.0), "between the 200- and 400-token runs")
    assert tokens_to_target(runs, 5.5)[0] == 100  # even the smallest: a bound
    assert "at most" in tokens_to_target(runs, 5.5)[1]
    assert tokens_to_target(runs, 2.0) == (None, "no budget reached the target")
