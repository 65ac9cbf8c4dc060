"""--optimizer muon (gpt/optim/muon.py): Muon for the blocks' matrices and AdamW for the rest,
as one optimizer; its schedule options; and the trainer with it: resume, DDP and ZeRO-1
against one process, FSDP refused."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from gpt.core.config import OptimConfig, model_preset
from gpt.entry import train_main
from gpt.engine.step import optimizer_step
from gpt.model.transformer import GPT
from gpt.optim.muon import MUON, hidden_matrices, momentum_at
from gpt.optim.muon_adamw import MuonAdamW
from gpt.optim.optimizer import build_optimizer
from gpt.optim.schedule import lr_at
from helpers import (QUIET, TINY, assert_resume_is_exact, assert_two_ranks_match_one, error_line,
                     run_cli)

MUON_CFG = OptimConfig(optimizer="muon", max_lr=3e-3, muon_lr=0.02, fused=False)


def model_and_grads(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(model_preset("tiny", block_size=32))
    x = torch.randint(0, 50257, (2, 16))
    model(x, x)[1].backward()
    return model


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest() -> None:
    model = model_and_grads()
    groups = MUON.param_groups(model, MUON_CFG)
    muon, decay, no_decay = groups
    assert muon["muon"] and muon["lr_ratio"] == pytest.approx(0.02 / 3e-3)
    assert {id(p) for p in muon["params"]} == {id(p) for p in hidden_matrices(model)}
    assert all(p.dim() == 2 for p in muon["params"]) and len(muon["params"]) == 4 * 2
    assert {id(p) for p in decay["params"]} == {id(model.transformer.wte.weight),
                                                id(model.transformer.wpe.weight)}
    assert all(p.dim() == 1 for p in no_decay["params"])


def test_one_step_is_torchs_muon_and_adamw_each_on_their_own() -> None:
    model, ref = model_and_grads(), model_and_grads()  # (a deep copy drops the gradients)
    opt, _ = build_optimizer(model, MUON_CFG, torch.device("cpu"))
    assert isinstance(opt, MuonAdamW)
    optimizer_step(opt, torch.amp.GradScaler("cpu", enabled=False), 3e-3, torch.tensor(1.0))
    groups = MUON.param_groups(ref, MUON_CFG)
    torch.optim.Muon(groups[0]["params"], lr=0.02, weight_decay=0.0, momentum=0.95).step()
    torch.optim.AdamW(groups[1:], lr=3e-3, betas=(0.9, 0.95), eps=1e-8).step()
    for (name, got), want in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(got, want), name


def test_the_state_round_trips_and_the_next_step_is_the_same() -> None:
    model, twin = model_and_grads(), model_and_grads()
    opt, _ = build_optimizer(model, MUON_CFG, torch.device("cpu"))
    opt.step()
    twin.load_state_dict(model.state_dict())
    twin_opt, _ = build_optimizer(twin, MUON_CFG, torch.device("cpu"))
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert any("momentum_buffer" in s for s in twin_opt.state.values())
    opt.step()
    twin_opt.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_momentum_warms_up_and_the_trapezoid_holds_then_falls() -> None:
    assert [momentum_at(s, 0.95, 4) for s in (0, 2, 4, 9)] == pytest.approx([0.85, 0.9, 0.95, 0.95])
    assert momentum_at(0, 0.95, 0) == 0.95
    lrs = [lr_at(s, 1.0, 0.0, 0, 10, "trapezoid", 0.4) for s in range(11)]
    assert lrs[:7] == [1.0] * 7 and lrs[7:] == pytest.approx([0.75, 0.5, 0.25, 0.0])
    assert lr_at(0, 1.0, 0.1, 2, 10, "trapezoid", 0.4) == 0.5  # warm-up first


def test_the_step_scales_muons_learning_rate_and_sets_its_momentum() -> None:
    model = model_and_grads()
    opt, _ = build_optimizer(model, MUON_CFG, torch.device("cpu"))
    optimizer_step(opt, torch.amp.GradScaler("cpu", enabled=False), 1.5e-3, torch.tensor(1.0),
                   settings=MUON.step_settings(
                       OptimConfig(optimizer="muon", muon_momentum=0.9), 0))
    muon_group, *adamw_groups = opt.param_groups
    assert muon_group["lr"] == pytest.approx(0.01) and muon_group["momentum"] == 0.9
    assert all(g["lr"] == 1.5e-3 and "momentum" not in g for g in adamw_groups)


def test_a_non_finite_gradient_skips_the_whole_step() -> None:
    model = model_and_grads()
    before = copy.deepcopy(model.state_dict())
    opt, _ = build_optimizer(model, MUON_CFG, torch.device("cpu"))
    skipped = optimizer_step(opt, torch.amp.GradScaler("cpu", enabled=False), 3e-3,
                             torch.tensor(float("nan")))
    assert skipped.item() == 1.0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


ARGS = [*TINY, *QUIET, "--optimizer", "muon", "--muon-momentum-warmup", "3",
        "--lr-schedule", "trapezoid", "--total-batch-tokens", "512"]


@pytest.mark.numerics
@pytest.mark.slow
def test_the_trainer_resumes_muon_exactly(data_dir: Path, tmp_path: Path) -> None:
    assert_resume_is_exact([*ARGS, "--data-dir", str(data_dir)], tmp_path)


@pytest.mark.slow
def test_resuming_with_the_other_optimizer_is_refused_in_one_line(data_dir: Path,
                                                                 tmp_path: Path) -> None:
    adamw = [*TINY, *QUIET, "--total-batch-tokens", "512", "--data-dir", str(data_dir),
             "--out-dir", str(tmp_path / "r")]
    assert run_cli(*adamw, "--max-steps", "1").returncode == 0
    proc = run_cli(*adamw, "--max-steps", "2", "--resume", "auto", "--optimizer", "muon")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "holds adamw's state, and this run asks for --optimizer muon" in proc.stderr


def test_fsdp_with_muon_is_refused_in_one_line(data_dir: Path, tmp_path: Path) -> None:
    proc = run_cli(*ARGS, "--max-steps", "1", "--parallel", "fsdp", "--data-dir",
                   str(data_dir), "--out-dir", str(tmp_path / "r"))
    assert proc.returncode == 2
    assert "--optimizer muon orthogonalises whole weight matrices" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()


@pytest.mark.parametrize("flags, words", [
    (["--muon-lr", "1e30"], "--muon-lr must be <= 1.0"),
    (["--muon-weight-decay", "100"], "--muon-weight-decay 100.0 x --muon-lr 0.02 must be < 1"),
])
def test_an_optimizers_own_values_are_refused_before_the_run(flags: list[str], words: str,
                                                             tmp_path: Path, capsys) -> None:
    # the optimizer's checks (gpt/optim/muon.py's), asked by the preflight first
    assert train_main([*TINY, *QUIET, *flags, "--out-dir", str(tmp_path / "run")]) == 2
    assert words in error_line(capsys.readouterr().err) and not (tmp_path / "run").exists()


@pytest.mark.numerics
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "zero1"])
def test_two_ranks_match_one_process_under_muon(mode: str, data_dir: Path, tmp_path: Path) -> None:
    one, two = assert_two_ranks_match_one([*ARGS, "--max-steps", "3", "--data-dir",
                                           str(data_dir)], mode, tmp_path, weights=False)
    from gpt.checkpoint.files import load

    ref, got = load(one / "ckpt_000003.pt"), load(two / "ckpt_000003.pt")
    for name, value in ref["model"].items():
        # Muon's Newton-Schulz runs in bf16, so the reduction order's fp32 rounding can
        # flip a bf16 rounding; and AdamW moves an element whose gradient is tiny by up to
        # its learning rate (3e-3) whichever way that rounding tips it, at each of the 3
        # steps (the chunked loss sums the head's gradient in another order than one
        # matmul: a tied embedding's element moved 4.6e-3 apart, the mean 2e-6). A real
        # error (a missed all-reduce, another batch) moves most elements by about Muon's
        # step (~2e-3 each, x3 steps): the mean, bounded well below that, catches it.
        diff = (got["model"][name] - value).abs()
        assert diff.max() < 3 * 3e-3 and diff.mean() < 1e-4, (name, diff.max(), diff.mean())
    assert ref["optimizer"]["state"].keys() == got["optimizer"]["state"].keys()
    assert "momentum_buffer" in got["optimizer"]["state"]["transformer.h.0.attn.c_attn.weight"]


@pytest.mark.numerics
def test_the_newton_schulz_bench_times_torchs_iteration() -> None:
    """gpt.bench newton-schulz compares fp32 with bf16 on its own copy of Muon's iteration:
    in bf16 it must be torch.optim.Muon's, bit for bit, or the comparison means nothing."""
    from torch.optim import _muon

    from gpt.bench.tokens.newton_schulz import newton_schulz

    torch.manual_seed(0)
    for shape in ((48, 16), (16, 64), (32, 32)):
        g = torch.randn(shape)
        want = _muon._zeropower_via_newtonschulz(g, (3.4445, -4.775, 2.0315), 5, 1e-7)
        got = newton_schulz(g, torch.bfloat16)
        assert got.dtype == torch.bfloat16 and torch.equal(got, want), shape
        fp32 = newton_schulz(g, torch.float32)
        assert fp32.dtype == torch.float32 and (fp32 - want.float()).abs().max() < 0.1
