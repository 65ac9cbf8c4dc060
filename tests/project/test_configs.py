"""Every recipe in configs/ loads, validates and divides into whole micro-batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpt.core.cli import parse_args
from gpt.core.config_check import grad_accum_steps

from helpers import REPO

RECIPES = sorted((REPO / "configs").glob("*.toml"))


def test_the_recipes_are_there() -> None:
    names = {p.stem for p in RECIPES}
    assert {"gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-xl-fsdp", "gpt2-xl", "cpu-demo",
            "gpu-smoke", "gpt2-124m-speedrun", "cpu-speedrun"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_loads_and_validates(path: Path) -> None:
    cfg = parse_args(["--config", str(path)])  # exits 2 on an unknown key or a bad value
    d = cfg.data
    # One process, and the training recipes on 8 GPUs too, must split the batch exactly
    # (--batch-size auto: into whole sequences per process, which layout._batches divides).
    worlds = (1, 8) if path.stem.startswith("gpt2-") else (1,)
    for world in worlds:
        batch = 1 if d.batch_size == "auto" else d.batch_size
        assert grad_accum_steps(d.total_batch_tokens, batch, d.seq_len, world) >= 1
    assert cfg.train.out_dir.startswith("runs/")
    assert cfg.optim.warmup_steps < cfg.train.max_steps


def test_recipes_write_to_their_own_folders() -> None:
    outs = [parse_args(["--config", str(p)]).train.out_dir for p in RECIPES]
    assert len(set(outs)) == len(outs)


@pytest.mark.parametrize("name", ["cpu-speedrun", "gpt2-124m-speedrun"])
def test_the_speedrun_files_are_the_tokens_benchs_new_recipe(name: str) -> None:
    """The recipe a user runs is the one the bench measured: every field of
    gpt/bench/tokens/recipes.py's new recipe (the CPU file's length and learning rates too)."""
    from dataclasses import asdict

    from gpt.bench.tokens import recipes

    cfg = parse_args(["--config", str(REPO / "configs" / f"{name}.toml")])
    got = {**asdict(cfg.model), **asdict(cfg.optim)}
    want = recipes.fields(recipes.NEW_PARTS, cfg.train.max_steps)
    if name == "cpu-speedrun":  # the best scale measured at its own steps; 124M: its own rates
        report = json.loads((REPO / "benchmarks" / "first_run" / "lr-scale.json").read_text())
        want.update(recipes.lr_fields(recipes.NEW_PARTS, report["best_scale"]))
    else:
        del want["muon_momentum_warmup"]  # the speedrun's own 300 steps
    assert {k: got[k] for k in want} == want
    extra = {k for part in recipes.EXTRA_PARTS for k in recipes.PARTS[part]}
    assert all(got[k] == getattr(type(cfg.model)(), k) for k in extra & got.keys())


def test_the_xl_recipe_leaves_its_layout_to_the_trainer() -> None:
    """configs/gpt2-xl.toml names no layout: the planner fits one to the GPUs (its choice
    on one 80 GB GPU: tests/plan/test_layout.py); gpt2-xl-fsdp.toml is the same run with
    the layout named, and the two agree on everything else."""
    from dataclasses import replace

    from gpt.plan import layout

    auto = parse_args(["--config", str(REPO / "configs" / "gpt2-xl.toml")])
    named = parse_args(["--config", str(REPO / "configs" / "gpt2-xl-fsdp.toml")])
    assert layout.unsettled(auto) == ["parallel", "activation_checkpointing", "batch_size"]
    assert (named.train.parallel, named.train.activation_checkpointing) == ("fsdp", "blocks")
    assert replace(auto, train=replace(auto.train, parallel="fsdp",
                                       activation_checkpointing="blocks",
                                       out_dir=named.train.out_dir),
                   data=replace(auto.data, batch_size=16)) == named
