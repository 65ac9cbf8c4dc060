"""Vetting what a file named like a checkpoint holds, before a resume uses it.

Any file can carry a checkpoint's name: one copied in from another run, edited, written by
an older version or by another program. So every entry a resume reads is checked for its
type and shape, the weights and AdamW state for finiteness, and the stored step against
the data position saved beside it. A failure is a BadContents naming the entry;
gpt/checkpoint/files.py adds the file's name, and --resume auto moves on to an older file.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gpt.core.config import ModelConfig
from gpt.core.rng import check_rng_state
from gpt.data.loader import check_loader_state, windows_passed
from gpt.engine import parallel
from gpt.engine.step import count_nonfinite
from gpt.model import sizing
from gpt.model.transformer import GPT


class BadContents(ValueError):
    """An entry of a checkpoint that a resume cannot use; the message names it."""


def stored_step(ckpt: Any) -> int:
    """The step a checkpoint holds, unless it is not a step count or is more than its
    loader's position allows (each step draws at least one batch: an edited file, or one
    pieced together from two runs). A loader state that is not one is check_contents' to
    name; the bound is checked wherever it can be read."""
    step = ckpt.get("step") if isinstance(ckpt, dict) else None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise BadContents(f"'step' is {step!r}, not a step count")
    try:
        state = ckpt["loader"][0]
        check_loader_state(state)
        bound = windows_passed(state)
    except (KeyError, IndexError, TypeError, ValueError):
        return step
    if step > bound:
        raise BadContents(f"holds step {step}, but its data position (pass {state['epoch']}, "
                          f"step {state['step']}) allows at most {bound}: its contents "
                          f"contradict themselves")
    return step


def check_weights_fit(cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> None:
    """The weights' names and shapes are those of cfg's model (a rotary one has no
    position embedding, an untied head a weight of its own), and a tied head is the
    embedding; a tied head may be listed once. What weights cannot show (--relu2,
    --qk-norm, --logit-softcap) the config schema's version guards (config.upgrade_dict);
    a file from before schemas gets a warning naming the fields assumed (model_weights).
    The size comes first, by arithmetic (sizing.check_weights_size): a config edited to
    an absurd size is refused before a model of that size is built to compare names and
    shapes."""
    try:
        sizing.check_weights_size(cfg, weights)
    except ValueError as e:
        raise BadContents(str(e)) from None
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in GPT(cfg).state_dict().items()}
    got = {k: tuple(v.shape) for k, v in weights.items()}
    if not cfg.untied_head and "lm_head.weight" not in got:
        got["lm_head.weight"] = expected.get("lm_head.weight")  # type: ignore[assignment]
    if got != expected:
        missing = sorted(set(expected) - set(got))
        extra = sorted(set(got) - set(expected))
        shapes = [f"{k} {got[k]} (the config's model: {expected[k]})"
                  for k in sorted(set(got) & set(expected)) if got[k] != expected[k]]
        what = "; ".join(p for p in (
            f"missing {', '.join(missing[:3])}" if missing else "",
            f"unexpected {', '.join(extra[:3])}" if extra else "",
            f"shapes {', '.join(shapes[:2])}" if shapes else "") if p)
        raise BadContents(f"its weights do not fit the model its config describes ({what}): "
                          f"the config or the weights were changed")
    head, wte = weights.get("lm_head.weight"), weights.get("transformer.wte.weight")
    if (not cfg.untied_head and head is not None and wte is not None
            and head.data_ptr() != wte.data_ptr() and not torch.equal(head, wte)):
        raise BadContents("its head (lm_head.weight) is not its token embedding, but its "
                          "config ties them (untied_head is off): the config lost "
                          "--untied-head, or the weights were changed")


def check_contents(ckpt: dict[str, Any], model_cfg: ModelConfig) -> None:
    """Types and shapes of everything a resume reads, a step its data position allows, and
    finite weights and optimizer state, so a wrong file is a one-line error."""
    model, optim = ckpt.get("model"), ckpt.get("optimizer")
    if not isinstance(model, dict) or not all(torch.is_tensor(v) for v in model.values()):
        raise BadContents("'model' is not a dict of tensors")
    with torch.device("meta"):
        meta = GPT(model_cfg)
    expected = {k: tuple(v.shape) for k, v in meta.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in model.items()}
    if got != expected:
        diff = sorted(set(got.items()) ^ set(expected.items()))[:3]
        raise BadContents(f"its weights do not fit the model of its own config (e.g. {diff})")
    try:
        parallel.check_optimizer_state(optim, {n: tuple(p.shape) for n, p in meta.named_parameters()})
    except ValueError as e:
        raise BadContents(f"'optimizer': {e}") from None
    for key in ("val_loss", "best_val_loss"):
        value = ckpt.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise BadContents(f"'{key}' is {value!r}, not a loss or None")
    ended = ckpt.get("ended_at")
    if ended is not None and (isinstance(ended, bool) or not isinstance(ended, int) or ended < 0):
        raise BadContents(f"'ended_at' is {ended!r}, not a step or None")
    skipped = ckpt.get("skipped_steps", 0)
    if isinstance(skipped, bool) or not isinstance(skipped, int) or skipped < 0:
        raise BadContents(f"'skipped_steps' is {skipped!r}, not a count")
    if not isinstance(ckpt.get("best_checkpoint") or "", str):
        raise BadContents(f"'best_checkpoint' is {ckpt['best_checkpoint']!r}, not a file name")
    scaler = ckpt.get("scaler") or {}
    if not isinstance(scaler, dict) or not all(isinstance(v, (int, float)) for v in scaler.values()):
        raise BadContents("'scaler' is not a GradScaler state")
    loaders, rngs = ckpt.get("loader"), ckpt.get("rng") or []
    if not isinstance(loaders, list) or not loaders or not isinstance(rngs, list):
        raise BadContents("'loader' is not a list of loader states, or 'rng' not a list of RNG "
                          "states")
    try:
        for state in loaders:
            check_loader_state(state)
        for state in rngs:
            check_rng_state(state)
    except ValueError as e:
        raise BadContents(str(e)) from None
    stored_step(ckpt)
    tensors = [t for t in model.values() if t.is_floating_point()]
    tensors += [v for s in optim["state"].values() for v in s.values()
                if torch.is_tensor(v) and v.is_floating_point() and v.dim() > 0]
    if tensors and count_nonfinite(tensors).item() > 0:
        raise BadContents("holds non-finite weights or optimizer state (NaN, inf or beyond 1e19)")
