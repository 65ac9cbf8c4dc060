"""The lm-evaluation-harness model (gpt/eval/harness.py) and task running (gpt/eval/harness_tasks.py),
offline on tiny local tasks of each request type (tests/harness_fixtures.py). Bad input is
one line, in `gpt2-lm-eval` as in `python -m gpt.evaluate`; a request the model cannot score
is refused before scoring, naming the task and the document, on every rank alike; a task
that fails while scored during training is one warning and the run goes on; and a task
that cannot load says what is wrong with it."""

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
from gpt.entry import train_main
from gpt.eval import harness_tasks
from gpt.evaluate import main as evaluate_main
from gpt.model.transformer import GPT

from harness_fixtures import MC, TASKS, flatten, responses, write_odd_tasks, write_tasks
from helpers import (QUIET, REPO, TINY, error_line, lm_eval_command, read_metrics, run_cli,
                     run_torchrun, write_checkpoint, write_random_shards)

lm_eval = pytest.importorskip("lm_eval", reason='lm-eval is not installed (pip install -e ".[eval]")')

pytestmark = pytest.mark.usefixtures("hub_offline")


def tiny_model(**overrides: object) -> GPT:
    torch.manual_seed(0)
    return GPT(model_preset("tiny", block_size=64, **overrides))


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every fixture task in one folder: the harness indexes it once for the module."""
    folder = tmp_path_factory.mktemp("tasks")
    write_tasks(folder)
    return write_odd_tasks(folder)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt.pt")  # block size 64


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    task of the Hub's is tests/eval/test_harness_tasks.py's)."""
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


def bad_checkpoint(case: str, good: Path, folder: Path) -> Path:
    path = folder / f"{case}.pt"
    data = good.read_bytes()
    if case == "a folder":
        path.mkdir()
    elif case == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif case == "corrupt":
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(flipped))
    return path  # "missing": nothing there


@pytest.mark.slow
@pytest.mark.parametrize("case", ["missing", "a folder", "truncated", "corrupt"])
def test_lm_eval_command_answers_a_checkpoint_it_cannot_read_in_one_line(
        case: str, tasks: Path, ckpt: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    path = bad_checkpoint(case, ckpt, tmp_path)
    code = lm_eval_command(monkeypatch, "--model", "gpt2-trainer", "--model_args",
                           f"checkpoint={path}", "--device", "cpu", "--tasks", "tiny_mc",
                           "--include_path", str(tasks), "--limit", "2")
    line = error_line(capsys.readouterr().err)
    # named as the user gave it, in model_args, not as gpt.evaluate's --checkpoint flag
    assert code == 1 and f"model_args checkpoint={path}" in line and "--checkpoint" not in line


@pytest.mark.slow
@pytest.mark.parametrize("flags, words", [
    (["--tasks", "no_such_task"], "--tasks no_such_task: no such lm-eval task or in --include_path"),
    (["--tasks", "tiny_mc", "--limit", "0"], "--limit 0: must be above 0"),
    (["--tasks", "tiny_mc", "--limit", "-1"], "--limit -1: must be above 0"),
    (["--tasks", "broken_empty"], "task broken_empty: its data holds no documents"),
    (["--tasks", "broken_missing"], "task broken_missing: its data could not be read"),
    (["--tasks", ""], "--tasks '' names no task"),
    (["--tasks", ",,,"], "--tasks ',,,' names no task"),
])
def test_lm_eval_command_answers_bad_flags_in_one_line(flags: list[str], words: str, tasks: Path,
                                                      ckpt: Path, monkeypatch, capsys) -> None:
    code = lm_eval_command(monkeypatch, "--model", "gpt2-trainer", "--model_args",
                           f"checkpoint={ckpt}", "--device", "cpu", "--include_path", str(tasks),
                           *flags)
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert words in [line for line in err.splitlines() if line.startswith("error:")][0]


@pytest.mark.slow
def test_lm_eval_command_still_takes_task_patterns(tasks: Path, ckpt: Path, monkeypatch,
                                                   capsys) -> None:
    code = lm_eval_command(monkeypatch, "--model", "gpt2-trainer", "--model_args",
                           f"checkpoint={ckpt}", "--device", "cpu", "--include_path", str(tasks),
                           "--tasks", "tiny_m*", "--limit", "2")
    assert code == 0 and "tiny_mc" in capsys.readouterr().out


@pytest.mark.parametrize("task, words", [
    ("odd_long_continuation", "its continuation is 100 tokens, more than the model's block "
                              "size of 64"),
    ("odd_empty_continuation", "its continuation is empty"),
    ("odd_max_gen_toks", "max_gen_toks 100 must be a whole number from 1 to 63"),
    ("odd_empty_context", "its context is empty"),
    ("odd_empty_document", "the text to score is empty"),
])
def test_a_request_the_model_cannot_score_is_refused_naming_task_and_document(
        task: str, words: str, tasks: Path, ckpt: Path, capsys) -> None:
    # --limit 1: the first document alone, the odd one (a rolling task of empty documents
    # only is where the harness divided by zero)
    code = evaluate_main(["--checkpoint", str(ckpt), "--tasks", task, "--include-path",
                          str(tasks), "--device", "cpu", "--limit", "1"])
    line = error_line(capsys.readouterr().err)
    assert code == 1 and f"task {task}, document 0: {words}" in line
    assert "refused before scoring" in line


@pytest.mark.slow
def test_lm_eval_command_refuses_a_request_in_one_line(tasks: Path, ckpt: Path, monkeypatch,
                                                       capsys) -> None:
    code = lm_eval_command(monkeypatch, "--model", "gpt2-trainer", "--model_args",
                           f"checkpoint={ckpt}", "--device", "cpu", "--include_path", str(tasks),
                           "--tasks", "odd_long_continuation")
    line = error_line(capsys.readouterr().err)
    assert code == 1 and "task odd_long_continuation, document 0: its continuation" in line


@pytest.mark.numerics
def test_a_continuation_as_long_as_the_block_scores_as_the_hf_model_scores_it(
        tasks: Path, tmp_path: Path) -> None:
    """The left cut keeps a continuation of block-size tokens whole: the harness's `hf`
    model on the export gives the same log-likelihoods (and it refuses longer ones)."""
    pytest.importorskip("accelerate", reason="the harness's hf model needs it (the hf extra)")
    from lm_eval.evaluator import evaluate
    from lm_eval.models.huggingface import HFLM

    from gpt.checkpoint.export import export_hf
    from gpt.eval.harness import GPT2TrainerLM

    torch.manual_seed(0)
    model = GPT(model_preset("tiny", block_size=64))
    export_hf(model, tmp_path / "hf")
    answers = []
    for lm in (GPT2TrainerLM(model=model, dtype="fp32"),
               HFLM(pretrained=str(tmp_path / "hf"), device="cpu", dtype="float32")):
        loaded, failed = harness_tasks.load_tasks(["fits_block"], str(tasks))
        assert not failed
        out = evaluate(lm=lm, task_dict=loaded, bootstrap_iters=0, log_samples=True)
        answers.append([s["resps"][0][0] for s in sorted(out["samples"]["fits_block"],
                                                         key=lambda s: s["doc_id"])])
    ours, theirs = answers
    assert len(ours) == 2
    for (lp, greedy), (lp_hf, greedy_hf) in zip(ours, theirs):
        assert lp == pytest.approx(lp_hf, abs=1e-4) and greedy == greedy_hf


@pytest.mark.slow
def test_ranks_agree_on_a_refusal(tasks: Path, ckpt: Path) -> None:
    """Under torchrun the odd document is rank 0's alone: both ranks stop with its line,
    rather than rank 1 waiting for rank 0 in the next collective."""
    proc = run_torchrun("--checkpoint", str(ckpt), "--tasks", "odd_long_continuation",
                        "--include-path", str(tasks), "--device", "cpu",
                        target=("-m", "gpt.evaluate"), timeout=300)
    assert proc.returncode != 0  # torchrun's own report of failed workers follows
    assert "/gpt/" not in proc.stderr and "lm_eval/" not in proc.stderr  # no worker traceback
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 2 and all("odd_long_continuation, document 0" in x for x in lines)


def test_a_task_that_fails_to_score_in_training_is_a_warning_and_the_run_goes_on(
        tasks: Path, tmp_path: Path, capsys) -> None:
    data = write_random_shards(tmp_path, seed=0, train=(10_000,))
    out = tmp_path / "run"
    code = train_main([*TINY, *QUIET, "--max-steps", "2", "--data-dir", str(data),
                       "--out-dir", str(out), "--eval-tasks",
                       "tiny_mc,odd_long_continuation,odd_later_document",
                       "--eval-tasks-every", "1", "--eval-tasks-include", str(tasks)])
    text = capsys.readouterr()
    assert code == 0 and "Traceback" not in text.err
    warnings = [line for line in text.out.splitlines() if line.startswith("warning: --eval-tasks")]
    assert len(warnings) == 2, warnings  # each failing task once, then dropped
    assert "odd_long_continuation could not be scored at step 0" in warnings[0]
    assert "document 0: its continuation is 100 tokens" in warnings[0]
    assert "odd_later_document could not be scored at step 0" in warnings[1]
    assert all("training goes on without it" in w for w in warnings)
    assert [r["step"] for r in read_metrics(out, "tasks")] == [0, 1, 2]
    assert all("tiny_mc/acc" in r for r in read_metrics(out, "tasks"))
    assert (out / "ckpt_000002.pt").is_file()  # the final checkpoint, after the scores


def _failing_rank_worker(rank: int, folder: str) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from gpt.core.config import model_preset
    from gpt.eval.harness import GPT2TrainerLM
    from gpt.eval.harness_tasks import HarnessError
    from gpt.eval.rank_agreement import agreed
    from gpt.model.transformer import GPT
    from gpt.eval.train_tasks import agreed_failure

    dist.init_process_group("gloo", init_method=f"file://{folder}/pg", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    try:
        lm = GPT2TrainerLM(model=GPT(model_preset("tiny", block_size=64)), rank=rank,
                           world_size=2, quiet=True)

        def share() -> list[tuple[float, bool]]:  # rank 1's share fails part-way
            if rank == 1:
                raise ValueError("out of memory on this share")
            return [(0.0, True)]

        try:
            outcome = f"returned {agreed(share, lm._world_size)}"
        except HarnessError as e:
            outcome = str(e)
        # the metrics, which the harness computes on rank 0 alone, fail there
        dropped = agreed_failure("ZeroDivisionError: in the metrics" if rank == 0 else None, 2)
        (Path(folder) / f"rank{rank}.json").write_text(json.dumps([outcome, dropped]))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ranks_agree_when_one_fails_while_scoring(tmp_path: Path) -> None:
    """Under DDP each rank scores its share: a rank whose share fails, or rank 0 whose
    metrics fail, must not leave the others waiting in the next gather; every rank raises
    or drops the task alike."""
    import torch.multiprocessing as mp

    mp.spawn(_failing_rank_worker, args=(str(tmp_path),), nprocs=2, join=True)
    for rank in range(2):
        outcome, dropped = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert outcome == "scoring failed on rank 1: ValueError: out of memory on this share"
        assert dropped == "ZeroDivisionError: in the metrics"


@pytest.mark.parametrize("task, words", [
    ("broken_template", "task broken_template: its template cannot be rendered on its documents "
                        "(TemplateSyntaxError"),
    ("broken_field", "task broken_field: its template cannot be rendered on its documents "
                     "(UndefinedError: 'question' is undefined)"),
    ("broken_empty", "task broken_empty: its data holds no documents"),
    ("broken_missing", "task broken_missing: its data could not be read"),
])
def test_a_local_task_that_cannot_load_says_what_is_wrong(task: str, words: str,
                                                          tasks: Path) -> None:
    loaded, failed = harness_tasks.load_tasks([task], str(tasks))
    assert not loaded and len(failed) == 1
    assert words in failed[0] and "network" not in failed[0]


def test_an_lm_eval_that_fails_to_import_is_not_called_missing(ckpt: Path, monkeypatch,
                                                               capsys) -> None:
    """lm-eval is there, but a package it needs (datasets, here) is not: its modules fail
    to import, and the line says so rather than "not installed"."""
    for name in [m for m in sys.modules if m.split(".")[0] in ("lm_eval", "datasets")
                 and m != "lm_eval"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "datasets", None)  # its import now fails
    code = evaluate_main(["--checkpoint", str(ckpt), "--tasks", "tiny_mc", "--device", "cpu"])
    line = error_line(capsys.readouterr().err)
    assert code == 1 and "installed but fails to import" in line and "datasets" in line
    assert "not installed" not in line
