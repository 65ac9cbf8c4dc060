"""The evaluations' seam (gpt/eval/evaluation.py): a fourth evaluation added from this file
alone (the weights' norm, on rank 0) is checked by the preflight, loaded, scored when due,
said and logged, in the run's summary and in its curves, with nothing else told of it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from gpt.core.cli import parse_args
from gpt.core.config import Config, ConfigError, EvalConfig
from gpt.eval import evaluations
from gpt.eval.evaluation import Evaluation, Result, Scoring
from gpt.plan.preflight import preflight
from gpt.report.metrics_reader import Panel
from gpt.runtime.world import Runtime
from helpers import QUIET, TINY, read_metrics, run_cli


class WeightNorm(Evaluation):
    """The L2 norm of the weights every 2 steps, on rank 0 alone; a run of at most 100
    steps only (its preflight check)."""

    name = "weight_norm"
    every_rank = False
    panels = (Panel("weight_norm", (("norm", "L2"),), "weight norm", "L2 norm"),)

    def every(self, e: EvalConfig) -> int:
        return 2

    def check(self, cfg: Config) -> None:
        if cfg.train.max_steps > 100:
            raise ConfigError(f"weight norm: --max-steps {cfg.train.max_steps} is over 100")

    def load(self, cfg: Config, runtime: Runtime) -> list[str]:
        return ["loaded once"]

    def score(self, loaded: Any, at: Scoring) -> Result:
        assert loaded == ["loaded once"] and at.runtime.is_master
        norm = math.sqrt(sum(float(p.detach().float().pow(2).sum()) for p in at.model.parameters()))
        return Result({"type": self.name, "step": at.step, "norm": norm},
                      (f"weight norm {norm:.3f}",))

    def summary(self, record: dict[str, Any]) -> str:
        return f"weight norm {record['norm']:.3f}"


@pytest.fixture
def weight_norm(monkeypatch: pytest.MonkeyPatch) -> WeightNorm:
    ev = WeightNorm()
    monkeypatch.setattr(evaluations, "EVALUATIONS", (*evaluations.EVALUATIONS, ev))
    return ev


def test_the_preflight_asks_every_evaluation(weight_norm: WeightNorm, data_dir: Path,
                                            tmp_path: Path) -> None:
    args = [*TINY, *QUIET, "--data-dir", str(data_dir), "--out-dir", str(tmp_path / "r")]
    assert preflight(parse_args([*args, "--max-steps", "4"])).ok
    plan = preflight(parse_args([*args, "--max-steps", "200"]))
    assert [str(p) for p in plan.problems] == ["weight norm: --max-steps 200 is over 100"]


def test_a_fourth_evaluation_is_due_logged_summed_up_and_drawn(weight_norm: WeightNorm,
                                                               data_dir: Path,
                                                               tmp_path: Path) -> None:
    out = tmp_path / "r"
    proc = run_cli(*TINY, *QUIET, "--max-steps", "5", "--data-dir", str(data_dir),
                   "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    records = read_metrics(out, "weight_norm")
    assert [r["step"] for r in records] == [0, 2, 4, 5]  # every 2 steps, and the end
    said = [line for line in proc.stdout.splitlines()
            if line.startswith("step") and "| weight norm" in line]
    assert said == [f"step {r['step']:6d} | weight norm {r['norm']:.3f}" for r in records]
    part = f"weight norm {records[-1]['norm']:.3f}"
    done = next(line for line in proc.stdout.splitlines() if line.startswith("done:"))
    assert f" | {part} | " in done
    assert read_metrics(out, "summary")[-1]["scores"] == [part]

    from gpt.train.run_curves import read_run

    run = read_run(out / "metrics.jsonl")
    assert run.panels == evaluations.panels() and weight_norm.panels[0] in run.panels
    assert list(run.column("weight_norm", "norm")[0]) == [0, 2, 4, 5]
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from gpt.report.curves import draw

    assert (out / "curves.png").is_file()
    fig = draw([run])
    try:
        ax = next(ax for ax in fig.axes if ax.get_title() == "weight norm")
        (line,) = ax.lines
        assert list(line.get_ydata()) == [r["norm"] for r in records]
        assert ax.get_ylabel() == "L2 norm" and line.get_label() == "L2"
    finally:
        plt.close(fig)


def test_the_loop_asks_the_list_not_names() -> None:
    # validation, HellaSwag and the harness's tasks are instances of the one interface,
    # each with its own record type in metrics.jsonl (logs written before read the same)
    assert [ev.name for ev in evaluations.EVALUATIONS] == ["val", "hellaswag", "tasks"]
    assert [ev.name for ev in evaluations.enabled(EvalConfig(val_every=0, hellaswag_every=5))] \
        == ["hellaswag"]
    assert evaluations.panels()[0].record == "hellaswag"
