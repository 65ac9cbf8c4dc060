"""The model's options beyond GPT-2 (rotary, RMSNorm, QK-norm, ReLU^2, untied head,
zero-initialised projections, logit soft-capping): each alone and all together, in the
model, the trainer, the distributed modes, generation and export. With all of them off the
model is GPT-2's; tests/model/test_transformer.py's parity tests hold that."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpt.checkpoint.export import export_hf
from gpt.checkpoint.files import load
from gpt.core.config import ModelConfig, model_preset
from gpt.model.transformer import GPT, Rotary
from helpers import (QUIET, TINY, assert_resume_is_exact, assert_two_ranks_match_one, graph_breaks,
                     meta_build_and_reference, run_cli, val_loader, write_random_shards)


OPTIONS: dict[str, dict[str, object]] = {
    "rotary": {"rotary": True}, "rmsnorm": {"rmsnorm": True}, "qk_norm": {"qk_norm": True},
    "relu2": {"relu2": True}, "untied_head": {"untied_head": True},
    "zero_init_proj": {"zero_init_proj": True, "untied_head": True},
    "logit_softcap": {"logit_softcap": 5.0},
}
ALL = {k: v for option in OPTIONS.values() for k, v in option.items()}
ALL_FLAGS = ["--rotary", "--rmsnorm", "--qk-norm", "--relu2", "--untied-head",
             "--logit-softcap", "15"]  # not zero-init: an all-zero head trains its first steps slowly


def tiny(**options: object) -> ModelConfig:
    return model_preset("tiny", block_size=32, **options)


@pytest.mark.parametrize("name", [*OPTIONS, "all"])
def test_a_meta_build_initialises_like_a_cpu_build(name: str) -> None:
    model, _ = meta_build_and_reference(tiny(**(ALL if name == "all" else OPTIONS[name])))
    x = torch.randint(0, 50257, (2, 16))
    _, loss = model(x, x)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters()
                                        if p.grad is not None)


def test_each_option_changes_what_it_names() -> None:
    gpt2 = GPT(tiny())
    rotary = GPT(tiny(rotary=True))
    assert "transformer.wpe.weight" in gpt2.state_dict()
    assert "transformer.wpe.weight" not in rotary.state_dict()
    assert rotary.num_params() == gpt2.num_params() - 32 * 64
    rms = GPT(tiny(rmsnorm=True))
    assert isinstance(rms.transformer.ln_f, torch.nn.RMSNorm) and "transformer.ln_f.bias" not in rms.state_dict()
    untied = GPT(tiny(untied_head=True))
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    assert untied.num_params() == gpt2.num_params() + 50304 * 64
    zero = GPT(tiny(zero_init_proj=True, untied_head=True))
    assert not zero.lm_head.weight.any() and not zero.transformer.h[0].mlp.c_proj.weight.any()
    assert zero.transformer.h[0].attn.c_attn.weight.any()
    assert GPT(tiny(zero_init_proj=True)).lm_head.weight.any()  # tied: the embedding stays
    x = torch.randint(0, 50257, (2, 16))
    logits, _ = GPT(tiny(logit_softcap=0.5)).eval()(x)
    assert logits.dtype == torch.float32 and logits.abs().max() <= 0.5
    relu2 = GPT(tiny(relu2=True)).transformer.h[0].mlp.act
    assert torch.equal(relu2(torch.tensor([-2.0, 3.0])), torch.tensor([0.0, 9.0]))


@pytest.mark.numerics
def test_rotary_scores_depend_on_relative_positions_only() -> None:
    q, k = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    rotary = Rotary()
    q0, k0 = rotary(q, k, 0)
    q7, k7 = rotary(q, k, 7)
    assert torch.allclose(q0 @ k0.transpose(-1, -2), q7 @ k7.transpose(-1, -2), atol=1e-5)
    assert not torch.allclose(q0, q7)


@pytest.mark.numerics
@pytest.mark.parametrize("name", ["rotary", "all"])
def test_kv_cache_decoding_equals_the_full_forward(name: str) -> None:
    options = dict(ALL, zero_init_proj=False) if name == "all" else OPTIONS[name]
    torch.manual_seed(0)
    model = GPT(tiny(**options)).eval()
    x = torch.randint(0, 50257, (2, 20))
    with torch.no_grad():
        full, _ = model(x)
        cache = model.new_kv_cache()
        parts = [model(x[:, a:b], kv_cache=cache)[0] for a, b in ((0, 12), (12, 15), (15, 20))]
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-5)


def test_generation_with_the_cache_equals_generation_without(tmp_path: Path) -> None:
    from gpt.eval.sampling import sample

    torch.manual_seed(0)
    model = GPT(tiny(**dict(ALL, zero_init_proj=False))).eval()
    runs = [sample(model, [1, 2, 3], 40, num_samples=2, top_k=5, use_cache=cache,
                   generator=torch.Generator().manual_seed(3)) for cache in (True, False)]
    assert torch.equal(runs[0], runs[1])  # 43 tokens: past the block size of 32 as well


def test_a_model_gpt2_cannot_hold_exports_with_its_own_code(tmp_path: Path) -> None:
    """(tests/checkpoint/test_export_custom.py checks what such an export computes.)"""
    out = export_hf(GPT(tiny(rotary=True, relu2=True)), tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gpt_trainer" and config["rotary"] and config["relu2"]
    assert (out / "modeling_gpt_trainer.py").is_file()
    # Zero-initialised projections change the starting weights, not the model: GPT-2's
    out = export_hf(GPT(tiny(zero_init_proj=True)), tmp_path / "zero-init")
    assert json.loads((out / "config.json").read_text())["model_type"] == "gpt2"


@pytest.mark.slow
def test_init_from_gpt2_weights_refuses_parts_with_no_place_for_them(tmp_path: Path) -> None:
    torch.manual_seed(3)
    source = GPT(tiny())
    export_hf(source, tmp_path / "hf")
    (tmp_path / "data").mkdir()
    data = write_random_shards(tmp_path / "data", seed=1, train=(5_000,))
    args = [*TINY, *QUIET, "--data-dir", str(data), "--init-from", str(tmp_path / "hf"),
            "--max-steps", "1", "--max-lr", "1e-9", "--warmup-steps", "0"]
    proc = run_cli(*args, "--out-dir", str(tmp_path / "rotary"), "--rotary", "--rmsnorm")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert ("a model with --rotary and --rmsnorm has no place for GPT-2's learned position "
            "embeddings and LayerNorm biases") in proc.stderr
    assert not (tmp_path / "rotary").exists()
    # The others take GPT-2's weights as a start; an untied head begins as the embedding
    proc = run_cli(*args, "--out-dir", str(tmp_path / "run"), "--untied-head", "--relu2")
    assert proc.returncode == 0, proc.stderr
    assert "(with --relu2 the model computes something else with GPT-2's weights" in proc.stdout
    saved = load(tmp_path / "run" / "ckpt_000001.pt")["model"]
    real = 50257  # GPT-2's rows; the exported folder holds no padding rows
    torch.testing.assert_close(saved["lm_head.weight"][:real],
                               source.transformer.wte.weight[:real], atol=1e-6, rtol=0)


def test_flags_and_recipe_keys_validate() -> None:
    from gpt.core.cli import parse_args

    cfg = parse_args([*TINY, *ALL_FLAGS])
    assert cfg.model.rotary and cfg.model.qk_norm and cfg.model.logit_softcap == 15.0
    with pytest.raises(SystemExit):
        parse_args([*TINY, "--logit-softcap", "-1"])
    with pytest.raises(SystemExit):
        parse_args(["--n-embd", "63", "--n-head", "7", "--rotary"])  # head size 9: odd


ARGS = [*TINY, *QUIET, *ALL_FLAGS, "--total-batch-tokens", "512"]


@pytest.mark.numerics
@pytest.mark.slow
def test_the_trainer_resumes_a_modern_model_exactly(data_dir: Path, tmp_path: Path) -> None:
    split = assert_resume_is_exact([*ARGS, "--data-dir", str(data_dir)], tmp_path)
    # what generate and evaluate load: the model as trained, its head its own
    from gpt.checkpoint.model_load import load_checkpoint_model

    model = load_checkpoint_model(split / "ckpt_000004.pt")
    assert model.config.rotary and model.config.untied_head
    assert model.lm_head.weight is not model.transformer.wte.weight
    saved = load(split / "ckpt_000004.pt")["model"]
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())


@pytest.mark.numerics
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_match_one_process_with_a_modern_model(mode: str, data_dir: Path,
                                                         tmp_path: Path) -> None:
    assert_two_ranks_match_one([*ARGS, "--max-steps", "3", "--data-dir", str(data_dir)], mode,
                               tmp_path)


@pytest.mark.slow
def test_the_memory_planner_plans_a_modern_model() -> None:
    from gpt.core.cli import parse_args
    from gpt.plan import memory

    gpt2 = memory.plan(parse_args(TINY), device_type="cpu")
    modern = memory.plan(parse_args([*TINY, *ALL_FLAGS]), device_type="cpu")
    # the untied head: its weight, gradient and two AdamW moments, 4 bytes each
    extra = 50304 * 64 * 4
    assert modern.components["parameters"] - gpt2.components["parameters"] == \
        pytest.approx(extra, rel=0.01)
    assert modern.components["optimizer state"] - gpt2.components["optimizer state"] == \
        pytest.approx(2 * extra, rel=0.01)


@pytest.mark.slow
def test_the_compiled_step_of_a_modern_model_has_no_graph_break(graph_backend, tmp_path: Path) -> None:
    """All the options and Muon under the trainer's torch.compile (aot_eager here): one
    graph for the training step and none added by a second step; evaluation and HellaSwag
    (rotary positions over padded examples) compile on their own callable."""
    from gpt.core.cli import parse_args
    from gpt.engine.step import forward_backward, optimizer_step
    from gpt.eval import hellaswag
    from gpt.eval.validation import val_loss
    from gpt.plan.preflight import preflight
    from gpt.runtime.world import init_runtime
    from gpt.train.build import build_run

    data = write_random_shards(tmp_path, seed=0, train=(20_000,), val=(5_000,))
    cfg = parse_args([*TINY, *QUIET, *ALL_FLAGS, "--zero-init-proj", "--optimizer", "muon",
                      "--compile", "--val-every", "5", "--data-dir", str(data),
                      "--out-dir", str(tmp_path / "run")])
    run = build_run(preflight(cfg).settled(), init_runtime("cpu"))
    try:
        par = run.par
        for _ in range(2):
            _, norm = forward_backward(par.train_model, par.scaler, par.optimizer,
                                       run.train_loader, run.accum, 1.0, "cpu", torch.float32)
            optimizer_step(par.optimizer, par.scaler, 1e-3, norm, settings={"muon": {"momentum": 0.9}})
        assert graph_breaks() == 0 and graph_backend.frame_count == 1
        assert torch.isfinite(val_loss(par.eval_model, val_loader(run), 2, "cpu", torch.float32))
        examples = [hellaswag.Example(context=(1, 2, 3), endings=((4,), (5, 6), (7,), (8, 9)),
                                      label=1)] * 3
        assert hellaswag.evaluate(par.eval_model, examples, "cpu", batch_examples=2)["total"] == 3
        assert graph_breaks() == 0
    finally:
        run.checkpointer.close()
