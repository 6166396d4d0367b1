#!/usr/bin/env bash
# One GPU check in one call (about 5 minutes on an H200; every part under its own timeout):
#   perf/gpu_check.sh OUT_DIR [--zero3] [--vllm] [--all]   # on a CUDA machine
#   perf/gpu_check.sh OUT_DIR --smoke                      # on a CPU: a tiny model, tests the script
# Prints one table (step time and peak memory beside TRL's, decode against the bandwidth limit, the
# profile's top kernels and compiles per decode shape, ZeRO-3 and vLLM rows on request) and writes JSON
# lines to OUT_DIR/gpu_check.jsonl. On a machine that reaches no package registry (../shared/bench/gpu/
# README.md), wheels in .whl/ are installed into /tmp/site first and the kit in .gpukit/ is used.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
    echo "usage: perf/gpu_check.sh OUT_DIR [--smoke] [--zero3] [--vllm] [--all]" >&2
    exit 2
fi
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1 && ! "$PY" -c "import rapo_echo" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    "$PY" -m pip install -q --no-deps --no-index --no-build-isolation -e .
fi
exec "$PY" perf/gpu_check.py "$@"
