"""A saved config's schema (gpt/core/config_io.py): a config that lost a field cannot
quietly become another model in any reader (generate and evaluate, export, resume), while
one from before schemas still loads with the fields added since at their defaults; a
schema from a newer trainer is refused, a new field raises the schema's version, and a
refusal suggests valid values only."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpt.checkpoint import files as checkpoint
from gpt.checkpoint.export import export_hf
from gpt.checkpoint.files import CheckpointError
from gpt.checkpoint.model_load import PretrainedError, load_checkpoint_model, read_checkpoint
from gpt.core.cli import parse_args
from gpt.core.config import SCHEMA_VERSION, model_preset
from gpt.entry import train_main
from gpt.model.transformer import GPT

from helpers import QUIET, TINY


@pytest.fixture(scope="module")
def beyond_gpt2_run(data_dir: Path, tmp_path_factory) -> Path:
    """A one-step run of a model with every part a saved config must not lose."""
    out = tmp_path_factory.mktemp("run")
    assert train_main([*TINY, *QUIET, "--relu2", "--qk-norm", "--logit-softcap", "15",
                       "--rotary", "--max-steps", "1", "--data-dir", str(data_dir),
                       "--out-dir", str(out)]) == 0
    return out / "ckpt_000001.pt"


def edited(src: Path, dst: Path, drop: str, schema: bool = True) -> Path:
    ckpt = torch.load(src, weights_only=True)
    assert ckpt[checkpoint.SCHEMA_KEY] == SCHEMA_VERSION  # the trainer writes the schema's version
    del ckpt["config"]["model"][drop]
    if not schema:  # as the last version before schemas wrote it
        del ckpt[checkpoint.SCHEMA_KEY]
    torch.save(ckpt, dst)
    return dst


def every_reader(path: Path, tmp_path: Path) -> list[str]:
    """The one-line refusal of each reader: generate and evaluate, export, resume."""
    errors = []
    for read in (lambda: load_checkpoint_model(path), lambda: read_checkpoint(path),
                 lambda: export_hf(path, tmp_path / "hf"),
                 lambda: checkpoint.choose(path.parent, str(path))):
        with pytest.raises((PretrainedError, CheckpointError)) as e:
            read()
        errors.append(str(e.value))
    assert not (tmp_path / "hf").exists()
    return errors


@pytest.mark.parametrize("field", ["relu2", "qk_norm", "logit_softcap"])
def test_a_field_removed_from_a_saved_config_is_refused_by_every_reader(
        field: str, beyond_gpt2_run: Path, tmp_path: Path) -> None:
    path = edited(beyond_gpt2_run, tmp_path / "ckpt_000001.pt", field)
    for error in every_reader(path, tmp_path):
        assert f"lacks {field}" in error and f"schema {SCHEMA_VERSION}" in error


def test_weights_that_do_not_fit_the_config_are_refused_by_every_reader(
        beyond_gpt2_run: Path, tmp_path: Path) -> None:
    # a checkpoint from before schemas whose config lost `rotary`: its weights show it
    path = edited(beyond_gpt2_run, tmp_path / "ckpt_000001.pt", "rotary", schema=False)
    for error in every_reader(path, tmp_path):
        assert "missing transformer.wpe.weight" in error


def test_an_untied_head_under_a_tied_config_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = GPT(model_preset("tiny", block_size=32, untied_head=True))
    cfg = {"preset": "tiny", "model": {"n_layer": 2, "n_head": 2, "n_embd": 64,
                                       "block_size": 32}}  # untied_head lost, no schema
    path = tmp_path / "ckpt_000001.pt"
    torch.save({"model": model.state_dict(), "config": cfg}, path)
    with pytest.raises(PretrainedError, match="config ties them"):
        load_checkpoint_model(path)


def test_a_checkpoint_from_before_the_schema_still_loads(beyond_gpt2_run: Path,
                                                        tmp_path: Path) -> None:
    # written before schemas, a missing field is one that did not exist yet: its default
    path = edited(beyond_gpt2_run, tmp_path / "ckpt_000001.pt", "relu2", schema=False)
    assert load_checkpoint_model(path).config.relu2 is False
    assert load_checkpoint_model(beyond_gpt2_run).config.relu2 is True


def test_a_schema_1_config_reads_with_the_fields_added_since_at_their_defaults() -> None:
    from gpt.core.config import Config, ConfigError
    from gpt.core.config_io import from_dict, to_dict

    saved = to_dict(Config())
    del saved["train"]["loss_kernel"]  # added in schema 2
    assert from_dict(saved, schema=1).train.loss_kernel == "auto"  # ours but on CUDA with Liger
    with pytest.raises(ConfigError, match="lacks loss_kernel"):
        from_dict(saved, schema=2)


def test_a_schema_from_a_newer_trainer_is_refused(beyond_gpt2_run: Path, tmp_path: Path) -> None:
    ckpt = torch.load(beyond_gpt2_run, weights_only=True)
    ckpt[checkpoint.SCHEMA_KEY] = 99
    torch.save(ckpt, tmp_path / "new.pt")
    with pytest.raises(PretrainedError, match="config schema 99"):
        read_checkpoint(tmp_path / "new.pt")


# The fields each schema version always holds, frozen: a field added without raising
# config.SCHEMA_VERSION (and giving it `since=` the new version) would make every
# checkpoint written before it "lack" it, and be refused. Add the new version's line here.
FIELDS_OF_SCHEMA = {1: 85, 2: 86, 3: 88}


def test_a_new_config_field_raises_the_schema_version() -> None:
    from gpt.core.config import SCHEMA_VERSION
    from gpt.core.config_io import field_index

    assert set(FIELDS_OF_SCHEMA) == set(range(1, SCHEMA_VERSION + 1))
    for version, count in FIELDS_OF_SCHEMA.items():
        names = [n for n, (_, f) in field_index().items() if f.metadata["since"] <= version]
        assert len(names) == count, (
            f"schema {version} holds {len(names)} fields, not {count}: a field added since "
            f"needs since={SCHEMA_VERSION + 1} and SCHEMA_VERSION raised (gpt/core/config.py)")


def test_an_unknown_saved_optimizer_is_not_suggested(beyond_gpt2_run: Path,
                                                     tmp_path: Path) -> None:
    ckpt = torch.load(beyond_gpt2_run, weights_only=True)
    ckpt["config"]["optim"]["optimizer"] = "sgd"
    path = tmp_path / "ckpt_000001.pt"
    torch.save(ckpt, path)
    cfg = parse_args([*TINY, "--rotary"])
    with pytest.raises(CheckpointError) as e:
        checkpoint.check_resume_config(ckpt, cfg, path)
    assert "--optimizer sgd" not in str(e.value) and "adamw, muon" in str(e.value)
    with pytest.raises(CheckpointError) as e:  # --resume PATH says the same
        checkpoint.choose(tmp_path, str(path))
    assert "--optimizer sgd" not in str(e.value) and "adamw, muon" in str(e.value)
