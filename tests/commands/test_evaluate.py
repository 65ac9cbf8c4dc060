"""Validation loss and the `python -m gpt.evaluate` command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from gpt.checkpoint.model_load import load_checkpoint_model
from gpt.core.config import model_preset
from gpt.data.loader import ShardLoader
from gpt.data.shards import read_shard, write_shard
from gpt.eval import hellaswag
from gpt.eval.validation import val_loss
from gpt.evaluate import main
from gpt.model.transformer import GPT

from helpers import error_line, run_torchrun, write_checkpoint, write_random_shards

MINI = [
    ("A man is sitting on a roof. He", ["is using wrap to wrap a pair of skis.",
                                         "is ripping level tiles off.", "is holding a cube.",
                                         "starts pulling up roofing on a roof."], 3),
    ("Kids", ["play.", "sleep soundly in a very long bed tonight.", "eat.", "run around."], 0),
    ("The cat", ["sat.", "sat on the mat.", "flew to the moon and back again.", "purred."], 1),
    ("She opens the fridge and", ["takes out some milk.", "sings.", "drives away.", "a b c"], 0),
    ("Rain falls. People", ["open umbrellas.", "swim upward.", "eat stones.", "laugh at the sky."], 0),
]


def write_hellaswag(path: Path) -> Path:
    lines = [json.dumps({"ind": i, "ctx": c, "endings": e, "label": lab, "split": "val"})
             for i, (c, e, lab) in enumerate(MINI)]
    path.write_text("\n".join(lines) + "\n")
    return path


class OverwritingModel(torch.nn.Module):
    """Returns losses 1, 2, 3, ... and overwrites its previous output at every call, as a
    model compiled with CUDA graphs (--compile-mode reduce-overhead) does."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.previous: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[None, torch.Tensor]:
        if self.previous is not None:
            self.previous.fill_(-100.0)  # the graph's output buffer, reused
        self.calls += 1
        self.previous = torch.full((), float(self.calls))
        return None, self.previous


def test_val_loss_keeps_no_output_across_calls(random_data_dir: Path) -> None:
    loader = ShardLoader(random_data_dir, "val", 2, 16)
    assert val_loss(OverwritingModel(), loader, 3, "cpu", torch.float32).item() == 2.0


def test_val_loss_is_a_0dim_tensor_near_uniform(random_data_dir: Path) -> None:
    torch.manual_seed(0)
    model = GPT(model_preset("tiny", block_size=32))
    loader = ShardLoader(random_data_dir, "val", 2, 32)
    loss = val_loss(model, loader, 3, "cpu", torch.float32)
    assert loss.dim() == 0 and abs(loss.item() - math.log(50304)) < 0.2
    assert model.training  # restored


@pytest.mark.slow
@pytest.mark.numerics
def test_cli_reports_hellaswag_and_val_loss(tmp_path: Path, random_data_dir: Path,
                                            capsys) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt.pt")
    data = write_hellaswag(tmp_path / "mini.jsonl")
    args = ["--checkpoint", str(ckpt), "--hellaswag", str(data), "--batch-examples", "2",
            "--data-dir", str(random_data_dir), "--val-steps", "2", "--batch-size", "2",
            "--seq-len", "32", "--device", "cpu"]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # The same numbers as calling the functions directly.
    model = load_checkpoint_model(ckpt)
    expected = hellaswag.evaluate(model, hellaswag.load_examples(data), "cpu", batch_examples=2,
                                  valid_vocab=50257)
    # a file of one's own is scored under its own name, never as the validation set's
    assert out["hellaswag"] == {"set": str(data), **expected} and expected["total"] == 5
    loader = ShardLoader(random_data_dir, "val", 2, 32)
    assert out["val_loss"] == pytest.approx(val_loss(model, loader, 2, "cpu", torch.float32).item(),
                                            abs=1e-5)
    assert out["val_tokens"] == 2 * 2 * 32
    assert main(args) == 0
    text = capsys.readouterr().out
    assert f"acc_norm {expected['acc_norm']:.4f}" in text and "val loss" in text
    assert f"hellaswag ({data}): acc " in text


def test_batch_flags_larger_than_the_free_memory_are_one_line_before_the_forward(
        tmp_path: Path, random_data_dir: Path, capsys, monkeypatch) -> None:
    """--batch-examples and --batch-size are judged by arithmetic against what the host
    has free before a forward allocates; a --batch-examples above the examples a rank
    scores makes no larger forward (its rows would all be dummies)."""
    from gpt.model import sizing

    ckpt = write_checkpoint(tmp_path / "ckpt.pt")
    data = write_hellaswag(tmp_path / "mini.jsonl")
    base = ["--checkpoint", str(ckpt), "--device", "cpu", "--json"]
    assert main([*base, "--hellaswag", str(data), "--batch-examples", "1000000"]) == 0
    assert json.loads(capsys.readouterr().out)["hellaswag"]["total"] == 5
    monkeypatch.setattr(sizing, "free_memory", lambda device: (2**20, "this host"))
    monkeypatch.setattr(hellaswag, "evaluate", lambda *a, **k: pytest.fail("scored"))
    assert main([*base, "--hellaswag", str(data), "--batch-examples", "1000000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "error: --batch-examples 1,000,000 (forwards of 20 rows x 64 tokens: their fp32 logits) "
        "needs at least 0.2 GiB, and this host has 0.0 GiB free: lower --batch-examples")
    assert main([*base, "--data-dir", str(random_data_dir), "--batch-size", "100000",
                 "--seq-len", "32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "error: --batch-size 100,000 (forwards of 100,000 rows x 32 tokens) needs at least ")


def test_an_empty_data_dir_is_named(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--checkpoint", "x.pt", "--data-dir", ""])
    assert e.value.code == 2 and "--data-dir must not be empty" in capsys.readouterr().err


def test_cli_errors(tmp_path: Path, capsys) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt.pt")
    with pytest.raises(SystemExit) as exc:
        main(["--checkpoint", str(ckpt)])
    assert exc.value.code == 2 and "nothing to do" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--checkpoint", str(ckpt), "--hellaswag", "x", "--batch-examples", "0"])
    assert exc.value.code == 2 and "--batch-examples" in capsys.readouterr().err
    assert main(["--checkpoint", str(tmp_path / "none.pt"), "--hellaswag", "x",
                 "--device", "cpu"]) == 1
    assert "none.pt: no such checkpoint file" in capsys.readouterr().err
    assert main(["--checkpoint", str(ckpt), "--hellaswag", str(tmp_path / "hs.jsonl"),
                 "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "hs.jsonl: no such HellaSwag file" in err and "Traceback" not in err
    assert main(["--checkpoint", str(ckpt), "--data-dir", str(tmp_path), "--seq-len", "65",
                 "--device", "cpu"]) == 2
    assert "--seq-len 65" in capsys.readouterr().err


def test_evaluate_names_an_id_beyond_the_vocabulary(tmp_path: Path, capsys) -> None:
    from gpt.evaluate import main as evaluate

    (tmp_path / "d").mkdir()
    data = write_random_shards(tmp_path / "d", seed=0, train=(1000,), val=(3000,))
    tokens = read_shard(data / "val_000000.bin").copy()
    tokens[40] = 60_000  # beyond the padded 50304
    write_shard(data / "val_000000.bin", tokens)
    ckpt = write_checkpoint(tmp_path / "ckpt.pt", block_size=32)
    code = evaluate(["--checkpoint", str(ckpt), "--data-dir", str(data), "--val-steps", "2",
                     "--batch-size", "2", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert "val_000000.bin: token id 60000 at index 40 is >= --vocab-size 50304" in err


@pytest.mark.usefixtures("hub_offline")
@pytest.mark.parametrize("text", ["", ",,,", " , "])
def test_evaluate_refuses_an_empty_task_list(text: str, trained: Path, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--checkpoint", str(trained), "--tasks", text])
    assert e.value.code == 2 and f"--tasks {text!r} names no task" in error_line(
        capsys.readouterr().err)


def test_tasks_without_lm_eval_is_named_before_torch_and_the_model(
        tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """run() is where torch and the model load (seconds on a busy machine); a missing
    extra is named before it."""
    import sys

    import gpt.evaluate as evaluate

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval raises ImportError
    monkeypatch.setattr(evaluate, "run", lambda args: pytest.fail("got to run()"))
    assert main(["--checkpoint", str(tmp_path / "any.pt"), "--tasks", "hellaswag"]) == 1
    assert capsys.readouterr().err == (
        "error: --tasks needs EleutherAI's lm-evaluation-harness (lm-eval), which is not "
        "installed: pip install -e \".[eval]\" in the checkout, or pip install lm-eval\n")


@pytest.mark.slow
def test_cli_under_torchrun_two_ranks_matches_one(tmp_path: Path, random_data_dir: Path,
                                                  capsys) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt.pt")
    data = write_hellaswag(tmp_path / "mini.jsonl")
    args = ["--checkpoint", str(ckpt), "--hellaswag", str(data), "--batch-examples", "2",
            "--device", "cpu", "--json"]
    assert main(args) == 0
    single = json.loads(capsys.readouterr().out)
    proc = run_torchrun(*args, target=("-m", "gpt.evaluate"), timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1  # rank 0 alone prints
    assert json.loads(lines[0]) == single
