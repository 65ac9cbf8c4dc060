"""The pieces of `tokens` that gpt/bench/tokens/search.py (the measurement itself) builds
on: its flags (the model, the budget, the learning-rate sweeps, --corpus), the trainer's
flags of one run, where a validation curve reaches a target and the tokens to a target
from whole runs at several budgets, the corpus prepared into shards, and the plot of the
best curves.

    python -m gpt.bench tokens --data-dir data/pydoc --out benchmarks/tokens

Both recipes train at the same model size on the same token stream (the same data folder
and seed: the same batches in the same order), each through train_gpt2.py; the recipes'
parts are gpt/bench/tokens/recipes.py's. Use a corpus whose train split exceeds the full budget,
so that no run sees a token twice.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import tempfile
from pathlib import Path
from typing import Any

from gpt.bench.runs import run_fineweb
from gpt.core.cli import finite_float, takes_flags
from gpt.core.errors import UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tokens", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", required=True, help="token shards (train_*/val_*), fineweb.py's")
    p.add_argument("--corpus", help="a folder of .txt files to prepare into --data-dir first "
                   "(documents shuffled with seed 0, 250,000 val tokens), unless it holds shards")
    p.add_argument("--out", default="runs/bench/tokens", help="folder for tokens.json, .md, .png")
    p.add_argument("--model", default="tiny", help="model preset (default tiny)")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--total-batch-tokens", type=int, default=8192)
    p.add_argument("--steps", type=int, default=120, help="the full budget, in steps")
    p.add_argument("--val-every", type=int, default=10)
    p.add_argument("--val-steps", type=int, default=16)
    lr = finite_float(0, 1, above=True)  # a learning rate: (0, 1], as the trainer's --max-lr
    p.add_argument("--baseline-lrs", type=lr, nargs="+", default=[1.5e-3, 3e-3, 6e-3])
    p.add_argument("--new-max-lr", type=lr, default=6e-3,
                   help="the new recipe's AdamW learning rate at scale 1")
    p.add_argument("--new-muon-lr", type=lr, default=0.02,
                   help="the new recipe's Muon learning rate at scale 1")
    p.add_argument("--new-lr-scales", type=finite_float(0, 100, above=True), nargs="+",
                   default=[0.5, 1.0, 2.0])
    p.add_argument("--new-budgets", type=finite_float(0, 1, above=True), nargs="+",
                   default=[0.25, 0.375, 0.5, 0.75])
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=1337)
    takes_flags(p.add_argument(
        "--trainer-flags", default="",
        help="more train_gpt2.py flags for every run, in one string (e.g. '--no-compile')"))


def trainer_flags(args: argparse.Namespace, steps: int) -> list[str]:
    return ["--model", args.model, "--n-layer", str(args.n_layer), "--n-head", str(args.n_head),
            "--n-embd", str(args.n_embd), "--block-size", str(args.seq_len),
            "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size),
            "--total-batch-tokens", str(args.total_batch_tokens), "--max-steps", str(steps),
            "--val-every", str(args.val_every), "--val-steps", str(args.val_steps),
            "--sample-every", "0", "--no-save-checkpoints", "--log-every", str(args.val_every),
            "--data-dir", args.data_dir, "--device", args.device, "--seed", str(args.seed),
            *shlex.split(args.trainer_flags)]


def crossing(curve: list[list[float]], target: float) -> float | None:
    """Tokens at which a validation curve first reaches target (linear between points)."""
    for (t0, l0), (t1, l1) in zip(curve, curve[1:]):
        if l1 <= target:
            return t1 if l0 <= target or l0 == l1 else t0 + (t1 - t0) * (l0 - target) / (l0 - l1)
    return curve[0][0] if curve and curve[0][1] <= target else None


def tokens_to_target(runs: list[dict[str, Any]], target: float) -> tuple[float | None, str]:
    """From complete runs at several budgets: the fewest tokens ending at or below target,
    interpolated between the largest budget above it and the smallest one at or below."""
    pair = either_side(sorted(runs, key=lambda r: r["tokens"]), target)
    if pair is None:
        return None, "no budget reached the target"
    lo, hi = pair
    if lo is None:
        return hi["tokens"], f"at most {hi['tokens']:,}: even the smallest budget reached it"
    l0, l1 = lo["final_val_loss"], hi["final_val_loss"]
    t = lo["tokens"] + (hi["tokens"] - lo["tokens"]) * (l0 - target) / (l0 - l1)
    return t, f"between the {lo['tokens']:,}- and {hi['tokens']:,}-token runs"


def either_side(runs: list[dict[str, Any]], target: float) -> tuple[dict[str, Any] | None,
                                                                   dict[str, Any]] | None:
    """Of runs sorted by budget, the first ending at or below target and the one before it
    (None where it is the first); None where none reaches the target."""
    for lo, hi in zip([None, *runs], runs):
        if hi["final_val_loss"] <= target:
            return lo, hi
    return None


def spread(values: list[float | None]) -> dict[str, Any]:
    """Per-seed values (None: that seed never reached the target) as mean and std of those
    that did, and how many did."""
    got = [v for v in values if v is not None]
    return {"values": values, "mean": statistics.mean(got) if got else None,
            "std": statistics.stdev(got) if len(got) > 1 else 0.0 if got else None,
            "reached": f"{len(got)}/{len(values)}"}


def parameters(args: argparse.Namespace, parts: tuple[str, ...] | list[str]) -> int:
    """The parameter count of the bench's model with `parts` (tied weights once), by the
    gpt/model/sizing.py's formula: no model is built."""
    from gpt.bench.tokens import recipes
    from gpt.core.config import model_preset
    from gpt.core.config_io import section_names
    from gpt.model.sizing import param_count

    model = section_names("model")
    fields = {k: v for k, v in recipes.fields(parts, args.steps).items() if k in model}
    return param_count(model_preset(args.model, n_layer=args.n_layer, n_head=args.n_head,
                                    n_embd=args.n_embd, block_size=args.seq_len, **fields))


def part_effect(with_part: list[float | None], without: list[float | None],
                measure: str) -> dict[str, Any]:
    """Seed by seed (the same seed: the same init and data order), whether a part helps:
    `with_part` and `without` are per-seed values where lower is better (tokens to the
    target, None where that seed never reached it; or final validation losses). It helps
    (hurts) where it is lower (higher) on every seed; anything else is 'unclear'. A part
    that changes nothing still comes out 'helps' one time in 2^seeds (eight with three),
    and 'hurts' as often."""
    worst = float("inf")
    pairs = [(worst if a is None else a, worst if b is None else b)
             for a, b in zip(with_part, without, strict=True)]
    helps, hurts = sum(a < b for a, b in pairs), sum(a > b for a, b in pairs)
    verdict = ("helps" if helps == len(pairs) else "hurts" if hurts == len(pairs)
               else "unclear")
    return {"verdict": verdict, "helps": helps, "hurts": hurts, "seeds": len(pairs),
            "measure": measure}


def prepare_corpus(corpus: Path, data_dir: Path) -> None:
    """Every .txt file under corpus is a document; shuffled (seed 0), so that the val split
    (the first 250,000 tokens) is not one topic, then sharded by fineweb.py."""
    files = sorted(corpus.rglob("*.txt"))
    docs = [d for d in (f.read_text(encoding="utf-8", errors="replace") for f in files)
            if d.strip()]
    if not docs:
        raise UserError(f"--corpus {corpus}: no .txt file there holds any text "
                        f"({len(files)} file(s) found); add text files, or pass shards as "
                        f"--data-dir alone")
    random.Random(0).shuffle(docs)
    with tempfile.TemporaryDirectory(prefix="tokens_corpus_") as tmp:
        jsonl = Path(tmp) / "corpus.jsonl"
        jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
        run_fineweb(["--source", str(jsonl), "--out", str(data_dir), "--val-tokens", "250000",
                     "--shard-tokens", "500000", "--quiet"], f"preparing --corpus {corpus}")


def plot(base: dict[str, Any], new: dict[str, Any], target: float, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run, label in ((base, f"GPT-2 recipe, lr {base['lr']:g}"),
                       (new, f"new recipe, lr x{new['lr']:g}")):
        ax.plot([t for t, _ in run["curve"]], [v for _, v in run["curve"]], label=label)
    ax.axhline(target, color="gray", linestyle=":", label=f"target {target:.3f}")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
