# %% [markdown]
# # Exercises 8: chunked prefill in a server
#
# Six functions from chapter 8: name KV blocks the way vLLM's prefix cache does, count
# what a cached prompt still computes, plan one step under the long-prefill cap, score a
# serving layout by DistServe's goodput, then two the chapter does not work out for you:
# which cached blocks an allocation evicts (reference counts and the LRU list), and how
# many prompt tokens a shared system prompt saves (predicted, then measured by the
# engine). Each checker compares your function with the engine's own pieces (and
# switches off the engine's version while yours runs). Fill in the bodies where it says
# `raise NotImplementedError`.

# %%
import hashlib
from array import array

import minillm.grading as ex
from minillm.prefix_cache import ROOT_HASH, hash_block

# %% [markdown]
# ## 1. Chain the block hashes
#
# `hash_block(parent_hash, tokens)` hashes one full block together with its parent's hash.
# Return the hashes of the full blocks of `token_ids`, in order: the first block's parent is
# `ROOT_HASH`, every later block's parent is the hash of the block before it, and a partial
# last block gets no hash (it can still change). You may call `hash_block`, not
# `prefix_cache.block_hashes`.
#
# <details><summary>Hint</summary>
#
# How many full blocks are there, and what does each block's hash need from the block
# before it?
#
# </details>

# %%
def chain_hashes(token_ids, block_size):
    ### BEGIN SOLUTION
    hashes, parent = [], ROOT_HASH
    for start in range(0, len(token_ids) // block_size * block_size, block_size):
        parent = hash_block(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes
    ### END SOLUTION


# %%
ex.check_chain_hashes(chain_hashes)  # points: 1

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
# ## 3. One step under `long_prefill_token_threshold`
#
# Prompts of `prompt_lens` tokens wait, in arrival order; nothing else runs. Under the
# chunked policy with `chunk_size` prefill tokens per step and vLLM V1's cap
# `long_prefill_token_threshold = threshold` (0: no cap), return how many tokens each
# prompt gets in the first step (0 for those that get none). You may not call the engine's
# `Scheduler`.
#
# <details><summary>Hint</summary>
#
# Walk the prompts in arrival order, keeping the step's prefill tokens left. Three things
# bound what one prompt can take; the threshold is one of them, and only when it is not 0.
#
# </details>

# %%
def plan_prefill_step(prompt_lens, chunk_size, threshold):
    ### BEGIN SOLUTION
    left, plan = chunk_size, []
    for n in prompt_lens:
        take = min(n, left, threshold) if threshold > 0 else min(n, left)
        plan.append(take)
        left -= take
    return plan
    ### END SOLUTION


# %%
ex.check_plan_prefill_step(plan_prefill_step)  # points: 2

# %% [markdown]
# ## 4. DistServe's goodput
#
# DistServe's goodput is a rate, not exercise 7's count of good requests per second: the
# highest request rate the server sustains within its SLOs. `goodput_rate(attainment_by_rate,
# target)`: `attainment_by_rate` maps a request rate (req/s) to the fraction of requests that met
# both SLOs at that rate, in any order. Return the highest rate whose attainment is at
# least `target`, scanning rates upward and stopping at the first that misses it (0.0 if
# the lowest already misses). You may not call `minillm.sim.disaggregation`.
#
# <details><summary>Hint</summary>
#
# Walk the rates in increasing order: what do you keep, and when do you stop?
#
# </details>

# %%
def goodput_rate(attainment_by_rate, target):
    ### BEGIN SOLUTION
    best = 0.0
    for rate in sorted(attainment_by_rate):
        if attainment_by_rate[rate] < target:
            break
        best = rate
    return best
    ### END SOLUTION


# %%
ex.check_goodput_rate(goodput_rate)  # points: 1

# %% [markdown]
# ## 5. Which cached blocks an allocation evicts
#
# Chapter 8 (section 1) shows how the prefix cache takes a block: a clean block if there
# is one, else it evicts the least recently used cached block. Work out the order yourself.
#
# `eviction_order(tables, finish_order, num_clean, num_needed)`: `tables` maps each
# request to its block table, a list of block ids; every block in it is full, computed and
# named in the cache, and requests that share a prefix share its blocks (the same id in
# several tables, one reference each). The requests in `finish_order` leave, in that
# order; the others keep running. The pool also holds `num_clean` clean free blocks. Then a
# new request (no cache hit) takes `num_needed` blocks, one at a time. Return the cached
# blocks it evicts, in order (taking a clean block is not an eviction).
#
# The engine's rules: a block is freed when its reference count falls to 0, and a cached
# block that is freed joins the end of the LRU list; a leaving request releases its
# blocks **tail first** (its last block first), so a long prefix's tail is evicted before
# its head. You may not call the block manager (`PrefixCachingBlockManager`, `BlockManager`).
#
# <details><summary>Hint</summary>
#
# Keep a count of holders per block and an ordered list of evictable blocks. When does a
# block enter the list, and which end of the list does an allocation take from once the
# clean blocks are gone?
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
