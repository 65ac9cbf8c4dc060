"""OpenAI's GPT-2 weights in: Hugging Face GPT-2 folders (or the hub's four sizes) as this
package's GPT. The way out, export_hf, is gpt/checkpoint/export.py's.

    model = load_pretrained("gpt2")                 # downloads openai-community/gpt2
    model = load_pretrained("path/to/hf_folder")    # config.json + model.safetensors or .bin

A Hugging Face GPT-2 folder holds config.json and the weights as model.safetensors (or
pytorch_model.bin). The module names are the same as ours; the difference is that GPT-2's
attention and MLP projections are Conv1D layers whose weight is stored (in, out), the
transpose of nn.Linear's (out, in). The causal-mask buffers (attn.bias, attn.masked_bias)
are dropped and the output head is tied to the token embedding.

Weights files are read and written with the `safetensors` package. Loading a state dict
exactly into a model, and a trainer checkpoint's weights as a model, are gpt/checkpoint/model_load.py's."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import Any, NoReturn

import safetensors
import safetensors.torch
import torch

from gpt.checkpoint.model_load import PretrainedError, build_model, load_checkpoint_model
from gpt.core import network
from gpt.core.config import ModelConfig
from gpt.core.config_io import flag
from gpt.core.fileio import atomic_path
from gpt.data.tokenizer import GPT2_VOCAB
from gpt.model import sizing
from gpt.model.transformer import GPT


HUB_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
HUB_ORG = "openai-community"
CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Stored as HF Conv1D (in, out): transposed to nn.Linear's (out, in) and back.
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers, not weights


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


def is_hub_name(name: str) -> bool:
    return name in HUB_NAMES


def download(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Fetch config.json and the weights of an OpenAI GPT-2 model from the Hugging Face hub
    (safetensors where the repo has them) into huggingface_hub's cache; return the folder."""
    if name not in HUB_NAMES:
        raise PretrainedError(f"--init-from {name!r}: not a GPT-2 model name ({', '.join(HUB_NAMES)}) "
                              "nor an existing folder")
    # Without network the cache alone is read, at once (not after the library's retries);
    # asked first: an address the library cannot parse fails its import
    offline = network.hub_unreachable()
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import EntryNotFoundError, RepositoryNotFoundError
    except ImportError:
        raise PretrainedError(f"--init-from {name}: downloading needs `pip install huggingface-hub`") from None

    last_error: Exception | None = None
    for repo in (f"{HUB_ORG}/{name}", name):  # the current repo, then the legacy id
        def fetch(file: str, repo: str = repo) -> str:
            # a hub that stops answering part-way: given up on, not retried for minutes
            return network.within_time_limit(
                lambda: hf_hub_download(repo, file, cache_dir=cache_dir,
                                        local_files_only=offline is not None),
                f"--init-from {name}: downloading {file} of {repo} from {network.hub_url()}",
                progress=lambda: _cached_bytes(repo, cache_dir))

        try:
            config = fetch(CONFIG_FILE)
            for weights in WEIGHT_FILES:
                try:
                    fetch(weights)
                    return Path(config).parent
                except EntryNotFoundError as e:
                    last_error = e
            if offline is not None:
                raise FileNotFoundError(repo)  # not cached: said below
            raise PretrainedError(f"--init-from {name}: hub repo {repo} has none of {', '.join(WEIGHT_FILES)}")
        except RepositoryNotFoundError as e:
            last_error = e
            continue
        except (PretrainedError, network.NetworkError):
            raise
        except Exception as e:  # network, HTTP and offline-mode errors come in many types
            if offline is not None:
                if repo != name:
                    continue  # the legacy id's cache may hold it
                raise PretrainedError(
                    f"--init-from {name}: not in the Hugging Face cache, and the hub cannot be "
                    f"reached ({offline}): download it once with network, or pass a local "
                    f"folder with config.json and model.safetensors") from None
            raise PretrainedError(
                f"--init-from {name}: could not download {repo} from the Hugging Face hub "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); offline, "
                "pass a local folder with config.json and model.safetensors"
            ) from None
    raise PretrainedError(f"--init-from {name}: not found on the Hugging Face hub ({last_error})")


def _cached_bytes(repo: str, cache_dir: str | os.PathLike | None) -> int:
    """The bytes huggingface_hub's cache holds of `repo` so far, partial downloads
    included: a download's progress."""
    from huggingface_hub import constants

    folder = Path(cache_dir or constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
    total = 0
    for root, _, files in os.walk(folder):
        for file in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, file)).st_size
    return total


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
    cfg = ModelConfig(block_size=block_size or n_positions, vocab_size=vocab_size or hf_vocab,
                      n_layer=n_layer, n_head=n_head, n_embd=n_embd, dropout=dropout)
    problem = sizing.build_cost_problem(cfg, f"{source}: n_layer")  # before any reader builds it
    if problem is not None:
        raise PretrainedError(problem)
    return cfg


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


# ModelConfig's parts that GPT-2's architecture does not have (not config.INIT_ONLY's:
# they change the initial weights, not the model, and their runs export as any other)
NOT_GPT2 = ("rotary", "rmsnorm", "qk_norm", "relu2", "untied_head", "value_embeds",
            "unet_skips", "doc_mask")


def not_gpt2_parts(cfg: ModelConfig) -> list[str]:
    """The flags of cfg's parts that GPT-2's architecture does not have."""
    return [flag(p) for p in NOT_GPT2 if getattr(cfg, p)] + (
        [f"--logit-softcap {cfg.logit_softcap}"] if cfg.logit_softcap else []) + (
        [f"--attn-window {cfg.attn_window}"] if cfg.attn_window else [])


def pretrained_shape(m: ModelConfig, init_from: str) -> ModelConfig:
    """The model `m` with --init-from's depth and width (its config.json is read; the
    weights are loaded later, in build_run, unless a checkpoint is resumed instead). Parts
    that would drop some of GPT-2's weights are refused; the others (an untied head starts
    as a copy of the embedding) take GPT-2's weights as a starting point."""
    for table, words in ((NO_PLACE_FOR, "a model with {flags} has no place for GPT-2's {what}"),
                         (NOT_IN_GPT2, "GPT-2's weights have no {what} for {flags}")):
        parts = [part for part in table if getattr(m, part)]
        if parts:
            flags = " and ".join(flag(part) for part in parts)
            what = " and ".join(table[part] for part in parts)
            raise PretrainedError(
                f"--init-from {init_from}: {words.format(flags=flags, what=what)}; "
                f"drop {flags}, or train from scratch without --init-from")
    folder = resolve(init_from)
    pre = model_config_from_hf(read_hf_config(folder), str(folder), m.vocab_size, m.block_size)
    return dataclasses.replace(m, **{k: getattr(pre, k) for k in ("n_layer", "n_head", "n_embd")})


def init_from_note(cfg: ModelConfig) -> str:
    """What --init-from's GPT-2 weights are to a model of cfg's parts, for the line that
    says so: "" while they still give GPT-2's function (an untied head starts as a copy of
    the embedding), else a note that they are only a starting point."""
    other = [p for p in not_gpt2_parts(cfg) if p != flag("untied_head")]
    if not other:
        return ""
    return (f" (with {', '.join(other)} the model computes something else with GPT-2's "
            f"weights: they are a starting point, not GPT-2)")


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
