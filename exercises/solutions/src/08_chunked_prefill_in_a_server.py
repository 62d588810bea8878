# %% [markdown]
# # Exercises 8: chunked prefill in a server
#
# Six problems on chapter 8. Keep tenants apart in a prefix cache, count what a cached
# prompt still computes, predict when each prompt of a queue gets its first token under
# vLLM's long-prefill cap, design that cap for a latency target, work out which cached
# blocks an allocation evicts, and predict the prefill a shared system prompt saves. Each
# checker compares your function with the engine's own pieces (its prefix cache, its
# scheduler, its step loop run with a stand-in for the model) and switches the engine's
# version off while yours runs.

# %%
import hashlib

import minillm.grading as ex
from minillm.prefix_cache import ROOT_HASH, hash_block

# %% [markdown]
# ## 1. Keep tenants apart: a salted chain
#
# A server shared by several tenants must not let one tenant's request hit blocks another
# tenant's prompt cached: a hit answers sooner, so its latency tells the attacker what the
# other prompt held (vllm-project/vllm RFC #16016, "Leaking Secrets from Prefix Caches").
# vLLM lets a request carry a `cache_salt` for this (PR #17045; `generate_block_hash_extra_keys`
# in `vllm/v1/core/kv_cache_utils.py`, vLLM at commit 001cabc): requests with different salts
# never share a cached block, even for the same tokens; requests with the same salt share
# prefixes as before.
#
# Write `salted_hashes(token_ids, block_size, salt=None)`: the names of the full blocks of
# `token_ids`, in order. Without a salt they must be exactly the engine's names (chapter 8,
# section 1: `hash_block(parent_hash, tokens)`, the first block's parent `ROOT_HASH`). With
# a salt (a string), a block's name must differ from its name under any other salt and
# without one, and two prompts with the same salt must still share the names of the blocks
# they share. You may call `hash_block` and `hashlib`; not `prefix_cache.block_hashes`.
#
# <details><summary>Hint</summary>
#
# A block's name stands for every token up to the block's end: that is what the chain
# buys. For a salted name to differ everywhere, what must the salt become part of? Is there
# one place that reaches every block at once?
#
# </details>

# %%
def salted_hashes(token_ids, block_size, salt=None):
    ### BEGIN SOLUTION
    parent = ROOT_HASH if salt is None else hashlib.sha256(ROOT_HASH + b"salt:" + salt.encode()).digest()
    hashes = []
    for start in range(0, len(token_ids) // block_size * block_size, block_size):
        parent = hash_block(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes
    ### END SOLUTION


# %%
ex.check_salted_hashes(salted_hashes)  # points: 2

# %% [markdown]
# ## 2. What a cached prompt still computes
#
# The first `cached_blocks` full blocks of a `prompt_len`-token prompt are in the cache.
# How many of the prompt's tokens does the engine compute when the prompt arrives? A hit
# covers whole blocks, and never the last prompt token (its logits give the first output
# token): think of a prompt whose every block is cached. You may not call
# `prefix_cache.max_cached_tokens` or the block manager.
#
# <details><summary>Hint</summary>
#
# Which token must run whatever the cache holds? Then: a hit is made of whole blocks, so
# how many whole blocks fit before that token?
#
# </details>

# %%
def tokens_to_compute(prompt_len, cached_blocks, block_size):
    ### BEGIN SOLUTION
    most = (prompt_len - 1) // block_size * block_size
    return prompt_len - min(cached_blocks * block_size, most)
    ### END SOLUTION


# %%
ex.check_tokens_to_compute(tokens_to_compute)  # points: 1

# %% [markdown]
# ## 3. When does each prompt get its first token?
#
# Prompts of `prompt_lens` tokens wait, in arrival order; nothing else runs, nothing is
# cached, and each wants one output token. The engine serves them under the `chunked`
# policy with `chunk_size` prefill tokens per step and vLLM V1's
# `long_prefill_token_threshold = threshold` (0: off), with the meaning chapter 8 (section
# 2) gives it. Write `first_token_steps(prompt_lens, chunk_size, threshold)`: for each
# prompt, the step (counted from 1) at whose end it gets its first token. The checker runs
# the engine's step loop on the same queue and compares; you may not call the scheduler
# or the engine.
#
# <details><summary>Hint</summary>
#
# Step by step: in which order are the prompts served, what bounds one prompt's share of
# a step, and what happens to the part of the chunk it cannot take? Does any of that change
# once some prompts are done?
#
# </details>

# %%
def first_token_steps(prompt_lens, chunk_size, threshold):
    ### BEGIN SOLUTION
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
    ### END SOLUTION


# %%
ex.check_first_token_steps(first_token_steps)  # points: 3
# Chapter 8's case, in steps: an 8000-token prompt, then 8 prompts of 64, chunks of 512.
for threshold in (0, 256):
    steps = first_token_steps([8000] + [64] * 8, 512, threshold)
    print(f"threshold {threshold:3d}: short prompts' first tokens at steps {steps[1:]}, the long prompt's at {steps[0]}")

# %% [markdown]
# ## 4. Design the cap for a latency target
#
# A `long_len`-token prompt arrives first; short prompts of `short_lens` tokens queue
# behind it, as in task 3. The service wants every short prompt's first token within
# `max_steps` steps, and the long prompt's first token as soon as that allows. Write
# `threshold_for_short_ttft(long_len, short_lens, chunk_size, max_steps)`: return `0` if no
# cap is needed, else the largest `long_prefill_token_threshold` (from 1 to `chunk_size - 1`)
# that meets the target (the larger the cap, the more of each step the long prompt keeps), or
# `None` if no threshold meets it. You may use your `first_token_steps`. The checker runs the
# engine on the thresholds it needs to and measures.
#
# <details><summary>Hint</summary>
#
# Which way do the short prompts' first tokens move as the threshold falls, and is it the
# same way for every threshold? Try a short prompt longer than the threshold.
#
# </details>

# %%
def threshold_for_short_ttft(long_len, short_lens, chunk_size, max_steps):
    ### BEGIN SOLUTION
    def shorts_in_time(threshold):
        return max(first_token_steps([long_len, *short_lens], chunk_size, threshold)[1:]) <= max_steps
    if shorts_in_time(0):
        return 0
    for threshold in range(chunk_size - 1, 0, -1):
        if shorts_in_time(threshold):
            return threshold
    return None
    ### END SOLUTION


# %%
ex.check_threshold_for_short_ttft(threshold_for_short_ttft)  # points: 3
best = threshold_for_short_ttft(8000, [64] * 8, 512, 4)
print(f"8 short prompts within 4 steps behind an 8000-token one: threshold {best}, the long prompt's first token "
      f"at step {first_token_steps([8000] + [64] * 8, 512, best)[0]} instead of "
      f"{first_token_steps([8000] + [64] * 8, 512, 0)[0]}")

# %% [markdown]
# ## 5. Which cached blocks an allocation evicts
#
# Chapter 8 (section 1) shows how the prefix cache takes a block: a clean block if there
# is one, else it evicts the least recently used cached block. Which block is "least
# recently used" is not spelled out there: work it out for requests that share prefixes and
# leave in some order.
#
# `eviction_order(tables, finish_order, num_clean, num_needed)`: `tables` maps each
# request to its block table, a list of block ids; every block in it is full, computed and
# named in the cache, and requests that share a prefix share its blocks (the same id in
# several tables). The requests in `finish_order` leave, in that order; the others keep
# running. The pool also holds `num_clean` clean free blocks. Then a new request (no cache
# hit) takes `num_needed` blocks, one at a time. Return the cached blocks it evicts, in
# order (taking a clean block is not an eviction).
#
# Decide for yourself what the chapter leaves open, as a designer of the cache would: when
# can a shared block be evicted, and in which order does a leaving request's table give up
# its blocks? A prefix cache wants to keep what the next prompt is most likely to share. The
# checker runs the engine's block manager on the same pools and names the rule your order
# breaks. You may not call the block manager (`PrefixCachingBlockManager`, `BlockManager`).
#
# <details><summary>Hint</summary>
#
# Follow one block from the moment its last reader leaves. Which blocks of a long prompt do
# other prompts share most often, its first ones or its last ones, and so which should stay
# cached longest? Then ask which end of your list an allocation takes from.
#
# </details>

# %%
def eviction_order(tables, finish_order, num_clean, num_needed):
    ### BEGIN SOLUTION
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
    ### END SOLUTION


# %%
ex.check_eviction_order(eviction_order)  # points: 3

# %% [markdown]
# ## 6. The prefill a shared system prompt saves: predict, then measure
#
# Chats share a `system_len`-token system prompt; chat `i` adds `user_lens[i]` tokens of
# its own (all different from the other chats'). They reach one engine with prefix caching
# on, blocks of `block_size` tokens and plenty of them, one after another: each arrives after
# the one before has finished. `prefill_tokens_saved(system_len, user_lens, block_size)`:
# predict how many prompt tokens each chat's steps compute, a list (one number per chat).
# You may call your own `tokens_to_compute`; not the engine, the simulator or the prefix
# cache.
#
# The checker then **measures**: it serves the same chats with the engine's scheduler and
# prefix-caching block manager (a model-free executor) and counts each chat's prefill
# tokens from the engine's trace. The tolerance is zero: a prefix cache works in whole
# blocks, so your count is right or it is wrong by whole blocks.
#
# <details><summary>Hint</summary>
#
# What is cached when chat `i` arrives, and which of those blocks can it match? Think about
# the block that holds the last system-prompt token and the first user tokens, and about a
# chat that adds nothing to the system prompt.
#
# </details>

# %%
def prefill_tokens_saved(system_len, user_lens, block_size):
    ### BEGIN SOLUTION
    computed = []
    for i, user_len in enumerate(user_lens):
        cached_blocks = 0 if i == 0 else system_len // block_size
        computed.append(tokens_to_compute(system_len + user_len, cached_blocks, block_size))
    return computed
    ### END SOLUTION


# %%
ex.check_prefill_tokens_saved(prefill_tokens_saved)  # points: 3
chats = prefill_tokens_saved(2048, [64] * 16, 16)
print(f"16 chats, a 2048-token system prompt: {sum(chats)} of {16 * (2048 + 64)} prompt tokens computed")
assert sum(chats) < 0.2 * 16 * (2048 + 64)
