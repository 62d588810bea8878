"""Chapter 8's reference answers (teacher only): the solutions of
exercises/08_chunked_prefill_in_a_server, used by the hidden cases
(minillm.grading._hidden.ch08) and the tests. The public checkers never import this module:
their expected values come from the engine's prefix cache, scheduler and step loop."""
from __future__ import annotations

import hashlib

from ...prefix_cache import ROOT_HASH, hash_block


def salted_hashes(token_ids, block_size, salt=None):
    """vLLM's chain; a salt goes into the first block's name only (vllm/v1/core/kv_cache_utils.py,
    generate_block_hash_extra_keys), and the chain carries it to every later block."""
    parent = ROOT_HASH if salt is None else hashlib.sha256(ROOT_HASH + b"salt:" + salt.encode()).digest()
    hashes = []
    for start in range(0, len(token_ids) // block_size * block_size, block_size):
        parent = hash_block(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes


def tokens_to_compute(prompt_len, cached_blocks, block_size):
    most = (prompt_len - 1) // block_size * block_size
    return prompt_len - min(cached_blocks * block_size, most)


def first_token_steps(prompt_lens, chunk_size, threshold):
    left, steps, step = list(prompt_lens), [0] * len(prompt_lens), 0
    while any(left):
        step += 1
        room = chunk_size
        for i, n in enumerate(left):
            take = min(n, room, threshold) if threshold > 0 else min(n, room)
            left[i] -= take
            room -= take
            if n and not left[i]:
                steps[i] = step
    return steps


def threshold_for_short_ttft(long_len, short_lens, chunk_size, max_steps):
    def shorts_in_time(threshold):
        return max(first_token_steps([long_len, *short_lens], chunk_size, threshold)[1:]) <= max_steps
    if shorts_in_time(0):
        return 0
    return next((t for t in range(chunk_size - 1, 0, -1) if shorts_in_time(t)), None)


def eviction_order(tables, finish_order, num_clean, num_needed):
    holders = {}
    for table in tables.values():
        for block in table:
            holders[block] = holders.get(block, 0) + 1
    lru = []
    for request_id in finish_order:
        for block in reversed(tables[request_id]):
            holders[block] -= 1
            if holders[block] == 0:
                lru.append(block)
    return lru[:max(0, num_needed - num_clean)]


def prefill_tokens_saved(system_len, user_lens, block_size):
    return [tokens_to_compute(system_len + user_len, 0 if i == 0 else system_len // block_size, block_size)
            for i, user_len in enumerate(user_lens)]
