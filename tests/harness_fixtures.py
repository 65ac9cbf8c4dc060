"""Tiny local lm-evaluation-harness tasks, one of each request type, written by the tests
into a folder (YAML + JSONL) for TaskManager(include_path=...) / --include-path: no
network, no Hugging Face Hub."""

from __future__ import annotations

import json
from pathlib import Path

# Multiple choice (loglikelihood): context + candidate endings, the right one's index.
MC = [
    {"ctx": "A man is sitting on a roof. He", "endings": [
        "is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
        "is holding a cube.", "starts pulling up roofing on a roof."], "label": 3},
    {"ctx": "Kids", "endings": ["play.", "sleep soundly in a very long bed tonight.", "eat.",
                                "run around."], "label": 0},
    {"ctx": "The cat", "endings": ["sat.", "sat on the mat.", "flew to the moon and back.",
                                   "purred."], "label": 1},
    {"ctx": "She opens the fridge and", "endings": ["takes out some milk.", "sings.",
                                                    "drives away.", "a b c"], "label": 0},
    {"ctx": "Rain falls. People", "endings": ["open umbrellas.", "swim upward.", "eat stones.",
                                              "laugh at the sky."], "label": 0},
]

# One word to predict after a passage (loglikelihood, as lambada_openai).
WORD = [
    {"text": "The quick brown fox jumps over the lazy dog"},
    {"text": "To be, or not to be, that is the question"},
    {"text": "She sells sea shells by the sea shore"},
    {"text": "All that glitters is not gold"},
    {"text": " ".join(["Once upon a time there was a king who had three sons."] * 8) + " The end"},
]

# Whole texts (loglikelihood_rolling, as wikitext); one longer than a 64-token block.
TEXTS = [
    {"page": "Hello world. This is a short text."},
    {"page": " ".join(["The river runs to the sea, and the sea is never full."] * 12)},
    {"page": "Numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10."},
]

# Prompts to complete (generate_until).
PROMPTS = [
    {"q": "Question: What is two plus two?\nAnswer:", "a": "4"},
    {"q": "Question: Name a colour.\nAnswer:", "a": "red"},
    {"q": "Question: What is the capital of France?\nAnswer:", "a": "Paris"},
    {"q": "A long story: " + "the wind blew and the leaves fell. " * 10 + "\nAnswer:", "a": "no"},
]


def _write(folder: Path, name: str, rows: list[dict], yaml: str) -> None:
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    header = (f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
              f"    test: {data}\ntest_split: test\n")
    (folder / f"{name}.yaml").write_text(header + yaml)


def write_tasks(folder: Path) -> Path:
    """tiny_mc, tiny_word, tiny_rolling and tiny_gen in `folder`; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder, "tiny_mc", MC, (
        "output_type: multiple_choice\ndoc_to_text: \"{{ctx}}\"\n"
        "doc_to_choice: \"{{endings}}\"\ndoc_to_target: \"{{label}}\"\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"))
    _write(folder, "tiny_word", WORD, (
        "output_type: loglikelihood\n"
        "doc_to_text: \"{{text.split(' ')[:-1]|join(' ')}}\"\n"
        "doc_to_target: \"{{' ' + text.split(' ')[-1]}}\"\n"
        "metric_list:\n  - metric: perplexity\n  - metric: acc\n"))
    _write(folder, "tiny_rolling", TEXTS, (
        "output_type: loglikelihood_rolling\ndoc_to_text: \"\"\n"
        "doc_to_target: \"{{page}}\"\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n"
        "  - metric: bits_per_byte\n"))
    _write(folder, "tiny_gen", PROMPTS, (
        "output_type: generate_until\ndoc_to_text: \"{{q}}\"\ndoc_to_target: \"{{a}}\"\n"
        "generation_kwargs:\n  until: [\"\\n\", \".\"]\n  max_gen_toks: 6\n"
        "  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n"))
    return folder


# HellaSwag items as the official jsonl has them (activity label, ctx_a, ctx_b, endings,
# label), 2 of them WikiHow ones with the [header]/[title]/[step] tags the harness strips.
HELLASWAG = [
    ("Roof shingle removal", "A man is sitting on a roof.", "he",
     ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
      "is holding a rubik's cube.", "starts pulling up roofing on a roof."], 3),
    ("Clean and jerk", "A lady walks to a barbell. She bends down and grabs the pole.", "the lady",
     ["swings and lands in her arms.", "pulls the barbell forward.",
      "pulls a rope attached to the barbell.", "stands and lifts the weight over her head."], 3),
    ("Making a cake", "A woman mixes flour and eggs in a bowl.", "she",
     ["pours the batter into a pan.", "throws the bowl at the wall.", "paints the bowl blue.",
      "sings to the eggs."], 0),
    ("Home and Garden", "[header] How to water a plant [title] Check the soil.", "",
     ["[step] Push a finger into the soil to feel if it is dry.", "[step] Eat the soil.",
      "[step] Throw the plant away.", "[step] Paint the pot red."], 0),
    ("Playing guitar", "A man holds a guitar on stage.", "he",
     ["starts strumming the strings.", "eats the guitar.", "swims across the stage.",
      "folds the guitar in half."], 0),
    ("Personal Care", "[header] How to brush your teeth [title] Wet the brush.", "",
     ["[step] Put a small amount of toothpaste on it.", "[step] Put it in the oven.",
      "[step] Plant it in the garden.", "[step] Mail it to a friend."], 0),
]


def write_hellaswag_both_ways(folder: Path, harness_yaml: Path) -> tuple[Path, Path]:
    """HELLASWAG as gpt/eval/hellaswag.py reads it (ctx = ctx_a + ' ' + ctx_b, as the official
    jsonl's ctx is) and as the harness's own `hellaswag` task, included from its YAML, on
    a local JSONL (task hellaswag_local). Returns (our jsonl, the folder for include_path)."""
    folder.mkdir(parents=True, exist_ok=True)
    ours, theirs = folder / "ours.jsonl", folder / "theirs.jsonl"
    ours.write_text("".join(json.dumps({"ind": i, "ctx": a + (" " + b if b else ""),
                                        "endings": e, "label": lab, "split": "val"}) + "\n"
                            for i, (_, a, b, e, lab) in enumerate(HELLASWAG)))
    theirs.write_text("".join(json.dumps({"activity_label": act, "ctx_a": a, "ctx_b": b,
                                          "endings": e, "label": str(lab)}) + "\n"
                              for act, a, b, e, lab in HELLASWAG))
    tasks = folder / "tasks"
    tasks.mkdir(exist_ok=True)
    (tasks / "hellaswag_local.yaml").write_text(
        f"include: {harness_yaml}\ntask: hellaswag_local\ntag: []\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    validation: {theirs}\ntraining_split: null\n")
    return ours, tasks


# Tasks a tiny model (block size 64) cannot score, one of each kind (odd_*), and tasks
# that cannot load (broken_*). The first document of each odd_* task is the odd one.
_LL = ("output_type: loglikelihood\ndoc_to_text: \"{{ctx}}\"\ndoc_to_target: \"{{cont}}\"\n"
       "metric_list:\n  - metric: acc\n")
_GEN = ("output_type: generate_until\ndoc_to_text: \"{{q}}\"\ndoc_to_target: \"{{a}}\"\n"
        "generation_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: {max}\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n")
_ROLL = ("output_type: loglikelihood_rolling\ndoc_to_text: \"\"\ndoc_to_target: \"{{page}}\"\n"
         "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n")
_MC = ("output_type: multiple_choice\ndoc_to_text: \"{{ctx}}\"\n"
       "doc_to_choice: \"{{endings}}\"\ndoc_to_target: \"{{label}}\"\n")
ODD = {
    "odd_long_continuation": ([{"ctx": "Hello", "cont": " word" * 100},
                               {"ctx": "Hi", "cont": " there"}], _LL),
    "odd_empty_continuation": ([{"ctx": "Hello", "cont": ""}, {"ctx": "Hi", "cont": " there"}], _LL),
    "odd_max_gen_toks": ([{"q": "Question: 2+2?\nAnswer:", "a": "4"}],
                         _GEN.replace("{max}", "100")),
    "odd_empty_context": ([{"q": "", "a": "4"}, {"q": "Question:", "a": "4"}],
                          _GEN.replace("{max}", "5")),
    "odd_empty_document": ([{"page": ""}, {"page": "Some text to score."}], _ROLL),
    # the third document has no choices: the harness fails on it only as it scores it
    "odd_later_document": ([MC[0], MC[1], {"ctx": "Nothing", "endings": [], "label": 0}], _MC),
}
# A continuation of exactly 64 tokens (the block size) and one of 63: both fit a window.
FITS = [{"ctx": "Hello", "cont": " word" * 64}, {"ctx": "Hi", "cont": " word" * 63}]


def write_odd_tasks(folder: Path) -> Path:
    """ODD's tasks, fits_block (FITS), and broken_* tasks that cannot load: an empty data
    file, a missing one, a template that does not parse, a field the data lacks."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, (rows, yaml) in ODD.items():
        _write(folder, name, rows, yaml)
    _write(folder, "fits_block", FITS, _LL)
    _write(folder, "broken_empty", [], _MC)
    _write(folder, "broken_missing", MC, _MC)
    (folder / "broken_missing.jsonl").unlink()
    _write(folder, "broken_template", MC, _MC.replace("{{ctx}}", "{{ctx"))
    _write(folder, "broken_field", MC, _MC.replace("{{ctx}}", "{{question}}"))
    return folder


# the four tasks write_tasks writes, one of each request type
TASKS = ["tiny_mc", "tiny_word", "tiny_rolling", "tiny_gen"]


def responses(lm, folder: Path) -> dict[str, list]:
    """Every task's per-document model responses (log-likelihoods, is-greedy flags and
    generated texts), in document order."""
    from lm_eval.evaluator import evaluate

    from gpt.eval import harness_tasks

    tasks, failed = harness_tasks.load_tasks(TASKS, str(folder))
    assert not failed
    out = evaluate(lm=lm, task_dict=tasks, bootstrap_iters=0, log_samples=True)
    return {name: [s["resps"] for s in sorted(samples, key=lambda s: s["doc_id"])]
            for name, samples in out["samples"].items()}


def flatten(resps: list) -> list:
    items = []
    for r in resps:
        if isinstance(r, (list, tuple)):
            items.extend(flatten(list(r)))
        else:
            items.append(r)
    return items
