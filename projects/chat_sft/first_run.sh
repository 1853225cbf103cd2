#!/usr/bin/env bash
# A first run without any download: write the sample chats and a tiny ChatML tokenizer
# (output/chat_sample), train a small random Qwen2 on NPROC processes (default 1), then ask it
# one question through chat.py. Extra arguments are config overrides.
#   bash projects/chat_sft/first_run.sh            # 1 process, about a minute on 2 CPU cores
#   bash projects/chat_sft/first_run.sh 2 train.dist.tensor_parallel_size=2
set -euo pipefail
cd "$(dirname "$0")/../.."
NPROC=${1:-1}
SAMPLE=output/chat_sample
OUTPUT=output/chat_sft_tiny
if [ ! -f "$SAMPLE/train.jsonl" ]; then
  python3 projects/chat_sft/sample_data.py "$SAMPLE"
fi
bash tools/train.sh tools/train_net.py projects/chat_sft/configs/qwen2_chat_sft_tiny.py "$NPROC" \
  train.output_dir="$OUTPUT" "${@:2}"
python3 projects/chat_sft/chat.py "$OUTPUT" "What is 2 plus 3?" --max-new-tokens 32
