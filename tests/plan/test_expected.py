"""What the dry run says a run will take: its tokens, its time only where the GPU bench
measured the recipe on such a GPU, and its disk (checked against real files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpt.core.cli import parse_args
from gpt.plan import expected

from helpers import QUIET, REPO, TINY, run_cli, write_random_shards

RECIPE = ["--config", str(REPO / "configs" / "gpt2-124m.toml")]
H100 = "NVIDIA H100 80GB HBM3"
CUDA = torch.device("cuda")  # a device object only: nothing runs on it


def test_the_124m_recipe_on_one_h100_takes_the_measured_time() -> None:
    cfg = parse_args(RECIPE)
    lines = expected.lines(cfg, CUDA, H100, world=1)
    assert lines[0] == "expect:     10.00B tokens (19,073 steps x 524,288)"
    # 19,073 x 524,288 tokens at 493,276 tokens/s: 20,272 s
    assert lines[1].startswith("            time: about 5h37m52s of training at the 493,276 "
                               "tokens/s the GPU bench measured on one NVIDIA H100 80GB HBM3 at "
                               "micro-batch 64 (benchmarks/gpu/2026-11-27-h100/call1-gpu_stage1.json")
    assert "evaluation and checkpoints come on top" in lines[1]
    smaller = expected.lines(parse_args([*RECIPE, "--batch-size", "32"]), CUDA, H100, world=1)[1]
    assert "at the 488,566 tokens/s" in smaller and "micro-batch 32" in smaller


@pytest.mark.parametrize("case", ["8 gpus", "other gpu", "chunked", "fp8", "cpu", "xl"])
def test_anything_the_gpu_bench_did_not_measure_is_not_given_its_time(case: str) -> None:
    flags, device, gpu, world = [], CUDA, H100, 1
    if case == "8 gpus":
        world = 8
    elif case == "other gpu":
        gpu = "NVIDIA A100-SXM4-80GB"
    elif case == "chunked":
        flags = ["--chunked-loss"]
    elif case == "fp8":
        flags = ["--fp8", "tensorwise"]
    elif case == "cpu":
        device, gpu = torch.device("cpu"), "AMD EPYC"
    elif case == "xl":
        flags = ["--model", "gpt2-xl"]
    line = expected.lines(parse_args([*RECIPE, *flags]), device, gpu, world)[1]
    assert line.startswith("            time: not timed on "), line  # no timing given
    assert "tokens/s" not in line


def test_every_measured_figure_is_the_one_its_file_records() -> None:
    for m in expected.MEASURED:
        record = json.loads((REPO / m.source).read_text())
        assert record["env"]["device"] == m.gpu
        figures = [c["result"]["tokens_per_s_median"] for c in record["cells"]
                   if c.get("params", {}).get("batch_size") == m.batch_size
                   and c["name"].startswith("ours-") and c.get("result")
                   and c["params"].get("loss") in ("default", "unchunked")
                   and "--chunked-loss" not in c["params"]["trainer_argv"]]
        assert any(round(f) == m.tokens_per_s for f in figures), (m, figures)
        assert m.conditions.startswith("torch 2.11") and record["env"]["torch"].startswith("2.11")
        assert record["env"]["commit"].startswith(m.conditions.split("commit ")[1])


def test_the_checkpoint_size_is_what_a_run_writes(four_step_run: Path) -> None:
    """The estimate (12 bytes a parameter with AdamW) against a real checkpoint of a tiny
    run: the rest of the file (loader, RNG, config, zip headers) is well under 1%."""
    cfg = parse_args(["--config", str(four_step_run / "config.toml")])
    real = (four_step_run / "ckpt_000004.pt").stat().st_size
    assert expected.checkpoint_bytes(cfg) == pytest.approx(real, rel=0.01)
    # GPT-2 124M: 124,475,904 parameters (the wpe rows included), as the GPU bench counted
    assert expected.checkpoint_bytes(parse_args(RECIPE)) == 124_475_904 * 12
    muon = parse_args([*RECIPE, "--optimizer", "muon"])
    assert expected.checkpoint_bytes(muon) < 124_475_904 * 12


def test_disk_names_the_data_the_checkpoints_and_free_space(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "train_000000.bin").write_bytes(b"\0" * 2_500_000)
    cfg = parse_args([*RECIPE, "--data-dir", str(data), "--out-dir", str(tmp_path / "run")])
    disk = expected.lines(cfg, CUDA, H100, 1)[2]
    # 19,073 steps, a checkpoint every 1,000: 20 saves; 3 kept + the one written (no val_*
    # shards: no validation, so no best is kept beside them)
    assert disk.startswith(f"            disk: {data} holds 2.5 MB; {tmp_path / 'run'} needs "
                           f"about 6.0 GB for up to 4 checkpoint(s) of 1.5 GB at once "
                           f"(--keep-checkpoints 3, the one being written)")
    (data / "val_000000.bin").write_bytes(b"\0" * 2048)  # + the best
    assert "about 7.5 GB for up to 5 checkpoint(s) of 1.5 GB at once (--keep-checkpoints 3, " \
        "the best, the one being written)" in expected.lines(cfg, CUDA, H100, 1)[2]
    assert disk.endswith(" free there")
    none = parse_args([*RECIPE, "--no-save-checkpoints", "--data-dir", str(tmp_path / "none")])
    assert "does not exist yet" in expected.lines(none, CUDA, H100, 1)[2]
    assert "no checkpoints (--no-save-checkpoints)" in expected.lines(none, CUDA, H100, 1)[2]
    assert expected.checkpoints_at_once(parse_args([*RECIPE, "--max-steps", "1500"])) == 2


@pytest.mark.slow
def test_a_run_without_validation_is_counted_without_a_best(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_launch_env) -> None:
    """--keep-checkpoints 1 --val-every 0: the newest and the one being written, at most 2
    at once (no best is ever kept without validation); room for 2 is room enough, and the
    run keeps no more than that."""
    (tmp_path / "data").mkdir()
    data = write_random_shards(tmp_path / "data", seed=0, train=(10_000,), val=(2_000,))
    out = tmp_path / "run"
    flags = [*TINY, *QUIET, "--max-steps", "6", "--checkpoint-every", "2",
             "--keep-checkpoints", "1", "--data-dir", str(data), "--out-dir", str(out)]
    assert expected.checkpoints_at_once(parse_args(flags)) == 2
    with_val = parse_args([*flags, "--val-every", "2"])
    assert expected.checkpoints_at_once(with_val) == 3  # + the best
    each = expected.checkpoint_bytes(parse_args(flags))
    monkeypatch.setattr(expected, "free_bytes", lambda folder: 2 * each)
    expected.check_disk(parse_args(flags))
    with pytest.raises(expected.ConfigError, match="up to 3 checkpoint"):
        expected.check_disk(with_val)
    proc = run_cli(*flags)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in out.glob("ckpt_*.pt")] == ["ckpt_000006.pt"]


def test_a_resume_is_expected_to_train_and_keep_what_is_left(tmp_path: Path) -> None:
    cfg = parse_args([*RECIPE, "--max-steps", "3000", "--out-dir", str(tmp_path / "run")])
    fresh, resumed = (expected.lines(cfg, CUDA, H100, 1, start_step=s) for s in (0, 2500))
    assert fresh[0] == "expect:     1.57B tokens (3,000 steps x 524,288)"
    assert resumed[0] == "expect:     262.14M tokens (500 steps x 524,288, steps 2,500 to 3,000)"
    # 3,000 x 524,288 tokens at 493,276 tokens/s, and the last 500 steps of them
    assert "time: about 53m08s of training" in fresh[1]
    assert "time: about 8m51s of training" in resumed[1]
    # saves at 1,000, 2,000 and 3,000 from the start; from step 2,500, only 3,000's
    assert expected.checkpoints_at_once(cfg) == 3
    assert expected.checkpoints_at_once(cfg, 2500) == 1
    assert expected.checkpoints_at_once(cfg, 3000) == 0  # nothing left to train


def test_a_shortfall_of_disk_stops_the_run_and_its_dry_run_alike(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_launch_env) -> None:
    """Checkpoints that will not fit the free space are a problem before anything is
    written, named once by the dry run and by the run: --out-dir, the need, the space."""
    (tmp_path / "data").mkdir()
    data = write_random_shards(tmp_path / "data", seed=0, train=(10_000,))
    out = tmp_path / "run"
    flags = [*TINY, *QUIET, "--max-steps", "4", "--checkpoint-every", "2",
             "--data-dir", str(data), "--out-dir", str(out)]
    each = expected.checkpoint_bytes(parse_args(flags))
    monkeypatch.setattr(expected, "free_bytes", lambda folder: each)  # room for one of two
    line = (f"--out-dir {out}: the run needs about {expected.human_bytes(2 * each)} of disk "
            f"for up to 2 checkpoint(s) of {expected.human_bytes(each)} at once and "
            f"{expected.human_bytes(each)} is free there")
    dry = run_cli(*flags, "--dry-run")
    assert dry.returncode != 0 and f"error: {line}" in dry.stderr
    assert "the run would not start" in dry.stderr and "would start" not in dry.stdout
    run = run_cli(*flags)
    assert run.returncode != 0 and run.stderr.strip() == f"error: {line}: free some space, " \
        "name a folder on a larger disk, lower --keep-checkpoints, or pass --no-save-checkpoints"
    assert not out.exists()  # refused before the run folder was made
    ok = run_cli(*flags, "--no-save-checkpoints", "--dry-run")  # nothing to keep: no need
    assert ok.returncode == 0, ok.stderr
    # what the folder holds already (a resume's checkpoints) is on the disk: only the rest
    out.mkdir()
    with open(out / "ckpt_000002.pt", "wb") as fh:
        fh.truncate(each)  # sparse: its size counts, not its blocks
    assert expected.disk_needed(parse_args(flags)) == (each, 2, each)
    expected.check_disk(parse_args(flags))  # one more fits the free space
