"""The tokens bench's report in words (tokens.md, tokens-cached.md): the target, where the
runs came from, each variant's tokens and time to the target with their spread, whether
each ablation part helps seed by seed, the timing phase and every point. Its data is
tokens.json, which gpt/bench/tokens/search.py writes."""

from __future__ import annotations

from typing import Any


def _ratio(c: dict[str, Any], key: str) -> str:
    s = c[f"{key}_per_seed"]
    if s is None:
        return "not timed side by side"
    if s["mean"] is None:
        return "not reached"
    text = f"{s['mean']:.2f} +- {s['std']:.2f} ({s['reached']} seeds)"
    if key == "time_ratio" and c.get("time_ratio_range"):
        text += " [{:.2f}, {:.2f}]".format(*c["time_ratio_range"])
    return text


def _params(c: dict[str, Any]) -> str:
    return f"{c['params'] / 1e6:.2f}M" if c.get("params") else ""  # a report from before it


def _effect(e: dict[str, Any] | None) -> str:
    """part_effect in words, e.g. 'helps on all 3 seeds (tokens to the target)'."""
    if e is None:
        return ""
    if e["verdict"] == "unclear":
        return (f"unclear: helps on {e['helps']}, hurts on {e['hurts']} of {e['seeds']} seeds "
                f"({e['measure']})")
    return f"{e['verdict']} on all {e['seeds']} seeds ({e['measure']})"


def _origin(o: dict[str, Any]) -> str:
    commit = str(o["commit"])[:12] + (" (with local changes)" if o["commit_dirty"] else "")
    return (f"commit {commit} on {o['cpu']} x {o['cpu_count']}, torch {o['torch']}: "
            f"{o['runs']} run(s)")


def _rates(r: dict[str, Any]) -> str:
    def say(name: str, bracketed: bool | None) -> str:
        where = ("has a worse one on each side" if bracketed
                 else "is the edge of those tried (not bracketed)")
        return f"{name}'s best learning rate {where}"

    return "; ".join(say(name, r.get(key)) for name, key in (
        ("The GPT-2 recipe", "baseline_lr_bracketed"), ("the new recipe", "new_lr_scale_bracketed")))


def summary(r: dict[str, Any]) -> str:
    base, timing = r["baseline"], r["timing"]
    lines = [f"# Tokens and time to the GPT-2 recipe's validation loss "
             f"({r['target_val_loss']:.4f} +- {r['target_val_loss_std']:.4f}, {r['seeds']} seeds)",
             "", f"`{r['command']}` at {r['commit']} on {r['device']}, torch {r['torch']}", "",
             f"Target: GPT-2 recipe ({'trapezoid' if 'schedule' in base['parts'] else 'cosine'} "
             f"schedule, --max-lr "
             f"{base['lr']:g}) after {base['tokens']:,} tokens ({base['steps']} steps): "
             + (f"{base['seconds']:.1f} s at its side-by-side step time, " if timing else "")
             + f"{base['train_seconds']:.1f} s in its own runs, {_params(base)} parameters. "
             f"New recipe at lr scale "
             f"x{r['new_best_lr_scale']:g}. {_rates(r)}.", "",
             f"Runs: {r['runs_run_now']} run now, {r['runs_reused']} reused from "
             f"`{r['run_cache']}`; " + "; ".join(_origin(o) for o in r["run_origins"]) + ".", "",
             "| variant | parameters | tokens to target | tokens_ratio | time_ratio | "
             "time_ratio from run times | the part, seed by seed |", "|---|---|---|---|---|---|---|"]
    rows = [("new recipe (best)", r["best"]), ("new recipe, tied head (equal parameters)",
                                               r["tied_head"])]
    rows += [(a["variant"] + (f" (best lr of its own sweep: {a['lr']:g})" if a.get("lr_swept")
                              else ""), a) for a in r.get("ablation", [])]
    for name, c in rows:
        if "not_yet_run" in c:
            lines.append(f"| {name} | {_params(c)} | not yet run (first missing: "
                         f"{c['not_yet_run']}) | | | | |")
            continue
        tokens = f"{c['tokens_to_target']:,.0f} ({c['how']})" if c["tokens_to_target"] else c["how"]
        lines.append(f"| {name} | {_params(c)} | {tokens} | {_ratio(c, 'tokens_ratio')} | "
                     f"{_ratio(c, 'time_ratio')} | {_ratio(c, 'time_ratio_from_run_times')} | "
                     f"{_effect(c.get('part_effect'))} |")
    if timing:
        lines += _timing(timing)
    else:
        lines += ["", "No timing phase (--timing-repeats 0): time_ratio from run times alone."]
    lines += ["", "| point | steps | lr | final val loss | train s | peak GiB |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {p['label']} | {p['steps']} | {p['lr']:g} | {p['final_val_loss']:.4f} +- "
              f"{p['final_val_loss_std']:.4f} | {p['train_seconds']:.1f} | "
              f"{p['peak_mem_gb']:.2f} |" for p in r["points"]]
    return "\n".join(lines) + "\n"


def _timing(timing: dict[str, Any]) -> list[str]:
    """The timing phase's lines: what time_ratio is, and each recipe's step time."""
    lines = ["", f"time_ratio: from step times measured side by side at the end of this "
              f"invocation ({timing['repeats']} alternating runs of {timing['steps']} steps per "
              f"recipe, median ms/step from step {timing['warmup_steps']} on; in brackets the "
              f"ratio at the repeats' fastest and slowest). The runs' own times were measured "
              f"at different times (and in separate invocations) under this shared machine's load then, so "
              f"'from run times' measures that load too.", "",
              "| timed recipe | median ms/step | min | max |", "|---|---|---|---|"]
    lines += [f"| {name} | {t['median_step_s'] * 1000:.1f} | {t['min_step_s'] * 1000:.1f} | "
              f"{t['max_step_s'] * 1000:.1f} |" for name, t in timing["recipes"].items()]
    return lines
