"""`gpt2-lm-eval` (or `python -m gpt.harness_cli`): EleutherAI's `lm_eval` command line
with this package's model registered as `gpt2-trainer`.

    gpt2-lm-eval --model gpt2-trainer --model_args checkpoint=runs/x/ckpt_019073.pt \\
        --tasks hellaswag,arc_easy --batch_size 32

Every flag is the harness's own. The plain `lm_eval` command cannot find this model: the
harness (0.4.x) finds models only in its own table and in modules already imported, and
reads no plugin entry points, so this command imports ours first and then runs it.
model_args: checkpoint=PATH or init_from=NAME|DIR, and optionally device, dtype
(auto, fp32, bf16, fp16), max_gen_toks.
"""

from __future__ import annotations

import sys

from gpt.harness_tasks import HarnessError, require_lm_eval


def main() -> int:
    try:
        require_lm_eval("gpt2-lm-eval")
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    from lm_eval.__main__ import cli_evaluate

    from gpt.harness import register

    register()
    cli_evaluate()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
