#!/usr/bin/env bash
# GPT 345M on 2 processes (configs/pretrain_gpt_345M_mp2.yaml). Extra arguments are
# config overrides, e.g. -o Engine.max_steps=100. Several nodes: NODE, NODE_RANK, ADDR, PORT
# as for tools/train.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash tools/train.sh tools/train.py projects/gpt/configs/pretrain_gpt_345M_mp2.yaml 2 "$@"
