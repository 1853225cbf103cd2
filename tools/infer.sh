#!/usr/bin/env bash
# Launch an inference script on NPROC processes of this node through torchrun (LiBai's launcher).
#   bash tools/infer.sh tools/infer_demo.py NPROC [script args...]
# Every process builds the same pipeline; rank 0 prints the results.
# One node (NODE unset or 1) and PORT unset: torchrun --standalone picks a free port, so
# several jobs run side by side on one machine. PORT, when set, is always the port used.
# Several nodes: set NODE (node count), NODE_RANK, ADDR (rank-0 host) and PORT (default 12345)
# on each node.
set -euo pipefail
if [ "$#" -lt 2 ]; then
  echo "usage: bash tools/infer.sh SCRIPT NPROC [script args...]" >&2
  exit 2
fi
SCRIPT=$1
NPROC=$2
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# shellcheck source=tools/rendezvous.sh
source "$(dirname "$0")/rendezvous.sh"
exec python3 -m torch.distributed.run --nproc_per_node "$NPROC" "${RENDEZVOUS[@]}" \
  "$SCRIPT" "${@:3}"
