"""Sampling with a KV cache: it must agree with recomputing the whole context."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpt.core.config import model_preset
from gpt.engine.parallel import apply_activation_checkpointing
from gpt.eval.sampling import sample, until_eot
from gpt.generate import main
from gpt.model.transformer import GPT

from helpers import error_line, write_checkpoint


def tiny_model(block_size: int = 64, vocab_size: int = 256, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(model_preset("tiny", block_size=block_size, vocab_size=vocab_size)).eval()


@pytest.mark.numerics
def test_cached_logits_match_one_full_forward() -> None:
    model = tiny_model(block_size=16)
    idx = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        full, _ = model(idx)
        cache = model.new_kv_cache()
        parts = [model(idx[:, :5], kv_cache=cache)[0],  # prefill
                 model(idx[:, 5:9], kv_cache=cache)[0]]  # several tokens after a prefix
        for t in range(9, 16):  # then one at a time
            parts.append(model(idx[:, t : t + 1], kv_cache=cache)[0])
    assert cache.length == 16
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-5)


def test_cache_cannot_grow_past_block_size() -> None:
    model = tiny_model(block_size=8)
    cache = model.new_kv_cache()
    with torch.no_grad():
        model(torch.zeros(1, 6, dtype=torch.long), kv_cache=cache)
        with pytest.raises(ValueError, match="block_size 8"):
            model(torch.zeros(1, 3, dtype=torch.long), kv_cache=cache)
    with pytest.raises(ValueError, match="exceeds block_size"):
        model.new_kv_cache(9)


@pytest.mark.parametrize("block_size", [64, 16], ids=["within-block", "past-block-size"])
def test_greedy_with_cache_equals_greedy_without(block_size: int) -> None:
    model = tiny_model(block_size=block_size)
    prompt = [3, 14, 15, 92, 65]
    cached = sample(model, prompt, 40, num_samples=2, temperature=0, use_cache=True)
    plain = sample(model, prompt, 40, num_samples=2, temperature=0, use_cache=False)
    assert cached.shape == (2, 45)
    assert torch.equal(cached, plain)
    assert cached[:, :5].tolist() == [prompt, prompt]


def test_seeded_sampling_with_cache_equals_without() -> None:
    model = tiny_model(block_size=24)
    runs = []
    for use_cache in (True, False):
        gen = torch.Generator().manual_seed(7)
        runs.append(sample(model, [1, 2, 3], 30, num_samples=3, temperature=1.0, top_k=20,
                           generator=gen, use_cache=use_cache))
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0][0], runs[0][1])  # the rows really are sampled


def test_sampling_with_activation_checkpointing_equals_plain() -> None:
    """Activation checkpointing replaces each block's forward; the KV-cache arguments must
    still reach the block, so cached sampling gives the same tokens."""
    model = tiny_model(block_size=32)
    expected = sample(model, [1, 2], 20, temperature=0)
    apply_activation_checkpointing(model)
    assert torch.equal(sample(model, [1, 2], 20, temperature=0), expected)


@pytest.mark.parametrize("vocab_size,valid_vocab", [(300, 256), (50304, 50257)],
                         ids=["small", "gpt2-padded"])
def test_padded_vocab_ids_are_never_sampled(vocab_size: int, valid_vocab: int) -> None:
    model = tiny_model(block_size=32, vocab_size=vocab_size)
    with torch.no_grad():  # make the padding rows the most likely tokens by far:
        model.transformer.ln_f.weight.zero_()  # the final hidden state becomes the constant
        model.transformer.ln_f.bias.fill_(5.0)  # vector 5, whose product with the rows set
        model.transformer.wte.weight[valid_vocab:] = 1.0  # to 1 dwarfs every other logit
    gen = torch.Generator().manual_seed(0)
    for temperature in (0.0, 1.0):
        ids = sample(model, [1, 2, 3], 20, num_samples=3, temperature=temperature, top_k=None,
                     valid_vocab=valid_vocab, generator=gen)
        assert ids.shape == (3, 23)
        assert int(ids.max()) < valid_vocab
    unmasked = sample(model, [1, 2, 3], max_new_tokens=5, top_k=None, generator=gen)
    assert int(unmasked[:, 3:].min()) >= valid_vocab  # the test's premise: they would win otherwise


def test_stop_at_eot_fills_the_rest_of_each_row() -> None:
    model = tiny_model(block_size=64)
    free = sample(model, [1, 2, 3], 30, num_samples=4, generator=torch.Generator().manual_seed(1))
    eot = int(free[0, 6])  # a token row 0 generates, standing in for <|endoftext|>
    stopped = sample(model, [1, 2, 3], 30, num_samples=4, eot_id=eot, stop_at_eot=True,
                     generator=torch.Generator().manual_seed(1))
    assert stopped.shape == free.shape
    for row_free, row_stop in zip(free.tolist(), stopped.tolist()):
        kept = until_eot(row_free, 3, eot)
        assert until_eot(row_stop, 3, eot) == kept
        assert row_stop[: len(kept)] == kept  # same tokens up to the first EOT...
        assert all(t == eot for t in row_stop[len(kept) :])  # ...then only EOT
    assert until_eot([eot, 9, 9, eot, 4], prompt_len=1, eot_id=eot) == [eot, 9, 9]


def test_sampling_restores_training_mode_and_rejects_empty_prompt() -> None:
    model = tiny_model().train()
    sample(model, [1], 2)
    assert model.training
    with pytest.raises(ValueError, match="at least one token"):
        sample(model, [], 2)


# ---------------------------------------------------------------------------- CLI


def test_cli_generates_greedily_with_and_without_cache(tmp_path: Path, capsys) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt.pt")
    args = ["--checkpoint", str(ckpt), "--prompt", "Hello, I'm", "--max-new-tokens", "12",
            "--temperature", "0", "--num-samples", "2", "--device", "cpu", "--no-stop-at-eot"]
    assert main(args) == 0
    cached = capsys.readouterr().out
    assert main(args + ["--no-cache"]) == 0
    assert capsys.readouterr().out == cached
    assert cached.count("--- sample") == 2 and "Hello, I'm" in cached


def test_cli_errors_are_one_line(tmp_path: Path, capsys) -> None:
    assert main(["--checkpoint", str(tmp_path / "missing.pt"), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "missing.pt" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exc:
        main(["--checkpoint", "x.pt", "--max-new-tokens", "0"])
    assert exc.value.code == 2
    assert "--max-new-tokens" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--prompt", "hi"])  # neither --checkpoint nor --init-from
    assert exc.value.code == 2


@pytest.mark.parametrize("flag,value,words", [
    ("--num-samples", "100000", "--num-samples must be <= 64, got 100,000"),
    ("--max-new-tokens", "1000000000000", "--max-new-tokens must be <= 1,048,576, got "
                                          "1,000,000,000,000"),
])
def test_the_size_flags_are_bounded_before_torch(flag: str, value: str, words: str,
                                                 capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--checkpoint", "x.pt", "--prompt", "hi", flag, value])
    assert exc.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("value, words", [
    ("nan", "must be a finite number"), ("inf", "must be a finite number"),
    ("-1", "must be >= 0"), ("1e-40", "at least 1e-30"), ("1000", "must be at most 100")])
def test_generate_checks_the_temperature_as_it_is_typed(value: str, words: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:  # before any checkpoint is read
        main(["--checkpoint", "no-such-file.pt", "--temperature", value])
    assert e.value.code == 2 and words in error_line(capsys.readouterr().err)


def test_a_batch_of_samples_larger_than_the_free_memory_is_one_line_before_sampling(
        tmp_path: Path, capsys, monkeypatch) -> None:
    """Within the flags' bounds, a model's KV cache and logits can still exceed the host:
    judged by arithmetic against what is free, before anything is allocated."""
    from gpt.eval import sampling
    from gpt.model import sizing

    ckpt = write_checkpoint(tmp_path / "ckpt.pt")
    need = sampling.sampling_bytes(load_tiny(ckpt), 1, 1000, 64)
    monkeypatch.setattr(sizing, "free_memory", lambda device: (need - 1, "this host"))
    monkeypatch.setattr(sampling, "sample", lambda *a, **k: pytest.fail("sampled"))
    assert main(["--checkpoint", str(ckpt), "--prompt", "hi", "--num-samples", "64",
                 "--max-new-tokens", "1000", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "error: --num-samples 64 x --max-new-tokens 1,000 (a 1-token prompt) needs at least ")
    assert "this host has " in err and "lower --num-samples or --max-new-tokens" in err
    monkeypatch.undo()  # the host's own free memory: room enough, and it samples
    assert main(["--checkpoint", str(ckpt), "--prompt", "hi", "--num-samples", "2",
                 "--max-new-tokens", "3", "--device", "cpu"]) == 0


def test_the_sampling_arithmetic_counts_the_cache_and_the_logits() -> None:
    """The issue's batch (100,000 samples of a 2-block model): 20 GB of the prompt's
    logits alone, which the arithmetic must not miss."""
    from gpt.eval.sampling import sampling_bytes

    model = tiny_model(block_size=64, vocab_size=50304)
    assert sampling_bytes(model, 1, 4, 100_000) > 100_000 * 50304 * 4
    m = model.config  # the cache: keys and values of every layer, position and sample
    assert sampling_bytes(model, 1, 63, 8) - sampling_bytes(model, 1, 63, 8, use_cache=False) \
        == 2 * m.n_layer * 8 * 64 * m.n_embd * 4


def load_tiny(ckpt: Path) -> GPT:
    from gpt.checkpoint.model_load import load_checkpoint_model

    return load_checkpoint_model(ckpt)


@pytest.mark.parametrize("prompt,words", [
    ("hi", "--prompt 'hi': token id 5303 is beyond the model's vocabulary of 64 ids"),
    ("", "--prompt '': an empty prompt starts from <|endoftext|> (id 50256), which is beyond "
         "the model's vocabulary of 64 ids"),
])
def test_a_prompt_beyond_a_small_vocabulary_is_one_line(prompt: str, words: str, capsys) -> None:
    """A model trained with a vocabulary below GPT-2's (the checkpoint from before the
    move: 64 ids) cannot embed most GPT-2 tokens: said, not an IndexError; a prompt of
    its own ids samples."""
    from helpers import REPO

    ckpt = REPO / "tests" / "fixtures" / "run-1137a53" / "ckpt_000002.pt"
    args = ["--checkpoint", str(ckpt), "--device", "cpu", "--max-new-tokens", "4"]
    assert main([*args, "--prompt", prompt]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {words}: give a prompt whose GPT-2 "
                                                   f"tokens are all below 64")
    assert main([*args, "--prompt", "A"]) == 0  # GPT-2's id 32
    assert capsys.readouterr().out.startswith("--- sample 0\nA")
