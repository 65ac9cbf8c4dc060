"""--loss-kernel: ours, or Liger Kernel's / Cut Cross-Entropy's on CUDA (gpt/model/loss_kernels.py).

On CPU: the switch's rules (CUDA only, installed, only with the chunked loss), the planner,
and what our wrappers hand a library (a stand-in module with the library's signature
records it and computes the reference loss). Where Liger Kernel and Triton are installed,
its real kernel runs on CPU under Triton's interpreter (without the soft cap, which the
interpreter cannot run). On a GPU (-m cuda): both libraries' kernels against ours, soft
cap on, in bf16, and a compiled trainer run with each.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers import QUIET, REPO, TINY, cuda_run_losses, run_cli, write_random_shards
from gpt.core.cli import parse_args
from gpt.core.config import TrainConfig
from gpt.core.config_io import field_index
from gpt.core.errors import UserError
from gpt.model import loss_kernels
from gpt.plan import memory


def reference(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, cap: float | None) -> torch.Tensor:
    z = (h @ w.t()).float()
    if cap:
        z = cap * torch.tanh(z / cap)
    return F.cross_entropy(z, t)


def test_the_choices_are_the_kernels() -> None:
    assert field_index()["loss_kernel"][1].metadata["choices"] == ("auto", *loss_kernels.KERNELS)
    assert TrainConfig().loss_kernel == "auto" and parse_args([]).train.loss_kernel == "auto"
    assert parse_args(["--loss-kernel", "liger"]).train.loss_kernel == "liger"


def test_a_library_kernel_is_refused_off_cuda_and_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    loss_kernels.check("ours", "cpu")
    loss_kernels.check("auto", "cpu")
    for kernel in ("liger", "cce"):
        with pytest.raises(UserError, match=f"--loss-kernel {kernel} runs Triton kernels on CUDA only"):
            loss_kernels.check(kernel, "cpu")
    for module in ("liger_kernel", "cut_cross_entropy"):  # importing them now fails
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(UserError, match=r"^--loss-kernel liger needs liger-kernel, which is not "
                       r"installed: pip install -e \"\.\[kernels\]\" in the checkout, or pip "
                       r"install liger-kernel$"):
        loss_kernels.check("liger", "cuda")
    with pytest.raises(UserError, match="needs cut-cross-entropy, which is not installed"):
        loss_kernels.check("cce", "cuda")
    # unset, the chunked loss on CUDA is Liger's: without it, one line that says so
    with pytest.raises(UserError, match=r"^--chunked-loss on CUDA \(Liger Kernel's fused linear "
                       r"cross-entropy; or --no-chunked-loss, .*\) needs liger-kernel, which is "
                       r"not installed"):
        loss_kernels.check("auto", "cuda")
    loss_kernels.check("auto", "cuda", chunked=False)  # the whole logits: no kernel needed


def test_ours_is_not_offered_on_cuda() -> None:
    """Measured on an H100 (benchmarks/gpu/2026-11-27-h100): ours 1.45x the whole logits'
    step time, Liger's 1.05x at the same memory; ours stays on the CPU and MPS."""
    with pytest.raises(UserError, match="--loss-kernel ours is not offered on CUDA: it measured "
                       "1.45x the step time of the whole logits there"):
        loss_kernels.check("ours", "cuda")
    loss_kernels.check("ours", "cuda", chunked=False)
    loss_kernels.check("ours", "mps")


def test_a_library_kernel_needs_the_chunked_loss(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--loss-kernel", "cce", "--no-chunked-loss"])
    assert "--loss-kernel cce is a kernel of the chunked loss" in capsys.readouterr().err


@pytest.mark.slow
def test_the_trainer_and_its_dry_run_refuse_it_on_cpu_in_one_line(tmp_path: Path) -> None:
    data = write_random_shards(tmp_path, seed=1, train=(3_000,))
    for extra in ([], ["--dry-run"]):
        proc = run_cli(*TINY, *QUIET, "--max-steps", "1", "--device", "cpu", "--loss-kernel", "liger",
                       "--data-dir", str(data), "--out-dir", str(tmp_path / "run"), *extra)
        assert proc.returncode == 1, proc.stdout[-1000:]
        assert "--loss-kernel liger runs Triton kernels on CUDA only" in proc.stderr + proc.stdout
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_the_planner_plans_a_library_kernel_as_ours() -> None:
    small = ["--model", "tiny", "--block-size", "64", "--seq-len", "64", "--batch-size", "8"]
    ours = memory.plan(parse_args([*small, "--loss-kernel", "ours"]))
    liger = memory.plan(parse_args([*small, "--loss-kernel", "liger"]))
    assert liger.peak_bytes == ours.peak_bytes
    assert any("planned as ours" in a for a in liger.assumptions)
    assert not any("planned as ours" in a for a in ours.assumptions)


def stand_in(monkeypatch: pytest.MonkeyPatch, package: str, module: str, name: str) -> list[dict]:
    """Install a stand-in library module whose loss function records its arguments and
    computes the reference loss."""
    calls: list[dict] = []

    def fn(h, w, t, *, softcap=None, reduction="mean", **kwargs):
        calls.append({"h": h, "w": w, "t": t, "softcap": softcap, "reduction": reduction,
                      "autocast": torch.is_autocast_enabled("cpu"),
                      "compiling": torch.compiler.is_compiling(), **kwargs})
        return reference(h, w, t, softcap)

    mod = types.ModuleType(module)
    setattr(mod, name, fn)
    monkeypatch.setitem(sys.modules, package, types.ModuleType(package))
    monkeypatch.setitem(sys.modules, module, mod)
    return calls


@pytest.mark.parametrize("kernel, package, module, name", [
    ("liger", "liger_kernel", "liger_kernel.transformers.functional", "liger_fused_linear_cross_entropy"),
    ("cce", "cut_cross_entropy", "cut_cross_entropy", "linear_cross_entropy")])
@pytest.mark.numerics
def test_a_library_gets_what_autocast_linear_would(monkeypatch: pytest.MonkeyPatch, kernel: str,
                                                  package: str, module: str, name: str) -> None:
    calls = stand_in(monkeypatch, package, module, name)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 6, 16, generator=g, requires_grad=True)
    w = torch.randn(40, 16, generator=g, requires_grad=True)
    t = torch.randint(0, 40, (2, 7), generator=g)[:, 1:]  # not contiguous
    fn = loss_kernels.loss_fn(kernel)
    loss = fn(h, w, t, 0.0)
    assert calls[-1]["softcap"] is None and calls[-1]["reduction"] == "mean"
    assert calls[-1]["h"].shape == (12, 16) and calls[-1]["h"].is_contiguous()
    assert calls[-1]["h"].dtype == calls[-1]["w"].dtype == torch.float32
    assert torch.equal(calls[-1]["t"], t.reshape(-1))
    loss.backward()
    ref_h, ref_w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    reference(ref_h.reshape(-1, 16), ref_w, t.reshape(-1), None).backward()
    assert torch.allclose(loss, reference(h.detach().reshape(-1, 16), w.detach(), t.reshape(-1), None))
    assert torch.allclose(h.grad, ref_h.grad) and torch.allclose(w.grad, ref_w.grad)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = fn(h, w, t, 15.0)
    got = calls[-1]
    assert got["h"].dtype == got["w"].dtype == torch.bfloat16 and not got["autocast"]
    assert got["softcap"] == 15.0 and loss.dtype == torch.float32
    if kernel == "liger":
        assert got["accum_dtype"] is torch.float32  # the head weight's gradient summed in fp32
    else:
        assert got["filter_eps"] is None  # every gradient entry computed: no filter
    w.grad = None
    loss.backward()
    assert w.grad is not None and w.grad.dtype == torch.float32


@pytest.mark.numerics
def test_the_model_calls_the_kernel_the_trainer_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpt.core.config import model_preset
    from gpt.engine import parallel
    from gpt.model.transformer import GPT
    from gpt.runtime.world import Runtime

    calls = stand_in(monkeypatch, "cut_cross_entropy", "cut_cross_entropy", "linear_cross_entropy")
    torch.manual_seed(0)
    model = GPT(model_preset("tiny", block_size=16))
    parallel.parallelize(model, TrainConfig(loss_kernel="cce", compile=False), parse_args([]).optim,
                         Runtime(device=torch.device("cpu")))
    x = torch.randint(0, 50257, (2, 16))
    _, loss = model(x, x)
    assert len(calls) == 1
    model.loss_kernel = "ours"
    _, ours = model(x, x)
    assert len(calls) == 1 and torch.allclose(loss, ours, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.numerics
def test_a_library_kernel_runs_eagerly_inside_a_compiled_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamo does not trace into the library (its Triton launches): the rest of the model
    compiles, the loss and gradients are the eager ones."""
    from gpt.core.config import model_preset
    from gpt.model.transformer import GPT

    calls = stand_in(monkeypatch, "liger_kernel", "liger_kernel.transformers.functional",
                     "liger_fused_linear_cross_entropy")
    torch.manual_seed(0)
    model = GPT(model_preset("tiny", block_size=32, vocab_size=512, logit_softcap=15.0))
    model.chunked_loss, model.loss_kernel = True, "liger"
    x, y = torch.randint(0, 512, (2, 32)), torch.randint(0, 512, (2, 32))
    _, eager = model(x, y)
    eager.backward()
    expected = model.lm_head.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    _, loss = torch.compile(model, backend="aot_eager", dynamic=False)(x, y)
    loss.backward()
    assert len(calls) == 2 and calls[-1]["softcap"] == 15.0
    assert not calls[-1]["compiling"]  # called eagerly: not traced into the graph
    assert torch.allclose(loss, eager) and torch.allclose(model.lm_head.weight.grad, expected)


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None
                    or importlib.util.find_spec("triton") is None,
                    reason="Liger Kernel and Triton are not installed (pip install liger-kernel)")
def test_liger_under_tritons_interpreter_equals_ours() -> None:
    """Liger's real kernels, run on CPU by Triton's interpreter (set before triton is
    imported, hence a process of its own), through our wrapper, in fp32 and under bf16
    autocast (measured here: 1.4e-7 and 5.0e-3 relative on the head weight's gradient)."""
    code = """
import torch
from gpt.model import loss_kernels
from gpt.model.chunked_ce import linear_cross_entropy
g = torch.Generator().manual_seed(0)
h = torch.randn(48, 32, generator=g); w = torch.randn(500, 32, generator=g) * 0.3
t = torch.randint(0, 500, (48,), generator=g)
for dtype, bound in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
    out = []
    for fn in (loss_kernels.liger, linear_cross_entropy):
        a, b = h.clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss = fn(a, b, t, 0.0)
        (loss * 2).backward()
        out.append((loss, a.grad, b.grad))
    for x, y in zip(*out):
        assert ((x - y).norm() / y.norm()).item() < bound, (dtype, ((x - y).norm() / y.norm()).item())
print("equal")
"""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "equal" in proc.stdout, proc.stderr[-2000:]


# ---- on a GPU


def skip_without(kernel: str) -> None:
    """Skip, with the trainer's own one line, where the library kernel cannot run: its
    package (each of the modules it imports, loss_kernels.PACKAGES) missing or broken."""
    try:
        loss_kernels.check(kernel, "cuda")
    except UserError as e:
        pytest.skip(str(e))


def test_a_missing_library_skips_its_cuda_tests_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the GPU tests below do first: with the package missing, a skip naming it (not
    an error: the GPU machines' image has neither library)."""
    for module in ("liger_kernel", "cut_cross_entropy"):
        monkeypatch.setitem(sys.modules, module, None)  # importing it now fails
    for kernel, package in (("liger", "liger-kernel"), ("cce", "cut-cross-entropy")):
        with pytest.raises(pytest.skip.Exception, match=f"--loss-kernel {kernel} needs {package}, "
                           "which is not installed"):
            skip_without(kernel)


@pytest.mark.cuda
@pytest.mark.parametrize("kernel", ["liger", "cce"])
def test_a_library_kernel_on_cuda_equals_ours(kernel: str) -> None:
    skip_without(kernel)
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(4, 1024, 768, device="cuda", generator=g)
    w = torch.randn(50304, 768, device="cuda", generator=g) * 0.02
    t = torch.randint(0, 50257, (4, 1024), device="cuda", generator=g)
    out = {}
    for name in ("ours", kernel):
        a, b = h.clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_kernels.loss_fn(name)(a, b, t, 15.0)
        (loss * 3).backward()
        out[name] = (loss.double(), a.grad.double(), b.grad.double())
    for label, x, y in zip(("loss", "grad h", "grad weight"), out[kernel], out["ours"]):
        # both bf16 matmuls with fp32 accumulation: they differ by bf16's rounding at most
        assert ((x - y).norm() / y.norm()).item() < 2e-2, (label, ((x - y).norm() / y.norm()).item())


@pytest.mark.numerics
@pytest.mark.cuda
@pytest.mark.parametrize("kernel", ["liger", "cce"])
def test_a_compiled_trainer_run_with_a_library_kernel_logs_the_whole_logits_losses(kernel: str, tmp_path: Path) -> None:
    skip_without(kernel)
    runs = cuda_run_losses(tmp_path, {"whole": ["--no-chunked-loss"],
                                      kernel: ["--loss-kernel", kernel]}, 512)
    assert runs[kernel][0] == pytest.approx(runs["whole"][0], rel=2e-2)
