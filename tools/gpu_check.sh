#!/usr/bin/env bash
# The CUDA checks in one script (make gpu-check): the tests with the engine on
# the GPU, chapter 9's Triton kernel (its tests compiled for the GPU, then timed
# against flash-attn's varlen kernel and the sdpa split path), then the
# benchmarks; everything lands in the folder given.
#
#   bash tools/gpu_check.sh [OUT_DIR]             # on a CUDA machine (default OUT_DIR: gpu-results)
#   bash tools/gpu_check.sh --dry-run OUT_DIR     # on a CPU: the same stages and result files, with
#                                                 # the kernel in Triton's interpreter, one test file,
#                                                 # one kernel test, tiny shapes and a short benchmark
#
# No GPU has run this script yet. The dry run is in the test suite
# (tests/test_gpu_check.py), so the first GPU owner's run cannot die of a typo.
set -uo pipefail
dry_run=0
if [ "${1:-}" = "--dry-run" ]; then
    dry_run=1
    shift
fi
out=${1:-gpu-results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.." || exit 1
py=${PY:-.venv/bin/python}
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ "$dry_run" = 1 ]; then
    export TRITON_INTERPRET=1 MINILLM_DEVICE=cpu        # the kernel interpreted, on CPU tensors
    device=cpu
    tests=(tests/test_default_backend.py)
    triton_select=(-k "agrees_with_the_reference_backend_in_float32 and decodes")
    bench_args=(memory --memory-requests 100)
    bench_flags=(--dry-run)
    echo "gpu_check: DRY RUN on the CPU (Triton's interpreter, tiny shapes): these files prove the" \
         "script, they are not GPU results" | tee "$out/dry-run.txt"
else
    unset TRITON_INTERPRET        # the kernel must be compiled for the GPU, not interpreted
    device=cuda
    tests=(tests)
    triton_select=()
    bench_args=(all)
    bench_flags=()
fi

nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
if [ "$dry_run" = 0 ] && ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device here (torch.cuda.is_available() is False): run it on a machine" \
         "with an NVIDIA GPU and a CUDA build of torch, or run it with --dry-run" | tee "$out/summary.txt" >&2
    exit 1
fi
"$py" -c "import sys, torch; print(torch.__version__, torch.cuda.get_device_name() if sys.argv[1] == 'cuda' \
else 'cpu (dry run)')" "$device" | tee "$out/device.txt"

MINILLM_DEVICE=$device "$py" -m pytest -q -p no:cacheprovider "${tests[@]}" 2>&1 | tee "$out/tests.txt"
tests_rc=${PIPESTATUS[0]}

# Chapter 9's kernel on its own: its correctness tests (compiled, input_precision="ieee"
# for float32), which must run here rather than skip, then the timings.
MINILLM_DEVICE=$device "$py" -m pytest -q -rs -p no:cacheprovider tests/test_triton_attention.py \
    "${triton_select[@]}" 2>&1 | tee "$out/triton-tests.txt"
triton_rc=${PIPESTATUS[0]}
if grep -q "SKIPPED" "$out/triton-tests.txt"; then
    echo "gpu_check: the triton tests skipped on a $device machine (see $out/triton-tests.txt)" >&2
    triton_rc=1
fi
"$py" tools/gpu_check_bench.py "$out" "${bench_flags[@]}" 2>&1 | tee "$out/triton-bench.txt"
triton_bench_rc=${PIPESTATUS[0]}

MINILLM_DEVICE=$device "$py" -m minillm bench "${bench_args[@]}" --out "$out" 2>&1 | tee "$out/bench.txt"
bench_rc=${PIPESTATUS[0]}
echo "tests rc=$tests_rc triton tests rc=$triton_rc triton bench rc=$triton_bench_rc bench rc=$bench_rc" \
     "dry run=$dry_run" | tee "$out/summary.txt"
[ "$tests_rc" = 0 ] && [ "$triton_rc" = 0 ] && [ "$triton_bench_rc" = 0 ] && [ "$bench_rc" = 0 ]
