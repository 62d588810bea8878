"""`make gpu-check`'s kernel timings: one attention layer, per backend, as the engine calls it.

    python tools/gpu_check_bench.py OUT_DIR            # on a CUDA GPU (tools/gpu_check.sh runs it)
    python tools/gpu_check_bench.py OUT_DIR --dry-run  # on the CPU: Triton's interpreter, tiny shapes

On a GPU: Llama-3-8B's attention (32 query heads, 8 KV heads, head_dim 128, bfloat16)
over a paged cache, each backend at a block size it takes (flash-attn's paged KV needs
multiples of 256), the Triton kernel with each key tile (16, 32, 64) and with split-KV
off; median of 20 CUDA-event timings after 3 warm-ups; and how far the kernel is from
the reference backend on the same step. The dry run takes the same code path with
shapes small enough for the interpreter and one wall-clock timing each: it proves
the script, not the speed. Writes OUT_DIR/triton-bench.json.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from minillm.kernels import triton_attention as ta   # first: it picks the interpreter where there is no GPU
from minillm.attention import AttentionBatch, flash_available, paged_attention, write_kv
from minillm.kv_cache import BlockManager

GPU = dict(heads=(32, 8, 128), dtype=torch.bfloat16, repeats=20, steps={
    "mixed: a 512-token chunk over 4096 cached + 32 decodes over 1024-4000":
        ([512] + [1] * 32, [4096] + [1024 + 96 * i for i in range(32)]),
    "decodes only: 64 over 2048 cached": ([1] * 64, [2048] * 64),
    "decodes only: 4 over 8192 cached (split-KV: 32 programs before the split)": ([1] * 4, [8192] * 4),
    "prefill only: one 2048-token prompt": ([2048], [0]),
})
DRY_RUN = dict(heads=(4, 2, 32), dtype=torch.bfloat16, repeats=1, steps={
    "mixed: a 20-token chunk over 40 cached + 2 decodes": ([20, 1, 1], [40, 30, 50]),
    "decodes only: 1 over 520 cached (split-KV)": ([1], [520]),
})


def make_step(query_lens, cached_lens, block_size, heads, dtype, device, seed=0):
    """q, k_new, v_new, k_cache, v_cache, batch: the engine's arguments for one layer."""
    num_heads, num_kv_heads, head_dim = heads
    gen = torch.Generator(device=device).manual_seed(seed)
    seq_lens = [c + n for c, n in zip(cached_lens, query_lens)]
    manager = BlockManager(sum(-(-s // block_size) for s in seq_lens) + 1, block_size)
    for b, seq_len in enumerate(seq_lens):
        manager.allocate(b, seq_len)
    randn = lambda *shape: torch.randn(*shape, generator=gen, device=device, dtype=dtype)  # noqa: E731
    k_cache = randn(manager.num_blocks, block_size, num_kv_heads, head_dim)
    v_cache = randn(manager.num_blocks, block_size, num_kv_heads, head_dim)
    num_tokens = sum(query_lens)
    q, k_new, v_new = randn(num_tokens, num_heads, head_dim), randn(num_tokens, num_kv_heads, head_dim), \
        randn(num_tokens, num_kv_heads, head_dim)
    slots = [s for b, (n, c) in enumerate(zip(query_lens, cached_lens)) for s in manager.slot_mapping(b, c, c + n)]
    batch = AttentionBatch(list(query_lens), list(cached_lens), [manager.block_tables[b] for b in range(len(seq_lens))],
                           block_size, torch.tensor(slots, device=device))
    return q, k_new, v_new, k_cache, v_cache, batch


def triton_layer(q, k_new, v_new, k_cache, v_cache, batch, **kernel_args):
    """What paged_attention(backend="triton") does, with the kernel's own arguments."""
    write_kv(k_cache, v_cache, k_new, v_new, batch.slot_mapping)
    return ta.triton_paged_attention(q, k_cache, v_cache, batch, **kernel_args)


def median_ms(fn, repeats: int, on_gpu: bool) -> float:
    for _ in range(3 if on_gpu else 0):          # warm-ups: compiled kernels, caches, clocks
        fn()
    times = []
    for _ in range(repeats):
        if on_gpu:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def variants(on_gpu: bool):
    """(name, block size, layer function) for each timed variant."""
    rows = [(f"triton tile_n={tile_n} (block 16)", 16,
             lambda *a, tile_n=tile_n: triton_layer(*a, tile_n=tile_n)) for tile_n in ta.TILE_N_CHOICES]
    rows.append(("triton tile_n=32 (block 256)", 256, lambda *a: triton_layer(*a)))
    rows.append(("triton, split-KV off (block 16)", 16, lambda *a: triton_layer(*a, num_kv_splits=1)))
    rows.append(("sdpa (block 16)", 16, lambda *a: paged_attention(*a, backend="sdpa")))
    if on_gpu and flash_available():
        rows.append(("flash (block 256)", 256, lambda *a: paged_attention(*a, backend="flash")))
    return rows


def main(argv: list[str]) -> int:
    dry_run = "--dry-run" in argv
    out_dir = Path(next(a for a in argv if not a.startswith("--")))
    config = DRY_RUN if dry_run else GPU
    device = "cpu" if dry_run else "cuda"
    on_gpu = device == "cuda"
    heads, dtype = config["heads"], config["dtype"]
    name = "cpu (dry run: Triton's interpreter)" if dry_run else torch.cuda.get_device_name()
    results = {"device": name, "dry_run": dry_run, "torch": torch.__version__, "triton": ta.triton.__version__,
               "heads": heads, "dtype": str(dtype), "steps": {}}
    print(f"{name}, torch {results['torch']}, triton {results['triton']}; attention of one layer, "
          f"{heads[0]} query heads / {heads[1]} KV heads, head_dim {heads[2]}, {dtype}")
    for step_name, (query_lens, cached_lens) in config["steps"].items():
        row = {}
        for label, block_size, layer in variants(on_gpu):
            args = make_step(query_lens, cached_lens, block_size, heads, dtype, device)
            row[f"{label} ms"] = median_ms(lambda: layer(*args), config["repeats"], on_gpu)
        # The kernel against the reference backend on float32 copies of the same step: its
        # output in this dtype should be the exact answer rounded (bf16: ~4e-3 relative).
        q, k_new, v_new, k_cache, v_cache, batch = make_step(query_lens, cached_lens, 16, heads, dtype, device)
        expected = paged_attention(q.float(), k_new.float(), v_new.float(), k_cache.float(), v_cache.float(),
                                   batch, backend="reference")
        got = triton_layer(q, k_new, v_new, k_cache, v_cache, batch)
        row["triton vs reference, max |error|"] = (got.float() - expected).abs().max().item()
        results["steps"][step_name] = row
        print(step_name)
        for key, value in row.items():
            print(f"    {key:40s} " + (f"{value:.2e}" if "error" in key else f"{value:9.3f}"))
    (out_dir / "triton-bench.json").write_text(json.dumps(results, indent=2))
    worst = max(row["triton vs reference, max |error|"] for row in results["steps"].values())
    if not worst < 2e-2:       # bf16 outputs of size ~1 round at ~4e-3; a wrong mask moves them by ~1e-1
        print(f"gpu_check_bench: the kernel is {worst:.2e} from the reference backend", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
