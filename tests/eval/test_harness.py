"""The lm-evaluation-harness model (gpt/eval/harness.py) and task running (gpt/eval/harness_tasks.py),
offline on tiny local tasks of each request type (tests/harness_fixtures.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpt.checkpoint.export import export_hf
from gpt.core.config import model_preset
from gpt.model.transformer import GPT

from harness_fixtures import MC, TASKS, flatten, responses, write_tasks
from helpers import QUIET, REPO, TINY, read_metrics, run_cli

lm_eval = pytest.importorskip("lm_eval", reason='lm-eval is not installed (pip install -e ".[eval]")')

pytestmark = pytest.mark.usefixtures("hub_offline")


def tiny_model(**overrides: object) -> GPT:
    torch.manual_seed(0)
    return GPT(model_preset("tiny", block_size=64, **overrides))


@pytest.mark.numerics
def test_scores_equal_the_harness_hf_model_on_the_export(tmp_path: Path) -> None:
    """Our model's answers to all three request types equal those of its Hugging Face
    export scored by the harness's own `hf` model (fp32; log-likelihoods within 1e-4),
    on contexts shorter and longer than the block size."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="the harness's hf model needs it (the hf extra)")
    from lm_eval.models.huggingface import HFLM

    from gpt.eval.harness import GPT2TrainerLM

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
    """A speedrun-era checkpoint (rotary positions, untied head), which Hugging Face's
    GPT-2 cannot hold, scores on every request type from its checkpoint file."""
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
                   "--eval-tasks-include", str(folder), process=True)  # what a fresh process prints
    assert proc.returncode == 0, proc.stderr
    # no progress bars, neither datasets' as it reads a task's file nor lm-eval's as it
    # builds the requests: three scorings would be most of the log
    assert "examples/s" not in proc.stderr and "it/s" not in proc.stderr, proc.stderr
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("warning: --eval-tasks")]
    assert len(warnings) == 1 and "tiny_broken" in warnings[0] and "training goes on" in warnings[0]
    records = read_metrics(out, "tasks")
    assert [r["step"] for r in records] == [0, 2, 3]
    for r in records:
        assert 0.0 <= r["tiny_mc/acc"] <= 1.0 and "tiny_gen/exact_match" in r
        assert not any(key.startswith("tiny_broken") for key in r)
    val = read_metrics(out, "val")
    assert val and all(math.isfinite(r["val_bpb"]) for r in val)


@pytest.mark.numerics
def test_two_ranks_give_the_numbers_of_one_process(tmp_path: Path, capsys: pytest.CaptureFixture
                                                  ) -> None:
    """Under torchrun (2 gloo ranks) each rank scores its share and rank 0 alone prints the
    scores, which are those of one process."""
    from gpt.evaluate import main

    from helpers import run_torchrun, write_checkpoint

    folder = write_tasks(tmp_path / "tasks")
    ckpt = write_checkpoint(tmp_path / "ckpt.pt", tiny_model())
    args = ["--checkpoint", str(ckpt), "--tasks", ",".join(TASKS), "--include-path", str(folder),
            "--device", "cpu", "--json", "--tasks-batch-size", "2"]
    assert main(args) == 0
    single = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tasks"]
    proc = run_torchrun(*args, target=("-m", "gpt.evaluate"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1  # rank 0 alone prints
    double = json.loads(lines[0])["tasks"]
    assert double.keys() == single.keys()
    assert single["tiny_mc"]["sample_len"] == double["tiny_mc"]["sample_len"] == len(MC)
    for task, metrics in single.items():
        assert double[task] == pytest.approx(metrics, rel=1e-6), task


def test_names_of_the_include_path_alone_index_that_folder_alone(tmp_path: Path) -> None:
    """Names that are all tasks of --include-path's own are checked and loaded on an index of
    that folder alone (the harness's ~15,000 task files take seconds to index); a name of
    the harness's or a pattern indexes both. A task of the folder's named like one of the
    harness's is the folder's either way: the harness gives include_path precedence."""
    from gpt.eval import harness_tasks

    folder = write_tasks(tmp_path / "tasks")
    mine = (folder / "tiny_mc.yaml").read_text().replace("task: tiny_mc", "task: arc_easy")
    (folder / "arc_easy.yaml").write_text(mine)
    own, names = harness_tasks.check_tasks("tiny_mc,arc_easy", str(folder))
    assert names == ["tiny_mc", "arc_easy"] and "hellaswag" not in own.all_tasks
    both, _ = harness_tasks.check_tasks("arc_easy,hellaswag", str(folder))
    assert "hellaswag" in both.all_tasks and "tiny_mc" in both.all_tasks
    for manager in (own, both):
        assert Path(manager.task_index["arc_easy"].yaml_path).parent == folder
    matched, names = harness_tasks.check_tasks("tiny_m*", str(folder), patterns=True)
    assert matched is both and names == ["tiny_mc"]
    with pytest.raises(harness_tasks.HarnessError, match="no such lm-eval task"):
        harness_tasks.check_tasks("tiny_mc,tiny_typo", str(folder))  # judged on both
    tasks, failed = harness_tasks.load_tasks(["arc_easy"], str(folder))
    assert not failed and [t.config.task for t in tasks.values()] == ["arc_easy"]


def test_lm_eval_command_finds_the_model(tmp_path: Path) -> None:
    """gpt2-lm-eval (python -m gpt.harness_cli) is the harness's own command line with
    --model gpt2-trainer registered."""
    from helpers import write_checkpoint

    folder = write_tasks(tmp_path / "tasks")
    ckpt = write_checkpoint(tmp_path / "ckpt.pt", tiny_model())
    proc = subprocess.run(
        [sys.executable, "-m", "gpt.harness_cli", "--model", "gpt2-trainer", "--model_args",
         f"checkpoint={ckpt}", "--device", "cpu", "--tasks", "tiny_mc", "--include_path",
         str(folder), "--limit", "3"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "gpt2-trainer" in proc.stdout and "tiny_mc" in proc.stdout and "acc_norm" in proc.stdout


def test_without_lm_eval_one_line_says_how_to_install(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    from gpt.evaluate import main

    from helpers import write_checkpoint

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval raises ImportError
    ckpt = write_checkpoint(tmp_path / "ckpt.pt", tiny_model())
    assert main(["--checkpoint", str(ckpt), "--tasks", "hellaswag", "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'pip install -e ".[eval]"' in err[0] and "--tasks" in err[0]


def test_a_local_task_without_its_data_file_is_named_with_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Its data is a file of its own: the line names the file, not the Hub's cache (a
    task of the Hub's is tests/test_reliability_round5_harness.py's)."""
    from gpt.evaluate import main

    from helpers import write_checkpoint

    folder = write_tasks(tmp_path / "tasks")
    (folder / "tiny_mc.jsonl").unlink()
    ckpt = write_checkpoint(tmp_path / "ckpt.pt", tiny_model())
    assert main(["--checkpoint", str(ckpt), "--tasks", "tiny_mc", "--include-path", str(folder),
                 "--device", "cpu"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "task tiny_mc: its data could not be read" in err[0]
    assert str(folder / "tiny_mc.jsonl") in err[0] and "network" not in err[0]
    assert "1 of the --tasks could not be loaded" in err[-1]


@pytest.mark.numerics
def test_init_from_a_hugging_face_folder_scores_as_its_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--init-from (here a local Hugging Face GPT-2 folder, as OpenAI's weights arrive)
    scores the same as the checkpoint it was exported from."""
    from gpt.evaluate import main

    from helpers import write_checkpoint

    folder = write_tasks(tmp_path / "tasks")
    model = tiny_model()
    ckpt = write_checkpoint(tmp_path / "ckpt.pt", model)
    export_hf(model, tmp_path / "hf")
    common = ["--tasks", "tiny_mc,tiny_rolling", "--include-path", str(folder), "--device",
              "cpu", "--json"]
    scores = []
    for source in (["--checkpoint", str(ckpt)], ["--init-from", str(tmp_path / "hf")]):
        assert main([*source, *common]) == 0
        scores.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tasks"])
    assert scores[0]["tiny_mc"] == scores[1]["tiny_mc"]
    assert scores[0]["tiny_rolling"] == pytest.approx(scores[1]["tiny_rolling"], rel=1e-5)


def test_trainer_without_lm_eval_stops_in_one_line(tmp_path: Path, random_data_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture) -> None:
    """--eval-tasks without the eval extra stops before training, in one line that says
    how to install it."""
    from gpt.entry import train_main as main

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval raises ImportError
    out = tmp_path / "run"
    assert main([*TINY, *QUIET, "--data-dir", str(random_data_dir), "--out-dir", str(out),
                 "--max-steps", "2", "--eval-tasks", "hellaswag", "--eval-tasks-every", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--eval-tasks" in err[0] and 'pip install -e ".[eval]"' in err[0]
    assert not list(out.glob("ckpt_*.pt"))


def test_eval_tasks_every_needs_tasks(capsys: pytest.CaptureFixture) -> None:
    from gpt.core.cli import parse_args

    with pytest.raises(SystemExit) as exc:
        parse_args(["--eval-tasks-every", "100"])
    assert exc.value.code == 2
    assert "--eval-tasks-every needs --eval-tasks LIST" in capsys.readouterr().err


def test_our_hellaswag_and_the_harness_s_read_the_same_items_differently(tmp_path: Path) -> None:
    """What the README says of the two HellaSwags, checked on the same items: the harness's
    own task prefixes the activity label, capitalises ctx_b and strips WikiHow's tags
    (ours scores ctx as given); both score every item."""
    from gpt.data.tokenizer import GPT2_VOCAB, gpt2_tokenizer
    from gpt.eval import harness_tasks, hellaswag
    from gpt.eval.harness import GPT2TrainerLM

    from harness_fixtures import HELLASWAG, write_hellaswag_both_ways

    yaml = Path(lm_eval.__file__).parent / "tasks" / "hellaswag" / "hellaswag.yaml"
    ours_file, folder = write_hellaswag_both_ways(tmp_path, yaml)
    tasks, failed = harness_tasks.load_tasks(["hellaswag_local"], str(folder))
    assert not failed
    (task,) = tasks.values()
    docs = list(task.validation_docs())
    assert task.doc_to_text(docs[0]) == "Roof shingle removal: A man is sitting on a roof. He"
    assert task.doc_to_text(docs[3]) == "Home and Garden: How to water a plant. Check the soil."
    # The tag goes after the strip: the ending keeps a space (the harness adds its own too).
    assert task.doc_to_choice(docs[3])[0] == " Push a finger into the soil to feel if it is dry."
    examples = hellaswag.load_examples(str(ours_file), None, 0)
    assert gpt2_tokenizer().decode(list(examples[3].context)) == HELLASWAG[3][1]  # as given, tags and all
    model = tiny_model()
    ours = hellaswag.evaluate(model, examples, torch.device("cpu"), torch.float32, 0, 1,
                              valid_vocab=GPT2_VOCAB)
    theirs = harness_tasks.run_tasks(GPT2TrainerLM(model=model, dtype="fp32"), tasks)
    assert ours["total"] == theirs["hellaswag_local"]["sample_len"] == len(HELLASWAG)


def test_a_batch_larger_than_the_free_memory_is_one_line_before_its_forward(monkeypatch) -> None:
    """The harness's batch_size, like every reader's batch flag, is judged against what
    the host has free before the forward allocates its logits."""
    from gpt.core.errors import UserError
    from gpt.eval.harness import GPT2TrainerLM
    from gpt.model import sizing

    lm = GPT2TrainerLM(model=tiny_model(), dtype="fp32", batch_size=100_000)
    monkeypatch.setattr(sizing, "free_memory", lambda device: (2**20, "this host"))
    requests = [(None, [1, 2, 3], [4, 5])] * 3
    with pytest.raises(UserError, match=r"^batch_size 100000 \(a forward of 3 rows x 4 tokens: "
                       r"its logits\) needs at least 0\.0 GiB, and this host has 0\.0 GiB free: "
                       r"lower it \(gpt\.evaluate's --tasks-batch-size"):
        lm._loglikelihood_tokens(requests)
    monkeypatch.undo()
    assert len(lm._loglikelihood_tokens(requests)) == 3
