"""Checkpoints: the file (atomic write, verify, rotate, choose), what it holds, a run's checkpointing over its ranks, models read from checkpoints, GPT-2 weights in and out."""
