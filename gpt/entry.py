"""The trainer's command, `python train_gpt2.py` and `gpt2-train`: the flags are parsed
before torch is imported, so --help and a bad flag answer at once instead of after seconds."""

from __future__ import annotations

from gpt.cli import parse_args


def train_main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    from gpt.train import main_with  # torch and the whole trainer: only now

    return main_with(cfg)
