"""Every command line behaves alike: no abbreviated flags, one-line errors with the flag it
probably meant, help texts that state each default once, and answers without loading torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import REPO

COMMANDS = {
    "train_gpt2.py": [str(REPO / "train_gpt2.py")],
    "fineweb.py": [str(REPO / "fineweb.py")],
    "gpt.plot": ["-m", "gpt.plot"],
    "gpt.generate": ["-m", "gpt.generate"],
    "gpt.evaluate": ["-m", "gpt.evaluate"],
    "gpt.bench": ["-m", "gpt.bench", "model"],
    "gpt.pretrained": ["-m", "gpt.pretrained", "export"],
}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name,typo,meant", [
    ("train_gpt2.py", "--max-stpes", "--max-steps"),
    ("fineweb.py", "--val", "--val-tokens"),  # an abbreviation is refused, not taken
    ("gpt.plot", "--smoth", "--smooth"),
    ("gpt.generate", "--prompts", "--prompt"),
    ("gpt.evaluate", "--hellaswg", "--hellaswag"),
    ("gpt.bench", "--stepz", "--steps"),
    ("gpt.pretrained", "--chekpoint", "--checkpoint"),
])
def test_an_unknown_or_abbreviated_flag_is_one_line_with_a_suggestion(name: str, typo: str,
                                                                     meant: str) -> None:
    proc = cli(*COMMANDS[name], typo, "1")
    assert proc.returncode == 2, proc.stderr
    first, *rest = proc.stderr.strip().splitlines()
    assert f"unrecognized argument '{typo}' (did you mean '{meant}'?)" in first
    assert rest == ["(run with --help to list every flag)"]  # not the whole usage block


def imports_of(*args: str) -> set[str]:
    proc = cli("-X", "importtime", *args)
    return {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "import time:" in line}


def test_train_help_and_flag_errors_do_not_import_torch() -> None:
    for args in (["--help"], ["--max-stpes", "3"], ["--max-lr", "inf"]):
        assert "torch" not in imports_of(str(REPO / "train_gpt2.py"), *args), args
    proc = cli(str(REPO / "train_gpt2.py"), "--help")
    assert proc.returncode == 0 and "--max-steps" in proc.stdout


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_commands_help_answers_before_torch_loads(name: str) -> None:
    command = COMMANDS[name][:2] if name.startswith("gpt.") else COMMANDS[name][:1]
    assert "torch" not in imports_of(*command, "--help")  # gpt.bench: the list of subcommands
    proc = cli(*COMMANDS[name], "--help")
    assert proc.returncode == 0 and "usage:" in proc.stdout


def test_help_states_each_default_once() -> None:
    text = " ".join(cli(str(REPO / "train_gpt2.py"), "--help").stdout.split())
    assert "(default: where the device supports it) (default" not in text
    assert text.count("(default: ") >= 40
    assert "--stop-at-step INT save a checkpoint and stop after this many steps (e.g. to fit a job time limit) (default: off)" in text
    assert "--compile, --no-compile torch.compile the model (default: on for CUDA only)" in text


def test_gpt2_lm_eval_without_the_harness_says_how_to_get_it(monkeypatch, capsys) -> None:
    """The console script's module imports without lm-eval and answers in one line."""
    import sys

    from gpt import harness_cli

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # importing it now fails
    code = harness_cli.main(["--model", "gpt2-trainer", "--tasks", "hellaswag"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and '.[eval]' in err, err
