"""Bits per byte (gpt/eval/bpb.py) beside the validation loss (gpt/eval/validation.py), and in
`python -m gpt.evaluate --data-dir`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpt.core.config import model_preset
from gpt.data.loader import ShardLoader
from gpt.data.tokenizer import GPT2_EOT, gpt2_tokenizer
from gpt.eval import bpb
from gpt.eval.validation import val_loss
from gpt.evaluate import main
from gpt.model.transformer import GPT

from helpers import write_checkpoint


def test_token_bytes_are_utf8_lengths() -> None:
    enc = gpt2_tokenizer()
    table = bpb.token_bytes(50304)
    for text in ("Hello", " world", "é", " 日本"):
        ids = enc.encode_ordinary(text)
        assert sum(table[i].item() for i in ids) == len(text.encode("utf-8"))
    assert table[GPT2_EOT].item() == 0 and table[50257:].sum().item() == 0


def test_bits_per_byte_is_the_summed_loss_over_the_bytes(random_data_dir: Path) -> None:
    """val_loss's (mean loss, bytes per token) give the summed loss of every target token
    over ln 2 x their UTF-8 bytes, computed here token by token from the logits."""
    torch.manual_seed(0)
    model = GPT(model_preset("tiny", block_size=32)).eval()
    loader = ShardLoader(random_data_dir, "val", 2, 32)
    loss, per_token = val_loss(model, loader, 3, "cpu", torch.float32,
                               bpb.token_bytes(model.config.vocab_size)).tolist()
    enc, nats, nbytes = gpt2_tokenizer(), 0.0, 0
    loader.reset()
    with torch.no_grad():
        for _ in range(3):
            x, y = loader.next_batch()
            logits, _ = model(x)
            nats += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
            nbytes += sum(len(enc.decode_single_token_bytes(t)) for t in y.flatten().tolist()
                          if t != GPT2_EOT)
    assert bpb.bits_per_byte(loss, per_token) == pytest.approx(nats / (math.log(2) * nbytes),
                                                               rel=1e-5)


def test_evaluate_prints_bits_per_byte(tmp_path: Path, random_data_dir: Path,
                                       capsys: pytest.CaptureFixture) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt.pt", block_size=32)
    args = ["--checkpoint", str(ckpt), "--data-dir", str(random_data_dir), "--val-steps", "2",
            "--batch-size", "2", "--device", "cpu"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert math.isfinite(out["val_bpb"]) and out["val_bpb"] > 0
    assert main(args) == 0
    assert f"{out['val_bpb']:.4f} bits/byte" in capsys.readouterr().out
