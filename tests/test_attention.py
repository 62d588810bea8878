"""attention.py: masks, the reference, the merge, and every backend against float64."""
import contextlib
import math
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from minillm import attention, kernels
from minillm.attention import (AttentionBatch, causal_mask, gather_kv, merge_attention, split_decodes,
                               paged_attention, reference_attention, sdpa_attention, write_kv)
from minillm.kv_cache import BlockManager


# Decodes take the compiled paged kernel where it is built, else the gather
# into torch's fused kernel: the tests below hold both to the reference.
DECODE_PATHS = ["paged kernel", "gather"]


def _decode_path(name: str):
    """A context in which decodes take the named path (skips if it cannot)."""
    if name == "gather":
        return mock.patch.object(kernels, "paged_decode_available", return_value=False)
    if not kernels.paged_decode_available():
        pytest.skip("the CPU paged-decode kernel is not built (python -m minillm.kernels build)")
    return contextlib.nullcontext()


def _qkv(n, m, num_heads=4, num_kv_heads=2, head_dim=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, num_heads, head_dim, generator=g, dtype=dtype)
    k = torch.randn(m, num_kv_heads, head_dim, generator=g, dtype=dtype)
    v = torch.randn(m, num_kv_heads, head_dim, generator=g, dtype=dtype)
    return q, k, v


def _loop_attention(q, k, v):
    """The definition, one query and one head at a time: query i sits at m - n + i."""
    n, num_heads, head_dim = q.shape
    m, num_kv_heads, _ = k.shape
    out = torch.zeros_like(q)
    for h in range(num_heads):
        kv_head = h // (num_heads // num_kv_heads)
        for i in range(n):
            visible = m - n + i + 1
            scores = k[:visible, kv_head] @ q[i, h] / math.sqrt(head_dim)
            out[i, h] = torch.softmax(scores, 0) @ v[:visible, kv_head]
    return out


# ---- masks -------------------------------------------------------------------
def test_bottom_right_mask_lets_a_chunk_see_its_whole_prefix():
    mask = causal_mask(2, 5)
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_top_left_mask_hides_the_prefix_from_a_chunk():
    mask = causal_mask(2, 5, align="top_left")
    assert mask.tolist() == [[True, False, False, False, False], [True, True, False, False, False]]


def test_square_masks_are_the_same_for_both_alignments():
    assert torch.equal(causal_mask(6, 6), causal_mask(6, 6, align="top_left"))


def test_bad_mask_arguments_are_value_errors_naming_them():
    with pytest.raises(ValueError, match="align="):
        causal_mask(2, 3, align="diagonal")
    with pytest.raises(ValueError, match="q_len=-1"):
        causal_mask(-1, 3)


def test_torch_sdpa_is_causal_is_top_left_for_a_chunk():
    # The trap the book teaches: if torch ever changes this, chapter 1 must too.
    q, k, v = _qkv(3, 7, num_heads=2, num_kv_heads=2)
    qh, kh, vh = (x.transpose(0, 1) for x in (q, k, v))
    top_left = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True).transpose(0, 1)
    torch.testing.assert_close(top_left, reference_attention(q, k, v, align="top_left"))
    assert not torch.allclose(top_left, _loop_attention(q, k, v))


def test_causal_lower_right_is_the_bottom_right_fix():
    from torch.nn.attention.bias import causal_lower_right
    q, k, v = _qkv(3, 7, num_heads=2, num_kv_heads=2)
    qh, kh, vh = (x.transpose(0, 1)[None] for x in (q, k, v))
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=causal_lower_right(3, 7))
    torch.testing.assert_close(out[0].transpose(0, 1), _loop_attention(q, k, v))


# ---- single sequence ---------------------------------------------------------
@pytest.mark.parametrize("n,m", [(1, 1), (5, 5), (1, 9), (4, 11)])
def test_reference_attention_is_the_definition(n, m):
    q, k, v = _qkv(n, m)
    torch.testing.assert_close(reference_attention(q, k, v), _loop_attention(q, k, v),
                               atol=1e-12, rtol=0)


def test_reference_attention_without_mask_sees_every_key():
    q, k, v = _qkv(3, 3, num_heads=2, num_kv_heads=2)
    out = reference_attention(q, k, v, causal=False)
    # The first query now sees the future, so it must differ from causal attention.
    assert not torch.allclose(out[0], reference_attention(q, k, v)[0])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 12), extra=st.integers(0, 20), group=st.sampled_from([1, 2, 4]),
       num_kv_heads=st.sampled_from([1, 2]), seed=st.integers(0, 10**6))
def test_sdpa_attention_agrees_with_float64_reference_on_random_shapes(n, extra, group, num_kv_heads, seed):
    q, k, v = _qkv(n, n + extra, num_heads=group * num_kv_heads, num_kv_heads=num_kv_heads, seed=seed)
    torch.testing.assert_close(sdpa_attention(q, k, v), reference_attention(q, k, v),
                               atol=1e-10, rtol=0)


def test_sdpa_attention_in_float32_agrees_with_float64_reference():
    q, k, v = _qkv(6, 20, num_heads=8, num_kv_heads=2)
    out = sdpa_attention(q.float(), k.float(), v.float())
    torch.testing.assert_close(out.double(), reference_attention(q, k, v), atol=1e-5, rtol=0)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 8), m_a=st.integers(1, 10), m_b=st.integers(1, 10), seed=st.integers(0, 10**6))
def test_merging_two_partial_attentions_equals_attention_over_the_union(n, m_a, m_b, seed):
    q, k, v = _qkv(n, m_a + m_b, seed=seed)
    out_a, lse_a = reference_attention(q, k[:m_a], v[:m_a], causal=False, return_lse=True)
    out_b, lse_b = reference_attention(q, k[m_a:], v[m_a:], causal=False, return_lse=True)
    merged, lse = merge_attention(out_a, lse_a, out_b, lse_b)
    whole, lse_whole = reference_attention(q, k, v, causal=False, return_lse=True)
    torch.testing.assert_close(merged, whole, atol=1e-12, rtol=0)
    torch.testing.assert_close(lse, lse_whole, atol=1e-12, rtol=0)


def test_merge_of_cached_prefix_and_causal_chunk_is_chunk_attention():
    """A chunk attends to its cache (no mask) and to itself (causal): merged, that is the chunk's attention."""
    q, k, v = _qkv(4, 10)
    out_a, lse_a = reference_attention(q, k[:6], v[:6], causal=False, return_lse=True)
    out_b, lse_b = reference_attention(q, k[6:], v[6:], causal=True, return_lse=True)
    merged, _ = merge_attention(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(merged, _loop_attention(q, k, v), atol=1e-12, rtol=0)


# ---- the sdpa backend never aligns top-left ------------------------------------
def _record_sdpa_calls(monkeypatch):
    """Record (q_len, k_len, is_causal, has_mask) of every fused-kernel call."""
    calls = []
    real = attention._fused_attention

    def recording(q, k, v, is_causal=False, attn_mask=None, with_lse=False):
        calls.append((q.shape[-2], k.shape[-2], is_causal, attn_mask is not None))
        return real(q, k, v, is_causal=is_causal, attn_mask=attn_mask, with_lse=with_lse)

    monkeypatch.setattr(attention, "_fused_attention", recording)
    return calls


def _packed_step(query_lens, cached_lens, block_size=4, num_heads=4, num_kv_heads=2, head_dim=8,
                 seed=0, dtype=torch.float64, interleave=False):
    """A packed step over a paged cache, plus each sequence's contiguous q, k, v.

    interleave: hand out blocks one at a time round-robin, so that no
    request's blocks are consecutive in the pool (as after many decodes).
    """
    g = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in zip(cached_lens, query_lens)]
    manager = BlockManager(sum(-(-s // block_size) for s in seq_lens) + 3, block_size)
    manager.allocate("pad", 2 * block_size)            # so tables do not start at block 0
    for size in range(block_size, max(seq_lens) + block_size, block_size) if interleave else ():
        for b, seq_len in enumerate(seq_lens):
            manager.allocate(b, min(size, seq_len))
    shape = (manager.num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=g, dtype=dtype), torch.randn(shape, generator=g, dtype=dtype)
    seqs, qs, k_new, v_new, slots = [], [], [], [], []
    for b, (n, c) in enumerate(zip(query_lens, cached_lens)):
        manager.allocate(b, c + n)
        q, k, v = _qkv(n, c + n, num_heads, num_kv_heads, head_dim, seed=seed + 1 + b, dtype=dtype)
        prefix_slots = torch.tensor(manager.slot_mapping(b, 0, c), dtype=torch.long)
        write_kv(k_cache, v_cache, k[:c], v[:c], prefix_slots)       # the cached prefix
        seqs.append((q, k, v))
        qs.append(q), k_new.append(k[c:]), v_new.append(v[c:])
        slots += manager.slot_mapping(b, c, c + n)
    batch = AttentionBatch(query_lens=list(query_lens), cached_lens=list(cached_lens),
                           block_tables=[manager.block_tables[b] for b in range(len(query_lens))],
                           block_size=block_size, slot_mapping=torch.tensor(slots, dtype=torch.long))
    return (torch.cat(qs), torch.cat(k_new), torch.cat(v_new), k_cache, v_cache, batch), seqs


MIXED_STEPS = [
    ([7], [0]),                      # one prefill
    ([5], [9]),                      # a chunk over a cache
    ([1, 1, 1], [3, 8, 13]),         # decodes only (batched in sdpa)
    ([6, 1, 3, 1], [0, 10, 5, 2]),   # prefill, decodes and a chunk packed together
]


@pytest.mark.parametrize("decodes", DECODE_PATHS)
@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("query_lens,cached_lens", MIXED_STEPS)
def test_paged_attention_backends_agree_with_float64_reference(backend, query_lens, cached_lens, decodes):
    args, seqs = _packed_step(query_lens, cached_lens)
    with _decode_path(decodes):
        out = paged_attention(*args, backend=backend)
    expected = torch.cat([_loop_attention(q[:, :], k, v)[:] for q, k, v in seqs])
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=0)


@settings(max_examples=25, deadline=None)
@given(lens=st.lists(st.tuples(st.integers(1, 9), st.integers(0, 12)), min_size=1, max_size=5),
       block_size=st.sampled_from([1, 3, 4, 16]), seed=st.integers(0, 10**6))
def test_paged_attention_sdpa_agrees_with_reference_on_random_packed_steps(lens, block_size, seed):
    query_lens, cached_lens = [n for n, _ in lens], [c for _, c in lens]
    args, seqs = _packed_step(query_lens, cached_lens, block_size=block_size, seed=seed)
    expected = torch.cat([reference_attention(q, k, v) for q, k, v in seqs])
    for backend, decodes in [("reference", "gather"), ("sdpa", "gather"), ("sdpa", "paged kernel")]:
        if decodes == "paged kernel" and not kernels.paged_decode_available():
            continue                                  # not built here; the gather path is checked
        args, _ = _packed_step(query_lens, cached_lens, block_size=block_size, seed=seed)
        with _decode_path(decodes):
            out = paged_attention(*args, backend=backend)
        torch.testing.assert_close(out, expected, atol=1e-10, rtol=0)


@settings(max_examples=25, deadline=None)
@given(lens=st.lists(st.tuples(st.integers(1, 9), st.integers(0, 12)), min_size=1, max_size=5),
       block_size=st.sampled_from([1, 3, 4]), group=st.sampled_from([1, 2, 4]), seed=st.integers(0, 10**6))
def test_paged_attention_on_scattered_blocks_with_prefixes_read_once_agrees_with_reference(
        lens, block_size, group, seed):
    """The model's path: prefixes as views for the whole step where the blocks are
    consecutive, gathered by the layer where they are scattered."""
    query_lens, cached_lens = [n for n, _ in lens], [c for _, c in lens]
    args, seqs = _packed_step(query_lens, cached_lens, block_size=block_size, num_heads=2 * group,
                              seed=seed, interleave=True)
    q, k_new, v_new, k_cache, v_cache, batch = args
    pool = torch.stack([k_cache, v_cache])[None]          # [layers=1, 2, blocks, bs, Hkv, D]
    prefixes = [None if p is None else (p[0, 0], p[0, 1])
                for p in attention.read_cached_prefixes(pool, batch)]
    expected = torch.cat([reference_attention(*s) for s in seqs])
    for decodes in DECODE_PATHS:
        if decodes == "paged kernel" and not kernels.paged_decode_available():
            continue
        batch._plan.clear()
        with _decode_path(decodes):
            out = paged_attention(q, k_new, v_new, pool[0, 0], pool[0, 1], batch, "sdpa", prefixes)
        torch.testing.assert_close(out, expected, atol=1e-10, rtol=0)


def test_the_step_reads_a_consecutive_prefix_as_a_view_and_leaves_a_scattered_one_to_each_layer():
    for interleave, expect_view in [(False, True), (True, False)]:
        args, _ = _packed_step([3, 3, 1], [9, 9, 5], interleave=interleave)
        _, _, _, k_cache, v_cache, batch = args
        pool = torch.stack([k_cache, v_cache])[None]          # [layers=1, 2, blocks, bs, Hkv, D]
        prefixes = attention.read_cached_prefixes(pool, batch)
        assert prefixes[2] is None                            # a decode reads its own blocks
        for prefix, table, cached in zip(prefixes[:2], batch.block_tables, batch.cached_lens):
            if not expect_view:
                assert prefix is None                         # no whole-step copy of every layer
                continue
            assert prefix.untyped_storage().data_ptr() == pool.untyped_storage().data_ptr()
            assert torch.equal(prefix[0, 0], gather_kv(k_cache, table, cached))
            assert torch.equal(prefix[0, 1], gather_kv(v_cache, table, cached))


def test_a_prefix_in_consecutive_blocks_is_read_without_a_copy():
    args, _ = _packed_step([3, 3], [9, 9])
    args_scattered, _ = _packed_step([3, 3], [9, 9], interleave=True)
    for (_, _, _, k_cache, _, batch), copies in [(args, False), (args_scattered, True)]:
        for table, cached in zip(batch.block_tables, batch.cached_lens):
            prefix = gather_kv(k_cache, table, cached)
            assert (prefix.untyped_storage().data_ptr() != k_cache.untyped_storage().data_ptr()) == copies
            slots = torch.tensor([table[p // 4] * 4 + p % 4 for p in range(cached)])
            assert torch.equal(prefix, k_cache.flatten(0, 1)[slots])


def test_sdpa_backend_never_uses_is_causal_when_q_and_k_lengths_differ(monkeypatch):
    calls = _record_sdpa_calls(monkeypatch)
    for query_lens, cached_lens in MIXED_STEPS:
        args, seqs = _packed_step(query_lens, cached_lens)
        out = paged_attention(*args, backend="sdpa")
        expected = torch.cat([_loop_attention(q, k, v) for q, k, v in seqs])
        torch.testing.assert_close(out, expected, atol=1e-10, rtol=0)
    assert calls, "the sdpa backend did not call scaled_dot_product_attention"
    assert any(q_len != k_len for q_len, k_len, _, _ in calls)
    for q_len, k_len, is_causal, _ in calls:
        assert not (is_causal and q_len != k_len), f"is_causal=True with q_len={q_len}, k_len={k_len}"


def test_sdpa_attention_with_gqa_uses_is_causal_on_the_square_block_only(monkeypatch):
    calls = _record_sdpa_calls(monkeypatch)
    for n, m in [(5, 5), (3, 11)]:
        q, k, v = _qkv(n, m, num_heads=4, num_kv_heads=2)
        torch.testing.assert_close(sdpa_attention(q, k, v), _loop_attention(q, k, v), atol=1e-10, rtol=0)
    assert any(is_causal for _, _, is_causal, _ in calls)
    for q_len, k_len, is_causal, _ in calls:
        assert not (is_causal and q_len != k_len)


def test_prefill_chunks_are_computed_without_any_mask_tensor(monkeypatch):
    """A chunk over a cache: an unmasked call over the prefix, an is_causal call over the square."""
    calls = _record_sdpa_calls(monkeypatch)
    args, seqs = _packed_step([6, 5], [0, 9])
    out = paged_attention(*args, backend="sdpa")
    torch.testing.assert_close(out, torch.cat([_loop_attention(*s) for s in seqs]), atol=1e-10, rtol=0)
    assert calls and not any(has_mask for *_, has_mask in calls)
    group = 2                                            # 4 query heads share 2 KV heads
    assert sorted(calls) == sorted([(6, 6, True, False), (5 * group, 9, False, False), (5, 5, True, False)])


def test_decodes_of_one_length_need_no_mask_and_of_many_lengths_one_per_bucket(monkeypatch):
    monkeypatch.setattr(kernels, "paged_decode_available", lambda: False)     # the gather path
    calls = _record_sdpa_calls(monkeypatch)
    args, seqs = _packed_step([1, 1, 1], [7, 7, 7])
    torch.testing.assert_close(paged_attention(*args, backend="sdpa"),
                               torch.cat([_loop_attention(*s) for s in seqs]), atol=1e-10, rtol=0)
    assert calls == [(2, 8, False, False)]               # one call, 2 query heads per KV head
    calls.clear()
    args, _ = _packed_step([1] * 10, list(range(3, 13)))
    paged_attention(*args, backend="sdpa")
    assert len(calls) == 2 and all(has_mask for *_, has_mask in calls)   # buckets of 5 and 5


def test_a_long_decode_is_not_padded_onto_short_ones(monkeypatch):
    # One decode over 2,100 tokens batched with four over 200 would read 5 x 2,100
    # keys; the bucket is cut so the short ones read only their own.
    assert split_decodes([200] * 4 + [2100]) == [(0, 4), (4, 5)]
    assert split_decodes([40] * 8) == [(0, 8)]                        # alike: one call
    assert split_decodes([40] * 9) == [(0, 1), (1, 9)]                # at most 8 per call
    assert split_decodes([]) == []
    lens = [3, 900, 5, 4, 1200, 6]
    cuts = split_decodes(sorted(lens))
    assert [i for span in cuts for i in range(*span)] == list(range(len(lens)))   # every decode once
    monkeypatch.setattr(kernels, "paged_decode_available", lambda: False)     # the gather path
    calls = _record_sdpa_calls(monkeypatch)
    args, seqs = _packed_step([1] * len(lens), [n - 1 for n in lens], block_size=16)
    torch.testing.assert_close(paged_attention(*args, backend="sdpa"),
                               torch.cat([_loop_attention(*s) for s in seqs]), atol=1e-10, rtol=0)
    assert sorted(k_len for _, k_len, *_ in calls) == [6, 1200]      # short ones padded to 6 only


# ---- cache helpers and bad input -----------------------------------------------
def test_write_then_gather_returns_the_tokens_in_order():
    manager = BlockManager(6, 4)
    manager.allocate("x", 2)
    manager.allocate("r", 10)
    cache = torch.zeros(6, 4, 2, 3)
    values = torch.arange(10 * 2 * 3, dtype=torch.float32).view(10, 2, 3)
    write_kv(cache, cache.clone(), values, values, torch.tensor(manager.slot_mapping("r", 0, 10)))
    assert torch.equal(gather_kv(cache, manager.block_tables["r"], 10), values)


def test_unknown_backend_is_a_value_error_naming_backend():
    args, _ = _packed_step([2], [0])
    with pytest.raises(ValueError, match="backend='fast'"):
        paged_attention(*args, backend="fast")


def test_flash_backend_refuses_clearly_where_it_cannot_run():
    args, _ = _packed_step([2], [3], block_size=16)
    with pytest.raises(ValueError, match="flash-attn|block_size=16"):
        paged_attention(*args, backend="flash")


def test_flash_backend_refuses_float32_or_a_missing_package_with_a_value_error():
    args, _ = _packed_step([2], [3], block_size=256, dtype=torch.float32)
    with pytest.raises(ValueError, match="backend='flash'"):
        paged_attention(*args, backend="flash")


# ---- the chapter-1 exercise checkers refuse the engine and reject classic mistakes ----
def test_chapter1_checkers_refuse_the_engine_and_reject_a_top_left_mask():
    # (correct answers pass, and more mistakes fail: tests/test_grading_shortcuts.py)
    from minillm.grading import check_attention, check_causal_mask, check_merge_attention
    for check, engine in ((check_causal_mask, lambda n, m: causal_mask(n, m)),
                          (check_attention, reference_attention), (check_merge_attention, merge_attention)):
        with pytest.raises(AssertionError, match="engine's own answer"):
            check(engine, seed=0)
    with pytest.raises(AssertionError, match="TOP-LEFT"):
        check_causal_mask(lambda n, m: torch.ones(n, m).tril().bool(), seed=0)
    with pytest.raises(AssertionError, match="average the two outputs"):
        check_merge_attention(lambda oa, la, ob, lb: ((oa + ob) / 2, torch.logaddexp(la, lb)), seed=0)
