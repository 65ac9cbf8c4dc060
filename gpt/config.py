"""The configuration schema: one frozen dataclass per component, model presets, and the
cross-field rules checked once by validate().

Values flow one way: dataclass defaults <- model preset <- TOML file <- CLI flags
(gpt/cli.py reads the last two), then validate(), then the frozen Config is passed
down. Every field is a flag (``n_layer`` -> ``--n-layer``) whose help is the field's
metadata, so field names are unique across sections.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Any, get_args, get_origin

from gpt.errors import UserError


class ConfigError(UserError, ValueError):
    """A configuration value a user must change; the message names the flag."""

    exit_code = 2  # argparse's status for a bad command line


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
    # Beyond GPT-2: the parts of today's fast small-model recipes (the public 124M
    # speedrun's). Each is off by default; with all off the model is GPT-2's, bit for bit.
    rotary: bool = _opt(False, "rotary position embeddings in attention, in place of the "
                        "learned position embedding")
    rmsnorm: bool = _opt(False, "RMSNorm in place of LayerNorm")
    qk_norm: bool = _opt(False, "RMS-normalise each head's queries and keys before attention")
    relu2: bool = _opt(False, "ReLU^2 in the MLP in place of GELU")
    untied_head: bool = _opt(False, "an LM head of its own instead of the token embedding")
    zero_init_proj: bool = _opt(False, "zero-initialise each block's two output projections "
                                "(and an untied head)")
    logit_softcap: float = _opt(0.0, "soft-cap the logits at +-C (C * tanh(z / C)); 0: off")


# ModelConfig's fields that only choose the starting weights, not the model: a resume may
# change them, and an export does not look at them
INIT_ONLY = ("zero_init_proj",)


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
    data_dir: str = _opt("data/fineweb-edu-10B", "folder of train_*/val_* token shards "
                         "(fineweb.py's; llm.c's .bin and build-nanogpt's .npy shards too)")
    batch_size: int = _opt(64, "micro-batch size B: sequences per forward pass per process")
    seq_len: int = _opt(1024, "sequence length T in tokens (at most --block-size)")
    total_batch_tokens: int = _opt(
        524288, "tokens per optimizer step across all processes (2**19 for GPT-2 124M)"
    )
    shuffle: bool = _opt(False, "shuffle the order of training shards each pass")
    check_tokens: bool = _opt(
        False, "scan every shard at start-up for token ids outside the vocabulary (slow on big data)"
    )
    allow_incomplete_data: bool = _opt(
        False, "train on a data folder that fineweb.py is still writing (a warning, not an error)"
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
    lr_schedule: str = _opt(
        "cosine", "after warm-up: cosine (GPT-2) down to the min, or trapezoid: hold --max-lr, "
        "then a straight line down to the min over the last --cooldown-frac of the steps",
        ("cosine", "trapezoid"))
    cooldown_frac: float = _opt(0.4, "the trapezoid schedule's final decay, as a fraction of "
                                "--max-steps")
    optimizer: str = _opt(
        "adamw", "adamw, or muon: Muon for the blocks' weight matrices and AdamW (at "
        "--max-lr) for embeddings, head, biases and gains", ("adamw", "muon"))
    muon_lr: float = _opt(0.02, "Muon's peak learning rate (the schedule scales it as --max-lr's)")
    muon_momentum: float = _opt(0.95, "Muon's momentum (Nesterov)")
    muon_momentum_warmup: int = _opt(0, "steps over which Muon's momentum rises from 0.85 to "
                                     "--muon-momentum (0: none)")
    muon_weight_decay: float = _opt(0.0, "Muon's decoupled weight decay (x its learning rate)")


@dataclass(frozen=True)
class TrainConfig:
    """How the steps run: length, device, precision, parallelism."""

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
    compile_mode: str = _opt(
        "default", "torch.compile mode (default: default, inductor's usual kernels): "
        "max-autotune searches kernel configs (minutes of compiling), reduce-overhead adds "
        "CUDA graphs",
        ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    )
    seed: int = _opt(1337, "random seed for initialisation and data order")
    out_dir: str = _opt("runs/gpt2", "folder for the log, metrics, config and checkpoints")
    log_every: int = _opt(1, "print a log line every N steps (loss is read back only then)")
    tensorboard: bool = _opt(
        False, "also write every metrics record as TensorBoard events to OUT_DIR/tensorboard "
        "(pip install 'gpt2-trainer[tensorboard]')"
    )
    wandb_project: str | None = _opt(
        None, "also log every metrics record to Weights & Biases in this project "
        "(pip install 'gpt2-trainer[wandb]'; WANDB_MODE=offline keeps the run on disk)"
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
    fsdp_param_dtype: str = _opt(
        "fp32", "--parallel fsdp: the dtype parameters are all-gathered and computed in. fp32: "
        "as the other modes (autocast does the bf16 matmuls); bf16: half the all-gather "
        "traffic and unsharded-parameter memory, torchtitan's default, with LayerNorm gains "
        "and the residual stream between blocks in bf16 too, so the loss curve differs "
        "slightly. Either way gradients are reduced, and the weights and AdamW state kept, "
        "in fp32", ("fp32", "bf16"),
    )
    finite_check_every: int = _opt(
        100, "check that the weights and optimizer state are finite every N steps (and before "
        "every checkpoint, always); a step whose gradient is not finite is skipped on the "
        "device either way"
    )
    dist_timeout: float = _opt(
        600.0, "seconds a collective may wait for the other ranks before the job fails"
    )
    cpu_malloc_reuse: bool = _opt(
        True, "on CPU (Linux, glibc): keep freed memory for reuse instead of handing big blocks "
        "back to the OS every step; about 2x faster small-model steps for more resident memory "
        "(benchmarks/cpu_malloc.md)"
    )
    chunked_loss: bool = _opt(
        True, "the head and cross-entropy fused and computed a chunk of rows at a time, so "
        "the whole logits and their gradient are never held (gpt/chunked_ce.py); "
        "--no-chunked-loss: the plain head and F.cross_entropy"
    )
    init_from: str | None = _opt(
        None, "start from OpenAI's GPT-2 weights (gpt2, gpt2-medium, gpt2-large, gpt2-xl; "
        "downloaded) or a local Hugging Face GPT-2 folder; the model shape comes from them"
    )

    def compile_on(self, device_type: str) -> bool:
        """--compile as given, or (unset) on for CUDA only."""
        return self.compile if self.compile is not None else device_type == "cuda"


@dataclass(frozen=True)
class EvalConfig:
    """What the run measures and shows along the way: validation, HellaSwag, samples."""

    val_every: int = _opt(250, "validation loss every N steps (0 disables)")
    val_steps: int = _opt(
        20, "micro-batches each process scores per validation (a fixed slice of val_*)"
    )
    sample_every: int = _opt(1000, "print generated samples every N steps (0 disables)")
    sample_prompt: str = _opt("Hello, I'm a language model,", "prompt for the samples")
    sample_tokens: int = _opt(32, "new tokens per sample")
    num_samples: int = _opt(2, "samples generated each time")
    hellaswag_every: int = _opt(0, "HellaSwag accuracy every N steps and at the end (0 disables)")
    hellaswag_file: str | None = _opt(
        None, "HellaSwag jsonl (default: the official validation set, downloaded once)"
    )
    hellaswag_max_examples: int | None = _opt(
        None, "score only the first N HellaSwag examples (default: all 10,042)"
    )


@dataclass(frozen=True)
class CheckpointConfig:
    """When checkpoints are written and kept, and where a run starts from."""

    checkpoint_every: int = _opt(1000, "also checkpoint every N steps (0: only at the end)")
    save_checkpoints: bool = _opt(
        True, "write checkpoints (--no-save-checkpoints: none at all, not even at the end or on "
        "a stop signal; for benchmarks)"
    )
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


@dataclass(frozen=True)
class ProfileConfig:
    """Where the time and memory go: profiler windows, traces, snapshots, MFU's peak."""

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
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "checkpoint": CheckpointConfig,
    "profile": ProfileConfig,
}

MAX_LR = 1.0  # see validate()
MAX_DIST_TIMEOUT = 7 * 24 * 3600.0  # seconds: no collective should wait longer than a week
MAX_SAMPLES, MAX_SAMPLE_TOKENS = 64, 4096

# Before these sections were split off, all their fields lived under [train]: config
# files and checkpoints written then still name them there.
FORMERLY_TRAIN = ("train", "eval", "checkpoint", "profile")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@functools.cache
def field_index() -> dict[str, tuple[str, dataclasses.Field]]:
    """field name -> (section, field). Names are unique across sections, so flags are flat."""
    index: dict[str, tuple[str, dataclasses.Field]] = {}
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            assert f.name not in index, f"duplicate config field {f.name}"
            index[f.name] = (section, f)
    return index


@functools.cache
def field_type(name: str) -> type:
    """The scalar type of a field annotated e.g. 'bool | None' (annotations are strings here)."""
    section, _ = field_index()[name]
    tp = typing.get_type_hints(SECTIONS[section])[name]
    if get_origin(tp) in (typing.Union, types.UnionType):
        return next(a for a in get_args(tp) if a is not type(None))
    return tp


def section_names(section: str) -> set[str]:
    """The field names a [section] table may hold (old [train] tables: every formerly-train one)."""
    owners = FORMERLY_TRAIN if section == "train" else (section,)
    return {f.name for s in owners for f in fields(SECTIONS[s])}


def resolve(values: dict[str, Any]) -> Config:
    """Build a Config from field-name -> value settings (plus 'preset'), then validate it."""
    preset = values.get("preset", Config.preset)
    sections: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    for name, value in values.items():
        if name != "preset":
            sections[field_index()[name][0]][name] = value
    model = model_preset(preset, **sections.pop("model"))
    cfg = Config(preset=preset, model=model,
                 **{s: SECTIONS[s](**kw) for s, kw in sections.items()})
    validate(cfg)
    return cfg


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def validate(cfg: Config) -> None:
    """Reject values that cannot work, naming the flag."""
    m, d, o, t = cfg.model, cfg.data, cfg.optim, cfg.train
    e, c, p = cfg.eval, cfg.checkpoint, cfg.profile
    for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
        _check(getattr(m, name) >= 1, f"{flag(name)} must be >= 1, got {getattr(m, name)}")
    _check(
        m.n_embd % m.n_head == 0,
        f"--n-embd {m.n_embd} must be divisible by --n-head {m.n_head}",
    )
    # Muon orthogonalises each matrix as a whole; under FSDP2 a rank holds row shards
    _check(not (o.optimizer == "muon" and t.parallel == "fsdp"),
           "--optimizer muon orthogonalises whole weight matrices, and --parallel fsdp holds "
           "row shards of them: use --parallel ddp or zero1 with Muon")
    _check(0 < o.cooldown_frac <= 1, f"--cooldown-frac {o.cooldown_frac}: must be in (0, 1]")
    for name in ("muon_lr", "muon_momentum", "muon_weight_decay"):
        _check(getattr(o, name) >= 0 and math.isfinite(getattr(o, name)),
               f"{flag(name)} {getattr(o, name)}: must be a finite number >= 0")
    _check(o.muon_momentum < 1, f"--muon-momentum {o.muon_momentum}: must be below 1")
    _check(o.muon_momentum_warmup >= 0,
           f"--muon-momentum-warmup {o.muon_momentum_warmup}: must be >= 0")
    _check(not m.rotary or (m.n_embd // max(m.n_head, 1)) % 2 == 0,
           f"--rotary rotates channel pairs: the head size --n-embd {m.n_embd} / --n-head "
           f"{m.n_head} must be even")
    _check(m.logit_softcap >= 0 and math.isfinite(m.logit_softcap),
           f"--logit-softcap {m.logit_softcap}: must be 0 (off) or a positive cap")
    _check(0.0 <= m.dropout < 1.0, f"--dropout must be in [0, 1), got {m.dropout}")
    for name in ("batch_size", "seq_len", "total_batch_tokens"):
        _check(getattr(d, name) >= 1, f"{flag(name)} must be >= 1, got {getattr(d, name)}")
    _check(
        d.seq_len <= m.block_size,
        f"--seq-len {d.seq_len} exceeds the model's --block-size {m.block_size}",
    )
    _check(o.max_lr > 0, f"--max-lr must be > 0, got {o.max_lr}")
    # AdamW moves each weight by about the learning rate every step, and GPT-2's weights
    # are about 0.02: a rate above 1 can only destroy them (inf, 1e6 and 1e39 were typos).
    _check(o.max_lr <= MAX_LR, f"--max-lr must be <= {MAX_LR}, got {o.max_lr} (GPT-2 used 6e-4)")
    _check(0.0 <= o.min_lr_ratio <= 1.0, f"--min-lr-ratio must be in [0, 1], got {o.min_lr_ratio}")
    _check(o.warmup_steps >= 0, f"--warmup-steps must be >= 0, got {o.warmup_steps}")
    _check(o.weight_decay >= 0, f"--weight-decay must be >= 0, got {o.weight_decay}")
    # Decoupled decay multiplies the weights by 1 - lr * wd each step: at 1 or more it
    # zeroes or flips them.
    _check(o.max_lr * o.weight_decay < 1, f"--weight-decay {o.weight_decay} x --max-lr {o.max_lr} "
           f"must be < 1 (each step multiplies the weights by 1 - lr x weight decay)")
    for name in ("beta1", "beta2"):
        _check(0.0 <= getattr(o, name) < 1.0, f"{flag(name)} must be in [0, 1), got {getattr(o, name)}")
    _check(o.eps > 0, f"--eps must be > 0, got {o.eps}")
    _check(o.grad_clip >= 0, f"--grad-clip must be >= 0 (0 disables), got {o.grad_clip}")
    _check(t.max_steps >= 1, f"--max-steps must be >= 1, got {t.max_steps}")
    _check(t.log_every >= 1, f"--log-every must be >= 1, got {t.log_every}")
    _check(t.max_bad_steps >= 1, f"--max-bad-steps must be >= 1, got {t.max_bad_steps}")
    _check(t.finite_check_every >= 1,
           f"--finite-check-every must be >= 1, got {t.finite_check_every}")
    _check(0 < t.dist_timeout <= MAX_DIST_TIMEOUT,
           f"--dist-timeout must be > 0 and at most {MAX_DIST_TIMEOUT:.0f} seconds (a week), "
           f"got {t.dist_timeout}")
    _check(0 <= t.seed < 2**32, f"--seed must be in [0, 2**32), got {t.seed}")
    _check(bool(t.out_dir), "--out-dir must not be empty")
    for name in ("val_steps", "sample_tokens", "num_samples"):
        _check(getattr(e, name) >= 1, f"{flag(name)} must be >= 1, got {getattr(e, name)}")
    # Samples are printed for a person to read, in one batch: more would only exhaust memory.
    _check(e.num_samples <= MAX_SAMPLES, f"--num-samples must be <= {MAX_SAMPLES}, got {e.num_samples}")
    _check(e.sample_tokens <= MAX_SAMPLE_TOKENS,
           f"--sample-tokens must be <= {MAX_SAMPLE_TOKENS}, got {e.sample_tokens}")
    _check(
        e.hellaswag_max_examples is None or e.hellaswag_max_examples >= 1,
        f"--hellaswag-max-examples must be >= 1, got {e.hellaswag_max_examples}",
    )
    for name in ("val_every", "sample_every", "hellaswag_every"):
        _check(getattr(e, name) >= 0, f"{flag(name)} must be >= 0 (0 disables), got {getattr(e, name)}")
    _check(c.checkpoint_every >= 0,
           f"--checkpoint-every must be >= 0 (0 disables), got {c.checkpoint_every}")
    _check(c.keep_checkpoints >= 1, f"--keep-checkpoints must be >= 1, got {c.keep_checkpoints}")
    _check(
        c.stop_at_step is None or c.stop_at_step >= 1,
        f"--stop-at-step must be >= 1, got {c.stop_at_step}",
    )
    _check(bool(c.resume), "--resume must be 'auto', 'none' or a checkpoint path")
    _check(p.profile_start >= 0, f"--profile-start must be >= 0, got {p.profile_start}")
    _check(p.profile_steps >= 0, f"--profile-steps must be >= 0 (0: off), got {p.profile_steps}")
    _check(
        p.peak_tflops is None or p.peak_tflops > 0,
        f"--peak-tflops must be > 0, got {p.peak_tflops}",
    )
    for section in SECTIONS:  # last, so the checks above keep their more specific words
        for name, value in dataclasses.asdict(getattr(cfg, section)).items():
            if isinstance(value, float):
                _check(math.isfinite(value), f"{flag(name)} must be a finite number, got {value}")


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


def upgrade_dict(d: dict[str, Any]) -> dict[str, Any]:
    """A saved config dict in today's sections: fields that an older layout kept under
    "train" move to their own section, and fields added since it was saved take their
    defaults (a new option's default is what the code did before it existed). Unknown
    sections or fields are an error."""
    unknown = set(d) - {"preset", *SECTIONS}
    if unknown:
        raise ConfigError(f"unknown config sections: {', '.join(sorted(unknown))}")
    out: dict[str, Any] = {"preset": d.get("preset", Config.preset)}
    out.update({name: dataclasses.asdict(cls()) for name, cls in SECTIONS.items()})
    for section in SECTIONS:
        values = d.get(section, {})
        extra = set(values) - section_names(section)
        if extra:
            raise ConfigError(f"unknown [{section}] config fields: {', '.join(sorted(extra))}")
        for name, value in values.items():
            out[field_index()[name][0]][name] = value
    return out


def from_dict(d: dict[str, Any]) -> Config:
    """Inverse of to_dict (e.g. a checkpoint's saved config, in any earlier layout)."""
    d = upgrade_dict(d)
    return Config(preset=d["preset"], **{name: cls(**d[name]) for name, cls in SECTIONS.items()})


def describe(cfg: Config, width: int = 100) -> str:
    """The resolved config for the start of a run: a section a paragraph, wrapped."""
    out = [f"preset: {cfg.preset}"]
    for section in SECTIONS:
        line = f"{section + ':':<12}"
        for k, v in dataclasses.asdict(getattr(cfg, section)).items():
            item = f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
            if len(line) + len(item) > width and line.strip() != section + ":":
                out.append(line.rstrip())  # a value never breaks across lines
                line = " " * 12
            line += item + " "
        out.append(line.rstrip())
    return "\n".join(out)
