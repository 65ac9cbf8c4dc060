"""`python fineweb.py` end to end: input it cannot read and an output folder it cannot
make are one line, as the trainer's are."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

from helpers import REPO, TINY_RUN, one_line_error, run_cli


def test_truncated_gz_input(tmp_path: Path) -> None:
    src = tmp_path / "in.txt.gz"
    data = gzip.compress(("some text here " * 20000).encode())
    src.write_bytes(data[: len(data) // 2])
    proc = subprocess.run([sys.executable, str(REPO / "fineweb.py"), "--source", str(src),
                           "--out", str(tmp_path / "o"), "--val-tokens", "10", "--quiet"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert "in.txt.gz: corrupt or truncated compressed file" in one_line_error(proc)


def test_output_folder_that_cannot_be_created(tmp_path: Path, data_dir: Path) -> None:
    blocker = tmp_path / "a_file.txt"
    blocker.write_text("some text")
    proc = subprocess.run([sys.executable, str(REPO / "fineweb.py"), "--source", str(blocker),
                           "--out", str(blocker / "sub"), "--val-tokens", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert "cannot create or write there" in one_line_error(proc)
    proc = run_cli(*TINY_RUN, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir", str(blocker / "sub"))
    assert "cannot write there" in one_line_error(proc, 2)
