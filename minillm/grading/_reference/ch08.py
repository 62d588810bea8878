"""Chapter 8's expected values, asked of the engine itself: its prefix-caching block
manager for the eviction order, its step loop (a model-free executor) for the prefill
tokens a shared system prompt saves."""
from __future__ import annotations

import random

from ...engine import EngineCore, VirtualClock
from ...prefix_cache import PrefixCachingBlockManager, make_block_manager
from ...request import SamplingParams
from ...scheduler import SchedulerConfig
from .ch06 import _CountingExecutor


def engine_eviction_order(tables: dict, finish_order, num_clean: int, num_needed: int) -> list[int]:
    """Blocks named in the cache, held by `tables`; the requests in finish_order leave;
    a new request takes num_needed blocks: which cached blocks does it evict, in order?"""
    used = sorted({b for table in tables.values() for b in table})
    num_blocks = (max(used) + 1 if used else 0) + num_clean
    bm = PrefixCachingBlockManager(num_blocks, 1)
    clean = [b for b in range(num_blocks) if b not in used][:num_clean]
    bm.free_blocks.clear()
    bm.free_blocks.extend(clean)
    for request_id, table in tables.items():
        bm.block_tables[request_id] = list(table)
        for block in table:
            bm.ref_counts[block] += 1
    for block in used:                                   # every held block is full, computed and named
        name = f"block {block}".encode()
        bm.hash_to_block[name], bm.block_hash[block] = block, name
    for request_id in finish_order:
        bm.free(request_id)
    evicted = []
    for _ in range(num_needed):
        before = bm.num_evictions
        block = bm._take_free_block()
        if bm.num_evictions > before:
            evicted.append(block)
    return evicted


def engine_prefill_tokens(system_len: int, user_lens, block_size: int, seed: int = 0) -> list[int]:
    """Chats that share a system_len-token system prompt, each adding user_lens[i] tokens of
    its own, served one after another (each after the one before has finished) by the
    engine with prefix caching: the prompt tokens each chat's steps computed."""
    rng = random.Random(seed)
    system = [rng.randrange(1000) for _ in range(system_len)]
    longest = system_len + max(user_lens, default=0) + 8
    blocks = make_block_manager(len(user_lens) * (longest // block_size + 2) + 4, block_size, True)
    core = EngineCore(SchedulerConfig(policy="chunked", chunk_size=4096, max_num_seqs=4), blocks,
                      _CountingExecutor(), VirtualClock())
    computed = []
    for user_len in user_lens:
        prompt = system + [1000 + rng.randrange(1000) for _ in range(user_len)]
        rid = core.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True))
        first_step = len(core.trace)
        while core.has_unfinished_requests():
            core.step()
        assert core.requests[rid].output_token_ids, "the chat did not finish"
        computed.append(sum(step.num_prefill_tokens for step in core.trace[first_step:]))
    return computed
