"""The CUDA path: run with `python -m pytest -m cuda` on a machine with an NVIDIA GPU.

Without CUDA every test here is skipped with the reason (tests/conftest.py). They check
what the README claims of the GPU path: bf16 autocast and the fp16 GradScaler, the
trainer's CUDA defaults (TF32, torch.compile, fused AdamW, a fused SDPA kernel), the
pinned loader, a compiled training run and its resume after SIGTERM, every --parallel
mode under torchrun over NCCL, activation checkpointing's memory saving, KV-cache
sampling, HellaSwag under compile, and MFU against the device's peak.
"""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import (QUIET, kill_tree, read_metrics, run_cli, run_torchrun, start_trainer, wait_for,
                     write_random_shards)
from gpt.core.cli import parse_args
from gpt.core.config import OptimConfig, model_preset
from gpt.data.loader import ShardLoader
from gpt.data.shards import write_shard
from gpt.engine.parallel import apply_activation_checkpointing
from gpt.engine.step import forward_backward, optimizer_step
from gpt.eval import hellaswag
from gpt.eval.sampling import sample
from gpt.model.transformer import GPT
from gpt.optim.optimizer import build_optimizer
from gpt.plan.preflight import preflight
from gpt.report.flops import peak_tflops
from gpt.runtime.world import init_runtime
from gpt.train.build import build_run

pytestmark = pytest.mark.cuda

# A 2-layer model on 64-token sequences, on the GPU, with the trainer's CUDA defaults
# (bf16, TF32, compile and fused AdamW are what --device cuda gets unless told otherwise).
GPU_TINY = ["--model", "tiny", "--block-size", "64", "--seq-len", "64", "--batch-size", "8",
            "--total-batch-tokens", "512", "--warmup-steps", "2", "--max-lr", "3e-3",
            "--device", "cuda"]
PERIOD = 97  # the patterned data repeats every PERIOD tokens: a model learns it quickly


@pytest.fixture(scope="module")
def patterned_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shards of a repeating random sequence, so the loss clearly falls within a few steps."""
    out = tmp_path_factory.mktemp("patterned")
    base = np.random.default_rng(0).integers(0, 50257, PERIOD)
    write_shard(out / "train_000000.bin", np.tile(base, 2000))
    write_shard(out / "val_000000.bin", np.tile(base, 200))
    return out


def tiny_gpu_model(**overrides: object) -> GPT:
    torch.manual_seed(0)
    return GPT(model_preset("tiny", block_size=64, **overrides)).cuda()


# ---------------------------------------------------------------------------------------
# precision


def test_bf16_autocast_dtypes() -> None:
    model = tiny_gpu_model()
    x = torch.randint(0, 50257, (2, 64), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits, _ = model(x)
        _, loss = model(x, x)
    assert logits.dtype == torch.bfloat16
    assert loss.dtype == torch.float32  # cross_entropy runs in fp32 under autocast
    loss.backward()
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


def test_fp16_grad_scaler_takes_a_step() -> None:
    model = tiny_gpu_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt, fused = build_optimizer(model, OptimConfig(), torch.device("cuda"))
    scaler = torch.amp.GradScaler("cuda", enabled=True)
    x = torch.randint(0, 50257, (2, 65), device="cuda")

    class Batch:
        def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
            return x[:, :-1], x[:, 1:]

    loss, norm = forward_backward(model, scaler, opt, Batch(), 2, 1.0, "cuda", torch.float16)
    optimizer_step(opt, scaler, 1e-3, norm)
    assert fused and torch.isfinite(loss) and torch.isfinite(norm)
    assert scaler.get_scale() > 0
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())


# ---------------------------------------------------------------------------------------
# the trainer's CUDA defaults


def test_trainer_cuda_defaults_use_tf32_compile_and_fused_adamw(patterned_dir: Path,
                                                                tmp_path: Path) -> None:
    cfg = parse_args([*GPU_TINY, *QUIET, "--data-dir", str(patterned_dir),
                      "--out-dir", str(tmp_path / "run")])
    run = build_run(preflight(cfg).settled(), init_runtime("cuda"))
    assert run.autocast_dtype == torch.bfloat16
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert run.par.compiled and hasattr(run.par.train_model, "_orig_mod")  # torch.compile
    assert run.par.fused and run.par.optimizer.defaults["fused"] is True


def test_a_fused_sdpa_kernel_runs_at_1024_and_matches_math() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 12, 1024, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                      SDPBackend.EFFICIENT_ATTENTION]):
        fused = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # and the model's own attention at T=1024 finds a fused kernel too
        model = GPT(model_preset("mini", block_size=1024)).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            model(torch.randint(0, 50257, (2, 1024), device="cuda"))
    with sdpa_kernel([SDPBackend.MATH]):
        reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(fused.float(), reference, atol=2e-2, rtol=2e-2)


# ---------------------------------------------------------------------------------------
# the loader


def test_pinned_double_buffered_loader_gives_the_cpu_batches(tmp_path: Path) -> None:
    data = write_random_shards(tmp_path, seed=3, train=(5_000, 3_000))
    gpu = ShardLoader(data, "train", 4, 32, device="cuda")
    cpu = ShardLoader(data, "train", 4, 32, device="cpu")
    batches = [gpu.next_batch() for _ in range(3 * gpu.steps_per_pass // 2)]  # past a pass
    for x, y in batches:  # compared only after all were queued: no buffer was reused early
        cx, cy = cpu.next_batch()
        assert x.is_cuda and y.is_cuda
        assert torch.equal(x.cpu(), cx) and torch.equal(y.cpu(), cy)


# ---------------------------------------------------------------------------------------
# training through train_gpt2.py


def test_compiled_training_run_learns(patterned_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli(*GPU_TINY, *QUIET, "--compile", "--max-steps", "30",
                   "--data-dir", str(patterned_dir), "--out-dir", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [r["loss"] for r in read_metrics(out, "train")]
    assert len(losses) == 30 and all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 2.0, losses  # from ~10.9 on the pattern


def test_resume_after_sigterm_continues_the_curve(patterned_dir: Path, tmp_path: Path) -> None:
    """The loss of every resumed step matches the uninterrupted run: the first one closely
    (same weights, same batch; only the order of GPU reductions may differ), the later ones
    within 2e-2 (bf16 with nondeterministic reductions in backward drifts a little). The
    run is long (a GPU takes a tiny step in milliseconds, so a short one would end before
    the signal lands); where it stopped decides how far both runs go."""
    args = [*GPU_TINY, *QUIET, "--max-steps", "100000", "--data-dir", str(patterned_dir)]
    out = tmp_path / "split"
    proc = start_trainer(*args, "--out-dir", str(out))
    try:
        wait_for(lambda: (out / "metrics.jsonl").exists() and len(read_metrics(out, "train")) >= 4,
                 timeout=300, proc=proc)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        kill_tree(proc)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    stopped = len(read_metrics(out, "train"))
    assert 4 <= stopped < 100000
    end = ["--stop-at-step", str(stopped + 8)]
    whole = tmp_path / "whole"
    assert run_cli(*args, *end, "--out-dir", str(whole), timeout=600).returncode == 0
    proc = run_cli(*args, *end, "--out-dir", str(out), "--resume", "auto", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"at step {stopped}" in proc.stdout
    straight = {r["step"]: r["loss"] for r in read_metrics(whole, "train")}
    resumed = {r["step"]: r["loss"] for r in read_metrics(out, "train")}
    assert sorted(resumed) == list(range(stopped + 8))
    assert resumed[stopped] == pytest.approx(straight[stopped], rel=1e-4)
    for step in range(stopped, stopped + 8):
        assert abs(resumed[step] - straight[step]) < 2e-2, (step, resumed[step], straight[step])


def test_validation_under_cuda_graphs(patterned_dir: Path, tmp_path: Path) -> None:
    """--compile-mode reduce-overhead: every shipped recipe validates, and a CUDA graph's
    outputs are overwritten at its next replay; the validation loss must come out of every
    call intact, and equal the eager model's on the same weights."""
    out = tmp_path / "run"
    proc = run_cli(*GPU_TINY, "--sample-every", "0", "--compile", "--compile-mode", "reduce-overhead",
                   "--max-steps", "6", "--val-every", "3", "--val-steps", "4",
                   "--data-dir", str(patterned_dir), "--out-dir", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    vals = read_metrics(out, "val")
    assert [r["step"] for r in vals] == [0, 3, 6] and all(np.isfinite([r["val_loss"] for r in vals]))
    eager = run_cli(*GPU_TINY, "--sample-every", "0", "--no-compile", "--max-steps", "6",
                    "--val-every", "3", "--val-steps", "4", "--data-dir", str(patterned_dir),
                    "--out-dir", str(tmp_path / "eager"), timeout=600)
    assert eager.returncode == 0, eager.stderr[-3000:]
    assert vals[0]["val_loss"] == pytest.approx(read_metrics(tmp_path / "eager", "val")[0]["val_loss"],
                                                rel=1e-2)  # the same initial weights


def test_a_training_step_never_waits_for_the_gpu() -> None:
    """Forward, backward, clipping and the fused AdamW update, skipped on the device when
    the gradient is not finite: no host sync anywhere (CUDA raises on one)."""
    model = tiny_gpu_model()
    opt, fused = build_optimizer(model, OptimConfig(), torch.device("cuda"))
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    x = torch.randint(0, 50257, (2, 65), device="cuda")

    class Batch:
        def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
            return x[:, :-1], x[:, 1:]

    for bad in (False, True, False):  # warm: the first step allocates the AdamW state
        torch.cuda.set_sync_debug_mode("error")
        try:
            loss, norm = forward_backward(model, scaler, opt, Batch(), 2, 1.0, "cuda",
                                          torch.bfloat16)
            skipped = optimizer_step(opt, scaler, 1e-3, norm * float("nan") if bad else norm)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert fused and skipped.item() == float(bad)


def test_a_meta_model_initialised_on_the_gpu_equals_the_cpu_build() -> None:
    from gpt.core.config import TrainConfig
    from gpt.engine.parallel import parallelize
    from gpt.runtime.world import Runtime

    cfg = model_preset("mini", block_size=64)
    torch.manual_seed(7)
    cpu = GPT(cfg).state_dict()
    torch.manual_seed(7)
    with torch.device("meta"):
        model = GPT(cfg)
    parallelize(model, TrainConfig(compile=False), OptimConfig(), Runtime(torch.device("cuda", 0)))
    for name, value in model.state_dict().items():
        assert value.is_cuda and torch.equal(value.cpu(), cpu[name]), name


def test_metrics_report_mfu_against_the_device_peak(patterned_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli(*GPU_TINY, *QUIET, "--no-compile", "--max-steps", "3",
                   "--data-dir", str(patterned_dir), "--out-dir", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    header = read_metrics(out, "run")[0]
    name = torch.cuda.get_device_name()
    assert header["device_name"] == name
    assert header["peak_tflops"] == peak_tflops(name)
    if any(k in name for k in ("H100", "H200")) and not any(k in name for k in ("PCIe", "NVL")):
        assert header["peak_tflops"] == 989.0  # the SXM parts' bf16 dense peak
    train = read_metrics(out, "train")
    if header["peak_tflops"] is None:
        pytest.skip(f"{name}: no bf16 peak in the table, so no MFU to check")
    assert all(r["mfu"] is not None and 0 < r["mfu"] < 1 for r in train)
    assert all(r["peak_mem_gb"] > 0 for r in train)


# ---------------------------------------------------------------------------------------
# torchrun, one process: every --parallel mode over NCCL


@pytest.mark.parametrize("flags", [
    ["--parallel", "ddp", "--no-compile"],
    ["--parallel", "zero1", "--no-compile"],
    ["--parallel", "fsdp", "--compile"],
    ["--parallel", "ddp", "--no-compile", "--activation-checkpointing"],
    ["--parallel", "fsdp", "--no-compile", "--activation-checkpointing"],
    ["--parallel", "fsdp", "--no-compile", "--dtype", "fp16"],
    ["--parallel", "fsdp", "--compile", "--fsdp-param-dtype", "bf16"],
], ids=["ddp", "zero1", "fsdp-compile", "ddp-ac", "fsdp-ac", "fsdp-fp16", "fsdp-bf16-params"])
def test_torchrun_nccl_modes_take_steps(flags: list[str], patterned_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_torchrun(*GPU_TINY, *QUIET, *flags, "--max-steps", "4",
                        "--data-dir", str(patterned_dir), "--out-dir", str(out),
                        nproc=1, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"parallel {flags[1]}" in proc.stdout
    losses = [r["loss"] for r in read_metrics(out, "train")]
    assert len(losses) == 4 and all(np.isfinite(losses))
    assert (out / "ckpt_000004.pt").is_file()


def test_activation_checkpointing_keeps_a_fraction_of_the_block_activations() -> None:
    """GPT-2 124M's 12 blocks at B=8, T=1024, bf16: the memory their forward leaves held for
    the backward pass. Checkpointing keeps each block's input alone (plus the output),
    against a dozen intermediates per block. (The head and the loss, which checkpointing
    does not touch and which dominate a whole-model peak, are left out.)"""

    def held(ac: bool) -> int:
        torch.manual_seed(0)
        model = GPT(model_preset("gpt2")).cuda()
        if ac:
            apply_activation_checkpointing(model)
        x = torch.randn(8, 1024, 768, device="cuda", requires_grad=True)  # block 0's input
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = x
            for block in model.transformer.h:
                h = block(h)
        used = torch.cuda.memory_allocated() - before
        h.float().sum().backward()
        del model, h, x
        torch.cuda.empty_cache()
        return used

    plain, checkpointed = held(False), held(True)
    print(f"block activations held, B=8 T=1024 gpt2: {plain / 2**30:.2f} GiB plain, "
          f"{checkpointed / 2**30:.2f} GiB with activation checkpointing")
    assert checkpointed < 0.25 * plain


# ---------------------------------------------------------------------------------------
# generation and HellaSwag


def test_kv_cache_generation_equals_full_recompute() -> None:
    # plain fp32 (conftest's restore_global_flags puts it back): both paths must agree
    # exactly. Not monkeypatch.setattr: torch's cuBLAS settings object answers through
    # __getattr__, so pytest 9 records the setting as absent and its undo fails to delete it
    torch.backends.cuda.matmul.allow_tf32 = False
    model = tiny_gpu_model()
    prompt = [5, 17, 300, 42]
    cached = sample(model, prompt, 40, temperature=0, use_cache=True)
    full = sample(model, prompt, 40, temperature=0, use_cache=False)
    assert cached.is_cuda and torch.equal(cached, full)


def test_hellaswag_under_compile_equals_eager() -> None:
    model = GPT(model_preset("mini", block_size=128)).cuda()
    rng = np.random.default_rng(0)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(rng.integers(0, 50257, n).tolist())

    examples = [hellaswag.Example(context=ids(20 + i),
                                  endings=tuple(ids(3 + (i + j) % 5) for j in range(4)), label=i % 4)
                for i in range(24)]
    eager = hellaswag.evaluate(model, examples, torch.device("cuda"), torch.float32, 0, 1,
                               batch_examples=4)
    compiled = hellaswag.evaluate(torch.compile(model), examples, torch.device("cuda"),
                                  torch.float32, 0, 1, batch_examples=4)
    assert compiled == eager
