#!/usr/bin/env bash
# Launch an inference script on NPROC processes of this node through torchrun (LiBai's launcher).
#   bash tools/infer.sh tools/infer_demo.py NPROC [script args...]
# Every process builds the same pipeline; rank 0 prints the results.
# Several nodes: set NODE (node count), NODE_RANK, ADDR (rank-0 host) and PORT on each node.
set -euo pipefail
if [ "$#" -lt 2 ]; then
  echo "usage: bash tools/infer.sh SCRIPT NPROC [script args...]" >&2
  exit 2
fi
SCRIPT=$1
NPROC=$2
NODE=${NODE:-1}
NODE_RANK=${NODE_RANK:-0}
ADDR=${ADDR:-127.0.0.1}
PORT=${PORT:-12345}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec python3 -m torch.distributed.run \
  --nproc_per_node "$NPROC" --nnodes "$NODE" --node_rank "$NODE_RANK" \
  --master_addr "$ADDR" --master_port "$PORT" \
  "$SCRIPT" "${@:3}"
