"""The tokens bench's timing phase alone (gpt/bench/tokens/timing.py), for the recipes it
compares at its CPU scale: the GPT-2 recipe (cosine, --max-lr 3e-3), the new recipe at lr
scale x2 and its tied-head variant, 30 steps each, alternating, REPEATS times, one thread:

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/tokens/step_times.py DATA_DIR REPEATS OUT.json

(the whole bench measures the same at its end, for the recipes it finds best)."""
import argparse, json, sys, tempfile
from pathlib import Path

import torch

from gpt.bench.report import run_info
from gpt.bench.tokens import recipes
from gpt.bench.tokens import timing as tokens_timing

data, repeats, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
args = argparse.Namespace(model="tiny", n_layer=2, n_head=2, n_embd=64, seq_len=256, batch_size=16,
                          total_batch_tokens=4096, val_every=15, val_steps=8, data_dir=data,
                          device="cpu", seed=1337, trainer_flags="", timing_steps=30,
                          timing_repeats=repeats, new_max_lr=recipes.NEW_MAX_LR,
                          new_muon_lr=recipes.NEW_MUON_LR)
todo = {"gpt2": ((), 3e-3), "new": (recipes.NEW_PARTS, 2.0),
        "new, tied head": (tuple(p for p in recipes.NEW_PARTS if p != "untied_head"), 2.0)}
with tempfile.TemporaryDirectory() as tmp:
    times = tokens_timing.time_recipes(args, Path(tmp), todo)
report = {**run_info("tokens step times", torch.device("cpu"), sys.argv), "threads": torch.get_num_threads(),
          "recipes": times, "new_over_gpt2": times["new"]["median_step_s"] / times["gpt2"]["median_step_s"],
          "tied_over_gpt2": times["new, tied head"]["median_step_s"] / times["gpt2"]["median_step_s"]}
out.write_text(json.dumps(report, indent=1) + "\n")
print(json.dumps({k: report[k] for k in ("new_over_gpt2", "tied_over_gpt2")}))
