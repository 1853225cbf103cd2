#!/usr/bin/env bash
# SimCSE training through tools/train_net.py on NPROC processes of this node.
#   bash projects/simcse/train.sh unsup|sup NPROC [config overrides...]
# e.g. bash projects/simcse/train.sh unsup 2 \
#        tokenization.tokenizer.vocab_file=/models/bert-base-uncased/vocab.txt \
#        model.cfg.pretrained_model_path=/models/bert-base-uncased \
#        dataloader.train.dataset.0.data_path=/data/wiki1m_for_simcse.txt \
#        dataloader.train.valid_dataset.data_path=/data/sts-b-dev.csv
# Several nodes: NODE, NODE_RANK, ADDR and PORT as for tools/train.sh.
set -euo pipefail
if [ "$#" -lt 2 ] || { [ "$1" != unsup ] && [ "$1" != sup ]; }; then
  echo "usage: bash projects/simcse/train.sh unsup|sup NPROC [overrides...]" >&2
  exit 2
fi
MODE=$1
NPROC=$2
cd "$(dirname "$0")/../.."
exec bash tools/train.sh tools/train_net.py "projects/simcse/configs/simcse_${MODE}.py" "$NPROC" "${@:3}"
