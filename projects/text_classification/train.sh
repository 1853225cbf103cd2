#!/usr/bin/env bash
# Train the text classifier on NPROC processes (default 1) through tools/train.sh.
#   bash projects/text_classification/train.sh [NPROC] [overrides...]
#   CONFIG=projects/text_classification/configs/config_hf.py bash projects/text_classification/train.sh 2 model.path=/models/bert-base-uncased
# Works from any directory (outputs go under it: ./output/text_classification by default);
# NODE / NODE_RANK / ADDR / PORT work as in tools/train.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CONFIG=${CONFIG:-$ROOT/projects/text_classification/configs/config.py}
NPROC=1
if [ "$#" -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then
  NPROC=$1
  shift
fi
exec bash "$ROOT/tools/train.sh" "$ROOT/tools/train_net.py" "$CONFIG" "$NPROC" "$@"
