"""gpt/engine/parallel.py and the step on CPU, for what a GPU run would otherwise find first:
FSDP2 at world size 8 on torch's fake process group (sharded meta-device init, a step,
the checkpoint's full state dicts, bf16 gathering), the compiled graphs the trainer
runs (graph breaks and recompiles, counted), and, on 2 real gloo ranks, DDP's gradient
buckets, the sharded fp16 scaler and the ranks' vote on a stop signal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers import QUIET, REPO, TINY, graph_breaks, val_loader, write_random_shards

from gpt.core.cli import parse_args
from gpt.core.config import ConfigError, OptimConfig, TrainConfig, model_preset
from gpt.engine import parallel
from gpt.engine.step import SkippedSteps, forward_backward, optimizer_step
from gpt.eval import hellaswag
from gpt.model.transformer import GPT
from gpt.runtime.world import Runtime

HERE = Path(__file__).resolve().parent  # this file's folder: its child processes import it

TINY_MODEL = model_preset("tiny", block_size=32)


class RandomBatches:
    def __init__(self, seed: int = 0, batch: int = 4) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.batch = batch

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(0, 50257, (self.batch, 33), generator=self.gen)
        return x[:, :-1], x[:, 1:]  # the targets are not contiguous: the model takes any layout


@pytest.fixture()
def fake_world():
    """This process as rank 0 of 8 on the fake backend: collectives return at once
    without moving data, so sharding, hooks and state dicts run for real."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        yield Runtime(device=torch.device("cpu"), rank=0, world_size=8, distributed=True)
    finally:
        dist.destroy_process_group()


def meta_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    with torch.device("meta"):
        return GPT(TINY_MODEL)


def reference_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return GPT(TINY_MODEL).state_dict()


# ---------------------------------------------------------------------------------------
# FSDP2 at world size 8, one process


def check_shards(runtime: Runtime) -> None:
    """Built on meta, sharded, then initialised on the device: each rank's shard is its
    slice of the weights GPT(cfg) gets on the CPU from the same seed."""
    model = meta_model()
    parallel.parallelize(model, TrainConfig(parallel="fsdp", compile=False), OptimConfig(), runtime)
    ref = reference_weights()
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied
    for name, p in model.named_parameters():
        chunks = ref[name].chunk(8, dim=0)
        mine = chunks[runtime.rank] if runtime.rank < len(chunks) else ref[name][:0]
        assert torch.equal(p.to_local(), mine), name


@pytest.mark.numerics
def test_fsdp_shards_hold_their_part_of_the_cpu_init(fake_world: Runtime) -> None:
    check_shards(fake_world)


@pytest.mark.slow
@pytest.mark.numerics
def test_fsdp_shards_of_another_rank_too() -> None:
    """Rank 5 of 8, in a process of its own (DTensor caches sharding by mesh shape, so a
    second fake world in one process would reuse the first one's rank)."""
    script = ("import torch, torch.distributed as dist, test_parallel as t\n"
              "from torch.testing._internal.distributed.fake_pg import FakeStore\n"
              "dist.init_process_group('fake', store=FakeStore(), rank=5, world_size=8)\n"
              "t.check_shards(t.Runtime(device=torch.device('cpu'), rank=5, world_size=8,"
              " distributed=True))\nprint('ok')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), str(HERE)])}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


@pytest.mark.slow
def test_fsdp_step_under_compile_has_no_graph_break(fake_world: Runtime, graph_backend) -> None:
    """Each block is compiled before it is sharded and the head + loss on their own: one
    graph for the (identical) blocks, one for the loss, and none broken; a non-finite
    gradient skips the update on the device; the checkpoint's full state dicts come out
    keyed by parameter name."""
    model = meta_model()
    par = parallel.parallelize(model, TrainConfig(parallel="fsdp", compile=True), OptimConfig(),
                               fake_world)
    scaler = parallel.grad_scaler("fsdp", "cpu", enabled=False)
    loss, norm = forward_backward(par.train_model, scaler, par.optimizer, RandomBatches(), 2, 1.0,
                                  "cpu", torch.float32)
    assert torch.isfinite(loss) and norm.shape == ()
    assert graph_breaks() == 0 and graph_backend.frame_count == 2
    # The fake group's reduce-scatter leaves its output unwritten (uninitialised memory
    # before torch 2.13): give every gradient a finite value, so what follows tests the
    # skip and not the fake collective.
    for p in model.parameters():
        p.grad.to_local().fill_(1e-3)
    norm = torch.tensor(1.0)
    before = {n: p.to_local().clone() for n, p in model.named_parameters()}
    skipped = optimizer_step(par.optimizer, scaler, 1e-3, norm * float("nan"))
    assert skipped.item() == 1.0
    assert all(torch.equal(p.to_local(), before[n]) for n, p in model.named_parameters())
    assert optimizer_step(par.optimizer, scaler, 1e-3, norm).item() == 0.0
    assert any(not torch.equal(p.to_local(), before[n]) for n, p in model.named_parameters())
    assert graph_backend.frame_count == 2  # the second step compiled nothing new

    weights = parallel.model_state(model)
    state = parallel.optimizer_state(model, par.optimizer, fake_world)
    assert {k: tuple(v.shape) for k, v in weights.items()} == {
        k: tuple(v.shape) for k, v in reference_weights().items()}
    parallel.check_optimizer_state(state, {k: tuple(v.shape) for k, v in weights.items()
                                           if k != "lm_head.weight"})


@pytest.mark.slow
def test_fsdp_bf16_gathering_computes_in_bf16_and_keeps_fp32(fake_world: Runtime) -> None:
    model = meta_model()
    seen: list[torch.dtype] = []
    train = TrainConfig(parallel="fsdp", compile=False, fsdp_param_dtype="bf16")
    par = parallel.parallelize(model, train, OptimConfig(), fake_world)
    model.transformer.h[0].register_forward_pre_hook(
        lambda m, args: seen.append(m.attn.c_attn.weight.dtype))
    forward_backward(par.train_model, parallel.grad_scaler("fsdp", "cpu", False), par.optimizer,
                     RandomBatches(), 1, 1.0, "cpu", torch.float32)
    assert seen == [torch.bfloat16]  # gathered in bf16
    for p in model.parameters():  # the sharded master weights and their gradients stay fp32
        assert p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32


def test_fsdp_refuses_cuda_graph_compile_modes(fake_world: Runtime) -> None:
    train = TrainConfig(parallel="fsdp", compile=True, compile_mode="reduce-overhead")
    with pytest.raises(ConfigError, match="--compile-mode reduce-overhead captures CUDA graphs"):
        parallel.parallelize(meta_model(), train, OptimConfig(), fake_world)


# ---------------------------------------------------------------------------------------
# one process: init, activation checkpointing, the trainer's compiled graphs


def test_activation_checkpointing_saves_rng_state_only_when_dropout_draws(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}
    real = torch.get_rng_state

    def counting() -> torch.Tensor:
        calls["n"] += 1
        return real()

    monkeypatch.setattr(torch, "get_rng_state", counting)
    for dropout, saves in ((0.0, False), (0.1, True)):
        calls["n"] = 0
        model = GPT(model_preset("tiny", block_size=32, dropout=dropout))
        parallel.apply_activation_checkpointing(model)
        x, y = RandomBatches().next_batch()
        model(x, y)[1].backward()
        assert (calls["n"] > 0) == saves, (dropout, calls["n"])


@pytest.mark.slow
def test_trainer_graphs_training_never_breaks_and_eval_compiles_apart(
        graph_backend, tmp_path: Path) -> None:
    """The trainer's own compiled step: one graph, no break. Validation and HellaSwag
    compile their own two graphs (no-grad at the validation shape; HellaSwag's padded
    shape) on evaluation's callable, and the training step after them compiles nothing."""
    from gpt.eval.validation import val_loss
    from gpt.plan.preflight import preflight
    from gpt.runtime.world import init_runtime
    from gpt.train.build import build_run

    data = write_random_shards(tmp_path, seed=0, train=(20_000,), val=(5_000,))
    cfg = parse_args([*TINY, *QUIET, "--compile", "--val-every", "5", "--val-steps", "2",
                      "--data-dir", str(data), "--out-dir", str(tmp_path / "run")])
    run = build_run(preflight(cfg).settled(), init_runtime("cpu"))
    try:
        par = run.par
        assert par.compiled and par.eval_model is not par.train_model

        def train_step() -> None:
            loss, norm = forward_backward(par.train_model, run.par.scaler, par.optimizer,
                                          run.train_loader, run.accum, 1.0, "cpu", torch.float32)
            run.skips.add(optimizer_step(par.optimizer, run.par.scaler, 1e-3, norm))

        train_step()
        train_step()
        assert graph_breaks() == 0 and graph_backend.frame_count == 1
        val_loss(par.eval_model, val_loader(run), 2, "cpu", torch.float32)
        val_loss(par.eval_model, val_loader(run), 2, "cpu", torch.float32)
        assert graph_backend.frame_count == 2
        examples = [hellaswag.Example(context=(1, 2, 3), endings=((4,), (5, 6), (7,), (8, 9)),
                                      label=1)] * 3
        hellaswag.evaluate(par.eval_model, examples, "cpu", batch_examples=2)
        assert graph_backend.frame_count == 3
        train_step()
        assert graph_breaks() == 0 and graph_backend.frame_count == 3  # training untouched
    finally:
        run.checkpointer.close()


# ---------------------------------------------------------------------------------------
# the step


def test_a_skipped_step_leaves_weights_and_adamw_state_without_a_host_sync(
        monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = GPT(TINY_MODEL)
    opt, fused = parallel.build_optimizer(model, OptimConfig(), torch.device("cpu"))
    assert fused
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    _, norm = forward_backward(model, scaler, opt, RandomBatches(), 1, 1.0, "cpu", torch.float32)
    optimizer_step(opt, scaler, 1e-3, norm)  # AdamW state exists from here on
    _, norm = forward_backward(model, scaler, opt, RandomBatches(1), 1, 1.0, "cpu", torch.float32)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}

    def no_sync(*args: object) -> None:
        raise AssertionError("the step read a device value on the host")

    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "item", no_sync)
        m.setattr(torch.Tensor, "__bool__", no_sync)
        m.setattr(torch.Tensor, "tolist", no_sync)
        skipped = optimizer_step(opt, scaler, 1e-3, norm * float("inf"))
    assert skipped.item() == 1.0
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())
    assert all(torch.equal(v, state[id(p)][k]) for p, s in opt.state.items() for k, v in s.items())


def test_skipped_steps_are_counted_on_the_device() -> None:
    skips = SkippedSteps()
    for bad in (0, 1, 1, 0, 1, 1, 1):
        skips.add(torch.tensor(float(bad)))
    assert skips.counts(torch.device("cpu")).tolist() == [5, 3, 3]  # since read, streak, longest
    skips.reset()
    skips.add(torch.tensor(1.0))
    skips.add(torch.tensor(0.0))
    assert skips.counts(torch.device("cpu")).tolist() == [1, 0, 4]


# ---------------------------------------------------------------------------------------
# two gloo ranks


def _gloo(rank: int, folder: str) -> Runtime:
    dist.init_process_group("gloo", init_method=f"file://{folder}/pg", rank=rank, world_size=2)
    return Runtime(device=torch.device("cpu"), rank=rank, world_size=2, distributed=True,
                   control_group=dist.new_group(backend="gloo"))


def _ddp_and_vote_worker(rank: int, folder: str) -> None:
    from gpt.train.signals import StopSignal

    rt = _gloo(rank, folder)
    try:
        model = meta_model()
        par = parallel.parallelize(model, TrainConfig(compile=False), OptimConfig(), rt)
        forward_backward(par.train_model, torch.amp.GradScaler("cpu", enabled=False),
                         par.optimizer, RandomBatches(rank), 2, 1.0, "cpu", torch.float32)
        storages = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
        stop = StopSignal(rt)
        votes = []
        for i in range(6):
            if rank == 1 and i == 3:
                stop.signum = 15  # as the handler does
            votes.append(stop.agreed())
        stop.__exit__(None)
        result = {"params": len(list(model.parameters())), "grad_storages": len(storages),
                  "votes": votes}
        Path(folder, f"rank{rank}.txt").write_text(repr(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_ddp_buckets_and_stop_vote(tmp_path: Path) -> None:
    """DDP's gradients are views of its all-reduce buckets (no copy in and out of them);
    a stop signal on one rank stops both at the same step, one step later."""
    import torch.multiprocessing as mp

    mp.spawn(_ddp_and_vote_worker, args=(str(tmp_path),), nprocs=2, join=True)
    for rank in range(2):
        result = eval((tmp_path / f"rank{rank}.txt").read_text())
        assert result["grad_storages"] < result["params"] // 2, result  # shared bucket storage
        assert result["votes"] == [False, False, False, False, True, True], result


def _sharded_scaler_worker(rank: int, folder: str) -> None:
    rt = _gloo(rank, folder)
    try:
        model = meta_model()
        # fp16's scaler on CPU (fp16 autocast needs a GPU, the scaler does not)
        par = parallel.parallelize(model, TrainConfig(parallel="fsdp", compile=False),
                                   OptimConfig(), rt, autocast_dtype=torch.float16)
        scaler = par.scaler
        before = [p.to_local().clone() for p in model.parameters()]
        scale = scaler.get_scale()
        loss = par.train_model(*RandomBatches(rank).next_batch())[1]
        scaler.scale(loss).backward()
        if rank == 1:  # an overflow in one rank's gradient shard only
            next(iter(model.parameters())).grad.to_local().view(-1)[0] = float("inf")
        scaler.unscale_(par.optimizer)
        scaler.step(par.optimizer)
        scaler.update()
        moved = any(not torch.equal(p.to_local(), b) for p, b in zip(model.parameters(), before))
        Path(folder, f"rank{rank}.txt").write_text(repr({"moved": moved, "scale": scaler.get_scale(),
                                                        "before": scale}))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp_fp16_overflow_on_one_rank_skips_the_step_on_all(tmp_path: Path) -> None:
    """The ranks must agree to skip, and keep one scale. (torch 2.13's DTensor shares the
    flag even for the plain scaler; the sharded scaler makes it so on every torch.)"""
    import torch.multiprocessing as mp

    mp.spawn(_sharded_scaler_worker, args=(str(tmp_path),), nprocs=2, join=True)
    results = [eval((tmp_path / f"rank{r}.txt").read_text()) for r in range(2)]
    assert [r["moved"] for r in results] == [False, False], results
    assert results[0]["scale"] == results[1]["scale"] == results[0]["before"] / 2, results
