#!/usr/bin/env bash
# Train across several machines: run this same script on every node.
#
#   # on each of 2 nodes, 8 GPUs each, the first node's address reachable from all:
#   NNODES=2 MASTER_ADDR=10.0.0.1 launch/multi_node.sh --data-dir /shared/fineweb --out-dir /shared/runs/124M
#
# Rendezvous is torchrun's c10d store on MASTER_ADDR:MASTER_PORT, so node ranks are
# assigned automatically and nodes may start in any order. For a fixed assignment instead,
# run `torchrun --nnodes=$NNODES --node-rank=$NODE_RANK --master-addr=$MASTER_ADDR
# --master-port=$MASTER_PORT --nproc-per-node=$NGPUS train_gpt2.py ...` on each node.
#
# --out-dir must be on storage every node can read (NFS, Lustre, ...): rank 0 writes
# the checkpoints, and on --resume every rank reads the one it continues from. The data
# folder must be readable from every node too. With --max-restarts, a failed worker
# restarts the whole job from the newest checkpoint (--resume auto).
#
# Environment worth knowing:
#   NCCL_DEBUG=INFO            which interfaces and transports NCCL chose (IB, RoCE, sockets)
#   NCCL_SOCKET_IFNAME=eth0    the network interface for NCCL's bootstrap and socket
#                              transport; set it when the default pick is wrong (docker0, lo)
#   GLOO_SOCKET_IFNAME=eth0    the same for gloo (used for small control messages)
#   NCCL_IB_HCA=mlx5_0,mlx5_1  which InfiniBand adapters to use; NCCL_IB_DISABLE=1 forces TCP
#   TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (default) a failed collective aborts the job
#                              instead of hanging; --dist-timeout bounds any wait
#   TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (set below) gives every restart a fresh store.
#                              torchrun otherwise reuses one store across restarts and a
#                              restarted worker can read its dead predecessor's address
#                              and hang connecting to it (pytorch issue #135712)
#   PYTHON                     the interpreter; default: the active virtual environment's,
#                              else python3 (launch/find_python.sh). torchrun runs as its module
#
# Relative paths (--data-dir, --out-dir) are relative to where you run the script from.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
source "$REPO/launch/find_python.sh"
find_python

: "${NNODES:?set NNODES to the number of machines}"
: "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"
MASTER_PORT=${MASTER_PORT:-29500}
NGPUS=${NGPUS:-$("$PYTHON" -c "import torch; print(max(1, torch.cuda.device_count()))")}
MAX_RESTARTS=${MAX_RESTARTS:-3}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}

exec "$PYTHON" -m torch.distributed.run \
  --nnodes="$NNODES" \
  --nproc-per-node="$NGPUS" \
  --rdzv-backend=c10d \
  --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" \
  --rdzv-id="${RUN_ID:-gpt2}" \
  --max-restarts="$MAX_RESTARTS" \
  "$REPO/train_gpt2.py" --resume auto "$@"
