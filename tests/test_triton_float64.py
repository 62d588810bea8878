"""The Triton kernel against float64: the claim the README and docs/benchmarks.md section 12 make.

The kernel runs in float32 (it refuses float64). Its error against the exact answer is
measured here against the reference backend run in float64 on the same inputs, through
the public entry point only (`paged_attention(..., backend="triton")`), so it holds
whatever the kernel's internals become. Two packed steps over a paged cache whose blocks
are interleaved: a mixed step (a chunk starting mid-block over a cached prefix, beside
decodes, GQA) and a prefill beside a long-context decode at head_dim 128.

The bound: float32 rounds each of a row's D-term dot products, exps and sums (~6e-8
relative per operation); over a few hundred keys of outputs of size ~1 that leaves errors
of a few 1e-7, and the float32 reference backend lands there too. A wrong mask, block or
rescale moves outputs by ~1e-1. So: within 1e-6 of float64, and within 4x the float32
reference backend's own distance from float64 (the kernel is no sloppier than the
reference). In Triton's interpreter on a CPU, a few seconds.
"""
import importlib.util

import pytest
import torch

from minillm.attention import AttentionBatch, paged_attention

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (it installs with the project on Linux x86_64)",
                allow_module_level=True)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
WITHIN_OF_FLOAT64 = 1e-6      # quoted by the README and docs/benchmarks.md section 12

# (query_lens, cached_lens, block_size, num_heads, num_kv_heads, head_dim)
STEPS = {
    "mixed: chunk mid-block over a prefix, two decodes, GQA 2": ([23, 1, 1], [13, 40, 7], 16, 4, 2, 64),
    "prefill beside a long decode, head_dim 128, GQA 4": ([48, 1], [0, 300], 16, 8, 2, 128),
}


def _packed_step(query_lens, cached_lens, block_size, num_heads, num_kv_heads, head_dim, seed=0):
    """float64 tensors of one packed step over a paged cache whose requests' blocks are
    handed out round-robin (no request's blocks consecutive), block 0 unused; the new K/V
    of the step as k_new, v_new (paged_attention writes them). Returns (q, k_new, v_new,
    k_cache, v_cache, batch)."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in zip(cached_lens, query_lens)]
    tables, next_block = [[] for _ in seq_lens], 1
    for i in range(max(-(-s // block_size) for s in seq_lens)):
        for b, s in enumerate(seq_lens):
            if i * block_size < s:
                tables[b].append(next_block)
                next_block += 1
    shape = (next_block + 1, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=g, dtype=torch.float64)
    v_cache = torch.randn(shape, generator=g, dtype=torch.float64)
    num_tokens = sum(query_lens)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=g, dtype=torch.float64)
    k_new = torch.randn(num_tokens, num_kv_heads, head_dim, generator=g, dtype=torch.float64)
    v_new = torch.randn(num_tokens, num_kv_heads, head_dim, generator=g, dtype=torch.float64)
    slots = [tables[b][pos // block_size] * block_size + pos % block_size
             for b, (n, c) in enumerate(zip(query_lens, cached_lens)) for pos in range(c, c + n)]
    batch = AttentionBatch(query_lens=list(query_lens), cached_lens=list(cached_lens), block_tables=tables,
                           block_size=block_size, slot_mapping=torch.tensor(slots, dtype=torch.long))
    return q, k_new, v_new, k_cache, v_cache, batch


def _attend(step, backend, dtype, device):
    """paged_attention on copies of the step's tensors in dtype, on device (the cache is written)."""
    q, k_new, v_new, k_cache, v_cache, batch = step
    moved = [t.to(device=device, dtype=dtype) for t in (q, k_new, v_new, k_cache, v_cache)]
    batch = AttentionBatch(batch.query_lens, batch.cached_lens, batch.block_tables, batch.block_size,
                           batch.slot_mapping.to(device))
    return paged_attention(*moved, batch, backend=backend).to("cpu", torch.float64)


@pytest.mark.parametrize("case", STEPS.values(), ids=STEPS.keys())
def test_the_triton_kernel_is_within_1e_6_of_float64(case):
    step = _packed_step(*case)
    exact = _attend(step, "reference", torch.float64, "cpu")
    triton_error = (_attend(step, "triton", torch.float32, DEVICE) - exact).abs().max().item()
    reference_error = (_attend(step, "reference", torch.float32, "cpu") - exact).abs().max().item()
    print(f"max |error| against float64: triton {triton_error:.2e}, float32 reference {reference_error:.2e}")
    assert triton_error < WITHIN_OF_FLOAT64
    assert triton_error < 4 * reference_error + 1e-7


def test_a_wrong_answer_would_fail_the_bound():
    """The bound can fail: the same step with one cached key moved (a stand-in for a wrong
    block or mask) is far outside it."""
    step = _packed_step(*next(iter(STEPS.values())))
    exact = _attend(step, "reference", torch.float64, "cpu")
    q, k_new, v_new, k_cache, v_cache, batch = step
    k_cache = k_cache.clone()
    k_cache[batch.block_tables[0][0], 3] += 1.0                  # one key of the chunk's cached prefix
    moved = _attend((q, k_new, v_new, k_cache, v_cache, batch), "triton", torch.float32, DEVICE)
    assert (moved - exact).abs().max().item() > 100 * WITHIN_OF_FLOAT64
