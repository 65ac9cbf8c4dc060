"""The memory planner (gpt.plan.memory, python -m gpt.bench memory): its fake-tensor prediction
against a real CPU step's peak, as the CPU allocator counts it, and its command line."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.distributed as dist

from gpt.bench import cli as bench_cli
from gpt.bench.cli import main as bench_main
from gpt.core.cli import parse_args
from gpt.engine import parallel
from gpt.engine.step import forward_backward, optimizer_step
from gpt.model.transformer import GPT
from gpt.plan import memory, memory_trace
from gpt.runtime.world import Runtime
from helpers import error_line, highest_rise

SMALL = ["--model", "tiny", "--n-layer", "2", "--n-head", "2", "--n-embd", "64",
         "--vocab-size", "512", "--block-size", "64", "--batch-size", "4", "--seq-len", "64"]


class _Batches:
    def __init__(self, cfg) -> None:
        self.shape, self.vocab = (cfg.data.batch_size, cfg.data.seq_len), cfg.model.vocab_size

    def next_batch(self):
        return torch.randint(0, self.vocab, self.shape), torch.randint(0, self.vocab, self.shape)


def real_peak(cfg, dtype: torch.dtype, micro_steps: int) -> int:
    """Peak bytes the CPU allocator holds over a real training step (after one step that
    created the optimizer state), from the profiler's allocation events: what is live
    when it starts (weights, AdamW state; the old gradients are freed first) plus the
    highest that the blocks allocated during the step add up to at any moment."""
    torch.manual_seed(0)
    model = GPT(cfg.model)
    train = dataclasses.replace(cfg.train, compile=False, device="cpu")
    par = parallel.parallelize(model, train, cfg.optim, Runtime(device=torch.device("cpu")), dtype)
    batches = _Batches(cfg)

    def step(micro: int) -> torch.Tensor:
        return forward_backward(par.train_model, par.scaler, par.optimizer, batches, micro,
                                1.0, "cpu", dtype)[1]

    optimizer_step(par.optimizer, par.scaler, 1e-3, step(1))
    state = [v for s in par.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    live = sum(t.numel() * t.element_size() for t in [*model.parameters(), *state])
    return live + highest_rise(lambda: step(micro_steps))


def test_the_measurement_ignores_blocks_an_earlier_profile_left_alive() -> None:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True):
        leftover = [torch.ones(1 << 20, dtype=torch.uint8)]

    def run() -> list[torch.Tensor]:
        first = torch.ones(1000, dtype=torch.uint8)
        leftover.clear()  # freed mid-run: not this run's memory
        return [first, torch.ones(3000, dtype=torch.uint8)]

    assert highest_rise(run) == 4000


@pytest.mark.slow
@pytest.mark.parametrize("extra, dtype, micro", [
    ([], torch.float32, 2),
    (["--dtype", "bf16", "--activation-checkpointing"], torch.bfloat16, 2),
    (["--n-layer", "4", "--batch-size", "8"], torch.float32, 1),
])
def test_the_plan_matches_a_real_cpu_steps_peak(extra, dtype, micro) -> None:
    cfg = parse_args([*SMALL, *extra])
    tokens = cfg.data.batch_size * cfg.data.seq_len * micro
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, total_batch_tokens=tokens))
    plan = memory.plan(cfg, device_type="cpu")
    assert plan.setup["measured_micro_steps"] == micro
    assert plan.peak_bytes == sum(plan.components.values())
    measured = real_peak(cfg, dtype, micro)
    assert measured / plan.peak_bytes == pytest.approx(1.0, abs=0.03), (measured, plan.to_json())


@pytest.mark.slow
def test_components_follow_the_parallel_mode() -> None:
    base = parse_args([*SMALL, "--total-batch-tokens", "2048"])
    ddp = memory.plan(base, world_size=1, device_type="cpu").components
    zero1 = memory.plan(parse_args([*SMALL, "--parallel", "zero1"]), 4, "cpu").components
    fsdp = memory.plan(parse_args([*SMALL, "--parallel", "fsdp"]), 4, "cpu").components
    param_bytes = sum(p.numel() * 4 for p in GPT(base.model).parameters())
    assert ddp["parameters"] == param_bytes and ddp["gradients"] == param_bytes
    # ZeRO-1: the whole model and its gradients; a quarter of AdamW's state, give or take
    # the largest tensor (the embedding, which one rank holds whole)
    assert zero1["parameters"] == param_bytes and zero1["gradients"] == param_bytes
    assert ddp["optimizer state"] / 4 <= zero1["optimizer state"] < ddp["optimizer state"]
    # FSDP: each rank holds a quarter of the parameters and their AdamW state
    assert fsdp["parameters"] == pytest.approx(param_bytes / 4, rel=0.05)
    assert fsdp["optimizer state"] == pytest.approx(ddp["optimizer state"] / 4, rel=0.05)
    assert not dist.is_initialized()  # the planner's fake process group is gone


@pytest.mark.slow
def test_activation_checkpointing_lowers_the_planned_activations() -> None:
    args = [*SMALL, "--n-layer", "6"]
    plain = memory.plan(parse_args(args), device_type="cpu")
    ac = memory.plan(parse_args([*args, "--activation-checkpointing"]), device_type="cpu")
    assert ac.components["activations"] < plain.components["activations"] / 2
    assert 0 < ac.logits_and_loss_bytes <= ac.components["activations"] + ac.components["temporary buffers"]


def test_the_planner_refuses_to_run_inside_a_process_group(tmp_path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        with pytest.raises(memory.ConfigError, match="outside torchrun"):
            memory.plan(parse_args([*SMALL, "--parallel", "fsdp"]), 2, "cpu")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_largest_batch_is_the_last_that_fits() -> None:
    cfg = parse_args([*SMALL, "--total-batch-tokens", "256"])  # one micro-batch a step
    capacity = memory.RESERVE + int(memory.plan(
        dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, batch_size=6,
                                                          total_batch_tokens=6 * 64)),
        device_type="cpu").peak_bytes * memory.MARGIN) + 1
    b, plan = memory.largest_batch(cfg, capacity, device_type="cpu")
    assert b == 6 and plan is not None and plan.fits(capacity)
    assert memory.largest_batch(cfg, memory.RESERVE, device_type="cpu") == (0, None)


@pytest.mark.slow
def test_the_command_line_takes_the_trainers_flags(capsys, tmp_path) -> None:
    out = tmp_path / "plan.json"
    assert bench_main(["memory", *SMALL, "--device", "cpu", "--json", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == printed
    assert printed["peak_bytes"] == sum(printed["components"].values())
    assert printed["setup"]["device_type"] == "cpu" and printed["setup"]["dtype"] == "float32"
    assert bench_main(["memory", *SMALL, "--world-size", "2", "--parallel", "fsdp",
                       "--largest-batch"]) == 0
    text = capsys.readouterr().out
    assert "peak per device" in text and "largest --batch-size on 80GB" in text
    assert "--parallel fsdp on 2 device(s)" in text


def test_a_bad_trainer_flag_is_named(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_main(["memory", *SMALL, "--batch-sise", "4"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--batch-sise" in err
    assert err.startswith("python -m gpt.bench memory: error:")  # the command typed
    assert "python train_gpt2.py --help lists every trainer flag" in err


@pytest.mark.parametrize("flags, words", [
    (["--batch-size", "99999999999999999999"], "--batch-size 99999999999999999999 x --seq-len"),
    (["--batch-size", str(2**30)], "tokens per micro-batch: must be at most 2**31"),
    (["--total-batch-tokens", str(2**60)], "--total-batch-tokens must be at most 2**40"),
])
def test_a_huge_number_is_refused_where_it_is_typed(flags: list[str], words: str,
                                                    capsys) -> None:
    with pytest.raises(SystemExit) as e:  # the planner and the dry run both parse this way
        bench_cli.main(["memory", *flags])
    assert e.value.code == 2 and words in error_line(capsys.readouterr().err)


def test_the_planner_names_a_world_size_below_one(capsys) -> None:
    assert bench_cli.main(["memory", "--model", "tiny", "--world-size", "0"]) == 2
    assert "--world-size 0" in error_line(capsys.readouterr().err)


def test_the_planner_refuses_a_world_the_batch_does_not_divide(capsys) -> None:
    tiny = ["--model", "tiny", "--block-size", "32", "--seq-len", "32", "--batch-size", "4",
            "--total-batch-tokens", "256"]
    assert bench_cli.main(["memory", *tiny, "--world-size", "3"]) == 2
    assert "world size 3" in error_line(capsys.readouterr().err)


@pytest.mark.slow
def test_gpt2_xl_with_fsdp_and_checkpointing_fits_80gb_at_the_acceptance_batch() -> None:
    from pathlib import Path

    from gpt.bench.gpu.stages import Sizes, Where, xl_cell  # the acceptance run's own XL cell

    cell = xl_cell(Sizes.make(smoke=False), Where(Path("data"), Path("work"), Path("tmp")))
    cfg = parse_args(cell.params["trainer_argv"])
    assert cfg.train.parallel == "fsdp" and cfg.train.activation_checkpointing == "blocks"
    plan = memory.plan(cfg, world_size=cell.params["world_size"])
    assert plan.fits(memory.CAPACITIES["80GB"]), plan.table()
    assert not plan.fits(memory.CAPACITIES["24GB"])  # the optimizer state alone is 11.6 GiB


def test_the_planners_tracker_keeps_torchs_step_peak_without_its_module_peaks() -> None:
    """The planner's tracker (memory_trace._StepPeak before torch's MemTracker) skips the
    per-module peaks, which cost most of a large model's planning time: the step's peak
    snapshot is torch's own, category by category."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    cfg = parse_args(SMALL)
    peaks = []
    for tracker_class in (MemTracker, type("Tracker", (memory_trace._StepPeak, MemTracker), {})):
        with torch.device("meta"):
            model = GPT(cfg.model)
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            x = torch.zeros(4, 64, dtype=torch.long)
            tracker = tracker_class()
            tracker.track_external(model)
            with tracker:
                model(x, x)[1].backward()
            peaks.append(tracker.get_tracker_snapshot("peak"))
    assert peaks[0] == peaks[1] and peaks[0][torch.device("cpu")]["Total"] > 0


def test_the_planners_tracker_defers_to_torch_where_its_state_is_named_otherwise() -> None:
    """A torch release whose tracker keeps its state under other names runs its own
    update rather than the planner's."""
    calls = []

    class Tracker:
        def _update_peak_stats(self, peak_state: object) -> None:
            calls.append(peak_state)

    tracker = type("Planned", (memory_trace._StepPeak, Tracker), {})()
    tracker._update_peak_stats("PEAK_FW")
    assert calls == ["PEAK_FW"]


# ---- what the plan says: the model named by its preset, the GPUs' fits only for CUDA


def test_a_preset_with_a_field_changed_is_named_by_the_preset_and_the_change() -> None:
    assert memory.model_name(parse_args(["--model", "gpt2"])) == "gpt2"
    tiny = parse_args(["--model", "tiny", "--block-size", "32", "--seq-len", "32"])
    assert memory.model_name(tiny) == "tiny preset, block size 32"
    assert memory.model_name(parse_args(["--model", "tiny", "--rotary", "--block-size", "32",
                                         "--seq-len", "32"])) == \
        "tiny preset, block size 32, rotary"
    other = parse_args(["--model", "tiny", "--n-layer", "3"])  # not the preset's shape
    assert memory.model_name(other) == "custom: 3 layers, 2 heads, 64 wide"


@pytest.mark.slow
def test_the_gpus_fit_lines_are_said_for_a_cuda_plan_only() -> None:
    cfg = parse_args([*SMALL, "--total-batch-tokens", "256"])
    assert "24GB: fits" in memory.plan(cfg, device_type="cuda").table()
    cpu = memory.plan(cfg, device_type="cpu").table()
    assert "peak per device" in cpu and "GB:" not in cpu


def test_the_dry_run_counts_gpt2s_parameters_with_and_without_the_padded_vocabulary() -> None:
    from gpt.plan import dry_run

    line = dry_run.params_words(parse_args(["--model", "gpt2"]))
    # the README's 124,439,808 is GPT-2's; the padded vocabulary adds 47 rows of 768
    assert line.startswith("124,475,904 (gpt2 model; 124,439,808 with GPT-2's 50,257 tokens")
    assert "padded to 50,304" in line and "+36,096" in line
    assert "padded" not in dry_run.params_words(parse_args(SMALL))  # vocabulary 512: none


# ---- a long search says what it is doing


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_long_search_says_what_it_plans_every_few_seconds_and_a_short_one_nothing(capsys
                                                                                   ) -> None:
    clock = Clock()
    say = memory.Progress("the layout (auto)", clock=clock)
    say("--batch-size 8")  # at once: a short search says nothing
    clock.now += memory.Progress.FIRST_S
    say("--batch-size 7")
    clock.now += 1.0
    say("--batch-size 6")  # a second later: not yet again
    clock.now += memory.Progress.EVERY_S
    say("--batch-size 5")
    assert capsys.readouterr().err.splitlines() == [
        "planning the layout (auto): --batch-size 7 (2 s so far)",
        "planning the layout (auto): --batch-size 5 (8 s so far)"]


def test_one_slow_plan_is_not_silent_either(capsys) -> None:
    """Open as a context, a thread says the candidate still being planned when the time
    comes, with no new candidate to prompt it (the stand-in clock jumps; the thread looks
    every POLL_S)."""
    import time

    clock = Clock()
    with memory.Progress("the memory", clock=clock) as say:
        say("--batch-size 64")
        clock.now += memory.Progress.FIRST_S  # then nothing calls it again
        for _ in range(200):  # its next look: within POLL_S, however busy the machine
            if say.last == clock.now:
                break
            time.sleep(0.05)
    assert capsys.readouterr().err == "planning the memory: --batch-size 64 (2 s so far)\n"


def test_the_searches_report_each_candidate_they_plan() -> None:
    from gpt.plan import layout

    seen: list[str] = []
    cfg = parse_args([*SMALL, "--total-batch-tokens", "512"])
    capacity = memory.RESERVE + 2**30
    memory.largest_batch(cfg, capacity, device_type="cpu", limit=2, progress=seen.append)
    assert seen == ["--batch-size 1", "--batch-size 2"]
    seen.clear()
    auto = parse_args([*SMALL, "--total-batch-tokens", "512", "--batch-size", "auto"])
    tiny_plan = memory.MemoryPlan(1, {}, 0, {})  # fits anything: a stand-in for speed
    layout.settle(auto, 1, "cpu", capacity, progress=seen.append,
                  planner=lambda cfg, world, device: tiny_plan)
    assert seen and seen[0] == "--parallel ddp, --activation-checkpointing none, --batch-size 1"


def _plans_deep_and_traced(monkeypatch, flags: list[str], world_size: int = 1):
    """The plan of a 13-block model extrapolated from 9 and 11 blocks (the thresholds
    lowered, so that the test traces a few blocks), and the same model traced whole."""
    cfg = parse_args([*SMALL, "--vocab-size", "512", *flags, "--n-layer", "13"])
    with monkeypatch.context() as m:
        m.setattr(memory, "TRACED_LAYERS", 12)
        m.setattr(memory, "EXTRAPOLATED_FROM", (8, 10))
        extrapolated = memory.plan(cfg, world_size, "cpu")
    return extrapolated, memory.plan(cfg, world_size, "cpu")


@pytest.mark.slow
@pytest.mark.parametrize("flags", [
    [],
    pytest.param(["--n-embd", "256", "--n-head", "4", "--batch-size", "1", "--seq-len", "8"],
                 id="gradients-dominate"),
    pytest.param(["--value-embeds", "--unet-skips", "--rotary"], id="value-embeds-unet"),
    pytest.param(["--activation-checkpointing", "blocks", "--total-batch-tokens", "512"],
                 id="checkpointing-accumulating"),
], ids=lambda f: " ".join(f) or "plain")
def test_a_deep_model_is_planned_from_two_shallow_traces_as_its_whole_trace_says(
        flags, monkeypatch) -> None:
    """Tracing every block of 1,000 costs minutes; every block holds the same, so two
    traces of the model's own kind, extrapolated block by block, give the whole trace's
    plan, to the byte (the bytes a step holds are affine in the depth)."""
    extrapolated, traced = _plans_deep_and_traced(monkeypatch, flags)
    assert extrapolated.components == traced.components
    assert extrapolated.peak_bytes == traced.peak_bytes
    assert extrapolated.setup["params"] == traced.setup["params"]
    assert extrapolated.logits_and_loss_bytes == traced.logits_and_loss_bytes
    assert "13 blocks: traced at 9 and 11 and extrapolated" in extrapolated.assumptions[-1]


@pytest.mark.slow
def test_a_deep_fsdp_model_is_planned_from_two_shallow_traces(monkeypatch) -> None:
    extrapolated, traced = _plans_deep_and_traced(monkeypatch, ["--parallel", "fsdp"], 2)
    assert extrapolated.components == traced.components


@pytest.mark.slow
def test_the_dry_run_of_a_thousand_blocks_traces_a_few_and_says_so(monkeypatch) -> None:
    """What the dry run of --n-layer 1000 traces: two models of a few blocks, not 1,000."""
    depths: list[int] = []
    real = memory.measure_step

    def counted(cfg, *args):
        depths.append(cfg.model.n_layer)
        return real(cfg, *args)

    monkeypatch.setattr(memory, "measure_step", counted)
    cfg = parse_args([*SMALL, "--n-layer", "1000", "--n-embd", "16", "--n-head", "1"])
    plan = memory.plan(cfg, 1, "cpu")
    assert depths == [8, 16]
    assert plan.setup["n_layer"] == 1000 and plan.setup["params"] == \
        sum(p.numel() for p in GPT(cfg.model).parameters())
