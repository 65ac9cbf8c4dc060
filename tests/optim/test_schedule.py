"""The learning-rate schedule (gpt/optim/schedule.py): warm-up, cosine and its floor, and a
run's schedule as its optimizer sections set it."""

from __future__ import annotations

import math

import pytest

from gpt.optim.schedule import lr_at

MAX_LR, RATIO, WARMUP, STEPS = 6e-4, 0.1, 715, 19073


def lr(step: int) -> float:
    return lr_at(step, MAX_LR, RATIO, WARMUP, STEPS)


def test_lr_at_step_zero_is_small_but_not_zero() -> None:
    assert lr(0) == pytest.approx(MAX_LR / WARMUP)


def test_lr_warms_up_linearly_to_max() -> None:
    assert lr(WARMUP // 2) == pytest.approx(MAX_LR * (WARMUP // 2 + 1) / WARMUP)
    assert lr(WARMUP - 1) == pytest.approx(MAX_LR)  # end of warm-up
    assert lr(WARMUP) == pytest.approx(MAX_LR)  # start of the cosine


def test_lr_cosine_midpoint_and_end() -> None:
    mid = WARMUP + (STEPS - WARMUP) // 2
    min_lr = MAX_LR * RATIO
    assert lr(mid) == pytest.approx((MAX_LR + min_lr) / 2, rel=1e-3)
    assert lr(STEPS) == pytest.approx(min_lr)
    assert lr(STEPS + 1000) == pytest.approx(min_lr)  # stays at the floor


def test_lr_is_monotone_after_warmup() -> None:
    values = [lr(s) for s in range(WARMUP, STEPS + 1, 97)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    assert all(math.isfinite(v) and v > 0 for v in values)


def test_no_warmup() -> None:
    assert lr_at(0, 1.0, 0.0, 0, 10) == pytest.approx(1.0)
    assert lr_at(10, 1.0, 0.0, 0, 10) == pytest.approx(0.0)


def test_a_runs_schedule_is_its_optimizer_sections() -> None:
    from gpt.core.config import OptimConfig
    from gpt.optim.schedule import Schedule

    adamw = Schedule(OptimConfig(max_lr=1.0, min_lr_ratio=0.0, warmup_steps=2), max_steps=10)
    assert [adamw.lr(s) for s in (0, 1, 10)] == [lr_at(s, 1.0, 0.0, 2, 10) for s in (0, 1, 10)]
    assert adamw.settings(0) == {} and adamw.log_fields(0) == {}
    muon = Schedule(OptimConfig(optimizer="muon", muon_momentum=0.95, muon_momentum_warmup=4,
                                lr_schedule="trapezoid"), max_steps=10)
    assert muon.settings(0)["muon"]["momentum"] == pytest.approx(0.85)
    assert muon.settings(4) == {"muon": {"momentum": 0.95}}
    assert muon.log_fields(4) == {"muon_lr": pytest.approx(muon.lr(4) * 0.02 / 6e-4),
                                  "muon_momentum": 0.95}
    assert muon.lr(9) == lr_at(9, 6e-4, 0.1, 715, 10, "trapezoid", 0.4)
