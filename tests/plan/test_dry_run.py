"""`train_gpt2.py --dry-run`: checks a command and says what it would do, writes nothing. The
dry run and the run go through one validation path: a dry run that says the run would
start is followed by a run that starts, and what one refuses the other refuses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import torch

from gpt.bench import cli as bench_cli
from gpt.entry import train_main
from gpt.model import sizing
from gpt.model.transformer import GPT
from gpt.plan import speed
from gpt.runtime.device import device_name

from helpers import QUIET, TINY, error_line, run_cli, write_random_shards


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
    assert "the log's mem on cpu (the process's peak resident memory) should read about" in text
    assert "24GB" not in text and "params:     3,321,600 (tiny preset, block size 32; " \
        "3,318,592 with GPT-2's 50,257 tokens" in text
    # the verdict says what the run would do: 20 steps, too short to time
    assert text.rstrip().splitlines()[-1] == (
        "dry run: the run would start and train 20 steps on this cpu (AMD EPYC); not timed: "
        "a short run, 0.10 TFLOP of training: not worth a second of timing"
    ).replace("AMD EPYC", device_name(torch.device("cpu")))
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


@pytest.mark.slow
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
    assert "dry run: the run would start and train steps 2 to 4 on this cpu" in text
    assert sorted(p.name for p in out.iterdir()) == files  # no lock taken, nothing added
    assert ckpt.stat().st_mtime_ns == stamp
    # --resume none over the same folder: the error the real run would give
    code = train_main([*common, "--max-steps", "4", "--dry-run"])
    assert code != 0 and "already holds checkpoints" in capsys.readouterr().err


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_verdict_says_how_long_the_run_would_take_here(
        tmp_path: Path, no_launch_env, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The warning says a recipe takes hours on this CPU: the verdict says the same, not a
    bare "would start" (a stand-in timing of 30 s a pass makes 20 steps 20 minutes); and
    a timing whose passes disagreed gives its range there too."""
    data = write_random_shards(mkdir(tmp_path / "data"), seed=0, train=(10_000,))
    args = [*TINY, *QUIET, "--max-steps", "20", "--data-dir", str(data),
            "--out-dir", str(tmp_path / "run"), "--dry-run"]
    monkeypatch.setattr(speed, "MIN_FLOPS", 0.0)
    slow = [30.0, 30.0, 30.0]  # a pass of the whole micro-batch: 2 of them a step
    monkeypatch.setattr(speed, "time_slice", lambda cfg, s, *a: speed.Timing(
        slow, 0.0, sizing.param_count(s.model(cfg.model))))
    assert train_main(args) == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith("dry run: the run would start and train 20 steps, taking about "
                           "20m00s of training on this cpu (")
    slow[:] = [3600.0] * 3
    assert train_main(args) == 0
    assert capsys.readouterr().out.rstrip().endswith(": a recipe meant for a GPU")
    slow[:] = [30.0, 60.0, 90.0]
    assert train_main(args) == 0
    assert "taking about 40m00s (20m00s to 1h00m00s) of training on this cpu" in \
        capsys.readouterr().out


def _expected_mem(dry_stdout: str) -> tuple[float, float]:
    """(the GiB the dry run's memory line says the log's mem should read, the baseline
    in it it measured)."""
    import re

    line = next(line for line in dry_stdout.splitlines() if line.startswith("memory:"))
    found = re.search(r"should read about ([0-9.]+) GiB: ([0-9.]+) GiB the process holds", line)
    assert found is not None, line
    return float(found[1]), float(found[2])


def _logged_mem(out_dir: Path) -> float:
    import json

    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return max(r["peak_mem_gb"] for r in records if r.get("type") == "train")


@pytest.mark.slow
def test_the_memory_line_says_what_the_runs_mem_will_read(tmp_path: Path) -> None:
    """The dry run measures what the process holds before it builds the model (torch, the
    package, the tokenizer) and adds the plan's tensors; a real run of the same flags, a
    process of its own, logs about that. The tolerance: the CPU allocator keeps a little
    beyond the tensors the plan counts, growing over the first steps (here the plan is
    0.1 GiB of a 0.5 GiB whole, and a run's mem reads 4-12% above the line's figure)."""
    data = write_random_shards(mkdir(tmp_path / "data"), seed=0, train=(20_000,), val=(3_000,))
    flags = [*TINY, "--max-steps", "6", "--log-every", "1", "--sample-every", "3",
             "--data-dir", str(data), "--out-dir", str(tmp_path / "run")]
    dry = run_cli(*flags, "--dry-run", process=True)
    assert dry.returncode == 0, dry.stderr
    expected, baseline = _expected_mem(dry.stdout)
    assert 0.15 < baseline < expected  # torch alone holds more than 0.15 GiB
    run = run_cli(*flags, process=True)
    assert run.returncode == 0, run.stderr
    assert 0.9 * expected <= _logged_mem(tmp_path / "run") <= 1.3 * expected


@pytest.mark.slow
def test_the_first_runs_memory_line_holds_for_its_run(tmp_path: Path) -> None:
    """The README's first run, 30 of its steps: there the step is timed whole, and what it
    grew the process by (the plan's 0.41 GiB of tensors and the allocator's keep) is the
    line's. The run's mem reads up to half as much again: its validations, samples, the
    curves' drawing (matplotlib) and the allocator's keep, growing over its steps beyond
    what the few timed passes show, come on top (the whole first run on 2 cores at load
    1.5: 1.03 GiB at step 0 and 1.17 by step 100, where the line said 0.83)."""
    from helpers import REPO, SHAKESPEARE

    data = tmp_path / "data"
    prep = subprocess.run([sys.executable, str(REPO / "fineweb.py"), "--source", str(SHAKESPEARE),
                           "--out", str(data), "--val-tokens", "30000"],
                          capture_output=True, text=True, cwd=REPO)
    assert prep.returncode == 0, prep.stderr
    flags = ["--config", str(REPO / "configs" / "cpu-speedrun.toml"), "--data-dir", str(data),
             "--out-dir", str(tmp_path / "run"), "--max-steps", "30", "--sample-every", "15"]
    dry = run_cli(*flags, "--dry-run", process=True)
    assert dry.returncode == 0, dry.stderr
    assert "GiB the step timed here grew it by" in dry.stdout  # the whole step was timed
    expected, _ = _expected_mem(dry.stdout)
    run = run_cli(*flags, process=True)
    assert run.returncode == 0, run.stderr
    assert 0.85 * expected <= _logged_mem(tmp_path / "run") <= 1.5 * expected


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


WORKER = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29531"}  # what torchrun adds


ABSURD = ["--n-layer", "100000", "--n-embd", "65536", "--n-head", "64"]


def empty_shards(folder: Path) -> Path:
    """Shards with a valid header and no tokens."""
    folder.mkdir()
    return write_random_shards(folder, seed=0, train=(0, 0))


def small_shards(folder: Path) -> Path:
    """Enough tokens for one step of one rank (4 x 32 + 1), not of two."""
    folder.mkdir()
    return write_random_shards(folder, seed=0, train=(200,))


# name -> (extra flags, launch environment, data folder maker or None for the shared one)
CASES = {
    "a good command": ([], {}, None),
    "shards of 0 tokens": ([], {}, empty_shards),
    "rank 1 without torchrun": ([], {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}, None),
    "a batch the world does not divide": (
        ["--total-batch-tokens", "384", "--dist-timeout", "20"],
        {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", **WORKER}, None),
    "too few tokens for one step of two ranks": (
        ["--total-batch-tokens", "256", "--dist-timeout", "20"],
        {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", **WORKER}, small_shards),
    "--parallel zero1 in one process": (["--parallel", "zero1"], {}, None),
    "an absurd model": (ABSURD, {}, None),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_dry_run_that_says_it_would_start_is_followed_by_a_run_that_starts(
        case: str, data_dir: Path, tmp_path: Path, no_launch_env, capsys) -> None:
    flags, env, make_data = CASES[case]
    folder = make_data(tmp_path / "data") if make_data else data_dir
    for name, value in env.items():
        no_launch_env.setenv(name, value)
    args = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(folder),
            "--out-dir", str(tmp_path / "run"), *flags]
    dry = train_main([*args, "--dry-run"])
    dry_text = capsys.readouterr()
    promised = dry == 0 and "dry run: the run would start" in dry_text.out
    real = train_main(args)
    real_text = capsys.readouterr()
    assert promised == (real == 0), (case, dry_text, real_text)
    assert promised == (case == "a good command"), (case, dry_text)
    if not promised:  # both refuse in one line, and the run wrote nothing
        error_line(dry_text.err)
        error_line(real_text.err)
        assert not (tmp_path / "run").exists()


def test_rank_one_without_torchrun_is_refused_by_the_dry_run(data_dir: Path, tmp_path: Path,
                                                             no_launch_env, capsys) -> None:
    for name, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}.items():
        no_launch_env.setenv(name, value)
    code = train_main([*TINY, *QUIET, "--data-dir", str(data_dir), "--out-dir",
                       str(tmp_path / "run"), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "set without MASTER_ADDR, MASTER_PORT" in error_line(err)


def test_the_dry_run_applies_the_loaders_rule_to_a_small_val_split(tmp_path: Path,
                                                                  no_launch_env, capsys) -> None:
    (tmp_path / "data").mkdir()
    folder = write_random_shards(tmp_path / "data", seed=0, train=(10_000,), val=(100,))
    code = train_main([*TINY, "--sample-every", "0", "--data-dir", str(folder),
                       "--out-dir", str(tmp_path / "run"), "--dry-run"])
    assert code != 0 and "split 'val' has 100 tokens" in capsys.readouterr().err


@pytest.mark.parametrize("env, words", [
    ({"WORLD_SIZE": "x"}, "WORLD_SIZE=x set without RANK"),
    ({"WORLD_SIZE": "x", "RANK": "0", "LOCAL_RANK": "0", **WORKER},
     "WORLD_SIZE='x' in the environment is not a number"),
    ({"WORLD_SIZE": "0", "RANK": "0", "LOCAL_RANK": "0", **WORKER}, "RANK=0 with WORLD_SIZE=0"),
])
def test_a_bad_launch_variable_is_one_line_in_the_dry_run(env: dict, words: str, data_dir: Path,
                                                          tmp_path: Path, no_launch_env,
                                                          capsys) -> None:
    for name, value in env.items():
        no_launch_env.setenv(name, value)
    code = train_main([*TINY, *QUIET, "--data-dir", str(data_dir), "--out-dir",
                       str(tmp_path / "run"), "--dry-run"])
    assert code == 2 and words in error_line(capsys.readouterr().err)


def test_an_absurd_model_is_refused_by_the_dry_run_and_the_planner(data_dir: Path, tmp_path: Path,
                                                                   no_launch_env,
                                                                   monkeypatch, capsys) -> None:
    def no_building(*args, **kwargs):
        raise AssertionError("an absurd model must not be built or traced")

    monkeypatch.setattr(GPT, "__init__", no_building)
    code = train_main([*TINY, *QUIET, *ABSURD, "--data-dir", str(data_dir), "--out-dir",
                       str(tmp_path / "run"), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "needs at least" in err and "per device" in err
    assert bench_cli.main(["memory", *ABSURD]) == 2
    assert "the largest GPU planned for" in error_line(capsys.readouterr().err)
