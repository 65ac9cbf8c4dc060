"""Benchmarks of the training step and its parts on one machine: the timing subcommands
(`model`, `components`, `attention`, `compile`, `ladder`), which time torch code in this
process through one Context (common.py) and may swap in naive attention (naive.py); and the
standalone ones on what the step costs besides: `comm` (its communication, under
torchrun), `cpu-malloc` (the CPU step with and without --cpu-malloc-reuse, as whole
trainer runs) and `memory` (its peak memory, predicted by the planner)."""
