#!/usr/bin/env bash
# Launch a training script on NPROC processes of this node through torchrun (LiBai's launcher).
#   bash tools/train.sh tools/train_net.py configs/gpt2_pretrain.py NPROC [overrides...]
# One node (NODE unset or 1) and PORT unset: torchrun --standalone picks a free port, so
# several jobs run side by side on one machine. PORT, when set, is always the port used.
# Several nodes: set NODE (node count), NODE_RANK, ADDR (rank-0 host) and PORT (default 12345)
# on each node.
set -euo pipefail
if [ "$#" -lt 3 ]; then
  echo "usage: bash tools/train.sh FILE CONFIG NPROC [overrides...]" >&2
  exit 2
fi
FILE=$1
CONFIG=$2
NPROC=$3
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# shellcheck source=tools/rendezvous.sh
source "$(dirname "$0")/rendezvous.sh"
# a LiBai project's own entry script (projects/<name>/...): OneFlow's API for its code
RUN=("$FILE")
case "/$FILE" in
  */projects/*) RUN=("$(dirname "$0")/../libai/oneflow_api/run.py" "$FILE") ;;
esac
exec python3 -m torch.distributed.run --nproc_per_node "$NPROC" "${RENDEZVOUS[@]}" \
  "${RUN[@]}" --config-file "$CONFIG" "${@:4}"
