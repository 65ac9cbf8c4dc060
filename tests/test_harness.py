"""The lm-evaluation-harness model (gpt/harness.py) and task running (gpt/harness_tasks.py),
offline on tiny local tasks of each request type (tests/harness_fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpt.config import model_preset
from gpt.model import GPT
from gpt.weights import export_hf

from harness_fixtures import write_tasks

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
