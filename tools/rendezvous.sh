# Sourced by tools/train.sh and tools/infer.sh: sets RENDEZVOUS, torchrun's node and port
# arguments. One node (NODE unset or 1) and PORT unset: torchrun --standalone picks a free
# port, so several jobs run side by side on one machine. PORT, when set, is always the port
# used. Several nodes: NODE (node count), NODE_RANK, ADDR (rank-0 host) and PORT (default
# 12345) on each node.
NODE=${NODE:-1}
NODE_RANK=${NODE_RANK:-0}
ADDR=${ADDR:-127.0.0.1}
if [ -z "${PORT:-}" ] && [ "$NODE" = 1 ]; then
  RENDEZVOUS=(--standalone --nnodes 1)
else
  RENDEZVOUS=(--nnodes "$NODE" --node_rank "$NODE_RANK"
              --master_addr "$ADDR" --master_port "${PORT:-12345}")
fi
