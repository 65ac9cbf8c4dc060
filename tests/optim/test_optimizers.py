"""The optimizers' seam (gpt/optim/kind.py): --optimizer's names are the table's, and a third
optimizer added from this file alone (SGD with momentum, a row in the table and a name
among the flag's choices) goes through the preflight, the memory plan, a run, its
checkpoint and a resume, with nothing else told of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gpt.checkpoint.files import load
from gpt.core import config
from gpt.core.cli import parse_args
from gpt.core.config import ConfigError, OptimConfig
from gpt.optim import optimizer
from gpt.optim.kind import OptimizerKind
from gpt.plan.preflight import preflight
from helpers import QUIET, REPO, TINY, assert_resume_is_exact, read_metrics


class SGD(OptimizerKind):
    """SGD with momentum: one group, one momentum buffer a parameter, a momentum that
    rises over the first two steps, which it logs."""

    name = "sgd"
    least_state_bytes = 4

    def param_groups(self, model: torch.nn.Module, o: OptimConfig) -> list[dict[str, Any]]:
        return [{"params": [p for p in model.parameters() if p.requires_grad],
                 "weight_decay": 0.0, "sgd": True}]

    def torch_class(self) -> type[torch.optim.Optimizer]:
        return torch.optim.SGD

    def kwargs(self, o: OptimConfig, fused: bool) -> dict[str, Any]:
        return {"lr": o.max_lr, "momentum": 0.9}

    def layout_problem(self, parallel: str) -> str | None:
        return "--optimizer sgd is not sharded here: use --parallel ddp" if parallel == "fsdp" else None

    def check(self, o: OptimConfig) -> None:
        if o.optimizer == "sgd" and o.max_lr > 0.5:
            raise ConfigError(f"--max-lr {o.max_lr}: too high for SGD here")

    @staticmethod
    def momentum(step: int) -> float:
        return min(0.9, 0.5 + 0.2 * step)

    def step_settings(self, o: OptimConfig, step: int) -> dict[str, dict[str, float]]:
        return {"sgd": {"momentum": self.momentum(step)}}

    def log_fields(self, o: OptimConfig, step: int, lr: float) -> dict[str, float]:
        return {"sgd_momentum": self.momentum(step)}


@pytest.fixture
def sgd(monkeypatch: pytest.MonkeyPatch) -> SGD:
    """SGD registered: its row, and its name among --optimizer's choices."""
    row = SGD()
    monkeypatch.setitem(optimizer.OPTIMIZERS, "sgd", row)
    monkeypatch.setitem(config.OPTIMIZER_NAMES, "sgd", __file__)
    return row


def test_the_flags_choices_are_the_tables_rows() -> None:
    assert list(config.OPTIMIZER_NAMES) == list(optimizer.OPTIMIZERS)
    for name, module in config.OPTIMIZER_NAMES.items():
        assert optimizer.OPTIMIZERS[name].name == name
        assert (REPO / module).is_file()


def test_an_unregistered_optimizer_is_not_a_choice() -> None:
    with pytest.raises(SystemExit):
        parse_args([*TINY, "--optimizer", "sgd"])


@pytest.mark.slow
def test_a_third_optimizer_is_planned_and_checked_by_the_preflight(sgd: SGD, data_dir: Path,
                                                                  tmp_path: Path) -> None:
    args = [*TINY, *QUIET, "--optimizer", "sgd", "--data-dir", str(data_dir),
            "--out-dir", str(tmp_path / "run")]
    plan = preflight(parse_args(args), plan_memory=True)
    assert plan.ok, plan.problems
    n = sum(p.numel() for p in plan_model_params(plan.cfg))
    # the planner built SGD and measured its state: one fp32 momentum buffer a parameter
    assert plan.memory.components["optimizer state"] == 4 * n
    refused = preflight(parse_args([*args, "--parallel", "fsdp"]))
    assert str(refused.problems[0]) == "--optimizer sgd is not sharded here: use --parallel ddp"
    refused = preflight(parse_args([*args, "--max-lr", "0.9"]))
    assert str(refused.problems[0]) == "--max-lr 0.9: too high for SGD here"


def plan_model_params(cfg: config.Config) -> list[torch.Tensor]:
    from gpt.model.transformer import GPT

    with torch.device("meta"):
        return list(GPT(cfg.model).parameters())


@pytest.mark.numerics
@pytest.mark.slow
def test_a_third_optimizer_trains_checkpoints_and_resumes_exactly(sgd: SGD, data_dir: Path,
                                                                  tmp_path: Path) -> None:
    split = assert_resume_is_exact([*TINY, *QUIET, "--optimizer", "sgd", "--data-dir",
                                    str(data_dir)], tmp_path)
    straight = load(tmp_path / "straight" / "ckpt_000004.pt")
    resumed = load(split / "ckpt_000004.pt")
    assert resumed["config"]["optim"]["optimizer"] == "sgd"
    # bit for bit, as the losses were: the same computations in the same order on the
    # same machine, whether the run stopped and resumed between them or not
    for name, value in straight["model"].items():
        assert torch.equal(resumed["model"][name], value), name
    state = resumed["optimizer"]
    assert [g["momentum"] for g in state["param_groups"]] == [SGD.momentum(3)]  # step 3's
    for name, entry in straight["optimizer"]["state"].items():
        assert torch.equal(state["state"][name]["momentum_buffer"], entry["momentum_buffer"])
    records = read_metrics(split, "train")
    assert [r["sgd_momentum"] for r in records] == [SGD.momentum(s) for s in range(4)]
