"""OpenAI's GPT-2 weights in and out: Hugging Face GPT-2 folders <-> this package's GPT.

    model = load_pretrained("gpt2")                 # downloads openai-community/gpt2
    model = load_pretrained("path/to/hf_folder")    # config.json + model.safetensors or .bin
    export_hf("runs/x/ckpt_001000.pt", "hf/my-gpt2") # a folder transformers can load

(`python -m gpt.pretrained export`, in gpt/pretrained.py, is the command line for export_hf.)

A Hugging Face GPT-2 folder holds config.json and the weights as model.safetensors (or
pytorch_model.bin). The module names are the same as ours; the difference is that GPT-2's
attention and MLP projections are Conv1D layers whose weight is stored (in, out), the
transpose of nn.Linear's (out, in). The causal-mask buffers (attn.bias, attn.masked_bias)
are dropped and the output head is tied to the token embedding.

Weights files are read and written with the `safetensors` package. Loading a state dict
exactly into a model, and a trainer checkpoint's weights as a model, are gpt/checkpoint/model_load.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn

import safetensors
import safetensors.torch
import torch
import torch.nn as nn

from gpt.checkpoint.files import CheckpointError, model_weights
from gpt.core.config import Config, ModelConfig, flag
from gpt.core.fileio import atomic_files, atomic_path, free_space
from gpt.model.transformer import GPT, unwrap
from gpt.checkpoint.model_load import (PretrainedError, build_model, check_finite, load_checkpoint_model,
                            read_checkpoint)
from gpt.data.tokenizer import ASSETS, GPT2_EOT, GPT2_VOCAB

HUB_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
HUB_ORG = "openai-community"
CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Stored as HF Conv1D (in, out): transposed to nn.Linear's (out, in) and back.
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers, not weights


# ---------------------------------------------------------------------------- safetensors


def read_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of a .safetensors file, on the CPU, in their stored dtype."""
    path = Path(path)
    if not path.is_file():
        raise PretrainedError(f"{path}: no such file")
    try:
        return safetensors.torch.load_file(path)
    except (safetensors.SafetensorError, OSError) as e:
        raise PretrainedError(f"{path}: not a safetensors file, or a damaged one ({e})") from None


def write_safetensors(tensors: dict[str, torch.Tensor], path: str | os.PathLike) -> Path:
    """Write tensors as a .safetensors file (metadata format "pt", which transformers
    checks), atomically: a temporary file, fsynced, then renamed."""
    path = Path(path)
    flat = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        safetensors.torch.save_file(flat, tmp, metadata={"format": "pt"})
    return path


# ---------------------------------------------------------------------------- import


def is_hub_name(name: str) -> bool:
    return name in HUB_NAMES


def download(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Fetch config.json and the weights of an OpenAI GPT-2 model from the Hugging Face hub
    (safetensors where the repo has them) into huggingface_hub's cache; return the folder."""
    if name not in HUB_NAMES:
        raise PretrainedError(f"--init-from {name!r}: not a GPT-2 model name ({', '.join(HUB_NAMES)}) "
                              "nor an existing folder")
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import EntryNotFoundError, RepositoryNotFoundError
    except ImportError:
        raise PretrainedError(f"--init-from {name}: downloading needs `pip install huggingface-hub`") from None

    last_error: Exception | None = None
    for repo in (f"{HUB_ORG}/{name}", name):  # the current repo, then the legacy id
        try:
            config = hf_hub_download(repo, CONFIG_FILE, cache_dir=cache_dir)
            for weights in WEIGHT_FILES:
                try:
                    hf_hub_download(repo, weights, cache_dir=cache_dir)
                    return Path(config).parent
                except EntryNotFoundError as e:
                    last_error = e
            raise PretrainedError(f"--init-from {name}: hub repo {repo} has none of {', '.join(WEIGHT_FILES)}")
        except RepositoryNotFoundError as e:
            last_error = e
            continue
        except PretrainedError:
            raise
        except Exception as e:  # network, HTTP and offline-mode errors come in many types
            raise PretrainedError(
                f"--init-from {name}: could not download {repo} from the Hugging Face hub "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); offline, "
                "pass a local folder with config.json and model.safetensors"
            ) from None
    raise PretrainedError(f"--init-from {name}: not found on the Hugging Face hub ({last_error})")


def resolve(name_or_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """A local Hugging Face GPT-2 folder: the path itself, or a hub model downloaded."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if is_hub_name(str(name_or_path)):
        return download(str(name_or_path), cache_dir)
    if path.is_file():  # a trainer checkpoint, say: its own commands take it
        raise PretrainedError(f"--init-from {path}: a file, not a Hugging Face GPT-2 folder; a "
                              f"trainer checkpoint continues with --resume {path}, or becomes "
                              f"such a folder with python -m gpt.pretrained export")
    raise PretrainedError(f"--init-from {name_or_path}: no such folder, and not one of {', '.join(HUB_NAMES)}")


def read_hf_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise PretrainedError(f"{folder}: no {CONFIG_FILE} (not a Hugging Face model folder)")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PretrainedError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise PretrainedError(f"{path}: not a JSON object")
    return cfg


def model_config_from_hf(hf: dict[str, Any], source: str, vocab_size: int | None = None,
                         block_size: int | None = None, dropout: float = 0.0) -> ModelConfig:
    """Our ModelConfig for a HF GPT-2 config.json; refuses variants this model cannot compute."""
    def bad(what: str) -> NoReturn:
        raise PretrainedError(f"{source}: {what}; only standard GPT-2 models are supported")

    if hf.get("model_type", "gpt2") != "gpt2":
        bad(f"model_type is {hf.get('model_type')!r}")
    try:
        n_layer, n_head, n_embd = int(hf["n_layer"]), int(hf["n_head"]), int(hf["n_embd"])
        n_positions = int(hf.get("n_positions", hf.get("n_ctx", 1024)))
        hf_vocab = int(hf.get("vocab_size", GPT2_VOCAB))
    except (KeyError, TypeError, ValueError) as e:
        raise PretrainedError(f"{source}: config.json lacks or garbles {e}") from None
    if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        bad(f"activation_function is {hf.get('activation_function')!r} (tanh GELU expected)")
    if abs(float(hf.get("layer_norm_epsilon", 1e-5)) - 1e-5) > 1e-12:
        bad(f"layer_norm_epsilon is {hf.get('layer_norm_epsilon')} (1e-5 expected)")
    if hf.get("n_inner") not in (None, 4 * n_embd):
        bad(f"n_inner is {hf.get('n_inner')} (4 x n_embd expected)")
    if not hf.get("scale_attn_weights", True) or hf.get("scale_attn_by_inverse_layer_idx", False):
        bad("attention scaling differs from GPT-2's")
    if n_embd % n_head:
        bad(f"n_embd {n_embd} is not divisible by n_head {n_head}")
    if vocab_size is not None and vocab_size < hf_vocab:
        raise PretrainedError(f"{source}: vocab_size {vocab_size} is smaller than the model's {hf_vocab}")
    if block_size is not None and not 1 <= block_size <= n_positions:
        raise PretrainedError(f"{source}: block_size {block_size} must be in 1..{n_positions} "
                              "(the model's n_positions)")
    return ModelConfig(block_size=block_size or n_positions, vocab_size=vocab_size or hf_vocab,
                       n_layer=n_layer, n_head=n_head, n_embd=n_embd, dropout=dropout)


def read_hf_weights(folder: Path) -> tuple[dict[str, torch.Tensor], Path]:
    for name in WEIGHT_FILES:
        path = folder / name
        if path.is_file():
            if name.endswith(".safetensors"):
                return read_safetensors(path), path
            try:
                sd = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as e:  # truncated zip, bad pickle, unsupported object, ...
                first = (str(e).splitlines() or [type(e).__name__])[0]
                raise PretrainedError(f"{path}: not a loadable PyTorch weights file ({first})") from None
            if not isinstance(sd, dict) or not all(torch.is_tensor(v) for v in sd.values()):
                raise PretrainedError(f"{path}: holds a {type(sd).__name__}, not a state dict of tensors")
            return sd, path
    raise PretrainedError(f"{folder}: no {' or '.join(WEIGHT_FILES)} (sharded checkpoints are "
                          "not supported)")


def hf_to_gpt_state_dict(hf_sd: dict[str, torch.Tensor], cfg: ModelConfig,
                         source: str) -> dict[str, torch.Tensor]:
    """HF GPT-2 tensors -> our state dict for `cfg` (transposes Conv1D weights, drops the mask
    buffers, checks the tied head, pads the vocabulary and crops the positions)."""
    out: dict[str, torch.Tensor] = {}
    head: torch.Tensor | None = None
    for key, value in hf_sd.items():
        name = key[len("transformer."):] if key.startswith("transformer.") else key
        if name.endswith(IGNORED_SUFFIXES):
            continue
        if name == "lm_head.weight":
            head = value
            continue
        if name.endswith(CONV1D_SUFFIXES):
            value = value.t()
        out["transformer." + name] = value.to(torch.float32).contiguous()
    wte = out.get("transformer.wte.weight")
    if wte is None or "transformer.wpe.weight" not in out:
        raise PretrainedError(f"{source}: no wte/wpe embedding weights (not a GPT-2 checkpoint)")
    if head is not None and (head.shape != wte.shape or not torch.equal(head.to(wte.dtype), wte)):
        raise PretrainedError(f"{source}: lm_head.weight is not tied to wte.weight; untied heads "
                              "are not supported")
    if cfg.vocab_size > wte.size(0):
        # Padding rows hold the mean embedding: their logit is then the mean logit, so together
        # the extra ids take under (pad / vocab) of the probability (Jensen), e.g. < 0.1% for
        # 47 rows on 50257, instead of the large share that zero rows (logit 0) would take
        # from GPT-2's mostly negative logits. They are never sampled (see gpt.generate).
        pad = wte.mean(dim=0, keepdim=True).expand(cfg.vocab_size - wte.size(0), -1)
        out["transformer.wte.weight"] = torch.cat([wte, pad])
    out["transformer.wpe.weight"] = out["transformer.wpe.weight"][: cfg.block_size]
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def load_pretrained(name_or_path: str | os.PathLike, *, vocab_size: int | None = None,
                    block_size: int | None = None, dropout: float = 0.0,
                    device: str | torch.device = "cpu",
                    cache_dir: str | os.PathLike | None = None) -> GPT:
    """OpenAI's GPT-2 (gpt2, gpt2-medium, gpt2-large, gpt2-xl; downloaded from the hub) or a
    local Hugging Face GPT-2 folder, as a GPT in fp32 on `device`.

    vocab_size pads the vocabulary (e.g. to 50304) with mean-embedding rows; block_size
    keeps the first block_size position embeddings.
    """
    folder = resolve(name_or_path, cache_dir)
    cfg = model_config_from_hf(read_hf_config(folder), str(folder / CONFIG_FILE), vocab_size,
                               block_size, dropout)
    hf_sd, path = read_hf_weights(folder)
    return build_model(cfg, hf_to_gpt_state_dict(hf_sd, cfg, str(path)), str(path), device)


# GPT-2's weights that a model with these parts has no place for
NO_PLACE_FOR = {"rotary": "learned position embeddings", "rmsnorm": "LayerNorm biases"}
# and weights of these parts that GPT-2's checkpoints do not have
NOT_IN_GPT2 = {"value_embeds": "value embedding tables", "unet_skips": "U-net skip weights"}


def with_pretrained_shape(cfg: Config) -> Config:
    """--init-from decides the model's depth and width (its config.json is read; the weights
    are loaded later, in build_run, unless a checkpoint is resumed instead). Parts that
    would drop some of GPT-2's weights are refused; the others (an untied head starts as
    a copy of the embedding) take GPT-2's weights as a starting point."""
    if not cfg.train.init_from:
        return cfg
    for table, words in ((NO_PLACE_FOR, "a model with {flags} has no place for GPT-2's {what}"),
                         (NOT_IN_GPT2, "GPT-2's weights have no {what} for {flags}")):
        parts = [part for part in table if getattr(cfg.model, part)]
        if parts:
            flags = " and ".join(flag(part) for part in parts)
            what = " and ".join(table[part] for part in parts)
            raise PretrainedError(
                f"--init-from {cfg.train.init_from}: {words.format(flags=flags, what=what)}; "
                f"drop {flags}, or train from scratch without --init-from")
    folder = resolve(cfg.train.init_from)
    pre = model_config_from_hf(read_hf_config(folder), str(folder),
                                          cfg.model.vocab_size, cfg.model.block_size)
    shape = {k: getattr(pre, k) for k in ("n_layer", "n_head", "n_embd")}
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **shape))


def init_from_note(cfg: ModelConfig) -> str:
    """What --init-from's GPT-2 weights are to a model of cfg's parts, for the line that
    says so: "" while they still give GPT-2's function (an untied head starts as a copy of
    the embedding), else a note that they are only a starting point."""
    other = [p for p in not_gpt2_parts(cfg) if p != flag("untied_head")]
    if not other:
        return ""
    return (f" (with {', '.join(other)} the model computes something else with GPT-2's "
            f"weights: they are a starting point, not GPT-2)")


# ---------------------------------------------------------------------------- either


def load_model(checkpoint: str | None = None, init_from: str | None = None,
               device: str | torch.device = "cpu", flags: tuple[str, str] = ("--checkpoint", "--init-from")
               ) -> GPT:
    """The model of a trainer checkpoint, or of --init-from (a GPT-2 name or HF folder);
    `flags`: how the caller's user names the two (errors name them so)."""
    if (checkpoint is None) == (init_from is None):
        raise PretrainedError(f"give exactly one of {flags[0]} and {flags[1]}")
    if checkpoint is not None:
        label = f"{flags[0]} " if flags[0].startswith("-") else f"{flags[0]}="
        return load_checkpoint_model(checkpoint, device, label)
    assert init_from is not None
    return load_pretrained(init_from, device=device)


# ---------------------------------------------------------------------------- export


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


# ModelConfig's parts that GPT-2's architecture does not have (not config.INIT_ONLY's:
# they change the initial weights, not the model, and their runs export as any other)
NOT_GPT2 = ("rotary", "rmsnorm", "qk_norm", "relu2", "untied_head", "value_embeds",
            "unet_skips", "doc_mask")


def not_gpt2_parts(cfg: ModelConfig) -> list[str]:
    """The flags of cfg's parts that GPT-2's architecture does not have."""
    return [flag(p) for p in NOT_GPT2 if getattr(cfg, p)] + (
        [f"--logit-softcap {cfg.logit_softcap}"] if cfg.logit_softcap else []) + (
        [f"--attn-window {cfg.attn_window}"] if cfg.attn_window else [])


TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")  # what an export writes
# What a Hugging Face model folder can hold besides: left beside new weights, it would
# disagree with them (a tokenizer of another vocabulary, other weights, other ids).
OTHER_MODEL_FILES = ("pytorch_model.bin", "model.safetensors.index.json", "tokenizer.json",
                     "special_tokens_map.json", "added_tokens.json", "generation_config.json")


def export_hf(model_or_checkpoint: nn.Module | dict[str, Any] | str | os.PathLike,
              out_dir: str | os.PathLike, vocab_size: int | None = None) -> Path:
    """Write a model (GPT, possibly compiled/DDP-wrapped), checkpoint dict or checkpoint file
    as a Hugging Face GPT-2 folder: config.json + model.safetensors, and GPT-2's tokenizer
    files (vocab.json, merges.txt, tokenizer_config.json) when the vocabulary is GPT-2's,
    so that AutoTokenizer and pipeline("text-generation") work on the folder as it is.

    vocab_size defaults to GPT-2's 50257 (the padding rows are cut), or the model's own if
    smaller; cutting GPT-2's ids from a model that has them is refused. The files are
    written together (fileio.atomic_files): a failure (a full disk) leaves the folder as it
    was. A model already there is replaced, with a note, and its files that would
    disagree with the new one (a tokenizer of another vocabulary, other weights) go.
    """
    source = str(model_or_checkpoint) if isinstance(model_or_checkpoint, (str, os.PathLike)) else "model"
    if isinstance(model_or_checkpoint, nn.Module):
        model = unwrap(model_or_checkpoint)
        cfg, sd = model.config, model.state_dict()
    elif isinstance(model_or_checkpoint, dict):
        try:
            cfg, sd = model_weights(model_or_checkpoint, "checkpoint")
        except CheckpointError as e:
            raise PretrainedError(str(e)) from None
    else:
        cfg, sd = read_checkpoint(model_or_checkpoint)
    beyond = not_gpt2_parts(cfg)
    if beyond:
        raise PretrainedError(f"{source}: Hugging Face's GPT-2 cannot hold a model with "
                              f"{', '.join(beyond)}; only a GPT-2-shaped model exports "
                              f"(its checkpoint works with gpt.generate and gpt.evaluate)")
    vocab = min(cfg.vocab_size, GPT2_VOCAB) if vocab_size is None else vocab_size
    if not 1 <= vocab <= cfg.vocab_size:
        raise PretrainedError(f"{source}: vocab_size {vocab} must be in 1..{cfg.vocab_size}")
    if vocab < GPT2_VOCAB <= cfg.vocab_size:
        raise PretrainedError(f"--vocab-size {vocab} would cut GPT-2's token ids {vocab}.."
                              f"{GPT2_VOCAB - 1} from a model that has them all, and no tokenizer "
                              f"would fit the rest; leave it out for GPT-2's {GPT2_VOCAB}")
    check_finite(sd, source)
    hf_sd = gpt_to_hf_state_dict(sd, vocab)
    config = hf_config(cfg, vocab, hf_sd["transformer.wte.weight"].dtype)
    files: dict[str, Callable[[Path], None]] = {
        "model.safetensors": lambda p: safetensors.torch.save_file(hf_sd, p, metadata={"format": "pt"}),
        CONFIG_FILE: lambda p: p.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")}
    if vocab == GPT2_VOCAB:
        files.update(tokenizer_files(cfg.block_size))
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise PretrainedError(f"--out {out}: exists and is not a folder")
    there = [n for n in (CONFIG_FILE, *WEIGHT_FILES, *TOKENIZER_FILES, *OTHER_MODEL_FILES)
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


def tokenizer_files(max_length: int) -> dict[str, Callable[[Path], None]]:
    """GPT-2's tokenizer in Hugging Face's file names: the same two BPE files the package
    ships (encoder.json is vocab.json, vocab.bpe is merges.txt) and a tokenizer config."""
    eot = "<|endoftext|>"
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": max_length,
              "bos_token": eot, "eos_token": eot, "unk_token": eot, "add_prefix_space": False}
    return {"vocab.json": lambda p: p.write_bytes((ASSETS / "gpt2" / "encoder.json").read_bytes()),
            "merges.txt": lambda p: p.write_bytes((ASSETS / "gpt2" / "vocab.bpe").read_bytes()),
            "tokenizer_config.json": lambda p: p.write_text(json.dumps(config, indent=2) + "\n")}
