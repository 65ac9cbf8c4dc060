"""FP8 matmuls in training (--fp8 tensorwise | rowwise), through torchao's float8 training.

Each linear layer of the blocks (attention's qkv and projection, the MLP's two) becomes
torchao's Float8Linear: its input, weight and output gradient are cast to FP8 (e4m3 for
the forward operands, and for rowwise the gradient too; e5m2 for tensorwise's gradient)
with a scale per tensor (tensorwise) or per row (rowwise), multiplied on the FP8 tensor
cores, and the result comes out in the compute dtype. The weights, their gradients and
AdamW's state stay as they were (fp32), and the module keeps nn.Linear's parameters, so a
converted model's state dict has exactly the keys and tensors of an unconverted one: a
checkpoint of an FP8 run is read by every reader (resume, evaluate, generate, export)
as any other.

Where it runs:
- CUDA GPUs with FP8 tensor cores (compute capability 8.9 or newer). Elsewhere on CUDA
  the run is refused in one line: without the hardware it would only be slower.
- On a CPU the FP8 rounding is emulated (torchao's emulate=True: the same casts and
  scales, the matmul in high precision on the rounded values). That is for checking what
  FP8 does to a recipe's loss on a small model before a GPU run, never for speed, and
  the start line says so.
- MPS has no FP8 dtypes: refused.

What is left out: the LM head, unless --fp8-head (its logits are the most sensitive to
rounding; with the chunked loss it never runs as a module anyway), and any layer whose
dimensions are not multiples of 16 (config_check refuses a width where no layer would
convert).

Evaluation (the run's evaluations, its samples) runs the same weights with
plain high-precision matmuls (high_precision()): the numbers a run reports are those
`python -m gpt.evaluate` gives for its checkpoint, and compare with a run without FP8.
Under torch.compile the switch of class is guarded: the evaluation's graph is compiled
once beside the training's, and the two alternate without recompiling.

torchao is optional (the `fp8` extra). It is imported only when --fp8 is on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
from typing import Any, Iterator

import torch
import torch.nn as nn

from gpt.core import extras
from gpt.core.compat import version_tuple
from gpt.core.config import TrainConfig
from gpt.core.errors import UserError


RECIPES = ("tensorwise", "rowwise")
MULTIPLE = 16  # both dimensions of an FP8 matmul's weight (torch._scaled_mm's rule)
MIN_CAPABILITY = (8, 9)  # Ada and Hopper onwards have FP8 tensor cores
HEAD = "lm_head"
# nn.Linear attributes GPT sets for its initialisation (gpt/model/transformer.py), which a swapped
# module must keep so that an FP8 model starts from the same weights
_INIT_ATTRS = ("residual_scale", "zero_init")


def emulated(device_type: str) -> bool:
    """Whether --fp8 runs emulated here (CPU) rather than on FP8 tensor cores."""
    return device_type == "cpu"


def check(train: TrainConfig, device: torch.device) -> None:
    """Refuse --fp8 where it cannot run: MPS, a CUDA GPU without FP8 tensor cores, or
    torchao missing; and --fp8-head where the chunked loss would run the head instead
    (its default depends on the device). --fp8 none passes everywhere."""
    recipe = train.fp8
    if recipe == "none":
        return
    if train.fp8_head and train.chunked_loss_on(device.type):
        raise UserError(f"--fp8-head converts the head's own matmul, and on {device.type} "
                        f"the chunked loss (on by default here) runs the head inside its "
                        f"fused loss: add --no-chunked-loss, or drop --fp8-head")
    if device.type == "mps":
        raise UserError(f"--fp8 {recipe}: MPS has no FP8 matmuls; use --fp8 none there")
    if device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        if cap < MIN_CAPABILITY:
            name = torch.cuda.get_device_name(device)
            raise UserError(
                f"--fp8 {recipe} needs FP8 tensor cores (compute capability "
                f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer: H100, H200, L4, L40S, "
                f"RTX 40xx), and {name} is {cap[0]}.{cap[1]}: use --fp8 none")
    _torchao(f"--fp8 {recipe}")  # imported as the run imports it: a broken build fails here


def _torchao(what: str = "--fp8") -> Any:
    """torchao.float8, imported quietly: its import logs a warning for each CUDA extension
    a CPU-only machine cannot load, and torch's pytree a deprecation, none of which
    concerns the float8 training used here (pure Python over torch._scaled_mm)."""
    try:
        return extras.require("torchao.float8", what, "fp8", "torchao",
                              quiet=("torchao", "torch.utils._pytree"))
    except extras.MissingExtra:
        release = _release_for_this_torch()
        if release is None:
            raise
        raise extras.MissingExtra(
            f"{what} needs torchao, and torchao {release} does not import under torch "
            f"{torch.__version__} (it needs a newer torch); 0.17.0 does: pip install "
            f"torchao==0.17.0") from None


def _release_for_this_torch() -> str | None:
    """The installed torchao's version where it is one that does not import under this
    torch: 0.18 and later under torch 2.9, the minimum (0.18.0 imports a name 2.9 lacks,
    torch.nn.functional.ScalingType; 0.17.0, built for 2.11, imports there and
    tests/model/test_fp8.py passes with it: pip resolves .[fp8] to the newest, so a user on 2.9
    meets this)."""
    try:
        release = importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        return None
    if version_tuple(torch.__version__) < (2, 10) and version_tuple(release) >= (0, 18):
        return release
    return None


def convertible(module: nn.Module, name: str, head: bool) -> bool:
    """Whether the linear layer `name` runs in FP8: both weight dimensions multiples of 16,
    and the head only when asked for."""
    if not isinstance(module, nn.Linear) or (name == HEAD and not head):
        return False
    out_features, in_features = module.weight.shape
    return in_features % MULTIPLE == 0 and out_features % MULTIPLE == 0


def convert(model: nn.Module, recipe: str, head: bool, device_type: str) -> list[str]:
    """Swap the model's convertible linear layers for torchao's Float8Linear, in place
    (before compile and FSDP, on the meta device or with weights loaded: the parameters
    themselves are kept, and a tied head stays tied). Returns the names of the linear
    layers left in high precision."""
    if recipe == "none":
        return []
    float8 = _torchao()
    config = float8.Float8LinearConfig.from_recipe_name(recipe)
    if emulated(device_type):
        config = dataclasses.replace(config, emulate=True)
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    kept = {name: {a: getattr(m, a) for a in _INIT_ATTRS if hasattr(m, a)}
            for name, m in linears.items()}
    float8.convert_to_float8_training(
        model, config=config, module_filter_fn=lambda m, name: convertible(m, name, head))
    modules = dict(model.named_modules())
    for name, attrs in kept.items():
        for attr, value in attrs.items():
            setattr(modules[name], attr, value)
    return [name for name in linears if not is_fp8(modules[name])]


def is_fp8(module: nn.Module) -> bool:
    """A linear layer that convert() swapped (torchao's Float8Linear)."""
    return type(module).__name__ == "Float8Linear" and isinstance(module, nn.Linear)


def converted(model: nn.Module) -> list[str]:
    """The names of the model's FP8 linear layers."""
    return [name for name, m in model.named_modules() if is_fp8(m)]


@contextlib.contextmanager
def high_precision(model: nn.Module) -> Iterator[None]:
    """Within: the FP8 layers multiply as the plain nn.Linear they were converted from, on
    the same parameters, so evaluation sees the weights as any reader of the checkpoint
    does. Each layer's class is switched back on the way out, whatever happens within.
    A model without FP8 layers is left alone."""
    swapped = [(m, type(m)) for m in model.modules() if is_fp8(m)]
    for m, _ in swapped:
        m.__class__ = nn.Linear
    try:
        yield
    finally:
        for m, cls in swapped:
            m.__class__ = cls


def describe(recipe: str, head: bool, kept: list[str], n_fp8: int, device_type: str) -> str:
    """The start line's words for --fp8: the recipe, how many layers, what stayed in high
    precision, and whether it is emulated."""
    if recipe == "none":
        return "none"
    text = f"{recipe} on {n_fp8} linear layers"
    if kept:
        text += f" ({', '.join(kept)} in high precision)"
    if emulated(device_type):
        text += f", EMULATED on {device_type}: for checking the numerics, not the speed"
    return text
