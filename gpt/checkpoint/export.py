"""Our models out as Hugging Face folders: config.json, model.safetensors and the
tokenizer's files, written together or not at all, for transformers and lm-eval to load.

    export_hf("runs/x/ckpt_001000.pt", "hf/my-gpt2")  # a folder transformers can load

(`python -m gpt.pretrained export`, in gpt/pretrained.py, is its command line.) A
GPT-2-shaped model becomes Hugging Face's GPT2LMHeadModel: the weights go back to
Conv1D's (in, out) layout and the tied head is left out. Any other (rotary, RMSNorm, ...)
becomes a model with code of its own, loaded with trust_remote_code=True
(gpt/checkpoint/export_custom.py)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import safetensors
import safetensors.torch
import torch
import torch.nn as nn

from gpt.checkpoint.export_custom import (CODE_FILES, check_carried, code_files, custom_config,
                                          custom_state_dict, trained_window)
from gpt.checkpoint.files import CheckpointError, model_weights, saved_config
from gpt.checkpoint.files import load as load_checkpoint_file
from gpt.checkpoint.model_load import PretrainedError, check_finite, read_checkpoint
from gpt.checkpoint.weights import CONFIG_FILE, CONV1D_SUFFIXES, WEIGHT_FILES, not_gpt2_parts
from gpt.core.config import ModelConfig
from gpt.core.fileio import atomic_files, free_space
from gpt.data.tokenizer import ASSETS, GPT2_EOT, GPT2_VOCAB
from gpt.model.attention_mask import AttentionMask
from gpt.model.transformer import unwrap


def hf_config(cfg: ModelConfig, vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """config.json of a Hugging Face GPT2LMHeadModel equal to a model of `cfg`."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_embd": cfg.n_embd,
        "n_inner": None,
        "n_positions": cfg.block_size,
        "n_ctx": cfg.block_size,
        "vocab_size": vocab_size,
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.dropout,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "bos_token_id": min(GPT2_EOT, vocab_size - 1),
        "eos_token_id": min(GPT2_EOT, vocab_size - 1),
        "use_cache": True,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def gpt_to_hf_state_dict(state_dict: dict[str, torch.Tensor],
                         vocab_size: int) -> dict[str, torch.Tensor]:
    """Our weights -> GPT2LMHeadModel's (Conv1D weights transposed, padded vocab rows cut,
    the tied head left out: transformers re-ties it to wte)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key == "lm_head.weight":
            continue
        value = value.detach().cpu()
        if key.endswith(CONV1D_SUFFIXES):
            value = value.t()
        elif key == "transformer.wte.weight":
            value = value[:vocab_size]
        out[key] = value.contiguous()
    return out



TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")  # what an export writes
# What a Hugging Face model folder can hold besides: left beside new weights, it would
# disagree with them (a tokenizer of another vocabulary, other weights, other ids).
OTHER_MODEL_FILES = ("pytorch_model.bin", "model.safetensors.index.json", "tokenizer.json",
                     "special_tokens_map.json", "added_tokens.json", "generation_config.json")


def export_hf(model_or_checkpoint: nn.Module | dict[str, Any] | str | os.PathLike,
              out_dir: str | os.PathLike, vocab_size: int | None = None) -> Path:
    """Write a model (GPT, possibly compiled/DDP-wrapped), checkpoint dict or checkpoint file
    as a Hugging Face folder: config.json + model.safetensors, and GPT-2's tokenizer files
    (vocab.json, merges.txt, tokenizer_config.json) when the vocabulary is GPT-2's, so that
    AutoTokenizer and pipeline("text-generation") work on the folder as it is. A GPT-2-shaped
    model is a GPT2LMHeadModel; any other carries its code (configuration_gpt_trainer.py,
    modeling_gpt_trainer.py) and its attention window as last trained, and loads with
    trust_remote_code=True.

    vocab_size defaults to GPT-2's 50257 (the padding rows are cut), or the model's own if
    smaller; cutting GPT-2's ids from a model that has them is refused. The files are
    written together (fileio.atomic_files): a failure (a full disk) leaves the folder as it
    was. A model already there is replaced, with a note, and its files that would
    disagree with the new one (a tokenizer of another vocabulary, other weights) go.
    """
    source = str(model_or_checkpoint) if isinstance(model_or_checkpoint, (str, os.PathLike)) else "model"
    cfg, sd, window = _model_of(model_or_checkpoint)
    custom = bool(not_gpt2_parts(cfg))
    if custom:
        check_carried(cfg, source)
    vocab = min(cfg.vocab_size, GPT2_VOCAB) if vocab_size is None else vocab_size
    if not 1 <= vocab <= cfg.vocab_size:
        raise PretrainedError(f"{source}: vocab_size {vocab} must be in 1..{cfg.vocab_size}")
    if vocab < GPT2_VOCAB <= cfg.vocab_size:
        raise PretrainedError(f"--vocab-size {vocab} would cut GPT-2's token ids {vocab}.."
                              f"{GPT2_VOCAB - 1} from a model that has them all, and no tokenizer "
                              f"would fit the rest; leave it out for GPT-2's {GPT2_VOCAB}")
    check_finite(sd, source)
    hf_sd = custom_state_dict(sd, cfg, vocab) if custom else gpt_to_hf_state_dict(sd, vocab)
    dtype = hf_sd["transformer.wte.weight"].dtype
    config = custom_config(cfg, vocab, dtype, window) if custom else hf_config(cfg, vocab, dtype)
    files: dict[str, Callable[[Path], None]] = {
        "model.safetensors": lambda p: safetensors.torch.save_file(hf_sd, p, metadata={"format": "pt"}),
        CONFIG_FILE: lambda p: p.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")}
    if custom:
        files.update(code_files())
    if vocab == GPT2_VOCAB:
        files.update(tokenizer_files(cfg.block_size))
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise PretrainedError(f"--out {out}: exists and is not a folder")
    there = [n for n in (CONFIG_FILE, *WEIGHT_FILES, *CODE_FILES, *TOKENIZER_FILES, *OTHER_MODEL_FILES)
             if (out / n).exists()]
    created, writing = not out.exists(), "the folder"
    try:
        out.mkdir(parents=True, exist_ok=True)
        with atomic_files(out, list(files)) as temps:
            for writing, write in files.items():
                write(temps[writing])
        writing = "the new model; old files that disagree with it are still there"
        for name in there:
            if name not in files:
                (out / name).unlink()
    except (OSError, safetensors.SafetensorError) as e:
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()  # only if empty
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise PretrainedError(f"--out {out}: could not write {writing} ({reason}; "
                              f"{free_space(out if out.exists() else out.parent)}); "
                              f"{'nothing was written' if created else 'the folder is as it was'}"
                              ) from None
    if there:
        print(f"note: --out {out}: replaced the model that was there ({', '.join(there)})",
              file=sys.stderr)
    if vocab != GPT2_VOCAB:
        print(f"note: vocabulary {vocab} is not GPT-2's {GPT2_VOCAB}: no tokenizer files were "
              f"written, so {out} needs a tokenizer of its own", file=sys.stderr)
    return out


def _model_of(model_or_checkpoint: nn.Module | dict[str, Any] | str | os.PathLike
              ) -> tuple[ModelConfig, dict[str, torch.Tensor], int]:
    """(model config, weights, attention window) of a model, checkpoint dict or file. The
    window is the model's own now, or a checkpoint's as gpt.generate sets it (0: none)."""
    if isinstance(model_or_checkpoint, nn.Module):
        model = unwrap(model_or_checkpoint)
        mask = getattr(model, "attn_mask", None)
        window = int(mask.window) if isinstance(mask, AttentionMask) else 0
        return model.config, model.state_dict(), window
    ckpt: dict[str, Any] | None = None
    if isinstance(model_or_checkpoint, dict):
        ckpt, label, prefix = model_or_checkpoint, "checkpoint", ""
        try:
            cfg, sd = model_weights(ckpt, label)
        except CheckpointError as e:
            raise PretrainedError(str(e)) from None
    else:
        cfg, sd = read_checkpoint(model_or_checkpoint)
        label, prefix = str(model_or_checkpoint), "--checkpoint "
    if not cfg.attn_window:
        return cfg, sd, 0
    try:
        if ckpt is None:  # verified just now: read again, memory-mapped, for its step and length
            ckpt = load_checkpoint_file(model_or_checkpoint, required=("model", "config"), check=False)
        max_steps = saved_config(ckpt, label)["train"]["max_steps"]
    except CheckpointError as e:
        raise PretrainedError(f"{prefix}{e}") from None
    return cfg, sd, trained_window(cfg, ckpt.get("step"), max_steps)


def tokenizer_files(max_length: int) -> dict[str, Callable[[Path], None]]:
    """GPT-2's tokenizer in Hugging Face's file names: the same two BPE files the package
    ships (encoder.json is vocab.json, vocab.bpe is merges.txt) and a tokenizer config."""
    eot = "<|endoftext|>"
    # clean_up_tokenization_spaces off: decoded text is the BPE's bytes, as ours (transformers
    # 4.x would otherwise glue " ," and " ." to the word before)
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": max_length,
              "bos_token": eot, "eos_token": eot, "unk_token": eot, "add_prefix_space": False,
              "clean_up_tokenization_spaces": False}
    return {"vocab.json": lambda p: p.write_bytes((ASSETS / "gpt2" / "encoder.json").read_bytes()),
            "merges.txt": lambda p: p.write_bytes((ASSETS / "gpt2" / "vocab.bpe").read_bytes()),
            "tokenizer_config.json": lambda p: p.write_text(json.dumps(config, indent=2) + "\n")}
