"""The tokens bench's recipes as parts: the GPT-2 recipe is the trainer's defaults, and each
part of the speedrun-era recipe is a set of config fields on top of them. The bench, its
ablation and the recipe files (configs/cpu-speedrun.toml, tests/project/test_configs.py) read the
recipe here, its one home.

A part is named by what it adds; the full recipe is NEW_PARTS together. A run's flags
also depend on its length (warm-ups are fractions of the steps) and its learning rate.
"""

from __future__ import annotations

from typing import Any

# The parts of today's new recipe, each as the ModelConfig / OptimConfig fields it sets.
PARTS: dict[str, dict[str, Any]] = {
    "rotary": {"rotary": True},
    "rmsnorm": {"rmsnorm": True},
    "qk_norm": {"qk_norm": True},
    "relu2": {"relu2": True},
    "untied_head": {"untied_head": True},
    "zero_init": {"zero_init_proj": True},
    "softcap": {"logit_softcap": 15.0},
    # Muon for the hidden matrices, with the speedrun's settings around it: no weight
    # decay and no learning-rate warm-up (its momentum warms up instead, see MOMENTUM_WARMUP)
    "muon": {"optimizer": "muon", "weight_decay": 0.0},
    # The shape after warm-up: hold the peak, then a straight line to 0 over the last 40%
    "schedule": {"lr_schedule": "trapezoid", "cooldown_frac": 0.4, "min_lr_ratio": 0.0},
    # The speedrun's further parts: off in the recipe until the ablation shows they help
    # at CPU scale (README, "Sample efficiency")
    "value_embeds": {"value_embeds": True},
    "unet_skips": {"unet_skips": True},
    "growing_window": {"attn_window": 64, "attn_window_final": 0},
    "doc_mask": {"doc_mask": True},
}
NEW_PARTS = ("rotary", "rmsnorm", "qk_norm", "relu2", "untied_head", "zero_init", "softcap",
             "muon", "schedule")
EXTRA_PARTS = ("value_embeds", "unet_skips", "growing_window", "doc_mask")

GPT2_WARMUP = 715 / 19073  # the GPT-2 recipe's warm-up, as a fraction of its steps
MOMENTUM_WARMUP = 300 / 1750  # the speedrun's momentum warm-up, as a fraction of its steps
NEW_MAX_LR = 6e-3  # the new recipe's AdamW rate at learning-rate scale 1
NEW_MUON_LR = 0.02  # and its Muon rate


def fields(parts: tuple[str, ...] | list[str], steps: int) -> dict[str, Any]:
    """The config fields (beyond the defaults) of GPT-2 plus `parts`, for a run of `steps`,
    learning rates aside."""
    out: dict[str, Any] = {}
    for name in parts:
        out.update(PARTS[name])
    if "muon" in parts:
        out["warmup_steps"] = 0
        out["muon_momentum_warmup"] = round(MOMENTUM_WARMUP * steps)
    else:
        out["warmup_steps"] = max(1, round(GPT2_WARMUP * steps))
    return out


def lr_fields(parts: tuple[str, ...] | list[str], lr: float, max_lr: float = NEW_MAX_LR,
              muon_lr: float = NEW_MUON_LR) -> dict[str, Any]:
    """The learning rates: `lr` is --max-lr for AdamW alone, and with Muon a scale of
    (max_lr, muon_lr), the rates at scale 1."""
    if "muon" in parts:
        return {"max_lr": max_lr * lr, "muon_lr": muon_lr * lr}
    return {"max_lr": lr}


def to_flags(values: dict[str, Any]) -> list[str]:
    """Config fields as train_gpt2.py flags."""
    out: list[str] = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + name.replace("_", "-"))
        else:
            out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return out


def flags(parts: tuple[str, ...] | list[str], steps: int, lr: float, max_lr: float = NEW_MAX_LR,
          muon_lr: float = NEW_MUON_LR) -> list[str]:
    """train_gpt2.py's flags for GPT-2 plus `parts` over `steps` at learning rate `lr`
    (see lr_fields)."""
    return to_flags({**fields(parts, steps), **lr_fields(parts, lr, max_lr, muon_lr)})
