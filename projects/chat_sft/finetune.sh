#!/usr/bin/env bash
# Chat fine-tuning of a Hugging Face Qwen2 / Llama checkpoint on NPROC processes.
#   bash projects/chat_sft/finetune.sh MODEL_DIR TRAIN_JSONL NPROC [overrides...]
#   bash projects/chat_sft/finetune.sh /models/Qwen2-0.5B-Instruct chats.jsonl 4 \
#       train.dist.tensor_parallel_size=2 train.dist.device_type=cuda train.amp.enabled=True
# MODEL_DIR holds config.json, the safetensors weights, tokenizer.json and the chat template.
set -euo pipefail
if [ "$#" -lt 3 ]; then
  echo "usage: bash projects/chat_sft/finetune.sh MODEL_DIR TRAIN_JSONL NPROC [overrides...]" >&2
  exit 2
fi
MODEL=$(realpath "$1")
DATA=$(realpath "$2")
NPROC=$3
cd "$(dirname "$0")/../.."
bash tools/train.sh tools/train_net.py projects/chat_sft/configs/qwen2_chat_sft.py "$NPROC" \
  model.path="$MODEL" dataloader.train.dataset.0.data_path="$DATA" "${@:4}"
