# %% [markdown]
# # Exercises 3: The paged KV cache
#
# Write each function, then run the check cell below it: it compares your function with
# the engine's `minillm.kv_cache` on fixed random inputs and says what is wrong. Tasks 1-4
# rebuild what chapter 3 shows; task 5 (copy-on-write after a fork) is a case the engine
# itself does not have, and task 6 asks you to predict a count before the engine measures
# it. May not call the engine's own answer in any task (`minillm.kv_cache.blocks_for`,
# `BlockManager.slot_mapping`, `gather_kv`, `blocks_that_fit`, `kv_bytes_per_token`).

# %%
import torch

import minillm.grading as ex
from minillm.config import ModelConfig

# %% [markdown]
# ## 1. Blocks needed
#
# `blocks_needed(num_tokens, block_size)`: how many blocks a request of `num_tokens` tokens
# occupies. Use integer arithmetic only (no floats: `num_tokens` can be large).
#
# <details><summary>Hint</summary>
#
# You need the ceiling of a division, and `math.ceil(a / b)` goes through a float: at
# 10**18 tokens a float cannot tell two neighbouring counts apart. How can floor division
# (`//`, exact on Python ints) give a ceiling? Think of negative numbers, or of what to
# add before dividing.
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
# ## 2. The slot mapping
#
# `slot_mapping(block_table, start, end, block_size)`: the flat cache slot of each position
# in `[start, end)`, as a list. Token `p` lives in block `block_table[p // block_size]`,
# at offset `p % block_size`; the flat slot is `block * block_size + offset`.
#
# <details><summary>Hint</summary>
#
# Position `p` lives in block number `p // block_size` of the request, at offset
# `p % block_size` inside it; the block table says which pool block that is, and a pool
# block's first slot is its number times `block_size`.
#
# </details>

# %%
def slot_mapping(block_table, start, end, block_size):
    ### BEGIN SOLUTION
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]
    ### END SOLUTION

# %%
ex.check_slot_mapping(slot_mapping)  # points: 1
assert slot_mapping([7, 2], 2, 6, 4) == [30, 31, 8, 9]

# %% [markdown]
# ## 3. Reading a request's keys through its block table
#
# `gather_kv(k_cache, block_table, num_tokens)`: `k_cache` has shape
# `[num_blocks, block_size, num_kv_heads, head_dim]`; return the request's first
# `num_tokens` keys as one contiguous tensor `[num_tokens, num_kv_heads, head_dim]`.
#
# <details><summary>Hint</summary>
#
# Index the pool with the table to get the request's blocks in order; put them end to
# end (a reshape); the last block may be partly empty.
#
# </details>

# %%
def gather_kv(k_cache, block_table, num_tokens):
    ### BEGIN SOLUTION
    block_size = k_cache.shape[1]
    blocks = torch.as_tensor(block_table[:-(-num_tokens // block_size)], device=k_cache.device)
    return k_cache[blocks].reshape(-1, *k_cache.shape[2:])[:num_tokens]
    ### END SOLUTION

# %%
ex.check_gather_kv(gather_kv)  # points: 1


# %% [markdown]
# ## 4. How many blocks fit in a memory budget?
#
# `blocks_that_fit(cfg, num_bytes, block_size, dtype_bytes)`: the number of whole blocks
# of `block_size` tokens that fit in `num_bytes` of KV memory for the model `cfg`. Then use
# it: how many tokens of Llama-3-8B's bf16 KV fit in the 64 GB an 80 GB GPU has left after
# the 16 GB of weights?
#
# <details><summary>Hint</summary>
#
# What does one token leave in the cache: how many tensors (K? V?), in how many layers,
# for how many heads (query heads or KV heads?), each of how many numbers, each of how
# many bytes? A block is `block_size` such tokens; a partial block does not count. Read
# `cfg.head_dim` rather than deriving it: some models set it apart from `hidden_size`.
#
# </details>

# %%
def blocks_that_fit(cfg, num_bytes, block_size, dtype_bytes):
    ### BEGIN SOLUTION
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes
    return num_bytes // (block_size * per_token)
    ### END SOLUTION

# %%
ex.check_blocks_that_fit(blocks_that_fit)  # points: 2
llama = ModelConfig.preset("llama-3-8b")
tokens = blocks_that_fit(llama, 64 * 10**9, 16, 2) * 16
print(f"{tokens:,} tokens, {tokens // 8192} sequences of 8192 tokens")
assert tokens == 488_272

# %% [markdown]
# ## 5. Copy-on-write after a fork
#
# Parallel sampling and beam search **fork** a request: the children share the parent's
# blocks instead of copying them, and each block carries a reference count (how many
# requests hold it: the engine's `BlockManager.ref_counts`). Sharing is safe as long as
# nobody writes into a shared block. `append_slot(block_table, num_tokens, ref_counts,
# free_blocks, block_size)` finds the slot of a request's next token (position
# `num_tokens`) and returns `(new_block_table, slot, copy)`:
# - the last block is full (or there is none): take a block from the **front** of
#   `free_blocks`, give it ref count 1, append it; `copy` is `None`;
# - the last block has room and this request alone holds it: write there; `copy` is `None`;
# - the last block has room but is **shared**: replace it in this request's table by a
#   fresh block (from the front of `free_blocks`, ref count 1), write there, and return
#   `copy = (old_block, new_block)`, so the caller copies the old block's tokens first.
#
# Update `ref_counts` and `free_blocks` in place, so that every block's count stays the
# number of tables that hold it. The checker forks requests and appends to parents and
# children in random order. May not call `BlockManager.allocate` or `slot_mapping`.
#
# <details><summary>Hint</summary>
#
# Where does position `num_tokens` fall: at the start of a new block, or inside the last
# one? If inside, who else reads that block, and what would they see if you wrote there?
# After the copy, how many tables still hold the old block?
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
# ## 6. Predict, then measure: what the cache saves
#
# Chapter 3, section 1 compares recomputing against caching. Generating
# `num_output_tokens` tokens after a prompt of `prompt_len` tokens, how many tokens do
# the model's forward passes process in all, **without** a cache (every new token reruns
# the whole sequence so far) and **with** one (the engine)? `forward_tokens(prompt_len,
# num_output_tokens)` returns your predicted pair `(without_cache, with_cache)`. The
# checker measures both by recording the forward passes of a small model (the engine's
# `LLMEngine.generate`, and a loop of `prefill_kv` for the recomputation); counts are
# exact, so the tolerance is 0. May not run the model.
#
# <details><summary>Hint</summary>
#
# Which forward pass produces the first output token? Does the last output token ever
# go through the model? Write the passes out for a 3-token prompt and 2 output tokens,
# then generalise.
#
# </details>

# %%
def forward_tokens(prompt_len, num_output_tokens):
    ### BEGIN SOLUTION
    n = num_output_tokens
    without_cache = sum(prompt_len + i for i in range(n))    # pass i reads the prompt and i outputs
    with_cache = prompt_len + (n - 1)                        # one prefill, then one token per decode
    return without_cache, with_cache
    ### END SOLUTION


# %%
ex.check_forward_tokens(forward_tokens)  # points: 2
without, with_cache = forward_tokens(1000, 100)
print(f"1000-token prompt, 100 output tokens: {without:,} tokens through the model without a cache, "
      f"{with_cache:,} with one (x{without / with_cache:.0f})")

# %% [markdown]
# Done: block counts, slot mapping, gathering, the memory budget, sharing blocks safely
# between forks, and the arithmetic that makes the cache worth its memory.
