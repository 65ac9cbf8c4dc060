"""python -m gpt.bench tokens (gpt/bench/tokens/search.py): seeds and spread, the bracketed
crossing, both GPT-2 schedules, the tied-head variant, time to target and the ablation.
The logic runs on a stand-in trainer (a loss that falls with steps, known per recipe);
one slow test runs the real trainer end to end."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpt.bench import runs
from gpt.bench.cli import main as bench_main
from gpt.bench.tokens import recipes
from gpt.bench.tokens import runner as tokens_runner
from gpt.bench.tokens import timing as tokens_timing
from gpt.bench.tokens.budgets import narrow_crossing
from gpt.core.errors import UserError
from helpers import write_random_shards

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None  # the plot extra
ARGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--seq-len", "64",
        "--batch-size", "2", "--total-batch-tokens", "128", "--val-every", "2", "--val-steps", "1"]


class FakeTrainer:
    """Stands in for run_trainer and read_metrics (in tokens_runner and tokens_timing): a
    run 'trains' to loss 10 - 0.01 * rate * steps (rate 1 for GPT-2 plus `speed` per part
    its flags turn on; seed s adds 0.01 * s) at 10 ms a step (20 with Muon), and a timing
    run (--val-every 0) logs every step: 500 ms in warm-up, then its step time."""

    FLAG = {"muon": "muon", "untied_head": "--untied-head", "rotary": "--rotary",
            "schedule": "trapezoid", "relu2": "--relu2"}

    def __init__(self, monkeypatch, speed: dict[str, float], stop_at: int = 0,
                 stop=None, best_lr: dict[str, float] | None = None) -> None:
        self.speed, self.flags_of, self.calls = speed, {}, []
        # {"gpt2" / "muon" / "adamw, untied head": the --max-lr where runs of that kind do
        # best (the last, AdamW with an untied head, as GPT-2 if not given)}; else any rate
        # is as good
        self.best_lr = best_lr or {}
        self.stop_at, self.stop = stop_at, stop  # at call number stop_at, stop() (an interrupt)
        for module in (tokens_runner, tokens_timing):
            monkeypatch.setattr(module, "run_trainer", self.run_trainer)
            monkeypatch.setattr(module, "read_metrics", self.read_metrics)

    def run_trainer(self, flags, what, on_start=None) -> float:
        self.calls.append(list(flags))
        if len(self.calls) == self.stop_at:
            self.stop()
        self.flags_of[flags[flags.index("--out-dir") + 1]] = list(flags)
        return 1.0

    def training_runs(self) -> int:
        return sum(f[f.index("--val-every") + 1] != "0" for f in self.calls)

    def read_metrics(self, out) -> list[dict]:
        flags = self.flags_of[str(out)]
        value = lambda name: flags[flags.index(name) + 1]  # noqa: E731
        steps, seed = int(value("--max-steps")), int(value("--seed"))
        ms = 20.0 if "muon" in flags else 10.0
        if value("--val-every") == "0":  # a timing run; its repeats 10% slower each
            ms *= 1 + 0.1 * sum(c[:-2] == flags[:-2] for c in self.calls if c[-1] != str(out))
            return [{"type": "train", "step": s, "ms": 500.0 if s < 5 else ms}
                    for s in range(steps)]
        rate = 1.0 + sum(v for p, v in self.speed.items() if self.FLAG[p] in flags)
        loss = 10.0 - 0.01 * rate * steps + 0.01 * (seed - 1337)
        kind = ("muon" if "muon" in flags else
                "adamw, untied head" if "--untied-head" in flags else "gpt2")
        best = self.best_lr.get(kind, self.best_lr.get("gpt2"))
        if best is not None:
            loss += 0.05 * math.log2(float(value("--max-lr")) / best) ** 2
        return [{"type": "train", "step": steps - 1, "ms": ms,
                 "peak_mem_gb": 0.5 + 0.5 * ("--untied-head" in flags)},
                {"type": "val", "step": steps, "val_loss": loss}]


def bench(tmp_path: Path, monkeypatch, speed: dict[str, float], *extra: str,
          code: int = 0) -> dict:
    """The bench on FakeTrainer(speed), its tokens.json."""
    FakeTrainer(monkeypatch, speed)
    return run_bench(tmp_path, *extra, code=code)


def run_bench(tmp_path: Path, *extra: str, code: int = 0, report: str = "tokens") -> dict:
    data = tmp_path / "data"
    if not data.exists():
        data.mkdir()
        write_random_shards(data, seed=0, train=(30_000,), val=(4_000,))
    got = bench_main(["tokens", "--data-dir", str(data), "--out", str(tmp_path / "out"), *ARGS,
                      "--steps", "64", "--baseline-lrs", "1e-3", "3e-3", "--new-lr-scales", "1",
                      "--new-budgets", "0.5", "--seeds", "2", "--timing-steps", "8", *extra])
    assert got == code
    return json.loads((tmp_path / "out" / f"{report}.json").read_text()) if code == 0 else {}


def test_seeds_schedules_bracketing_and_the_tied_head(tmp_path: Path, monkeypatch) -> None:
    # the new recipe 4x as fast; its untied head a quarter of that; the trapezoid helps GPT-2
    speed = {"muon": 2.0, "untied_head": 0.75, "rotary": 0.25, "schedule": 0.1}
    r = bench(tmp_path, monkeypatch, speed)
    labels = {(p["label"], p["lr"]) for p in r["points"]}
    assert {("gpt2 cosine", 1e-3), ("gpt2 cosine", 3e-3), ("gpt2 trapezoid", 1e-3),
            ("gpt2 trapezoid", 3e-3)} <= labels
    assert r["baseline"]["parts"] == ["schedule"]  # the better schedule is the target
    assert r["target_val_loss"] == pytest.approx(10 - 0.01 * 1.1 * 64 + 0.005)
    assert r["target_val_loss_std"] > 0 and len(r["runs"]) == 2 * len(r["points"])
    # the new recipe (rate 4.1) reaches the target at 64 * 1.1 / 4.1 = 17.2 steps: below the
    # smallest budget asked for (32), so the bench halved it to 16, which ended above, ran
    # the budget halfway (24) to narrow the crossing, and interpolated between 16 and 24
    best = r["best"]
    steps = sorted(p["steps"] for p in best["points"])
    assert steps == [16, 24, 32, 64] and best["how"].startswith("between the 2,048- and 3,072")
    assert best["tokens_to_target"] == pytest.approx(64 * 1.1 / 4.1 * 128, rel=0.02)
    assert best["tokens_ratio"] == pytest.approx(4.1 / 1.1, rel=0.02)
    assert best["tokens_ratio_per_seed"]["reached"] == "2/2"
    assert best["tokens_ratio_per_seed"]["std"] > 0  # the seeds differ
    # Muon's steps cost twice as much here: the time ratio is half the tokens ratio
    assert best["time_ratio_from_run_times"] == pytest.approx(best["tokens_ratio"] / 2, rel=0.02)
    assert best["time_ratio"] == pytest.approx(best["tokens_ratio"] / 2, rel=0.02)
    tied = r["tied_head"]
    assert tied["tokens_ratio"] == pytest.approx(3.35 / 1.1, rel=0.02)
    # parameters: GPT-2's V*d + T*d + L*(12d^2 + 13d) + 2d at V=50304, T=64, d=32, L=1; the
    # untied head adds V*d
    d, vocab = 32, 50304
    assert r["baseline"]["params"] == vocab * d + 64 * d + 12 * d * d + 13 * d + 2 * d
    assert best["params"] - tied["params"] == vocab * d
    assert all("--untied-head" not in run["flags"] for run in r["runs"]
               if run["label"] == "new, tied head")
    md = (tmp_path / "out" / "tokens.md").read_text()
    assert "tied head (equal parameters)" in md and "+-" in md and "from run times" in md
    assert "Target: GPT-2 recipe (trapezoid schedule, --max-lr 0.001)" in md
    assert "1.62M parameters" in md and "| new recipe (best) | 3.23M |" in md
    assert (tmp_path / "out" / "tokens.png").exists() == HAS_MATPLOTLIB  # both best curves
    peaks = {p["label"]: p["peak_mem_gb"] for p in r["points"]}
    assert peaks["new"] == 1.0 and peaks["new, tied head"] == 0.5 and "peak GiB" in md


def test_the_ablation_adds_each_part_to_gpt2_and_takes_it_from_the_recipe(
        tmp_path: Path, monkeypatch) -> None:
    speed = {"muon": 2.0, "rotary": 0.5}
    r = bench(tmp_path, monkeypatch, speed, "--ablation", "--parts", "rotary", "relu2",
              "value_embeds")
    rows = {a["variant"]: a for a in r["ablation"]}
    # a further part is only asked of the full recipe: whether to add it
    assert list(rows) == ["gpt2 + rotary", "new - rotary", "gpt2 + relu2", "new - relu2",
                          "new + value_embeds"]
    assert rows["gpt2 + rotary"]["tokens_ratio"] == pytest.approx(1.5, rel=0.02)
    assert rows["new - rotary"]["tokens_ratio"] == pytest.approx(3.0, rel=0.02)
    assert rows["gpt2 + relu2"]["tokens_ratio"] == pytest.approx(1.0, rel=0.02)
    assert rows["new + value_embeds"]["parts"] == [*recipes.NEW_PARTS, "value_embeds"]
    # seed by seed: rotary helps whether added to GPT-2 (a lower final loss) or taken from
    # the recipe (more tokens without it); ReLU^2 and value embeddings change nothing here
    effect = {k: r["part_effect"] for k, r in rows.items()}
    assert effect["gpt2 + rotary"] == {"verdict": "helps", "helps": 2, "hurts": 0, "seeds": 2,
                                       "measure": "final val loss at the full budget"}
    assert effect["new - rotary"]["verdict"] == "helps"
    assert effect["new - rotary"]["measure"] == "tokens to the target"
    for name in ("gpt2 + relu2", "new - relu2", "new + value_embeds"):
        assert (effect[name]["verdict"], effect[name]["helps"], effect[name]["hurts"]) == (
            "unclear", 0, 0)
    md = (tmp_path / "out" / "tokens.md").read_text()
    assert "| gpt2 + rotary |" in md and "helps on all 2 seeds (final val loss at the full" in md
    assert "unclear: helps on 0, hurts on 0 of 2 seeds (tokens to the target)" in md


def test_the_ablation_sweeps_the_rate_where_muon_is_the_part(tmp_path: Path, monkeypatch) -> None:
    """Adding Muon to GPT-2 or taking it from the recipe leaves a variant whose optimizer no
    recipe tuned with its other parts: it gets a sweep of its own, bracketed; the other
    variants run at their optimizer's tuned rate."""
    FakeTrainer(monkeypatch, {"muon": 2.0, "rotary": 0.5},
                best_lr={"gpt2": 1e-3, "adamw, untied head": 6e-3})
    r = run_bench(tmp_path, "--ablation", "--parts", "muon", "rotary")
    rows = {a["variant"]: a for a in r["ablation"]}
    assert r["baseline"]["lr"] == 1e-3
    no_muon = rows["new - muon"]  # 1e-3 and 3e-3, then twice the best twice: 6e-3 is inside
    assert (no_muon["lr"], no_muon["lr_swept"], no_muon["lr_bracketed"]) == (
        6e-3, [1e-3, 3e-3, 6e-3, 1.2e-2], True)
    assert rows["gpt2 + muon"]["lr_swept"] == [1.0]  # --new-lr-scales: one scale here
    assert rows["gpt2 + rotary"]["lr"] == 1e-3 and rows["gpt2 + rotary"]["lr_swept"] is None
    assert rows["new - rotary"]["lr"] == r["new_best_lr_scale"]
    # its smaller budgets at its own best rate
    assert {p["lr"] for p in r["points"] if p["label"] == "new - muon" and p["steps"] < 64} == {6e-3}
    md = (tmp_path / "out" / "tokens.md").read_text()
    assert "| new - muon (best lr of its own sweep: 0.006) |" in md


@pytest.mark.parametrize("steps, losses, want", [
    ((16, 32, 64), (5.5, 5.0, 4.5), 24),   # a halving's 2x apart around the crossing
    ((24, 32, 64), (5.5, 5.0, 4.5), None),  # 1.33x apart: as fine as --new-budgets
    ((16, 32, 64), (5.5, 5.4, 5.3), None),  # never reached
    ((16, 32, 64), (5.0, 4.9, 4.5), None),  # reached by the smallest: nothing below it
    ((1, 2, 4), (5.5, 5.0, 4.5), None),     # no whole budget between 1 and 2
])
def test_a_coarse_crossing_gets_the_budget_halfway(steps, losses, want) -> None:
    points = [{"steps": s, "final_val_loss": v} for s, v in zip(steps, losses)]
    assert narrow_crossing(points, target=5.2) == want


def test_the_ablation_runs_only_the_budgets_that_bracket_each_crossing(
        tmp_path: Path, monkeypatch) -> None:
    """bisect_budgets: a variant whose full budget ends above the target is one point; one
    that crosses it gets the same two points either side, and so the same tokens to the
    target, as the whole grid of budgets, from fewer runs."""
    budgets = ["--new-budgets", "0.25", "0.375", "0.5", "0.75", "--seeds", "1"]
    speed = {"muon": 2.0, "rotary": 0.5, "relu2": -0.2}  # ReLU^2 slows learning here
    fake = FakeTrainer(monkeypatch, speed)
    r = run_bench(tmp_path, *budgets, "--ablation", "--parts", "rotary", "relu2")
    rows = {a["variant"]: a for a in r["ablation"]}
    # GPT-2 + ReLU^2 ends above the target at the full budget: nothing smaller can reach it
    assert [p["steps"] for p in rows["gpt2 + relu2"]["points"]] == [64]
    assert rows["gpt2 + relu2"]["tokens_to_target"] is None
    # the full recipe without rotary learns at rate 1 + 2 - 0.2 = 2.8: it reaches the
    # target (64 steps at rate 1) at 22.9 steps, between the grid's 16 and 24 (of
    # 16/24/32/48/64): the bisection ran 24, then 16 (32 and 48 not at all)
    got = [p["steps"] for p in rows["new - rotary"]["points"]]
    assert got == [16, 24, 64]
    assert rows["new - rotary"]["how"].startswith("between the 2,048- and 3,072")
    # the loss is linear in the steps here, so the two points either side give it exactly
    assert rows["new - rotary"]["tokens_to_target"] == pytest.approx(64 / 2.8 * 128)
    # fewer runs than the grid, which the recipe itself (rate 3.3) got whole
    assert [p["steps"] for p in r["best"]["points"]] == [16, 24, 32, 48, 64]
    assert sum("--rotary" not in f and "muon" in f for f in fake.calls) == 3


def test_without_matplotlib_the_plot_is_left_out_in_one_line(tmp_path: Path, monkeypatch,
                                                             capsys) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    bench(tmp_path, monkeypatch, {"muon": 2.0, "untied_head": 0.75, "rotary": 0.25})
    out = capsys.readouterr()
    assert not (tmp_path / "out" / "tokens.png").exists() and (tmp_path / "out" / "tokens.md").exists()
    notes = [line for line in out.err.splitlines() if "tokens.png" in line]
    assert notes == ["note: tokens.png left out: matplotlib is not installed; pip install "
                     "-e \".[plot]\" (or pip install matplotlib)"]
    assert "tokens.png" not in out.out


@pytest.mark.slow
def test_the_command_trains_both_recipes_for_real(tmp_path: Path) -> None:
    """The real trainer, tiny and short: every point over 2 seeds, curves and times kept."""
    data = write_random_shards(tmp_path, seed=0, train=(30_000,), val=(4_000,))
    out = tmp_path / "out"
    code = bench_main(["tokens", "--data-dir", str(data), "--out", str(out), *ARGS, "--steps", "4",
                       "--baseline-lrs", "3e-3", "--new-lr-scales", "1", "--new-budgets", "0.5",
                       "--seeds", "2", "--max-halvings", "0", "--new-max-lr", "5e-3",
                       "--new-muon-lr", "0.03", "--timing-steps", "6",
                       "--timing-repeats", "1"])
    assert code == 0
    r = json.loads((out / "tokens.json").read_text())
    assert [(p["label"], p["steps"]) for p in r["points"]] == [
        ("gpt2 cosine", 4), ("gpt2 trapezoid", 4), ("new", 4), ("new", 2),
        ("new, tied head", 4), ("new, tied head", 2)]
    assert len(r["runs"]) == 12 and {run["seed"] for run in r["runs"]} == {1337, 1338}
    assert all(run["curve"][-1][0] == run["steps"] * 128 and run["train_seconds"] > 0
               and run["peak_mem_gb"] > 0 for run in r["runs"])
    new = [run["flags"] for run in r["runs"] if run["label"] == "new"]
    assert all("--max-lr" in f and f[f.index("--max-lr") + 1] == "0.005" and
               f[f.index("--muon-lr") + 1] == "0.03" for f in new)
    assert r["commit"] and r["torch"] and "tokens_ratio" in r["best"]
    assert all(t["median_step_s"] > 0 for t in r["timing"]["recipes"].values())
    assert r["runs_run_now"] == 12
    assert len((out / "tokens-runs.jsonl").read_text().splitlines()) == 12
    assert not HAS_MATPLOTLIB or (out / "tokens.png").stat().st_size > 0


def cache_lines(tmp_path: Path) -> list[str]:
    return (tmp_path / "out" / "tokens-runs.jsonl").read_text().splitlines()


def test_a_second_bench_reuses_every_run_and_a_changed_flag_or_data_trains_again(
        tmp_path: Path, monkeypatch, capsys) -> None:
    first = bench(tmp_path, monkeypatch, {"muon": 2.0})
    n = len(first["runs"])
    assert (first["runs_run_now"], first["runs_reused"]) == (n, 0)
    assert len(cache_lines(tmp_path)) == n  # the timing runs are never cached
    line = json.loads(cache_lines(tmp_path)[0])
    assert "--out-dir" not in line["key"]["flags"] and line["key"]["data"]["shards"]
    assert line["commit"] and line["torch"] and line["cpu_count"] and line["time"]
    fake = FakeTrainer(monkeypatch, {"muon": 2.0})
    again = run_bench(tmp_path)
    assert fake.training_runs() == 0 and (again["runs_run_now"], again["runs_reused"]) == (0, n)
    assert again["best"]["tokens_to_target"] == first["best"]["tokens_to_target"]
    assert "reused gpt2 cosine (64 steps, lr 0.001, seed 1337)" in capsys.readouterr().out
    assert len(again["run_origins"]) == 1 and again["run_origins"][0]["runs"] == n
    md = (tmp_path / "out" / "tokens.md").read_text()
    assert f"0 run now, {n} reused" in md
    # a third learning rate: only its 2 seeds train; the rest is reused
    fake = FakeTrainer(monkeypatch, {"muon": 2.0})
    third = run_bench(tmp_path, "--baseline-lrs", "1e-3", "3e-3", "2e-3")
    assert fake.training_runs() == 4 and third["runs_run_now"] == 4  # both schedules
    assert third["runs_reused"] == n
    # other data (a shard's size): nothing is reused
    with open(tmp_path / "data" / "val_000000.bin", "ab") as fh:
        fh.write(b"\0\0")
    fake = FakeTrainer(monkeypatch, {"muon": 2.0})
    assert run_bench(tmp_path)["runs_reused"] == 0 and fake.training_runs() == n


def test_no_reuse_trains_again_and_still_appends(tmp_path: Path, monkeypatch) -> None:
    n = len(bench(tmp_path, monkeypatch, {"muon": 2.0})["runs"])
    fake = FakeTrainer(monkeypatch, {"muon": 2.0})
    r = run_bench(tmp_path, "--no-reuse")
    assert fake.training_runs() == n and (r["runs_run_now"], r["runs_reused"]) == (n, 0)
    assert len(cache_lines(tmp_path)) == 2 * n


def test_a_truncated_last_line_is_skipped_with_a_warning_and_kept(
        tmp_path: Path, monkeypatch, capsys) -> None:
    n = len(bench(tmp_path, monkeypatch, {"muon": 2.0})["runs"])
    path = tmp_path / "out" / "tokens-runs.jsonl"
    whole = path.read_text()
    last = whole.splitlines()[-1]
    path.write_text(whole + last[: len(last) // 2])  # a writer killed mid-line
    fake = FakeTrainer(monkeypatch, {"muon": 2.0})
    r = run_bench(tmp_path, "--baseline-lrs", "1e-3", "3e-3", "2e-3")
    assert f"warning: {path} line {n + 1}: skipped" in capsys.readouterr().err
    assert r["runs_reused"] == n and fake.training_runs() == 4
    lines = path.read_text().splitlines()
    assert path.read_text().startswith(whole) and lines[n] == last[: len(last) // 2]
    assert len(lines) == n + 1 + 4 and all(json.loads(x)["run"] for x in lines[n + 1:])


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupted_bench_leaves_every_completed_run_in_the_cache(
        tmp_path: Path, monkeypatch, capsys, how: str) -> None:
    def stop() -> None:
        if how == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises in this thread
        raise KeyboardInterrupt

    FakeTrainer(monkeypatch, {"muon": 2.0}, stop_at=6, stop=stop)
    before = signal.getsignal(signal.SIGTERM)
    run_bench(tmp_path, code=130)
    assert len(cache_lines(tmp_path)) == 5
    assert "holds every completed run (5 of them run now)" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == before  # restored, not left raising
    fake = FakeTrainer(monkeypatch, {"muon": 2.0})
    r = run_bench(tmp_path)
    assert r["runs_reused"] == 5 and fake.training_runs() == len(r["runs"]) - 5


def test_time_ratio_comes_from_the_step_times_measured_side_by_side(
        tmp_path: Path, monkeypatch) -> None:
    fake = FakeTrainer(monkeypatch, {"muon": 2.0})
    r = run_bench(tmp_path, "--timing-repeats", "3")
    timed = [f for f in fake.calls if f[f.index("--val-every") + 1] == "0"]
    # 3 recipes x 3 repeats, each first in turn, all at --timing-steps, logged every step
    assert len(timed) == 9 and all(f[f.index("--max-steps") + 1] == "8"
                                   and f[f.index("--log-every") + 1] == "1" for f in timed)
    muon = ["muon" in f for f in timed]
    assert muon == [False, True, True, True, True, False, True, False, True]
    t = r["timing"]["recipes"]
    # warm-up (500 ms) left out; repeats at 1, 1.1, 1.2 x the step time: median 1.1 x
    assert t["gpt2"]["median_step_s"] == pytest.approx(0.011)
    assert (t["new"]["min_step_s"], t["new"]["max_step_s"]) == pytest.approx((0.02, 0.024))
    best = r["best"]
    steps_to_target = best["tokens_to_target"] / 128
    assert best["seconds_to_target"] == pytest.approx(steps_to_target * 0.022)
    assert best["time_ratio"] == pytest.approx(64 * 0.011 / (steps_to_target * 0.022))
    per_seed = [64 * 0.011 / (t / 128 * 0.022) for t in best["tokens_to_target_per_seed"]]
    assert best["time_ratio_per_seed"]["values"] == pytest.approx(per_seed)
    assert best["time_ratio_range"] == pytest.approx(
        [64 * 0.010 / (steps_to_target * 0.024), 64 * 0.012 / (steps_to_target * 0.020)])
    md = (tmp_path / "out" / "tokens.md").read_text()
    assert "| new | 22.0 | 20.0 | 24.0 |" in md


def test_no_timing_phase_with_zero_repeats(tmp_path: Path, monkeypatch) -> None:
    fake = FakeTrainer(monkeypatch, {"muon": 2.0})
    r = run_bench(tmp_path, "--timing-repeats", "0")
    assert fake.training_runs() == len(fake.calls) and r["timing"] is None
    assert r["best"]["time_ratio"] is None and r["best"]["time_ratio_from_run_times"] > 1
    assert "No timing phase" in (tmp_path / "out" / "tokens.md").read_text()


@pytest.mark.parametrize("flag, value", [("--timing-steps", "5"), ("--timing-repeats", "-1")])
def test_bad_timing_flags_are_one_line_errors(tmp_path: Path, monkeypatch, capsys, flag: str,
                                              value: str) -> None:
    FakeTrainer(monkeypatch, {})
    run_bench(tmp_path, flag, value, code=1)
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag} {value}: must be") and err.count("\n") == 1


def test_jobs_train_a_points_seeds_at_once_and_report_the_same(tmp_path: Path, monkeypatch) -> None:
    speed = {"muon": 2.0, "untied_head": 0.75}
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = bench(tmp_path / "one", monkeypatch, speed)
    fake = FakeTrainer(monkeypatch, speed)
    active, most, lock = [0], [0], threading.Lock()
    plain = fake.run_trainer

    def slow(flags, what, on_start=None) -> float:  # long enough for the seeds to overlap
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return plain(flags, what)

    for module in (tokens_runner, tokens_timing):
        monkeypatch.setattr(module, "run_trainer", slow)
    two = run_bench(tmp_path / "two", "--jobs", "2")
    assert most[0] == 2
    # the points complete in another order; the report lists them in the same
    strip = lambda r: [(p["label"], p["steps"], p["lr"], p["final_val_loss"]) for p in r["points"]]  # noqa: E731
    assert strip(two) == strip(one) and two["best"]["tokens_ratio"] == one["best"]["tokens_ratio"]
    assert sorted(r["seed"] for r in two["runs"]) == sorted(r["seed"] for r in one["runs"])


def test_jobs_fill_every_slot_from_the_points_that_wait_on_nothing(tmp_path: Path,
                                                                  monkeypatch) -> None:
    """3 seeds on 2 slots: the third seed of a point shares the slots with another point's
    runs (the new recipe's and the tied head's budgets are asked for together), and no
    more than --jobs runs ever go on at once."""
    fake = FakeTrainer(monkeypatch, {"muon": 2.0, "untied_head": 0.75})
    live: list[str] = []
    most, mixed, lock = [0], [False], threading.Lock()
    plain = fake.run_trainer

    def slow(flags, what, on_start=None) -> float:
        point = what.rsplit(", seed", 1)[0]
        with lock:
            live.append(point)
            most[0] = max(most[0], len(live))
            mixed[0] |= len(set(live)) > 1
        time.sleep(0.05)
        with lock:
            live.remove(point)
        return plain(flags, what)

    for module in (tokens_runner, tokens_timing):
        monkeypatch.setattr(module, "run_trainer", slow)
    r = run_bench(tmp_path, "--jobs", "2", "--seeds", "3", "--ablation", "--parts", "rotary")
    assert most[0] == 2 and mixed[0]
    assert len(r["runs"]) == 3 * len(r["points"]) == len(fake.calls) - 9  # 9 timing runs


def test_cached_only_reports_what_the_cache_holds_and_trains_nothing(
        tmp_path: Path, monkeypatch, capsys) -> None:
    """A bench of many invocations shows its progress: the ablation's variants whose runs are
    all in the cache get their row, the others 'not yet run', in tokens-cached.json/.md;
    the complete report's files stay as they were."""
    speed = {"muon": 2.0, "rotary": 0.5}
    done = bench(tmp_path, monkeypatch, speed, "--ablation", "--parts", "rotary")
    complete = (tmp_path / "out" / "tokens.json").read_bytes()
    fake = FakeTrainer(monkeypatch, speed)
    r = run_bench(tmp_path, "--ablation", "--parts", "rotary", "relu2", "--cached-only",
                  "--jobs", "2", report="tokens-cached")
    assert fake.calls == []  # no run, no timing phase
    assert (tmp_path / "out" / "tokens.json").read_bytes() == complete
    rows = {a["variant"]: a for a in r["ablation"]}
    assert rows["new - rotary"]["tokens_ratio"] == done["ablation"][1]["tokens_ratio"]
    assert rows["gpt2 + relu2"]["not_yet_run"] == "gpt2 + relu2 (64 steps, lr 0.001, seed 1337)"
    assert r["timing"] is None and r["best"]["tokens_ratio"] == done["best"]["tokens_ratio"]
    md = (tmp_path / "out" / "tokens-cached.md").read_text()
    assert "| new - relu2 | 3.23M | not yet run (first missing: new - relu2 (64 steps" in md
    assert "--cached-only" in md  # the command, at the top
    # without the runs the target needs: one line, and nothing written
    capsys.readouterr()  # what the benches above printed
    FakeTrainer(monkeypatch, speed)
    (tmp_path / "empty").mkdir()
    run_bench(tmp_path / "empty", "--cached-only", code=1)
    err = capsys.readouterr().err
    assert err.startswith("error: --cached-only: ") and "holds no run of gpt2 cosine" in err
    assert err.count("\n") == 1 and not (tmp_path / "empty" / "out" / "tokens-cached.json").exists()


@pytest.mark.parametrize("flag, value", [("--jobs", "0"), ("--max-lr-extensions", "-1")])
def test_jobs_and_extensions_out_of_range_are_one_line_errors(tmp_path: Path, monkeypatch, capsys,
                                                              flag: str, value: str) -> None:
    FakeTrainer(monkeypatch, {})
    run_bench(tmp_path, flag, value, code=1)
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag} {value}: must be >=") and err.count("\n") == 1


def test_ctrl_c_with_jobs_kills_the_runs_going_on(tmp_path: Path, monkeypatch, capsys) -> None:
    """One seed's run is a real process (a sleep in a group of its own, as run_group starts
    them) when the other is interrupted: it is killed, not waited for."""
    fake = FakeTrainer(monkeypatch, {})
    sleeper: list[subprocess.Popen] = []

    def trainer(flags, what, on_start=None) -> float:
        if flags[flags.index("--seed") + 1] == "1337":
            proc = subprocess.Popen(["sleep", "60"], **runs.GROUP)
            sleeper.append(proc)
            on_start(proc.pid)
            proc.wait()
            raise UserError(f"{what} failed: killed")
        time.sleep(0.2)  # the sleeper has started
        raise KeyboardInterrupt

    for module in (tokens_runner, tokens_timing):
        monkeypatch.setattr(module, "run_trainer", trainer)
    started = time.perf_counter()
    run_bench(tmp_path, "--jobs", "2", code=130)
    assert time.perf_counter() - started < 30 and sleeper[0].poll() is not None
    assert "interrupted" in capsys.readouterr().err and fake.calls == []


def test_a_best_learning_rate_at_the_sweeps_edge_is_bracketed(tmp_path: Path, monkeypatch) -> None:
    # GPT-2 does best at --max-lr 5e-4, below the sweep (1e-3, 3e-3); the new recipe at
    # scale 2 (AdamW 1.2e-2), above its sweep (0.5, 1)
    FakeTrainer(monkeypatch, {"muon": 2.0}, best_lr={"gpt2": 5e-4, "muon": 1.2e-2})
    r = run_bench(tmp_path, "--new-lr-scales", "0.5", "1")
    tried = {(p["label"], p["lr"]) for p in r["points"] if p["steps"] == 64}
    assert {("gpt2 cosine", 5e-4), ("gpt2 cosine", 2.5e-4)} <= tried  # halved twice
    assert r["baseline"]["lr"] == 5e-4 and r["baseline_lr_bracketed"]
    assert {("new", 2.0), ("new", 4.0)} <= tried and r["new_best_lr_scale"] == 2.0
    assert r["new_lr_scale_bracketed"]
    assert "has a worse one on each side" in (tmp_path / "out" / "tokens.md").read_text()
    # one extension allowed: the GPT-2 rate stops at the edge, and the report says so
    FakeTrainer(monkeypatch, {"muon": 2.0}, best_lr={"gpt2": 2e-4})
    (tmp_path / "again").mkdir()
    r = run_bench(tmp_path / "again", "--max-lr-extensions", "1", "--no-reuse")
    assert r["baseline"]["lr"] == 5e-4 and not r["baseline_lr_bracketed"]
    assert "not bracketed" in (tmp_path / "again" / "out" / "tokens.md").read_text()
