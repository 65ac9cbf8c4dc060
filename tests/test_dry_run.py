"""`train_gpt2.py --dry-run`: checks a command and says what it would do, writes nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpt.entry import train_main
from gpt.model import sizing

from helpers import QUIET, TINY, run_cli, write_random_shards


def mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def test_a_dry_run_reports_the_run_and_writes_nothing(tmp_path: Path) -> None:
    data = write_random_shards(mkdir(tmp_path / "data"), seed=0, train=(10_000, 6_000), val=(3_000,))
    before = sorted(p.name for p in data.iterdir())
    out = tmp_path / "run"
    proc = run_cli(*TINY, "--max-steps", "20", "--data-dir", str(data), "--out-dir", str(out),
                   "--dry-run")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "params:     " in text and "tokens per micro-batch" in text
    assert "4 x 32 tokens per micro-batch x 1 process(es) x 2 accumulation step(s) = 256" in text
    assert "2 train shard(s), 16,000 tokens; one pass is 62 steps" in text
    assert "1 val shard(s), 3,000 tokens" in text
    assert f"start:      fresh, in {out}" in text
    assert "peak per device" in text and "memory:     fits cpu" in text
    # what the plan counts, against what the log's mem counts on a CPU; no GPU's sizes
    assert "the log's mem on cpu is the process's peak resident memory" in text
    assert "24GB" not in text and "params:     3,321,600 (tiny preset, block size 32; " \
        "3,318,592 with GPT-2's 50,257 tokens" in text
    assert text.rstrip().endswith("dry run: the run would start")
    assert not out.exists()  # no folder, no lock, no log
    assert sorted(p.name for p in data.iterdir()) == before


def test_a_dry_run_names_every_problem(tmp_path: Path) -> None:
    proc = run_cli(*TINY, "--data-dir", str(tmp_path / "nothing"), "--total-batch-tokens", "300",
                   "--out-dir", str(tmp_path / "run"), "--dry-run")
    assert proc.returncode != 0
    assert "--total-batch-tokens 300" in proc.stderr and "data folder does not exist" in proc.stderr
    assert "dry run: 2 problem(s) above" in proc.stderr
    assert "peak per device" not in proc.stdout  # no plan of a run the trainer refuses
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_dry_run_says_which_checkpoint_it_would_resume(tmp_path: Path, no_launch_env,
                                                         capsys) -> None:
    data = write_random_shards(mkdir(tmp_path / "data"), seed=0, train=(10_000,))
    out = tmp_path / "run"
    common = [*TINY, *QUIET, "--data-dir", str(data), "--out-dir", str(out)]
    assert train_main([*common, "--max-steps", "2"]) == 0
    capsys.readouterr()
    ckpt = out / "ckpt_000002.pt"
    files = sorted(p.name for p in out.iterdir())
    stamp = ckpt.stat().st_mtime_ns
    code = train_main([*common, "--max-steps", "4", "--resume", "auto", "--dry-run"])
    text = capsys.readouterr().out
    assert code == 0
    assert f"start:      would resume from {ckpt} at step 2" in text
    # what it would train is counted from there: 2 steps of 256 tokens, not 4
    assert "expect:     512 tokens (2 steps x 256, steps 2 to 4)" in text
    assert sorted(p.name for p in out.iterdir()) == files  # no lock taken, nothing added
    assert ckpt.stat().st_mtime_ns == stamp
    # --resume none over the same folder: the error the real run would give
    code = train_main([*common, "--max-steps", "4", "--dry-run"])
    assert code != 0 and "already holds checkpoints" in capsys.readouterr().err


def test_what_to_lower_when_the_plan_does_not_fit(tmp_path: Path, no_launch_env,
                                                  monkeypatch, capsys) -> None:
    data = write_random_shards(mkdir(tmp_path / "data"), seed=0, train=(10_000,))
    args = [*TINY, *QUIET, "--data-dir", str(data), "--out-dir", str(tmp_path / "run"),
            "--batch-size", "8", "--total-batch-tokens", "512", "--dry-run"]
    from gpt.core.cli import parse_args
    from gpt.plan import memory

    cfg = parse_args([*args[:-1], "--batch-size", "2"])
    two = memory.plan(cfg, device_type="cpu").peak_bytes  # what --batch-size 2 needs
    monkeypatch.setattr(sizing, "device_memory", lambda device: int(two * memory.MARGIN) +
                        memory.RESERVE + 1)
    # The run would stop at its first step: no promise that it would start
    assert train_main(args) == 1
    err = capsys.readouterr().err
    assert "will not fit" in err and "lower --batch-size to 2" in err
    assert "the run would not start (or would run out of memory in its first step)" in err


@pytest.mark.slow
def test_under_torchrun_rank_zero_answers_for_the_world(tmp_path: Path) -> None:
    data = write_random_shards(mkdir(tmp_path / "data"), seed=0, train=(10_000,))
    args = [*TINY, *QUIET, "--data-dir", str(data), "--out-dir", str(tmp_path / "run"),
            "--total-batch-tokens", "512", "--dry-run"]
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}  # torchrun's worker env
    quiet = run_cli(*args, env=env)
    assert quiet.returncode == 0 and quiet.stdout == ""
    answer = run_cli(*args, env={**env, "RANK": "0", "LOCAL_RANK": "0"})
    assert answer.returncode == 0, answer.stderr
    assert "x 2 process(es) x 2 accumulation step(s) = 512" in answer.stdout


def test_paths_a_config_file_gives_are_printed_escaped(tmp_path: Path) -> None:
    """A config file's data_dir and out_dir are anyone's text: the dry run's disk, data
    and start lines escape them, as every error line does."""
    data = tmp_path / "data\x1b[2Jx"
    data.mkdir()
    write_random_shards(data, seed=0, train=(10_000,))
    out = tmp_path / "run\x1b]0;t\x07z"
    (tmp_path / "run.toml").write_text(f'[data]\ndata_dir = "{data}"\n[train]\nout_dir = '
                                       f'"{out}"\n'.replace("\x1b", "\\u001b").replace(
                                           "\x07", "\\u0007"))
    proc = run_cli("--config", str(tmp_path / "run.toml"), *TINY, *QUIET, "--max-steps", "1",
                   "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    lines = {line.split(":", 1)[0].strip(): line for line in proc.stdout.splitlines()}
    assert "data\\x1b[2Jx holds" in proc.stdout and "run\\x1b]0;t\\x07z needs about" in proc.stdout
    assert lines["start"].endswith("fresh, in " + str(out).replace("\x1b", "\\x1b").replace(
        "\x07", "\\x07"))


def test_an_empty_data_dir_is_named_not_read_as_the_current_folder(capsys) -> None:
    """--data-dir '' would be the current folder, where train_gpt2.py is named like a
    shard: the flag is named instead."""
    with pytest.raises(SystemExit) as e:
        train_main([*TINY, "--data-dir", "", "--dry-run"])
    assert e.value.code == 2
    assert "--data-dir must not be empty (it would be the current folder)" in capsys.readouterr().err
