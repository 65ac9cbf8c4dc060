"""How long a run takes on the device it is on (gpt/plan/speed.py): the slice that is
timed, the arithmetic that scales it to the run (from where the run starts), the line
the dry run and the run's start print, and a GPU recipe on a CPU said plainly."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from gpt.core.cli import parse_args
from gpt.model import sizing
from gpt.plan import speed
from gpt.report.flops import flops_per_token

from helpers import QUIET, REPO, TINY, run_cli, write_random_shards

GPU_SMOKE = ["--config", str(REPO / "configs" / "gpu-smoke.toml")]
CPU = torch.device("cpu")


def test_the_slice_is_the_whole_micro_batch_where_it_is_cheap_and_a_part_where_not() -> None:
    tiny = parse_args([*TINY, "--max-steps", "1000"])
    assert speed.choose_slice(tiny, "cpu") == speed.Slice(2, 4, 32)  # the whole micro-batch
    gpt2 = parse_args(GPU_SMOKE)  # 16 x 1024 tokens of GPT-2 124M
    assert speed.choose_slice(gpt2, "cpu") == speed.Slice(1, 1, speed.MIN_SEQ)
    assert speed.choose_slice(gpt2, "cuda") == speed.Slice(12, 1, 1024)  # one sequence
    # value embeddings pair early blocks with late ones: every block is kept
    ve = parse_args([*GPU_SMOKE, "--value-embeds"])
    assert speed.choose_slice(ve, "cpu").n_layer == 12


def test_the_slice_is_scaled_to_the_run_by_flops_parameters_and_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in timing (2 s a forward+backward of the slice, 0.5 s an update of its
    parameters) gives exactly the arithmetic's time: nothing else is added or lost."""
    cfg = parse_args([*GPU_SMOKE, "--max-steps", "100", "--val-every", "50", "--val-steps", "3"])
    s = speed.choose_slice(cfg, "cpu")
    sliced = dataclasses.replace(cfg.model, n_layer=s.n_layer)
    slice_params = sizing.param_count(sliced)
    monkeypatch.setattr(speed, "time_slice", lambda *a: (2.0, 0.5, slice_params, 3))
    e = speed.estimate(cfg, CPU, torch.float32, accum=4)
    micro = 2.0 * (flops_per_token(cfg.model, 1024) * 16 * 1024) / (
        flops_per_token(sliced, s.seq_len) * s.seq_len)
    step = 4 * micro + 0.5 * sizing.param_count(cfg.model) / slice_params
    assert e.train_s == pytest.approx(100 * step, rel=1e-9)
    assert e.tokens_per_s == pytest.approx(65536 / step, rel=1e-9)
    assert e.val_s == pytest.approx(3 * 3 * micro / 3, rel=1e-9)  # steps 0, 50 and 100
    # a resume at step 60: 40 steps and one validation (at the end) left
    resumed = speed.estimate(cfg, CPU, torch.float32, accum=4, start_step=60)
    assert resumed.train_s == pytest.approx(40 * step, rel=1e-9)
    assert resumed.val_s == pytest.approx(3 * micro / 3, rel=1e-9)
    line = e.line("cpu (a CPU)", "cpu")
    assert line.startswith("time: about ") and "of training + " in line
    assert "1 of 12 blocks with the embeddings and the head" in line and "by FLOPs" in line
    assert "the recipe is meant for a GPU" in line  # hours on a CPU
    assert "meant for a GPU" not in e.line("cuda:0 (a GPU)", "cuda")


def test_a_run_too_short_to_time_says_so_and_times_nothing(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.setattr(speed, "time_slice", lambda *a: pytest.fail("timed a short run"))
    e = speed.estimate(parse_args([*TINY, "--max-steps", "10"]), CPU, torch.float32, accum=2)
    assert e.train_s is None and "a short run" in e.line("cpu", "cpu")
    assert "not timed on cpu" in e.line("cpu", "cpu")


def test_timing_a_slice_runs_the_step_and_leaves_the_runs_random_state_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = parse_args([*TINY, "--max-steps", "1000"])
    timed = []
    real = speed.time_slice
    monkeypatch.setattr(speed, "time_slice", lambda *a: timed.append(real(*a)) or timed[-1])
    torch.manual_seed(123)
    state = torch.get_rng_state()
    e = speed.estimate(cfg, CPU, torch.float32, accum=2)
    assert torch.equal(torch.get_rng_state(), state)  # the run's seed draws as before
    [(fb, opt, params, passes)] = timed
    assert fb > 0 and opt > 0 and 1 <= passes <= speed.TIMED_PASSES
    assert params == sizing.param_count(cfg.model)  # the whole model: it is cheap
    assert e.train_s is not None and e.train_s > 0 and "the whole model" in e.basis


def test_the_dry_run_and_the_run_say_the_time_and_a_gpu_recipe_on_a_cpu_is_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_launch_env) -> None:
    """A slow stand-in timing makes the tiny recipe one of hours: with --device auto on
    this machine (no GPU) the dry run and the run both warn (with --device cpu asked for,
    only the time line says it: test_the_slice_is_scaled...)."""
    if torch.cuda.is_available():
        pytest.skip("--device auto picks the GPU here")
    (tmp_path / "data").mkdir()
    data = write_random_shards(tmp_path / "data", seed=0, train=(20_000,), val=(3_000,))
    # 3,000 s a forward+backward: one step of two micro-batches is 1h40m
    monkeypatch.setattr(speed, "time_slice", lambda cfg, s, *a: (
        3000.0, 0.1, sizing.param_count(dataclasses.replace(cfg.model, n_layer=s.n_layer)), 1))
    flags = [*TINY, *QUIET, "--max-steps", "2000", "--data-dir", str(data)]
    auto = [*flags, "--device", "auto"]  # the last --device given wins
    dry = run_cli(*auto, "--out-dir", str(tmp_path / "a"), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "time: about " in dry.stdout and "the recipe is meant for a GPU" in dry.stdout
    assert "warning: --device auto found no GPU and falls back to cpu" in dry.stderr
    monkeypatch.setattr(speed, "MIN_FLOPS", 0.0)  # one step is timed too
    run = run_cli(*auto, "--out-dir", str(tmp_path / "b"), "--max-steps", "1")
    assert run.returncode == 0, run.stderr  # the run says it as it starts, and goes on
    assert "time: about 1h40m" in run.stdout and "falls back to cpu" in run.stderr
