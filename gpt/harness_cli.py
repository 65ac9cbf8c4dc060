"""`gpt2-lm-eval` (or `python -m gpt.harness_cli`): EleutherAI's `lm_eval` command line
with this package's model registered as `gpt2-trainer`.

    gpt2-lm-eval --model gpt2-trainer --model_args checkpoint=runs/x/ckpt_019073.pt \\
        --tasks hellaswag,arc_easy --batch_size 32

Every flag is the harness's own. The plain `lm_eval` command cannot find this model: the
harness (0.4.x) finds models only in its own table and in modules already imported, and
reads no plugin entry points, so this command imports ours first and then runs it.
model_args: checkpoint=PATH or init_from=NAME|DIR, and optionally device, dtype
(auto, fp32, bf16, fp16), max_gen_toks.

Before the harness runs, what `python -m gpt.evaluate` checks is checked here too, with
its words: --tasks names tasks that exist and load, --include_path is a folder, --limit is
above 0. Every error this package raises (a checkpoint that cannot be read, a request the
model cannot score) is then one line, as in this package's other commands.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from pathlib import Path
from typing import Any

from gpt.core import network
from gpt.core.errors import UserError
from gpt.core.text import one_line
from gpt.eval.harness_tasks import HarnessError, load_tasks, require_lm_eval, task_files


def main(argv: list[str] | None = None) -> int:
    saved_argv = sys.argv
    if argv is not None:  # the harness's parser reads sys.argv
        sys.argv = [saved_argv[0] if saved_argv else "gpt2-lm-eval", *argv]
    try:
        require_lm_eval("gpt2-lm-eval")
        from lm_eval._cli import HarnessCLI
        from lm_eval.utils import setup_logging

        from gpt.eval.harness import register

        register()
        setup_logging()
        cli = HarnessCLI()
        args = cli.parse_args()  # the harness's own parser: its errors are its one-liners
        if getattr(args, "command", None) == "run":  # also the form without "run"
            check_run(args)
        # Without network the harness's datasets read their cache alone (check_run has
        # loaded every task from it), not after a minute of retries for each
        with network.offline_hub() if network.hub_unreachable() else contextlib.nullcontext():
            cli.execute(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    finally:
        sys.argv = saved_argv
    return 0


def check_run(args: argparse.Namespace) -> None:
    """What `run` needs, checked before the harness builds a model or loads a task: --limit
    above 0, --tasks naming tasks that exist (names, or patterns such as arc_*) and whose
    data loads, --include_path a folder whose every task file can be read (as every folder
    named in --tasks). Task YAML files named in --tasks are the harness's to read. Values
    may come from --config's YAML file, as the harness merges them (the command line
    first)."""
    from_file: dict[str, Any] = {}
    if getattr(args, "config", None):
        from lm_eval.config.evaluate_config import EvaluatorConfig

        try:
            from_file = EvaluatorConfig.load_yaml_config(args.config)
        except (OSError, ValueError, TypeError) as e:
            raise HarnessError(f"--config {args.config}: "
                               f"{one_line(' '.join(str(e).split()))}") from None

    def given(name: str) -> Any:
        value = getattr(args, name, None)
        return value if value or value == 0 else from_file.get(name)

    limit = given("limit")
    if limit is not None and (not isinstance(limit, (int, float)) or not math.isfinite(limit)
                              or limit <= 0):
        shown = f"{limit:g}" if isinstance(limit, float) else limit
        raise HarnessError(f"--limit {shown}: must be above 0 (a number of examples of each "
                           f"task, or below 1 a fraction of them)")
    tasks = given("tasks")
    if tasks is None:
        raise HarnessError("--tasks: name the tasks to score, e.g. --tasks hellaswag,arc_easy "
                           "(`gpt2-lm-eval ls tasks` lists them)")
    items = [t.strip() for x in ([tasks] if isinstance(tasks, str) else tasks)
             for t in str(x).split(",")]
    # Task YAML files and folders of them: the harness reads those itself (a folder's
    # entries checked readable first, as --include_path's are: it passes over one in silence)
    for folder in (t for t in items if t and Path(t).is_dir()):
        task_files(folder, "--tasks")
    names = [t for t in items if t and not t.endswith(".yaml") and not Path(t).is_dir()]
    if names or not any(items):
        _, failed = load_tasks(",".join(names) if names else ",".join(items),
                               given("include_path"), flag="--tasks",
                               include_flag="--include_path", patterns=True)
        if failed:
            print("\n".join(f"error: {line}" for line in failed), file=sys.stderr)
            raise HarnessError(f"{len(failed)} of the --tasks could not be loaded (see above)")


if __name__ == "__main__":
    raise SystemExit(main())
