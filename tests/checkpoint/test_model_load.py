"""A checkpoint's saved config, as every reader of it reads it (gpt/checkpoint/model_load.py,
and the resume, the export and the lm-eval model beside it): its values are checked as the
command line's are, one line in every reader; a checkpoint from before config schemas that
lacks a model field says so once, in a warning, and one whose weights disagree with the
model assumed is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpt.checkpoint import files as checkpoint
from gpt.checkpoint.export import export_hf
from gpt.checkpoint.files import CheckpointError
from gpt.checkpoint.model_load import PretrainedError, load_checkpoint_model, read_checkpoint
from gpt.entry import train_main

from helpers import QUIET, TINY


def edited(src: Path, dst: Path, schema: bool = True, drop: tuple[str, ...] = (),
           **model: object) -> Path:
    """src with model fields of its saved config set or dropped (and its schema version)."""
    ckpt = torch.load(src, weights_only=True)
    ckpt["config"]["model"].update(model)
    for name in drop:
        del ckpt["config"]["model"][name]
    if not schema:
        del ckpt[checkpoint.SCHEMA_KEY]
    dst.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, dst)
    return dst


def readers(path: Path, tmp_path: Path) -> dict:
    """Every reader of a checkpoint: generate and evaluate, export, resume, the harness."""
    def harness() -> object:
        pytest.importorskip("lm_eval", reason="the eval extra")
        from gpt.eval.harness import GPT2TrainerLM
        return GPT2TrainerLM(checkpoint=str(path), device="cpu")

    return {"load": lambda: load_checkpoint_model(path), "read": lambda: read_checkpoint(path),
            "export": lambda: export_hf(path, tmp_path / "hf"),
            "resume": lambda: checkpoint.choose(path.parent, str(path)), "harness": harness}


@pytest.mark.slow
@pytest.mark.parametrize("value, words", [
    ({"n_layer": "2"}, "n_layer = '2' must be int (flag --n-layer)"),
    ({"n_embd": 64.0}, "n_embd = 64.0 must be int (flag --n-embd)"),
    ({"n_head": 3}, "--n-embd 64 must be divisible by --n-head 3"),
    ({"dropout": 1.5}, "--dropout must be in [0, 1), got 1.5"),
])
def test_a_bad_value_in_a_saved_config_is_one_line_in_every_reader(
        value: dict, words: str, trained: Path, tmp_path: Path) -> None:
    path = edited(trained, tmp_path / "run" / "ckpt_000001.pt", **value)
    for name, read in readers(path, tmp_path).items():
        with pytest.raises((PretrainedError, CheckpointError)) as e:
            read()
        assert f"{path}: its saved config: {words}" in str(e.value), name
    assert not (tmp_path / "hf").exists()


def test_a_checkpoint_of_the_current_trainer_loads_as_before(trained: Path, capsys) -> None:
    model = load_checkpoint_model(trained)
    saved = torch.load(trained, weights_only=True)["model"]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    assert "warning" not in capsys.readouterr().err


def one_step(data_dir: Path, out: Path, *flags: str) -> Path:
    assert train_main([*TINY, *QUIET, *flags, "--max-steps", "1", "--data-dir", str(data_dir),
                       "--out-dir", str(out)]) == 0
    return out / "ckpt_000001.pt"


@pytest.fixture(scope="module")
def relu2_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return one_step(data_dir, tmp_path_factory.mktemp("relu2"), "--relu2")


def test_a_file_from_before_schemas_that_lacks_a_field_warns_in_every_reader(
        relu2_run: Path, tmp_path: Path, capsys) -> None:
    path = edited(relu2_run, tmp_path / "run" / "ckpt_000001.pt", schema=False, drop=("relu2",))
    capsys.readouterr()
    for name, read in readers(path, tmp_path).items():
        read()
        warnings = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning:")]
        assert len(warnings) == 1, (name, warnings)
        assert f"{path}: its config lacks relu2" in warnings[0] and "relu2=False" in warnings[0]


def test_weights_that_disagree_with_the_assumed_model_are_refused(data_dir: Path,
                                                                  tmp_path: Path) -> None:
    # RMSNorm holds no bias: read as LayerNorm, the weights show the loss
    src = one_step(data_dir, tmp_path / "src", "--rmsnorm")
    path = edited(src, tmp_path / "run" / "ckpt_000001.pt", schema=False, drop=("rmsnorm",))
    for name, read in readers(path, tmp_path).items():
        with pytest.raises((PretrainedError, CheckpointError), match="missing .*ln_1.bias"):
            read()


def test_a_resume_from_before_schemas_warns_once(trained: Path, data_dir: Path, tmp_path: Path,
                                                 capsys) -> None:
    path = edited(trained, tmp_path / "run" / "ckpt_000001.pt", schema=False,
                  drop=("qk_norm", "relu2"))
    assert train_main([*TINY, *QUIET, "--max-steps", "2", "--data-dir", str(data_dir),
                       "--out-dir", str(tmp_path / "run"), "--resume", str(path)]) == 0
    warnings = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning:")]
    assert len(warnings) == 1 and "lacks qk_norm, relu2" in warnings[0]
    assert (tmp_path / "run" / "ckpt_000002.pt").is_file()
