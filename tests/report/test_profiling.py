"""Tests for gpt.report.profiling: no-ops without CUDA, the CUDA call sequences (with the CUDA
functions stubbed), and torch.profiler Chrome traces on the CPU."""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path

import pytest
import torch

import gpt.report.profiling as prof
from gpt.report.profiling import (
    CudaProfilerWindow,
    MemorySnapshot,
    TorchProfile,
    cuda_profiler_range,
    nvtx_range,
)

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="tests the no-CUDA path")


@pytest.fixture()
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Pretend CUDA is there; record the CUDA calls the helpers make."""
    calls: list[tuple] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append(("sync",)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(("push", name)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append(("pop",)))
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append(("start",)))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append(("stop",)))
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda *a, **k: calls.append(("record", k)))
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot",
                        lambda path: (calls.append(("dump", path)), Path(path).write_bytes(b"x")))
    return calls


# --------------------------------------------------------------------------------------
# NVTX


@needs_no_cuda
def test_nvtx_range_is_a_noop_without_cuda() -> None:
    for enabled in (True, False):
        ctx = nvtx_range("forward", enabled)
        assert isinstance(ctx, contextlib.nullcontext)
        with ctx:
            pass


def test_nvtx_range_pushes_and_pops(fake_cuda: list[tuple]) -> None:
    with nvtx_range("forward", True):
        with nvtx_range("attn.scores", True):
            pass
    assert fake_cuda == [("push", "forward"), ("push", "attn.scores"), ("pop",), ("pop",)]
    fake_cuda.clear()
    with pytest.raises(ValueError):
        with nvtx_range("backward", True):
            raise ValueError
    assert fake_cuda == [("push", "backward"), ("pop",)]  # popped on the way out
    fake_cuda.clear()
    with nvtx_range("off", False):
        pass
    assert fake_cuda == []


def test_nvtx_range_skipped_while_compiling(fake_cuda: list[tuple],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prof, "_compiling", lambda: True)
    with nvtx_range("forward", True):
        pass
    assert fake_cuda == []


# --------------------------------------------------------------------------------------
# CUDA profiler range (nsys --capture-range=cudaProfilerApi)


@needs_no_cuda
def test_cuda_profiler_range_is_a_noop_without_cuda() -> None:
    with cuda_profiler_range(True):
        pass
    assert prof.cuda_profiler_start(True) is False
    assert prof.cuda_profiler_stop(True) is False


def test_cuda_profiler_range_syncs_around(fake_cuda: list[tuple]) -> None:
    with cuda_profiler_range(True):
        fake_cuda.append(("work",))
    assert fake_cuda == [("sync",), ("start",), ("work",), ("sync",), ("stop",)]
    fake_cuda.clear()
    with pytest.raises(RuntimeError):
        with cuda_profiler_range(True):
            raise RuntimeError("boom")
    assert fake_cuda[-1] == ("stop",)
    fake_cuda.clear()
    with cuda_profiler_range(False):
        pass
    assert fake_cuda == []


def test_cuda_profiler_window(fake_cuda: list[tuple]) -> None:
    events = []
    with CudaProfilerWindow(start_step=3, num_steps=4) as window:
        for step in range(10):
            window.step(step)
            events.extend((step, c[0]) for c in fake_cuda if c[0] in ("start", "stop"))
            fake_cuda.clear()
    assert events == [(3, "start"), (7, "stop")]
    # a loop that ends inside the window still stops the range
    with CudaProfilerWindow(start_step=0, num_steps=100) as window:
        window.step(0)
    assert [c[0] for c in fake_cuda if c[0] in ("start", "stop")] == ["start", "stop"]
    with pytest.raises(ValueError):
        CudaProfilerWindow(start_step=0, num_steps=0)


# --------------------------------------------------------------------------------------
# Memory snapshot


@needs_no_cuda
def test_memory_snapshot_noop_without_cuda(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "snap.pickle"
    with MemorySnapshot(path) as snap:
        torch.ones(4)
    assert not path.exists() and snap.written == []
    assert "need a CUDA device" in capsys.readouterr().err
    with MemorySnapshot(None):  # disabled: silent
        pass
    with MemorySnapshot(path, enabled=False):
        pass
    assert capsys.readouterr().err == ""


def test_memory_snapshot_records_and_dumps(fake_cuda: list[tuple], tmp_path: Path) -> None:
    path = tmp_path / "sub" / "snap.pickle"
    with pytest.raises(RuntimeError):
        with MemorySnapshot(path, max_entries=1234):
            raise RuntimeError("CUDA out of memory")  # the snapshot is still written
    kinds = [c[0] for c in fake_cuda]
    assert kinds == ["record", "dump", "record"]
    assert fake_cuda[0][1]["max_entries"] == 1234
    assert fake_cuda[1][1] == str(path) and path.exists()
    assert fake_cuda[2][1] == {"enabled": None}  # recording switched off again


# --------------------------------------------------------------------------------------
# torch.profiler


def _work() -> None:
    a = torch.randn(32, 32)
    (a @ a).sum()


def test_torch_profile_writes_chrome_trace(tmp_path: Path) -> None:
    out = tmp_path / "prof"
    with TorchProfile(out, wait=1, warmup=1, active=2, name="bench step") as p:
        for _ in range(6):
            _work()
            p.step()
    assert len(p.traces) == 1
    trace = p.traces[0]
    assert trace.parent == out and trace.name == "bench_step_step4.pt.trace.json"
    data = json.loads(trace.read_text())
    assert data["traceEvents"]
    assert (out / "bench_step_step4.txt").read_text().strip()


def test_torch_profile_loop_ending_mid_window(tmp_path: Path) -> None:
    with TorchProfile(tmp_path, wait=0, warmup=1, active=10) as p:
        for _ in range(3):
            _work()
            p.step()
    assert len(p.traces) == 1 and p.traces[0].exists()


def test_torch_profile_gives_no_advice_that_does_not_apply(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # torch 2.11 warns at each window that its events replace the last one's ("set
    # acc_events=True"); every window is written on its own, so the advice would mislead.
    # torch warns once per process: forget any earlier warning first.
    monkeypatch.setattr(torch.profiler.profiler, "_WARNINGS_SHOWN", set(), raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with TorchProfile(tmp_path, wait=0, warmup=1, active=1, repeat=2) as p:
            for _ in range(6):
                _work()
                p.step()
    assert len(p.traces) == 2


def test_torch_profile_disabled(tmp_path: Path) -> None:
    out = tmp_path / "none"
    with TorchProfile(out, enabled=False) as p:
        p.step()
    with TorchProfile(None) as p:
        p.step()
    assert not out.exists() and p.traces == []
    with pytest.raises(ValueError):
        TorchProfile(out, active=0)
