"""The worked example of evaluating on your own data (examples/eval-tasks/, one local task of
each request type on JSONL files): the README's command runs as written, from the
repository's root, offline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import REPO

pytest.importorskip("lm_eval", reason='lm-eval is not installed (pip install -e ".[eval]")')

EXAMPLES = REPO / "examples" / "eval-tasks"
TASKS = "example_choice,example_last_word,example_perplexity,example_qa"


def test_the_example_folder_holds_every_request_type():
    kinds = {}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())
        data = REPO / spec["dataset_kwargs"]["data_files"]["test"]
        assert data.is_file() and data.stat().st_size > 0, path
        kinds[spec["task"]] = spec["output_type"]
    assert kinds == {"example_choice": "multiple_choice", "example_last_word": "loglikelihood",
                     "example_perplexity": "loglikelihood_rolling", "example_qa": "generate_until"}
    assert TASKS.split(",") == sorted(kinds)


@pytest.mark.slow
def test_the_readme_command_scores_every_example_task(four_step_run: Path,
                                                      monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    proc = subprocess.run(
        [sys.executable, "-m", "gpt.evaluate", "--checkpoint", str(four_step_run / "ckpt_000004.pt"),
         "--include-path", "examples/eval-tasks", "--tasks", TASKS],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    names = [line.split()[:2] for line in lines[:-1]]
    assert names == [["example_choice", "acc"], ["example_choice", "acc_norm"],
                     ["example_last_word", "perplexity"], ["example_last_word", "acc"],
                     ["example_perplexity", "word_perplexity"],
                     ["example_perplexity", "byte_perplexity"],
                     ["example_perplexity", "bits_per_byte"], ["example_qa", "exact_match"]]
    assert all(float(line.split()[2]) >= 0 for line in lines[:-1])
    assert lines[-1] == ("centred mean accuracy (as DCLM's CORE): none; not counted (no random "
                         "baseline known): example_choice, example_last_word, "
                         "example_perplexity, example_qa")
    assert "Traceback" not in proc.stderr and "not registered" not in proc.stderr
    # no progress bars (lm-eval's per task, datasets' per split): one line says what runs
    assert proc.stderr.splitlines() == [f"scoring {TASKS.replace(',', ', ')} with "
                                        f"lm-evaluation-harness ..."], proc.stderr[-3000:]
