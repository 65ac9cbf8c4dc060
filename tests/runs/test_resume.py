"""Reliability: exact resume, preemption, elastic restart, the non-finite guard,
checkpoint rotation, and bad input that must not lose anything already written."""

from __future__ import annotations

import math
import os
import resource
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from helpers import QUIET, REPO, TINY, TINY_RUN, kill_tree, read_metrics, run_cli, run_torchrun, start_trainer, torchrun_cmd, wait_for, write_random_shards
from gpt.checkpoint import files as checkpoint
from gpt.checkpoint.files import CheckpointError, load
from gpt.core.cli import parse_args
from gpt.data.shards import write_shard
from gpt.engine.step import TrainingDiverged

ARGS = [*TINY_RUN, "--max-steps", "6"]


def losses(out: Path) -> dict[int, float]:
    """step -> loss; on a resumed run the later record of a step wins."""
    return {r["step"]: r["loss"] for r in read_metrics(out, "train")}


def assert_same_model(a: Path, b: Path) -> None:
    ma, mb = load(a)["model"], load(b)["model"]
    assert ma.keys() == mb.keys()
    for k in ma:
        assert torch.equal(ma[k], mb[k]), k


# ---------------------------------------------------------------------------------------
# exact resume


@pytest.mark.numerics
@pytest.mark.slow
def test_stop_and_resume_is_bitwise_identical(data_dir: Path, tmp_path: Path) -> None:
    args = [*ARGS, "--data-dir", str(data_dir), "--val-every", "2", "--val-steps", "2"]
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert run_cli(*args, "--out-dir", str(whole)).returncode == 0
    first = run_cli(*args, "--out-dir", str(split), "--stop-at-step", "3")
    assert first.returncode == 0, first.stderr
    second = run_cli(*args, "--out-dir", str(split), "--resume", "auto")
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stdout and "at step 3" in second.stdout

    assert losses(split) == losses(whole)  # bitwise: fp32 on CPU, same order of operations
    assert_same_model(whole / "ckpt_000006.pt", split / "ckpt_000006.pt")
    vals = {r["step"]: r["val_loss"] for r in read_metrics(split, "val")}
    assert vals[6] == {r["step"]: r["val_loss"] for r in read_metrics(whole, "val")}[6]
    # The log was appended to: two run headers, and the steps continue after 3.
    runs = read_metrics(split, "run")
    assert len(runs) == 2 and runs[1]["start_step"] == 3 and runs[1]["resumed_from"]
    assert [r["step"] for r in read_metrics(split, "train")] == list(range(6))

    ckpt = load(split / "ckpt_000003.pt")
    assert {"model", "optimizer", "scaler", "loader", "rng", "config", "step",
            "best_val_loss"} <= ckpt.keys()
    assert set(ckpt["rng"][0]) >= {"python", "numpy", "torch"}
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in ckpt["model"])


@pytest.mark.numerics
@pytest.mark.slow
def test_stop_and_resume_is_bitwise_identical_on_two_ranks(data_dir: Path, tmp_path: Path) -> None:
    args = [*ARGS, "--data-dir", str(data_dir)]
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert run_torchrun(*args, "--out-dir", str(whole)).returncode == 0
    assert run_torchrun(*args, "--out-dir", str(split), "--stop-at-step", "3").returncode == 0
    proc = run_torchrun(*args, "--out-dir", str(split), "--resume", "auto")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert losses(split) == losses(whole)
    assert_same_model(whole / "ckpt_000006.pt", split / "ckpt_000006.pt")

    # A new world size re-splits the same data position: 2 ranks x 2 micro-steps become
    # 1 process x 4, the same global batches in the same order.
    single = tmp_path / "single"
    single.mkdir()
    (single / "ckpt_000003.pt").write_bytes((split / "ckpt_000003.pt").read_bytes())
    proc = run_cli(*args, "--out-dir", str(single), "--resume", "auto")
    assert proc.returncode == 0, proc.stderr
    resumed, ref = losses(single), losses(whole)
    assert sorted(resumed) == [3, 4, 5]
    assert [resumed[s] for s in (3, 4, 5)] == pytest.approx([ref[s] for s in (3, 4, 5)], rel=1e-5)


# ---------------------------------------------------------------------------------------
# preemption and elastic restart


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1])
def test_signal_finishes_the_step_saves_and_exits(sig: int, data_dir: Path, tmp_path: Path) -> None:
    """A scheduler's stop (SIGTERM), Ctrl-C (SIGINT), a closed terminal (SIGHUP) and SLURM's
    warning before its time limit (SIGUSR1) each end the run with a checkpoint of the step in
    flight, from which --resume auto carries on."""
    out = tmp_path / "run"
    args = [*TINY, *QUIET, "--max-steps", "100000", "--data-dir", str(data_dir),
            "--out-dir", str(out)]
    proc = start_trainer(*args)
    try:
        wait_for(lambda: (out / "metrics.jsonl").exists() and len(read_metrics(out, "train")) >= 2,
                 timeout=120, proc=proc)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        kill_tree(proc)
    assert proc.returncode == 128 + sig, stderr
    name = signal.Signals(sig).name
    assert f"{name} received: saved checkpoint" in stdout
    saved = checkpoint.list_checkpoints(out)
    assert len(saved) == 1
    step, path = saved[0]
    assert step == max(losses(out)) + 1  # the step in flight was finished, then saved
    assert load(path)["step"] == step

    # The same command with --resume auto carries on from there.
    proc2 = run_cli(*args[:-4], "--max-steps", "100000", "--stop-at-step", str(step + 2),
                    "--data-dir", str(data_dir), "--out-dir", str(out), "--resume", "auto")
    assert proc2.returncode == 0, proc2.stderr
    steps = [r["step"] for r in read_metrics(out, "train")]
    assert steps == list(range(step + 2))


@pytest.mark.slow
def test_elastic_restart_after_a_rank_is_killed(data_dir: Path, tmp_path: Path) -> None:
    """torchrun --max-restarts with --resume auto: SIGKILL one worker mid-run; the job
    restarts once from the last checkpoint and finishes. (One restart is all it gets: the
    restarted workers must not trip over the dead ones' rendezvous keys, which torchrun
    leaves in the store it reuses; see gpt.runtime.launch.restart_store_prefix.)"""
    out = tmp_path / "run"
    args = [*TINY, *QUIET, "--total-batch-tokens", "512", "--max-steps", "12",
            "--checkpoint-every", "2", "--data-dir", str(data_dir), "--out-dir", str(out),
            "--resume", "auto"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(torchrun_cmd(*args, extra=("--max-restarts=1",)), cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_for(lambda: bool(checkpoint.list_checkpoints(out)), timeout=180, proc=proc)
        workers = [c for c in psutil.Process(proc.pid).children(recursive=True)
                   if "train_gpt2.py" in " ".join(c.cmdline())]
        assert len(workers) == 2
        workers[-1].kill()
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        kill_tree(proc)
    assert proc.returncode == 0, stderr[-3000:]
    runs = read_metrics(out, "run")
    assert len(runs) == 2 and runs[1]["resumed_from"]  # one restart, and it resumed
    assert sorted(losses(out)) == list(range(12))
    assert load(out / "ckpt_000012.pt")["step"] == 12


# ---------------------------------------------------------------------------------------
# the non-finite guard (in process, with the gradient norm made NaN on chosen steps)


def train_in_process(monkeypatch: pytest.MonkeyPatch, data_dir: Path, out: Path,
                     *flags: str) -> dict:
    from gpt.train.trainer import train

    monkeypatch.delenv("RANK", raising=False)
    cfg = parse_args([*ARGS, "--data-dir", str(data_dir), "--out-dir", str(out), *flags])
    return train(cfg)


def run_with_bad_steps(monkeypatch: pytest.MonkeyPatch, data_dir: Path, out: Path,
                       bad: set[int], *flags: str) -> dict:
    import gpt.train.loop as train_mod

    real = train_mod.forward_backward
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        loss, norm = real(*args, **kwargs)
        step = calls["n"]
        calls["n"] += 1
        if step in bad:
            return loss * math.nan, norm * math.nan
        return loss, norm

    monkeypatch.setattr(train_mod, "forward_backward", flaky)
    return train_in_process(monkeypatch, data_dir, out, *flags)


@pytest.fixture(scope="module")
def two_step_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run stopped after 2 steps (ckpt_000002.pt), trained once, for tests that only read it."""
    out = tmp_path_factory.mktemp("two_steps") / "run"
    with pytest.MonkeyPatch.context() as mp:
        train_in_process(mp, data_dir, out, "--stop-at-step", "2")
    return out


@pytest.fixture()
def two_step_copy(two_step_run: Path, tmp_path: Path) -> Path:
    """A private copy of two_step_run, for tests that write into the run's folder."""
    return Path(shutil.copytree(two_step_run, tmp_path / "run"))


@pytest.mark.slow
def test_non_finite_steps_are_skipped_and_counted(monkeypatch, data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_with_bad_steps(monkeypatch, data_dir, out, {1, 3})
    assert result["skipped"] == 2 and result["steps"] == 6
    skipped = read_metrics(out, "skipped")
    assert [r["step"] for r in skipped] == [1, 3]
    assert [r["in_a_row"] for r in skipped] == [1, 1]
    assert load(out / "ckpt_000006.pt")["skipped_steps"] == 2
    assert all(math.isfinite(p.float().sum()) for p in load(out / "ckpt_000006.pt")["model"].values())


@pytest.mark.slow
def test_skips_are_counted_on_the_device_and_read_at_log_steps(monkeypatch, data_dir: Path,
                                                               tmp_path: Path) -> None:
    """Log lines every 4 steps: the skips between them are read there, in one record."""
    out = tmp_path / "run"
    result = run_with_bad_steps(monkeypatch, data_dir, out, {1, 2}, "--log-every", "4",
                                "--max-steps", "6", "--checkpoint-every", "0")
    assert result["skipped"] == 2
    assert [(r["step"], r["count"], r["in_a_row"], r["total"]) for r in read_metrics(out, "skipped")
            ] == [(4, 2, 0, 2)]
    assert load(out / "ckpt_000006.pt")["skipped_steps"] == 2


@pytest.mark.slow
def test_a_streak_between_log_steps_still_stops_the_run(monkeypatch, data_dir: Path,
                                                        tmp_path: Path) -> None:
    """Three bad steps in a row, then good ones, all between two log lines: the longest
    streak since the last read is what counts."""
    with pytest.raises(TrainingDiverged, match=r"3 steps in a row.*by step 4"):
        run_with_bad_steps(monkeypatch, data_dir, tmp_path / "run", {1, 2, 3}, "--log-every", "4",
                           "--max-bad-steps", "3", "--checkpoint-every", "0")


def test_no_save_checkpoints_writes_none(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli(*ARGS, "--data-dir", str(data_dir), "--out-dir", str(out), "--max-steps", "3",
                   "--checkpoint-every", "1", "--no-save-checkpoints")
    assert proc.returncode == 0, proc.stderr
    assert not list(out.glob("ckpt_*")) and not read_metrics(out, "checkpoint")
    assert len(read_metrics(out, "train")) == 3


@pytest.mark.slow
def test_no_checkpoint_is_saved_during_a_streak_of_skipped_steps(monkeypatch, data_dir: Path,
                                                                  tmp_path: Path) -> None:
    """Finite weights whose loss is not finite are no checkpoint to go back to: saves wait
    for a good step, and the error names the last checkpoint from before the streak."""
    out = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match=r"4 steps in a row.*ckpt_000003\.pt"):
        run_with_bad_steps(monkeypatch, data_dir, out, {3, 4, 5, 6}, "--checkpoint-every", "1",
                           "--max-bad-steps", "4", "--keep-checkpoints", "5", "--max-steps", "10")
    assert [s for s, _ in checkpoint.list_checkpoints(out)] == [1, 2, 3]
    records = read_metrics(out, "checkpoint")
    assert [(r["step"], r["path"] is None) for r in records] == [
        (1, False), (2, False), (3, False), (4, True), (5, True), (6, True)]


def test_a_val_shard_failing_mid_run_stops_with_a_checkpoint(monkeypatch, data_dir: Path,
                                                              tmp_path: Path) -> None:
    from gpt.data.shards import DataError, ShardError
    import gpt.eval.validation as periodic  # where validation scores (lazily imported)

    real = periodic.val_loss
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise ShardError("val_000000.bin: holds fewer tokens than its header said")
        return real(*args, **kwargs)

    monkeypatch.setattr(periodic, "val_loss", failing)
    out = tmp_path / "run"
    with pytest.raises(DataError, match=r"val_000000.bin: .*; saved .*ckpt_000002\.pt at step 2: "
                                         r"restore the data"):
        train_in_process(monkeypatch, data_dir, out, "--val-every", "2", "--val-steps", "1")
    assert [s for s, _ in checkpoint.list_checkpoints(out)] == [2]


@pytest.mark.slow
def test_a_shard_truncated_during_training_stops_with_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    data = write_random_shards(tmp_path / "d", seed=3, train=(200_000,))
    out = tmp_path / "run"
    proc = start_trainer(*ARGS, "--max-steps", "100000", "--data-dir", str(data), "--out-dir", str(out))
    try:
        wait_for(lambda: (out / "metrics.jsonl").exists() and len(read_metrics(out, "train")) >= 2,
                 timeout=120, proc=proc)
        with open(data / "train_000000.bin", "r+b") as fh:
            fh.truncate(4096)
        _, stderr = proc.communicate(timeout=120)
    finally:
        kill_tree(proc)
    assert proc.returncode == 1 and proc.returncode != -signal.SIGBUS, stderr
    assert "Traceback" not in stderr and "holds fewer tokens than its header said" in stderr
    saved = checkpoint.list_checkpoints(out)
    assert len(saved) == 1 and f"saved {saved[0][1]}" in stderr
    assert load(saved[0][1])["step"] == saved[0][0]


@pytest.mark.slow
def test_too_many_bad_steps_in_a_row_stop_the_run(monkeypatch, data_dir: Path,
                                                  two_step_copy: Path) -> None:
    out = two_step_copy
    before = (out / "ckpt_000002.pt").read_bytes()
    with pytest.raises(TrainingDiverged, match=r"3 steps in a row.*ckpt_000002\.pt"):
        run_with_bad_steps(monkeypatch, data_dir, out, {0, 1, 2}, "--resume", "auto",
                           "--max-bad-steps", "3")
    assert (out / "ckpt_000002.pt").read_bytes() == before  # the good checkpoint stays
    assert [s for s, _ in checkpoint.list_checkpoints(out)] == [2]


# ---------------------------------------------------------------------------------------
# checkpoint files


def test_rotation_keeps_the_newest_and_the_best(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4, 5):
        torch.save({"step": step}, tmp_path / f"ckpt_{step:06d}.pt")
    (tmp_path / "notes.txt").write_text("mine")
    removed = checkpoint.rotate(tmp_path, keep=2, protect={"ckpt_000002.pt"})
    assert sorted(p.name for p in removed) == ["ckpt_000001.pt", "ckpt_000003.pt"]
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [2, 4, 5]
    assert (tmp_path / "notes.txt").exists()


def test_rotation_counts_readable_checkpoints_by_their_stored_step(tmp_path: Path) -> None:
    """Damaged files are neither counted nor deleted, so they cannot push good checkpoints
    out; the order is the step stored inside, not the name."""
    for step in (2, 4):
        torch.save({"step": step}, tmp_path / f"ckpt_{step:06d}.pt")
    torch.save({"step": 1}, tmp_path / "ckpt_000009.pt")  # renamed by hand: the oldest
    for name in ("ckpt_000006.pt", "ckpt_000007.pt", "ckpt_000008.pt"):
        (tmp_path / name).write_bytes(b"")
    torch.save({"step": 5}, tmp_path / "ckpt_000005.pt")
    removed = checkpoint.rotate(tmp_path, keep=2, protect={"ckpt_000005.pt"})
    assert sorted(p.name for p in removed) == ["ckpt_000002.pt", "ckpt_000009.pt"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["ckpt_000004.pt", "ckpt_000005.pt", "ckpt_000006.pt", "ckpt_000007.pt",
                    "ckpt_000008.pt"]


def test_a_checkpoint_that_cannot_be_deleted_is_a_warning(tmp_path: Path, monkeypatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    for step in (1, 2, 3):
        torch.save({"step": step}, tmp_path / f"ckpt_{step:06d}.pt")
    real_unlink = Path.unlink

    def unlink(self: Path, missing_ok: bool = False) -> None:
        if self.name == "ckpt_000001.pt":
            raise PermissionError(1, "Operation not permitted")
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    removed = checkpoint.rotate(tmp_path, keep=1, protect={"ckpt_000003.pt"})
    assert [p.name for p in removed] == ["ckpt_000002.pt"]
    err = capsys.readouterr().err
    assert "warning: could not remove old checkpoint" in err and "ckpt_000001.pt" in err
    assert "Operation not permitted" in err and "training goes on" in err


@pytest.mark.slow
def test_periodic_checkpoints_rotate_and_keep_the_best(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli(*ARGS, "--data-dir", str(data_dir), "--out-dir", str(out),
                   "--checkpoint-every", "1", "--keep-checkpoints", "2",
                   "--val-every", "1", "--val-steps", "1", "--max-lr", "1.0")
    assert proc.returncode == 0, proc.stderr
    vals = {r["step"]: r["val_loss"] for r in read_metrics(out, "val")}
    best = min((v, s) for s, v in vals.items() if s >= 1)[1]  # lr 1.0 makes it diverge
    kept = [s for s, _ in checkpoint.list_checkpoints(out)]
    assert kept == sorted({best, 5, 6})
    last = load(out / "ckpt_000006.pt")
    assert last["best_checkpoint"] == f"ckpt_{best:06d}.pt"
    assert last["best_val_loss"] == pytest.approx(vals[best])


def test_damaged_newest_checkpoint_is_skipped_with_a_warning(two_step_copy: Path) -> None:
    out = two_step_copy
    good = out / "ckpt_000002.pt"
    damaged = out / "ckpt_000004.pt"
    damaged.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    path, ckpt, warnings = checkpoint.find_latest(out)
    assert path == good and ckpt is not None and ckpt["step"] == 2
    assert len(warnings) == 1 and str(damaged) in warnings[0]
    with pytest.raises(CheckpointError, match="ckpt_000004.pt: not a readable checkpoint"):
        load(damaged)


# ---------------------------------------------------------------------------------------
# bad input: one clear message, a non-zero status, nothing lost


def test_empty_data_folder(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_cli(*ARGS, "--data-dir", str(empty), "--out-dir", str(tmp_path / "r"))
    assert proc.returncode == 1
    assert f"{empty}: no train_* shards" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_wrong_magic_and_out_of_range_token(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    bad = data / "train_000000.bin"
    bad.write_bytes(b"\0" * 4096)
    proc = run_cli(*ARGS, "--data-dir", str(data), "--out-dir", str(tmp_path / "r"))
    assert proc.returncode == 1 and f"{bad}: bad magic" in proc.stderr
    tokens = np.zeros(5000, dtype=np.int64)
    tokens[40] = 50310  # beyond the padded vocabulary 50304
    write_shard(bad, tokens)
    proc = run_cli(*ARGS, "--data-dir", str(data), "--out-dir", str(tmp_path / "r2"))
    assert proc.returncode == 1
    assert f"{bad}: token id 50310 at index 40" in proc.stderr and "Traceback" not in proc.stderr


def test_fresh_start_refuses_a_folder_with_checkpoints(data_dir: Path, two_step_copy: Path) -> None:
    out = two_step_copy
    before = (out / "ckpt_000002.pt").read_bytes()
    proc = run_cli(*ARGS, "--data-dir", str(data_dir), "--out-dir", str(out))
    assert proc.returncode == 2
    assert "already holds checkpoints" in proc.stderr and "--resume auto" in proc.stderr
    assert (out / "ckpt_000002.pt").read_bytes() == before


@pytest.mark.slow
def test_incompatible_checkpoint_lists_the_differences(data_dir: Path, tmp_path: Path,
                                                       two_step_run: Path) -> None:
    out = two_step_run  # only read: the runs below write into tmp_path / "other"
    proc = run_cli(*ARGS, "--data-dir", str(data_dir), "--out-dir", str(tmp_path / "other"),
                   "--resume", str(out / "ckpt_000002.pt"), "--n-layer", "3", "--n-embd", "128")
    assert proc.returncode == 1
    assert "n_layer: checkpoint 2, config 3" in proc.stderr
    assert "n_embd: checkpoint 64, config 128" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli(*ARGS, "--data-dir", str(data_dir), "--out-dir", str(tmp_path / "other"),
                   "--resume", str(tmp_path / "missing.pt"))
    assert proc.returncode == 1 and "missing.pt: no such checkpoint file" in proc.stderr


def _limit_file_size(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.slow
def test_full_disk_while_saving_keeps_the_previous_checkpoint(data_dir: Path,
                                                              two_step_copy: Path) -> None:
    """A write that fails part-way (here: a file-size limit, as a full disk would) stops the
    run with a clear message; the previous checkpoint stays loadable and no partial file
    is left under a checkpoint name."""
    out = two_step_copy
    before = (out / "ckpt_000002.pt").read_bytes()
    proc = run_cli(*ARGS, "--data-dir", str(data_dir), "--out-dir", str(out), "--resume", "auto",
                   "--stop-at-step", "4", preexec_fn=_limit_file_size(len(before) // 4))
    assert proc.returncode == 1, proc.stderr
    assert "ckpt_000004.pt: could not write the checkpoint (File too large: over this " \
        "process's file-size limit" in proc.stderr and "GiB free" not in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (out / "ckpt_000002.pt").read_bytes() == before
    assert load(out / "ckpt_000002.pt")["step"] == 2
    assert sorted(p.name for p in out.iterdir() if "ckpt" in p.name) == ["ckpt_000002.pt"]


def test_a_file_size_limit_is_named_as_the_reason_a_checkpoint_was_not_written(
        tmp_path: Path) -> None:
    """torch's zip writer hides the OS's error behind its own words ("unexpected pos"): the
    message says the file-size limit, not the disk's free space, which is not the cause."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))
    try:
        with pytest.raises(CheckpointError) as e:
            checkpoint.save_atomic({"w": torch.zeros(100_000)}, tmp_path / "ckpt_000001.pt")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert str(e.value) == (
        f"{tmp_path / 'ckpt_000001.pt'}: could not write the checkpoint (File too large: over "
        f"this process's file-size limit (100,000 bytes), `ulimit -f`; raise the limit); "
        f"earlier checkpoints in {tmp_path} are untouched")
    assert not list(tmp_path.iterdir())  # no partial file left


def test_a_copied_run_folders_config_is_noted_as_training_elsewhere(tmp_path: Path,
                                                                    capsys) -> None:
    """The note alone, from the config's folder and its out_dir: said where they differ
    and --out-dir was not given, not for a config file that is no run's."""
    b = tmp_path / "B"
    b.mkdir()
    (b / "metrics.jsonl").write_text("")
    (b / "config.toml").write_text(f'[train]\nout_dir = "{tmp_path / "A"}"\n')
    assert parse_args(["--config", str(b / "config.toml")]).train.out_dir == str(tmp_path / "A")
    assert f"but its out_dir is {tmp_path / 'A'}: this run trains in {tmp_path / 'A'}" in \
        capsys.readouterr().err
    parse_args(["--config", str(b / "config.toml"), "--out-dir", str(b)])
    (b / "metrics.jsonl").unlink()  # a recipe file, not a run folder's
    parse_args(["--config", str(b / "config.toml")])
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_a_copied_run_folder_says_where_its_config_trains(data_dir: Path, tmp_path: Path) -> None:
    """cp -a A B; --config B/config.toml --resume auto trains in A, whose path the copied
    config names: the config file says so at its top, and the start says so in a note
    that gives the flag to continue the copy instead."""
    a, b = tmp_path / "A", tmp_path / "B"
    assert run_cli(*ARGS, "--data-dir", str(data_dir), "--out-dir", str(a),
                   "--max-steps", "1").returncode == 0
    assert f"a copy of the folder continues in the copy only with --out-dir COPY " \
        f"(--config COPY/config.toml --resume auto alone trains in {a})" in \
        (a / "config.toml").read_text().splitlines()[1]
    shutil.copytree(a, b)
    proc = run_cli("--config", str(b / "config.toml"), "--resume", "auto", "--max-steps", "2")
    assert proc.returncode == 0, proc.stderr
    assert f"note: --config {b / 'config.toml'} is from the run folder {b}, but its out_dir " \
        f"is {a}: this run trains in {a} (its checkpoints, log and resume); to continue the " \
        f"copy in {b}, add --out-dir {b}" in proc.stderr
    assert (a / "ckpt_000002.pt").exists() and not (b / "ckpt_000002.pt").exists()
    proc = run_cli("--config", str(b / "config.toml"), "--resume", "auto", "--max-steps", "2",
                   "--out-dir", str(b))
    assert proc.returncode == 0 and "note: --config" not in proc.stderr
    assert (b / "ckpt_000002.pt").exists()


def test_typo_in_config_file_names_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text("[optim]\nmax_lrr = 1e-3\n")
    proc = run_cli("--config", str(cfg))
    assert proc.returncode == 2
    assert "unknown key 'max_lrr' in [optim]" in proc.stderr and "'max_lr'" in proc.stderr
