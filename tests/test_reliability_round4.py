"""Reliability, round four: the dry run, the memory planner and the trainer give one
verdict; a saved config cannot quietly become another model; every number typed is
checked where it is typed. One group of tests per class of the adversarial pass."""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import pytest
import torch

from helpers import QUIET, TINY, error_line, write_random_shards
from gpt.bench import cli as bench_cli
from gpt.bench.tokens import bench as tokens_bench
from gpt.checkpoint import files as checkpoint
from gpt.checkpoint.export import export_hf
from gpt.checkpoint.files import CheckpointError
from gpt.checkpoint.model_load import PretrainedError, load_checkpoint_model, read_checkpoint
from gpt.core.cli import parse_args
from gpt.core.config import SCHEMA_VERSION, model_preset
from gpt.core.errors import UserError
from gpt.entry import train_main
from gpt.generate import main as generate_main
from gpt.model import sizing
from gpt.model.transformer import GPT

WORKER = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29531"}  # what torchrun adds
ABSURD = ["--n-layer", "100000", "--n-embd", "65536", "--n-head", "64"]


# ---- 1 (and 3, 4): the dry run and the run go through one validation path


def empty_shards(folder: Path) -> Path:
    """Shards with a valid header and no tokens."""
    folder.mkdir()
    return write_random_shards(folder, seed=0, train=(0, 0))


def small_shards(folder: Path) -> Path:
    """Enough tokens for one step of one rank (4 x 32 + 1), not of two."""
    folder.mkdir()
    return write_random_shards(folder, seed=0, train=(200,))


# name -> (extra flags, launch environment, data folder maker or None for the shared one)
CASES = {
    "a good command": ([], {}, None),
    "shards of 0 tokens": ([], {}, empty_shards),
    "rank 1 without torchrun": ([], {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}, None),
    "a batch the world does not divide": (
        ["--total-batch-tokens", "384", "--dist-timeout", "20"],
        {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", **WORKER}, None),
    "too few tokens for one step of two ranks": (
        ["--total-batch-tokens", "256", "--dist-timeout", "20"],
        {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", **WORKER}, small_shards),
    "--parallel zero1 in one process": (["--parallel", "zero1"], {}, None),
    "an absurd model": (ABSURD, {}, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_dry_run_that_says_it_would_start_is_followed_by_a_run_that_starts(
        case: str, data_dir: Path, tmp_path: Path, no_launch_env, capsys) -> None:
    flags, env, make_data = CASES[case]
    folder = make_data(tmp_path / "data") if make_data else data_dir
    for name, value in env.items():
        no_launch_env.setenv(name, value)
    args = [*TINY, *QUIET, "--max-steps", "1", "--data-dir", str(folder),
            "--out-dir", str(tmp_path / "run"), *flags]
    dry = train_main([*args, "--dry-run"])
    dry_text = capsys.readouterr()
    promised = dry == 0 and "dry run: the run would start" in dry_text.out
    real = train_main(args)
    real_text = capsys.readouterr()
    assert promised == (real == 0), (case, dry_text, real_text)
    assert promised == (case == "a good command"), (case, dry_text)
    if not promised:  # both refuse in one line, and the run wrote nothing
        error_line(dry_text.err)
        error_line(real_text.err)
        assert not (tmp_path / "run").exists()


def test_rank_one_without_torchrun_is_refused_by_the_dry_run(data_dir: Path, tmp_path: Path,
                                                             no_launch_env, capsys) -> None:
    for name, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}.items():
        no_launch_env.setenv(name, value)
    code = train_main([*TINY, *QUIET, "--data-dir", str(data_dir), "--out-dir",
                       str(tmp_path / "run"), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "set without MASTER_ADDR, MASTER_PORT" in error_line(err)


def test_the_dry_run_applies_the_loaders_rule_to_a_small_val_split(tmp_path: Path,
                                                                  no_launch_env, capsys) -> None:
    (tmp_path / "data").mkdir()
    folder = write_random_shards(tmp_path / "data", seed=0, train=(10_000,), val=(100,))
    code = train_main([*TINY, "--sample-every", "0", "--data-dir", str(folder),
                       "--out-dir", str(tmp_path / "run"), "--dry-run"])
    assert code != 0 and "split 'val' has 100 tokens" in capsys.readouterr().err


# ---- 2: launch variables and huge numbers are one line, naming the variable or flag


@pytest.mark.parametrize("env, words", [
    ({"WORLD_SIZE": "x"}, "WORLD_SIZE=x set without RANK"),
    ({"WORLD_SIZE": "x", "RANK": "0", "LOCAL_RANK": "0", **WORKER},
     "WORLD_SIZE='x' in the environment is not a number"),
    ({"WORLD_SIZE": "0", "RANK": "0", "LOCAL_RANK": "0", **WORKER}, "RANK=0 with WORLD_SIZE=0"),
])
def test_a_bad_launch_variable_is_one_line_in_the_dry_run(env: dict, words: str, data_dir: Path,
                                                          tmp_path: Path, no_launch_env,
                                                          capsys) -> None:
    for name, value in env.items():
        no_launch_env.setenv(name, value)
    code = train_main([*TINY, *QUIET, "--data-dir", str(data_dir), "--out-dir",
                       str(tmp_path / "run"), "--dry-run"])
    assert code == 2 and words in error_line(capsys.readouterr().err)


@pytest.mark.parametrize("flags, words", [
    (["--batch-size", "99999999999999999999"], "--batch-size 99999999999999999999 x --seq-len"),
    (["--batch-size", str(2**30)], "tokens per micro-batch: must be at most 2**31"),
    (["--total-batch-tokens", str(2**60)], "--total-batch-tokens must be at most 2**40"),
])
def test_a_huge_number_is_refused_where_it_is_typed(flags: list[str], words: str,
                                                    capsys) -> None:
    with pytest.raises(SystemExit) as e:  # the planner and the dry run both parse this way
        bench_cli.main(["memory", *flags])
    assert e.value.code == 2 and words in error_line(capsys.readouterr().err)


def test_the_planner_names_a_world_size_below_one(capsys) -> None:
    assert bench_cli.main(["memory", "--model", "tiny", "--world-size", "0"]) == 2
    assert "--world-size 0" in error_line(capsys.readouterr().err)


# ---- 3: absurd model sizes are answered by arithmetic, before anything is built


@pytest.mark.parametrize("rotary, rmsnorm, untied, value_embeds, unet",
                         list(itertools.product([False, True], repeat=5)))
def test_the_parameter_formula_is_the_models_count(rotary: bool, rmsnorm: bool, untied: bool,
                                                    value_embeds: bool, unet: bool) -> None:
    m = model_preset("mini", rotary=rotary, rmsnorm=rmsnorm, untied_head=untied,
                     value_embeds=value_embeds, unet_skips=unet, qk_norm=True, relu2=True,
                     vocab_size=1000, block_size=77)
    with torch.device("meta"):
        assert sizing.param_count(m) == GPT(m).num_params()


def test_an_absurd_model_is_refused_by_the_dry_run_and_the_planner(data_dir: Path, tmp_path: Path,
                                                                   no_launch_env,
                                                                   monkeypatch, capsys) -> None:
    def no_building(*args, **kwargs):
        raise AssertionError("an absurd model must not be built or traced")

    monkeypatch.setattr(GPT, "__init__", no_building)
    code = train_main([*TINY, *QUIET, *ABSURD, "--data-dir", str(data_dir), "--out-dir",
                       str(tmp_path / "run"), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "needs at least" in err and "per device" in err
    assert bench_cli.main(["memory", *ABSURD]) == 2
    assert "the largest GPU planned for" in error_line(capsys.readouterr().err)


def test_fsdp_shares_the_least_memory_over_the_world() -> None:
    cfg = parse_args(["--model", "gpt2-xl", "--parallel", "fsdp"])
    adamw = 8  # bytes of state a parameter
    one, eight = sizing.least_bytes(cfg, 1, adamw), sizing.least_bytes(cfg, 8, adamw)
    assert one > 7 * eight  # all but the token ids are sharded
    sizing.check_fits(cfg, 8, 80 * 2**30, "an 80 GB GPU", adamw)
    with pytest.raises(UserError, match="an 80 GB GPU"):
        sizing.check_fits(cfg, 1, 20 * 2**30, "an 80 GB GPU", adamw)


# ---- 4: the planner plans only what the trainer accepts


def test_the_planner_refuses_a_world_the_batch_does_not_divide(capsys) -> None:
    tiny = ["--model", "tiny", "--block-size", "32", "--seq-len", "32", "--batch-size", "4",
            "--total-batch-tokens", "256"]
    assert bench_cli.main(["memory", *tiny, "--world-size", "3"]) == 2
    assert "world size 3" in error_line(capsys.readouterr().err)


# ---- 5: a saved config that lost a field cannot quietly become another model


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


# ---- 6: every float a command takes is finite and in range where it is typed


@pytest.mark.parametrize("value, words", [
    ("nan", "must be a finite number"), ("inf", "must be a finite number"),
    ("-1", "must be >= 0"), ("1e-40", "at least 1e-30"), ("1000", "must be at most 100")])
def test_generate_checks_the_temperature_as_it_is_typed(value: str, words: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:  # before any checkpoint is read
        generate_main(["--checkpoint", "no-such-file.pt", "--temperature", value])
    assert e.value.code == 2 and words in error_line(capsys.readouterr().err)


@pytest.mark.parametrize("flags, words", [
    (["--logit-softcap", "1e-40"], "--logit-softcap 1e-40: must be 0 (off) or a cap of at least 1"),
    (["--eps", "1e300"], "--eps must be a finite number in [1e-30, 1]"),
])
def test_values_that_make_training_degenerate_are_refused(flags: list[str], words: str,
                                                          capsys) -> None:
    with pytest.raises(SystemExit):
        parse_args([*TINY, *flags])
    assert words in error_line(capsys.readouterr().err)


@pytest.mark.parametrize("flags, words", [
    (["--muon-lr", "1e30"], "--muon-lr must be <= 1.0"),
    (["--muon-weight-decay", "100"], "--muon-weight-decay 100.0 x --muon-lr 0.02 must be < 1"),
])
def test_an_optimizers_own_values_are_refused_before_the_run(flags: list[str], words: str,
                                                             tmp_path: Path, capsys) -> None:
    # the optimizer's checks (gpt/optim/muon.py's), asked by the preflight first
    assert train_main([*TINY, *QUIET, *flags, "--out-dir", str(tmp_path / "run")]) == 2
    assert words in error_line(capsys.readouterr().err) and not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv", [
    ["tokens", "--data-dir", "d", "--new-max-lr", "nan"],
    ["tokens", "--data-dir", "d", "--new-budgets", "0.5", "inf"],
    ["prepare", "--mb", "inf"],
    ["comm", "allreduce", "--sizes-mb", "nan"],
    ["model", "--peak-tflops", "inf"],
])
def test_the_benchmarks_float_flags_are_finite(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as e:
        bench_cli.main(argv)
    assert e.value.code == 2 and "must be" in error_line(capsys.readouterr().err)


def test_plot_smoothing_is_finite(capsys) -> None:
    from gpt.plot import main as plot_main
    with pytest.raises(SystemExit):
        plot_main(["metrics.jsonl", "--smooth", "nan"])
    assert "--smooth" in error_line(capsys.readouterr().err)


# ---- 7: the tokens bench


def test_a_corpus_without_text_is_one_line(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "empty.txt").write_text("")
    code = bench_cli.main(["tokens", "--data-dir", str(tmp_path / "shards"), "--corpus",
                           str(corpus), "--out", str(tmp_path / "out")])
    assert code == 1 and "holds any text" in error_line(capsys.readouterr().err)


def test_a_corpus_fineweb_refuses_is_one_line(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "short.txt").write_text("too short for 250,000 validation tokens")
    # the bench's one way to run fineweb.py: its own one-line error, after what was run
    with pytest.raises(UserError, match=r"preparing --corpus .* failed: error: --source .*"
                                        r"--val-tokens"):
        tokens_bench.prepare_corpus(corpus, tmp_path / "shards")


@pytest.mark.parametrize("argv", [["--trainer-flags", "--no-compile"],
                                  ["--trainer-flags=--no-compile"]])
def test_trainer_flags_parse_as_the_help_writes_them(argv: list[str]) -> None:
    full = ["tokens", "--data-dir", "d", *argv, "--steps", "3"]
    args = bench_cli.build_parser(full).parse_args(full)
    assert args.trainer_flags == "--no-compile" and args.steps == 3
    assert isinstance(args, argparse.Namespace)


# ---- 8: a refusal suggests valid values only


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
