"""Weights into a GPT: a state dict loaded exactly (the model allocated once, with no
random initialisation, each tensor checked for its name, shape and finiteness), and a
trainer checkpoint's weights read as a model, for generation, evaluation and export.
Hugging Face GPT-2 folders in are gpt/checkpoint/weights.py's, out gpt/checkpoint/export.py's;
a checkpoint's format is gpt/checkpoint/files.py's."""

from __future__ import annotations

import os

import torch

from gpt.checkpoint.files import CheckpointError
from gpt.checkpoint.files import load as load_checkpoint_file
from gpt.checkpoint.files import model_weights, saved_config
from gpt.core.config import ConfigError, ModelConfig
from gpt.core.errors import UserError
from gpt.engine.step import count_nonfinite
from gpt.model import sizing
from gpt.model.attention_mask import set_attention_step
from gpt.model.transformer import GPT


class PretrainedError(UserError, ValueError):
    """A weights file, folder or model name that cannot be used; the message names it."""


def check_finite(state_dict: dict[str, torch.Tensor], source: str) -> None:
    """Refuse weights that hold NaN, inf or values beyond 1e19 (the trainer's own test),
    naming the file and the first such tensor: trained from or sampled, they give only NaN,
    and the trainer would blame its learning rate."""
    floats = [(k, v) for k, v in state_dict.items() if v.is_floating_point() and v.numel()]
    if not floats or count_nonfinite([v for _, v in floats]).item() == 0:
        return
    bad = [k for k, v in floats if count_nonfinite([v]).item() > 0]
    raise PretrainedError(f"{source}: {bad[0]} holds NaN, inf or values beyond 1e19 "
                          f"({len(bad)} tensor(s) in all); these weights cannot be used")


def build_model(cfg: ModelConfig, state_dict: dict[str, torch.Tensor], source: str,
                device: str | torch.device = "cpu") -> GPT:
    """A GPT holding exactly `state_dict`, allocated once on `device` (no random init),
    after the model's size is judged against the device's memory (gpt/model/sizing.py)."""
    device = torch.device(device)
    try:
        sizing.check_weights_fit_memory(cfg, sizing.device_memory(device), str(device), source)
    except ConfigError as e:
        raise PretrainedError(str(e)) from None
    with torch.device("meta"):
        model = GPT(cfg)
    model.to_empty(device=device)  # GPT.to_empty ties the head again (if tied)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    if missing or unexpected:
        parts = [f"missing {', '.join(missing[:4])}" if missing else "",
                 f"unexpected {', '.join(unexpected[:4])}" if unexpected else ""]
        raise PretrainedError(f"{source}: weights do not match the model ({'; '.join(p for p in parts if p)})")
    for key, value in state_dict.items():
        if value.shape != expected[key].shape:
            raise PretrainedError(f"{source}: {key} has shape {tuple(value.shape)}, the model "
                                  f"expects {tuple(expected[key].shape)}")
    check_finite(state_dict, source)
    model.load_state_dict(state_dict)
    return model


def read_checkpoint(path: str | os.PathLike) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(model config, weights) of a trainer checkpoint, with one-line errors. Only the
    "model" and "config" entries are needed; the file is memory-mapped, so the optimizer
    state in it is never read."""
    try:
        return model_weights(load_checkpoint_file(path, required=("model", "config")), path)
    except CheckpointError as e:
        raise PretrainedError(f"--checkpoint {e}") from None


def load_checkpoint_model(path: str | os.PathLike, device: str | torch.device = "cpu",
                          label: str = "--checkpoint ") -> GPT:
    """The model of a trainer checkpoint, weights checked; errors begin with `label`, how
    the user gave the path (the harness's command line: "model_args checkpoint=")."""
    try:
        ckpt = load_checkpoint_file(path, required=("model", "config"))
        cfg, sd = model_weights(ckpt, path)
        max_steps = saved_config(ckpt, path)["train"]["max_steps"]
    except CheckpointError as e:
        raise PretrainedError(f"{label}{e}") from None
    sd = dict(sd)
    if "lm_head.weight" not in sd and "transformer.wte.weight" in sd and not cfg.untied_head:
        sd["lm_head.weight"] = sd["transformer.wte.weight"]  # tied; a writer may list it once
    model = build_model(cfg, sd, f"{label}{path}", device)
    if isinstance(ckpt.get("step"), int) and ckpt["step"] > 0:
        # A growing attention window: the one its weights were last trained with
        set_attention_step(model, ckpt["step"] - 1, max_steps)
    return model
