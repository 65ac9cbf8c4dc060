"""`tokens` with seeds: the GPT-2 recipe's target, the new recipe's tokens and seconds to it,
the crossing bracketed, the equal-parameter (tied-head) variant, and the ablation.

    python -m gpt.bench tokens --data-dir data/pydoc --out benchmarks/tokens [--ablation]

Every point (a recipe at a budget and learning rate) is trained with --seeds seeds (init
and data order: --seed, --seed + 1, ...), and reported as the mean and standard deviation.

1. The GPT-2 recipe over --baseline-lrs under both schedules (cosine to 10%, and the new
   recipe's trapezoid to 0) at the full budget (--steps). The best mean final validation
   loss is the target. While the best rate is the lowest (highest) of its schedule's and
   better than all of them, half (twice) it is tried too, at most --max-lr-extensions
   times (bracket_rate), so the target is not an edge of the sweep.
2. The new recipe over --new-lr-scales at the full budget, its best scale bracketed the
   same way; at its best scale, whole
   schedules over fewer steps (--new-budgets, fractions of --steps), and smaller ones
   (halving the smallest) until one ends above the target, so the crossing is bracketed
   by the bench itself (at most --max-halvings more), and the budget halfway between the
   last halving and the one before it, so the pair either side is as close as the grid's
   (gpt/bench/tokens/budgets.py).
3. The same budgets for the new recipe with a tied head (the equal-parameter variant).
4. With --ablation: each part alone on top of the GPT-2 recipe (at its best learning
   rate and schedule; Muon at the new recipe's best scale) and the full recipe without
   each part (the further parts of gpt/bench/tokens/recipes.py: with each), tokens to the
   target for each, over the same seeds, on only the budgets that bracket each crossing
   (bisect_budgets), and whether the part helps on every seed (part_effect). Where Muon
   is the part, the variant's rate is its own sweep's best (variant_rate).
5. The timing phase (gpt/bench/tokens/timing.py): the target's GPT-2 recipe, the best new
   recipe and its tied-head variant, --timing-steps steps each, alternately, --timing-repeats
   times, in this invocation; each recipe's median step time, with min and max (none with
   --timing-repeats 0, for a machine that no other job shares).

Tokens to the target: between the largest budget whose mean run ends above it and the
smallest that ends at or below, interpolated (gpt.bench.tokens.budgets.crossing), per
seed too, for the spread of the ratio. tokens_ratio = the GPT-2 recipe's full budget /
the new recipe's tokens to the target. time_ratio = the GPT-2 recipe's full budget in steps
x its median step time / the new recipe's steps to the target x its median step time, both
step times from the timing phase. Why not the runs' own training times: those were measured
at different times, under whatever load this shared machine had then, and with the run cache
in different invocations, commits and machines; a ratio of sums of them measures the load as
much as the recipes. They are kept as time_ratio_from_run_times (the trainer's own step
times, no start-up, no evaluation, interpolated as the tokens are), with each run's wall time
and peak memory; the ablation's variants are not timed side by side, and have only that one.

Every completed run is appended to `<--out>/tokens-runs.jsonl` (gpt/bench/tokens/cache.py
gives its format) and a later bench with the same --out reuses a run whose trainer flags and
data are the same instead of training it again (--no-reuse: train all again, still append):
a bench stopped by Ctrl-C or SIGTERM resumes where it was, and --cached-only reports what the
cache holds so far without training (as tokens-cached.json/.md). --jobs N trains up to N runs at
once, each a process of its own, from the seeds of the points that do not depend on each
other (gpt/bench/tokens/runner.py; the timing phase stays one at a time).
tokens.json counts the runs reused and run now, and names the commits and machines they
came from.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any, Iterator

from gpt.bench.record import write_outputs
from gpt.bench.tokens import bench as tokens_bench
from gpt.bench.tokens import recipes
from gpt.bench.tokens import timing as timing_phase
from gpt.bench.tokens.bench import parameters, part_effect
from gpt.bench.tokens.budgets import bisect_budgets, budgets, crossing
from gpt.bench.tokens.cache import CACHE_NAME, RunCache, data_fingerprint, origins
from gpt.bench.tokens.report import summary
from gpt.bench.tokens.runner import Bench, NotCached
from gpt.core.errors import UserError
from gpt.report.curves import MATPLOTLIB_HINT

TIED = tuple(p for p in recipes.NEW_PARTS if p != "untied_head")
PARTIAL = "tokens-cached"  # --cached-only's report, beside tokens.json and never over it


def add_parser(sub: argparse._SubParsersAction) -> None:
    tokens_bench.add_parser(sub)
    p = sub.choices["tokens"]
    p.description = __doc__
    p.add_argument("--seeds", type=int, default=3, help="runs per point, seeds --seed, --seed + 1, ...")
    p.add_argument("--max-halvings", type=int, default=4,
                   help="at most this many budgets below the smallest of --new-budgets")
    p.add_argument("--ablation", action="store_true",
                   help="also each part alone on GPT-2 and the full recipe without each")
    p.add_argument("--parts", nargs="+", choices=list(recipes.PARTS), metavar="PART",
                   help=f"the ablation's parts (default: all: {', '.join(recipes.PARTS)})")
    p.add_argument("--max-lr-extensions", type=int, default=2,
                   help="while a recipe's best learning rate is the lowest (highest) it tried, "
                   "try half (twice) it, at most this many times")
    p.add_argument("--jobs", type=int, default=1,
                   help="trainer runs at a time, each a process, from the seeds of every point "
                   "that does not wait on another's result "
                   "(give each its share of the cores, e.g. OMP_NUM_THREADS=1 and --jobs 2 on "
                   "2 cores); the timing phase runs one at a time whatever this is")
    p.add_argument("--no-reuse", action="store_true",
                   help=f"train every run again, not reusing those in <--out>/{CACHE_NAME} "
                   f"(they are still appended there)")
    p.add_argument("--cached-only", action="store_true",
                   help=f"train nothing: report what <--out>/{CACHE_NAME} holds now, as "
                   f"{PARTIAL}.json/.md (an ablation variant not all there is 'not yet run'; "
                   "no timing phase), leaving a complete report's files as they are")
    timing_phase.add_flags(p)
    p.set_defaults(standalone=run)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the bench as Ctrl-C does: the running trainer's process group is
    killed (run_group's clean-up), and the runs completed are in the cache already. Left as
    it is off the main thread, where no handler can be set."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run(args: argparse.Namespace) -> int:
    from gpt.bench.report import run_info
    from gpt.data.shards import find_shards, shard_num_tokens
    from gpt.runtime.device import pick_device

    if args.seeds < 1:
        raise UserError(f"--seeds {args.seeds}: must be >= 1")
    if args.max_lr_extensions < 0:
        raise UserError(f"--max-lr-extensions {args.max_lr_extensions}: must be >= 0")
    if args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: must be >= 1 (runs at a time)")
    timing_phase.check_flags(args)
    if args.cached_only:  # nothing trains, so nothing runs side by side or is timed
        args.jobs, args.timing_repeats = 1, 0
    device = pick_device(args.device)
    out = Path(args.out)  # checked by gpt.bench.cli before the bench runs
    out.mkdir(parents=True, exist_ok=True)
    if args.corpus and not (Path(args.data_dir) / "metadata.json").exists():
        tokens_bench.prepare_corpus(Path(args.corpus), Path(args.data_dir))
    train_tokens = sum(shard_num_tokens(p) for p in find_shards(args.data_dir, "train"))
    full = args.steps * args.total_batch_tokens
    if full > train_tokens:
        print(f"warning: --steps {args.steps} x {args.total_batch_tokens} tokens = {full:,} is "
              f"more than the {train_tokens:,} train tokens: runs repeat data", file=sys.stderr)
    cache = RunCache(out / CACHE_NAME, data_fingerprint(args.data_dir), reuse=not args.no_reuse)
    if cache.lines:
        print(f"run cache: {len(cache.lines)} run(s) in {cache.path} to reuse", flush=True)
    with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix="tokens_bench_") as tmp:
        b = Bench(args, Path(tmp), cache)
        try:
            report, base, best = measure(b, args)
        except KeyboardInterrupt:
            now = sum(not r["reused"] for r in b.runs)
            print(f"\ninterrupted: {cache.path} holds every completed run ({now} of them run "
                  f"now); the same command resumes from them", file=sys.stderr)
            return 130
        except NotCached as e:
            raise UserError(f"--cached-only: {cache.path} holds no run of {e} yet, which the "
                            f"report cannot do without: run the same command without "
                            f"--cached-only (it resumes from the cache)") from None
    target = base["final_val_loss"]
    reused = sum(bool(r.get("reused")) for r in b.runs)
    report = {**run_info("tokens", device, args.argv), "data_dir": args.data_dir,
              "train_tokens": train_tokens, "seeds": args.seeds,
              "model": {"preset": args.model, "n_layer": args.n_layer, "n_head": args.n_head,
                        "n_embd": args.n_embd, "seq_len": args.seq_len},
              "tokens_per_step": args.total_batch_tokens, "full_budget_tokens": full,
              "new_recipe_parts": list(recipes.NEW_PARTS), **report,
              "run_cache": str(cache.path), "runs_reused": reused,
              "runs_run_now": len(b.runs) - reused, "run_origins": origins(b.runs),
              # by recipe, then budget: with --jobs they complete in no fixed order
              "points": [{k: v for k, v in p.items() if k != "seeds"} for p in sorted(
                  b.points.values(), key=lambda p: (p["label"], -p["steps"], p["lr"]))],
              "runs": b.runs}
    markdown = summary(report)
    if args.cached_only:
        write_outputs(out, PARTIAL, report, markdown)
        print(markdown)
        print(f"wrote {out}/{PARTIAL}.json, {PARTIAL}.md")
        return 0
    write_outputs(out, "tokens", report, markdown)
    first = [p["seeds"][0] for p in (base, best)]  # the first seed's curves of both
    plotted = tokens_bench.plot(*(dict(r, lr=p["lr"]) for r, p in zip(first, (base, best))),
                                target, out / "tokens.png")
    print(markdown)
    print(f"wrote {out}/tokens.json, tokens.md{', tokens.png' if plotted else ''}")
    if not plotted:
        print(f"note: tokens.png left out: matplotlib is not installed; {MATPLOTLIB_HINT}",
              file=sys.stderr)
    return 0


def bracket_rate(b: Bench, points: list[dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """The best of `points` (one full-budget point per learning rate, of one or more
    recipes), after trying half (or twice) its rate while it is strictly better than every
    other rate of its recipe and the lowest (or highest) of them, at most
    --max-lr-extensions times; and whether the best now has a worse rate on each side."""
    extensions = 0
    while True:
        best = min(points, key=lambda p: p["final_val_loss"])
        same = sorted((p for p in points if p["parts"] == best["parts"]), key=lambda p: p["lr"])
        others = [p["final_val_loss"] for p in same if p is not best]
        if not others or best["final_val_loss"] >= min(others):
            return best, False  # one rate, or a tie: nothing says which way to go
        if same[0] is not best and same[-1] is not best:
            return best, True
        if extensions == b.args.max_lr_extensions:
            return best, False
        extensions += 1
        lr = best["lr"] / 2 if same[0] is best else best["lr"] * 2
        points.append(b.point(best["label"], tuple(best["parts"]), best["steps"], lr))


def measure(b: Bench, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any],
                                                         dict[str, Any]]:
    """The bench's steps 1-5: (its results, the target's point, the best new point)."""
    gpt2 = [b.point(f"gpt2 {sched}", parts, args.steps, lr)
            for sched, parts in (("cosine", ()), ("trapezoid", ("schedule",)))
            for lr in args.baseline_lrs]
    base, base_bracketed = bracket_rate(b, gpt2)
    target = base["final_val_loss"]
    new = [b.point("new", recipes.NEW_PARTS, args.steps, s) for s in args.new_lr_scales]
    best, new_bracketed = bracket_rate(b, new)
    scale = best["lr"]
    # both recipes' budgets together: with --jobs, their runs fill every slot
    points, tied = b.together([partial(budgets, b, "new", recipes.NEW_PARTS, scale, target, best),
                               partial(budgets, b, "new, tied head", TIED, scale, target)])
    report: dict[str, Any] = {
        # whether each best rate has a worse one on each side (else it is the best tried)
        "baseline_lr_bracketed": base_bracketed, "new_lr_scale_bracketed": new_bracketed,
        "target_val_loss": target, "target_val_loss_std": base["final_val_loss_std"],
        "baseline": {"parts": base["parts"], "lr": base["lr"], "steps": base["steps"],
                     "tokens": base["tokens"], "train_seconds": base["train_seconds"],
                     "params": parameters(args, base["parts"])},
        "new_best_lr_scale": scale,
        "best": {"params": parameters(args, recipes.NEW_PARTS),
                 **crossing(points, target, base, args.seeds)},
        "tied_head": {"params": parameters(args, TIED), **crossing(tied, target, base, args.seeds)},
    }
    if args.ablation:
        report["ablation"] = ablation(b, args, base, scale, target,
                                      report["best"]["tokens_to_target_per_seed"])
    report["timing"] = None
    if args.timing_repeats == 0:
        return report, base, best
    timing = timing_phase.time_recipes(args, b.work, {
        "gpt2": (tuple(base["parts"]), base["lr"]), "new": (recipes.NEW_PARTS, scale),
        "new, tied head": (TIED, scale)})
    report["timing"] = {"steps": args.timing_steps, "repeats": args.timing_repeats,
                        "warmup_steps": timing_phase.WARMUP_STEPS, "recipes": timing}
    report["baseline"]["seconds"] = base["steps"] * timing["gpt2"]["median_step_s"]
    for key, name in (("best", "new"), ("tied_head", "new, tied head")):
        report[key].update(timing_phase.side_by_side(
            report[key], base, args.total_batch_tokens, timing["gpt2"], timing[name]))
    return report, base, best


def ablation(b: Bench, args: argparse.Namespace, base: dict[str, Any], scale: float,
             target: float, new_tokens: list[float | None]) -> list[dict[str, Any]]:
    """Each of the recipe's parts alone on the GPT-2 recipe and the full recipe without it;
    each further part on the full recipe (whether to add it is the question): tokens to the
    target for each, over the same seeds, on bisect_budgets' points, and whether the part
    helps seed by seed (part_effect: against the full recipe's tokens, `new_tokens`; on
    the GPT-2 recipe, whose own tokens are the full budget, by the final loss there).
    --jobs variants at a time, so that their runs fill the slots and the variants complete
    about in order."""
    variants = []
    base_parts = tuple(base["parts"])
    for part in args.parts or list(recipes.PARTS):
        if part in recipes.NEW_PARTS:
            if part not in base_parts:
                variants.append((f"gpt2 + {part}", part, (*base_parts, part)))
            variants.append((f"new - {part}", part,
                             tuple(p for p in recipes.NEW_PARTS if p != part)))
        else:
            variants.append((f"new + {part}", part, (*recipes.NEW_PARTS, part)))

    def row(label: str, part: str, parts: tuple[str, ...]) -> dict[str, Any]:
        head = {"variant": label, "part": part, "parts": list(parts),
                "params": parameters(args, parts)}
        try:
            rate = variant_rate(b, label, parts, part == "muon", base["lr"], scale)
            points = bisect_budgets(b, label, parts, rate["lr"], target)
        except NotCached as e:  # --cached-only: this variant has not all run yet
            return {**head, "not_yet_run": str(e)}
        head.update(rate)
        c = crossing(points, target, base, args.seeds)
        if label.startswith("gpt2"):
            full = next(p for p in points if p["steps"] == args.steps)
            losses = [[s["final_val_loss"] for s in p["seeds"]] for p in (full, base)]
            effect = part_effect(*losses, "final val loss at the full budget")
        else:
            mine = c["tokens_to_target_per_seed"]
            pair = (new_tokens, mine) if label.startswith("new -") else (mine, new_tokens)
            effect = part_effect(*pair, "tokens to the target")
        return {**head, **c, "part_effect": effect}

    return b.together([partial(row, *v) for v in variants], at_most=args.jobs)


def variant_rate(b: Bench, label: str, parts: tuple[str, ...], swept: bool, adamw_lr: float,
                 scale: float) -> dict[str, Any]:
    """An ablation variant's learning rate: its optimizer's tuned one (the new recipe's scale
    with Muon, the GPT-2 recipe's rate with AdamW alone), unless `swept` (Muon is the part
    added or taken away, so no recipe tuned that optimizer with these parts): then the best
    of its own sweep at the full budget (--new-lr-scales with Muon, else --baseline-lrs,
    bracketed as the recipes' are)."""
    muon = "muon" in parts
    if not swept:
        return {"lr": scale if muon else adamw_lr, "lr_swept": None}
    rates = b.args.new_lr_scales if muon else b.args.baseline_lrs
    points = b.together([partial(b.point, label, parts, b.args.steps, lr) for lr in rates])
    best, bracketed = bracket_rate(b, points)
    return {"lr": best["lr"], "lr_swept": sorted(p["lr"] for p in points),
            "lr_bracketed": bracketed}
