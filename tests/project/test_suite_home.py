"""The suite's own home (tests/conftest.py): the tests and every process they start see a
temporary folder of the run's as their home and as every library's cache, so they never
write into the user's; and a test that moves one of them and leaves it moved is named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HOME_WRITES, home_moved

PROBE = """import json, os, pathlib
out = {"home": str(pathlib.Path.home()), "cache": os.path.expanduser("~/.cache")}
try:
    import matplotlib
    out["matplotlib"] = [matplotlib.get_configdir(), matplotlib.get_cachedir()]
except ImportError:
    pass
print(json.dumps(out))
"""


def the_runs_home() -> Path:
    """The temporary folder this process's home variables point into."""
    return Path(os.environ["HOME"]).parent


@pytest.mark.skipif(sys.platform == "win32", reason="pwd: the account's home is POSIX's")
def test_a_process_a_test_starts_has_the_runs_home_not_the_users() -> None:
    import pwd

    real = pwd.getpwuid(os.getuid()).pw_dir
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    root = the_runs_home()
    assert root.name.startswith("gpt2-trainer-tests-home-") and str(root) != real
    assert seen["home"] == str(root / "home") and seen["cache"] == str(root / "home" / ".cache")
    for path in seen.get("matplotlib", []):  # where the plot extra is installed
        assert Path(path).is_relative_to(root), path
    for name, sub in HOME_WRITES.items():
        assert os.environ[name] == str(root / sub), name


def test_a_home_variable_left_changed_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    root = the_runs_home()
    assert home_moved(root) == []
    monkeypatch.setenv("XDG_CACHE_HOME", "/elsewhere/.cache")
    monkeypatch.delenv("MPLCONFIGDIR")
    assert home_moved(root) == ["XDG_CACHE_HOME=/elsewhere/.cache", "MPLCONFIGDIR=(unset)"]
