"""kernels/triton_attention.py: one Triton launch per layer for a whole packed step.

Without a GPU these run in triton's interpreter on CPU tensors (the module
turns it on before importing triton when there is no CUDA device); on a CUDA
machine, in a process without TRITON_INTERPRET, on the GPU (`make gpu-check`).

Precision: on a GPU the kernel asks tl.dot for input_precision="ieee"
(exact float32 products) rather than the default TF32 (10 mantissa bits,
~1e-3 relative), so one float32 tolerance holds on both: 1e-5 absolute on
outputs of size ~1. The float32 kernel and the float32 reference backend each
round D-term dot products and exps (~1e-7 relative per operation; measured
differences ~1e-6 at head_dim 128); a wrong mask, a wrong block or a lost
rescale moves outputs by ~1e-1, so 1e-5 leaves room for rounding and none
for a bug.
"""
import importlib.util
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

import minillm
from minillm import LLMEngine, SamplingParams, SchedulerConfig, attention
from minillm.attention import AttentionBatch, paged_attention, reference_attention, write_kv
from minillm.kernels import triton_attention as ta
from minillm.kv_cache import BlockManager

if not ta.triton_available():
    pytest.skip(ta.TRITON_IMPORT_ERROR, allow_module_level=True)
DEVICE = "cpu" if ta.INTERPRETED else "cuda"
if ta.why_unavailable(DEVICE):
    pytest.skip(ta.why_unavailable(DEVICE), allow_module_level=True)
ATOL_FLOAT32 = 1e-5


def _packed_step(query_lens, cached_lens, block_size=16, num_heads=4, num_kv_heads=2, head_dim=32,
                 seed=0, dtype=torch.float32, spare_blocks=2):
    """A packed step over a paged cache whose requests' blocks are interleaved
    (handed out round-robin, so no request's blocks are consecutive), its new
    K/V already written. Returns (q, k_cache, v_cache, batch)."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in zip(cached_lens, query_lens)]
    manager = BlockManager(sum(-(-s // block_size) for s in seq_lens) + spare_blocks + 1, block_size)
    manager.allocate("pad", block_size)                    # tables do not start at block 0
    for size in range(block_size, max(seq_lens) + block_size, block_size):
        for b, seq_len in enumerate(seq_lens):
            manager.allocate(b, min(size, seq_len))
    shape = (manager.num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=g).to(dtype)
    v_cache = torch.randn(shape, generator=g).to(dtype)
    q = torch.randn(sum(query_lens), num_heads, head_dim, generator=g).to(dtype)
    slots = [s for b, (n, c) in enumerate(zip(query_lens, cached_lens)) for s in manager.slot_mapping(b, c, c + n)]
    batch = AttentionBatch(query_lens=list(query_lens), cached_lens=list(cached_lens),
                           block_tables=[list(manager.block_tables[b]) for b in range(len(query_lens))],
                           block_size=block_size, slot_mapping=torch.tensor(slots, dtype=torch.long))
    return q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), batch


def _reference(q, k_cache, v_cache, batch):
    """The reference backend's answer on the same cache (its K/V write is a no-op rewrite)."""
    rows = batch.slot_mapping.to(k_cache.device)
    flat_k, flat_v = k_cache.view(-1, *k_cache.shape[2:]), v_cache.view(-1, *v_cache.shape[2:])
    return paged_attention(q, flat_k[rows], flat_v[rows], k_cache.clone(), v_cache.clone(), batch,
                           backend="reference")


# Each case: (query_lens, cached_lens, block_size, num_heads, num_kv_heads, head_dim).
# Together: GQA ratios 1, 2, 4, 8; head_dim 32, 64, 128; block sizes 16 and 32;
# decode-only, prefill-only and mixed steps; chunks that start mid-block.
CASES = {
    "prefill only, MHA": ([37], [0], 16, 4, 4, 32),
    "chunk mid-block, GQA 2": ([21], [13], 16, 4, 2, 64),
    "decodes only, GQA 4": ([1, 1, 1], [0, 15, 47], 16, 8, 2, 64),
    "mixed, GQA 8, d=128": ([9, 1, 17, 1], [0, 33, 5, 2], 32, 8, 1, 128),
    "mixed, blocks of 32": ([40, 1, 3], [7, 64, 31], 32, 4, 2, 32),
    "long chunk over a long prefix": ([70], [50], 16, 2, 1, 64),
    "prefix-cached prompt (whole blocks cached)": ([5, 1], [32, 9], 16, 4, 2, 128),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_one_launch_agrees_with_the_reference_backend_in_float32(case):
    query_lens, cached_lens, block_size, num_heads, num_kv_heads, head_dim = case
    q, k_cache, v_cache, batch = _packed_step(query_lens, cached_lens, block_size, num_heads, num_kv_heads, head_dim)
    expected = _reference(q, k_cache, v_cache, batch)
    out = ta.triton_paged_attention(q, k_cache, v_cache, batch)
    torch.testing.assert_close(out, expected, atol=ATOL_FLOAT32, rtol=0)


def test_block_sizes_below_a_tile_and_not_powers_of_two_are_padded_and_masked():
    for block_size in (3, 4):
        q, k_cache, v_cache, batch = _packed_step([6, 1], [5, 4], block_size, 2, 1, 8)
        torch.testing.assert_close(ta.triton_paged_attention(q, k_cache, v_cache, batch),
                                   _reference(q, k_cache, v_cache, batch), atol=ATOL_FLOAT32, rtol=0)


def test_bfloat16_inputs_are_cast_before_tl_dot():
    """triton #11584: the interpreter's tl.dot on bfloat16 multiplies raw bits
    (~1e10 for inputs near 1). Cast, the output is the float32 answer rounded to
    bfloat16 (8 mantissa bits: ~4e-3 relative)."""
    q, k_cache, v_cache, batch = _packed_step([9, 1], [7, 20], 16, 4, 2, 32, dtype=torch.bfloat16)
    expected = _reference(q.float(), k_cache.float(), v_cache.float(), batch)
    out = ta.triton_paged_attention(q, k_cache, v_cache, batch)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=0)


def _poisoned_step(module=ta):
    """A step whose every byte the kernel must not read is NaN: the unused blocks,
    each request's slots past its end, q's and out's rows past the step. Returns
    (out, out buffer past the step) after one launch of module's kernel."""
    q, k_cache, v_cache, batch = _packed_step([5, 1, 3], [11, 6, 0], 16, 4, 2, 32, spare_blocks=3)
    clean = _reference(q, k_cache, v_cache, batch)
    used = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    for table, seq_len in zip(batch.block_tables, batch.seq_lens):
        for p in range(seq_len):
            used[table[p // 16], p % 16] = True
    k_cache[~used.to(DEVICE)] = float("nan")
    v_cache[~used.to(DEVICE)] = float("nan")
    q_buffer = torch.full((q.shape[0] + 64, *q.shape[1:]), float("nan"), device=DEVICE)
    q_buffer[:q.shape[0]] = q
    out_buffer = torch.full_like(q_buffer, 7.0)
    module.triton_paged_attention(q_buffer[:q.shape[0]], k_cache, v_cache, batch, out=out_buffer[:q.shape[0]])
    return out_buffer[:q.shape[0]], out_buffer[q.shape[0]:], clean


def test_every_load_and_store_is_masked_nothing_past_an_end_is_read_or_written():
    """The interpreter does not check bounds: an unmasked load reads whatever lies
    past the end. Here that is NaN, so it would show in the output."""
    out, past_the_end, clean = _poisoned_step()
    torch.testing.assert_close(out, clean, atol=ATOL_FLOAT32, rtol=0)
    assert bool((past_the_end == 7.0).all()), "the kernel wrote rows past the step's end"


@pytest.mark.skipif(not ta.INTERPRETED, reason="mutates the kernel's source: interpreter only (cheap, no compile)")
def test_the_poisoned_step_catches_a_kernel_with_a_load_mask_removed(tmp_path):
    """The test above would fail if the V load had lost its mask: a copy of the
    module with that one mask removed puts NaN in the output."""
    source = Path(ta.__file__).read_text()
    unmasked = "v = tl.load(v_cache_ptr + block * stride_v_block + v_offsets, mask=kv_mask, other=0.0)"
    assert unmasked in source
    path = tmp_path / "triton_attention_unmasked.py"
    path.write_text(source.replace(unmasked, unmasked.replace(", mask=kv_mask, other=0.0", "")))
    spec = importlib.util.spec_from_file_location("triton_attention_unmasked", path)
    mutant = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mutant
    try:
        spec.loader.exec_module(mutant)
        out, _, _ = _poisoned_step(mutant)
    finally:
        del sys.modules[spec.name]
    assert bool(out.isnan().any()), "a V load without its mask went unnoticed"


def test_tiles_past_the_diagonal_are_skipped_and_only_diagonal_tiles_are_masked():
    """ta.key_tiles is the kernel's tile arithmetic in Python: checked against the mask itself."""
    block_size = 16
    for cached in (0, 5, 16, 40):
        for n in (1, 7, 16, 33):
            for first_row in range(0, n, 8):
                rows = min(8, n - first_row)
                unmasked, total = ta.key_tiles(cached, first_row, rows, block_size)
                positions = range(cached + first_row, cached + first_row + rows)
                for j in range(-(-(cached + n) // block_size)):
                    keys = range(j * block_size, (j + 1) * block_size)
                    seen = [[k <= p for k in keys] for p in positions]
                    if j < unmasked:
                        assert all(map(all, seen)), (cached, n, first_row, j)      # needs no mask
                    elif j < total:
                        assert not all(map(all, seen)) and any(map(any, seen))      # the diagonal
                    else:
                        assert not any(map(any, seen))                              # skipped


def test_plan_tiles_gives_a_decode_one_tile_and_a_chunk_as_many_as_its_rows_need():
    requests, first_rows = ta.plan_tiles([1, 40, 1, 16], group=4, block_m=64)
    assert requests == [0, 1, 1, 1, 2, 3]
    assert first_rows == [0, 0, 16, 32, 0, 0]


def test_float64_and_bad_precision_are_refused_with_value_errors_naming_them():
    q, k_cache, v_cache, batch = _packed_step([2], [3])
    with pytest.raises(ValueError, match="dtype=torch.float64"):
        ta.triton_paged_attention(q.double(), k_cache.double(), v_cache.double(), batch)
    with pytest.raises(ValueError, match="precision='fast'"):
        ta.triton_paged_attention(q, k_cache, v_cache, batch, precision="fast")


def test_triton_is_a_backend_and_the_default_on_cuda_only_where_triton_is_installed():
    assert "triton" in attention.BACKENDS
    assert attention.default_backend("cpu") == "sdpa"
    assert attention.default_backend("cuda") == "triton"
    with mock.patch.object(importlib.util, "find_spec", return_value=None):
        assert attention.default_backend("cuda") == "sdpa"


# ---- the engine with backend="triton" -------------------------------------------
def _greedy(model, prompts, backend, max_tokens, chunk_size=24, **engine_kwargs):
    # A small pool: the interpreter copies the whole pool's storage back after every launch.
    engine = LLMEngine(model, SchedulerConfig(policy="chunked", chunk_size=chunk_size, max_num_seqs=4),
                       block_size=16, num_blocks=16, backend=backend, **engine_kwargs)
    outs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    return [o.output_token_ids for o in outs], engine


def test_engine_greedy_tokens_equal_the_reference_backends_on_tiny_with_one_launch_per_layer(monkeypatch):
    model = minillm.build_model("tiny", seed=0, dtype=torch.float32, device=DEVICE)
    rng = torch.Generator().manual_seed(1)
    system = torch.randint(0, 512, (35,), generator=rng).tolist()
    # chunk_size 24 with blocks of 16: chunks start mid-block; the shared system
    # prompt is served from the prefix cache (whole cached blocks, then a chunk).
    prompts = [system + [7, 8, 9], torch.randint(0, 512, (5,), generator=rng).tolist(), system + [1, 2]]
    expected, _ = _greedy(model, prompts, "reference", 4, enable_prefix_caching=True)
    launches = []
    kernel = ta.attention_tile_kernel

    class CountingKernel:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]

    monkeypatch.setattr(ta, "attention_tile_kernel", CountingKernel())
    got, engine = _greedy(model, prompts, "triton", 4, enable_prefix_caching=True)
    assert got == expected
    assert len(launches) == model.cfg.num_layers * len(engine.trace)      # one launch per layer per step
    steps = [[n for _, n in step.scheduled] for step in engine.trace]
    assert any(1 in lens and max(lens) > 1 for lens in steps), f"no step mixed a chunk with decodes: {steps}"


def test_engine_greedy_tokens_equal_the_reference_backends_on_smollm2():
    try:
        model, tok = minillm.pretrained("smollm2-135m-instruct", device=DEVICE)
    except (FileNotFoundError, ImportError, ValueError) as e:
        pytest.skip(f"SmolLM2-135M is not installed here ({e})")
    prompts = [tok.encode("The capital of France is")]
    # Short, as the interpreter is slow (30 layers x 3 steps = 90 launches): chunks of 3
    # tokens, so the second chunk starts mid-block over a cache, then one decode.
    expected, _ = _greedy(model, prompts, "reference", 2, chunk_size=3)
    got, engine = _greedy(model, prompts, "triton", 2, chunk_size=3)
    assert got == expected
    assert [step.scheduled[0][1] for step in engine.trace] == [3, 2, 1]


def test_without_triton_or_with_the_wrong_mode_the_backend_refuses_and_says_why(monkeypatch):
    q, k_cache, v_cache, batch = _packed_step([2], [3])
    monkeypatch.setattr(ta, "INTERPRETED", DEVICE == "cuda")     # the other mode than this process's
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        ta.triton_paged_attention(q, k_cache, v_cache, batch)
    monkeypatch.setattr(ta, "triton", None)
    monkeypatch.setattr(ta, "TRITON_IMPORT_ERROR", "triton is not importable here (no wheel)")
    assert not ta.triton_available()
    with pytest.raises(ValueError, match="backend='triton': triton is not importable here"):
        paged_attention(q, q[:, :2], q[:, :2], k_cache, v_cache, batch, backend="triton")
