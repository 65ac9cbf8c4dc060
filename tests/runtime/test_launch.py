"""Launch environments (gpt/runtime/launch.py): torchrun's own variables, or none, are
accepted; worker variables set by hand without torchrun's are one line saying what is
missing; and a peer that never comes is waited for no longer than --dist-timeout."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from gpt.core.config import ConfigError
from gpt.runtime.launch import WORKER_VARS, RendezvousError, launch_environment
from gpt.runtime.world import init_runtime

from helpers import TINY_RUN, free_port, one_line_error, run_cli


@pytest.mark.parametrize("env,words", [
    ({"RANK": "0", "WORLD_SIZE": "2"}, "RANK=0, WORLD_SIZE=2 set without MASTER_ADDR, MASTER_PORT"),
    ({"RANK": "0", "WORLD_SIZE": "1"}, "RANK=0, WORLD_SIZE=1 set without MASTER_ADDR, MASTER_PORT"),
    ({"LOCAL_RANK": "0"}, "LOCAL_RANK=0 set without RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"),
    ({"RANK": "one", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
     "RANK='one' in the environment is not a number"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
     "LOCAL_RANK='-1' in the environment is not a number >= 0"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
     "RANK=2 with WORLD_SIZE=2: ranks go from 0 to WORLD_SIZE - 1"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"},
     "MASTER_PORT=70000 is not a TCP port"),
])
def test_a_launch_environment_without_torchrun_says_what_is_missing(env: dict, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        launch_environment(env)
    assert words in str(caught.value)
    assert "torchrun" in str(caught.value) and "unset RANK, WORLD_SIZE and LOCAL_RANK" in str(caught.value)


def test_torchruns_own_environment_and_none_at_all_are_accepted() -> None:
    assert launch_environment({"PATH": "/bin"}) is None
    launch = launch_environment({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                                 "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    assert (launch.rank, launch.local_rank, launch.world_size, launch.master) == (1, 1, 2, "10.0.0.1:29500")


def launch_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (*WORKER_VARS, "MASTER_ADDR", "MASTER_PORT")}
    return {**env, **values}


@pytest.mark.slow
def test_worker_variables_without_torchrun_stop_the_trainer_in_one_line(tmp_path: Path) -> None:
    proc = run_cli(*TINY_RUN, "--max-steps", "1", "--data-dir", str(tmp_path), "--out-dir",
                   str(tmp_path / "run"), env=launch_env(RANK="0", WORLD_SIZE="1"))
    line = one_line_error(proc, 2)
    assert "set without MASTER_ADDR, MASTER_PORT" in line and "torchrun" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_peer_that_never_comes_is_waited_for_no_longer_than_dist_timeout(
        rank: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    for name, value in {"RANK": rank, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)
    for name in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(name, raising=False)
    # torch counts a group before the rendezvous fails and never uncounts it: the next
    # default group in this process would be named "1", and a later test's FSDP would
    # look up that name after its own group ("0") replaced it. Put the count back after.
    c10d = torch.distributed.distributed_c10d
    monkeypatch.setattr(c10d._world, "group_count", c10d._world.group_count)
    started = time.monotonic()
    with pytest.raises(RendezvousError) as caught:
        init_runtime("cpu", timeout_s=1)
    assert time.monotonic() - started < 30 and not torch.distributed.is_initialized()
    message = str(caught.value)
    assert f"rank {rank} of 2" in message and f"127.0.0.1:{port}" in message
    assert "1 s (--dist-timeout" in message and "torchrun" in message
    assert "frame #" not in capfd.readouterr().err  # no C++ stack traces from torch's retries
