"""Tests for gpt.metrics: FLOPs per token, MFU, device peaks and the JSONL log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpt.config import model_preset
from gpt.metrics import MetricsLog, flops_per_token, mfu, peak_tflops
from gpt.model import GPT


def meta_gpt(name: str, **overrides: object) -> GPT:
    with torch.device("meta"):
        return GPT(model_preset(name, **overrides))


# --------------------------------------------------------------------------
# flops_per_token


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("gpt2", {"vocab_size": 50257}),
        ("gpt2", {"vocab_size": 50304}),
        ("tiny", {}),
        ("mini", {}),
        ("mini", {"block_size": 128, "vocab_size": 1000}),
    ],
)
@pytest.mark.parametrize("T", [64, 1024])
def test_flops_per_token_matches_model(name: str, overrides: dict, T: int) -> None:
    model = meta_gpt(name, **overrides)
    cfg = model.config
    n = model.num_params(exclude_position_embedding=True)
    expected = 6 * n + 12 * cfg.n_layer * cfg.n_embd * T
    assert flops_per_token(cfg, T) == expected
    # the position embedding is excluded, the tied head counted once
    assert n == model.num_params() - cfg.block_size * cfg.n_embd


def test_gpt2_124m_param_count() -> None:
    model = meta_gpt("gpt2", vocab_size=50257)
    assert model.num_params() == 124_439_808
    assert model.num_params(exclude_position_embedding=True) == 124_439_808 - 1024 * 768


def test_flops_per_token_known_value() -> None:
    cfg = model_preset("gpt2", vocab_size=50257)
    n = 124_439_808 - 1024 * 768
    assert flops_per_token(cfg, 1024) == 6 * n + 12 * 12 * 768 * 1024
    # ~0.85 GFLOP per token for GPT-2 124M at T=1024
    assert flops_per_token(cfg, 1024) == pytest.approx(8.5e8, rel=0.02)


def test_flops_per_token_grows_with_seq_len() -> None:
    cfg = model_preset("tiny")
    assert flops_per_token(cfg, 128) - flops_per_token(cfg, 64) == 12 * 2 * 64 * 64


# --------------------------------------------------------------------------
# mfu


@pytest.mark.parametrize("peak", [None, 0, 0.0])
def test_mfu_unknown_peak(peak: float | None) -> None:
    assert mfu(100_000, 1e9, peak) is None


def test_mfu_value() -> None:
    assert mfu(100_000, 1e9, 989.0) == pytest.approx(100_000 * 1e9 / 989e12, rel=1e-12)
    assert mfu(100_000, 1e9, 989.0) == pytest.approx(0.10111223458038422)
    assert mfu(1_000_000, 1e9, 1000.0) == pytest.approx(1.0)
    assert mfu(0, 1e9, 312.0) == 0.0


# --------------------------------------------------------------------------
# peak_tflops


@pytest.mark.parametrize(
    "name, expected",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100-PCIE-40GB", 312.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L4", 121.0),
        ("Tesla T4", None),
        ("", None),
        ("cpu", None),
    ],
)
def test_peak_tflops(name: str, expected: float | None) -> None:
    assert peak_tflops(name) == expected


# --------------------------------------------------------------------------
# MetricsLog


def read_records(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_metrics_log_writes_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with MetricsLog(path) as log:
        log.write({"kind": "header", "model": "tiny"})
        log.write({"step": 1, "loss": 10.5, "lr": 6e-4, "mfu": None})
    assert read_records(path) == [
        {"kind": "header", "model": "tiny"},
        {"step": 1, "loss": 10.5, "lr": 6e-4, "mfu": None},
    ]
    assert len(path.read_text().splitlines()) == 2


def test_metrics_log_readable_before_close(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    try:
        log.write({"step": 0})
        assert read_records(path) == [{"step": 0}]
        log.write({"step": 1, "loss": 3.25})
        assert read_records(path) == [{"step": 0}, {"step": 1, "loss": 3.25}]
    finally:
        log.close()


def test_metrics_log_appends_on_reopen(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with MetricsLog(path) as log:
        log.write({"run": 1, "step": 0})
    with MetricsLog(str(path)) as log:
        log.write({"run": 2, "step": 5})
    assert read_records(path) == [{"run": 1, "step": 0}, {"run": 2, "step": 5}]


def test_metrics_log_closes(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with MetricsLog(path) as log:
        pass
    with pytest.raises(ValueError):
        log.write({"step": 1})
    assert path.read_text() == ""
