"""Evaluation: validation loss, bits per byte, sampling, HellaSwag, the lm-evaluation-harness model and its tasks; the evaluations a run makes every so many steps, behind one interface."""
