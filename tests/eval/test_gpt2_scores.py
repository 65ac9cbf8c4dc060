"""The lines printed beside a model's task scores: GPT-2's published figures and the summary
number (gpt/eval/gpt2_scores.py). Pure functions, no lm-eval needed."""

from __future__ import annotations

import pytest

from gpt.eval.gpt2_scores import centred_mean, comparison_lines


def test_published_scores_stand_beside_ours():
    lines = comparison_lines({"hellaswag": {"acc": 0.3, "acc_norm": 0.32, "sample_len": 100.0}})
    assert lines[0] == "hellaswag acc 0.3000 | GPT-2 124M 0.2892 | GPT-2 1.5B 0.4004"
    assert lines[1] == "hellaswag acc_norm 0.3200 | GPT-2 124M 0.3114 | GPT-2 1.5B 0.5089"
    assert not any("sample_len" in line for line in lines)  # a count, not a score
    assert lines[-1].startswith("GPT-2 scores: llm.c")


def test_centred_mean_is_the_mean_of_chance_centred_accuracies():
    # hellaswag acc_norm 0.4 with chance 0.25 -> 0.2; piqa acc_norm 0.75 with chance 0.5 -> 0.5
    core, left_out = centred_mean({"hellaswag": {"acc_norm": 0.4}, "piqa": {"acc_norm": 0.75},
                                   "my_task": {"acc": 0.9}})
    assert core == pytest.approx(0.35) and left_out == ["my_task"]
    lines = comparison_lines({"hellaswag": {"acc_norm": 0.4}, "piqa": {"acc_norm": 0.75},
                              "my_task": {"acc": 0.9}})
    assert ("centred mean accuracy (as DCLM's CORE) 0.3500 over 2 task(s); not counted "
            "(no random baseline known): my_task") in lines


def test_tasks_without_a_known_baseline_are_named_and_left_out():
    """Only tasks of your own: the summary line still says why there is no number."""
    lines = comparison_lines({"my_mc": {"acc": 0.5}, "my_gen": {"exact_match": 0.0}})
    assert lines == ["my_mc acc 0.5000", "my_gen exact_match 0.0000",
                     "centred mean accuracy (as DCLM's CORE): none; not counted (no random "
                     "baseline known): my_mc, my_gen"]
    assert comparison_lines({}) == []
