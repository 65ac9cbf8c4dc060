"""The layout a run chooses when the user leaves it to the trainer (gpt/plan/layout.py:
--parallel auto, --activation-checkpointing auto, --batch-size auto) and selective
activation checkpointing (gpt/engine/recompute.py): the flags and their old spellings, the
chooser's decisions from planned peaks (a stand-in planner with a made-up device memory,
and the real planner), the values recorded and honoured on resume, the dry run's line,
and one-line errors when nothing fits."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest
import torch

from helpers import QUIET, TINY, read_metrics, run_cli
from gpt.checkpoint.files import load, resume_point
from gpt.core.cli import parse_args
from gpt.core.config import Config, ConfigError
from gpt.core.config_io import from_dict, to_dict
from gpt.engine import parallel
from gpt.model.transformer import GPT
from gpt.plan import layout, memory
from gpt.plan.memory import MemoryPlan

GiB = 2**30
AUTO = ["--parallel", "auto", "--activation-checkpointing", "auto", "--batch-size", "auto"]


# ---- the flags


def test_the_defaults_stay_the_gpt2_recipe_and_auto_is_opt_in() -> None:
    cfg = parse_args([])
    assert (cfg.train.parallel, cfg.train.activation_checkpointing, cfg.data.batch_size) == \
        ("ddp", "none", 64)
    assert layout.unsettled(cfg) == []
    assert layout.unsettled(parse_args(AUTO)) == ["parallel", "activation_checkpointing",
                                                   "batch_size"]


@pytest.mark.parametrize("argv, want", [
    (["--activation-checkpointing"], "blocks"),  # the switch it was: whole blocks
    (["--no-activation-checkpointing"], "none"),
    (["--activation-checkpointing", "selective"], "selective"),
    (["--activation-checkpointing=auto"], "auto"),
    (["--activation-checkpointing", "--batch-size", "8"], "blocks"),  # a flag is not a value
])
def test_activation_checkpointing_takes_values_and_its_old_switch(argv, want) -> None:
    assert parse_args(argv).train.activation_checkpointing == want


@pytest.mark.parametrize("text, want", [("true", "blocks"), ("false", "none"),
                                        ('"selective"', "selective"), ('"auto"', "auto")])
def test_a_config_file_may_spell_it_as_before(tmp_path: Path, text: str, want: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"[train]\nactivation_checkpointing = {text}\n[data]\nbatch_size = \"auto\"\n")
    cfg = parse_args(["--config", str(path)])
    assert cfg.train.activation_checkpointing == want and cfg.data.batch_size == "auto"


def test_a_checkpoint_written_with_the_switch_reads_as_its_value() -> None:
    saved = to_dict(Config())
    del saved["train"]["fp8"], saved["train"]["fp8_head"]  # schema 2 had neither
    saved["train"]["activation_checkpointing"] = True
    assert from_dict(saved, schema=2).train.activation_checkpointing == "blocks"
    saved["train"]["activation_checkpointing"] = False
    assert from_dict(saved, schema=2).train.activation_checkpointing == "none"


@pytest.mark.parametrize("argv, words", [
    (["--batch-size", "most"], "'most' is neither an int nor auto"),
    (["--activation-checkpointing", "all"], "invalid choice: 'all'"),
    (["--parallel", "tp"], "invalid choice: 'tp'"),
])
def test_bad_layout_values_are_one_line(capsys, argv, words) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and words in err and "Traceback" not in err


def test_a_bad_batch_word_in_a_file_is_named(capsys, tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[data]\nbatch_size = "max"\n')
    with pytest.raises(SystemExit):
        parse_args(["--config", str(path)])
    assert "batch_size = 'max' must be int or \"auto\"" in capsys.readouterr().err


# ---- the chooser, against a stand-in planner


class Planner:
    """Peak bytes = fixed + per_sample x batch, per (parallel, checkpointing), in GiB; it
    records each layout it planned."""

    def __init__(self, fixed: dict[str, float], per_sample: dict[str, float]) -> None:
        self.fixed, self.per_sample, self.calls = fixed, per_sample, []

    def __call__(self, cfg: Config, world: int, device_type: str) -> MemoryPlan:
        t, b = cfg.train, cfg.data.batch_size
        self.calls.append((t.parallel, t.activation_checkpointing, b))
        peak = (self.fixed[t.parallel] + self.per_sample[t.activation_checkpointing] * b) * GiB
        return MemoryPlan(int(peak), {"activations": int(peak)}, 0, {})


def usable(gib: float) -> int:
    """A device's memory such that a plan of `gib` GiB just fits (fits()'s margin)."""
    return int(gib * GiB * memory.MARGIN + memory.RESERVE) + 1


SMALL = ["--model", "tiny", "--seq-len", "64", "--block-size", "64",
         "--total-batch-tokens", str(64 * 64)]  # 64 sequences a step


def settle(argv: list[str], planner: Planner, capacity: int, world: int = 1, **kw):
    return layout.settle(parse_args([*SMALL, *argv]), world, "cuda", capacity,
                         distributed=world > 1, planner=planner, **kw)


def test_one_process_never_shards_and_takes_the_largest_batch_that_fits() -> None:
    planner = Planner({"ddp": 10}, {"none": 1.0, "selective": 0.7, "blocks": 0.2})
    cfg, choice = settle(AUTO, planner, usable(10 + 20))  # room for 20 samples without AC
    assert (cfg.train.parallel, cfg.train.activation_checkpointing, cfg.data.batch_size) == \
        ("ddp", "none", 16)  # 32 would not fit; 16 is the largest divisor of 64 that does
    assert choice.source == "planned" and choice.plan.peak_bytes == 26 * GiB
    assert {c[0] for c in planner.calls} == {"ddp"}
    assert "one process: no FSDP" in choice.line() and "micro-batch 16" in choice.line()
    assert len(planner.calls) <= 4  # two plans give the line, then its estimate is checked


def test_recomputation_comes_in_only_where_none_does_not_fit() -> None:
    planner = Planner({"ddp": 10}, {"none": 1.0, "selective": 0.5, "blocks": 0.1})
    _, choice = settle(AUTO, planner, usable(10.8))  # none needs 11 at batch 1
    assert (choice.activation_checkpointing, choice.batch_size) == ("selective", 1)
    _, choice = settle(AUTO, planner, usable(10.3))
    assert (choice.activation_checkpointing, choice.batch_size) == ("blocks", 2)
    assert "did not fit: ddp/none" in choice.line()


def test_several_processes_shard_as_little_as_fits() -> None:
    planner = Planner({"ddp": 30, "zero1": 15, "fsdp": 5},
                      {"none": 1.0, "selective": 0.5, "blocks": 0.1})
    _, choice = settle(AUTO, planner, usable(20), world=8)
    assert (choice.parallel, choice.activation_checkpointing) == ("zero1", "none")
    assert choice.batch_size == 4  # 8 sequences per process: 4 fits, 8 does not
    _, choice = settle(AUTO, planner, usable(12), world=8)
    assert (choice.parallel, choice.activation_checkpointing) == ("fsdp", "none")
    # Muon needs whole matrices: never fsdp
    _, choice = settle([*AUTO, "--optimizer", "muon"], planner, usable(15.5), world=8)
    assert (choice.parallel, choice.activation_checkpointing) == ("zero1", "selective")


def test_a_named_value_is_kept_and_the_rest_fitted_around_it() -> None:
    planner = Planner({"ddp": 10, "fsdp": 2}, {"none": 1.0, "selective": 0.5, "blocks": 0.1})
    cfg, choice = settle(["--batch-size", "8", "--activation-checkpointing", "auto"], planner,
                         usable(15))
    assert (cfg.data.batch_size, cfg.train.activation_checkpointing) == (8, "selective")
    assert choice.decided == ("activation_checkpointing",)
    cfg, _ = settle(["--parallel", "fsdp", "--batch-size", "auto"], planner, usable(20), world=2)
    assert (cfg.train.parallel, cfg.train.activation_checkpointing, cfg.data.batch_size) == \
        ("fsdp", "none", 16)


def test_nothing_that_fits_is_one_line_naming_the_values() -> None:
    planner = Planner({"ddp": 10}, {"none": 1.0, "selective": 0.5, "blocks": 0.1})
    with pytest.raises(ConfigError) as exc:
        settle(AUTO, planner, usable(9))
    text = str(exc.value)
    assert "\n" not in text and "no layout fits" in text
    assert "ddp/blocks at --batch-size 1: 10.1 GiB planned" in text


def test_a_model_whose_state_alone_is_too_big_is_not_even_planned() -> None:
    planner = Planner({"ddp": 10}, {"none": 1.0, "selective": 0.5, "blocks": 0.1})
    with pytest.raises(ConfigError, match="weights, gradients and optimizer state alone"):
        settle(AUTO, planner, 10**6)
    assert planner.calls == []


def test_batch_auto_needs_a_step_that_whole_sequences_divide() -> None:
    planner = Planner({"ddp": 1}, {"none": 1.0, "selective": 0.5, "blocks": 0.1})
    with pytest.raises(ConfigError, match="not a multiple of --seq-len 64 x 2 process"):
        settle(["--batch-size", "auto", "--total-batch-tokens", str(64 * 3)], planner,
               usable(100), world=2)


def test_the_batch_search_agrees_with_trying_every_divisor() -> None:
    for room in (1.5, 7.9, 8.0, 30, 63.9, 64, 500):
        planner = Planner({"ddp": 0}, {"none": 1.0, "selective": 1.0, "blocks": 1.0})
        cfg, _ = settle(["--batch-size", "auto"], planner, usable(room))
        assert cfg.data.batch_size == max(b for b in (1, 2, 4, 8, 16, 32, 64) if b <= room)


def test_a_resume_takes_the_checkpoints_values_without_planning() -> None:
    planner = Planner({"ddp": 10}, {"none": 1.0, "selective": 0.5, "blocks": 0.1})
    saved = to_dict(parse_args([*SMALL, "--activation-checkpointing", "selective",
                                "--batch-size", "4"]))
    cfg, choice = settle(AUTO, planner, usable(1000), saved=saved)
    assert (cfg.train.parallel, cfg.train.activation_checkpointing, cfg.data.batch_size) == \
        ("ddp", "selective", 4)
    assert choice.source == "checkpoint" and planner.calls == []
    assert "as the checkpoint resumed from chose" in choice.line()
    # ... unless they cannot run here: zero1 in one process is chosen again
    saved["train"]["parallel"] = "zero1"
    _, choice = settle(AUTO, planner, usable(1000), saved=saved)
    assert choice.source == "planned" and choice.parallel == "ddp"


def test_the_settled_config_passes_the_same_validation_as_flags() -> None:
    planner = Planner({"ddp": 10}, {"none": 1.0, "selective": 0.5, "blocks": 0.1})
    cfg, _ = settle(AUTO, planner, usable(20))
    from gpt.core.cli import to_toml
    text = to_toml(cfg)
    assert 'parallel = "ddp"' in text and "batch_size = 8" in text
    assert from_dict(to_dict(cfg)) == cfg


# ---- the chooser, against the real planner


@pytest.mark.slow
def test_the_real_planner_picks_selective_between_none_and_blocks() -> None:
    cfg = parse_args([*SMALL, "--n-layer", "4", "--n-embd", "128", "--n-head", "4",
                      "--vocab-size", "512", "--dtype", "bf16", "--batch-size", "8"])
    peaks = {ac: memory.plan(dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, activation_checkpointing=ac)), device_type="cpu").peak_bytes
        for ac in ("none", "selective", "blocks")}
    assert peaks["blocks"] < peaks["selective"] < peaks["none"]
    between = int((peaks["selective"] + peaks["none"]) / 2 * memory.MARGIN + memory.RESERVE)
    auto = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train,
                                                              activation_checkpointing="auto"))
    settled, choice = layout.settle(auto, 1, "cpu", between)
    assert settled.train.activation_checkpointing == "selective"
    assert choice.plan.peak_bytes == peaks["selective"]


@pytest.mark.slow
def test_gpt2_124m_on_an_80gb_gpu_needs_no_checkpointing_and_a_large_batch() -> None:
    cfg, choice = layout.settle(parse_args(AUTO), 1, "cuda", memory.CAPACITIES["80GB"])
    assert (cfg.train.parallel, cfg.train.activation_checkpointing) == ("ddp", "none")
    assert cfg.data.batch_size >= 64 and choice.plan.fits(memory.CAPACITIES["80GB"])
    assert not memory.plan(dataclasses.replace(cfg, data=dataclasses.replace(
        cfg.data, batch_size=cfg.data.batch_size * 2))).fits(memory.CAPACITIES["80GB"])


@pytest.mark.slow
def test_gpt2_xl_on_one_80gb_gpu_runs_without_fsdp_or_checkpointing() -> None:
    from helpers import REPO

    # The recipe's layout at the acceptance run's micro-batch: one plan (the batch search,
    # four plans of XL, is the 124M test's and the stand-in planner's)
    argv = ["--config", str(REPO / "configs" / "gpt2-xl.toml"), "--batch-size", "8"]
    cfg, choice = layout.settle(parse_args(argv), 1, "cuda", memory.CAPACITIES["80GB"])
    assert (cfg.train.parallel, cfg.train.activation_checkpointing) == ("ddp", "none")
    assert "one process: no FSDP" in choice.line() and choice.plan.fits(memory.CAPACITIES["80GB"])


# ---- selective activation checkpointing


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_selective_checkpointing_gives_the_loss_and_gradients_of_none(dtype) -> None:
    cfg = parse_args(["--model", "tiny", "--n-layer", "3", "--vocab-size", "512",
                      "--block-size", "64", "--seq-len", "64", "--dropout", "0.1"]).model
    x = torch.randint(0, 512, (4, 64), generator=torch.Generator().manual_seed(1))
    grads = {}
    for mode in ("none", "selective", "blocks"):
        torch.manual_seed(0)
        model = GPT(cfg)
        parallel.apply_activation_checkpointing(model, mode)
        torch.manual_seed(5)  # dropout's draws: the recomputation must see the same ones
        with torch.autocast("cpu", dtype, enabled=dtype != torch.float32):
            _, loss = model(x, x)
        loss.backward()
        grads[mode] = (loss.item(), [p.grad.clone() for p in model.parameters()])
    for mode in ("selective", "blocks"):
        assert grads[mode][0] == grads["none"][0]
        assert all(torch.equal(a, b) for a, b in zip(grads[mode][1], grads["none"][1]))


def test_an_unknown_checkpointing_mode_is_refused() -> None:
    model = GPT(parse_args(["--model", "tiny"]).model)
    with pytest.raises(ValueError, match="auto is settled before"):
        parallel.apply_activation_checkpointing(model, "auto")


# ---- the trainer and the dry run


@pytest.mark.slow
def test_the_dry_run_prints_the_choice(data_dir: Path, tmp_path: Path) -> None:
    proc = run_cli(*TINY, *QUIET, *AUTO, "--data-dir", str(data_dir), "--dry-run",
                   "--out-dir", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("layout (auto):"))
    assert "--parallel ddp, --activation-checkpointing none, --batch-size 8" in line
    assert "planned peak" in line
    assert "dry run: the run would start" in proc.stdout


@pytest.mark.slow
def test_a_run_records_the_values_it_chose_and_a_resume_keeps_them(
        data_dir: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    from gpt.entry import train_main as main

    out = tmp_path / "run"
    args = [*TINY, *QUIET, *AUTO, "--data-dir", str(data_dir), "--out-dir", str(out),
            "--max-steps", "4"]
    assert main([*args, "--stop-at-step", "2"]) == 0
    assert "layout (auto): --parallel ddp, --activation-checkpointing none, --batch-size 8" \
        in capsys.readouterr().out
    recipe = tomllib.loads((out / "config.toml").read_text())
    assert (recipe["train"]["parallel"], recipe["train"]["activation_checkpointing"],
            recipe["data"]["batch_size"]) == ("ddp", "none", 8)
    saved = load(out / "ckpt_000002.pt")["config"]
    assert (saved["train"]["parallel"], saved["data"]["batch_size"]) == ("ddp", 8)
    assert resume_point(out, "auto", verify=False).saved["data"]["batch_size"] == 8
    assert parse_args(["--config", str(out / "config.toml")]).data.batch_size == 8

    # The resume does not choose again: it runs the checkpoint's layout, planning nothing.
    monkeypatch.setattr(memory, "plan", lambda *a, **k: pytest.fail("planned again"))
    assert main([*args, "--resume", "auto"]) == 0
    out_text = capsys.readouterr().out
    assert "as the checkpoint resumed from chose" in out_text
    assert [r["step"] for r in read_metrics(out, "train")] == [0, 1, 2, 3]
    assert read_metrics(out, "run")[-1]["grad_accum"] == 1


@pytest.mark.slow
def test_a_run_with_nothing_that_fits_stops_in_one_line(data_dir: Path, tmp_path: Path,
                                                        monkeypatch, capsys) -> None:
    from gpt.entry import train_main as main
    from gpt.model import sizing

    monkeypatch.setattr(sizing, "device_memory", lambda device: 64 * 2**20)
    code = main([*TINY, *QUIET, *AUTO, "--data-dir", str(data_dir),
                 "--out-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "no layout fits" in err
    assert not (tmp_path / "run").exists()  # nothing was written


@pytest.mark.slow
def test_the_planners_command_settles_auto_values_for_the_memory_it_is_given(capsys) -> None:
    import json

    from gpt.bench.cli import main as bench_main

    small = [*SMALL, "--vocab-size", "512", "--device", "cpu"]
    assert bench_main(["memory", *small, *AUTO, "--capacity-gib", "1.5", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    chosen = report["layout"]
    assert (chosen["parallel"], chosen["activation_checkpointing"]) == ("ddp", "none")
    assert chosen["auto"] == ["parallel", "activation_checkpointing", "batch_size"]
    assert report["setup"]["batch_size"] == chosen["batch_size"] >= 1
    assert report["peak_bytes"] == chosen["planned_peak_bytes"]
    assert bench_main(["memory", *small, *AUTO, "--capacity-gib", "1.5"]) == 0
    assert capsys.readouterr().out.startswith("layout (auto): --parallel ddp")
