#!/usr/bin/env bash
# Issue 44's GPU figures in one run on a lent GPU (about 9 minutes): the 1B Llama MFU table
# (seq 2048: libai and transformers, eager and compiled), batch-1/8 bf16 decoding (GPT-2 124M
# and Llama 1B against transformers eager and static + compile), FP8 against bf16 (1B, seq
# 4096) and the GPU tests. Each stage has its own time cap, so one slow stage cannot take the
# others' results; every log lands in OUT_DIR.
#
#   bash benchmarks/issue44_device.sh OUT_DIR
# The GPU image lacks omegaconf, hydra-core, antlr4 and torchao: put their wheels in .whl/
# (docs/benchmarks.md says how) and this script installs them into /tmp/site first.
set -uo pipefail
OUT=${1:?output dir}
# shellcheck source=benchmarks/device_run.sh
source "$(dirname "$0")/device_run.sh"

stage mfu2048 170 python3 benchmarks/bench_mfu.py --device cuda --seq 2048 --batch 4 \
  --rows "libai eager,libai compiled,transformers eager,transformers compiled" \
  --profile "libai compiled" --json "$OUT/mfu2048.json"
stage generation 150 python3 benchmarks/bench_generation.py --device cuda --dtype bf16 \
  --models gpt2,llama1b --batches 1,8 --no-memory --skip "HF compiled@8" \
  --json "$OUT/generation.json"
stage fp8 160 python3 benchmarks/bench_fp8.py --device cuda --seq 4096 --batch 2 \
  --steps 60 --warmup 10 --json "$OUT/fp8.json"
stage gpu_tests 70 python3 -m pytest -q -p no:cacheprovider tests/gpu \
  tests/unit/layers/test_float8.py
