"""The README's first run, as a new user types it in a folder of their own, offline and
with no tiktoken cache: prepare the shipped corpus, train with the CPU recipe (shortened
by flags, which win over the recipe), sample from the checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO, read_metrics
from gpt.data.shards import read_shard


def test_readme_first_run_offline(tmp_path: Path) -> None:
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "no_cache"),
           "HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}

    def run(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    run(str(REPO / "fineweb.py"), "--source", "demo", "--out", "data/shakespeare",
        "--val-tokens", "30000")
    data = tmp_path / "data" / "shakespeare"
    val, train = read_shard(data / "val_000000.bin"), read_shard(data / "train_000000.bin")
    assert len(val) == 30_000 and len(val) + len(train) == 338_026  # EOT + the corpus

    run(str(REPO / "train_gpt2.py"), "--config", str(REPO / "configs" / "cpu-demo.toml"),
        "--max-steps", "4", "--val-every", "2", "--val-steps", "1", "--sample-every", "4",
        "--checkpoint-every", "4", "--sample-tokens", "8")
    out = tmp_path / "runs" / "shakespeare"
    assert [r["step"] for r in read_metrics(out, "val")] == [0, 2, 4]
    assert read_metrics(out, "sample")[0]["samples"][0].startswith("ROMEO:")

    proc = run("-m", "gpt.generate", "--checkpoint", "runs/shakespeare/ckpt_000004.pt",
               "--prompt", "ROMEO:", "--max-new-tokens", "8")
    assert proc.stdout.startswith("--- sample 0\nROMEO:")
