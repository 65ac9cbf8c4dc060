"""The README's first run, measured as a user runs it: its three commands in a fresh folder,
each timed, then the figures the README quotes (the time, the validation loss, the last
samples, the share of their words that are words of the corpus, the log's peak memory).

    PYTHONPATH=. python benchmarks/first_run/measure.py OUT.json [--config configs/cpu-speedrun.toml]
        [--max-new-tokens 32]

Run it on an idle machine: the time is the machine's as much as the recipe's (the JSON
records the load average before and after, the CPU and torch's version, and the commit).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gpt.eval.words import Corpus, count_words  # noqa: E402 (the checkout's package)


def run(argv: list[str], cwd: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)} failed:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t0, proc.stdout


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--config", default="configs/cpu-speedrun.toml")
    p.add_argument("--max-new-tokens", default="32")  # the README's third command
    args = p.parse_args()
    import torch  # only its version, for the record

    from gpt.runtime.device import cpu_name

    cfg_path = REPO / args.config
    out_dir = re.search(r'out_dir = "([^"]+)"', cfg_path.read_text()).group(1)
    corpus = Corpus.of((REPO / "gpt" / "assets" / "tinyshakespeare.txt").read_text())
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        cwd = Path(folder)
        prepare_s, _ = run([str(REPO / "fineweb.py"), "--source", "demo", "--out",
                            "data/shakespeare", "--val-tokens", "30000"], cwd)
        train_s, log = run([str(REPO / "train_gpt2.py"), "--config", str(cfg_path)], cwd)
        ckpt = sorted((cwd / out_dir).glob("ckpt_*.pt"))[-1]
        generate_s, generated = run(["-m", "gpt.generate", "--checkpoint", str(ckpt.relative_to(cwd)),
                                     "--prompt", "ROMEO:", "--max-new-tokens", args.max_new_tokens], cwd)
        records = [json.loads(line) for line in (cwd / out_dir / "metrics.jsonl").open()]
    last_step = max(r["step"] for r in records if r["type"] == "sample")
    samples = next(r["samples"] for r in records if r["type"] == "sample" and r["step"] == last_step)
    vals = [r for r in records if r["type"] == "val"]
    mem = max(r["peak_mem_gb"] for r in records if r["type"] == "train")
    trained = count_words(samples, corpus)
    generated = "\n".join(line for line in generated.splitlines()
                          if not line.startswith("--- sample"))  # the command's own headers
    printed = count_words([generated], corpus)
    result = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                 capture_output=True, text=True).stdout.strip(),
        "cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
        "python": platform.python_version(), "config": args.config,
        "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
        "seconds": {"prepare": round(prepare_s, 1), "train": round(train_s, 1),
                    "generate": round(generate_s, 1)},
        "val_loss": {str(r["step"]): round(r["val_loss"], 4) for r in vals},
        "peak_mem_gib": round(mem, 2),
        "log_lines": [line for line in log.splitlines() if line.startswith("step ") and "| loss " in line],
        "samples_at_step": last_step, "samples": samples,
        "samples_words": {"real": trained.real, "total": trained.total,
                          "real_pairs": trained.real_pairs, "pairs": trained.pairs,
                          "not_in_corpus": list(trained.unknown)},
        "generated": generated,
        "generated_words": {"real": printed.real, "total": printed.total,
                            "real_pairs": printed.real_pairs, "pairs": printed.pairs,
                            "not_in_corpus": list(printed.unknown)},
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("seconds", "val_loss", "samples_words",
                                             "generated_words", "peak_mem_gib")}, indent=1))


if __name__ == "__main__":
    main()
