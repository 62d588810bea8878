# %% [markdown]
# # Exercises 3: The paged KV cache
#
# Write each function, then run the check cell below it: it compares your function with
# the engine's `minillm.kv_cache` on fresh random inputs and says what is wrong.

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
# The ceiling of a division in integers: `-(-a // b)`, or `(a + b - 1) // b`.
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
ex.check_gather_kv(gather_kv)  # points: 2


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
# One token stores K and V in every layer for every KV head: `2 * layers * kv_heads * head_dim * dtype_bytes`
# bytes. A block holds `block_size` of them; keep whole blocks with `//`. Use only `cfg.num_layers`,
# `cfg.num_kv_heads` and `cfg.head_dim`.
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
