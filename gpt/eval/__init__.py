"""Evaluation: validation loss, bits per byte, sampling, HellaSwag, the lm-evaluation-harness model and its tasks."""
