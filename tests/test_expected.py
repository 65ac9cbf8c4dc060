"""What the dry run says a run will take: its tokens, its time only where the GPU bench
measured the recipe on such a GPU, and its disk (checked against real files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpt.plan import expected
from gpt.core.cli import parse_args

from helpers import REPO

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
def test_anything_not_measured_is_said_to_be_unmeasured(case: str) -> None:
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
    assert line.startswith("            time: not measured for this recipe on "), line
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
    # 19,073 steps, a checkpoint every 1,000: 20 saves; 3 kept + the best + the one written
    assert disk.startswith(f"            disk: {data} holds 2.5 MB; {tmp_path / 'run'} needs "
                           f"about 7.5 GB for up to 5 checkpoint(s) of 1.5 GB at once")
    assert disk.endswith(" free there")
    none = parse_args([*RECIPE, "--no-save-checkpoints", "--data-dir", str(tmp_path / "none")])
    assert "does not exist yet" in expected.lines(none, CUDA, H100, 1)[2]
    assert "no checkpoints (--no-save-checkpoints)" in expected.lines(none, CUDA, H100, 1)[2]
    assert expected.checkpoints_at_once(parse_args([*RECIPE, "--max-steps", "1500"])) == 2
