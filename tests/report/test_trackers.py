"""Experiment tracking: every metrics record also goes to TensorBoard and to Weights & Biases
(offline here), on rank 0, each behind its own flag and extra."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from helpers import QUIET, TINY, read_metrics, run_cli

ARGS = [*TINY, *QUIET, "--max-steps", "4", "--val-every", "2", "--val-steps", "1"]


def test_tensorboard_events_hold_every_record(random_data_dir: Path, tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    out = tmp_path / "run"
    proc = run_cli(*ARGS, "--tensorboard", "--data-dir", str(random_data_dir), "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    events = event_accumulator.EventAccumulator(str(out / "tensorboard"),
                                                size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    losses = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert losses == [(r["step"], pytest.approx(r["loss"])) for r in read_metrics(out, "train")]
    assert [e.step for e in events.Scalars("val/val_loss")] == [0, 2, 4]
    assert "train/tokens_per_s" in events.Tags()["scalars"]
    assert "run/config/text_summary" in events.Tags()["tensors"]  # text is stored as tensors


def test_wandb_offline_writes_its_run_and_a_resume_continues_it(random_data_dir: Path,
                                                                 tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    out = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    args = [*ARGS, "--wandb-project", "gpt2-trainer-test", "--data-dir", str(random_data_dir),
            "--out-dir", str(out)]
    proc = run_cli(*args, "--stop-at-step", "2", env=env)
    assert proc.returncode == 0, proc.stderr
    run_id = (out / "wandb_run_id").read_text().strip()
    runs = list((out / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))[0].stat().st_size > 0
    proc = run_cli(*args, "--resume", "auto", env=env)
    assert proc.returncode == 0, proc.stderr
    assert (out / "wandb_run_id").read_text().strip() == run_id  # the same W&B run, continued
    assert len(list((out / "wandb").glob(f"offline-run-*-{run_id}"))) == 2  # one per process


@pytest.mark.parametrize("flag,extra", [(["--tensorboard"], "tensorboard"),
                                        (["--wandb-project", "p"], "wandb")])
def test_missing_package_is_one_line_naming_the_extra(flag: list[str], extra: str, monkeypatch,
                                                      random_data_dir: Path, tmp_path: Path,
                                                      capsys) -> None:
    from gpt.entry import train_main

    monkeypatch.setitem(sys.modules, extra, None)  # importing it now fails
    code = train_main([*ARGS, *flag, "--data-dir", str(random_data_dir),
                           "--out-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and f'pip install -e ".[{extra}]"' in err and "not installed" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_wandb_without_a_login_is_one_line_and_leaves_no_folder(random_data_dir: Path,
                                                                 tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path / "home"), WANDB_CONFIG_DIR=str(tmp_path / "wandb_config"),
               WANDB_MODE="online", HTTPS_PROXY="http://127.0.0.1:9")
    out = tmp_path / "run"
    proc = run_cli(*ARGS, "--wandb-project", "p", "--data-dir", str(random_data_dir),
                   "--out-dir", str(out), env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().startswith("error: --wandb-project p: W&B could not start a run")
    assert "wandb login" in proc.stderr and "WANDB_MODE=offline" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()
