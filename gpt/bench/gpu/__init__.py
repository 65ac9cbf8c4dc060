"""The GPU acceptance run, `python -m gpt.bench gpu`: the command that runs stages of cells
(accept.py), one cell run (cell_run.py), the stages by name (catalog.py) and their cells
(stages.py), the plan `--plan` prints (plan.py), each cell's estimated seconds
(estimates.py), what the stages need from the user (inputs.py), build-nanogpt as the
baseline (nanogpt.py), the whole logits' loss timed on its own (loss_bench.py), the
trainer with the fused loss in a given mode (fused_mode.py), and the
figures read from each cell's output (results.py)."""
