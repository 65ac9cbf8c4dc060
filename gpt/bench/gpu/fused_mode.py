"""The trainer with --loss-kernel fused in one of gpt/model/fused_ce.py's modes, for the GPU
acceptance's loss-kernels stage:

    python -m gpt.bench.gpu.fused_mode forward --loss-kernel fused ...   # the trainer's flags

sets gpt/model/loss_kernels.py's FUSED_MODE (the constant whose value that stage's
measurement decides: no flag offers the mode to users while nothing has measured it) for
this process, then runs the trainer's command as train_gpt2.py does. The run's start line
names the mode it ran ("loss whole logits (fused, forward mode)").
"""

from __future__ import annotations

import sys

from gpt.entry import train_main
from gpt.model import loss_kernels


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in loss_kernels.FUSED_MODES:
        print(f"usage: python -m gpt.bench.gpu.fused_mode {{{','.join(loss_kernels.FUSED_MODES)}}} "
              f"TRAINER-FLAGS...", file=sys.stderr)
        return 2
    loss_kernels.FUSED_MODE = argv[0]
    return train_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
