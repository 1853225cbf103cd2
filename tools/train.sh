#!/usr/bin/env bash
# Launch a training script on NPROC processes of this node through torchrun (LiBai's launcher).
#   bash tools/train.sh tools/train_net.py configs/gpt2_pretrain.py NPROC [overrides...]
# Several nodes: set NODE (node count), NODE_RANK, ADDR (rank-0 host) and PORT on each node.
set -euo pipefail
if [ "$#" -lt 3 ]; then
  echo "usage: bash tools/train.sh FILE CONFIG NPROC [overrides...]" >&2
  exit 2
fi
FILE=$1
CONFIG=$2
NPROC=$3
NODE=${NODE:-1}
NODE_RANK=${NODE_RANK:-0}
ADDR=${ADDR:-127.0.0.1}
PORT=${PORT:-12345}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec python3 -m torch.distributed.run \
  --nproc_per_node "$NPROC" --nnodes "$NODE" --node_rank "$NODE_RANK" \
  --master_addr "$ADDR" --master_port "$PORT" \
  "$FILE" --config-file "$CONFIG" "${@:4}"
