"""The one preflight (gpt/plan/preflight.py): the trainer and the dry run ask it once and hold
no checks of their own, so what the run refuses the dry run refuses in the same words; a
saved config's size is judged by every checkpoint reader before it builds a model; an
optional package is judged by importing it, as the run does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from harness_fixtures import write_tasks
from helpers import QUIET, REPO, TINY, error_line, read_metrics, run_cli
from gpt.checkpoint.export import export_hf
from gpt.checkpoint.files import save_atomic
from gpt.checkpoint.model_load import PretrainedError, load_checkpoint_model
from gpt.checkpoint.weights import load_pretrained
from gpt.core import extras
from gpt.core.cli import parse_args
from gpt.core.config import ModelConfig, model_preset
from gpt.core.errors import UserError
from gpt.entry import train_main
from gpt.model import sizing
from gpt.plan.preflight import preflight


@pytest.fixture(scope="module")
def trained(data_dir: Path, tmp_path_factory) -> Path:
    """A one-step run's checkpoint of the tiny model."""
    out = tmp_path_factory.mktemp("run")
    assert train_main([*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir),
                       "--out-dir", str(out)]) == 0
    return out / "ckpt_000001.pt"


# ---------------------------------------------------------------------------------------
# one plan


@pytest.mark.slow
def test_the_plan_holds_what_the_run_will_do(data_dir: Path, tmp_path: Path, no_launch_env) -> None:
    cfg = parse_args([*TINY, "--sample-every", "0", "--max-steps", "4", "--batch-size", "auto",
                      "--data-dir", str(data_dir), "--out-dir", str(tmp_path / "run")])
    plan = preflight(cfg)
    assert plan.ok and plan.settled() is plan
    assert plan.runtime.device == torch.device("cpu") and plan.runtime.world_size == 1
    assert plan.dtype == torch.float32 and plan.layout is not None  # --batch-size auto settled
    d = plan.cfg.data
    assert plan.accum == d.total_batch_tokens // (d.batch_size * d.seq_len)
    assert (plan.data.train_shards, plan.data.train_tokens, plan.data.val_tokens) == (2, 18_000, 3_000)
    assert plan.start.path is None and plan.memory is None  # the planner only when asked
    assert not (tmp_path / "run").exists()  # nothing written


def test_every_problem_is_one_entry_and_the_run_raises_the_first(data_dir: Path, tmp_path: Path,
                                                                  no_launch_env) -> None:
    (tmp_path / "file").write_text("")
    cfg = parse_args([*TINY, *QUIET, "--total-batch-tokens", "300", "--data-dir",
                      str(tmp_path / "none"), "--out-dir", str(tmp_path / "file"),
                      "--hellaswag-every", "5", "--hellaswag-file", str(tmp_path / "hs.jsonl")])
    plan = preflight(cfg)
    words = ["--total-batch-tokens 300", "--out-dir", "--hellaswag-file"]
    assert [any(w in str(p) for p in plan.problems) for w in words] == [True] * 3
    assert all("\n" not in str(p) for p in plan.problems)
    with pytest.raises(UserError) as e:
        plan.settled()
    assert e.value is plan.problems[0]


def test_a_missing_hellaswag_file_stops_the_run_and_its_dry_run_alike(data_dir: Path,
                                                                      tmp_path: Path) -> None:
    args = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir",
            str(tmp_path / "run"), "--hellaswag-every", "1", "--hellaswag-file",
            str(tmp_path / "missing.jsonl")]
    for proc in (run_cli(*args, "--dry-run"), run_cli(*args)):
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert f"--hellaswag-file {tmp_path / 'missing.jsonl'}: no such file" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_hellaswag_file_bad_past_its_first_lines_is_refused_by_the_dry_run(
        data_dir: Path, tmp_path: Path) -> None:
    """The dry run reads every line the run will: a bad 21st line is its verdict too."""
    import json

    good = json.dumps({"ctx": "The man", "endings": ["a", "b", "c", "d"], "label": 0})
    path = tmp_path / "hs.jsonl"
    path.write_text(f"{good}\n" * 20 + "{not json\n" + f"{good}\n" * 5)
    args = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir",
            str(tmp_path / "run"), "--hellaswag-every", "1", "--hellaswag-file", str(path)]
    for proc in (run_cli(*args, "--dry-run"), run_cli(*args)):
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert f"--hellaswag-file {path}:21: not valid JSON" in proc.stderr
    assert not (tmp_path / "run").exists()


GOOD = json.dumps({"ctx": "The man", "endings": ["a", "b", "c", "d"], "label": 0})


@pytest.mark.slow
@pytest.mark.parametrize("content,words", [
    (b"ctx,endings,label\nThe man,a|b|c|d,0\n", "FILE:1: not valid JSON"),
    (f"{GOOD}\n{GOOD}\n".encode() + b'{"ctx": "x", "label": 1}\n', "FILE:3: 'endings' must be"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", "FILE:1: not UTF-8 text"),
    (b'[{"ctx": "x"}]\n', "FILE:1: expected a JSON object"),
])
def test_a_hellaswag_file_that_is_not_hellaswags_is_refused_before_the_run(
        content: bytes, words: str, data_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "hs.jsonl"
    path.write_bytes(content)
    args = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir",
            str(tmp_path / "run"), "--hellaswag-every", "1", "--hellaswag-file", str(path)]
    for flags in ([*args, "--dry-run"], args):
        assert train_main(flags) == 2
        line = error_line(capsys.readouterr().err)
        assert f"--hellaswag-file {words.replace('FILE', str(path))}" in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("flags,words", [
    (["--torch-profile", "/proc/x", "--profile-start", "1"], "--torch-profile /proc/x: cannot "
                                                              "write there: "),
    (["--torch-profile", "FILE"], "--torch-profile FILE: cannot write there: FILE is a file, "
                                  "not a folder; name another folder"),
    (["--memory-snapshot", "FILE/snap.pickle"], "--memory-snapshot FILE/snap.pickle: cannot "
                                                "write there: FILE is a file, not a folder"),
    (["--vocab-size", "1000"], "train_000000.bin: token id "),
], ids=["profile-in-proc", "profile-a-file", "snapshot-below-a-file", "vocab-below-the-data"])
def test_what_the_run_would_stop_at_the_dry_run_says_first(flags: list[str], words: str,
                                                           data_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    flags = [f.replace("FILE", str(tmp_path / "file")) for f in flags]
    words = words.replace("FILE", str(tmp_path / "file"))
    args = [*TINY, *QUIET, "--max-steps", "2", "--data-dir", str(data_dir), "--out-dir",
            str(tmp_path / "run"), *flags]
    for proc in (run_cli(*args, "--dry-run"), run_cli(*args)):
        assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr
        assert words in proc.stderr
    assert not (tmp_path / "run").exists()
    if "--vocab-size" in flags:  # the line names the flag to change, not only the data
        assert "is >= --vocab-size 1000, beyond the model's vocabulary; raise --vocab-size" \
            in proc.stderr


@pytest.mark.parametrize("case", ["name too long", "unreadable"])
def test_an_out_dir_that_cannot_be_listed_is_one_line_in_the_dry_run_and_the_run(
        case: str, data_dir: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """The checkpoints are listed before the folder's own check: a folder that cannot be
    listed (a name longer than the file system takes; write but no read permission, as
    root cannot be made to lack it, stood in for) is said there, not a traceback."""
    import pathlib

    if case == "name too long":
        out = tmp_path / ("x" * 300)
    else:
        out = tmp_path / "run"
        out.mkdir()
        real = pathlib.Path.iterdir

        def unreadable(self):
            if self == out:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self)

        monkeypatch.setattr(pathlib.Path, "iterdir", unreadable)
    args = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir", str(out)]
    for dry in (["--dry-run"], []):
        assert train_main([*args, *dry]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and f"error: --out-dir {out}: cannot list it for its " \
            f"checkpoints ({'File name too long' if case == 'name too long' else 'Permission denied'})" in err


def test_an_empty_sample_prompt_samples_from_end_of_text(data_dir: Path, tmp_path: Path) -> None:
    """As gpt.generate --prompt '' does: what the dry run passes, the run samples."""
    args = [*TINY, "--val-every", "0", "--max-steps", "1", "--sample-every", "1",
            "--sample-tokens", "4", "--num-samples", "1", "--sample-prompt", "",
            "--data-dir", str(data_dir), "--out-dir", str(tmp_path / "run")]
    assert run_cli(*args, "--dry-run").returncode == 0
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    samples = [r for r in read_metrics(tmp_path / "run", "sample")]
    assert [r["step"] for r in samples] == [1] and len(samples[0]["samples"]) == 1


def direct_calls(fn, stop_at: str | None = None):
    """(calls, run): run(*args) calls fn, recording in calls the module:function of each
    call fn makes itself (not its callees) into gpt/, until a call of `stop_at`, which is
    not made."""
    calls: list[str] = []
    code = fn.__code__

    class Stop(Exception):
        pass

    def profile(frame, event, arg) -> None:
        if event != "call" or "/gpt/" not in frame.f_code.co_filename:
            return
        if frame.f_back is None or frame.f_back.f_code is not code:
            return
        name = f"{Path(frame.f_code.co_filename).stem}:{frame.f_code.co_name}"
        if frame.f_code.co_name == stop_at:
            raise Stop
        calls.append(name)

    def run(*args):
        sys.setprofile(profile)
        try:
            fn(*args)
        except Stop:
            pass
        finally:
            sys.setprofile(None)
    return calls, run


def test_the_trainer_and_the_dry_run_each_ask_the_preflight_once(data_dir: Path, tmp_path: Path,
                                                                  no_launch_env, capsys) -> None:
    """Before the runtime starts, train() calls the preflight (and reads its verdict) and
    nothing else of the package: no check of its own. The dry run likewise."""
    from gpt.plan import dry_run
    from gpt.train import trainer as train

    cfg = parse_args([*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir),
                      "--out-dir", str(tmp_path / "run")])
    calls, run = direct_calls(train.train, stop_at="init_runtime")
    run(cfg)
    # (world:is_master: the plan's runtime read, to print its lines on rank 0 only)
    assert [c for c in calls if c != "world:is_master"] == ["preflight:preflight",
                                                           "preflight:settled"]
    calls, run = direct_calls(dry_run.main)
    run(cfg)
    assert [c for c in calls if not c.startswith(("dry_run:", "launch:launch"))] == [
        "preflight:preflight"]
    assert "the run would start" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------
# what the run refuses, the dry run refuses, in the same words


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tasks(tmp_path_factory.mktemp("tasks"))


def lm_eval_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval raises ImportError


# name -> (flags, words of the refusal, what to do to the environment first)
CASES = {
    "an unknown task in --eval-tasks": (
        ["--eval-tasks", "no_such_task", "--eval-tasks-every", "1"],
        "--eval-tasks no_such_task: no such lm-eval task", None),
    "--eval-tasks-include naming a missing folder": (
        ["--eval-tasks", "tiny_mc", "--eval-tasks-every", "1", "--eval-tasks-include", "MISSING"],
        "--eval-tasks-include MISSING: no such folder", None),
    "lm-eval not importable": (
        ["--eval-tasks", "tiny_mc", "--eval-tasks-every", "1"],
        "--eval-tasks needs EleutherAI's lm-evaluation-harness (lm-eval), which is not installed",
        lm_eval_missing),
    "--out-dir naming a file": (["--out-dir", "FILE"],
                                "--out-dir FILE: cannot write there: it is a file, not a folder",
                                None),
    "--vocab-size below the data's ids with --check-tokens": (
        ["--vocab-size", "1000", "--check-tokens"], "is >= --vocab-size 1000", None),
}


@pytest.mark.slow
@pytest.mark.usefixtures("hub_offline")
@pytest.mark.parametrize("case", list(CASES))
def test_the_dry_run_refuses_what_the_run_refuses_in_the_same_words(
        case: str, data_dir: Path, tasks: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    pytest.importorskip("lm_eval", reason="the eval extra")
    flags, words, environment = CASES[case]
    (tmp_path / "file").write_text("not a folder")
    names = {"MISSING": str(tmp_path / "missing"), "FILE": str(tmp_path / "file")}
    flags = [names.get(f, f) for f in flags]
    words = words.replace("MISSING", names["MISSING"]).replace("FILE", names["FILE"])
    if environment is not None:
        environment(monkeypatch)
    args = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir",
            str(tmp_path / "run"), "--eval-tasks-include", str(tasks), *flags]
    dry = train_main([*args, "--dry-run"])
    dry_text = capsys.readouterr()
    assert dry != 0 and "the run would start" not in dry_text.out, dry_text
    dry_line = error_line(dry_text.err)
    real = train_main(args)
    real_line = error_line(capsys.readouterr().err)
    assert real == dry and words in dry_line and dry_line == real_line
    assert not (tmp_path / "run").exists()  # nothing written


@pytest.mark.usefixtures("hub_offline")
def test_the_dry_run_promises_a_run_with_known_tasks(data_dir: Path, tasks: Path, tmp_path: Path,
                                                     capsys) -> None:
    pytest.importorskip("lm_eval", reason="the eval extra")
    code = train_main([*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir",
                       str(tmp_path / "run"), "--eval-tasks", "tiny_mc,tiny_gen",
                       "--eval-tasks-every", "1", "--eval-tasks-include", str(tasks),
                       "--check-tokens", "--dry-run"])
    assert code == 0 and "dry run: the run would start" in capsys.readouterr().out
    assert not (tmp_path / "run").exists()


def test_an_out_dir_below_a_file_is_refused_before_anything_is_built(data_dir: Path, tmp_path: Path,
                                                                      capsys) -> None:
    (tmp_path / "file").write_text("not a folder")
    out = tmp_path / "file" / "run"
    assert train_main([*TINY, *QUIET, "--data-dir", str(data_dir), "--out-dir", str(out)]) == 2
    assert f"--out-dir {out}: cannot write there: {tmp_path / 'file'} is a file" in error_line(
        capsys.readouterr().err)


# ---------------------------------------------------------------------------------------
# a saved config's size, judged before any reader builds a model


def absurd_copy(src: Path, dst: Path) -> Path:
    """src with its saved config's depth set to 10^9, re-saved with valid checksums."""
    ckpt = torch.load(src, weights_only=True)
    ckpt["config"]["model"]["n_layer"] = 10**9
    dst.parent.mkdir(parents=True, exist_ok=True)
    save_atomic(ckpt, dst)
    return dst


@pytest.mark.slow
def test_an_absurd_size_in_a_saved_config_is_refused_by_every_reader(trained: Path, data_dir: Path,
                                                                     tmp_path: Path) -> None:
    """generate, evaluate, export, resume (and its dry run) and gpt2-lm-eval each say so
    in one line; built, the model of 10^9 blocks would take minutes and all the memory
    (the timeout stands for a hang, not a speed limit)."""
    path = absurd_copy(trained, tmp_path / "run" / "ckpt_000001.pt")
    train = [*TINY, *QUIET, "--max-steps", "2", "--data-dir", str(data_dir), "--out-dir",
             str(path.parent), "--resume", "auto"]
    commands = {
        "generate": ["-m", "gpt.generate", "--checkpoint", str(path), "--prompt", "hi",
                     "--max-new-tokens", "4", "--device", "cpu"],
        "evaluate": ["-m", "gpt.evaluate", "--checkpoint", str(path), "--data-dir", str(data_dir),
                     "--device", "cpu", "--val-steps", "1", "--batch-size", "2", "--seq-len", "32"],
        "export": ["-m", "gpt.pretrained", "export", "--checkpoint", str(path), "--out",
                   str(tmp_path / "hf")],
        "resume": [str(REPO / "train_gpt2.py"), *train],
        "dry run": [str(REPO / "train_gpt2.py"), *train, "--dry-run"],
    }
    if extras.have("lm_eval"):
        commands["gpt2-lm-eval"] = ["-m", "gpt.harness_cli", "--model", "gpt2-trainer",
                                    "--model_args", f"checkpoint={path}", "--tasks",
                                    "example_choice", "--include_path",
                                    str(REPO / "examples" / "eval-tasks"), "--device", "cpu"]
    procs = {name: subprocess.Popen([sys.executable, *cmd], cwd=REPO, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for name, cmd in commands.items()}  # side by side: each mostly imports torch
    for name, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"{name}: no answer in 240 s: a model of the saved size was built")
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert proc.returncode != 0 and "Traceback" not in err, (name, err[-2000:])
        assert len(errors) == 1 and "describes a model of 49,984,003," in errors[0], (name, err)
    assert not (tmp_path / "hf").exists()


def test_the_size_is_judged_before_the_names_and_shapes(trained: Path) -> None:
    weights = torch.load(trained, weights_only=True)["model"]
    tiny = model_preset("tiny", block_size=32)
    sizing.check_weights_size(tiny, weights)  # the weights' own model
    # a deeper model within twice the size: built (on the meta device) and compared, which
    # names what differs
    sizing.check_weights_size(model_preset("tiny", block_size=32, n_layer=3), weights)
    for n_layer in (1000, 10**9):  # beyond twice: refused by arithmetic, nothing built
        with pytest.raises(ValueError, match="its weights hold 3,321,600 values"):
            sizing.check_weights_size(model_preset("tiny", block_size=32, n_layer=n_layer),
                                      weights)


def test_a_reader_refuses_a_model_larger_than_its_device(trained: Path, monkeypatch) -> None:
    from gpt.checkpoint.model_load import PretrainedError, load_checkpoint_model

    monkeypatch.setattr(sizing, "device_memory", lambda device: 1 << 20)  # 1 MiB
    with pytest.raises(PretrainedError, match=r"needs 0\.0 GiB for its weights alone, and cpu "
                                              r"has 0\.0 GiB"):
        load_checkpoint_model(trained)


DEEP_THIN = {"n_layer": 80_000, "n_embd": 2, "n_head": 1}  # passes the parameter bounds


def test_a_deep_thin_model_by_flags_is_refused_before_anything_is_built(
        data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Its parameters fit any device; building it (or planning its memory, which
    --batch-size auto does) would take minutes to hours. The dry run and the run answer
    at once, naming the flag."""
    base = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir",
            str(tmp_path / "run"), "--n-layer", "20000", "--n-embd", "16", "--n-head", "1"]
    for args in ([*base, "--dry-run"], base, [*base, "--batch-size", "auto", "--dry-run"]):
        assert train_main(args) == 2
        line = error_line(capsys.readouterr().err)
        assert line.startswith("error: --n-layer 20000: a model of more than 1,000 blocks")
        assert "choose --n-layer 1000 or fewer" in line
    assert sizing.param_count(ModelConfig(**DEEP_THIN)) < 10**7  # the parameters pass


def test_a_saved_config_edited_deep_and_thin_is_refused_by_every_reader(
        trained: Path, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A checkpoint whose config says 80,000 blocks 2 wide: within twice its weights'
    size, so the parameter bound passes; every reader refuses it before building it."""
    ckpt = torch.load(trained, weights_only=True)
    ckpt["config"]["model"].update(DEEP_THIN)
    path = tmp_path / "run" / "ckpt_000001.pt"
    path.parent.mkdir()
    save_atomic(ckpt, path)
    with pytest.raises(PretrainedError, match="its config's n_layer 80000: a model of more "
                                              "than 1,000 blocks"):
        load_checkpoint_model(path)  # generate, evaluate, export and gpt2-lm-eval read so
    args = [*TINY, *QUIET, "--max-steps", "2", "--data-dir", str(data_dir), "--out-dir",
            str(path.parent), "--resume", "auto"]
    for flags in ([*args, "--dry-run"], args):
        assert train_main(flags) != 0
        assert "its config's n_layer 80000" in error_line(capsys.readouterr().err)


def test_an_exported_folder_edited_deep_and_thin_is_refused_by_its_readers(
        trained: Path, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = export_hf(trained, tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    config.update(DEEP_THIN)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(PretrainedError, match=r"config\.json: n_layer 80000: a model of more "
                                              r"than 1,000 blocks"):
        load_pretrained(folder)  # generate and evaluate's --init-from
    args = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(data_dir), "--out-dir",
            str(tmp_path / "run"), "--init-from", str(folder)]
    for flags in ([*args, "--dry-run"], args):
        assert train_main(flags) != 0
        assert f"{folder}: n_layer 80000: a model of more than 1,000 blocks" in error_line(
            capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------
# an optional package is judged by importing it


def test_a_package_that_fails_to_import_is_named_with_its_reason(tmp_path: Path,
                                                                 monkeypatch) -> None:
    (tmp_path / "broken_pkg").mkdir()
    (tmp_path / "broken_pkg" / "__init__.py").write_text("raise OSError('libfoo.so: cannot open')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(extras.MissingExtra, match=r"^--flag needs broken-pkg, which is installed "
                       r"but fails to import \(OSError: libfoo\.so: cannot open\): .*"
                       r'pip install -e "\.\[x\]"'):
        extras.require("broken_pkg", "--flag", "x", "broken-pkg")
    monkeypatch.setitem(sys.modules, "absent_pkg", None)
    with pytest.raises(extras.MissingExtra, match="^--flag needs absent-pkg, which is not installed"):
        extras.require("absent_pkg", "--flag", "x", "absent-pkg")
    assert extras.require("json", "--flag", "x", "json").dumps(1) == "1"


@pytest.mark.slow
def test_a_broken_torchao_is_refused_by_the_dry_run_as_by_the_run(data_dir: Path,
                                                                   tmp_path: Path) -> None:
    """torchao on disk but failing to import: the dry run no longer promises a start that
    the run then refuses."""
    shim = tmp_path / "shim"
    (shim / "torchao").mkdir(parents=True)
    (shim / "torchao" / "__init__.py").write_text(textwrap.dedent("""\
        raise ImportError("undefined symbol: _ZN3c10 (built for another torch)")
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), str(REPO)])}
    args = [*TINY, *QUIET, "--max-steps", "1", "--fp8", "tensorwise", "--data-dir", str(data_dir),
            "--out-dir", str(tmp_path / "run")]
    dry, real = run_cli(*args, "--dry-run", env=env), run_cli(*args, env=env)
    assert dry.returncode == real.returncode == 1
    assert "the run would not start" in dry.stderr and "the run would start" not in dry.stdout
    for proc in (dry, real):
        assert "--fp8 tensorwise needs torchao, which is installed but fails to import " \
               "(ImportError: undefined symbol" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_the_memory_planner_and_the_layout_do_not_call_back_into_the_preflight() -> None:
    """The modules the preflight consults are called from it, not from each other: none
    of them imports it."""
    import ast

    importers = []
    for path in sorted((REPO / "gpt").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) else [])
            if any(n == "gpt.plan.preflight" for n in names):
                importers.append(path.relative_to(REPO).as_posix())
    assert sorted(set(importers)) == ["gpt/plan/dry_run.py", "gpt/train/build.py",
                                     "gpt/train/trainer.py"]
