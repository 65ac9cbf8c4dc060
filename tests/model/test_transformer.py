"""The GPT-2 architecture: parameter counts, causality, init, weight tying, vocab padding."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gpt.core.config import PRESETS, model_preset
from gpt.model.transformer import GPT

from helpers import meta_gpt

# Published parameter counts of OpenAI's GPT-2 models (vocab 50257, context 1024).
GPT2_COUNTS = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
}


@pytest.mark.parametrize("name,count", GPT2_COUNTS.items())
def test_gpt2_parameter_counts(name: str, count: int) -> None:
    assert meta_gpt(name, vocab_size=50257).num_params() == count


def test_tied_head_counted_once_and_shared() -> None:
    model = GPT(model_preset("tiny", block_size=32))
    assert model.lm_head.weight is model.transformer.wte.weight
    n_tensors = sum(p.numel() for p in model.state_dict().values())
    # state_dict lists the tied tensor under both names; parameters() once.
    assert n_tensors - model.num_params() == model.lm_head.weight.numel()


@pytest.mark.parametrize(
    "name,layers,heads,width",
    [("small", 12, 12, 768), ("medium", 24, 16, 1024), ("large", 36, 20, 1280),
     ("xl", 48, 25, 1600), ("2.7B", 32, 32, 2560)],
)
def test_benchmark_presets(name: str, layers: int, heads: int, width: int) -> None:
    model = meta_gpt(name)
    cfg = model.config
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd) == (layers, heads, width)
    assert model.transformer.h[0].mlp.c_fc.out_features == 4 * width  # d_ff
    assert len(model.transformer.h) == layers


def test_gpt2_and_small_presets_exist() -> None:
    assert set(PRESETS) >= {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "tiny", "mini"}


def test_default_vocab_is_padded_multiple_of_128() -> None:
    cfg = model_preset("gpt2")
    assert cfg.vocab_size == 50304 and cfg.vocab_size % 128 == 0


@pytest.mark.numerics
def test_causality_later_tokens_never_change_earlier_logits() -> None:
    torch.manual_seed(0)
    model = GPT(model_preset("tiny", block_size=32)).eval()
    idx = torch.randint(0, 50257, (2, 16))
    changed = idx.clone()
    changed[:, 10:] = torch.randint(0, 50257, (2, 6))
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10], rtol=0, atol=1e-5)
    assert not torch.allclose(a[:, 10:], b[:, 10:])  # and the later positions do see it


def test_init_statistics() -> None:
    torch.manual_seed(0)
    cfg = model_preset("mini", block_size=128)
    model = GPT(cfg)
    resid_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            assert torch.count_nonzero(p) == 0, name
        elif ".ln_" in name or name.startswith("transformer.ln_f"):
            assert torch.all(p == 1), name  # LayerNorm gains
        elif name.endswith("c_proj.weight"):
            assert abs(p.std().item() - resid_std) < 0.1 * resid_std, name
            assert abs(p.mean().item()) < 0.1 * resid_std, name
        else:  # c_attn, c_fc, wte, wpe
            assert abs(p.std().item() - 0.02) < 0.002, name
            assert abs(p.mean().item()) < 0.002, name


def test_initial_loss_is_near_uniform() -> None:
    torch.manual_seed(0)
    model = GPT(model_preset("tiny", block_size=64))
    idx, targets = torch.randint(0, 50257, (2, 4, 64))
    _, loss = model(idx, targets)
    assert abs(loss.item() - math.log(50304)) < 0.1  # ~10.83: no token favoured at init


def test_sequence_longer_than_block_size_is_rejected() -> None:
    model = GPT(model_preset("tiny", block_size=8))
    with pytest.raises(ValueError, match="block_size 8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_dropout_is_off_by_default_and_used_when_set() -> None:
    torch.manual_seed(0)
    idx = torch.randint(0, 50257, (2, 16))
    plain = GPT(model_preset("tiny", block_size=16)).train()
    a, _ = plain(idx)
    b, _ = plain(idx)
    torch.testing.assert_close(a, b)  # dropout 0: training mode is deterministic
    dropped = GPT(model_preset("tiny", block_size=16, dropout=0.5)).train()
    c, _ = dropped(idx)
    d, _ = dropped(idx)
    assert not torch.allclose(c, d)


def test_targets_of_any_layout_and_no_logits_with_a_loss() -> None:
    """Targets sliced from a longer row (not contiguous) give the same loss as a copy;
    with targets the model hands back no logits, so a training step never keeps them."""
    torch.manual_seed(0)
    model = GPT(model_preset("tiny", block_size=64))
    rows = torch.randint(0, 50257, (2, 65))
    x, y = rows[:, :-1], rows[:, 1:]
    assert not y.is_contiguous()
    logits, loss = model(x, y)
    assert logits is None
    assert torch.equal(loss, model(x, y.contiguous())[1])
    full, none = model(x)
    assert none is None and full.shape == (2, 64, 50304)
    assert torch.equal(F.cross_entropy(full.view(-1, full.size(-1)), y.reshape(-1)), loss)


def test_a_meta_build_initialised_later_equals_a_cpu_build() -> None:
    """GPT.init_weights after to_empty gives every weight of GPT(cfg) on the CPU, bit for
    bit, and leaves the CPU generator where the CPU build leaves it."""
    cfg = model_preset("mini", block_size=32)
    torch.manual_seed(1234)
    cpu = GPT(cfg)
    after_cpu = torch.rand(4)
    torch.manual_seed(1234)
    with torch.device("meta"):
        late = GPT(cfg)
    assert all(p.is_meta for p in late.parameters())
    late.to_empty(device="cpu").init_weights()
    assert late.lm_head.weight is late.transformer.wte.weight  # tied again after to_empty
    assert torch.equal(torch.rand(4), after_cpu)
    for name, value in cpu.state_dict().items():
        assert torch.equal(late.state_dict()[name], value), name


# These two run in this order (pytest keeps a file's order): the first leaves TF32 on, as
# the trainer does on CUDA; the second finds it off again (conftest.restore_global_flags).
def test_a_test_may_turn_tf32_on() -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.set_float32_matmul_precision("high")


def test_the_next_test_finds_the_global_flags_restored() -> None:
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.get_float32_matmul_precision() == "highest"
