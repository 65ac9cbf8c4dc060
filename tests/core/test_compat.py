"""The torch range: the minimum pyproject.toml declares is the one the trainer checks, an older
torch is named in one line at start-up, and FSDP2 on CPU stops in one line where torch is
too old for it instead of training on wrong gradients (or failing inside torch); TF32 set
without torch 2.9's deprecation notice."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import QUIET, REPO, TINY, write_random_shards
from gpt.core import compat
from gpt.core.config import ConfigError
from gpt.engine import parallel
from gpt.runtime.world import Runtime


def test_the_minimum_checked_is_the_one_declared_and_tested() -> None:
    declared = re.findall(r'^\s*"torch([<>=!~][^"]*)?",', (REPO / "pyproject.toml").read_text(), re.M)
    assert declared == [">={}.{}".format(*compat.TORCH_MIN)]
    assert compat.version_tuple(torch.__version__) >= compat.TORCH_MIN  # the suite's own torch
    # CI tests exactly that minimum (.ci/run installs it into a fresh environment).
    [ci_min] = re.findall(r"^TORCH_MIN=(\S+)", (REPO / ".ci" / "run").read_text(), re.M)
    assert compat.version_tuple(ci_min) == compat.TORCH_MIN and ci_min.endswith(".0")


@pytest.mark.parametrize("version,parsed", [("2.6.0+cu124", (2, 6)), ("2.11.0", (2, 11)),
                                            ("2.10.0a0+git1234567", (2, 10)), ("3.0.0", (3, 0))])
def test_versions_compare_as_numbers(version: str, parsed: tuple[int, int]) -> None:
    assert compat.version_tuple(version) == parsed


@pytest.mark.parametrize("version,old", [("2.8.0+cu128", True), ("2.9.0+cpu", False),
                                         ("2.11.0+cu130", False)])
def test_a_torch_below_the_minimum_gets_one_line(version: str, old: bool,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", version)
    note = compat.old_torch_note()
    if not old:
        assert note is None
        return
    assert note is not None and "\n" not in note
    assert f"torch {version} is older" in note and "pip install 'torch>=2.9'" in note


@pytest.mark.parametrize("version,device,stops", [("2.8.0+cu128", "cpu", True),
                                                  ("2.9.0+cu128", "cpu", False),
                                                  ("2.8.0+cu128", "cuda", False)])
def test_fsdp_on_cpu_names_the_torch_it_needs(version: str, device: str, stops: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", version)
    runtime = Runtime(device=torch.device(device), distributed=True)
    if not stops:
        parallel.check_mode("fsdp", runtime)
        return
    with pytest.raises(ConfigError) as err:
        parallel.check_mode("fsdp", runtime)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"--parallel fsdp on CPU needs torch>=2.9 (found {version})")
    assert msg.endswith("pip install 'torch>=2.9'")
    parallel.check_mode("ddp", runtime)  # the other modes run on it


def test_a_feature_newer_than_the_minimum_names_both_versions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.9.1+cu128")
    compat.needs_torch("a feature", (2, 9), "why")  # met: nothing happens
    with pytest.raises(ConfigError, match=r"^a feature needs torch>=2\.11 \(found 2\.9\.1\+cu128\): "
                                          r"why; pip install 'torch>=2\.11'$"):
        compat.needs_torch("a feature", (2, 11), "why")
    monkeypatch.setattr(torch, "__version__", "2.6.0")
    with pytest.raises(ConfigError, match=r"needs torch>=2\.7 .* pip install 'torch>=2\.9'$"):
        compat.needs_torch("an old feature", (2, 7), "why")  # the advice: never below the minimum


def test_the_trainer_prints_the_note_at_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from gpt.entry import train_main as main

    data = write_random_shards(tmp_path, seed=3, train=(3_000,))
    monkeypatch.setattr(torch, "__version__", "2.8.0+cu128")
    # In this process: keep glibc's defaults, which later tests of peak RSS rely on.
    args = [*TINY, *QUIET, "--max-steps", "1", "--no-cpu-malloc-reuse", "--data-dir", str(data),
            "--out-dir", str(tmp_path / "run")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("note: torch 2.8.0+cu128 is older than this package's minimum, 2.9") == 1


@pytest.mark.slow
def test_tf32_is_read_and_set_without_torch_29s_notice() -> None:
    """torch 2.9 warns once a process when TF32 goes through allow_tf32 (CI's part 2 runs
    it): in a process of its own, every warning an error, the switches read, set and put
    back through gpt.core.compat say nothing and do what they say."""
    code = ("from gpt.core.compat import set_tf32, tf32_switches\n"
            "before = tf32_switches()\n"
            "set_tf32(True, False)\n"
            "assert tf32_switches() == (True, False), tf32_switches()\n"
            "set_tf32(*before)\n"
            "assert tf32_switches() == before\n")
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
