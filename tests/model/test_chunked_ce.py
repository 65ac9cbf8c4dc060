"""The chunked head + cross-entropy (gpt/model/chunked_ce.py): the unfused path's loss and
gradients (fp32 to rounding, bf16 and fp16 as close to the exact values as the unfused
path is), never the whole logits, torch.compile without a graph break, and the switch
(--chunked-loss / --no-chunked-loss, [train] chunked_loss) from the command line to the
model and the memory planner."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers import QUIET, TINY, highest_rise, read_metrics, run_cli, write_random_shards

from gpt.core.cli import parse_args
from gpt.core.config import TrainConfig, model_preset
from gpt.engine import parallel
from gpt.model.chunked_ce import chunk_rows, linear_cross_entropy
from gpt.model.transformer import GPT
from gpt.plan import memory
from gpt.runtime.world import Runtime

FP32_REL = 1e-6  # |chunked - unfused| / |unfused| over each whole tensor, in fp32


def unfused(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, cap: float) -> torch.Tensor:
    z = F.linear(h, w)
    if cap:
        z = cap * torch.tanh(z.float() / cap)
    return F.cross_entropy(z.reshape(-1, z.size(-1)), t.reshape(-1))


def loss_and_grads(fn, h, w, t, dtype=None, scale=3.0):
    h, w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = fn(h, w, t)
    (loss * scale).backward()  # an incoming gradient that is not 1, as accumulation's
    return loss.detach().double(), h.grad.double(), w.grad.double()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def inputs(seed: int = 0, rows: int = 96, vocab: int = 1000, width: int = 48):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(3, rows // 3, width, generator=g)
    w = torch.randn(vocab, width, generator=g) * 0.2
    t = torch.randint(0, vocab, (3, rows // 3 + 1), generator=g)[:, 1:]  # not contiguous
    return h, w, t


@pytest.mark.numerics
@pytest.mark.parametrize("cap", [0.0, 15.0, 1.0])  # 1.0: most logits deep in tanh's tails
@pytest.mark.parametrize("rows", [7, 32, None])  # chunks that do not divide, divide, one
def test_fp32_loss_and_gradients_equal_the_unfused_path(cap: float, rows: int | None) -> None:
    h, w, t = inputs()
    ref = loss_and_grads(lambda *a: unfused(*a, cap), h, w, t)
    got = loss_and_grads(lambda *a: linear_cross_entropy(*a, cap, rows=rows), h, w, t)
    for name, a, b in zip(("loss", "grad h", "grad weight"), got, ref):
        assert rel(a, b) <= FP32_REL, (name, rel(a, b))


@pytest.mark.numerics
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cap", [0.0, 15.0])
def test_low_precision_is_as_close_to_the_exact_values_as_the_unfused_path(dtype, cap) -> None:
    """Under autocast both paths round the matmuls' inputs and outputs: the chunked one
    rounds the gradient matmuls' products per chunk (2^-8 relative in bf16), the unfused
    one scales first. Against fp64, its error is at most 1.5x the unfused path's. fp16
    with GradScaler's 2^16 loss scale: nothing underflows (the chunks' gradients are cast
    to fp16 before the 1/N of the mean is applied)."""
    h, w, t = inputs(rows=192)
    exact = loss_and_grads(lambda *a: unfused(*a, cap), h.double(), w.double(), t)
    scale = 2.0**16 if dtype is torch.float16 else 3.0
    ref = loss_and_grads(lambda *a: unfused(*a, cap), h, w, t, dtype, scale)
    got = loss_and_grads(lambda *a: linear_cross_entropy(*a, cap, rows=40), h, w, t, dtype, scale)
    exact = (exact[0], exact[1] * scale / 3, exact[2] * scale / 3)
    for name, a, b, x in zip(("loss", "grad h", "grad weight"), got, ref, exact):
        assert torch.isfinite(a).all(), name
        assert rel(a, x) <= 1.5 * rel(b, x) + 1e-6, (name, rel(a, x), rel(b, x))
        assert rel(a, b) < 2e-2, (name, rel(a, b))


@pytest.mark.numerics
@pytest.mark.parametrize("parts", [{}, {"untied_head": True, "logit_softcap": 15.0}])
def test_the_model_trains_the_same_with_and_without_it(parts) -> None:
    """GPT.loss either way, tied and untied heads: the same loss and gradient of every
    parameter (the tied embedding gets the head's gradient added to its own)."""
    cfg = model_preset("tiny", block_size=32, vocab_size=512, **parts)
    torch.manual_seed(0)
    model = GPT(cfg)
    x, y = torch.randint(0, 512, (4, 32)), torch.randint(0, 512, (4, 32))
    results = []
    for chunked in (False, True):
        model.zero_grad(set_to_none=True)
        model.chunked_loss = chunked
        _, loss = model(x, y)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (plain, plain_grads), (chunked, chunked_grads) = results
    assert rel(chunked.double(), plain.double()) <= FP32_REL
    for name, g in plain_grads.items():
        assert rel(chunked_grads[name], g) <= 2 * FP32_REL, name


@pytest.mark.numerics
def test_a_chunk_of_the_logits_at_a_time_and_none_without_gradients() -> None:
    """The most the chunked path holds at once is about a chunk's logits (and the two
    gradients it returns), where the unfused path holds all of them, twice; without
    gradients (validation) it keeps no gradient buffers, and its loss is the same."""
    n, vocab, width, rows = 512, 8192, 32, 32
    h, w, t = inputs(rows=n, vocab=vocab, width=width)
    h, w = h.requires_grad_(), w.requires_grad_()
    logits_bytes = n * vocab * 4

    def step(fn):
        def run():
            fn().backward()
        run()  # warm: the first call's one-off allocations are not the step's
        return highest_rise(run)

    plain = step(lambda: unfused(h, w, t, 0.0))
    chunked = step(lambda: linear_cross_entropy(h, w, t, rows=rows))
    grads = (n * width + vocab * width) * 4 * 2  # gradients held in the function and returned
    assert plain > 2 * logits_bytes
    assert chunked <= grads + 3 * rows * vocab * 4
    assert chunked < logits_bytes / 2
    with torch.no_grad():
        loss = linear_cross_entropy(h, w, t, rows=rows)
        rise = highest_rise(lambda: linear_cross_entropy(h, w, t, rows=rows))
        assert torch.allclose(loss, unfused(h, w, t, 0.0), rtol=FP32_REL, atol=0)
    assert rise <= 2 * rows * vocab * 4


def test_chunk_rows_keep_a_chunk_near_the_hidden_states_and_above_the_floor() -> None:
    # GPT-2 124M at B=64, T=1024: about 1,000 rows (a chunk's logits ~ the hidden states)
    rows = chunk_rows(64 * 1024, 768, 50304)
    assert abs(rows * 50304 / (64 * 1024 * 768) - 1) < 0.02
    chunks = -(-64 * 1024 // rows)
    assert 64 * 1024 - (chunks - 1) * rows >= rows - chunks  # equal chunks, bar rounding
    # a small model: the floor's 667 rows, as 7 equal chunks (not 6 of 667 and one of 94)
    assert chunk_rows(4096, 64, 50304) == 586
    assert chunk_rows(1024, 64, 50304) == 512  # two equal chunks, not 667 + 357 rows
    assert chunk_rows(10, 64, 50304) == 10  # never more rows than there are


@pytest.mark.slow
@pytest.mark.numerics
def test_compiles_as_one_graph_with_the_eager_loss_and_gradients() -> None:
    torch.manual_seed(0)
    model = GPT(model_preset("tiny", block_size=32, vocab_size=512, logit_softcap=15.0))
    model.chunked_loss = True
    x, y = torch.randint(0, 512, (2, 32)), torch.randint(0, 512, (2, 32))
    _, eager = model(x, y)
    eager.backward()
    expected = model.lm_head.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=False)
    _, loss = compiled(x, y)  # fullgraph: a graph break would raise
    loss.backward()
    assert torch.allclose(loss, eager) and torch.allclose(model.lm_head.weight.grad, expected)


def test_compiled_the_chunk_loop_is_one_op_inductor_cannot_reorder() -> None:
    # Unrolled into the graph, inductor reordered the chunks and held about all their
    # gradients at once on CUDA (5.7 GiB over the plan at GPT-2 124M, micro-batch 64)
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(gm: torch.fx.GraphModule, _: object):
        graphs.append(gm)
        return make_boxed_func(gm.forward)  # AOTAutograd calls it with a list of its inputs

    h, w, t = inputs(seed=4)
    expected = loss_and_grads(lambda *a: linear_cross_entropy(*a, rows=7), h, w, t)
    fn = torch.compile(lambda *a: linear_cross_entropy(*a, rows=7), fullgraph=True,
                       backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))
    got = loss_and_grads(fn, h, w, t)
    ops = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert sum("linear_cross_entropy_chunks" in op for op in ops) == 1, ops
    assert not [op for op in ops if "mm" in op], ops  # 14 chunks' matmuls, none in the graph
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


def test_unset_it_is_on_but_on_cuda_where_auto_is_liger() -> None:
    from gpt.model import loss_kernels

    assert TrainConfig().chunked_loss_on("cpu") and TrainConfig().chunked_loss_on("mps")
    assert not TrainConfig().chunked_loss_on("cuda")  # the whole logits measured fastest there
    assert not TrainConfig(compile=False).chunked_loss_on("cuda")
    assert TrainConfig(compile=True).chunked_loss_on("cpu")
    for kernel in ("ours", "liger", "cce"):  # naming a kernel asks for the chunked loss
        assert TrainConfig(loss_kernel=kernel).chunked_loss_on("cuda")
    assert TrainConfig(chunked_loss=True).chunked_loss_on("cuda")
    assert not TrainConfig(chunked_loss=False).chunked_loss_on("cpu")
    assert loss_kernels.resolve("auto", "cuda") == "liger"  # ours is not offered on CUDA
    assert loss_kernels.resolve("auto", "cpu") == loss_kernels.resolve("auto", "mps") == "ours"
    assert loss_kernels.resolve("cce", "cuda") == "cce"


@pytest.mark.slow
def test_a_compiled_cuda_plan_holds_the_whole_logits_once() -> None:
    small = ["--model", "tiny", "--block-size", "64", "--seq-len", "64", "--batch-size", "32"]
    cfg = parse_args(small)
    default, chunked, eager_whole = (
        memory.plan(parse_args([*small, *flags]), device_type="cuda")
        for flags in ([], ["--chunked-loss"], ["--no-chunked-loss", "--no-compile"]))
    assert (default.setup["chunked_loss"], chunked.setup["chunked_loss"]) == (False, True)
    logits = 32 * 64 * cfg.model.vocab_size * 2  # bf16, once
    assert default.peak_bytes - chunked.peak_bytes == logits
    assert default.logits_and_loss_bytes - chunked.logits_and_loss_bytes == logits
    assert default.peak_bytes < eager_whole.peak_bytes  # inductor's fused loss: no fp32 copies
    assert any("inductor's fused cross-entropy" in a for a in default.assumptions)


@pytest.mark.slow
def test_the_switch_reaches_the_model_and_the_planner(tmp_path: Path) -> None:
    assert parse_args([]).train.chunked_loss is TrainConfig().chunked_loss is None  # by device
    assert parse_args(["--chunked-loss"]).train.chunked_loss is True
    assert parse_args(["--no-chunked-loss"]).train.chunked_loss is False
    toml = tmp_path / "r.toml"
    toml.write_text("[train]\nchunked_loss = false\n")
    assert not parse_args(["--config", str(toml)]).train.chunked_loss
    assert GPT(model_preset("tiny", block_size=32)).chunked_loss is False  # a bare model: F.cross_entropy
    for on in (True, False):
        model = GPT(model_preset("tiny", block_size=32))
        parallel.parallelize(model, TrainConfig(chunked_loss=on, compile=False), parse_args([]).optim,
                             Runtime(device=torch.device("cpu")))
        assert model.chunked_loss is on
    small = ["--model", "tiny", "--block-size", "64", "--seq-len", "64", "--batch-size", "32"]
    on, off = (memory.plan(parse_args([*small, *flag]), device_type="cpu")
               for flag in ([], ["--no-chunked-loss"]))
    assert on.peak_bytes < off.peak_bytes / 2
    assert on.logits_and_loss_bytes < off.logits_and_loss_bytes / 3


@pytest.mark.numerics
@pytest.mark.slow
def test_the_trainer_logs_the_same_losses_either_way(tmp_path: Path) -> None:
    data = write_random_shards(tmp_path, seed=3, train=(5_000,))
    runs = {}
    for name, flag in (("on", "--chunked-loss"), ("off", "--no-chunked-loss")):
        proc = run_cli(*TINY, *QUIET, "--max-steps", "3", "--no-save-checkpoints", flag,
                       "--data-dir", str(data), "--out-dir", str(tmp_path / "runs" / name))
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[name] = read_metrics(tmp_path / "runs" / name, "train")
        # which loss ran: the start line, the metrics log's header, the dry run
        said = "loss chunked (ours)" if name == "on" else "loss whole logits"
        assert said in proc.stdout
        [header] = read_metrics(tmp_path / "runs" / name, "run")
        assert (header["chunked_loss"], header["loss_kernel"]) == (
            (True, "ours") if name == "on" else (False, None))
        dry = run_cli(*TINY, "--dry-run", flag, "--data-dir", str(data),
                      "--out-dir", str(tmp_path / "runs" / name))
        assert dry.returncode == 0 and said in dry.stdout, dry.stdout[-2000:]
    on, off = runs["on"], runs["off"]
    assert [r["loss"] for r in on] == pytest.approx([r["loss"] for r in off], rel=1e-5)
    assert [r["grad_norm"] for r in on] == pytest.approx([r["grad_norm"] for r in off], rel=1e-4)


@pytest.mark.cuda
def test_compiled_on_cuda_it_holds_a_chunk_not_every_chunks_gradient() -> None:
    # The GPU acceptance's first run (its loss kernels' stage): traced into inductor's graph, the chunked
    # loss at 124M, micro-batch 64 peaked 5.7 GiB above its plan, as high as the whole logits
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(16 * 1024, 768, device="cuda", generator=g).requires_grad_()
    w = (torch.randn(50304, 768, device="cuda", generator=g) * 0.02).requires_grad_()
    t = torch.randint(0, 50257, (16 * 1024,), device="cuda", generator=g)

    def step(h, w, t):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return linear_cross_entropy(h, w, t)

    peaks = {}
    for name, fn in (("eager", step), ("compiled", torch.compile(step, dynamic=False))):
        fn(h, w, t).backward()  # compiles; the second call is measured
        h.grad = w.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn(h, w, t).backward()
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated() - base
        h.grad = w.grad = None
    whole_bf16_logits = 16 * 1024 * 50304 * 2  # 1.5 GiB; a chunk's fp32 logits are 0.2
    assert peaks["compiled"] < peaks["eager"] + whole_bf16_logits / 4, peaks
