# %% [markdown]
# # Exercises 8: chunked prefill in a server
#
# Four small functions from chapter 8: name KV blocks the way vLLM's prefix cache does,
# count what a cached prompt still computes, plan one step under the long-prefill cap,
# and score a serving layout by DistServe's goodput. Each checker compares your function
# with the engine's own pieces on fresh random cases (and switches off the engine's
# version while yours runs). Fill in the bodies where it says `raise NotImplementedError`.

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
# last block gets no hash (it can still change).
#
# <details><summary>Hint</summary>
#
# Loop over the starts of the full blocks only (`len(token_ids) // block_size * block_size`) and feed each hash in as the next block's parent.
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
ex.check_chain_hashes(chain_hashes)  # points: 2

# %% [markdown]
# ## 2. What a cached prompt still computes
#
# The first `cached_blocks` full blocks of a `prompt_len`-token prompt are in the cache.
# How many of the prompt's tokens does the engine compute when the prompt arrives? A hit
# covers whole blocks, and never the last prompt token (its logits give the first output
# token): think of a prompt whose every block is cached.
#
# <details><summary>Hint</summary>
#
# The most a hit can cover is the full blocks of the first `prompt_len - 1` tokens: `(prompt_len - 1) // block_size * block_size`.
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
# prompt gets in the first step (0 for those that get none).
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
ex.check_plan_prefill_step(plan_prefill_step)  # points: 3

# %% [markdown]
# ## 4. DistServe's goodput
#
# DistServe's goodput is a rate, not exercise 7's count of good requests per second: the
# highest request rate the server sustains within its SLOs. `goodput_rate(attainment_by_rate,
# target)`: `attainment_by_rate` maps a request rate (req/s) to the fraction of requests that met
# both SLOs at that rate, in any order. Return the highest rate whose attainment is at
# least `target`, scanning rates upward and stopping at the first that misses it (0.0 if
# the lowest already misses).
#
# <details><summary>Hint</summary>
#
# `sorted(attainment_by_rate)` gives the rates upward; `break` at the first whose attainment is below `target`.
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
ex.check_goodput_rate(goodput_rate)  # points: 2
