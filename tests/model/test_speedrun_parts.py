"""The speedrun's further model parts, each off by default: value embeddings, U-net skips,
a growing sliding attention window and document masks (gpt/model/value_embeds.py, gpt/model/unet.py,
gpt/model/attention_mask.py): what each does, KV-cache decoding, meta builds, compile, the
trainer's window and resume, export (carried) and --init-from (refused), Muon's groups."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpt.checkpoint.export import export_hf
from gpt.core.config import ModelConfig, model_preset
from gpt.model.attention_mask import EOT, AttentionMask, window_at
from gpt.model.transformer import GPT
from helpers import (QUIET, TINY, assert_resume_is_exact, graph_breaks, meta_build_and_reference,
                     run_cli, write_random_shards)


PARTS: dict[str, dict[str, object]] = {
    "value_embeds": {"value_embeds": True},
    "unet_skips": {"unet_skips": True},
    "window": {"attn_window": 6, "attn_window_final": 20},
    "doc_mask": {"doc_mask": True},
}
ALL = {k: v for part in PARTS.values() for k, v in part.items()}
ALL_FLAGS = ["--value-embeds", "--unet-skips", "--attn-window", "8", "--attn-window-final",
             "32", "--doc-mask", "--rotary", "--rmsnorm"]


def cfg(n_layer: int = 4, **options: object) -> ModelConfig:
    return model_preset("tiny", block_size=32, n_layer=n_layer, **options)


def tokens(seed: int = 0, T: int = 24) -> torch.Tensor:
    x = torch.randint(0, 50000, (2, T), generator=torch.Generator().manual_seed(seed))
    x[0, 5], x[0, 13], x[1, 9] = EOT, EOT, EOT  # three documents in row 0, two in row 1
    return x


def test_off_by_default_the_model_is_gpt2s() -> None:
    torch.manual_seed(0)
    ref = GPT(cfg())
    assert not any(k.startswith(("value_embeds", "skips", "attn_mask")) for k in ref.state_dict())
    assert dict(ModelConfig().__dict__, **ALL) != ModelConfig().__dict__
    assert all(getattr(ModelConfig(), k) in (False, 0) for k in ALL)


def test_value_embeddings_share_tables_between_first_and_last_blocks() -> None:
    model = GPT(cfg(n_layer=5, value_embeds=True))
    assert model.value_embeds.layers == [0, 1, None, 0, 1]
    assert [b.attn.value_mix is not None for b in model.transformer.h] == [1, 1, 0, 1, 1]
    assert model.num_params() == GPT(cfg(n_layer=5)).num_params() + 2 * 50304 * 64 + 4 * 2
    # a block's values see the token ids: a table change moves that block's output
    x = tokens()
    with torch.no_grad():
        before, _ = model(x)
        model.value_embeds.tables[1].weight.add_(1.0)
        after, _ = model(x)
    assert not torch.allclose(before, after)


def test_unet_skips_add_the_mirror_blocks_output() -> None:
    model = GPT(cfg(n_layer=5, unet_skips=True))
    x, outs = torch.zeros(1, 1, 2), [torch.full((1, 1, 2), float(i)) for i in range(4)]
    with torch.no_grad():
        model.skips.weights.copy_(torch.tensor([2.0, 3.0]))
    assert torch.equal(model.skips(2, x, outs[:2]), x)  # the middle block: nothing
    assert torch.equal(model.skips(3, x, outs[:3]), x + 2.0 * outs[1])
    assert torch.equal(model.skips(4, x, outs), x + 3.0 * outs[0])


def attends(model: GPT, x: torch.Tensor, changed: int) -> torch.Tensor:
    """Which positions' logits move when the token at `changed` does."""
    y = x.clone()
    y[:, changed] = (y[:, changed] + 1) % 50000
    with torch.no_grad():
        a, b = model(x)[0], model(y)[0]
    return (a - b).abs().amax(dim=-1) > 1e-6  # (B, T)


def test_the_window_hides_positions_further_back_and_grows() -> None:
    model = GPT(cfg(n_layer=1, attn_window=4, attn_window_final=16)).eval()
    x = torch.randint(0, 50000, (1, 24))
    moved = attends(model, x, 2)[0]
    # one layer: position 2 reaches positions 2..5 (a query sees 4 positions, itself included)
    assert moved[2:6].all() and not moved[6:].any() and not moved[:2].any()
    assert [window_at(model.config, s, 11) for s in (0, 5, 10, 11)] == [4, 10, 16, 16]
    model.attn_mask.set_step(10, 11)
    moved = attends(model, x, 2)[0]
    assert moved[2:18].all() and not moved[18:].any()


def test_documents_do_not_see_each_other() -> None:
    model = GPT(cfg(doc_mask=True)).eval()
    x = tokens()
    moved = attends(model, x, 3)  # row 0's first document is positions 0..4
    assert moved[0, 3:5].all() and not moved[0, 5:].any()
    assert moved[1, 3:9].all() and not moved[1, 9:].any()  # row 1's breaks at 9


@pytest.mark.numerics
@pytest.mark.parametrize("name", [*PARTS, "all"])
def test_kv_cache_decoding_equals_the_full_forward(name: str) -> None:
    options = ALL if name == "all" else PARTS[name]
    torch.manual_seed(0)
    model = GPT(cfg(rotary=name == "all", **options)).eval()
    x = tokens()
    with torch.no_grad():
        full, _ = model(x)
        cache = model.new_kv_cache()
        chunks = ((0, 4), (4, 5), (5, 6), (6, 14), (14, 15), (15, 24))  # EOT inside, at edges
        parts = [model(x[:, a:b], kv_cache=cache)[0] for a, b in chunks]
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-5)


@pytest.mark.parametrize("name", [*PARTS, "all"])
def test_a_meta_build_initialises_like_a_cpu_build(name: str) -> None:
    config = cfg(**(ALL if name == "all" else PARTS[name]))
    model, ref = meta_build_and_reference(config)
    if isinstance(model.attn_mask, AttentionMask):  # a buffer outside the state dict
        assert model.attn_mask.window.item() == ref.attn_mask.window.item() == window_at(config, 0, 1)


def test_muon_leaves_the_value_tables_and_scalars_to_adamw() -> None:
    from gpt.optim.muon import hidden_matrices

    model = GPT(cfg(value_embeds=True, unet_skips=True))
    hidden = {id(p) for p in hidden_matrices(model)}
    assert all(id(p) not in hidden for p in model.value_embeds.parameters())
    assert id(model.skips.weights) not in hidden
    assert all(p.dim() == 2 for p in hidden_matrices(model))


@pytest.mark.slow
def test_the_compiled_model_has_no_graph_break(graph_backend) -> None:
    """All four parts (and rotary) under torch.compile: one graph for the forward and
    backward, none more when the window grows (a buffer, not a constant)."""
    torch.manual_seed(0)
    model = GPT(cfg(rotary=True, **ALL))
    compiled = torch.compile(model, backend=graph_backend)
    x = tokens()
    for step in range(3):
        model.attn_mask.set_step(step, 3)
        compiled(x, x)[1].backward()
    assert graph_breaks() == 0 and graph_backend.frame_count == 1


def test_export_carries_the_parts_and_init_from_refuses_them(tmp_path: Path) -> None:
    """(What such an export computes: tests/checkpoint/test_export_custom.py.)"""
    for name, options in PARTS.items():
        config = json.loads((export_hf(GPT(cfg(**options)), tmp_path / name) / "config.json").read_text())
        assert config["model_type"] == "gpt_trainer", name
        assert {k: config[k] for k in options if k != "attn_window_final"} == \
            {k: v for k, v in options.items() if k != "attn_window_final"}  # the window of step 0
    export_hf(GPT(cfg()), tmp_path / "hf")
    data = write_random_shards(tmp_path, seed=1, train=(5_000,))
    proc = run_cli(*TINY, *QUIET, "--data-dir", str(data), "--init-from", str(tmp_path / "hf"),
                   "--max-steps", "1", "--value-embeds", "--out-dir", str(tmp_path / "run"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "GPT-2's weights have no value embedding tables for --value-embeds" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags, says", [
    (["--attn-window", "64"], "--attn-window 64: must be in [0, --block-size 32]"),
    (["--attn-window-final", "16"], "--attn-window-final 16 needs an --attn-window from 1 up"),
    (["--attn-window", "20", "--attn-window-final", "16"], "needs an --attn-window from 1 up"),
])
def test_bad_windows_are_one_line(flags: list[str], says: str, tmp_path: Path) -> None:
    proc = run_cli(*TINY, *flags, "--max-steps", "1", "--out-dir", str(tmp_path / "r"))
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.numerics
@pytest.mark.slow
def test_the_trainer_grows_the_window_and_resumes_exactly(tmp_path: Path) -> None:
    """The window comes from the step, so a run stopped and resumed trains as one that
    was not; all four parts and the flags' way in."""
    data = write_random_shards(tmp_path, seed=0, train=(20_000,), val=(4_000,))
    assert_resume_is_exact([*TINY, *QUIET, *ALL_FLAGS, "--n-layer", "4", "--data-dir",
                            str(data)], tmp_path)


def test_a_checkpoint_loads_with_the_window_it_was_last_trained_with(tmp_path: Path) -> None:
    """gpt.generate / gpt.evaluate read a checkpoint as a model: its window is the one of
    the last step trained, not the first step's."""
    from dataclasses import replace

    from gpt.checkpoint.model_load import load_checkpoint_model
    from gpt.core.config import Config, TrainConfig
    from gpt.core.config_io import to_dict

    model_cfg = cfg(attn_window=4, attn_window_final=20)
    config = replace(Config(), model=model_cfg, train=TrainConfig(max_steps=9))
    torch.save({"model": GPT(model_cfg).state_dict(), "config": to_dict(config), "step": 5},
               tmp_path / "ckpt.pt")
    model = load_checkpoint_model(tmp_path / "ckpt.pt")
    assert model.attn_mask.window.item() == window_at(model_cfg, 4, 9) == 12


@pytest.mark.slow
def test_the_memory_planner_counts_the_value_tables() -> None:
    from gpt.core.cli import parse_args
    from gpt.plan import memory

    gpt2 = memory.plan(parse_args(TINY), device_type="cpu")
    parts = memory.plan(parse_args([*TINY, *ALL_FLAGS]), device_type="cpu")
    extra = 50304 * 64 * 4  # tiny has 2 blocks: one table, shared by both; fp32
    assert parts.components["parameters"] - gpt2.components["parameters"] == \
        pytest.approx(extra, rel=0.01)
    assert parts.components["optimizer state"] - gpt2.components["optimizer state"] == \
        pytest.approx(2 * extra, rel=0.01)


@pytest.mark.numerics
# Eager on purpose (the mask's values, not the kernel, are under test): torch warns that
# FlexAttention uncompiled materialises the scores, which the trainer never does.
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")
def test_the_flex_attention_block_mask_is_the_sdpa_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """The BlockMask used under torch.compile on CUDA allows exactly what the boolean mask
    does: forward only here (FlexAttention has no backward on CPU), eager."""
    from gpt.model import attention

    torch.manual_seed(0)
    model = GPT(cfg(rotary=True, **ALL)).eval()
    model.attn_mask.set_step(3, 10)
    x = tokens()
    with torch.no_grad():
        want, _ = model(x)
        monkeypatch.setattr(attention, "flex_wanted", lambda idx: True)
        assert isinstance(model.attn_mask(x), attention.BlockMask)
        got, _ = model(x)
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.numerics
@pytest.mark.cuda
def test_flex_attention_trains_as_sdpa_on_cuda(graph_backend) -> None:
    """On CUDA under torch.compile the mask is a BlockMask for FlexAttention: the same loss
    and gradients as the eager SDPA path, and no graph break."""
    torch.manual_seed(0)
    model = GPT(cfg(rotary=True, **ALL)).cuda()
    x = tokens().cuda()
    _, want = model(x, x)
    want.backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    _, got = torch.compile(model, fullgraph=True)(x, x)
    got.backward()
    assert torch.allclose(got, want, atol=1e-4) and graph_breaks() == 0
    for p, g in zip(model.parameters(), ref):
        assert torch.allclose(p.grad, g, atol=1e-4)


def test_generation_with_the_cache_equals_generation_without() -> None:
    """All four parts, sampled past the block size (the context is cropped and the cache
    rebuilt), with end-of-text tokens in the prompt."""
    from gpt.eval.sampling import sample

    torch.manual_seed(0)
    model = GPT(cfg(rotary=True, **ALL)).eval()
    runs = [sample(model, [1, EOT, 2, 3, EOT, 4], 40, num_samples=2, top_k=5, use_cache=cache,
                   generator=torch.Generator().manual_seed(3)) for cache in (True, False)]
    assert torch.equal(runs[0], runs[1])
