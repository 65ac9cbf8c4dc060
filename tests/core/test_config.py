"""Tests for gpt.core.config: defaults, presets, CLI flags, TOML files, validation, round trips."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpt.core.cli import parse_args, to_toml
from gpt.core.config import (PRESETS, SECTIONS, CheckpointConfig, EvalConfig, ProfileConfig, Config, ConfigError, DataConfig, ModelConfig, OptimConfig, TrainConfig, model_preset)
from gpt.core.config_check import grad_accum_steps, resolve
from gpt.core.config_io import describe, flag, from_dict, to_dict

from helpers import one_line_error, run_cli

# --------------------------------------------------------------------------
# helpers


def write_toml(tmp_path: Path, text: str, name: str = "cfg.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def parse_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run parse_args expecting exit status 2; return stderr."""
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "error:" in err
    return err


# --------------------------------------------------------------------------
# defaults


def test_defaults_reproduce_gpt2_124m_recipe() -> None:
    cfg = parse_args([])
    assert cfg == Config()
    assert cfg.preset == "gpt2"
    d, o, m, t = cfg.data, cfg.optim, cfg.model, cfg.train
    assert d.total_batch_tokens == 2**19 == 524288
    assert d.batch_size == 64
    assert d.seq_len == 1024
    assert o.max_lr == 6e-4
    assert o.min_lr_ratio == 0.1
    assert o.warmup_steps == 715
    assert t.max_steps == 19073
    assert (o.beta1, o.beta2) == (0.9, 0.95)
    assert o.eps == 1e-8
    assert o.weight_decay == 0.1
    assert o.grad_clip == 1.0
    assert m.vocab_size == 50304
    assert m.block_size == 1024
    assert (m.n_layer, m.n_head, m.n_embd) == (12, 12, 768)
    assert m.dropout == 0.0
    assert grad_accum_steps(d.total_batch_tokens, d.batch_size, d.seq_len, 1) == 8


# --------------------------------------------------------------------------
# --help


def test_help_lists_every_field(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--config" in out
    assert "--model" in out
    n = 0
    for cls in SECTIONS.values():
        for f in dataclasses.fields(cls):
            expected = "--" + f.name.replace("_", "-")
            assert flag(f.name) == expected
            assert expected in out, f"{expected} missing from --help"
            n += 1
    assert list(SECTIONS.values()) == [ModelConfig, DataConfig, OptimConfig, TrainConfig,
                                       EvalConfig, CheckpointConfig, ProfileConfig]
    assert n >= 37  # the fields of the first version, at least
    # bool fields get a --no-X form too
    assert "--no-tf32" in out and "--no-compile" in out and "--no-shuffle" in out


# --------------------------------------------------------------------------
# presets


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset(name: str) -> None:
    cfg = parse_args(["--model", name])
    assert cfg.preset == name
    assert (cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd) == PRESETS[name]
    assert model_preset(name) == cfg.model
    # other model fields keep their defaults
    assert cfg.model.vocab_size == 50304 and cfg.model.block_size == 1024


@pytest.mark.parametrize(
    "name, shape",
    [
        ("gpt2", (12, 12, 768)),
        ("gpt2-medium", (24, 16, 1024)),
        ("gpt2-large", (36, 20, 1280)),
        ("gpt2-xl", (48, 25, 1600)),
        ("2.7B", (32, 32, 2560)),
        ("mini", (4, 4, 256)),
        ("tiny", (2, 2, 64)),
    ],
)
def test_preset_shapes(name: str, shape: tuple[int, int, int]) -> None:
    m = model_preset(name)
    assert (m.n_layer, m.n_head, m.n_embd) == shape


def test_preset_alias_flag() -> None:
    assert parse_args(["--preset", "gpt2-medium"]).model.n_layer == 24


def test_preset_with_override() -> None:
    cfg = parse_args(["--model", "tiny", "--n-layer", "3"])
    assert (cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd) == (3, 2, 64)
    assert model_preset("tiny", n_layer=3) == cfg.model


def test_unknown_preset() -> None:
    with pytest.raises(ConfigError, match="'huge' is not a preset"):
        model_preset("huge")


def test_unknown_preset_flag(capsys: pytest.CaptureFixture[str]) -> None:
    err = parse_error(capsys, ["--model", "huge"])
    assert "--model" in err and "huge" in err


# --------------------------------------------------------------------------
# precedence: defaults <- preset <- TOML <- CLI

PRECEDENCE_TOML = """\
preset = "mini"
max_steps = 77

[model]
n_layer = 6
dropout = 0.25

[train]
dtype = "bf16"
seed = 5

[optim]
max_lr = 3e-4
"""


def test_toml_values_and_preset(tmp_path: Path) -> None:
    path = write_toml(tmp_path, PRECEDENCE_TOML)
    cfg = parse_args(["--config", str(path)])
    assert cfg.preset == "mini"
    # [model] key beats the preset; other preset values stay
    assert (cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd) == (6, 4, 256)
    assert cfg.model.dropout == 0.25
    assert cfg.train.max_steps == 77  # top-level key
    assert cfg.train.dtype == "bf16"
    assert cfg.train.seed == 5
    assert cfg.optim.max_lr == 3e-4
    # untouched values keep their defaults
    assert cfg.data.batch_size == 64
    assert cfg.optim.warmup_steps == 715


def test_cli_beats_toml(tmp_path: Path) -> None:
    path = write_toml(tmp_path, PRECEDENCE_TOML)
    cfg = parse_args(
        ["--config", str(path), "--n-layer", "2", "--max-steps", "9", "--dtype", "fp32", "--model", "tiny"]
    )
    assert cfg.preset == "tiny"
    # CLI preset applies, [model] n_layer from TOML overridden by --n-layer
    assert (cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd) == (2, 2, 64)
    assert cfg.model.dropout == 0.25  # TOML still applies where CLI says nothing
    assert cfg.train.max_steps == 9
    assert cfg.train.dtype == "fp32"
    assert cfg.train.seed == 5


def test_cli_order_independent_of_config_position(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "seed = 5\n")
    assert parse_args(["--seed", "6", "--config", str(path)]).train.seed == 6


def test_toml_int_accepted_for_float(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[optim]\nmax_lr = 1\n")
    cfg = parse_args(["--config", str(path)])
    assert cfg.optim.max_lr == 1.0
    assert isinstance(cfg.optim.max_lr, float)


def test_toml_bools(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[train]\ncompile = false\ntf32 = false\n[data]\nshuffle = true\n")
    cfg = parse_args(["--config", str(path)])
    assert cfg.train.compile is False
    assert cfg.train.tf32 is False
    assert cfg.data.shuffle is True


# --------------------------------------------------------------------------
# TOML errors


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[optim]\nmax_lrr = 1e-3\n", ["unknown key 'max_lrr' in [optim]", "did you mean 'max_lr'"]),
        ("max_lrr = 1e-3\n", ["unknown key 'max_lrr'", "did you mean 'max_lr'"]),
        ("[train]\nbogus_key_xyz = 1\n", ["unknown key 'bogus_key_xyz' in [train]"]),
        ("[data]\nbatch_size = \"big\"\n", ["batch_size = 'big' must be int", "--batch-size"]),
        ("batch_size = true\n", ["batch_size = True must be int"]),
        ("[optim]\nmax_lr = \"fast\"\n", ["max_lr = 'fast' must be float"]),
        ("[train]\ndtype = \"fp8\"\n", ["dtype = 'fp8' must be one of", "bf16"]),
        ("preset = \"huge\"\n", ["preset 'huge' unknown"]),
        ("[train\nseed = 1\n", ["not valid TOML"]),
        ("seed = \n", ["not valid TOML"]),
        ("[model]\nn_head = 5\n", ["--n-embd 768 must be divisible by --n-head 5"]),
    ],
)
def test_toml_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: list[str]
) -> None:
    path = write_toml(tmp_path, text)
    err = parse_error(capsys, ["--config", str(path)])
    assert str(path) in err or "must be divisible" in err  # validation errors name the flag
    for piece in expected:
        assert piece in err, (piece, err)


def test_toml_error_names_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_toml(tmp_path, "[data]\nbatch_size = \"big\"\n", name="my_run.toml")
    err = parse_error(capsys, ["--config", str(path)])
    assert f"--config {path}" in err
    assert "my_run.toml" in err


def test_toml_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nope.toml"
    err = parse_error(capsys, ["--config", str(path)])
    assert f"--config {path}: no such file" in err


def test_toml_directory_is_not_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = parse_error(capsys, ["--config", str(tmp_path)])
    assert "no such file" in err


def test_toml_top_level_model_key_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_toml(tmp_path, 'model = "mini"\n')
    err = parse_error(capsys, ["--config", str(path)])
    assert "did you mean 'model'" not in err
    assert "preset" in err


def test_non_utf8_toml(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_bytes(b"[train]\nout_dir = \"caf\xe9\"\n")
    proc = run_cli("--config", str(cfg))
    assert "run.toml: not valid TOML" in one_line_error(proc, 2)


# --------------------------------------------------------------------------
# CLI rejection


def test_cli_unknown_flag_suggests(capsys: pytest.CaptureFixture[str]) -> None:
    err = parse_error(capsys, ["--max-lrr", "3"])
    assert "unrecognized argument '--max-lrr'" in err
    assert "did you mean '--max-lr'" in err


def test_cli_unknown_flag_with_equals(capsys: pytest.CaptureFixture[str]) -> None:
    err = parse_error(capsys, ["--batch-sise=8"])
    assert "--batch-sise" in err
    assert "did you mean '--batch-size'" in err


def test_cli_no_abbreviations(capsys: pytest.CaptureFixture[str]) -> None:
    err = parse_error(capsys, ["--max-st", "3"])
    assert "unrecognized argument '--max-st'" in err


def test_cli_non_integer(capsys: pytest.CaptureFixture[str]) -> None:
    err = parse_error(capsys, ["--batch-size", "big"])  # which also takes auto (gpt/plan/layout.py)
    assert "--batch-size" in err and "'big' is neither an int nor auto" in err
    err = parse_error(capsys, ["--n-layer", "2.5"])
    assert "--n-layer" in err and "invalid int value: '2.5'" in err


def test_cli_non_float(capsys: pytest.CaptureFixture[str]) -> None:
    err = parse_error(capsys, ["--max-lr", "fast"])
    assert "--max-lr" in err and "invalid float value: 'fast'" in err


def test_cli_bad_choices(capsys: pytest.CaptureFixture[str]) -> None:
    err = parse_error(capsys, ["--dtype", "fp8"])
    assert "--dtype" in err and "invalid choice: 'fp8'" in err
    err = parse_error(capsys, ["--device", "tpu"])
    assert "--device" in err and "invalid choice: 'tpu'" in err


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--n-embd", "100", "--n-head", "3"], "--n-embd 100 must be divisible by --n-head 3"),
        (["--seq-len", "2048"], "--seq-len 2048 exceeds the model's --block-size 1024"),
        (["--block-size", "256"], "--seq-len 1024 exceeds the model's --block-size 256"),
        (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["--seq-len", "0"], "--seq-len must be >= 1, got 0"),
        (["--total-batch-tokens", "0"], "--total-batch-tokens must be >= 1, got 0"),
        (["--n-layer", "0"], "--n-layer must be >= 1, got 0"),
        (["--vocab-size", "0"], "--vocab-size must be >= 1, got 0"),
        (["--max-lr", "0"], "--max-lr must be > 0, got 0.0"),
        (["--max-lr", "nan"], "--max-lr must be > 0, got nan"),
        (["--min-lr-ratio", "1.5"], "--min-lr-ratio must be in [0, 1], got 1.5"),
        (["--min-lr-ratio", "-0.1"], "--min-lr-ratio must be in [0, 1], got -0.1"),
        (["--warmup-steps", "-1"], "--warmup-steps must be >= 0, got -1"),
        (["--weight-decay", "-0.1"], "--weight-decay must be >= 0, got -0.1"),
        (["--beta1", "-0.5"], "--beta1 must be in [0, 1), got -0.5"),
        (["--beta2", "1.0"], "--beta2 must be in [0, 1), got 1.0"),
        (["--eps", "0"], "--eps must be a finite number in [1e-30, 1], got 0.0"),
        (["--dropout", "1.0"], "--dropout must be in [0, 1), got 1.0"),
        (["--grad-clip", "-1"], "--grad-clip must be >= 0 (0 disables), got -1.0"),
        (["--max-steps", "0"], "--max-steps must be >= 1, got 0"),
        (["--val-every", "-1"], "--val-every must be >= 0 (0 disables), got -1"),
        (["--sample-every", "-1"], "--sample-every must be >= 0 (0 disables), got -1"),
        (["--checkpoint-every", "-1"], "--checkpoint-every must be >= 0 (0 disables), got -1"),
        (["--log-every", "0"], "--log-every must be >= 1, got 0"),
        (["--val-steps", "0"], "--val-steps must be >= 1, got 0"),
        (["--num-samples", "0"], "--num-samples must be >= 1, got 0"),
        (["--peak-tflops", "0"], "--peak-tflops must be > 0, got 0.0"),
        (["--out-dir", ""], "--out-dir must not be empty"),
    ],
)
def test_cli_invalid_values(capsys: pytest.CaptureFixture[str], args: list[str], expected: str) -> None:
    err = parse_error(capsys, args)
    assert expected in err, err


def test_resolve_raises_config_error() -> None:
    with pytest.raises(ConfigError, match=r"--batch-size must be >= 1, got 0"):
        resolve({"batch_size": 0})


def test_valid_edge_values_accepted() -> None:
    cfg = parse_args(
        [
            "--min-lr-ratio", "0", "--warmup-steps", "0", "--grad-clip", "0", "--val-every", "0",
            "--beta2", "0", "--seq-len", "1024", "--block-size", "1024", "--dropout", "0.5",
        ]
    )  # fmt: skip
    assert cfg.optim.min_lr_ratio == 0.0
    assert cfg.optim.grad_clip == 0.0
    assert cfg.eval.val_every == 0
    assert cfg.model.dropout == 0.5


# --------------------------------------------------------------------------
# boolean flags


def test_boolean_flags() -> None:
    default = parse_args([])
    assert default.train.tf32 is True
    assert default.train.compile is None  # auto
    assert default.optim.fused is None
    assert default.data.shuffle is False
    assert parse_args(["--no-tf32"]).train.tf32 is False
    assert parse_args(["--compile"]).train.compile is True
    assert parse_args(["--no-compile"]).train.compile is False
    assert parse_args(["--fused"]).optim.fused is True
    assert parse_args(["--shuffle"]).data.shuffle is True


def test_bool_flag_takes_no_value(capsys: pytest.CaptureFixture[str]) -> None:
    err = parse_error(capsys, ["--compile", "yes"])
    assert "'yes'" in err


# --------------------------------------------------------------------------
# grad_accum_steps


def test_grad_accum_steps() -> None:
    assert grad_accum_steps(2**19, 64, 1024, 1) == 8
    assert grad_accum_steps(2**19, 64, 1024, 8) == 1
    assert grad_accum_steps(2**19, 16, 1024, 2) == 16
    assert grad_accum_steps(4 * 3 * 5, 4, 3, 1) == 5


def test_grad_accum_steps_not_divisible() -> None:
    with pytest.raises(ConfigError) as exc:
        grad_accum_steps(500000, 64, 1024, 2)
    msg = str(exc.value)
    for piece in ("500000", "--batch-size 64", "--seq-len 1024", "world size 2", "131072"):
        assert piece in msg, (piece, msg)
    # the suggestion is itself a multiple of the micro-step size
    assert "e.g. 524288" in msg


def test_grad_accum_steps_world_too_big() -> None:
    # 2**19 tokens over 16 GPUs at 64 x 1024 is half a micro-step each
    with pytest.raises(ConfigError, match="world size 16"):
        grad_accum_steps(2**19, 64, 1024, 16)


# --------------------------------------------------------------------------
# round trips


def _nondefault_config() -> Config:
    return resolve(
        {
            "preset": "mini",
            "n_layer": 3,
            "dropout": 0.125,
            "vocab_size": 50257,
            "batch_size": 4,
            "seq_len": 128,
            "data_dir": "/tmp/some data/dir",
            "shuffle": True,
            "max_lr": 1.5e-3,
            "eps": 1e-10,
            "fused": False,
            "tf32": False,
            "dtype": "bf16",
            "sample_prompt": 'He said "hi", then left\\ with a tab\t and é',
            "peak_tflops": 123.5,
            # compile left None (auto)
        }
    )


def test_to_toml_round_trip(tmp_path: Path) -> None:
    cfg = _nondefault_config()
    assert cfg != Config()
    assert cfg.train.compile is None
    path = write_toml(tmp_path, to_toml(cfg), name="saved.toml")
    back = parse_args(["--config", str(path)])
    assert back == cfg
    assert back.train.compile is None
    assert back.eval.sample_prompt == 'He said "hi", then left\\ with a tab\t and é'
    assert back.optim.fused is False


def test_to_toml_round_trip_defaults(tmp_path: Path) -> None:
    path = write_toml(tmp_path, to_toml(Config()))
    assert parse_args(["--config", str(path)]) == Config()


def test_to_toml_omits_none() -> None:
    text = to_toml(Config())
    assert "\ncompile = " not in text  # None (auto) is omitted; compile_mode is a string
    assert "fused" not in text
    assert "peak_tflops" not in text
    assert "tf32 = true" in text
    for section in SECTIONS:
        assert f"[{section}]" in text


def test_to_toml_round_trip_non_bmp(tmp_path: Path) -> None:
    cfg = resolve({"sample_prompt": "Hello \U0001F600"})
    path = write_toml(tmp_path, to_toml(cfg))
    assert parse_args(["--config", str(path)]) == cfg


def test_dict_round_trip() -> None:
    cfg = _nondefault_config()
    d = to_dict(cfg)
    assert d["preset"] == "mini"
    assert d["model"]["n_layer"] == 3
    assert d["train"]["compile"] is None
    assert from_dict(d) == cfg
    assert from_dict(to_dict(Config())) == Config()


def test_from_dict_unknown_section_key() -> None:
    d = to_dict(Config())
    d["optim"]["max_lrr"] = 1.0
    with pytest.raises(ConfigError, match="max_lrr"):
        from_dict(d)


def test_from_dict_unknown_top_level_key() -> None:
    d = to_dict(Config())
    d["optimizer"] = {"max_lr": 1.0}
    with pytest.raises((TypeError, ValueError, KeyError)):
        from_dict(d)


# --------------------------------------------------------------------------
# frozen, describe


def test_frozen() -> None:
    cfg = parse_args([])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.preset = "tiny"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model.n_layer = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.optim.max_lr = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.data.batch_size = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.seed = 1  # type: ignore[misc]


def test_describe() -> None:
    cfg = parse_args(["--model", "tiny", "--seed", "42"])
    text = describe(cfg)
    assert "preset: tiny" in text
    for section in SECTIONS:
        assert f"{section}: " in text
    assert "n_layer=2" in text
    assert "seed=42" in text
    assert "max_lr=0.0006" in text
    lines = text.splitlines()
    # a section a paragraph, wrapped to 100 columns (one 600-column line is not readable)
    assert [line.split(":")[0] for line in lines if not line.startswith(" ")] == ["preset", *SECTIONS]
    assert max(len(line) for line in lines) <= 100


# --------------------------------------------------------------------------
# sections per component, and the layout before the split


def test_each_component_has_its_section(tmp_path: Path) -> None:
    text = "[eval]\nval_every = 7\n[checkpoint]\nkeep_checkpoints = 2\n[profile]\nnvtx = true\n"
    cfg = parse_args(["--config", str(write_toml(tmp_path, text))])
    assert (cfg.eval.val_every, cfg.checkpoint.keep_checkpoints, cfg.profile.nvtx) == (7, 2, True)
    assert parse_args(["--stop-at-step", "3"]).checkpoint.stop_at_step == 3


def test_a_field_in_another_components_section_is_refused(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[eval]\nseed = 3\n")
    assert "unknown key 'seed' in [eval]" in parse_error(capsys, ["--config", str(path)])


def test_old_train_table_still_holds_the_fields_that_moved(tmp_path: Path) -> None:
    # Config files written before the split kept these under [train].
    text = ("[train]\nseed = 4\nval_every = 9\nresume = \"auto\"\nprofile_steps = 2\n"
            "sample_prompt = \"Hi\"\n")
    cfg = parse_args(["--config", str(write_toml(tmp_path, text))])
    assert cfg.train.seed == 4 and cfg.eval.val_every == 9 and cfg.eval.sample_prompt == "Hi"
    assert cfg.checkpoint.resume == "auto" and cfg.profile.profile_steps == 2


def test_old_checkpoint_config_layout_loads() -> None:
    cfg = Config()
    old = to_dict(cfg)
    for section in ("eval", "checkpoint", "profile"):
        old["train"].update(old.pop(section))  # everything under "train", as saved before
    assert from_dict(old) == cfg
