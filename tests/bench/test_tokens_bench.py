"""python -m gpt.bench tokens: tokens to the GPT-2 recipe's final validation loss; a --corpus
without text, or one fineweb.py refuses, is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpt.bench import cli as bench_cli
from gpt.bench.tokens import bench as tokens_bench
from gpt.bench.tokens.bench import crossing, part_effect, tokens_to_target
from gpt.core.errors import UserError

from helpers import error_line


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


@pytest.mark.parametrize("with_part, without, verdict, helps, hurts", [
    ([100, 200, 300], [110, 210, 310], "helps", 3, 0),
    ([120, 200, 300], [110, 210, 310], "unclear", 2, 1),  # one seed the other way
    ([100, 210, 300], [110, 210, 310], "unclear", 2, 0),  # a tie is not a help
    ([None, 300, 400], [110, 210, 310], "hurts", 0, 3),   # never reached: worse than any
    ([500, 300, 400], [None, None, 310], "unclear", 2, 1),
    ([None, None], [None, None], "unclear", 0, 0),
])
def test_a_part_helps_only_where_it_does_on_every_seed(with_part, without, verdict, helps,
                                                       hurts) -> None:
    e = part_effect(with_part, without, "tokens to the target")
    assert (e["verdict"], e["helps"], e["hurts"], e["seeds"]) == (verdict, helps, hurts,
                                                                   len(with_part))


def test_part_effect_pairs_the_same_seeds() -> None:
    with pytest.raises(ValueError):
        part_effect([1.0, 2.0], [1.0], "final val loss")


def test_a_corpus_without_text_is_one_line(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "empty.txt").write_text("")
    code = bench_cli.main(["tokens", "--data-dir", str(tmp_path / "shards"), "--corpus",
                           str(corpus), "--out", str(tmp_path / "out")])
    assert code == 1 and "holds any text" in error_line(capsys.readouterr().err)


def test_a_corpus_fineweb_refuses_is_one_line(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "short.txt").write_text("too short for 250,000 validation tokens")
    # the bench's one way to run fineweb.py: its own one-line error, after what was run
    with pytest.raises(UserError, match=r"preparing --corpus .* failed: error: --source .*"
                                        r"--val-tokens"):
        tokens_bench.prepare_corpus(corpus, tmp_path / "shards")
