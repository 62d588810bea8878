#!/usr/bin/env bash
# The CUDA checks in one script (make gpu-check): the tests with the engine on
# the GPU, then the benchmarks; everything lands in the folder given ($1).
set -uo pipefail
out=${1:-gpu-results}
mkdir -p "$out"
py=${PY:-.venv/bin/python}
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
"$py" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())" | tee "$out/device.txt" || exit 1
MINILLM_DEVICE=cuda "$py" -m pytest -q tests 2>&1 | tee "$out/tests.txt"
tests_rc=${PIPESTATUS[0]}
MINILLM_DEVICE=cuda "$py" -m minillm bench all --out "$out" 2>&1 | tee "$out/bench.txt"
bench_rc=${PIPESTATUS[0]}
echo "tests rc=$tests_rc bench rc=$bench_rc" | tee "$out/summary.txt"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
