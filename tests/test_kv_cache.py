"""kv_cache.py: block bookkeeping, the slot mapping and the paged tensors."""
import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

from minillm.config import ModelConfig
from minillm.kv_cache import (BlockManager, OutOfBlocksError, PagedKVCache, blocks_for,
                              blocks_that_fit, kv_bytes_per_token)


def test_blocks_for_is_the_ceiling_of_tokens_over_block_size():
    assert [blocks_for(n, 16) for n in (0, 1, 15, 16, 17, 32, 33)] == [0, 1, 1, 1, 2, 2, 3]


def test_allocate_grows_a_table_and_free_returns_every_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    assert len(bm.allocate("a", 5)) == 2
    assert len(bm.allocate("a", 8)) == 2          # still fits: no new block
    assert len(bm.allocate("a", 9)) == 3
    bm.allocate("b", 1)
    assert bm.num_free_blocks == 4 and bm.num_leaked_blocks() == 0
    bm.free("a")
    bm.free("b")
    assert bm.num_free_blocks == 8 and bm.num_leaked_blocks() == 0
    assert sorted(bm.free_blocks) == list(range(8))


def test_out_of_blocks_raises_a_scheduler_readable_error_and_changes_nothing():
    bm = BlockManager(num_blocks=3, block_size=4)
    bm.allocate("a", 8)
    with pytest.raises(OutOfBlocksError) as info:
        bm.allocate("b", 9)
    err = info.value
    assert (err.request_id, err.blocks_needed, err.blocks_free) == ("b", 3, 1)
    assert "preempt" in str(err)
    assert "b" not in bm.block_tables and bm.num_free_blocks == 1
    assert not bm.can_allocate("b", 9) and bm.can_allocate("b", 4)


def test_slot_mapping_follows_the_block_table():
    bm = BlockManager(num_blocks=6, block_size=4)
    bm.allocate("x", 2)
    bm.allocate("y", 4)
    table = bm.allocate("x", 10)            # x owns blocks 0, 2, 3
    assert table == [0, 2, 3]
    assert bm.slot_mapping("x", 0, 10) == [0, 1, 2, 3, 8, 9, 10, 11, 12, 13]
    assert bm.slot_mapping("x", 3, 5) == [3, 8]
    with pytest.raises(ValueError, match="end=13"):
        bm.slot_mapping("x", 0, 13)
    with pytest.raises(ValueError, match="start"):
        bm.slot_mapping("x", 5, 3)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "free", "share"]), st.integers(0, 4),
                          st.integers(0, 40)), max_size=40))
def test_no_sequence_of_operations_leaks_a_block(ops):
    bm = BlockManager(num_blocks=12, block_size=4)
    for op, rid, num_tokens in ops:
        if op == "alloc":
            try:
                bm.allocate(rid, num_tokens)
            except OutOfBlocksError:
                pass
        elif op == "free":
            bm.free(rid)
        elif rid in bm.block_tables and not bm.block_tables.get(rid + 10):
            bm.share(rid, rid + 10, num_tokens)
        assert bm.num_leaked_blocks() == 0
        owners = [0] * bm.num_blocks
        for t in bm.block_tables.values():
            for b in t:
                owners[b] += 1
        assert owners == bm.ref_counts
        assert set(bm.free_blocks).isdisjoint(b for t in bm.block_tables.values() for b in t)
    for rid in list(bm.block_tables):
        bm.free(rid)
    assert bm.num_free_blocks == bm.num_blocks


def test_shared_blocks_are_freed_by_their_last_user_only():
    bm = BlockManager(num_blocks=4, block_size=4)
    bm.allocate("a", 10)                    # 3 blocks
    shared = bm.share("a", "b", 10)         # whole blocks only: 2
    assert shared == bm.block_tables["a"][:2]
    bm.free("a")
    assert bm.num_free_blocks == 2          # a's third block, plus the untouched one
    bm.free("b")
    assert bm.num_free_blocks == 4 and bm.num_leaked_blocks() == 0


def test_share_refuses_to_overwrite_a_table_that_owns_blocks():
    bm = BlockManager(num_blocks=4, block_size=4)
    bm.allocate("a", 8)
    bm.allocate("b", 1)
    with pytest.raises(ValueError, match="dst_id"):
        bm.share("a", "b", 8)
    assert bm.num_leaked_blocks() == 0


@pytest.mark.parametrize("kwargs, arg", [
    (dict(num_blocks=0, block_size=16), "num_blocks"),
    (dict(num_blocks=4, block_size=0), "block_size"),
    (dict(num_blocks=2.5, block_size=16), "num_blocks"),
])
def test_bad_pool_shapes_are_refused_by_name(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        BlockManager(**kwargs)


def test_negative_or_fractional_token_counts_are_refused():
    bm = BlockManager(num_blocks=4, block_size=4)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="num_tokens"):
            bm.allocate("a", bad)


def test_block_table_gather_equals_the_contiguous_layout():
    rng = random.Random(0)
    L, Hkv, D, bs = 3, 2, 8, 4
    cache = PagedKVCache(L, num_blocks=10, block_size=bs, num_kv_heads=Hkv, head_dim=D,
                         dtype=torch.float64)
    bm = BlockManager(10, bs)
    bm.allocate("noise", 7)
    num_tokens = 13
    contiguous = torch.randn(L, 2, num_tokens, Hkv, D, dtype=torch.float64)
    bm.allocate("r", num_tokens)
    table = bm.block_tables["r"]
    rng.shuffle(table)                       # any order of blocks must work
    slots = torch.tensor(bm.slot_mapping("r", 0, num_tokens))
    for layer in range(L):
        k_cache, v_cache = cache.layer(layer)
        k_cache.view(-1, Hkv, D)[slots] = contiguous[layer, 0]
        v_cache.view(-1, Hkv, D)[slots] = contiguous[layer, 1]
    assert torch.equal(cache.gather(table, num_tokens), contiguous)


def test_kv_bytes_per_token_of_llama3_8b_in_bf16_is_128_kib():
    cfg = ModelConfig.preset("llama-3-8b")
    assert kv_bytes_per_token(cfg, 2) == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    cache = PagedKVCache.for_model(ModelConfig.preset("tiny"), 3, 16, torch.bfloat16, "cpu")
    assert cache.num_bytes == 3 * 16 * kv_bytes_per_token(ModelConfig.preset("tiny"), 2)
    assert blocks_that_fit(cfg, 2**30, 16) == 2**30 // (16 * 128 * 1024) == 512


def test_a_block_count_whose_bookkeeping_cannot_fit_is_refused_by_name():
    # the simulator has no KV pool to check against memory, only the free list
    import minillm
    from minillm.sim import workloads
    with pytest.raises(ValueError, match=r"num_blocks=1099511627776: keeping track"):
        BlockManager(2**40, 16)
    # and the pool itself, wherever it is built, before a byte is allocated
    with pytest.raises(ValueError, match=r"num_blocks=1099511627776: a KV pool of .* does not fit"):
        PagedKVCache(4, 2**40, 16, 2, 64)
    workload = workloads.long_prompt_interference(prompt_len=64, num_decoders=1)
    with pytest.raises(ValueError, match=r"num_blocks=1180591620717411303424"):
        minillm.simulate(workload, num_blocks=2**70)
