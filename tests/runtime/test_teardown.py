"""Tearing the process group down: whatever holds it from C++ (DDP's reducer, FSDP's state)
is gone before destroy_process_group, also when an exception is in flight. Freed after it,
the group was destroyed with the GIL held, which deadlocks gloo's worker threads: a 2-rank
run that had finished hung at exit, or aborted ("terminate called without an active
exception"), about once in twenty runs on a loaded machine."""

from __future__ import annotations

import socket
import weakref
from pathlib import Path

import pytest
import torch.distributed as dist

from helpers import QUIET, TINY, write_random_shards
from gpt.core.cli import parse_args
from gpt.runtime import world as gdist


@pytest.fixture()
def one_rank_world(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as rank 0 of a torchrun world of one (gloo)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)
    for name in ("TORCHELASTIC_USE_AGENT_STORE", "GROUP_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def watch_destroy(monkeypatch: pytest.MonkeyPatch, refs: list[weakref.ref]) -> list[bool]:
    """Record, at destroy_process_group, whether any watched object is still alive."""
    seen: list[bool] = []
    real = dist.destroy_process_group

    def destroy(*args, **kwargs):
        seen.append(any(r() is not None for r in refs))
        real(*args, **kwargs)

    monkeypatch.setattr(gdist.dist, "destroy_process_group", destroy)
    return seen


def test_an_exception_in_flight_does_not_keep_its_frames_past_shutdown(
        one_rank_world: None, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = gdist.init_runtime("cpu")
    refs: list[weakref.ref] = []
    seen = watch_destroy(monkeypatch, refs)

    class Holder:  # stands for a DDP module held by a frame of the traceback
        pass

    def fail() -> None:
        holder = Holder()
        refs.append(weakref.ref(holder))
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        try:
            fail()
        finally:
            gdist.shutdown(runtime, clean=False)
    assert seen == [False]


@pytest.mark.slow
@pytest.mark.parametrize("mode,fail", [("fsdp", False), ("zero1", True)],
                         ids=["fsdp-finished", "zero1-failed"])
def test_the_trainers_model_and_optimizer_are_gone_before_the_group_is(
        mode: str, fail: bool, one_rank_world: None, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """FSDP's sharded model and ZeRO's optimizer hold the group (DDP's reducer does too,
    with two ranks or more: the subprocess tests in test_two_ranks.py run those)."""
    import gpt.train.trainer as train_mod

    data = write_random_shards(tmp_path, seed=4, train=(6_000,))
    cfg = parse_args([*TINY, *QUIET, "--max-steps", "2", "--parallel", mode,
                      "--data-dir", str(data), "--out-dir", str(tmp_path / "run")])
    refs: list[weakref.ref] = []
    seen = watch_destroy(monkeypatch, refs)
    real_build = train_mod.build_run

    def build(*args, **kwargs):
        run = real_build(*args, **kwargs)
        refs.extend([weakref.ref(run.model), weakref.ref(run.par.train_model),
                     weakref.ref(run.par.optimizer)])
        if fail:
            raise ValueError("a failure after the model was wrapped")
        return run

    monkeypatch.setattr(train_mod, "build_run", build)
    if fail:
        with pytest.raises(ValueError, match="after the model was wrapped"):
            train_mod.train(cfg)
    else:
        assert train_mod.train(cfg)["steps"] == 2
    assert seen == [False]
