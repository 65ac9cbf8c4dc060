"""karpathy/build-nanogpt's train_gpt2.py as a baseline, run side by side with the trainer.

Its code is never part of this repository: the user downloads train_gpt2.py from
https://github.com/karpathy/build-nanogpt and names it with `--nanogpt PATH`; a stage with
its cells fails at once, running nothing, when it is missing or has changed (check). At
run time the script is copied into a scratch folder and a short list of text
substitutions (SUBSTITUTIONS, each required to match exactly once) points it at the same
tokens the trainer reads, sets its micro-batch and step count, turns torch.compile on and
its evaluation, HellaSwag and sampling off. It loads GPT-2's BPE files through tiktoken at
start; where tiktoken's cache lacks them, the copies this package ships are put in a
scratch cache for it (tiktoken_env), so a machine without internet runs it too. Its
per-step log line is parsed into step times, tokens/s and losses.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import numpy as np

# tiktoken's cache rules and file names, as the trainer's tokenizer reads them
from gpt.data.tokenizer import _BPE_FILES, _URL, ASSETS, _in_tiktoken_cache

# (what to find, what to put instead, why). Each must occur exactly once in the script.
SUBSTITUTIONS: list[tuple[str, str, str]] = [
    ("from hellaswag import render_example, iterate_examples",
     "render_example = iterate_examples = None  # HellaSwag is off in this comparison",
     "its HellaSwag module downloads data; not needed when HellaSwag is off"),
    ("B = 64 # micro batch size", "B = {batch_size} # micro batch size", "the cell's micro-batch"),
    ("total_batch_size = 524288 # 2**19, ~0.5M, in number of tokens",
     "total_batch_size = {total_batch_tokens}", "the same tokens per step as the trainer's cell"),
    ("max_steps = 19073 #", "max_steps = {max_steps} #", "a short run"),
    ("warmup_steps = 715", "warmup_steps = {warmup_steps}",
     "the trainer cell's warm-up: the same learning rate at every step, so the losses compare"),
    ("use_compile = False", "use_compile = True", "compile on, as the comparison asks"),
    ("if step % 250 == 0 or last_step:", "if False:", "no validation (nor its checkpoint)"),
]
STEP_LINE = re.compile(r"step\s+(\d+) \| loss: ([\d.naif]+) \| lr [\d.e+-]+ \| norm: [\d.naif]+ \| "
                       r"dt: ([\d.]+)ms \| tok/sec: ([\d.]+)")
DATA_FOLDER = "edu_fineweb10B"  # the folder its DataLoaderLite reads, relative to its cwd


class MissingBaseline(Exception):
    """build-nanogpt cannot run here: its script is not where --nanogpt says."""


def patch(source: str, **values: object) -> str:
    """The script with every substitution applied; a line that no longer matches (its
    author changed the script) stops the cell rather than running something else."""
    for old, new, _ in SUBSTITUTIONS:
        count = source.count(old)
        if count != 1:
            raise ValueError(f"build-nanogpt: expected the line {old!r} once, found it {count} "
                             f"times; its script changed, update gpt/bench/gpu/nanogpt.py")
        source = source.replace(old, new.format(**values))
    return source


def check(path: Path) -> None:
    """Raises MissingBaseline (or ValueError for a changed script) unless the baseline can
    run here: its script is there and every substitution applies."""
    patch(script(path).read_text(encoding="utf-8"), batch_size=1, total_batch_tokens=1,
          max_steps=1, warmup_steps=1)


def script(path: Path) -> Path:
    """build-nanogpt's train_gpt2.py: `path` itself, or the file of that name in the folder
    `path`."""
    found = path / "train_gpt2.py" if path.is_dir() else path
    if not found.is_file():
        raise MissingBaseline(f"{found} not found: download train_gpt2.py from "
                              f"https://github.com/karpathy/build-nanogpt and pass its path")
    return found


def tiktoken_env(scratch: Path) -> dict[str, str]:
    """The environment build-nanogpt's tiktoken call needs to find GPT-2's BPE files
    without downloading: none where tiktoken's cache has them, else a cache in `scratch`
    holding the copies this package ships (named as tiktoken names them: the sha1 of the
    file's URL)."""
    if _in_tiktoken_cache():
        return {}
    scratch.mkdir(parents=True, exist_ok=True)
    for name in _BPE_FILES:
        target = scratch / hashlib.sha1((_URL + name).encode()).hexdigest()
        if not target.is_file():
            shutil.copyfile(ASSETS / "gpt2" / name, target)
    return {"TIKTOKEN_CACHE_DIR": str(scratch)}


def prepare(path: Path, work: Path, train: np.ndarray, val: np.ndarray, *,
            batch_size: int, total_batch_tokens: int, max_steps: int, warmup_steps: int) -> Path:
    """A scratch folder with the patched script and its .npy shards of the given tokens;
    returns the script to run (with `work` as its working directory)."""
    source = script(path)
    work.mkdir(parents=True, exist_ok=True)
    patched = patch(source.read_text(encoding="utf-8"), batch_size=batch_size,
                    total_batch_tokens=total_batch_tokens, max_steps=max_steps,
                    warmup_steps=warmup_steps)
    (work / "train_gpt2.py").write_text(patched, encoding="utf-8")
    data = work / DATA_FOLDER
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir()
    # Its loader keeps the files whose name contains the split, in name order.
    np.save(data / "edufineweb_train_000000.npy", train.astype(np.uint16))
    np.save(data / "edufineweb_val_000000.npy", val.astype(np.uint16))
    return work / "train_gpt2.py"


def parse_steps(stdout: str) -> list[dict[str, float]]:
    """Its per-step lines as records: step, loss, ms, tokens_per_s."""
    return [{"step": int(m[1]), "loss": float(m[2]), "ms": float(m[3]), "tokens_per_s": float(m[4])}
            for m in STEP_LINE.finditer(stdout)]
