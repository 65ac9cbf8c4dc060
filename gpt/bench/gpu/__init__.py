"""The GPU acceptance run, `python -m gpt.bench gpu`: the command that runs stages of cells
(accept.py), the stages and their cells (stages.py), the plan `--plan` prints (plan.py), each
cell's estimated seconds (estimates.py), what the stages need from the user (inputs.py),
build-nanogpt as the baseline (nanogpt.py), and the figures read from each cell's output
(results.py)."""
