"""A model's size by arithmetic (gpt/model/sizing.py), before anything is built: the
parameter formula is the model's own count for every combination of options, and the least
memory a run needs is shared over the world under FSDP."""

from __future__ import annotations

import itertools

import pytest
import torch

from gpt.core.cli import parse_args
from gpt.core.config import model_preset
from gpt.core.errors import UserError
from gpt.model import sizing
from gpt.model.transformer import GPT


@pytest.mark.parametrize("rotary, rmsnorm, untied, value_embeds, unet",
                         list(itertools.product([False, True], repeat=5)))
def test_the_parameter_formula_is_the_models_count(rotary: bool, rmsnorm: bool, untied: bool,
                                                    value_embeds: bool, unet: bool) -> None:
    m = model_preset("mini", rotary=rotary, rmsnorm=rmsnorm, untied_head=untied,
                     value_embeds=value_embeds, unet_skips=unet, qk_norm=True, relu2=True,
                     vocab_size=1000, block_size=77)
    with torch.device("meta"):
        assert sizing.param_count(m) == GPT(m).num_params()


def test_fsdp_shares_the_least_memory_over_the_world() -> None:
    cfg = parse_args(["--model", "gpt2-xl", "--parallel", "fsdp"])
    adamw = 8  # bytes of state a parameter
    one, eight = sizing.least_bytes(cfg, 1, adamw), sizing.least_bytes(cfg, 8, adamw)
    assert one > 7 * eight  # all but the token ids are sharded
    sizing.check_fits(cfg, 8, 80 * 2**30, "an 80 GB GPU", adamw)
    with pytest.raises(UserError, match="an 80 GB GPU"):
        sizing.check_fits(cfg, 1, 20 * 2**30, "an 80 GB GPU", adamw)
