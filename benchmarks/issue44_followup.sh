#!/usr/bin/env bash
# Issue 44's second GPU run (about 9 minutes), after the first (issue44_device.sh, recorded in
# docs/benchmarks.md): the GPU tests; batch-1/8 bf16 decoding of GPT-2 124M and Llama 1B with
# the greedy step in one CUDA graph (libai dynamic and compiled against transformers eager and
# static + compile); FP8 tensorwise against bf16 without compile (is compile behind the
# loss gap?); the whole-model compiled row of the 1B MFU table. Each stage has its own cap.
#
#   bash benchmarks/issue44_followup.sh OUT_DIR
# Wheels the GPU image lacks (omegaconf, hydra-core, antlr4, torchao) go in .whl/
# (docs/benchmarks.md says how); they are installed into /tmp/site first.
set -uo pipefail
OUT=${1:?output dir}
# shellcheck source=benchmarks/device_run.sh
source "$(dirname "$0")/device_run.sh"

stage gpu_tests 60 python3 -m pytest -q -p no:cacheprovider tests/gpu \
  tests/unit/layers/test_float8.py
TORCH_LOGS=perf_hints stage generation 250 python3 benchmarks/bench_generation.py \
  --device cuda --dtype bf16 --models gpt2,llama1b --batches 1,8 --paths dynamic,compiled \
  --no-memory --skip "HF compiled@8" --json "$OUT/generation.json"
stage fp8_eager 120 python3 benchmarks/bench_fp8.py --device cuda --seq 4096 --batch 2 \
  --rows bf16,tensorwise --no-compile --steps 150 --warmup 10 --json "$OUT/fp8_eager.json"
stage mfu_model 110 python3 benchmarks/bench_mfu.py --device cuda --seq 2048 --batch 4 \
  --rows "libai compiled-model" --json "$OUT/mfu_model.json"
