"""What a run wrote before the package's modules moved into stage folders (commit 1137a53,
tests/fixtures/run-1137a53/: a 1-layer model's checkpoint after 2 steps, its config.toml
and metrics.jsonl) still reads: a checkpoint names no module path (a plain dict of tensors,
loaded with weights_only), and a saved config names fields, not files."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from gpt.checkpoint.files import load
from gpt.core.cli import parse_args
from gpt.data.shards import write_shard
from gpt.report.metrics_reader import load_metrics
from helpers import REPO, run_cli

FIXTURE = REPO / "tests" / "fixtures" / "run-1137a53"


def old_data(folder: Path) -> Path:
    """The data the fixture's run trained on: token ids below its vocabulary of 64."""
    rng = np.random.default_rng(0)
    folder.mkdir()
    write_shard(folder / "train_000000.bin", rng.integers(0, 64, 4000))
    write_shard(folder / "val_000000.bin", rng.integers(0, 64, 2000))
    return folder


def test_a_checkpoint_from_before_resumes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    data = old_data(tmp_path / "data")
    proc = run_cli("--config", str(run / "config.toml"), "--data-dir", str(data),
                   "--out-dir", str(run), "--resume", "auto", "--max-steps", "3")
    assert proc.returncode == 0, proc.stderr
    assert f"resumed from {run / 'ckpt_000002.pt'} at step 2" in proc.stdout
    assert load(run / "ckpt_000003.pt")["step"] == 3


def test_its_saved_config_and_metrics_read_as_they_did() -> None:
    cfg = parse_args(["--config", str(FIXTURE / "config.toml")])
    assert (cfg.model.n_layer, cfg.model.n_embd, cfg.model.vocab_size) == (1, 16, 64)
    metrics = load_metrics(FIXTURE / "metrics.jsonl")
    assert metrics.steps("train") == [0, 1] and metrics.bad_lines == 0


def test_it_evaluates(tmp_path: Path, capsys) -> None:
    from gpt.evaluate import main

    data = old_data(tmp_path / "data")
    assert main(["--checkpoint", str(FIXTURE / "ckpt_000002.pt"), "--data-dir", str(data),
                 "--val-steps", "2", "--device", "cpu"]) == 0
    assert "val loss" in capsys.readouterr().out
