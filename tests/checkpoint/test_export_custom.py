"""Models beyond GPT-2 exported with their own code (gpt/checkpoint/export_custom.py,
gpt/checkpoint/hf_model/): each option of the speedrun-era recipe computes in transformers
what it computes here, through AutoModelForCausalLM, generate(), pipeline() and lm-eval's
hf model, with trust_remote_code=True and no network."""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

from gpt import pretrained
from gpt.checkpoint import export_custom
from gpt.checkpoint.export import export_hf
from gpt.checkpoint.model_load import load_checkpoint_model
from gpt.core.cli import parse_args
from gpt.core.config import INIT_ONLY, Config, ModelConfig, TrainConfig, model_preset
from gpt.core.config_io import to_dict
from gpt.eval.sampling import sample
from gpt.model.transformer import GPT

from helpers import QUIET, REPO, run_cli

EOT, VOCAB = 50256, 50257
# Each option alone (value embeddings on 4 blocks, so some have none; U-net skips on 5, so
# the middle block has no mirror), the growing window half-way through its growth
OPTIONS = {
    "rotary": dict(rotary=True),
    "rmsnorm": dict(rmsnorm=True),
    "qk_norm": dict(qk_norm=True),
    "relu2": dict(relu2=True),
    "untied_head": dict(untied_head=True),
    "logit_softcap": dict(logit_softcap=3.0),
    "value_embeds": dict(value_embeds=True, n_layer=4),
    "unet_skips": dict(unet_skips=True, n_layer=5),
    "attn_window": dict(attn_window=4, attn_window_final=12),
    "doc_mask": dict(doc_mask=True),
}
ALL = {k: v for option in OPTIONS.values() for k, v in option.items()} | {"n_layer": 4}


def tokens() -> torch.Tensor:
    """Two rows of 30 tokens (past any window here), with end-of-text tokens in them."""
    idx = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(0))
    idx[0, 5] = idx[0, 20] = idx[1, 17] = EOT
    return idx


def write_model(path: Path, cfg: ModelConfig, step: int = 6, max_steps: int = 10) -> Path:
    """A trainer-style checkpoint of a seeded model of cfg, written after `step` of
    `max_steps` steps. Its weights are moved off their initial values (gains and mixing
    scalars too), so a tensor the export missed would show, and logits spread widely enough
    that greedy choices are far from ties."""
    torch.manual_seed(1)
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    config = Config(preset="tiny", model=cfg, train=TrainConfig(max_steps=max_steps))
    torch.save({"model": model.state_dict(), "optimizer": {}, "loader": {}, "step": step,
                "config": to_dict(config)}, path)
    return path


def exported(tmp_path: Path, cfg: ModelConfig, capsys: pytest.CaptureFixture) -> tuple[Path, Path]:
    """(checkpoint, export folder), exported through the command line."""
    ckpt = write_model(tmp_path / "ckpt_000006.pt", cfg)
    out = tmp_path / "hf-export"
    assert pretrained.main(["export", "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "modeling_gpt_trainer.py" in said and "trust_remote_code=True" in said
    return ckpt, out


def load(out: Path):
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (optional; the hf extra)")
    return transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()


def logits_of(model, idx: torch.Tensor, **kw) -> torch.Tensor:
    with torch.no_grad():
        out = model(idx, **kw)
    return out.logits if hasattr(out, "logits") else out[0][..., :VOCAB]


def greedy(model, prompt: list[int], n: int, use_cache: bool) -> list[int]:
    return model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                          use_cache=use_cache, pad_token_id=EOT)[0].tolist()


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("option", OPTIONS)
def test_each_option_computes_our_logits_and_greedy_tokens(tmp_path: Path, option: str,
                                                           capsys: pytest.CaptureFixture) -> None:
    """The export's logits are ours, as gpt.generate loads the checkpoint (its window the one
    of the last trained step), and greedy generation gives our tokens, with the KV cache
    and without. The two forwards run the same fp32 operations in the same order, so the
    logits agree to the last bit on the CPUs tried; 1e-5 on logits of size ~10 leaves room
    for another CPU's kernels choosing another summation order, and none for a missed part
    (which moves them by 1e-2 or more)."""
    cfg = model_preset("tiny", block_size=32, vocab_size=50304, **OPTIONS[option])
    ckpt, out = exported(tmp_path, cfg, capsys)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gpt_trainer" and config["vocab_size"] == VOCAB
    if option == "attn_window":  # the window of step 5 (the sixth) of 0..9: 4 + (12 - 4) * 5 / 9
        assert config["attn_window"] == 8
    ours, theirs = load_checkpoint_model(ckpt).eval(), load(out)
    assert type(theirs).__name__ == "GPTTrainerForCausalLM"
    idx = tokens()
    torch.testing.assert_close(logits_of(theirs, idx), logits_of(ours, idx), rtol=0, atol=1e-5)
    prompt = idx[0, :8].tolist()  # an end-of-text token inside it
    want = sample(ours, prompt, 10, temperature=0, valid_vocab=VOCAB)[0].tolist()
    assert greedy(theirs, prompt, 10, use_cache=True) == want
    assert greedy(theirs, prompt, 10, use_cache=False) == want


@pytest.mark.numerics
@pytest.mark.parametrize("options", [ALL, dict(attn_window=6, doc_mask=True, relu2=True)],
                         ids=["all", "learned-positions"])
def test_padding_and_a_cache_compute_what_one_pass_does(tmp_path: Path, options: dict,
                                                        capsys: pytest.CaptureFixture) -> None:
    """A left-padded row gets the logits it gets alone, and tokens fed to a cache in two
    chunks get those of one pass (learned positions, where a shifted position would show,
    and rotary ones). These passes give SDPA other masks, so other kernels that sum in
    another order: ~1e-5 apart on logits of size ~10; 1e-4 bounds that, while a wrong
    position, window or document moves them by 1e-2 or more."""
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (optional; the hf extra)")
    DynamicCache = transformers.DynamicCache

    _, out = exported(tmp_path, model_preset("tiny", block_size=32, vocab_size=50304, **options),
                      capsys)
    model, idx = load(out), tokens()
    whole = logits_of(model, idx)
    padded, mask = idx.clone(), torch.ones_like(idx)
    padded[1, 7:], padded[1, :7], mask[1, :7] = idx[1, :23], EOT, 0  # row 1: 7 pads, 23 tokens
    alone = logits_of(model, idx[1:, :23])
    torch.testing.assert_close(logits_of(model, padded, attention_mask=mask)[1, 7:], alone[0],
                               rtol=0, atol=1e-4)
    cache = DynamicCache()
    name = sys.modules[type(model).__module__].CACHE  # the argument's name in this transformers
    logits_of(model, idx[:, :10], use_cache=True, **{name: cache})
    later = logits_of(model, idx[:, 10:16], use_cache=True, context_ids=idx[:, :16], **{name: cache})
    torch.testing.assert_close(later, whole[:, 10:16], rtol=0, atol=1e-4)


@pytest.mark.numerics
def test_the_readme_recipe_exports_and_writes_our_text_in_a_pipeline(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The README's first run's model (configs/cpu-speedrun.toml's options) exported from its
    checkpoint: pipeline("text-generation") on the folder writes, greedily, the text
    gpt.generate writes from the checkpoint."""
    cfg = parse_args(["--config", str(REPO / "configs" / "cpu-speedrun.toml")]).model
    ckpt, out = exported(tmp_path, cfg, capsys)
    assert_same_text(ckpt, out, capsys)


def assert_same_text(ckpt: Path, out: Path, capsys: pytest.CaptureFixture) -> None:
    """gpt.generate on the checkpoint and pipeline("text-generation") on its export write
    the same greedy text after "ROMEO:"."""
    transformers = pytest.importorskip("transformers")
    from gpt.generate import main as generate

    assert generate(["--checkpoint", str(ckpt), "--prompt", "ROMEO:", "--max-new-tokens", "12",
                     "--temperature", "0", "--device", "cpu"]) == 0
    ours = capsys.readouterr().out.split("--- sample 0\n", 1)[1].removesuffix("\n")  # print's
    write = transformers.pipeline("text-generation", model=str(out), trust_remote_code=True)
    theirs = write("ROMEO:", max_new_tokens=12, do_sample=False)[0]["generated_text"]
    assert theirs != "ROMEO:" and theirs == ours
    text = "I do , and you ? Yes ."  # decoded as the BPE wrote it, in transformers 4.x as well
    assert write.tokenizer.decode(write.tokenizer(text)["input_ids"]) == text


def test_an_option_the_export_cannot_carry_is_refused_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = write_model(tmp_path / "ckpt.pt", model_preset("tiny", block_size=32, relu2=True,
                                                          rotary=True))
    monkeypatch.setattr(export_custom, "CARRIED", tuple(f for f in export_custom.CARRIED
                                                        if f != "relu2"))
    assert pretrained.main(["export", "--checkpoint", str(ckpt), "--out", str(tmp_path / "hf")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the export cannot carry --relu2" in err and "ckpt.pt" in err
    assert not (tmp_path / "hf").exists()


def test_every_model_option_is_carried_or_only_chooses_the_start() -> None:
    """An option added to ModelConfig is refused by the export (above) until the exported
    model computes it and export_custom.CARRIED names it."""
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    assert fields == set(export_custom.CARRIED) | set(INIT_ONLY)


def test_the_model_code_imports_only_torch_and_transformers() -> None:
    """What a machine with transformers alone can load: no import of this package. The
    folder's own __init__ imports nothing either (it is a package only so that the files ship
    with this one)."""
    import gpt.checkpoint.hf_model as code

    assert Path(code.__file__).resolve().parent == export_custom.CODE
    assert sorted(p.name for p in export_custom.CODE.glob("*.py")) == sorted(
        ["__init__.py", *export_custom.CODE_FILES])
    for name in export_custom.CODE_FILES:
        tree = ast.parse((export_custom.CODE / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                tops = {"." if node.level else node.module.split(".")[0]}
            else:
                continue
            assert tops <= {"torch", "transformers", "."}, f"{name}: imports {tops}"


def test_the_model_code_builds_a_fresh_model_in_the_package_too() -> None:
    """The same files as modules of this package: a model from a config alone (transformers'
    from_config: random initial weights) runs and generates."""
    pytest.importorskip("transformers")
    from gpt.checkpoint.hf_model.configuration_gpt_trainer import GPTTrainerConfig
    from gpt.checkpoint.hf_model.modeling_gpt_trainer import GPTTrainerForCausalLM

    config = GPTTrainerConfig(vocab_size=100, block_size=16, n_layer=2, n_head=2, n_embd=32,
                              value_embeds=True, unet_skips=True, rotary=True, eos_token_id=99)
    model = GPTTrainerForCausalLM(config).eval()
    assert model.lm_head.weight is model.transformer.wte.weight  # tied unless told otherwise
    assert torch.equal(model.transformer.h[0].attn.value_mix.weights, torch.full((2,), 0.5))
    ids = torch.tensor([[1, 2, 3]])
    out = model(ids, labels=ids)
    assert out.logits.shape == (1, 3, 100) and torch.isfinite(out.loss)
    assert model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0).shape[1] <= 7
    with pytest.raises(ValueError, match="exceed the model's context of 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_a_gpt2_model_over_an_export_with_code_leaves_no_code(tmp_path: Path, capsys) -> None:
    out = tmp_path / "hf"
    torch.manual_seed(0)
    export_hf(GPT(model_preset("tiny", block_size=32, rotary=True)), out)
    assert {"modeling_gpt_trainer.py", "configuration_gpt_trainer.py"} <= {p.name for p in out.iterdir()}
    export_hf(GPT(model_preset("tiny", block_size=32)), out)
    assert not (out / "modeling_gpt_trainer.py").exists()
    assert json.loads((out / "config.json").read_text())["model_type"] == "gpt2"
    assert "modeling_gpt_trainer.py" in capsys.readouterr().err  # the note of what it replaced


@pytest.mark.slow
@pytest.mark.numerics
def test_a_trained_speedrun_model_scores_alike_in_lm_eval_hf(
        tmp_path: Path, shakespeare_dir: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's recipe trained by the trainer, then exported: a pipeline writes
    gpt.generate's text, and lm-eval's own hf model on the folder (trust_remote_code=True)
    answers every request type as our harness model does on the checkpoint: log-likelihoods within 1e-4 (fp32; contexts longer than the
    block cut alike, batches padded), the same greedy flags and generated text."""
    pytest.importorskip("lm_eval", reason='lm-eval is not installed (pip install -e ".[eval]")')
    pytest.importorskip("accelerate", reason="the harness's hf model needs it (the hf extra)")
    from lm_eval.models.huggingface import HFLM

    from gpt.eval.harness import GPT2TrainerLM

    from harness_fixtures import write_tasks
    from harness_fixtures import TASKS, flatten, responses

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = tmp_path / "run"
    proc = run_cli("--config", str(REPO / "configs" / "cpu-speedrun.toml"), *QUIET,
                   "--data-dir", str(shakespeare_dir), "--out-dir", str(run), "--block-size", "64",
                   "--seq-len", "64", "--total-batch-tokens", "512", "--max-steps", "12",
                   "--checkpoint-every", "12")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpt = run / "ckpt_000012.pt"
    assert pretrained.main(["export", "--checkpoint", str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    assert_same_text(ckpt, tmp_path / "hf", capsys)
    folder = write_tasks(tmp_path / "tasks")
    ours = responses(GPT2TrainerLM(model=load_checkpoint_model(ckpt), dtype="fp32", batch_size=3),
                     folder)
    theirs = responses(HFLM(pretrained=str(tmp_path / "hf"), trust_remote_code=True, device="cpu",
                            dtype="float32", batch_size=3), folder)
    assert ours.keys() == theirs.keys() == set(TASKS)
    for task in TASKS:
        a, b = flatten(ours[task]), flatten(theirs[task])
        assert len(a) == len(b) > 0, task
        for x, y in zip(a, b):
            assert x == (pytest.approx(y, abs=1e-4) if isinstance(x, float) else y), task
