"""Tests for the benchmark suite (gpt.bench): timing statistics, OOM and error handling,
and a CPU run of every subcommand at a tiny size, checking the JSON and markdown files."""

from __future__ import annotations

import ast
import json
import math
import runpy
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from gpt.bench import cli
from gpt.bench.step import attention as attention_bench
from gpt.bench.step import model as model_bench
from gpt.bench.step.common import mode_flops_per_token, precision_skip_reason
from gpt.bench.step.naive import NaiveCausalSelfAttention, use_naive_attention
from gpt.bench.timing import run_guarded, summarize, time_fn
from gpt.core.config import model_preset
from gpt.model.transformer import GPT
from gpt.report.flops import flops_per_token
from gpt.runtime.device import is_oom

CPU = torch.device("cpu")
RUN_FIELDS = ("command", "device", "torch", "cuda", "tf32", "commit", "time", "results")


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on a shared 2-core machine: one thread is faster and steadier."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_bench(tmp_path: Path, name: str, *args: str) -> dict[str, Any]:
    argv = [*args, "--device", "cpu", "--out", str(tmp_path), "--name", name]
    assert cli.main(argv) == 0
    data = json.loads((tmp_path / f"{name}.json").read_text())
    for key in RUN_FIELDS:
        assert key in data, key
    assert data["command"].startswith("python -m gpt.bench " + args[0])
    assert data["torch"] == torch.__version__
    assert isinstance(data["tf32"], dict) and "cuda_matmul_allow_tf32" in data["tf32"]
    assert data["device_type"] == "cpu"
    md = (tmp_path / f"{name}.md").read_text()
    assert md.startswith(f"# gpt.bench {args[0]}")
    assert "| status |" in md
    return data


# --------------------------------------------------------------------------------------
# statistics and the timing helper


def test_summarize_known_samples() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.mean == 22.0
    assert s.median == 3.0
    # sample std: deviations -21 -20 -19 -18 78; squares sum 7610; / (n - 1) = 1902.5
    assert s.std == pytest.approx(math.sqrt(1902.5))
    assert (s.min, s.max, s.n) == (1.0, 100.0, 5)
    even = summarize([4.0, 1.0, 3.0, 2.0])
    assert even.median == 2.5 and even.mean == 2.5
    assert even.std == pytest.approx(math.sqrt((2.25 + 0.25 + 0.25 + 2.25) / 3))
    one = summarize([7.0])
    assert (one.mean, one.median, one.std, one.n) == (7.0, 7.0, 0.0, 1)
    with pytest.raises(ValueError):
        summarize([])


def test_time_fn_warmup_and_steps() -> None:
    calls = []
    timing = time_fn(lambda: calls.append(1), CPU, warmup=2, steps=3)
    assert len(calls) == 5  # no extra calls off CUDA
    assert len(timing.samples_ms) == 3 and len(timing.warmup_ms) == 2
    assert timing.first_call_ms == timing.warmup_ms[0]
    assert timing.stats.n == 3
    assert timing.method == "perf_counter+synchronize"
    assert timing.host_ms is None and timing.launch_bound is None
    # Off CUDA the peak is the process's resident set (issue: host memory, not "n/a").
    assert timing.peak_mem_source == "peak RSS" and timing.peak_mem_bytes > 10 * 2**20
    d = timing.to_dict()
    assert set(d["ms"]) == {"mean", "std", "median", "min", "max", "n"}


def test_time_fn_setup_outside_the_timed_call() -> None:
    seen = []
    counter = iter(range(100))

    def setup() -> int:
        time.sleep(0.02)  # not timed
        return next(counter)

    timing = time_fn(lambda v: seen.append(v), CPU, warmup=1, steps=3, setup=setup)
    assert seen == [0, 1, 2, 3]
    assert max(timing.samples_ms) < 15


def test_time_fn_measures_time() -> None:
    timing = time_fn(lambda: time.sleep(0.01), CPU, warmup=0, steps=3)
    assert timing.stats.min >= 9.5
    assert timing.warmup_ms == [] and timing.first_call_ms is None


@pytest.mark.parametrize("warmup, steps", [(-1, 3), (1, 0)])
def test_time_fn_rejects_bad_counts(warmup: int, steps: int) -> None:
    with pytest.raises(ValueError):
        time_fn(lambda: None, CPU, warmup=warmup, steps=steps)


# --------------------------------------------------------------------------------------
# OOM and error handling


def test_is_oom() -> None:
    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"))
    assert is_oom(RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"))
    assert is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"))
    wrapped = RuntimeError("backend compiler failed")
    wrapped.__cause__ = torch.cuda.OutOfMemoryError("x")
    assert is_oom(wrapped)
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_oom(ValueError("out of range"))


def test_run_guarded_statuses() -> None:
    assert run_guarded(lambda: {"x": 1}, CPU) == {"x": 1, "status": "ok"}

    def oom() -> dict:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")

    r = run_guarded(oom, CPU)
    assert r["status"] == "oom" and "out of memory" in r["error"]

    def boom() -> dict:
        raise ValueError("bad head dim")

    r = run_guarded(boom, CPU)
    assert r["status"] == "error" and "ValueError: bad head dim" in r["error"]
    r = run_guarded(boom, CPU, classify=lambda e: {"status": "unsupported", "reason": str(e)})
    assert r == {"status": "unsupported", "reason": "bad head dim"}

    def interrupt() -> dict:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_guarded(interrupt, CPU)


def test_model_sweep_survives_simulated_oom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OOM inside one cell's timed loop is recorded as OOM; the other cells still run."""
    real = model_bench.make_step_fn

    def make_step_fn(model, mode, *args, **kwargs):  # type: ignore[no-untyped-def]
        fn = real(model, mode, *args, **kwargs)
        if mode != "fwdbwd":
            return fn

        def oom() -> None:
            fn()
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")

        return oom

    monkeypatch.setattr(model_bench, "make_step_fn", make_step_fn)
    data = run_bench(tmp_path, "oom", "model", "--sizes", "tiny", "--seq-len", "16",
                     "--batch-size", "2", "--warmup", "1", "--steps", "2")
    status = {r["mode"]: r["status"] for r in data["results"]}
    assert status == {"fwd": "ok", "fwdbwd": "oom", "step": "ok"}
    oom = next(r for r in data["results"] if r["mode"] == "fwdbwd")
    assert oom.get("ms") is None and "out of memory" in oom["error"]
    md = (tmp_path / "oom.md").read_text()
    assert "| OOM |" in md


def test_model_sweep_records_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = model_bench.build_model

    def build_model(cfg, device, attention="sdpa", nvtx=False):  # type: ignore[no-untyped-def]
        if cfg.n_layer == 2:
            raise RuntimeError("simulated failure")
        return real(cfg, device, attention, nvtx)

    monkeypatch.setattr(model_bench, "build_model", build_model)
    data = run_bench(tmp_path, "err", "model", "--sizes", "tiny", "mini", "--seq-len", "16",
                     "--batch-size", "1", "--modes", "fwd", "--warmup", "0", "--steps", "1")
    by_size = {r["size"]: r for r in data["results"]}
    assert by_size["tiny"]["status"] == "error"
    assert "simulated failure" in by_size["tiny"]["error"]
    assert by_size["mini"]["status"] == "ok"


# --------------------------------------------------------------------------------------
# subcommands at tiny sizes on the CPU


@pytest.mark.slow
def test_model_subcommand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = run_bench(tmp_path, "model", "model", "--sizes", "tiny", "--seq-len", "16",
                     "--batch-size", "2", "--precision", "fp32", "tf32", "bf16",
                     "--warmup", "1", "--steps", "2")
    results = data["results"]
    assert len(results) == 9  # 3 modes x 3 precisions
    for r in results:
        if r["precision"] == "tf32":
            assert r["status"] == "skipped" and "tf32 needs CUDA" in r["reason"]
            continue
        assert r["status"] == "ok", r
        assert set(r["ms"]) == {"mean", "std", "median", "min", "max", "n"}
        assert r["ms"]["n"] == 2 and len(r["samples_ms"]) == 2
        assert r["tokens_per_s"] == pytest.approx(32 / (r["ms"]["median"] / 1e3))
        assert r["mfu"] is None  # peak unknown on CPU
        assert r["peak_mem_bytes"] > 0  # the process's peak RSS on CPU (no allocator figures)
        assert r["timing_method"] == "perf_counter+synchronize"
        cfg = model_preset("tiny")
        full = flops_per_token(cfg, 16)
        assert r["flops_per_token"] == pytest.approx(full / 3 if r["mode"] == "fwd" else full)
    assert {r["autocast"] for r in results if r["precision"] == "bf16"} == {"bf16"}
    assert data["peak_tflops"] is None
    out = capsys.readouterr().out
    assert "median ms" in out and "unknown" in out and "skipped: tf32 needs CUDA" in out
    md = (tmp_path / "model.md").read_text()
    assert "unknown (MFU not reported" in md
    assert md.count("| tiny |") == 9


@pytest.mark.slow
def test_a_model_sweep_says_its_cells_and_time_as_it_starts_and_its_place_and_eta_per_cell(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's sweep on a CPU ran blind for minutes: it now says how many cells, which
    are skipped here and why, what tf32 and bf16 mean on this device, and a time costed by
    FLOPs at a rate timed here, then each cell's place and the time left."""
    run_bench(tmp_path, "plan", "model", "--sizes", "tiny", "--seq-len", "16", "--batch-size",
              "2", "--precision", "fp32", "tf32", "bf16", "--warmup", "1", "--steps", "2")
    err = capsys.readouterr().err.splitlines()
    plan = next(line for line in err if line.startswith("[model] 9 cells"))
    assert plan.startswith("[model] 9 cells: 6 to run, 3 skipped here (tf32 needs CUDA")
    assert "; about " in plan and "GFLOP/s one eager fp32 forward+backward of tiny at 2 x 16 " \
        "ran here" in plan
    assert any(line.startswith("note: tf32 is a CUDA tensor-core mode") for line in err)
    assert any(line.startswith("note: bf16 on a CPU is autocast to bfloat16") for line in err)
    places = [line for line in err if "(cell " in line]
    assert [line.split("(cell ")[1].split(";")[0] for line in places] == [
        f"{i} of 6" for i in range(1, 7)]
    assert all("; left: about " in line for line in places)
    assert err.index(plan) < err.index(places[0])  # said before the first cell


def test_the_eta_is_corrected_by_the_cells_done_and_compiling_costed_once_seen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpt.bench.step import sweep_plan

    cells = [sweep_plan.Cell(f"c{i}", "tiny", 16, 2, "fwd", precision, compiled, None, 2e9)
             for i, (compiled, precision) in enumerate([(False, "fp32"), (False, "fp32"),
                                                        (True, "fp32"), (True, "fp32"),
                                                        (False, "bf16"), (False, "bf16")])]
    progress = sweep_plan.SweepProgress(cells, rate=1e9)  # 2 s a cell, as FLOPs say
    assert progress.eta_words() == "about 8s + compiling 2 cells (costed once one is compiled)"
    clock = iter([0.0, 6.0, 12.0, 42.0, 72.0, 172.0])  # when each cell begins
    monkeypatch.setattr(sweep_plan.time, "perf_counter", lambda: next(clock))
    assert "(cell 1 of 6; left: about 8s + compiling 2 cells" in progress.before("c0")
    # c0 took 6 s where 2 were said: the rest of the eager cells x3 (bf16 too: no bf16 yet)
    assert "(cell 2 of 6; left: about 18s + compiling 2" in progress.before("c1")
    progress.before("c2")
    progress.before("c3")  # a compiled cell took 30 s: the other one is costed so
    assert progress.eta_words() == "about 42s"  # c3's 30 s and two bf16 cells' 6 s
    progress.before("c4")
    progress.before("c5")  # a bf16 cell took 100 s: the other bf16 one is costed so
    assert progress.eta_words() == "about 1m40s"


def test_model_peak_override_gives_mfu(tmp_path: Path) -> None:
    data = run_bench(tmp_path, "peak", "model", "--sizes", "tiny", "--seq-len", "16",
                     "--batch-size", "1", "--modes", "fwdbwd", "--warmup", "0", "--steps", "1",
                     "--peak-tflops", "2.5", "--attention", "naive")
    r = data["results"][0]
    assert data["peak_tflops"] == 2.5 and data["peak_tflops_source"] == "--peak-tflops"
    assert r["attention"] == "naive"
    assert r["mfu"] == pytest.approx(r["tokens_per_s"] * r["flops_per_token"] / 2.5e12)


def test_model_bench_times_the_speedrun_block_too(tmp_path: Path) -> None:
    data = run_bench(tmp_path, "arch", "model", "--sizes", "tiny", "--seq-len", "16",
                     "--batch-size", "1", "--modes", "fwdbwd", "step", "--warmup", "0",
                     "--steps", "1", "--arch", "speedrun")
    assert [(r["arch"], r["status"]) for r in data["results"]] == [("speedrun", "ok")] * 2


def test_components_subcommand(tmp_path: Path) -> None:
    data = run_bench(tmp_path, "parts", "components", "--sizes", "tiny", "--seq-len", "16",
                     "--batch-size", "2", "--warmup", "1", "--steps", "2")
    by = {r["component"]: r for r in data["results"]}
    assert set(by) == {"embedding", "blocks", "head+loss", "full model", "sum of parts"}
    for name in ("embedding", "blocks", "head+loss", "full model"):
        r = by[name]
        assert r["status"] == "ok", r
        assert r["fwd"]["ms"]["n"] == 2 and r["fwdbwd"]["ms"]["n"] == 2
        assert r["fwd_median_ms"] > 0 and r["fwdbwd_median_ms"] > 0
    assert by["full model"]["share_of_full_fwdbwd"] == pytest.approx(1.0)
    parts = sum(by[n]["fwdbwd_median_ms"] for n in ("embedding", "blocks", "head+loss"))
    assert by["sum of parts"]["fwdbwd_median_ms"] == pytest.approx(parts)


@pytest.mark.slow
def test_attention_subcommand(tmp_path: Path) -> None:
    data = run_bench(tmp_path, "attn", "attention", "--impls", "naive", "sdpa", "sdpa-math",
                     "sdpa-efficient", "--head-dims", "8", "16", "--seq-lens", "16", "32",
                     "--batch-size", "2", "--n-head", "2", "--warmup", "1", "--steps", "2")
    results = data["results"]
    assert len(results) == 4 * 2 * 2
    assert data["grid"]["head_dims"] == [8, 16]
    for r in results:
        if r["impl"] == "sdpa-efficient":
            # no memory-efficient kernel on CPU: recorded with the reason, not an error
            assert r["status"] == "unsupported", r
            assert "EFFICIENT_ATTENTION" in r["reason"]
            continue
        assert r["status"] == "ok", r
        assert r["fwd_ms"] > 0 and r["bwd_ms"] > 0
        assert r["fwdbwd_ms"] == pytest.approx(r["fwd_ms"] + r["bwd_ms"])
        assert r["mem_held_for_backward_bytes"] is None  # n/a off CUDA
        assert "speedup_vs_naive" in r
    md = (tmp_path / "attn.md").read_text()
    assert "unsupported: EFFICIENT_ATTENTION" in md


def test_attention_oom_in_one_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = attention_bench.make_attention

    def make_attention(impl, T, *args, **kwargs):  # type: ignore[no-untyped-def]
        if impl == "naive" and T == 32:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 48.00 GiB")
        return real(impl, T, *args, **kwargs)

    monkeypatch.setattr(attention_bench, "make_attention", make_attention)
    data = run_bench(tmp_path, "attn_oom", "attention", "--impls", "naive", "sdpa",
                     "--head-dims", "8", "--seq-lens", "16", "32", "--batch-size", "1",
                     "--n-head", "1", "--warmup", "0", "--steps", "1")
    status = {(r["impl"], r["seq_len"]): r["status"] for r in data["results"]}
    assert status == {("naive", 16): "ok", ("sdpa", 16): "ok", ("naive", 32): "oom",
                      ("sdpa", 32): "ok"}


@pytest.mark.slow
def test_ladder_subcommand(tmp_path: Path) -> None:
    data = run_bench(tmp_path, "ladder", "ladder", "--size", "tiny", "--seq-len", "16",
                     "--batch-size", "2", "--warmup", "1", "--steps", "2", "--no-compile-rungs")
    rungs = {r["key"]: r for r in data["results"]}
    assert list(rungs) == ["fp32", "tf32", "bf16", "compile", "flash", "vocab", "fused", "trainer"]
    assert rungs["tf32"]["status"] == "skipped" and rungs["tf32"]["reason"] == "tf32 needs CUDA"
    assert rungs["compile"]["status"] == "skipped"
    assert "no-compile-rungs" in rungs["compile"]["reason"]
    for key in ("fp32", "bf16", "flash", "vocab", "fused", "trainer"):
        r = rungs[key]
        assert r["status"] == "ok", r
        assert r["tokens_per_s"] == pytest.approx(32 / (r["ms_per_step"] / 1e3))
        assert r["peak_mem_bytes"] > 0
    assert rungs["fp32"]["speedup_vs_fp32"] == 1.0 and "speedup_vs_prev" not in rungs["fp32"]
    # the rungs build on each other; a skipped rung changes nothing
    assert rungs["fp32"]["settings"]["attention"] == "naive"
    assert rungs["fp32"]["settings"]["vocab_size"] == 50257
    assert rungs["bf16"]["prev_rung"] == 1  # tf32 was skipped
    assert rungs["flash"]["settings"] == {**rungs["bf16"]["settings"], "attention": "sdpa"}
    assert rungs["flash"]["speedup_vs_prev"] == pytest.approx(
        rungs["bf16"]["ms_per_step"] / rungs["flash"]["ms_per_step"])
    assert rungs["vocab"]["settings"]["vocab_size"] == 50304
    assert rungs["fused"]["settings"]["fused_adamw"] is True
    assert rungs["trainer"]["settings"]["trainer_step"] is True
    assert rungs["trainer"]["settings"]["compile"] is False  # the trainer's CPU default
    md = (tmp_path / "ladder.md").read_text()
    assert "skipped: tf32 needs CUDA" in md


@pytest.mark.slow
def test_compile_subcommand(tmp_path: Path) -> None:
    """The torch.compile path (inductor on the CPU) for attention and the model."""
    data = run_bench(tmp_path, "compile", "compile", "--size", "tiny", "--seq-len", "16",
                     "--batch-size", "1", "--modes", "fwd", "--attn-impls", "naive",
                     "--head-dim", "8", "--attn-seq-len", "16", "--attn-batch-size", "1",
                     "--n-head", "1", "--warmup", "1", "--steps", "2")
    comps = data["comparisons"]
    assert [c["part"] for c in comps] == ["attention", "attention", "model"]
    for c in comps:
        assert c["status"] == "ok", c
        assert c["eager_ms"] > 0 and c["compiled_ms"] > 0
        assert c["speedup"] == pytest.approx(c["eager_ms"] / c["compiled_ms"])
        assert c["compile_s"] is not None and c["compile_s"] >= 0
    compiled_model = next(r for r in data["results"] if r["part"] == "model" and r["compile"])
    assert compiled_model["status"] == "ok"
    assert compiled_model["first_call_ms"] > compiled_model["ms"]["median"]


def test_profiling_flags_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--nvtx / --cuda-profiler-range / --memory-snapshot are no-ops without CUDA;
    --torch-profile writes a Chrome trace per cell."""
    snap = tmp_path / "mem.pickle"
    trace_dir = tmp_path / "traces"
    data = run_bench(tmp_path, "prof", "model", "--sizes", "tiny", "--seq-len", "16",
                     "--batch-size", "1", "--modes", "step", "--attention", "naive",
                     "--warmup", "1", "--steps", "1", "--nvtx", "--cuda-profiler-range",
                     "--memory-snapshot", str(snap), "--torch-profile", str(trace_dir))
    assert data["results"][0]["status"] == "ok"
    assert not snap.exists()
    assert "memory snapshot" in capsys.readouterr().err
    traces = list(trace_dir.glob("*.pt.trace.json"))
    assert len(traces) == 1 and traces[0].name.startswith("model_tiny_T16_B1_step_fp32")
    assert "traceEvents" in json.loads(traces[0].read_text())


# --------------------------------------------------------------------------------------
# pieces


@pytest.mark.numerics
def test_naive_attention_matches_sdpa() -> None:
    torch.manual_seed(0)
    cfg = model_preset("tiny", block_size=32, vocab_size=97)
    ref = GPT(cfg).eval()
    naive = GPT(cfg).eval()
    naive.load_state_dict(ref.state_dict())
    use_naive_attention(naive)
    assert all(isinstance(b.attn, NaiveCausalSelfAttention) for b in naive.transformer.h)
    assert naive.state_dict().keys() == ref.state_dict().keys()  # same names, mask not saved
    x = torch.randint(0, 97, (2, 24))
    l_ref, loss_ref = ref(x, x)
    l_naive, loss_naive = naive(x, x)
    torch.testing.assert_close(l_naive, l_ref, rtol=1e-4, atol=1e-5)
    loss_ref.backward()
    loss_naive.backward()
    torch.testing.assert_close(naive.transformer.h[0].attn.c_attn.weight.grad,
                               ref.transformer.h[0].attn.c_attn.weight.grad, rtol=1e-4, atol=1e-6)


def test_mode_flops_and_precision_skips() -> None:
    cfg = model_preset("tiny")
    assert mode_flops_per_token(cfg, 64, "fwd") == pytest.approx(flops_per_token(cfg, 64) / 3)
    assert mode_flops_per_token(cfg, 64, "step") == flops_per_token(cfg, 64)
    assert precision_skip_reason("fp32", CPU) is None
    assert precision_skip_reason("bf16", CPU) is None  # CPU autocast has bf16
    assert "tf32 needs CUDA" in precision_skip_reason("tf32", CPU)


def test_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["model", "--sizes", "gpt5", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --sizes 'gpt5' is not a preset") and len(err.splitlines()) == 1
    assert cli.main(["ladder", "--seq-len", "0", "--device", "cpu"]) == 2
    assert "--seq-len and --batch-size must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["model", "--size", "gpt2"])  # the suggestion is this subcommand's flag
    assert e.value.code == 2 and "did you mean '--sizes'?" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["model", "--precision", "fp8"])
    assert e.value.code == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_requested_without_gpu(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    assert cli.main(["model", "--device", "cuda"]) == 2
    assert "--device cuda" in capsys.readouterr().err
    # a standalone subcommand's error is one line too (it was a traceback)
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29633"}.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["comm", "allreduce", "--device", "cuda"]) == 2
    assert capsys.readouterr().err == ("error: --device cuda: no CUDA device is visible to torch "
                                       "(try --device auto)\n")


def test_compile_rows_set_the_speed_up_and_break_even_or_say_what_failed() -> None:
    """The compile subcommand's arithmetic, without compiling (test_compile_subcommand, in the
    slow tier, runs inductor): speed-up eager / compiled, and the steps a compilation's
    seconds take to win back at the time saved per step."""
    from gpt.bench.step.compile import _compare

    ok = _compare("model", "fwd", {"status": "ok", "ms": {"median": 30.0}},
                  {"status": "ok", "ms": {"median": 20.0}, "compile_s": 5.0,
                   "first_call_ms": 5020.0}, "ms")
    assert (ok["status"], ok["speedup"], ok["break_even_steps"]) == ("ok", 1.5, 500.0)
    slower = _compare("model", "fwd", {"status": "ok", "ms": 20.0},
                      {"status": "ok", "ms": 25.0, "compile_s": 5.0}, "ms")
    assert slower["speedup"] == 0.8 and slower["break_even_steps"] is None  # never wins back
    failed = _compare("attention", "sdpa", {"status": "ok", "ms": 1.0},
                      {"status": "error", "error": "backend compiler failed"}, "ms")
    assert failed["status"] == "error" and failed["reason"] == "backend compiler failed"
    assert "speedup" not in failed


def test_module_entry_point(monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m gpt.bench --help` (run in-process: no second torch import)."""
    monkeypatch.setattr(sys, "argv", ["gpt.bench", "--help"])
    with pytest.raises(SystemExit) as e:
        runpy.run_module("gpt.bench", run_name="__main__", alter_sys=False)
    assert e.value.code == 0
    out = capsys.readouterr().out
    for sub in ("model", "components", "attention", "ladder", "compile"):
        assert sub in out


def test_prepare_bench_writes_to_the_scratch_folder_unless_told() -> None:
    """The recorded results in benchmarks/ are tracked in git: a plain run must not
    overwrite them."""
    from gpt.bench.prepare.throughput import default_out

    assert default_out(None, 2) == Path("runs") / "bench" / "prepare_cpu2.json"
    assert default_out("benchmarks", 2) == Path("benchmarks/prepare_cpu2.json")


def test_a_failed_trainer_run_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """cpu-malloc whose trainer refuses a flag: one line naming the run, ending with the
    trainer's own error (it was a CalledProcessError traceback)."""
    assert cli.main(["cpu-malloc", "--repeats", "1", "--steps", "0", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the reuse run 1 failed: ") and "--max-steps must be >= 1" in err
    assert "Traceback" not in err and not list(tmp_path.iterdir())


def test_prepare_bench_records_the_command_typed(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Its record said the interpreter and sys.argv: under `python -m gpt.bench` the path of
    __main__.py, in-process whatever the caller's argv was."""
    argv = ["prepare", "--mb", "0.02", "--repeats", "1", "--scale", "0", "--inputs", "paragraphs",
            "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    data = json.loads((tmp_path / "prepare_cpu2.json").read_text())  # --out: a folder
    assert data["command"] == "python -m gpt.bench " + " ".join(argv)
    assert "commit" in data and data["inputs"]["paragraphs"]["same_tokens"]
    assert "| paragraphs |" in capsys.readouterr().out


def test_comm_outside_torchrun_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("RANK", raising=False)
    assert cli.main(["comm", "allreduce"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: run under torchrun, e.g. torchrun ") and len(err.splitlines()) == 1


def test_every_subcommand_names_a_module_that_defines_and_runs_it() -> None:
    """The command line names each subcommand's module by its path below gpt.bench (a part's
    folder, then the module): each must import and define the parser, and a timing
    subcommand's its runner."""
    for name in cli.SUBCOMMANDS:
        assert hasattr(cli._module(name), "add_parser"), name
    for name, (module, runner) in cli.RUNNERS.items():
        assert callable(getattr(cli._module(name), runner)), (name, module, runner)


def bench_imports(path: Path, bench: Path) -> set[str]:
    """The suite's modules `path` imports, wherever the import stands (in a function too),
    each as its path below gpt/bench without .py ("step/common", "record")."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:  # `from pkg import sub` too
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        for name in names:
            rel = name.split(".")[2:] if name.startswith("gpt.bench.") else []
            if rel and bench.joinpath(*rel).with_suffix(".py").is_file():
                out.add("/".join(rel))
            elif rel and bench.joinpath(*rel).is_dir():  # a part itself
                out.add("/".join([*rel, "__init__"]))
    return out


def test_the_shared_modules_import_no_part_and_no_part_imports_another() -> None:
    """gpt/bench/'s top holds what its parts (step/, tokens/, prepare/, gpu/) share: those
    modules import no part, and no part imports another, so a part reads with the shared
    modules alone. The command line is the one module that knows every part."""
    bench = Path(cli.__file__).parent
    wrong = []
    for path in sorted(bench.rglob("*.py")):
        here = path.relative_to(bench)
        if here.name in ("cli.py", "__main__.py") and len(here.parts) == 1:
            continue
        for target in bench_imports(path, bench):
            there = target.split("/")
            if len(there) > 1 and (len(here.parts) == 1 or there[0] != here.parts[0]):
                wrong.append(f"{here} -> {target}")
    assert not wrong, f"imports across the suite's parts: {wrong}"
