"""The lm-evaluation-harness model (gpt/harness.py) and task running (gpt/harness_tasks.py),
offline on tiny local tasks of each request type (tests/harness_fixtures.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from gpt.config import model_preset
from gpt.model import GPT
from gpt.weights import export_hf

from harness_fixtures import write_tasks
from helpers import QUIET, TINY, read_metrics, run_cli

lm_eval = pytest.importorskip("lm_eval", reason='lm-eval is not installed (pip install -e ".[eval]")')

TASKS = ["tiny_mc", "tiny_word", "tiny_rolling", "tiny_gen"]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def tiny_model(**overrides: object) -> GPT:
    torch.manual_seed(0)
    return GPT(model_preset("tiny", block_size=64, **overrides))


def responses(lm, folder: Path) -> dict[str, list]:
    """Every task's per-document model responses (log-likelihoods, is-greedy flags and
    generated texts), in document order."""
    from lm_eval.evaluator import evaluate

    from gpt import harness_tasks

    tasks, failed = harness_tasks.load_tasks(TASKS, str(folder))
    assert not failed
    out = evaluate(lm=lm, task_dict=tasks, bootstrap_iters=0, log_samples=True)
    return {name: [s["resps"] for s in sorted(samples, key=lambda s: s["doc_id"])]
            for name, samples in out["samples"].items()}


def flatten(resps: list) -> list:
    items = []
    for r in resps:
        if isinstance(r, (list, tuple)):
            items.extend(flatten(list(r)))
        else:
            items.append(r)
    return items


def test_scores_equal_the_harness_hf_model_on_the_export(tmp_path: Path) -> None:
    """Our model's answers to all three request types equal those of its Hugging Face
    export scored by the harness's own `hf` model (fp32; log-likelihoods within 1e-4),
    on contexts shorter and longer than the block size."""
    pytest.importorskip("transformers")
    from lm_eval.models.huggingface import HFLM

    from gpt.harness import GPT2TrainerLM

    folder = write_tasks(tmp_path / "tasks")
    model = tiny_model()
    export_hf(model, tmp_path / "hf")
    ours = responses(GPT2TrainerLM(model=model, dtype="fp32", batch_size=3), folder)
    theirs = responses(HFLM(pretrained=str(tmp_path / "hf"), device="cpu", dtype="float32",
                            batch_size=3), folder)
    assert ours.keys() == theirs.keys() == set(TASKS)
    for task in TASKS:
        a, b = flatten(ours[task]), flatten(theirs[task])
        assert len(a) == len(b) > 0, task
        for x, y in zip(a, b):
            if isinstance(x, float):
                assert x == pytest.approx(y, abs=1e-4), task
            else:
                assert x == y, task


def test_rotary_untied_checkpoint_evaluates(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A speedrun-era checkpoint (rotary positions, untied head), which no Hugging Face
    export can hold, scores on every request type from its checkpoint file."""
    from gpt.evaluate import main

    from helpers import write_checkpoint

    folder = write_tasks(tmp_path / "tasks")
    ckpt = write_checkpoint(tmp_path / "ckpt.pt", tiny_model(rotary=True, untied_head=True))
    assert main(["--checkpoint", str(ckpt), "--tasks", ",".join(TASKS), "--include-path",
                 str(folder), "--device", "cpu", "--json"]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tasks"]
    assert set(scores) == set(TASKS)
    assert 0.0 <= scores["tiny_mc"]["acc"] <= 1.0
    assert math.isfinite(scores["tiny_rolling"]["bits_per_byte"])


def test_training_writes_task_metrics(tmp_path: Path, random_data_dir: Path) -> None:
    """--eval-tasks scores during training and at the end; each metric is in the metrics
    log; a task whose data cannot be loaded is one line and training goes on."""
    folder = write_tasks(tmp_path / "tasks")
    (folder / "tiny_broken.yaml").write_text(
        "task: tiny_broken\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tmp_path / 'missing.jsonl'}\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: \"{{ctx}}\"\n"
        "doc_to_choice: \"{{endings}}\"\ndoc_to_target: \"{{label}}\"\n")
    out = tmp_path / "run"
    proc = run_cli(*TINY, *QUIET, "--val-every", "2", "--data-dir", str(random_data_dir),
                   "--out-dir", str(out), "--max-steps", "3", "--eval-tasks", "tiny_mc,tiny_broken,tiny_gen",
                   "--eval-tasks-every", "2", "--eval-tasks-limit", "3",
                   "--eval-tasks-include", str(folder))
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("warning: --eval-tasks")]
    assert len(warnings) == 1 and "tiny_broken" in warnings[0] and "training goes on" in warnings[0]
    records = read_metrics(out, "tasks")
    assert [r["step"] for r in records] == [0, 2, 3]
    for r in records:
        assert 0.0 <= r["tiny_mc/acc"] <= 1.0 and "tiny_gen/exact_match" in r
        assert not any(key.startswith("tiny_broken") for key in r)
    val = read_metrics(out, "val")
    assert val and all(math.isfinite(r["val_bpb"]) for r in val)
