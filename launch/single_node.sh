#!/usr/bin/env bash
# Train on every GPU of one machine with DDP (or --parallel zero1 / fsdp).
#
#   launch/single_node.sh                          # all visible GPUs, the 124M defaults
#   NGPUS=4 launch/single_node.sh --data-dir data/fineweb-edu-10B --out-dir runs/124M
#   launch/single_node.sh --model gpt2-xl --parallel fsdp --activation-checkpointing
#
# Any flags are passed to train_gpt2.py. --resume auto is added so that re-running the
# same command after a crash or preemption continues from the newest checkpoint.
#
# Environment worth knowing (NCCL reads these at start-up):
#   NCCL_DEBUG=WARN|INFO      INFO prints the rings/trees and transports NCCL picked:
#                             the first thing to look at when bandwidth is low or it hangs
#   NCCL_P2P_DISABLE=1        only if peer-to-peer between GPUs is broken on the machine
#   CUDA_VISIBLE_DEVICES=0,1  restrict the GPUs used (set NGPUS to match)
#   OMP_NUM_THREADS           torchrun sets 1 per process; raise it if data loading is slow
#   PYTHON                    the interpreter; default: the active virtual environment's,
#                             else python3 (launch/find_python.sh). torchrun runs as its module
#
# Relative paths (--data-dir, --out-dir) are relative to where you run the script from.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
source "$REPO/launch/find_python.sh"
find_python

if [ -z "${NGPUS:-}" ]; then
  NGPUS=$("$PYTHON" -c "import torch; print(max(1, torch.cuda.device_count()))")
fi
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

exec "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$NGPUS" \
  "$REPO/train_gpt2.py" --resume auto "$@"
