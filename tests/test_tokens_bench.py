"""python -m gpt.bench tokens: tokens to the GPT-2 recipe's final validation loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpt.bench.cli import main as bench_main
from gpt.bench.tokens_bench import crossing, tokens_to_target
from helpers import write_random_shards


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


def test_the_command_writes_json_markdown_and_every_run(tmp_path: Path, capsys) -> None:
    (tmp_path / "data").mkdir()
    data = write_random_shards(tmp_path / "data", seed=0, train=(30_000,), val=(4_000,))
    out = tmp_path / "out"
    code = bench_main(["tokens", "--data-dir", str(data), "--out", str(out), "--n-layer", "1",
                       "--n-head", "2", "--n-embd", "32", "--seq-len", "32", "--batch-size", "4",
                       "--total-batch-tokens", "128", "--steps", "8", "--val-every", "2",
                       "--val-steps", "2", "--baseline-lrs", "3e-3", "--new-lr-scales", "1",
                       "--new-budgets", "0.5"])
    assert code == 0
    report = json.loads((out / "tokens.json").read_text())
    assert [(r["recipe"], r["steps"]) for r in report["runs"]] == [("gpt2", 8), ("new", 8), ("new", 4)]
    assert all(len(r["curve"]) >= 2 and r["curve"][-1][0] == r["tokens"] for r in report["runs"])
    assert report["target_val_loss"] == report["runs"][0]["final_val_loss"]
    assert report["baseline_tokens"] == 8 * 128
    assert ("tokens_ratio" in report and report["commit"] and report["torch"]
            and "--optimizer" in report["new_recipe_flags"])
    assert "tokens_ratio" in (out / "tokens.md").read_text()
