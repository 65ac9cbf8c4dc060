"""The rules a configuration must meet, checked once, where it is resolved: each value's
range and the rules across fields (validate()), and the batch arithmetic that turns a
token-count batch into micro-steps (grad_accum_steps()). The schema they check is
gpt/core/config.py's; gpt/core/cli.py and gpt/plan/dry_run.py build a Config only through resolve()."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable

from gpt.core.config import (AUTO, INIT_ONLY, SECTIONS, CheckpointConfig, Config, ConfigError,
                             DataConfig, EvalConfig, ModelConfig, OptimConfig, ProfileConfig,
                             TrainConfig, model_preset)
from gpt.core.config_io import field_index, field_type, flag, spelled


MAX_LR = 1.0  # see validate()
MAX_DIST_TIMEOUT = 7 * 24 * 3600.0  # seconds: no collective should wait longer than a week
MAX_SAMPLES, MAX_SAMPLE_TOKENS = 64, 4096
# Tokens of one micro-batch (--batch-size x --seq-len): 2**31 already needs terabytes of
# logits; beyond it torch's 32-bit index arithmetic and the planner's shapes overflow.
MAX_MICRO_TOKENS = 2**31
MAX_STEP_TOKENS = 2**40  # --total-batch-tokens: a thousand times GPT-3's 3.2M-token batch
# A soft cap C bounds the logits to +-C: below 1 every softmax is nearly uniform and the
# gradient vanishes (1e-40 trained with gradient norm 0). The speedrun's is 15.
MIN_SOFTCAP = 1.0
MIN_EPS, MAX_EPS = 1e-30, 1.0  # AdamW divides by sqrt(v) + eps: 0 in fp32 gives 0/0
FP8_MULTIPLE = 16  # torch._scaled_mm's rule for both dimensions of an FP8 matmul's weight
LIMITS = ("_max_examples", "_limit")  # the endings of an evaluation's limit's field name
TASKS_EXAMPLE = "hellaswag,arc_easy"  # harness tasks, as --eval-tasks lists them


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


def check_value(name: str, value: Any, source: str, optional: bool = False) -> Any:
    """A value read from a file (a TOML config, a checkpoint's saved config) for field
    `name`: of the field's type (an int where a float is wanted becomes one; None only
    where `optional` and the field allows it) and among its choices; else a ConfigError
    naming `source`, the field and its flag. Flags get the same from argparse."""
    tp = field_type(name)
    if value is None and optional and field_index()[name][1].default is None:
        return value
    value = spelled(name, value)  # activation_checkpointing = true: "blocks"
    words = field_index()[name][1].metadata.get("words", ())  # --batch-size auto
    if isinstance(value, str) and value in words:
        return value
    ok = isinstance(value, tp) and not (tp is int and isinstance(value, bool))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        also = "".join(f" or {json.dumps(w)}" for w in words)
        raise ConfigError(f"{source}: {name} = {value!r} must be {tp.__name__}{also} "
                          f"(flag {flag(name)})")
    choices = field_index()[name][1].metadata.get("choices")
    if choices and value not in choices:
        raise ConfigError(f"{source}: {name} = {value!r} must be one of {', '.join(choices)}")
    return value


def check_saved(saved: dict[str, Any], source: str) -> dict[str, Any]:
    """A saved config (a checkpoint's, in today's sections: upgrade_dict's output) checked
    as the command line checks one: every value of its field's type, and the model's
    rules (validate_model); the checked dict, or a ConfigError naming `source`. The
    other sections' ranges were checked by the rules of the day it was written, and rules
    added since must not make a trained model unreadable: of them only the types are
    checked, since readers use a few (max_steps, optimizer)."""
    checked = {section: {name: check_value(name, value, source, optional=True)
                         for name, value in saved[section].items()} for section in SECTIONS}
    try:
        validate_model(ModelConfig(**checked["model"]))
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return {**saved, **checked}


def assumed_defaults(model: dict[str, Any], schema: int | None) -> dict[str, Any]:
    """field -> the default it is read with, for each model field missing from a saved
    config written before config schemas (schema None; in a newer one a missing field is
    upgrade_dict's error). Such a file cannot tell a field added since it was written from
    one removed from it: only the weights can refuse some (check_weights_fit)."""
    if schema is not None:
        return {}
    return {f.name: f.default for f in dataclasses.fields(ModelConfig)
            if f.name not in model and f.name not in INIT_ONLY}


def validate_model(m: ModelConfig) -> None:
    """The model's own rules (validate() runs them first): what a saved config must meet
    too, or the model cannot be built."""
    for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
        _check(getattr(m, name) >= 1, f"{flag(name)} must be >= 1, got {getattr(m, name)}")
    _check(
        m.n_embd % m.n_head == 0,
        f"--n-embd {m.n_embd} must be divisible by --n-head {m.n_head}",
    )
    _check(not m.rotary or (m.n_embd // max(m.n_head, 1)) % 2 == 0,
           f"--rotary rotates channel pairs: the head size --n-embd {m.n_embd} / --n-head "
           f"{m.n_head} must be even")
    _check(m.logit_softcap == 0 or MIN_SOFTCAP <= m.logit_softcap < math.inf,
           f"--logit-softcap {m.logit_softcap}: must be 0 (off) or a cap of at least "
           f"{MIN_SOFTCAP:g} (logits are bounded to +-cap: below 1 the softmax is nearly "
           f"uniform and nothing is learned; the speedrun uses 15)")
    _check(0.0 <= m.dropout < 1.0, f"--dropout must be in [0, 1), got {m.dropout}")
    for name in ("attn_window", "attn_window_final"):
        _check(0 <= getattr(m, name) <= m.block_size,
               f"{flag(name)} {getattr(m, name)}: must be in [0, --block-size {m.block_size}]")
    _check(not m.attn_window_final or 0 < m.attn_window <= m.attn_window_final,
           f"--attn-window-final {m.attn_window_final} needs an --attn-window from 1 up to it, "
           f"got {m.attn_window}")
    _check(not m.value_embeds or m.n_layer >= 2,
           f"--value-embeds shares tables between the first and last blocks: needs --n-layer "
           f">= 2, got {m.n_layer}")


def validate(cfg: Config) -> None:
    """Reject values that cannot work, naming the flag: each section's own rules (in the
    schema's order, each beside the others here), then the rules across sections, then
    every float finite. The fields an optimizer owns, and the layouts it refuses, are its
    own checks (gpt/optim/kind.py's check and layout_problem, which the preflight asks)."""
    for name, rules in SECTION_RULES.items():
        rules(getattr(cfg, name))
    validate_across(cfg)
    for section in SECTIONS:  # last, so the checks above keep their more specific words
        for name, value in dataclasses.asdict(getattr(cfg, section)).items():
            if isinstance(value, float):
                _check(math.isfinite(value), f"{flag(name)} must be a finite number, got {value}")


def validate_data(d: DataConfig) -> None:
    # --batch-size auto is settled before the run (gpt/plan/layout.py), then checked as a number
    auto_batch = d.batch_size == AUTO
    for name in ("seq_len", "total_batch_tokens") if auto_batch else (
            "batch_size", "seq_len", "total_batch_tokens"):
        _check(getattr(d, name) >= 1, f"{flag(name)} must be >= 1, got {getattr(d, name)}")
    _check(auto_batch or d.batch_size * d.seq_len <= MAX_MICRO_TOKENS,
           f"--batch-size {d.batch_size} x --seq-len {d.seq_len} = "
           f"{0 if auto_batch else d.batch_size * d.seq_len} "
           f"tokens per micro-batch: must be at most 2**31 (GPT-2 124M used 64 x 1024)")
    _check(d.total_batch_tokens <= MAX_STEP_TOKENS,
           f"--total-batch-tokens must be at most 2**40, got {d.total_batch_tokens} (GPT-2 "
           f"124M used 524288)")
    _check(bool(d.data_dir), "--data-dir must not be empty (it would be the current "
           "folder); name the folder of the shards ('.' if it is this one)")


def validate_optim(o: OptimConfig) -> None:
    _check(0 < o.cooldown_frac <= 1, f"--cooldown-frac {o.cooldown_frac}: must be in (0, 1]")
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
    _check(MIN_EPS <= o.eps <= MAX_EPS, f"--eps must be a finite number in [{MIN_EPS:g}, {MAX_EPS:g}], got "
           f"{o.eps} (AdamW divides by sqrt(v) + eps; GPT-2 used 1e-8)")
    _check(o.grad_clip >= 0, f"--grad-clip must be >= 0 (0 disables), got {o.grad_clip}")


def validate_train(t: TrainConfig) -> None:
    _check(t.chunked_loss is not False or t.loss_kernel in ("auto", "ours", "fused"),
           f"--loss-kernel {t.loss_kernel} is a kernel of the chunked loss, and "
           f"--no-chunked-loss turns that off: drop one of the two")
    _check(t.chunked_loss is not True or t.loss_kernel != "fused",
           "--loss-kernel fused is the whole logits' cross-entropy, not a kernel of the chunked "
           "loss that --chunked-loss asks for: drop one of the two")
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


def validate_eval(e: EvalConfig) -> None:
    for name in ("val_steps", "sample_tokens", "num_samples"):
        _check(getattr(e, name) >= 1, f"{flag(name)} must be >= 1, got {getattr(e, name)}")
    # Samples are printed for a person to read, in one batch: more would only exhaust memory.
    _check(e.num_samples <= MAX_SAMPLES, f"--num-samples must be <= {MAX_SAMPLES}, got {e.num_samples}")
    _check(e.sample_tokens <= MAX_SAMPLE_TOKENS,
           f"--sample-tokens must be <= {MAX_SAMPLE_TOKENS}, got {e.sample_tokens}")
    # an evaluation's limit on what it scores (N examples), where one is set
    for name in (f.name for f in dataclasses.fields(e) if f.name.endswith(LIMITS)):
        value = getattr(e, name)
        _check(value is None or value >= 1, f"{flag(name)} must be >= 1, got {value}")
    _check(not e.eval_tasks_every or bool(e.eval_tasks),
           f"--eval-tasks-every needs --eval-tasks LIST (e.g. {TASKS_EXAMPLE})")
    _check(e.eval_tasks is None or any(t.strip() for t in e.eval_tasks.split(",")),
           f"--eval-tasks {e.eval_tasks!r} names no task: give a comma-separated list, e.g. "
           f"{TASKS_EXAMPLE}")
    # Tasks named but never scored: a run that was asked for scores must not end without them
    _check(e.eval_tasks is None or e.eval_tasks_every != 0,
           f"--eval-tasks {e.eval_tasks} is scored every --eval-tasks-every N steps (and at "
           f"the end), and that is 0 (off): give N, or drop --eval-tasks")
    for name in (f.name for f in dataclasses.fields(e) if f.name.endswith("_every")):
        _check(getattr(e, name) >= 0, f"{flag(name)} must be >= 0 (0 disables), got {getattr(e, name)}")


def validate_checkpoint(c: CheckpointConfig) -> None:
    _check(c.checkpoint_every >= 0,
           f"--checkpoint-every must be >= 0 (0 disables), got {c.checkpoint_every}")
    _check(c.keep_checkpoints >= 1, f"--keep-checkpoints must be >= 1, got {c.keep_checkpoints}")
    _check(
        c.stop_at_step is None or c.stop_at_step >= 1,
        f"--stop-at-step must be >= 1, got {c.stop_at_step}",
    )
    _check(bool(c.resume), "--resume must be 'auto', 'none' or a checkpoint path")


def validate_profile(p: ProfileConfig) -> None:
    _check(p.profile_start >= 0, f"--profile-start must be >= 0, got {p.profile_start}")
    _check(p.profile_steps >= 0, f"--profile-steps must be >= 0 (0: off), got {p.profile_steps}")
    _check(
        p.peak_tflops is None or p.peak_tflops > 0,
        f"--peak-tflops must be > 0, got {p.peak_tflops}",
    )


# Each section's own rules, by the section's name (gpt/core/config.py's SECTIONS)
SECTION_RULES: dict[str, Callable[[Any], None]] = {
    "model": validate_model, "data": validate_data, "optim": validate_optim,
    "train": validate_train, "eval": validate_eval, "checkpoint": validate_checkpoint,
    "profile": validate_profile,
}


def validate_across(cfg: Config) -> None:
    """The rules between sections: the data's sequences against the model, FP8's."""
    _check(
        cfg.data.seq_len <= cfg.model.block_size,
        f"--seq-len {cfg.data.seq_len} exceeds the model's --block-size {cfg.model.block_size}",
    )
    _check_fp8(cfg)


def _check_fp8(cfg: Config) -> None:
    """--fp8's rules that the config alone decides (the device's are gpt/model/fp8.py's check)."""
    m, t = cfg.model, cfg.train
    if t.fp8 == "none":
        _check(not t.fp8_head, "--fp8-head converts the head too, and --fp8 is none: name a "
               "recipe (--fp8 tensorwise or rowwise), or drop --fp8-head")
        return
    # FP8 matmuls need both dimensions of each weight a multiple of 16, and every linear
    # layer of a block has --n-embd as one of its two: with another width none would convert
    _check(m.n_embd % FP8_MULTIPLE == 0,
           f"--fp8 {t.fp8}: FP8 matmuls need each weight's dimensions to be multiples of "
           f"{FP8_MULTIPLE}, and --n-embd {m.n_embd} is not, so no layer would run in fp8: "
           f"use a width that is a multiple of {FP8_MULTIPLE}, or --fp8 none")
    _check(t.dtype != "fp16", f"--fp8 {t.fp8} computes the rest of the model in bf16 (or fp32): "
           f"use --dtype bf16 (or auto) with it, not fp16")
    if t.fp8_head:
        _check(m.vocab_size % FP8_MULTIPLE == 0,
               f"--fp8-head: the head's --vocab-size {m.vocab_size} is not a multiple of "
               f"{FP8_MULTIPLE}, as FP8 matmuls need (GPT-2's padded 50304 is): pad it, or drop "
               f"--fp8-head")
        # (unset, the chunked loss depends on the device: gpt/model/fp8.py's check decides;
        # --loss-kernel fused keeps the head a matmul of its own)
        _check(t.chunked_loss is not True and t.loss_kernel in ("auto", "fused"),
               "--fp8-head converts the head's own matmul, and the chunked loss runs the head "
               "inside its fused loss (in bf16): drop --chunked-loss and --loss-kernel, or "
               "--fp8-head")


def grad_accum_steps(total_batch_tokens: int, batch_size: int, seq_len: int, world_size: int) -> int:
    """Micro-steps per optimizer step so that B * T * world_size * steps == total tokens,
    or the trainer's ConfigError: the batch must divide into whole micro-batches on every
    rank."""
    if world_size < 1:
        raise ConfigError(f"--world-size {world_size}: a run has at least one process")
    per_micro = batch_size * seq_len * world_size
    if total_batch_tokens % per_micro != 0:
        raise ConfigError(
            f"--total-batch-tokens {total_batch_tokens} is not divisible by "
            f"--batch-size {batch_size} x --seq-len {seq_len} x world size {world_size} "
            f"= {per_micro} tokens per micro-step; pick a total that is a multiple of "
            f"{per_micro} (e.g. {max(1, round(total_batch_tokens / per_micro)) * per_micro})"
        )
    return total_batch_tokens // per_micro
