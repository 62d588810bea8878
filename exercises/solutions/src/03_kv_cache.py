# %% [markdown]
# # Exercises 3: The paged KV cache
#
# Four tasks on chapter 3. A warm-up, then three problems the chapter sets up but does not
# solve: how many requests a memory budget really admits, copy-on-write for requests that
# share blocks after a fork (the engine has none), and the tokens the model processes with
# and without a cache when the scheduler preempts a request, predicted before the engine
# measures them. May not call the engine's own answers (`minillm.kv_cache.blocks_for`,
# `blocks_that_fit`, `kv_bytes_per_token`, `BlockManager.allocate`, `slot_mapping`).

# %%

import minillm.grading as ex
from minillm.config import ModelConfig

# %% [markdown]
# ## 1. Warm-up: blocks needed
#
# `blocks_needed(num_tokens, block_size)`: how many blocks a request of `num_tokens` tokens
# occupies. Integer arithmetic only: the checker also asks about 10**18 tokens.
#
# <details><summary>Hint</summary>
#
# You need the ceiling of a division, and `math.ceil(a / b)` goes through a float: at
# 10**18 tokens a float cannot tell two neighbouring counts apart. How can floor division
# (`//`, exact on Python ints) give a ceiling?
#
# </details>

# %%
def blocks_needed(num_tokens, block_size):
    ### BEGIN SOLUTION
    return -(-num_tokens // block_size)
    ### END SOLUTION

# %%
ex.check_blocks_needed(blocks_needed)  # points: 1
assert blocks_needed(8192, 16) == 512

# %% [markdown]
# ## 2. How many requests does a memory budget admit?
#
# A server has `num_bytes` of memory for the KV cache of the model `cfg`, in `dtype_bytes`
# per number, cut into blocks of `block_size` tokens (chapter 3, sections 2-4). Requests
# arrive with prompts of `prompt_lens` tokens and are admitted first come, first served:
# each admitted request keeps its prompt's K and V in the cache (nobody leaves), and the
# first request that does not fit waits, with every request behind it.
# `requests_that_fit(cfg, num_bytes, block_size, dtype_bytes, prompt_lens)` returns how many
# are admitted. The checker measures it with the engine: a `BlockManager` with as many
# blocks as the memory holds, allocating the prompts in order until one does not fit.
#
# <details><summary>Hint</summary>
#
# What does one token leave in the cache, in bytes (which heads, how many layers, K and
# V)? How many whole blocks does the memory make? Then the workload: does a request of 17
# tokens take 17 tokens' worth of memory, with blocks of 16? Try a budget of 10 blocks of 16
# and prompts of 17 tokens by hand.
#
# </details>

# %%
def requests_that_fit(cfg, num_bytes, block_size, dtype_bytes, prompt_lens):
    ### BEGIN SOLUTION
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes
    blocks_left = num_bytes // (block_size * per_token)        # whole blocks only
    for admitted, prompt_len in enumerate(prompt_lens):
        needed = blocks_needed(prompt_len, block_size)         # each request rounds up to whole blocks
        if needed > blocks_left:
            return admitted
        blocks_left -= needed
    return len(prompt_lens)
    ### END SOLUTION

# %%
ex.check_requests_that_fit(requests_that_fit)  # points: 2
llama = ModelConfig.preset("llama-3-8b")
for prompt_len in (8192, 17):
    admitted = requests_that_fit(llama, 64 * 10**9, 16, 2, [prompt_len] * 100_000)
    print(f"Llama-3-8B, 64 GB of bf16 KV in blocks of 16: {admitted:,} prompts of {prompt_len} tokens at once")

# %% [markdown]
# ## 3. Copy-on-write after a fork
#
# Parallel sampling and beam search **fork** a request: the children start with the
# parent's tokens, and instead of copying its blocks they share them, each block carrying
# a reference count, the number of block tables that hold it (the engine's
# `BlockManager.ref_counts`). Sharing is safe while nobody writes into a shared block. The
# engine never forks, so it has no code for what happens when a forked request appends a
# token. Design it: `append_slot(block_table, num_tokens, ref_counts, free_blocks,
# block_size)` places the request's next token (position `num_tokens`) and returns
# `(new_block_table, slot, copy)`, where `slot` is the flat cache slot to write, and `copy`
# is `None` or a pair `(source_block, destination_block)` whose tokens the caller copies
# before writing. Your design must keep, after every append:
# - every request reads back exactly its own tokens through its table;
# - `ref_counts[b]` equals the number of tables that hold block `b` (update it in place);
# - a block is taken from the **front** of `free_blocks` (in place), at most one per
#   append, and only when the token cannot go anywhere without breaking the first rule.
#
# The checker forks requests, appends to parents and children in random order, copies and
# writes as you say, and checks the three rules after each append.
#
# <details><summary>Hint</summary>
#
# Where does position `num_tokens` fall: at the start of a new block, or inside the last
# one? If inside, who else reads that block, and what would they see if you wrote there?
# If you must move, what does the new block need to hold first, and how many tables still
# hold the old one?
#
# </details>

# %%
def append_slot(block_table, num_tokens, ref_counts, free_blocks, block_size):
    ### BEGIN SOLUTION
    table, offset = list(block_table), num_tokens % block_size
    if offset == 0:                                        # full (or no) last block: a fresh one
        block = free_blocks.pop(0)
        ref_counts[block] = 1
        return table + [block], block * block_size, None
    last = table[-1]
    if ref_counts[last] == 1:                              # ours alone: write in place
        return table, last * block_size + offset, None
    block = free_blocks.pop(0)                             # shared: copy on write
    ref_counts[block], ref_counts[last] = 1, ref_counts[last] - 1
    table[-1] = block
    return table, block * block_size + offset, (last, block)
    ### END SOLUTION


# %%
ex.check_append_slot(append_slot)  # points: 3

# %% [markdown]
# ## 4. Predict, then measure: tokens through the model
#
# Chapter 3, section 1 compares recomputing against caching; section 5 describes what an
# engine does when the cache runs out: it **preempts** a request (vLLM's recompute
# preemption, and this engine's), freeing its blocks, and when the request is readmitted it
# recomputes the K and V it had lost, then goes on decoding.
#
# `forward_tokens(prompt_len, num_output_tokens, preempted_after=None)` returns your
# predicted pair `(without_cache, with_cache)`: the tokens the model's forward passes
# process in all to generate `num_output_tokens` tokens after a prompt of `prompt_len`,
# **without** a cache (every new token reruns the whole sequence so far) and **with** one
# (the engine). With `preempted_after=k`, the request is preempted once it holds `k` output
# tokens (`1 <= k < num_output_tokens`), then readmitted. Before you write it, put numbers
# on a prompt of 5 tokens and 4 output tokens, preempted after 2, and say why. The checker
# records the forward passes of a small model (`LLMEngine` with the preemption forced, and a
# loop of `prefill_kv` for the recomputation); counts are exact. May not run the model.
#
# <details><summary>Hint</summary>
#
# Which forward pass produces the first output token? Does the last output token ever go
# through the model? Write the passes out for a 3-token prompt and 2 output tokens. Then the
# preemption: which K and V are gone, which pass recomputes them, and which output token
# does that pass produce?
#
# </details>

# %%
def forward_tokens(prompt_len, num_output_tokens, preempted_after=None):
    ### BEGIN SOLUTION
    n = num_output_tokens
    without_cache = sum(prompt_len + i for i in range(n))    # pass i reads the prompt and i outputs
    with_cache = prompt_len + (n - 1)                        # one prefill, then one token per decode
    if preempted_after is not None:
        # the recompute pass runs the prompt and the k outputs, and yields output k + 1 itself:
        # it replaces one decode, so it adds the prompt_len + k - 1 tokens the cache had lost
        with_cache += prompt_len + preempted_after - 1
    return without_cache, with_cache
    ### END SOLUTION


# %%
ex.check_forward_tokens(forward_tokens)  # points: 3
without, with_cache = forward_tokens(1000, 100)
_, preempted = forward_tokens(1000, 100, preempted_after=50)
print(f"1000-token prompt, 100 output tokens: {without:,} tokens through the model without a cache, "
      f"{with_cache:,} with one (x{without / with_cache:.0f}); one preemption halfway: {preempted:,}")

# %% [markdown]
# Done: block counts, what a budget really admits, sharing blocks safely between forks,
# and the arithmetic that makes the cache worth its memory (and a preemption costly).
