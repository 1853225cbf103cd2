#!/usr/bin/env bash
# FleetX's own pretrain_gpt_345M_single_card.yaml (tests/fixtures/fleetx, unmodified) through
# tools/train.py on one GPU at its real size (345M, seq 1024, micro-batch 8, O2 fp16 as
# shipped), on a synthetic corpus in FleetX's _ids.npy / _idx.npz format: once per
# Model.recompute_granularity (off, full, full_attn, core_attn), reporting each run's peak
# memory (max_mem) and step time from the log; then once with FleetX's Profiler section on.
#
#   bash benchmarks/fleetx_gpt_device.sh OUT_DIR [extra -o overrides...]
# (CPU smoke: add -o Global.device=cpu and tiny Model sizes)
set -euo pipefail
OUT=${1:?output dir}; shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
YAML=$ROOT/tests/fixtures/fleetx/ppfleetx/configs/nlp/gpt/pretrain_gpt_345M_single_card.yaml
mkdir -p "$OUT"
PYTHONPATH=$ROOT/tests/support:${PYTHONPATH:-} python - "$OUT/corpus" <<'PY'
import sys
from pathlib import Path
from fleetx_files import fleetx_corpus
fleetx_corpus(Path(sys.argv[1]), num_docs=200000)
PY
COMMON=(-o "Data.Train.dataset.input_dir=$OUT/corpus" -o "Data.Eval.dataset.input_dir=$OUT/corpus"
        -o Engine.max_steps=12 -o Engine.logging_freq=4 -o Engine.eval_freq=-1
        -o Engine.save_load.save_steps=-1)
for g in off full full_attn core_attn; do
  REC=(-o Model.use_recompute=False)
  [ "$g" != off ] && REC=(-o Model.use_recompute=True -o Model.recompute_granularity=$g)
  python "$ROOT/tools/train.py" -c "$YAML" "${COMMON[@]}" "${REC[@]}" \
    -o "Engine.save_load.output_dir=$OUT/run_$g" "$@" > "$OUT/log_$g.txt" 2>&1 || echo "run $g failed"
  echo "== recompute $g: $(grep -Eo 'max_mem: [0-9]+M' "$OUT/log_$g.txt" | tail -1), $(grep -Eo 'time: [0-9.]+' "$OUT/log_$g.txt" | tail -1), $(grep -Eo 'total_loss: [0-9.]+' "$OUT/log_$g.txt" | head -1) -> $(grep -Eo 'total_loss: [0-9.]+' "$OUT/log_$g.txt" | tail -1)"
done
python "$ROOT/tools/train.py" -c "$YAML" "${COMMON[@]}" -o Profiler.enable=True \
  -o "Profiler.scheduler=[5,8]" -o "Engine.save_load.output_dir=$OUT/run_profiler" "$@" \
  > "$OUT/log_profiler.txt" 2>&1 || echo "profiler run failed"
ls -la "$OUT/run_profiler/profiler_log" 2>/dev/null || true
grep -c '"name": "ProfilerStep#' "$OUT"/run_profiler/profiler_log/trace_rank0.json 2>/dev/null || true
