"""GPT-2 weights in and out: safetensors, Hugging Face folders, export (onto a full disk too),
the hub path; non-finite weights named by every reader of a single file."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpt import pretrained
from gpt.checkpoint import weights
from gpt.checkpoint.export import export_hf
from gpt.checkpoint.model_load import load_checkpoint_model
from gpt.checkpoint.weights import (PretrainedError, load_pretrained, read_safetensors,
                                    write_safetensors)
from gpt.core.config import model_preset
from gpt.model.transformer import GPT

from helpers import REPO, TINY_RUN, one_line_error, run_cli, write_checkpoint, write_random_shards

SMALL = dict(n_layer=2, n_head=2, n_embd=32, n_positions=24, vocab_size=100)


def hf_config(**overrides) -> dict:
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "n_ctx": 24,
            **SMALL, **overrides}


def hf_tensors(seed: int = 0, prefix: str = "transformer.", **cfg) -> dict[str, torch.Tensor]:
    """Random GPT-2 weights in Hugging Face's layout: Conv1D weights are (in, out), each
    layer has its causal-mask buffers, and the head is a copy of wte."""
    cfg = {**SMALL, **cfg}
    g = torch.Generator().manual_seed(seed)
    L, C, V, P = cfg["n_layer"], cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]

    def rnd(*shape: int, std: float = 0.2) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    sd = {"wte.weight": rnd(V, C), "wpe.weight": rnd(P, C),
          "ln_f.weight": 1 + rnd(C), "ln_f.bias": rnd(C)}
    for i in range(L):
        h = f"h.{i}."
        sd.update({
            h + "ln_1.weight": 1 + rnd(C), h + "ln_1.bias": rnd(C),
            h + "attn.c_attn.weight": rnd(C, 3 * C), h + "attn.c_attn.bias": rnd(3 * C),
            h + "attn.c_proj.weight": rnd(C, C), h + "attn.c_proj.bias": rnd(C),
            h + "ln_2.weight": 1 + rnd(C), h + "ln_2.bias": rnd(C),
            h + "mlp.c_fc.weight": rnd(C, 4 * C), h + "mlp.c_fc.bias": rnd(4 * C),
            h + "mlp.c_proj.weight": rnd(4 * C, C), h + "mlp.c_proj.bias": rnd(C),
            h + "attn.bias": torch.tril(torch.ones(P, P, dtype=torch.uint8)).view(1, 1, P, P),
            h + "attn.masked_bias": torch.tensor(-1e4),
        })
    sd = {prefix + k: v for k, v in sd.items()}
    sd["lm_head.weight"] = sd[prefix + "wte.weight"].clone()
    return sd


def make_hf_folder(folder: Path, fmt: str = "safetensors", prefix: str = "transformer.",
                   config: dict | None = None, tensors: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or hf_config()))
    sd = tensors if tensors is not None else hf_tensors(prefix=prefix)
    if fmt == "safetensors":
        weights.write_safetensors({k: v for k, v in sd.items() if k != "lm_head.weight"},
                                     folder / "model.safetensors")
    else:
        torch.save(sd, folder / "pytorch_model.bin")
    return folder


def reference_logits(sd: dict[str, torch.Tensor], idx: torch.Tensor, n_layer: int,
                     n_head: int) -> torch.Tensor:
    """GPT-2's forward written out from the HF-layout tensors: x @ W for Conv1D weights,
    explicit layer norm, masked softmax attention and tanh GELU."""
    w = {k.removeprefix("transformer."): v.double() for k, v in sd.items()}

    def layer_norm(x, name):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + 1e-5) * w[name + ".weight"] + w[name + ".bias"]

    def gelu(x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    B, T = idx.shape
    x = w["wte.weight"][idx] + w["wpe.weight"][:T]
    C = x.size(-1)
    hd = C // n_head
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(n_layer):
        h = f"h.{i}."
        qkv = layer_norm(x, h + "ln_1") @ w[h + "attn.c_attn.weight"] + w[h + "attn.c_attn.bias"]
        q, k, v = (t.reshape(B, T, n_head, hd).transpose(1, 2) for t in qkv.split(C, dim=-1))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        att = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ w[h + "attn.c_proj.weight"] + w[h + "attn.c_proj.bias"]
        m = gelu(layer_norm(x, h + "ln_2") @ w[h + "mlp.c_fc.weight"] + w[h + "mlp.c_fc.bias"])
        x = x + m @ w[h + "mlp.c_proj.weight"] + w[h + "mlp.c_proj.bias"]
    return (layer_norm(x, "ln_f") @ w["wte.weight"].T).float()


def logits_of(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(idx)[0]


IDX = torch.tensor([[5, 17, 99, 0, 42, 42, 7, 63, 12, 1, 2, 3], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])


# ---------------------------------------------------------------------------- safetensors


def test_safetensors_reader_reads_the_documented_layout(tmp_path: Path) -> None:
    """Bytes laid out by hand from the format description, not by our writer."""
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    b = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    header = {"__metadata__": {"format": "pt"},
              "b": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
              "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [4, 28]}}
    blob = json.dumps(header).encode()
    data = b.view(torch.int16).numpy().tobytes() + a.numpy().tobytes()
    path = tmp_path / "hand.safetensors"
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    out = read_safetensors(path)
    assert set(out) == {"a", "b"}
    assert torch.equal(out["a"], a) and out["b"].dtype == torch.bfloat16 and torch.equal(out["b"], b)


def test_safetensors_round_trip_and_layout(tmp_path: Path) -> None:
    tensors = {"w": torch.randn(3, 4), "h": torch.randn(5).half(), "i": torch.arange(7),
               "m": torch.ones(2, 2, dtype=torch.bool), "e": torch.zeros(0, 3),
               "bf": torch.randn(2, 2).bfloat16(), "t": torch.randn(4, 3).t()}
    path = weights.write_safetensors(tensors, tmp_path / "x.safetensors")
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    assert n % 8 == 0 and header["__metadata__"] == {"format": "pt"}  # transformers checks it
    start, end = header["w"]["data_offsets"]
    assert header["w"] == {"dtype": "F32", "shape": [3, 4], "data_offsets": [start, end]}
    assert end - start == tensors["w"].numel() * tensors["w"].element_size() == 48
    assert raw[8 + n + start : 8 + n + end] == tensors["w"].numpy().tobytes()  # little-endian F32
    back = read_safetensors(path)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name


def test_corrupt_safetensors_are_named(tmp_path: Path) -> None:
    path = weights.write_safetensors({"w": torch.randn(64)}, tmp_path / "w.safetensors")
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(PretrainedError, match=r"w\.safetensors: not a safetensors file, or a damaged one"):
        read_safetensors(path)
    path.write_bytes(b"\xff" * 16)
    with pytest.raises(PretrainedError, match="not a safetensors file"):
        read_safetensors(path)


# ---------------------------------------------------------------------------- import


@pytest.mark.parametrize("fmt,prefix", [("safetensors", "transformer."), ("safetensors", ""),
                                        ("bin", "transformer.")])
@pytest.mark.numerics
def test_loaded_logits_match_reference_forward(tmp_path: Path, fmt: str, prefix: str) -> None:
    folder = make_hf_folder(tmp_path / "hf", fmt=fmt, prefix=prefix)
    model = load_pretrained(folder)
    cfg = model.config
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.vocab_size) == (2, 2, 32, 24, 100)
    assert model.lm_head.weight is model.transformer.wte.weight
    expected = reference_logits(hf_tensors(prefix=prefix), IDX, n_layer=2, n_head=2)
    torch.testing.assert_close(logits_of(model, IDX), expected, rtol=0, atol=1e-4)


@pytest.mark.numerics
def test_vocab_padding_and_block_size_crop(tmp_path: Path) -> None:
    folder = make_hf_folder(tmp_path / "hf")
    plain = load_pretrained(folder)
    padded = load_pretrained(folder, vocab_size=128, block_size=16)
    assert padded.config.vocab_size == 128 and padded.config.block_size == 16
    wte = padded.transformer.wte.weight
    torch.testing.assert_close(wte[100:], wte[:100].mean(0).expand(28, -1))
    a, b = logits_of(plain, IDX), logits_of(padded, IDX)
    torch.testing.assert_close(b[..., :100], a, rtol=0, atol=1e-6)
    # The padding rows' logit is the mean logit, so they get under 28/100 of the probability.
    assert F.softmax(b, -1)[..., 100:].sum(-1).max() < 28 / 100
    with pytest.raises(PretrainedError, match="block_size 30"):
        load_pretrained(folder, block_size=30)
    with pytest.raises(PretrainedError, match="vocab_size 50"):
        load_pretrained(folder, vocab_size=50)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"activation_function": "relu"}, "activation_function"),
        ({"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon"),
        ({"model_type": "llama"}, "model_type"),
        ({"n_layer": 3}, "missing transformer.h.2"),
        ({"n_embd": 48}, "has shape"),
    ],
)
def test_unsupported_or_mismatched_configs_are_refused(tmp_path: Path, change: dict,
                                                       message: str) -> None:
    folder = make_hf_folder(tmp_path / "hf", config=hf_config(**change))
    with pytest.raises(PretrainedError, match=message):
        load_pretrained(folder)


def test_bad_folders_and_names(tmp_path: Path) -> None:
    with pytest.raises(PretrainedError, match="not one of gpt2"):
        load_pretrained(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PretrainedError, match="no config.json"):
        load_pretrained(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text(json.dumps(hf_config()))
    with pytest.raises(PretrainedError, match="no model.safetensors or pytorch_model.bin"):
        load_pretrained(tmp_path / "empty")
    sd = hf_tensors()
    sd["lm_head.weight"] = torch.randn_like(sd["lm_head.weight"])
    with pytest.raises(PretrainedError, match="not tied"):
        load_pretrained(make_hf_folder(tmp_path / "untied", fmt="bin", tensors=sd))


def test_hub_names_download_with_huggingface_hub(tmp_path: Path, monkeypatch) -> None:
    """The hub is replaced by a local folder holding only pytorch_model.bin."""
    import huggingface_hub
    from huggingface_hub.utils import EntryNotFoundError

    remote = make_hf_folder(tmp_path / "remote", fmt="bin")
    calls = []

    def fake_download(repo_id: str, filename: str, cache_dir=None, **kw) -> str:
        calls.append((repo_id, filename))
        src = remote / filename
        if not src.exists():
            raise EntryNotFoundError(f"{filename} not in {repo_id}")
        dest = tmp_path / "cache" / repo_id / filename
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(src.read_bytes())
        return str(dest)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    model = load_pretrained("gpt2-medium")
    assert calls == [("openai-community/gpt2-medium", "config.json"),
                     ("openai-community/gpt2-medium", "model.safetensors"),
                     ("openai-community/gpt2-medium", "pytorch_model.bin")]
    torch.testing.assert_close(logits_of(model, IDX), logits_of(load_pretrained(remote), IDX))

    def offline(*a, **kw):
        raise ConnectionError("no network")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(PretrainedError, match="could not download openai-community/gpt2"):
        load_pretrained("gpt2")


# ---------------------------------------------------------------------------- export


def tiny_gpt(vocab_size: int = 100, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(model_preset("tiny", block_size=24, vocab_size=vocab_size))
    with torch.no_grad():  # non-zero biases and gains, so a missed tensor would show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def test_export_then_import_gives_identical_logits(tmp_path: Path) -> None:
    model = tiny_gpt()
    out = export_hf(model, tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["architectures"] == ["GPT2LMHeadModel"]
    assert (config["n_layer"], config["n_embd"], config["n_positions"], config["vocab_size"]) == (2, 64, 24, 100)
    names = read_safetensors(out / "model.safetensors")
    assert names["transformer.h.0.attn.c_attn.weight"].shape == (64, 192)  # Conv1D layout
    assert "lm_head.weight" not in names  # tied: transformers re-ties it
    back = load_pretrained(out)
    assert torch.equal(logits_of(back, IDX), logits_of(model, IDX))
    assert not list(tmp_path.glob("hf/.*"))  # no temporary files left


def test_export_of_a_padded_checkpoint_cuts_the_padding(tmp_path: Path, capsys) -> None:
    model = tiny_gpt(vocab_size=50304)
    ckpt = write_checkpoint(tmp_path / "ckpt_000010.pt", model, step=10)
    assert pretrained.main(["export", "--checkpoint", str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    assert "model.safetensors" in capsys.readouterr().out
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["vocab_size"] == 50257
    back = load_pretrained(tmp_path / "hf", vocab_size=50304)
    torch.testing.assert_close(logits_of(back, IDX)[..., :50257], logits_of(model, IDX)[..., :50257],
                               rtol=0, atol=0)


def test_export_cli_errors(tmp_path: Path, capsys) -> None:
    assert pretrained.main(["export", "--checkpoint", str(tmp_path / "no.pt"), "--out",
                            str(tmp_path / "hf")]) == 1
    err = capsys.readouterr().err
    assert "no.pt: no such checkpoint file" in err and "Traceback" not in err
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    assert pretrained.main(["export", "--checkpoint", str(tmp_path / "junk.pt"), "--out",
                            str(tmp_path / "hf")]) == 1
    assert "junk.pt: not a readable checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        pretrained.main(["export", "--out", "x"])
    assert exc.value.code == 2


@pytest.mark.numerics
def test_transformers_loads_the_export(tmp_path: Path) -> None:
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (optional; not a dependency)")
    model = tiny_gpt()
    out = export_hf(model, tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    with torch.no_grad():
        theirs = hf(IDX).logits
    torch.testing.assert_close(theirs, logits_of(model, IDX), rtol=0, atol=1e-4)


def test_the_export_works_in_a_text_generation_pipeline(tmp_path: Path) -> None:
    """The folder carries GPT-2's tokenizer, so AutoTokenizer and pipeline() work on it as
    it is, and greedy generation there gives the text our own sampling gives."""
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (optional; not a dependency)")
    from gpt.data.tokenizer import gpt2_tokenizer
    from gpt.eval.sampling import sample

    model = tiny_gpt(vocab_size=50304)  # GPT-2's padded vocabulary, as trained
    out = export_hf(model, tmp_path / "hf")
    assert {"vocab.json", "merges.txt", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    small = export_hf(tiny_gpt(), tmp_path / "small")  # not GPT-2's vocabulary: no tokenizer
    assert not (small / "vocab.json").exists()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = gpt2_tokenizer()
    prompt = "Hello, I'm a language model,"
    assert tok(prompt)["input_ids"] == enc.encode_ordinary(prompt) and len(tok) == 50257
    generate = transformers.pipeline("text-generation", model=str(out), tokenizer=str(out))
    text = generate(prompt, max_new_tokens=8, do_sample=False)[0]["generated_text"]
    ours = sample(model, enc.encode_ordinary(prompt), 8, temperature=0, valid_vocab=50257)
    assert text != prompt and text == enc.decode(ours[0].tolist())


def tiny_model(vocab_size: int = 50304, block_size: int = 32) -> GPT:
    torch.manual_seed(0)
    return GPT(model_preset("tiny", block_size=block_size, vocab_size=vocab_size))


@pytest.mark.slow
def test_an_export_onto_a_full_disk_is_one_line_and_keeps_the_model_there(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt_000001.pt", tiny_model())
    out = export_hf(ckpt, tmp_path / "hf")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    script = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (100000, 100000))\n"
              "from gpt.pretrained import main\n"
              f"for out in {[str(out), str(tmp_path / 'new')]!r}:\n"
              f"    print('status', main(['export', '--checkpoint', {str(ckpt)!r}, '--out', out]))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=REPO)  # over a model, and into a new folder
    assert proc.stdout.split() == ["status", "1", "status", "1"] and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    for line, folder in zip(lines, (out, tmp_path / "new"), strict=True):
        assert line.startswith(f"error: --out {folder}: could not write model.safetensors")
        assert "GiB free" in line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temporary files either
    assert not (tmp_path / "new").exists()


def test_an_export_that_no_gpt2_tokenizer_fits_is_refused_or_said(tmp_path: Path, capsys) -> None:
    with pytest.raises(PretrainedError, match="--vocab-size 10 would cut GPT-2's token ids 10..50256"):
        export_hf(tiny_model(), tmp_path / "hf", vocab_size=10)
    assert not (tmp_path / "hf").exists()
    out = export_hf(tiny_model(), tmp_path / "hf")  # GPT-2's vocabulary: with its tokenizer
    assert (out / "vocab.json").exists() and capsys.readouterr().err == ""
    export_hf(tiny_model(vocab_size=100), out)  # over it, a model no GPT-2 tokenizer fits
    err = capsys.readouterr().err
    assert f"note: --out {out}: replaced the model that was there (config.json, model.safetensors, " \
           f"vocab.json, merges.txt, tokenizer_config.json)" in err
    assert "vocabulary 100 is not GPT-2's 50257: no tokenizer files were written" in err
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]  # no stale tokenizer
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 100


# ---------------------------------------------------------------- non-finite weights


def test_non_finite_weights_given_by_init_from_are_named_when_loaded(tmp_path: Path) -> None:
    out = export_hf(tiny_model(), tmp_path / "hf")
    weights = read_safetensors(out / "model.safetensors")
    weights["transformer.h.1.mlp.c_fc.weight"][3, 5] = float("nan")
    write_safetensors(weights, out / "model.safetensors")
    (tmp_path / "d").mkdir()
    data = write_random_shards(tmp_path / "d", seed=6, train=(5_000,))
    proc = run_cli(*TINY_RUN, "--max-steps", "2", "--init-from", str(out), "--data-dir", str(data),
                   "--out-dir", str(tmp_path / "run"))
    line = one_line_error(proc)
    assert f"{out / 'model.safetensors'}: transformer.h.1.mlp.c_fc.weight holds NaN" in line
    assert "--max-lr" not in proc.stderr + proc.stdout
    assert not (tmp_path / "run").exists()


def test_every_reader_of_a_single_file_names_non_finite_weights(tmp_path: Path) -> None:
    model = tiny_model()
    with torch.no_grad():
        model.transformer.wpe.weight[0, 0] = float("inf")
    ckpt = write_checkpoint(tmp_path / "ckpt_000001.pt", model)
    with pytest.raises(PretrainedError, match="ckpt_000001.pt: transformer.wpe.weight holds NaN, inf"):
        load_checkpoint_model(ckpt)  # generate and evaluate
    with pytest.raises(PretrainedError, match="ckpt_000001.pt: transformer.wpe.weight holds NaN, inf"):
        export_hf(ckpt, tmp_path / "hf")
    with pytest.raises(PretrainedError, match="a file, not a Hugging Face GPT-2 folder; a trainer "
                                              "checkpoint continues with --resume"):
        load_pretrained(ckpt)  # --init-from
