#!/usr/bin/env bash
# GPT 345M on one device. Extra arguments are config overrides, e.g. -o Engine.max_steps=100
set -euo pipefail
cd "$(dirname "$0")/../.."
python tools/train.py -c projects/gpt/configs/pretrain_gpt_345M_single_card.yaml "$@"
