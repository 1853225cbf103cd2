# Shared by the GPU run scripts (benchmarks/issue44_*.sh), sourced with OUT set: installs the
# carried wheels (.whl/, see docs/benchmarks.md) into /tmp/site, writes the device and
# versions to $OUT/env.txt, and defines `stage NAME CAP_SECONDS COMMAND...`, which runs one
# stage under its own time cap (a slow stage cannot take the others' results), logs it to
# $OUT/NAME.log and prints the lines of the log that hold figures or failures.
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-}
fi
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c "import torch, transformers, torchao; print('torch', torch.__version__, \
'transformers', transformers.__version__, 'torchao', torchao.__version__, \
torch.cuda.get_device_name(), torch.cuda.get_device_capability())" 2>&1 | grep -v Warn
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

stage() {  # stage NAME CAP_SECONDS COMMAND...
  local name=$1 cap=$2
  shift 2
  echo "== $name (cap ${cap}s) start $(date -u +%T)"
  timeout "$cap" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name rc=$? end $(date -u +%T)"
  grep -E '^\||MFU|peak|FLOPs|tok/s|target|bound|failed|FAILED|Error|rc=|passed|skipping cudagraphs' \
    "$OUT/$name.log" | grep -v Warning | tail -n 40
}
