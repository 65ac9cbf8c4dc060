"""The trainer's command, `python train_gpt2.py` and `gpt2-train`: the flags are parsed
before torch is imported, so --help and a bad flag answer at once instead of after seconds."""

from __future__ import annotations

from gpt.core.cli import parse_command


def train_main(argv: list[str] | None = None) -> int:
    cfg, dry_run = parse_command(argv)
    if dry_run:
        from gpt.plan.dry_run import main as dry_main  # torch, but not the trainer
        return dry_main(cfg)
    from gpt.train.trainer import main_with  # torch and the whole trainer: only now

    return main_with(cfg)
