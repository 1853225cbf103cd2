#!/usr/bin/env bash
# Mutation testing of one package or file of libai (mutmut 3), e.g.
#   bash tools/mutation.sh libai/checkpoint
#   bash tools/mutation.sh libai/checkpoint --retest-survivors
# Run it with the Python of the environment libai's tests run in (pip install -e ".[test]").
# How and when: docs/testing.md, "Mutation testing".
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec python "$here/mutation/run.py" "$@"
