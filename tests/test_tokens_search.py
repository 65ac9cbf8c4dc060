"""python -m gpt.bench tokens (gpt/bench/tokens_search.py): seeds and spread, the bracketed
crossing, both GPT-2 schedules, the tied-head variant, time to target and the ablation.
The logic runs on a stand-in trainer (a loss that falls with steps, known per recipe);
one slow test runs the real trainer end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpt.bench import recipes, tokens_search
from gpt.bench.cli import main as bench_main
from helpers import write_random_shards

ARGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--seq-len", "64",
        "--batch-size", "2", "--total-batch-tokens", "128", "--val-every", "2", "--val-steps", "1"]


def stand_in(speed: dict[str, float]):
    """A Bench.train that 'trains' to loss 10 - speed * steps (speed per part, 1 for GPT-2;
    seed s adds 0.01 * s) in 0.01 s a step, recording what it was asked for."""
    def train(self, label, parts, steps, lr, seed):
        rate = 1.0 + sum(speed.get(p, 0.0) for p in parts)
        loss = 10.0 - 0.01 * rate * steps + 0.01 * (seed - self.args.seed)
        run = {"label": label, "seed": seed, "steps": steps, "lr": lr, "parts": parts,
               "curve": [[steps * self.args.total_batch_tokens, loss]], "final_val_loss": loss,
               "train_seconds": 0.01 * steps * (2 if "muon" in parts else 1),
               "wall_seconds": 1.0, "flags": recipes.flags(parts, steps, lr),
               "peak_mem_gb": 0.5 + 0.5 * ("untied_head" in parts)}
        self.runs.append(run)
        return run
    return train


def bench(tmp_path: Path, monkeypatch, speed: dict[str, float], *extra: str) -> dict:
    monkeypatch.setattr(tokens_search.Bench, "train", stand_in(speed))
    data = write_random_shards(tmp_path, seed=0, train=(30_000,), val=(4_000,))
    code = bench_main(["tokens", "--data-dir", str(data), "--out", str(tmp_path / "out"), *ARGS,
                       "--steps", "64", "--baseline-lrs", "1e-3", "3e-3", "--new-lr-scales", "1",
                       "--new-budgets", "0.5", "--seeds", "2", *extra])
    assert code == 0
    return json.loads((tmp_path / "out" / "tokens.json").read_text())


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
    # smallest budget asked for (32), so the bench halved it to 16, which ended above, and
    # interpolated between 16 and 32
    best = r["best"]
    steps = sorted(p["steps"] for p in best["points"])
    assert steps == [16, 32, 64] and best["how"].startswith("between the 2,048- and 4,096")
    assert best["tokens_to_target"] == pytest.approx(64 * 1.1 / 4.1 * 128, rel=0.02)
    assert best["tokens_ratio"] == pytest.approx(4.1 / 1.1, rel=0.02)
    assert best["tokens_ratio_per_seed"]["reached"] == "2/2"
    assert best["tokens_ratio_per_seed"]["std"] > 0  # the seeds differ
    # Muon's steps cost twice as much here: the time ratio is half the tokens ratio
    assert best["time_ratio"] == pytest.approx(best["tokens_ratio"] / 2, rel=0.02)
    tied = r["tied_head"]
    assert tied["tokens_ratio"] == pytest.approx(3.35 / 1.1, rel=0.02)
    assert all("--untied-head" not in run["flags"] for run in r["runs"]
               if run["label"] == "new, tied head")
    md = (tmp_path / "out" / "tokens.md").read_text()
    assert "tied head (equal parameters)" in md and "+-" in md
    assert (tmp_path / "out" / "tokens.png").exists()  # both best curves
    peaks = {p["label"]: p["peak_mem_gb"] for p in r["points"]}
    assert peaks["new"] == 1.0 and peaks["new, tied head"] == 0.5 and "peak GiB" in md


def test_the_ablation_adds_each_part_to_gpt2_and_takes_it_from_the_recipe(
        tmp_path: Path, monkeypatch) -> None:
    speed = {"muon": 2.0, "rotary": 0.5}
    r = bench(tmp_path, monkeypatch, speed, "--ablation", "--parts", "rotary", "relu2",
              "value_embeds")
    rows = {a["variant"]: a for a in r["ablation"]}
    assert set(rows) == {"gpt2 + rotary", "new - rotary", "gpt2 + relu2", "new - relu2",
                         "new + value_embeds", "gpt2 + value_embeds"}
    assert rows["gpt2 + rotary"]["tokens_ratio"] == pytest.approx(1.5, rel=0.02)
    assert rows["new - rotary"]["tokens_ratio"] == pytest.approx(3.0, rel=0.02)
    assert rows["gpt2 + relu2"]["tokens_ratio"] == pytest.approx(1.0, rel=0.02)
    assert rows["new + value_embeds"]["parts"] == [*recipes.NEW_PARTS, "value_embeds"]
    assert "gpt2 + rotary" in (tmp_path / "out" / "tokens.md").read_text()


@pytest.mark.slow
def test_the_command_trains_both_recipes_for_real(tmp_path: Path) -> None:
    """The real trainer, tiny and short: every point over 2 seeds, curves and times kept."""
    data = write_random_shards(tmp_path, seed=0, train=(30_000,), val=(4_000,))
    out = tmp_path / "out"
    code = bench_main(["tokens", "--data-dir", str(data), "--out", str(out), *ARGS, "--steps", "4",
                       "--baseline-lrs", "3e-3", "--new-lr-scales", "1", "--new-budgets", "0.5",
                       "--seeds", "2", "--max-halvings", "0", "--new-max-lr", "5e-3",
                       "--new-muon-lr", "0.03"])
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
    assert (out / "tokens.png").stat().st_size > 0
