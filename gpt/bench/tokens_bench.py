"""`tokens`: how many training tokens each recipe needs to reach the same validation loss.

    python -m gpt.bench tokens --data-dir data/pydoc --out benchmarks/tokens_cpu

Trains the GPT-2 recipe (learned positions, LayerNorm, GELU, tied head, AdamW, warm-up
and cosine) and the speedrun-era recipe (rotary, RMSNorm, QK-norm, ReLU^2, an untied
zero-initialised head, soft-capped logits, Muon + AdamW, a trapezoid schedule with
Muon's momentum warm-up) at the same model size, on the same token stream (the same
data folder and seed: the same batches in the same order), each through train_gpt2.py.

1. A learning-rate sweep per recipe at the full budget (--steps): the GPT-2 recipe over
   --baseline-lrs (its --max-lr), the new one over --new-lr-scales (x its --max-lr and
   --muon-lr together). The best GPT-2 run's final validation loss is the target.
2. The new recipe at its best learning rate, with whole schedules over fewer tokens
   (--new-budgets, fractions of the full budget): the fewest tokens whose run ends at or
   below the target (interpolated between the two budgets around it) are its tokens to
   the target. A schedule that ends there is how a recipe is used; reading the crossing
   off a longer run's curve (also reported) catches it before its learning rate decays.

tokens_ratio = the GPT-2 recipe's tokens to its final validation loss / the new recipe's
tokens to that same loss. The JSON keeps every run's validation curve, the command, the
device, torch and the commit; a markdown summary and (with matplotlib) a plot of both
best curves go beside it. Validation uses the same --val-steps batches of the val split
at every evaluation. Use a corpus whose train split exceeds the full budget, so that no
run sees a token twice.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpt.bench.record import write_outputs
from gpt.bench.runs import read_metrics, run_fineweb, run_trainer
from gpt.bench.tables import Column, col, fmt, md_table
from gpt.bench.recipes import GPT2_WARMUP, MOMENTUM_WARMUP, NEW_PARTS, PARTS, to_flags
from gpt.cli import finite_float, takes_flags
from gpt.errors import UserError

# The GPT-2 recipe is the trainer's defaults. The new recipe, on top of them (its parts
# and warm-ups are gpt/bench/recipes.py's):
NEW_RECIPE = [*to_flags({k: v for p in NEW_PARTS for k, v in PARTS[p].items()}),
              "--warmup-steps", "0"]


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
    p.set_defaults(standalone=run)


def trainer_flags(args: argparse.Namespace, steps: int) -> list[str]:
    return ["--model", args.model, "--n-layer", str(args.n_layer), "--n-head", str(args.n_head),
            "--n-embd", str(args.n_embd), "--block-size", str(args.seq_len),
            "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size),
            "--total-batch-tokens", str(args.total_batch_tokens), "--max-steps", str(steps),
            "--val-every", str(args.val_every), "--val-steps", str(args.val_steps),
            "--sample-every", "0", "--no-save-checkpoints", "--log-every", str(args.val_every),
            "--data-dir", args.data_dir, "--device", args.device, "--seed", str(args.seed),
            *shlex.split(args.trainer_flags)]


def recipe_flags(recipe: str, steps: int, lr: float, args: argparse.Namespace) -> list[str]:
    if recipe == "gpt2":
        return ["--max-lr", str(lr), "--warmup-steps", str(max(1, round(GPT2_WARMUP * steps)))]
    return [*NEW_RECIPE, "--max-lr", str(args.new_max_lr * lr),
            "--muon-lr", str(args.new_muon_lr * lr),
            "--muon-momentum-warmup", str(round(MOMENTUM_WARMUP * steps))]


def train(recipe: str, steps: int, lr: float, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One run through train_gpt2.py: its validation curve (tokens, loss)."""
    out = work / f"{recipe}-lr{lr:g}-steps{steps}"
    flags = [*trainer_flags(args, steps), *recipe_flags(recipe, steps, lr, args),
             "--out-dir", str(out)]
    seconds = run_trainer(flags, f"the {recipe} recipe's run at lr {lr:g} ({steps} steps)")
    curve = [[r["step"] * args.total_batch_tokens, r["val_loss"]] for r in read_metrics(out, "val")]
    run = {"recipe": recipe, "lr": lr, "steps": steps, "tokens": steps * args.total_batch_tokens,
           "curve": curve, "final_val_loss": curve[-1][1], "seconds": round(seconds, 1),
           "flags": flags}
    what = f"--max-lr {lr:g}" if recipe == "gpt2" else f"lr scale x{lr:g}"
    print(f"{recipe:5s} {what:17s} {steps:4d} steps: final val {run['final_val_loss']:.4f} "
          f"({seconds:.0f} s)", flush=True)
    return run


def crossing(curve: list[list[float]], target: float) -> float | None:
    """Tokens at which a validation curve first reaches target (linear between points)."""
    for (t0, l0), (t1, l1) in zip(curve, curve[1:]):
        if l1 <= target:
            return t1 if l0 <= target or l0 == l1 else t0 + (t1 - t0) * (l0 - target) / (l0 - l1)
    return curve[0][0] if curve and curve[0][1] <= target else None


def tokens_to_target(runs: list[dict[str, Any]], target: float) -> tuple[float | None, str]:
    """From complete runs at several budgets: the fewest tokens ending at or below target,
    interpolated between the largest budget above it and the smallest one at or below."""
    runs = sorted(runs, key=lambda r: r["tokens"])
    for lo, hi in zip([None, *runs], runs):
        if hi["final_val_loss"] <= target:
            if lo is None:
                return hi["tokens"], f"at most {hi['tokens']:,}: even the smallest budget reached it"
            l0, l1 = lo["final_val_loss"], hi["final_val_loss"]
            t = lo["tokens"] + (hi["tokens"] - lo["tokens"]) * (l0 - target) / (l0 - l1)
            return t, f"between the {lo['tokens']:,}- and {hi['tokens']:,}-token runs"
    return None, "no budget reached the target"


def run(args: argparse.Namespace) -> int:
    from gpt.bench.report import run_info
    from gpt.dist import pick_device
    from gpt.shards import find_shards, shard_num_tokens

    device = pick_device(args.device)  # a device this machine lacks: one line, before any run
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.corpus and not (Path(args.data_dir) / "metadata.json").exists():
        prepare_corpus(Path(args.corpus), Path(args.data_dir))
    train_tokens = sum(shard_num_tokens(p) for p in find_shards(args.data_dir, "train"))
    full = args.steps * args.total_batch_tokens
    if full > train_tokens:
        print(f"warning: --steps {args.steps} x {args.total_batch_tokens} tokens = {full:,} is "
              f"more than the {train_tokens:,} train tokens: runs repeat data", file=sys.stderr)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tokens_bench_") as tmp:
        work = Path(tmp)
        base = [train("gpt2", args.steps, lr, args, work) for lr in args.baseline_lrs]
        new = [train("new", args.steps, s, args, work) for s in args.new_lr_scales]
        best_base = min(base, key=lambda r: r["final_val_loss"])
        best_new = min(new, key=lambda r: r["final_val_loss"])
        target = best_base["final_val_loss"]
        budgets = [max(1, round(f * args.steps)) for f in sorted(args.new_budgets)]
        short = [train("new", b, best_new["lr"], args, work) for b in budgets if b < args.steps]
        runs = [*base, *new, *short]
    at_best = [r for r in runs if r["recipe"] == "new" and r["lr"] == best_new["lr"]]
    new_tokens, how = tokens_to_target(at_best, target)
    base_tokens = best_base["tokens"]
    report = {
        **run_info("tokens", device, args.argv), "data_dir": args.data_dir, "train_tokens": train_tokens,
        "model": {"preset": args.model, "n_layer": args.n_layer, "n_head": args.n_head,
                  "n_embd": args.n_embd, "seq_len": args.seq_len},
        "tokens_per_step": args.total_batch_tokens, "full_budget_tokens": full,
        "new_recipe_flags": NEW_RECIPE,
        "target_val_loss": target, "baseline_best_lr": best_base["lr"],
        "baseline_tokens": base_tokens, "new_best_lr_scale": best_new["lr"],
        "new_final_val_loss_full_budget": best_new["final_val_loss"],
        "new_tokens_to_target": new_tokens, "new_tokens_how": how,
        "new_tokens_to_target_on_full_curve": crossing(best_new["curve"], target),
        "tokens_ratio": base_tokens / new_tokens if new_tokens else None,
        "runs": runs,
    }
    markdown = summary(report)
    write_outputs(out, "tokens", report, markdown)
    plotted = plot(best_base, best_new, target, out / "tokens.png")
    print(markdown)
    print(f"wrote {out}/tokens.json, tokens.md{', tokens.png' if plotted else ''}")
    return 0


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


RUN_COLUMNS = [
    col("recipe", "recipe", align="left"),
    Column("learning rate", lambda run: f"{'' if run['recipe'] == 'gpt2' else 'x'}{run['lr']:g}"),
    col("tokens", "tokens", fmt(",")),
    col("final val loss", "final_val_loss", fmt(".4f")),
    col("seconds", "seconds", fmt(".0f")),
]


def summary(r: dict[str, Any]) -> str:
    ratio = f"{r['tokens_ratio']:.2f}" if r["tokens_ratio"] else "n/a"
    lines = [f"# Tokens to the GPT-2 recipe's final validation loss ({r['target_val_loss']:.4f})",
             "", f"`{r['command']}` at {r['commit']} on {r['device']}, torch {r['torch']}",
             "", md_table(r["runs"], RUN_COLUMNS)]
    lines += ["", f"GPT-2 recipe: {r['baseline_tokens']:,} tokens (best --max-lr "
              f"{r['baseline_best_lr']:g}). New recipe (best scale x{r['new_best_lr_scale']:g}): "
              f"{r['new_tokens_to_target'] or 0:,.0f} tokens ({r['new_tokens_how']}). "
              f"**tokens_ratio {ratio}**.", ""]
    return "\n".join(lines)


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
