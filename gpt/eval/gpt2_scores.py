"""OpenAI GPT-2's published lm-evaluation-harness scores, and the one summary number over
the tasks a run scored: what `python -m gpt.evaluate --tasks` and the trainer's
--eval-tasks print beside a model's own scores.

Only numbers with a named source are here. Source of every entry:
  Andrej Karpathy, llm.c, dev/data/hellaswag.py (module docstring; the same lines are in
  build-nanogpt's hellaswag.py): "gpt2 (124M) - eleuther harness reports acc 28.92%,
  acc_norm 31.14%" and "gpt2-xl (1558M) - eleuther harness reports acc 40.04%, acc_norm
  50.89%" (zero-shot HellaSwag validation, 10,042 examples).
Left out for want of a source that states the harness's numbers: GPT-2 355M and 774M,
and every other task. (The GPT-2 paper's LAMBADA accuracies were measured with a
stop-word filter the harness's lambada_openai does not apply, so they are not this
task's numbers.)
"""

from __future__ import annotations


SOURCE = "llm.c dev/data/hellaswag.py (EleutherAI harness, zero-shot)"

# task -> metric -> GPT-2 size -> score
PUBLISHED: dict[str, dict[str, dict[str, float]]] = {
    "hellaswag": {
        "acc": {"124M": 0.2892, "1.5B": 0.4004},
        "acc_norm": {"124M": 0.3114, "1.5B": 0.5089},
    },
}

# The summary score, as DCLM's CORE is defined: each task's accuracy centred on its
# random-guess baseline, (acc - random) / (1 - random), so 0 is chance and 1 perfect,
# then the mean over the tasks run. Task -> (the metric used, its random baseline):
# 1 / number of choices for multiple choice, 0 where the answer is produced.
CENTRED: dict[str, tuple[str, float]] = {
    "hellaswag": ("acc_norm", 0.25),
    "arc_easy": ("acc_norm", 0.25),
    "arc_challenge": ("acc_norm", 0.25),
    "openbookqa": ("acc_norm", 0.25),
    "piqa": ("acc_norm", 0.5),
    "winogrande": ("acc", 0.5),
    "copa": ("acc", 0.5),
    "lambada_openai": ("acc", 0.0),
}


def centred_mean(scores: dict[str, dict[str, float]]) -> tuple[float | None, list[str]]:
    """(mean centred accuracy over the tasks of `scores` that CENTRED knows, the tasks left
    out of it); None when none of them counts."""
    centred, left_out = [], []
    for task, metrics in scores.items():
        metric, random = CENTRED.get(task, ("", 0.0))
        if metric in metrics:
            centred.append((metrics[metric] - random) / (1.0 - random))
        else:
            left_out.append(task)
    return (sum(centred) / len(centred) if centred else None), left_out


def comparison_lines(scores: dict[str, dict[str, float]]) -> list[str]:
    """One line per task metric, with GPT-2's published score where there is one:
    'hellaswag acc_norm 0.2890 | GPT-2 124M 0.3114 | GPT-2 1.5B 0.5089'; then the
    centred mean."""
    lines = []
    for task, metrics in scores.items():
        for metric, value in metrics.items():
            if metric == "sample_len":  # a count, not a score
                continue
            line = f"{task} {metric} {value:.4f}"
            for size, ref in PUBLISHED.get(task, {}).get(metric, {}).items():
                line += f" | GPT-2 {size} {ref:.4f}"
            lines.append(line)
    core, left_out = centred_mean(scores)
    not_counted = f"not counted (no random baseline known): {', '.join(left_out)}"
    if core is not None:
        lines.append(f"centred mean accuracy (as DCLM's CORE) {core:.4f} over "
                     f"{len(scores) - len(left_out)} task(s)"
                     + (f"; {not_counted}" if left_out else ""))
    elif left_out:  # the verdict still says why there is no summary number
        lines.append(f"centred mean accuracy (as DCLM's CORE): none; {not_counted}")
    if any(task in PUBLISHED for task in scores):
        lines.append(f"GPT-2 scores: {SOURCE}")
    return lines
