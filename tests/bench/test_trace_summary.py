"""Where a profiled step's time goes (gpt/bench/trace_summary.py): on a trace written in
torch.profiler's Chrome format by hand, whose answers are known (the H100 baseline's 124M
trace among them: five micro-batches in two profiler steps), and on a real CPU trace of
the trainer's --torch-profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import QUIET, TINY, run_cli, write_random_shards
from gpt.bench import trace_summary


def kernel(name: str, ts: float, dur: float, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


def test_busy_time_shares_and_top_kernels_of_a_known_trace() -> None:
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#10", "ts": 0, "dur": 500},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#11", "ts": 500, "dur": 500},
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 0, 300),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 250, 100),  # overlaps the first: 350 busy
        kernel("pytorch_flash::flash_fwd_kernel", 400, 200),  # 50 us gap before it
        kernel("triton_red_fused_add_native_layer_norm_0", 700, 100),  # 100 us gap before it
        kernel("Memcpy DtoD (Device -> Device)", 800, 50, cat="gpu_memcpy"),
        kernel("ncclDevKernel_AllReduce_Sum_f32", 850, 50),
        kernel("elementwise_kernel", 900, 100),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 999, "tid": 1},  # not GPU
    ]
    s = trace_summary.summarize({"traceEvents": events})
    assert s["device"] == "cuda" and s["steps"] == 2 and s["kernels"] == 7
    assert s["micro_batches"] is None and s["per_step_from"] == "profiler steps"  # no loss kernel
    assert s["gpu_span_ms_per_step"] == pytest.approx(1.0 / 2)  # 0 .. 1000 us over two steps
    assert s["gpu_busy_ms_per_step"] == pytest.approx(0.85 / 2)  # all but the two gaps
    assert s["busy_fraction"] == pytest.approx(0.85)
    total = 300 + 100 + 200 + 100 + 50 + 50 + 100
    kinds = s["kinds"]
    assert list(kinds)[0] == "matmul" and kinds["matmul"]["share"] == pytest.approx(400 / total, abs=1e-4)
    assert {k: kinds[k]["ms_per_step"] for k in kinds} == pytest.approx(
        {"matmul": 0.2, "attention": 0.1, "triton": 0.05, "other": 0.05, "copy/fill": 0.025,
         "collective": 0.025})
    top = s["top"][0]
    assert (top["kind"], top["calls"], top["ms_per_step"]) == ("matmul", 2, 0.2)
    assert {t["name"]: t["kind"] for t in s["top"]}["Memcpy DtoD (Device -> Device)"] == "copy/fill"


def test_a_cpu_trace_is_summarised_from_its_outermost_operators() -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 0, "dur": 100, "tid": 1},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 80, "tid": 1},  # inside
              {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 150, "dur": 50, "tid": 1}]
    s = trace_summary.summarize({"traceEvents": events}, steps=1)
    assert s["device"] == "cpu" and s["kernels"] == 2
    assert s["busy_fraction"] == pytest.approx(150 / 200)
    assert s["kinds"]["matmul"]["share"] == pytest.approx(100 / 150, abs=1e-4)
    with pytest.raises(ValueError, match="neither GPU kernels nor CPU operators"):
        trace_summary.summarize({"traceEvents": []})


@pytest.mark.slow
def test_the_trainers_own_trace_summarises(tmp_path: Path) -> None:
    data = write_random_shards(tmp_path, seed=5, train=(5_000,))
    trace = tmp_path / "trace"
    proc = run_cli(*TINY, *QUIET, "--max-steps", "4", "--no-save-checkpoints",
                   "--torch-profile", str(trace), "--profile-start", "2", "--profile-steps", "2",
                   "--data-dir", str(data), "--out-dir", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = trace_summary.summarize_dir(trace)
    assert s["trace"].startswith("rank0_step") and s["device"] == "cpu" and s["steps"] == 2
    assert s["top"] and 0 < s["busy_fraction"] <= 1
    json.dumps(s)  # what the stage's JSON holds
    with pytest.raises(ValueError, match="no torch profiler trace"):
        trace_summary.summarize_dir(tmp_path)


def annotation(name: str, ts: float, dur: float, cat: str, pid: int = 0, tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": {"External id": 1}}


def test_a_cuda_trace_counts_each_step_once_though_the_gpu_rows_repeat_it() -> None:
    """A CUDA trace holds each ProfilerStep# range on the CPU row (user_annotation) and again
    on every GPU stream that ran its kernels (gpu_user_annotation, as torch.profiler writes
    them): two steps on two streams are six ranges, and still two steps. Counting the
    ranges halved every per-step figure of the H100 baseline's traces."""
    events = [annotation("ProfilerStep#11", 0, 500, "user_annotation"),
              annotation("ProfilerStep#12", 500, 500, "user_annotation"),
              annotation("ProfilerStep#11", 10, 480, "gpu_user_annotation", tid=7),
              annotation("ProfilerStep#12", 510, 480, "gpu_user_annotation", tid=7),
              annotation("ProfilerStep#11", 20, 100, "gpu_user_annotation", tid=13),  # a 2nd stream
              annotation("ProfilerStep#12", 520, 100, "gpu_user_annotation", tid=13),
              kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 10, 480),
              kernel("ncclDevKernel_AllGather_RING_LL", 20, 100) | {"tid": 13},
              kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 510, 480),
              kernel("ncclDevKernel_AllGather_RING_LL", 520, 100) | {"tid": 13}]
    s = trace_summary.summarize({"traceEvents": events})
    assert s["steps"] == 2
    assert s["gpu_span_ms_per_step"] == pytest.approx(0.98 / 2)  # 10 .. 990 us over two steps
    assert s["kinds"]["matmul"]["ms_per_step"] == pytest.approx(0.48)


# inductor's kernels of GPT-2 124M's whole-logits loss, as the H100 baseline's trace names them
LOSS_FORWARD = "triton_red_fused__log_softmax_prepare_softmax_online_18"
LOSS_BACKWARD = ("triton_red_fused__log_softmax__log_softmax_backward_data__to_copy_arange_eq_"
                 "expand_nll_loss_backward_nll_loss_forward_scalar_tensor_view_where_0")


def micro_batch_kernels(t0: float, loss: tuple[str, str] = (LOSS_FORWARD, LOSS_BACKWARD)) -> list[dict]:
    """One micro-batch of GPT-2 124M at 64 x 1024 on the H100, as its trace shows it: 133 ms
    of kernels, the loss's forward 4.63 ms and backward 4.82 ms among them."""
    return [kernel("nvjet_sm90_tst_192x192_64x3_2x1_v_bz_coopB_NNN", t0, 118_550),
            kernel("triton_poi_fused_gelu_view_9", t0 + 118_550, 5_000),
            kernel(loss[0], t0 + 123_550, 4_630),
            kernel(loss[1], t0 + 128_180, 4_820)]


def test_micro_batches_are_counted_from_the_loss_kernels_not_the_profiler_steps() -> None:
    """The H100 baseline's 124M trace: two profiler steps of two micro-batches each hold
    five micro-batches' kernels (the GPU was still running the step before the first
    traced one when tracing began). Dividing its span by the steps made a 266 ms step 333
    ms, and the loss's 9.45 ms a micro-batch 11.8; counted by the loss's kernels, a
    micro-batch is 133 ms and a step of two 266 ms."""
    events = [annotation("ProfilerStep#11", 66_500, 266_000, "user_annotation"),
              annotation("ProfilerStep#12", 332_500, 266_000, "user_annotation")]
    for mb in range(5):
        events += micro_batch_kernels(mb * 133_000)
    s = trace_summary.summarize({"traceEvents": events}, per_step=2)
    assert s["steps"] == 2 and s["micro_batches"] == 5 and s["micro_batches_counted_from"] == LOSS_BACKWARD
    assert s["per_step_from"] == "micro-batches" and s["micro_batches_per_step"] == 2
    assert s["gpu_span_ms_per_micro_batch"] == pytest.approx(133.0)
    assert s["gpu_span_ms_per_step"] == pytest.approx(266.0)
    top = {t["name"]: t for t in s["top"]}
    assert top[LOSS_FORWARD]["ms_per_micro_batch"] + top[LOSS_BACKWARD]["ms_per_micro_batch"] \
        == pytest.approx(9.45)
    assert top[LOSS_FORWARD]["calls"] == 5 and top[LOSS_FORWARD]["ms_per_step"] == pytest.approx(9.26)
    assert s["kinds"]["triton"]["ms_per_step"] == pytest.approx(2 * (5.0 + 4.63 + 4.82))
    # without a step's micro-batches: per micro-batch only, no per-step figure guessed
    s = trace_summary.summarize({"traceEvents": events})
    assert s["gpu_span_ms_per_step"] is None and s["per_step_from"] is None
    assert s["gpu_span_ms_per_micro_batch"] == pytest.approx(133.0)
    assert s["kinds"]["matmul"]["ms_per_step"] is None


@pytest.mark.parametrize("loss", [("nll_loss_forward_reduce_cuda_kernel_2d",
                                   "nll_loss_backward_reduce_cuda_kernel_2d"),  # eager
                                  ("_lse_kernel", "_grad_kernel"),  # --loss-kernel fused
                                  ("_loss_grad_kernel", "_rescale_kernel")])  # its forward mode
def test_every_whole_logits_loss_is_counted(loss: tuple[str, str]) -> None:
    events = [k for mb in range(3) for k in micro_batch_kernels(mb * 133_000, loss)]
    events.append(kernel("triton_poi_fused_nll_loss_backward_1", 0, 1))  # once in all: not the count
    s = trace_summary.summarize({"traceEvents": events}, per_step=3)
    assert s["micro_batches"] == 3 and s["gpu_span_ms_per_step"] == pytest.approx(3 * 133.0)


def test_the_command_takes_the_micro_batches_a_step(tmp_path: Path, capsys) -> None:
    trace = tmp_path / "t.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": [k for mb in range(4) for k in micro_batch_kernels(mb * 133_000)]}))
    assert trace_summary.main([str(trace), "--micro-batches-per-step", "4"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["micro_batches"] == 4 and s["gpu_span_ms_per_step"] == pytest.approx(4 * 133.0)
    with pytest.raises(SystemExit):
        trace_summary.main([str(tmp_path / "missing.json")])
    assert "missing.json" in capsys.readouterr().err
