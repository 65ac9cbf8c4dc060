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
    # the micro-batch halved while it costs more: 2 sequences of 0.85 TFLOP within 2
    assert speed.choose_slice(gpt2, "cuda") == speed.Slice(12, 2, 1024)
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
    monkeypatch.setattr(speed, "time_slice", lambda *a: speed.Timing([2.0, 1.9, 2.1], 0.5,
                                                                     slice_params))
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
    [t] = timed
    assert min(t.passes) > 0 and t.update_s > 0
    assert 1 <= len(t.passes) <= speed.TIMED_PASSES  # how many: more_passes (its own test)
    assert t.params == sizing.param_count(cfg.model)  # the whole model: it is cheap
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
    monkeypatch.setattr(speed, "time_slice", lambda cfg, s, *a: speed.Timing(
        [3000.0], 0.1, sizing.param_count(s.model(cfg.model))))
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


def test_a_wide_model_is_timed_narrower_within_the_budget_and_a_share_of_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1.2B-parameter block (8192 wide, 64 heads) once took 78 s and 21 GB to time: its
    slice is narrowed (half the heads at a time, the heads' width kept) until it costs at
    most WIDEN budgets and holds at most MEMORY_SHARE of the device's memory; timing it
    grows this process by about what slice_bytes says."""
    wide = parse_args(["--n-embd", "8192", "--n-head", "64", "--n-layer", "1"])
    host = 16 * 2**30
    s = speed.choose_slice(wide, "cpu", host)
    assert (s.n_layer, s.batch_size, s.seq_len) == (1, 1, speed.MIN_SEQ)
    assert s.n_embd < 8192 and s.n_embd // s.n_head == 8192 // 64  # heads as wide as the run's
    assert speed.slice_flops(wide.model, s) <= speed.WIDEN * speed.DEFAULT_BUDGET
    assert speed.slice_bytes(wide.model, s) <= host * speed.MEMORY_SHARE
    # a small host narrows it further: the memory share binds
    small = speed.choose_slice(wide, "cpu", 2 * 2**30)
    assert small.n_embd < s.n_embd
    assert speed.slice_bytes(wide.model, small) <= 2 * 2**30 * speed.MEMORY_SHARE
    # one head of 16,384 halves its width instead (rotary: still an even head)
    one_head = parse_args(["--n-embd", "16384", "--n-head", "1", "--n-layer", "1", "--rotary"])
    narrowed = speed.choose_slice(one_head, "cpu", host)
    assert narrowed.n_head == 1 and narrowed.n_embd <= 1024 and narrowed.n_embd % 2 == 0
    # timed for real (the smallest host's slice: a few seconds here), the estimate says so
    monkeypatch.setattr(sizing, "device_memory", lambda device: 2 * 2**30)
    e = speed.estimate(wide, CPU, torch.float32, accum=1)
    assert e.train_s is not None and f"{small.n_embd} wide ({small.n_head} heads) in place " \
        f"of 8192 (64)" in e.basis and e.step_memory is None  # a slice: no memory measured


def test_the_estimate_is_the_median_of_several_passes_and_a_range_where_they_disagree(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One slow pass (another process took the cores for a moment) no longer decides the
    estimate: the median does; where the fastest and slowest differ by more than DISAGREE,
    the line gives the range the passes span."""
    cfg = parse_args([*GPU_SMOKE, "--max-steps", "100", "--val-every", "0"])
    s = speed.choose_slice(cfg, "cpu")
    params = sizing.param_count(s.model(cfg.model))
    steady = [1.0, 1.1, 1.05]
    monkeypatch.setattr(speed, "time_slice", lambda *a: speed.Timing(steady, 0.0, params))
    e = speed.estimate(cfg, CPU, torch.float32, accum=1)
    assert e.spread is None and "(" not in e.about() and "differed" not in e.line("cpu", "cpu")
    monkeypatch.setattr(speed, "time_slice", lambda *a: speed.Timing([1.0, 4.0, 1.2], 0.0, params))
    busy = speed.estimate(cfg, CPU, torch.float32, accum=1)
    assert busy.train_s == pytest.approx(e.train_s * 1.2 / 1.05)  # the median: 1.2, not 4.0
    low, high = busy.spread
    assert low == pytest.approx(busy.train_s / 1.2) and high == pytest.approx(busy.train_s / 0.3)
    line = busy.line("cpu", "cpu")
    assert "the median of 3 forward+backward passes" in line
    assert "the timed passes differed 4.0x" in line and " to " in busy.about()


def test_a_deep_thin_model_is_timed_on_a_few_blocks() -> None:
    """1,000 blocks 16 wide: a few GFLOP, but each block's kernels cost their launches, and
    its slice of 125 blocks took 3 s a pass and 22 s in all; at most MAX_BLOCKS now (the
    FLOPs scale them to the run), and a sequence's logits at most (4 sequences of it took
    5.5 s a pass)."""
    deep = parse_args(["--n-layer", "1000", "--n-embd", "16", "--n-head", "1"])
    s = speed.choose_slice(deep, "cpu")
    assert (s.n_layer, s.batch_size, s.seq_len) == (speed.MAX_BLOCKS, 1, 1024)
    assert speed.slice_flops(deep.model, s) <= speed.DEFAULT_BUDGET
    # its logits bound the batch too: a thin model's pass is memory's, not its FLOPs'
    assert s.batch_size * s.seq_len * deep.model.vocab_size <= speed.DEFAULT_LOGITS
    ve = parse_args(["--n-layer", "24", "--n-embd", "16", "--n-head", "1", "--value-embeds"])
    assert speed.choose_slice(ve, "cpu").n_layer == 24  # paired blocks: all kept


@pytest.mark.parametrize("passes,more", [
    ([], True), ([0.3], True), ([0.3, 0.3], True),  # at least MIN_PASSES
    ([0.4, 0.4, 0.4], False),  # a second spent
    ([0.1, 0.1, 0.1], True), ([0.1] * 5, False),  # up to TIMED_PASSES
    ([1.4], True), ([1.6], False),  # a second that would end beyond HARD_LIMIT_S: not begun
])
def test_short_passes_are_timed_several_times_and_long_ones_not_beyond_the_limit(
        passes: list[float], more: bool) -> None:
    assert speed.more_passes(passes) is more


def test_the_first_steps_are_held_against_the_estimate_and_a_gap_said() -> None:
    assert speed.compare_steps(1.0, 1.9, 100) is None  # within the factor
    assert speed.compare_steps(1.0, 0.6, 100) is None
    slow = speed.compare_steps(0.5, 1.5, 120)
    assert slow is not None and slow.startswith("the steps take 1.5 s each, 3.0x of the 0.5 s")
    assert "the 120 steps left take about 3m00s" in slow
    fast = speed.compare_steps(2.0, 0.5, 10)
    assert fast is not None and "1/4.0 of the 2 s" in fast


@pytest.mark.slow
def test_a_run_whose_steps_differ_from_its_estimate_says_so_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_launch_env) -> None:
    """A stand-in timing makes the estimate 100 s a step; the real steps take a fraction
    of that: the run says so once, after its first steps (not at the first, which warms
    up), with the time left at the steps' pace; the resume gets an estimate too."""
    data = write_random_shards(tmp_path, seed=0, train=(20_000,), val=(3_000,))
    monkeypatch.setattr(speed, "MIN_FLOPS", 0.0)
    monkeypatch.setattr(speed, "time_slice", lambda cfg, s, *a: speed.Timing(
        [100.0], 0.0, sizing.param_count(s.model(cfg.model))))
    flags = [*TINY, *QUIET, "--data-dir", str(data), "--out-dir", str(tmp_path / "run"),
             "--log-every", "2", "--checkpoint-every", "3"]
    run = run_cli(*flags, "--max-steps", "6", "--stop-at-step", "3")
    assert run.returncode == 0, run.stderr
    notes = [line for line in run.stdout.splitlines() if "the start's estimate timed" in line]
    assert len(notes) == 1 and notes[0].startswith("note: the steps take ")
    assert "x of the" not in notes[0] and "of the 200 s the start's estimate timed" in notes[0]
    resumed = run_cli(*flags, "--max-steps", "6", "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr
    assert "time: about 10m00s of training" in resumed.stdout  # 3 steps left of 200 s


def test_under_torchrun_rank_0_times_its_share_and_the_cores_the_ranks_share(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks: rank 0's preflight times its share of the step (half the micro-batches
    of one process's), says the all-reduce is not timed, and scales the time where the
    local ranks' threads are more than the cores; the other rank times nothing."""
    from gpt.plan.preflight import preflight

    data = write_random_shards(tmp_path, seed=0, train=(20_000,), val=(3_000,))
    monkeypatch.setattr(speed, "MIN_FLOPS", 0.0)
    monkeypatch.setattr(speed, "time_slice", lambda cfg, s, *a: speed.Timing(
        [1.0], 0.0, sizing.param_count(s.model(cfg.model))))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(speed.os, "cpu_count", lambda: 2)
    cfg = parse_args([*TINY, *QUIET, "--max-steps", "10", "--data-dir", str(data),
                      "--out-dir", str(tmp_path / "run")])
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    one, two = preflight(cfg, env={}), preflight(cfg, env=env)
    assert one.ok and two.ok and (one.accum, two.accum) == (2, 1)
    # each rank does half the micro-batches, each at twice the time: 2 ranks x 2 threads
    # on 2 cores
    assert two.estimate.train_s == pytest.approx(one.estimate.train_s)
    assert "each of the 2 processes' share, their all-reduce not timed, x2.0 for the 2 " \
           "local processes' 4 threads on 2 cores" in two.time_line
    assert two.time_line.startswith("time: about ") and "x 2 processes" in two.time_line
    other = preflight(cfg, env={**env, "RANK": "1", "LOCAL_RANK": "1"})
    assert other.ok and other.estimate is None and other.time_line is None
