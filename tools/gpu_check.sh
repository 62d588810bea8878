#!/usr/bin/env bash
# The CUDA checks in one script (make gpu-check): the tests with the engine on
# the GPU, chapter 9's Triton kernel (its tests compiled for the GPU, then timed
# against flash-attn's varlen kernel and the sdpa split path), then the
# benchmarks; everything lands in the folder given ($1).
set -uo pipefail
out=${1:-gpu-results}
mkdir -p "$out"
py=${PY:-.venv/bin/python}
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
unset TRITON_INTERPRET        # the kernel must be compiled for the GPU, not interpreted
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
if ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device here (torch.cuda.is_available() is False): run it on a machine" \
         "with an NVIDIA GPU and a CUDA build of torch" | tee "$out/summary.txt" >&2
    exit 1
fi
"$py" -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" | tee "$out/device.txt"

MINILLM_DEVICE=cuda "$py" -m pytest -q tests 2>&1 | tee "$out/tests.txt"
tests_rc=${PIPESTATUS[0]}

# Chapter 9's kernel on its own: its correctness tests (compiled, input_precision="ieee"
# for float32), which must run here rather than skip, then the timings.
MINILLM_DEVICE=cuda "$py" -m pytest -q -rs tests/test_triton_attention.py 2>&1 | tee "$out/triton-tests.txt"
triton_rc=${PIPESTATUS[0]}
if grep -q "SKIPPED" "$out/triton-tests.txt"; then
    echo "gpu_check: the triton tests skipped on a CUDA machine (see $out/triton-tests.txt)" >&2
    triton_rc=1
fi
"$py" - "$out" <<'EOF' 2>&1 | tee "$out/triton-bench.txt"
"""One layer of Llama-3-8B's attention (32 query heads, 8 KV heads, head_dim 128,
bfloat16) over a paged cache, per backend, as the engine calls it (paged_attention:
the new K/V written, then attention). Median of 20 CUDA-event timings after 3 warm-ups;
each backend at a block size it takes (flash-attn's paged KV needs multiples of 256)."""
import json
import statistics
import sys
from pathlib import Path

import torch

from minillm.attention import AttentionBatch, flash_available, paged_attention
from minillm.kv_cache import BlockManager

out_dir = Path(sys.argv[1])
HQ, HKV, D, DTYPE = 32, 8, 128, torch.bfloat16
STEPS = {
    "mixed: a 512-token chunk over 4096 cached + 32 decodes over 1024-4000":
        ([512] + [1] * 32, [4096] + [1024 + 96 * i for i in range(32)]),
    "decodes only: 64 over 2048 cached": ([1] * 64, [2048] * 64),
    "prefill only: one 2048-token prompt": ([2048], [0]),
}
BACKENDS = [("triton", 16), ("sdpa", 16)] + ([("flash", 256)] if flash_available() else [])


def make_step(query_lens, cached_lens, block_size, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    seq_lens = [c + n for c, n in zip(cached_lens, query_lens)]
    manager = BlockManager(sum(-(-s // block_size) for s in seq_lens) + 1, block_size)
    for b, seq_len in enumerate(seq_lens):
        manager.allocate(b, seq_len)
    shape = (manager.num_blocks, block_size, HKV, D)
    k_cache = torch.randn(shape, generator=gen, device="cuda", dtype=DTYPE)
    v_cache = torch.randn(shape, generator=gen, device="cuda", dtype=DTYPE)
    num_tokens = sum(query_lens)
    q = torch.randn(num_tokens, HQ, D, generator=gen, device="cuda", dtype=DTYPE)
    k_new = torch.randn(num_tokens, HKV, D, generator=gen, device="cuda", dtype=DTYPE)
    v_new = torch.randn(num_tokens, HKV, D, generator=gen, device="cuda", dtype=DTYPE)
    slots = [s for b, (n, c) in enumerate(zip(query_lens, cached_lens)) for s in manager.slot_mapping(b, c, c + n)]
    batch = AttentionBatch(list(query_lens), list(cached_lens), [manager.block_tables[b] for b in range(len(seq_lens))],
                           block_size, torch.tensor(slots, device="cuda"))
    return q, k_new, v_new, k_cache, v_cache, batch


def median_ms(fn, repeats=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "steps": {}}
print(f"{results['device']}, torch {results['torch']}; Llama-3-8B attention, one layer, bfloat16")
for name, (query_lens, cached_lens) in STEPS.items():
    row = {}
    for backend, block_size in BACKENDS:
        args = make_step(query_lens, cached_lens, block_size)
        row[f"{backend} (block {block_size})"] = median_ms(lambda: paged_attention(*args, backend=backend))
    # The same step for the reference backend and the kernel: how far apart in bfloat16.
    args = make_step(query_lens, cached_lens, 16)
    expected = paged_attention(*args[:3], args[3].clone(), args[4].clone(), args[5], backend="reference")
    got = paged_attention(*args, backend="triton")
    row["triton vs reference, max |error|"] = (got.float() - expected.float()).abs().max().item()
    results["steps"][name] = row
    print(name)
    for key, value in row.items():
        print(f"    {key:36s} " + (f"{value:.2e}" if "error" in key else f"{value:8.3f} ms"))
(out_dir / "triton-bench.json").write_text(json.dumps(results, indent=2))
EOF
triton_bench_rc=${PIPESTATUS[0]}

MINILLM_DEVICE=cuda "$py" -m minillm bench all --out "$out" 2>&1 | tee "$out/bench.txt"
bench_rc=${PIPESTATUS[0]}
echo "tests rc=$tests_rc triton tests rc=$triton_rc triton bench rc=$triton_bench_rc bench rc=$bench_rc" \
    | tee "$out/summary.txt"
[ "$tests_rc" = 0 ] && [ "$triton_rc" = 0 ] && [ "$triton_bench_rc" = 0 ] && [ "$bench_rc" = 0 ]
