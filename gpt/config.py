"""Typed configuration: dataclasses, model presets, CLI flags and TOML files.

Values flow one way: dataclass defaults <- model preset <- TOML file <- CLI flags.
Every dataclass field is a CLI flag (``n_layer`` -> ``--n-layer``) with its help text
taken from the field's metadata, so ``--help`` always lists everything. The result is
validated once and frozen.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_args, get_origin


class ConfigError(ValueError):
    """A configuration value a user must change; the message names the flag."""


def _opt(default: Any, help: str, choices: tuple[Any, ...] | None = None) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class ModelConfig:
    block_size: int = _opt(1024, "maximum context length (rows of the position embedding)")
    vocab_size: int = _opt(
        50304,
        "embedding rows; GPT-2's 50257 padded to a multiple of 128 for faster matmuls "
        "(the padded ids are never sampled)",
    )
    n_layer: int = _opt(12, "number of transformer blocks")
    n_head: int = _opt(12, "attention heads per block")
    n_embd: int = _opt(768, "model width d_model (the MLP is 4x this)")
    dropout: float = _opt(0.0, "dropout probability (0 for pre-training)")


# name -> (n_layer, n_head, n_embd). GPT-2's four sizes, the benchmark sizes
# (d_ff = 4 * d_model throughout) and small models for tests and CPU runs.
PRESETS: dict[str, tuple[int, int, int]] = {
    "gpt2": (12, 12, 768),
    "gpt2-medium": (24, 16, 1024),
    "gpt2-large": (36, 20, 1280),
    "gpt2-xl": (48, 25, 1600),
    "small": (12, 12, 768),
    "medium": (24, 16, 1024),
    "large": (36, 20, 1280),
    "xl": (48, 25, 1600),
    "2.7B": (32, 32, 2560),
    "mini": (4, 4, 256),
    "tiny": (2, 2, 64),
}


def model_preset(name: str, **overrides: Any) -> ModelConfig:
    """The ModelConfig of a named preset, with optional field overrides."""
    if name not in PRESETS:
        raise ConfigError(f"--model {name!r} is not a preset; choose one of: {', '.join(PRESETS)}")
    n_layer, n_head, n_embd = PRESETS[name]
    return ModelConfig(**{"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd, **overrides})


@dataclass(frozen=True)
class DataConfig:
    data_dir: str = _opt("data/fineweb-edu-10B", "folder of train_*/val_* token shards")
    batch_size: int = _opt(64, "micro-batch size B: sequences per forward pass per process")
    seq_len: int = _opt(1024, "sequence length T in tokens (at most --block-size)")
    total_batch_tokens: int = _opt(
        524288, "tokens per optimizer step across all processes (2**19 for GPT-2 124M)"
    )
    shuffle: bool = _opt(False, "shuffle the order of training shards each pass")
    check_tokens: bool = _opt(
        False, "scan every shard at start-up for token ids >= --vocab-size (slow on big data)"
    )


@dataclass(frozen=True)
class OptimConfig:
    max_lr: float = _opt(6e-4, "peak learning rate, reached at the end of warm-up")
    min_lr_ratio: float = _opt(0.1, "final learning rate as a fraction of --max-lr")
    warmup_steps: int = _opt(715, "linear warm-up steps")
    weight_decay: float = _opt(0.1, "AdamW weight decay, on tensors of 2 or more dimensions only")
    beta1: float = _opt(0.9, "AdamW beta1")
    beta2: float = _opt(0.95, "AdamW beta2")
    eps: float = _opt(1e-8, "AdamW epsilon")
    grad_clip: float = _opt(1.0, "clip the global gradient norm to this (0 disables)")
    fused: bool | None = _opt(None, "fused AdamW kernel (default: where the device supports it)")


@dataclass(frozen=True)
class TrainConfig:
    max_steps: int = _opt(19073, "optimizer steps (19073 x 2**19 tokens = 10B tokens)")
    device: str = _opt("auto", "device; auto picks cuda > mps > cpu", ("auto", "cuda", "mps", "cpu"))
    dtype: str = _opt(
        "auto",
        "compute precision: bf16/fp16 autocast or plain fp32; auto is bf16 on CUDA "
        "(fp16 where bf16 is missing) and MPS, fp32 on CPU",
        ("auto", "fp32", "bf16", "fp16"),
    )
    tf32: bool = _opt(True, "allow TF32 tensor-core matmuls for fp32 work on CUDA")
    compile: bool | None = _opt(None, "torch.compile the model (default: on for CUDA only)")
    seed: int = _opt(1337, "random seed for initialisation and data order")
    out_dir: str = _opt("runs/gpt2", "folder for the log, metrics, config and checkpoints")
    log_every: int = _opt(1, "print a log line every N steps (loss is read back only then)")
    val_every: int = _opt(250, "validation loss every N steps (0 disables)")
    val_steps: int = _opt(
        20, "micro-batches each process scores per validation (a fixed slice of val_*)"
    )
    sample_every: int = _opt(1000, "print generated samples every N steps (0 disables)")
    sample_prompt: str = _opt("Hello, I'm a language model,", "prompt for the samples")
    sample_tokens: int = _opt(32, "new tokens per sample")
    num_samples: int = _opt(2, "samples generated each time")
    checkpoint_every: int = _opt(1000, "also checkpoint every N steps (0: only at the end)")
    keep_checkpoints: int = _opt(
        3, "keep the newest N periodic checkpoints (the best by val loss is kept as well)"
    )
    resume: str = _opt(
        "none",
        "'auto': continue from the newest complete checkpoint in --out-dir (start fresh if "
        "there is none); a file path: continue from that checkpoint; 'none': start fresh "
        "(refused if --out-dir already holds checkpoints)",
    )
    stop_at_step: int | None = _opt(
        None, "save a checkpoint and stop after this many steps (e.g. to fit a job time limit)"
    )
    max_bad_steps: int = _opt(
        5, "stop after this many steps in a row with a non-finite loss or gradient (they are skipped)"
    )
    parallel: str = _opt(
        "ddp", "data parallelism under torchrun: ddp, zero1 (sharded optimizer) or fsdp "
        "(sharded everything, FSDP2)", ("ddp", "zero1", "fsdp"),
    )
    activation_checkpointing: bool = _opt(
        False, "recompute block activations in backward to save memory (any --parallel mode)"
    )
    dist_timeout: float = _opt(
        600.0, "seconds a collective may wait for the other ranks before the job fails"
    )
    init_from: str | None = _opt(
        None, "start from OpenAI's GPT-2 weights (gpt2, gpt2-medium, gpt2-large, gpt2-xl; "
        "downloaded) or a local Hugging Face GPT-2 folder; the model shape comes from them"
    )
    hellaswag_every: int = _opt(0, "HellaSwag accuracy every N steps and at the end (0 disables)")
    hellaswag_file: str | None = _opt(
        None, "HellaSwag jsonl (default: the official validation set, downloaded once)"
    )
    hellaswag_max_examples: int | None = _opt(
        None, "score only the first N HellaSwag examples (default: all 10,042)"
    )
    nvtx: bool = _opt(False, "NVTX ranges (step, forward, backward, optimizer) for Nsight Systems")
    profile_start: int = _opt(10, "first step recorded by --profile-steps / --torch-profile")
    profile_steps: int = _opt(
        0, "record this many steps from --profile-start between cudaProfilerStart/Stop, "
        "for `nsys --capture-range=cudaProfilerApi` (launch/profile_nsys.sh); 0: off"
    )
    torch_profile: str | None = _opt(
        None, "write a torch.profiler Chrome trace of steps from --profile-start to this folder"
    )
    memory_snapshot: str | None = _opt(
        None, "CUDA: record allocations and write a snapshot here at the end, for pytorch.org/memory_viz"
    )
    peak_tflops: float | None = _opt(
        None, "the device's bf16 dense peak in TFLOP/s for MFU (default: looked up by name)"
    )


@dataclass(frozen=True)
class Config:
    preset: str = "gpt2"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "train": TrainConfig,
}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _field_index() -> dict[str, tuple[str, dataclasses.Field]]:
    """field name -> (section, field). Names are unique across sections, so flags are flat."""
    index: dict[str, tuple[str, dataclasses.Field]] = {}
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            assert f.name not in index, f"duplicate config field {f.name}"
            index[f.name] = (section, f)
    return index


def _field_type(cls: type, f: dataclasses.Field) -> type:
    """The scalar type of a field annotated e.g. 'bool | None' (annotations are strings here)."""
    tp = typing.get_type_hints(cls)[f.name]
    args = get_args(tp)
    if get_origin(tp) in (typing.Union, types.UnionType):
        return next(a for a in args if a is not type(None))
    return tp


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line naming the flag, then `hint`: the full
    usage block would bury it. Every command line of the package uses it."""

    hint = ""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n{self.hint}")


def check_at_least_one(parser: argparse.ArgumentParser, args: argparse.Namespace,
                       names: typing.Iterable[str]) -> None:
    """parser.error for the first of these (optional) int flags that is below 1."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="train_gpt2.py",
        description="Pre-train a GPT-2 model. Values: defaults <- --model preset <- "
        "--config TOML file <- flags.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,  # a typo must not silently match a longer flag
        argument_default=argparse.SUPPRESS,  # so we can tell which flags were given
    )
    parser.hint = "(run with --help to list every flag)\n"
    parser.add_argument("--config", metavar="FILE", help="TOML file of settings (see README)")
    parser.add_argument(
        "--model",
        "--preset",
        dest="preset",
        choices=list(PRESETS),
        help="model size preset (default: gpt2); --n-layer etc. override its values",
    )
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(f"{section} settings")
        for f in fields(cls):
            tp = _field_type(cls, f)
            default = f.default
            help_text = f"{f.metadata['help']} (default: {'auto' if default is None else default})"
            if tp is bool:
                group.add_argument(
                    flag(f.name), action=argparse.BooleanOptionalAction, help=help_text
                )
            else:
                group.add_argument(
                    flag(f.name),
                    type=tp,
                    choices=f.metadata.get("choices"),
                    metavar=None if f.metadata.get("choices") else tp.__name__.upper(),
                    help=help_text,
                )
    # The defaults are already in the help text; the stock formatter would print SUPPRESS.
    parser.formatter_class = argparse.HelpFormatter
    return parser


def _suggest(name: str, options: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ConfigError(
                f"--config {path}: reading TOML on Python 3.10 needs `pip install tomli`"
            ) from None
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file")
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config {path}: not valid TOML: {e}") from None


def _flatten_toml(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """Accept [model]/[data]/[optim]/[train] tables and/or top-level keys; return name -> value."""
    index = _field_index()
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        if key in SECTIONS and isinstance(value, dict):
            names = {f.name for f in fields(SECTIONS[key])}
            for sub, v in value.items():
                if sub not in names:
                    raise ConfigError(
                        f"--config {path}: unknown key {sub!r} in [{key}]{_suggest(sub, names)}"
                    )
                flat[sub] = v
        elif key == "preset" or key in index:
            flat[key] = value
        elif key in SECTIONS:
            raise ConfigError(
                f"--config {path}: {key!r} must be a table ([{key}]); "
                + ("to pick a model size write preset = ..." if key == "model" else "")
            )
        else:
            raise ConfigError(
                f"--config {path}: unknown key {key!r}"
                f"{_suggest(key, [*index, *SECTIONS, 'preset'])}"
            )
    return flat


def _coerce(name: str, value: Any, source: str) -> Any:
    """Check a TOML value's type against the field (TOML has its own types; argparse did CLI)."""
    if name == "preset":
        if value not in PRESETS:
            raise ConfigError(f"{source}: preset {value!r} unknown; choose one of {', '.join(PRESETS)}")
        return value
    section, f = _field_index()[name]
    tp = _field_type(SECTIONS[section], f)
    ok = isinstance(value, tp) and not (tp is int and isinstance(value, bool))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ConfigError(
            f"{source}: {name} = {value!r} must be {tp.__name__} (flag {flag(name)})"
        )
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        raise ConfigError(f"{source}: {name} = {value!r} must be one of {', '.join(choices)}")
    return value


def resolve(values: dict[str, Any]) -> Config:
    """Build a Config from field-name -> value settings (plus 'preset'), then validate it."""
    preset = values.get("preset", Config.preset)
    sections: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    index = _field_index()
    for name, value in values.items():
        if name != "preset":
            sections[index[name][0]][name] = value
    cfg = Config(
        preset=preset,
        model=model_preset(preset, **sections["model"]),
        data=DataConfig(**sections["data"]),
        optim=OptimConfig(**sections["optim"]),
        train=TrainConfig(**sections["train"]),
    )
    validate(cfg)
    return cfg


def parse_args(argv: list[str] | None = None) -> Config:
    """CLI -> Config. A bad flag or value exits with status 2 and a message naming it."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        known = [o for a in parser._actions for o in a.option_strings]
        bad = unknown[0]
        parser.error(f"unrecognized argument {bad!r}{_suggest(bad.split('=')[0], known)}")
    cli = vars(args)
    try:
        values: dict[str, Any] = {}
        config_file = cli.pop("config", None)
        if config_file is not None:
            path = Path(config_file)
            for name, value in _flatten_toml(_load_toml(path), path).items():
                values[name] = _coerce(name, value, f"--config {path}")
        values.update(cli)
        return resolve(values)
    except ConfigError as e:
        parser.error(str(e))
    raise AssertionError("unreachable")  # parser.error exits


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def validate(cfg: Config) -> None:
    """Reject values that cannot work, naming the flag."""
    m, d, o, t = cfg.model, cfg.data, cfg.optim, cfg.train
    for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
        _check(getattr(m, name) >= 1, f"{flag(name)} must be >= 1, got {getattr(m, name)}")
    _check(
        m.n_embd % m.n_head == 0,
        f"--n-embd {m.n_embd} must be divisible by --n-head {m.n_head}",
    )
    _check(0.0 <= m.dropout < 1.0, f"--dropout must be in [0, 1), got {m.dropout}")
    for name in ("batch_size", "seq_len", "total_batch_tokens"):
        _check(getattr(d, name) >= 1, f"{flag(name)} must be >= 1, got {getattr(d, name)}")
    _check(
        d.seq_len <= m.block_size,
        f"--seq-len {d.seq_len} exceeds the model's --block-size {m.block_size}",
    )
    _check(o.max_lr > 0, f"--max-lr must be > 0, got {o.max_lr}")
    _check(0.0 <= o.min_lr_ratio <= 1.0, f"--min-lr-ratio must be in [0, 1], got {o.min_lr_ratio}")
    _check(o.warmup_steps >= 0, f"--warmup-steps must be >= 0, got {o.warmup_steps}")
    _check(o.weight_decay >= 0, f"--weight-decay must be >= 0, got {o.weight_decay}")
    for name in ("beta1", "beta2"):
        _check(0.0 <= getattr(o, name) < 1.0, f"{flag(name)} must be in [0, 1), got {getattr(o, name)}")
    _check(o.eps > 0, f"--eps must be > 0, got {o.eps}")
    _check(o.grad_clip >= 0, f"--grad-clip must be >= 0 (0 disables), got {o.grad_clip}")
    _check(t.max_steps >= 1, f"--max-steps must be >= 1, got {t.max_steps}")
    for name in ("log_every", "val_steps", "sample_tokens", "num_samples"):
        _check(getattr(t, name) >= 1, f"{flag(name)} must be >= 1, got {getattr(t, name)}")
    _check(t.profile_start >= 0, f"--profile-start must be >= 0, got {t.profile_start}")
    _check(t.profile_steps >= 0, f"--profile-steps must be >= 0 (0: off), got {t.profile_steps}")
    _check(t.keep_checkpoints >= 1, f"--keep-checkpoints must be >= 1, got {t.keep_checkpoints}")
    _check(t.max_bad_steps >= 1, f"--max-bad-steps must be >= 1, got {t.max_bad_steps}")
    _check(t.dist_timeout > 0, f"--dist-timeout must be > 0 seconds, got {t.dist_timeout}")
    _check(
        t.stop_at_step is None or t.stop_at_step >= 1,
        f"--stop-at-step must be >= 1, got {t.stop_at_step}",
    )
    _check(bool(t.resume), "--resume must be 'auto', 'none' or a checkpoint path")
    _check(
        t.hellaswag_max_examples is None or t.hellaswag_max_examples >= 1,
        f"--hellaswag-max-examples must be >= 1, got {t.hellaswag_max_examples}",
    )
    for name in ("val_every", "sample_every", "checkpoint_every", "hellaswag_every"):
        _check(getattr(t, name) >= 0, f"{flag(name)} must be >= 0 (0 disables), got {getattr(t, name)}")
    _check(
        t.peak_tflops is None or t.peak_tflops > 0,
        f"--peak-tflops must be > 0, got {t.peak_tflops}",
    )
    _check(bool(t.out_dir), "--out-dir must not be empty")


def grad_accum_steps(total_batch_tokens: int, batch_size: int, seq_len: int, world_size: int) -> int:
    """Micro-steps per optimizer step so that B * T * world_size * steps == total tokens."""
    per_micro = batch_size * seq_len * world_size
    if total_batch_tokens % per_micro != 0:
        raise ConfigError(
            f"--total-batch-tokens {total_batch_tokens} is not divisible by "
            f"--batch-size {batch_size} x --seq-len {seq_len} x world size {world_size} "
            f"= {per_micro} tokens per micro-step; pick a total that is a multiple of "
            f"{per_micro} (e.g. {max(1, round(total_batch_tokens / per_micro)) * per_micro})"
        )
    return total_batch_tokens // per_micro


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def from_dict(d: dict[str, Any]) -> Config:
    """Inverse of to_dict (e.g. a checkpoint's saved config); unknown keys are an error."""
    unknown = set(d) - {"preset", *SECTIONS}
    if unknown:
        raise ConfigError(f"unknown config sections: {', '.join(sorted(unknown))}")
    for name, cls in SECTIONS.items():
        extra = set(d.get(name, {})) - {f.name for f in fields(cls)}
        if extra:
            raise ConfigError(f"unknown [{name}] config fields: {', '.join(sorted(extra))}")
    return Config(
        preset=d.get("preset", Config.preset),
        **{name: cls(**d.get(name, {})) for name, cls in SECTIONS.items()},
    )


def to_toml(cfg: Config) -> str:
    """The resolved config as a TOML file that --config reads back (None = auto is omitted)."""
    lines = [f"preset = {json.dumps(cfg.preset)}"]
    for section in SECTIONS:
        lines.append(f"\n[{section}]")
        for name, value in dataclasses.asdict(getattr(cfg, section)).items():
            if value is None:
                continue
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, str):
                # JSON's escapes (\", \\, \n, \u00XX) are valid in TOML basic strings;
                # ensure_ascii=False keeps other characters literal, since JSON would
                # write non-BMP ones as surrogate pairs, which TOML rejects.
                text = json.dumps(value, ensure_ascii=False)
            else:
                text = repr(value)
            lines.append(f"{name} = {text}")
    return "\n".join(lines) + "\n"


def describe(cfg: Config) -> str:
    """Readable multi-line dump of the resolved config for the start of a run."""
    out = [f"preset: {cfg.preset}"]
    for section in SECTIONS:
        items = dataclasses.asdict(getattr(cfg, section))
        out.append(f"{section}: " + ", ".join(f"{k}={v}" for k, v in items.items()))
    return "\n".join(out)
