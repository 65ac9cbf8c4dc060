"""A model beyond GPT-2 (rotary, RMSNorm, QK-norm, ReLU^2, an untied head, soft-capped
logits, value embeddings, U-net skips, a sliding window, document masks) out as a
transformers model with code of its own: config.json names, under auto_map, the two files
of gpt/checkpoint/hf_model/ that the folder carries, so
AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True) builds it. The weights
keep our names; gpt/checkpoint/export.py writes the folder."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import torch

from gpt.checkpoint.model_load import PretrainedError
from gpt.core.config import INIT_ONLY, ModelConfig
from gpt.core.config_io import flag
from gpt.data.tokenizer import GPT2_VOCAB
from gpt.model.attention_mask import EOT, window_at

CODE = Path(__file__).resolve().parent / "hf_model"
CODE_FILES = ("configuration_gpt_trainer.py", "modeling_gpt_trainer.py")
# ModelConfig's fields that config.json carries (GPTTrainerConfig's); a field added to
# ModelConfig and not here is refused by name rather than dropped
CARRIED = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "dropout", "rotary",
           "rmsnorm", "qk_norm", "relu2", "untied_head", "logit_softcap", "value_embeds",
           "unet_skips", "attn_window", "attn_window_final", "doc_mask")


def check_carried(cfg: ModelConfig, source: str) -> None:
    """Refuse, naming them, the options of cfg that the exported model cannot compute."""
    default = ModelConfig()
    lost = [flag(f.name) for f in dataclasses.fields(cfg)
            if f.name not in CARRIED + INIT_ONLY and getattr(cfg, f.name) != getattr(default, f.name)]
    if lost:
        raise PretrainedError(f"{source}: the export cannot carry {', '.join(lost)} (its model "
                              f"code has no such part); the checkpoint works with gpt.generate "
                              f"and gpt.evaluate")


def trained_window(cfg: ModelConfig, step: object, max_steps: int) -> int:
    """The attention window of a checkpoint written after `step` steps of `max_steps`: the one
    its weights were last trained with, as gpt/checkpoint/model_load.py's load_checkpoint_model
    sets it for sampling and evaluation (--attn-window at step 0)."""
    if isinstance(step, int) and step > 0:
        return window_at(cfg, step - 1, max_steps)
    return window_at(cfg, 0, 1)


def custom_config(cfg: ModelConfig, vocab_size: int, dtype: torch.dtype, window: int) -> dict[str, Any]:
    """config.json of the exported model (configuration_gpt_trainer.GPTTrainerConfig's fields)."""
    eot = min(EOT, vocab_size - 1)
    return {
        "architectures": ["GPTTrainerForCausalLM"],
        "model_type": "gpt_trainer",
        "auto_map": {"AutoConfig": "configuration_gpt_trainer.GPTTrainerConfig",
                     "AutoModelForCausalLM": "modeling_gpt_trainer.GPTTrainerForCausalLM"},
        "vocab_size": vocab_size,
        "block_size": cfg.block_size,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_embd": cfg.n_embd,
        "dropout": cfg.dropout,
        "rotary": cfg.rotary,
        "rmsnorm": cfg.rmsnorm,
        "qk_norm": cfg.qk_norm,
        "relu2": cfg.relu2,
        "tie_word_embeddings": not cfg.untied_head,
        "logit_softcap": cfg.logit_softcap,
        "value_embeds": cfg.value_embeds,
        "unet_skips": cfg.unet_skips,
        # one window at inference: the growing window's value when the weights were saved
        "attn_window": window if cfg.attn_window else 0,
        "doc_mask": cfg.doc_mask,
        "eot_token_id": EOT,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "use_cache": True,
        "torch_dtype": str(dtype).removeprefix("torch."),
        # GPT-2's tokenizer, whose files the folder holds: a pipeline loads it for a model
        # type it does not know only when the config names it (transformers 4.x)
        **({"tokenizer_class": "GPT2Tokenizer"} if vocab_size == GPT2_VOCAB else {}),
    }


def custom_state_dict(state_dict: dict[str, torch.Tensor], cfg: ModelConfig,
                      vocab_size: int) -> dict[str, torch.Tensor]:
    """Our weights under our names, the padded vocabulary's rows cut from every table indexed
    by token id, and a tied head left out (transformers ties it to transformer.wte)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key == "lm_head.weight" and not cfg.untied_head:
            continue
        value = value.detach().cpu()
        if key in ("transformer.wte.weight", "lm_head.weight") or key.startswith("value_embeds.tables."):
            value = value[:vocab_size]
        out[key] = value.contiguous()
    return out


def code_files() -> dict[str, Callable[[Path], None]]:
    """The model's code, copied as it is."""
    return {name: (lambda p, src=CODE / name: p.write_bytes(src.read_bytes())) for name in CODE_FILES}
