# %% [markdown]
# # Exercises 4: Chunked prefill is exact
#
# Write each function, then run the check cell below it: it compares your function with
# the engine on fresh random inputs and says what is wrong.

# %%
import torch

import minillm
import minillm.grading as ex
from minillm.attention import AttentionBatch
from minillm.kv_cache import BlockManager, PagedKVCache

# %% [markdown]
# ## 1. The mask of a packed step
#
# One step packs several requests (chapter 1, section 6): request `r` brings
# `query_lens[r]` new tokens and has `cached_lens[r]` tokens in its cache. Line the step's
# queries up as rows (request 0's new tokens, then request 1's, ...) and every request's
# keys as columns (request 0's cached and new keys, then request 1's, ...).
# `step_mask(query_lens, cached_lens)`: a boolean tensor `[sum of q, sum of c + q]`, True
# where a query may attend to a key: only keys of its own request, at or before its own
# absolute position. Do not call `minillm.attention.causal_mask`: build each request's part
# from `torch.arange`.
#
# <details><summary>Hint</summary>
#
# Each request's part is the chunk rectangle of chapter 1 (`[q, c + q]`, its queries the
# last q positions); where do the parts sit relative to each other, and what is everywhere
# else? `torch.block_diag` keeps booleans.
#
# </details>

# %%
def step_mask(query_lens, cached_lens):
    ### BEGIN SOLUTION
    parts = []
    for q, c in zip(query_lens, cached_lens):
        query_pos = torch.arange(q)[:, None] + c
        parts.append(torch.arange(c + q)[None, :] <= query_pos)
    return torch.block_diag(*parts)
    ### END SOLUTION

# %%
ex.check_step_mask(step_mask)  # points: 1
print(step_mask([2, 1], [1, 3]).int())

# %% [markdown]
# ## 2. Chunk boundaries
#
# `chunk_bounds(num_tokens, chunk_size)`: the list of `(start, end)` pairs that split
# `[0, num_tokens)` into chunks of `chunk_size` tokens, in order; the last may be shorter.
#
# <details><summary>Hint</summary>
#
# `range(0, num_tokens, chunk_size)` gives the starts; each end is `min(start + chunk_size, num_tokens)`.
#
# </details>

# %%
def chunk_bounds(num_tokens, chunk_size):
    ### BEGIN SOLUTION
    return [(start, min(start + chunk_size, num_tokens)) for start in range(0, num_tokens, chunk_size)]
    ### END SOLUTION

# %%
ex.check_chunk_bounds(chunk_bounds)  # points: 1
assert chunk_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]

# %% [markdown]
# ## 3. Your own chunked prefill
#
# `chunked_prefill(model, token_ids, chunk_size)`: run the prompt chunk by chunk through
# `model.forward(token_ids, positions, batch, kv_cache, backend="reference")` and return
# the KV `[num_layers, 2, T, num_kv_heads, head_dim]`. You need, per chunk: its token ids
# as a tensor, its **absolute** positions, and an `AttentionBatch(query_lens, cached_lens,
# block_tables, block_size, slot_mapping)`. Set up one `BlockManager` and one
# `PagedKVCache.for_model(model.cfg, num_blocks, block_size, model.dtype, model.device)`
# first; `kv_cache.gather(block_table, T)` reads the result back. The checker compares with
# `minillm.prefill_kv` in float64 and, when you are off, says at which layer and position.
#
# <details><summary>Hint</summary>
#
# Allocate the whole prompt's blocks once. For each chunk from `chunk_bounds`, one
# `model(...)` call with an `AttentionBatch` of one request: how many new tokens, how many
# already cached, which table, and which slots the new tokens go to. Which positions does
# the chunk's first token have? The checker counts your forward passes: one per chunk.
#
# </details>

# %%
def chunked_prefill(model, token_ids, chunk_size, block_size=16):
    ### BEGIN SOLUTION
    T = len(token_ids)
    blocks = BlockManager(-(-T // block_size), block_size)
    table = blocks.allocate("prompt", T)
    cache = PagedKVCache.for_model(model.cfg, blocks.num_blocks, block_size, model.dtype, model.device)
    for start, end in chunk_bounds(T, chunk_size):
        batch = AttentionBatch(query_lens=[end - start], cached_lens=[start], block_tables=[table],
                               block_size=block_size,
                               slot_mapping=torch.tensor(blocks.slot_mapping("prompt", start, end)))
        model(torch.tensor(token_ids[start:end]), torch.arange(start, end), batch, cache,
              backend="reference")
    return cache.gather(table, T)
    ### END SOLUTION

# %%
ex.check_chunked_prefill(chunked_prefill)  # points: 3


# %% [markdown]
# ## 4. Which bug is it?
#
# Make a copy of your `chunked_prefill` that passes `torch.arange(0, end - start)` as the
# positions (bug 3 of the chapter) and measure, per layer, the largest KV error against
# `minillm.prefill_kv`: return a list of `num_layers` floats, each the largest
# `|your KV - prefill_kv's KV|` over K and V and every position of that layer. The checker
# runs it on prompts of a few chunks and on a prompt that is one chunk. Then think: which
# layer is already wrong, and why does that point at the positions rather than the mask?
#
# <details><summary>Hint</summary>
#
# Copy `chunked_prefill` and change only the positions; then compare
# `cache.gather(table, T)[layer]` with `minillm.prefill_kv(model, token_ids)[0][layer]` layer by layer.
#
# </details>

# %%
def position_bug_errors(model, token_ids, chunk_size, block_size=16):
    ### BEGIN SOLUTION
    T = len(token_ids)
    blocks = BlockManager(-(-T // block_size), block_size)
    table = blocks.allocate("prompt", T)
    cache = PagedKVCache.for_model(model.cfg, blocks.num_blocks, block_size, model.dtype, model.device)
    for start, end in chunk_bounds(T, chunk_size):
        batch = AttentionBatch([end - start], [start], [table], block_size,
                               torch.tensor(blocks.slot_mapping("prompt", start, end)))
        model(torch.tensor(token_ids[start:end]), torch.arange(0, end - start), batch, cache,
              backend="reference")
    full, _ = minillm.prefill_kv(model, token_ids)
    return [(cache.gather(table, T)[layer] - full[layer]).abs().max().item()
            for layer in range(model.cfg.num_layers)]
    ### END SOLUTION

# %%
ex.check_position_bug_errors(position_bug_errors)  # points: 2
cfg = minillm.ModelConfig(name="ex", vocab_size=64, hidden_size=64, intermediate_size=128,
                          num_layers=2, num_heads=4, num_kv_heads=2, max_position=256)
model = minillm.build_model(cfg, seed=0, dtype=torch.float64)
tokens = torch.randint(0, 64, (60,), generator=torch.Generator().manual_seed(0)).tolist()
print("max KV error per layer, chunks of 16:", [f"{e:.1e}" for e in position_bug_errors(model, tokens, 16)])
print("the same prompt as one chunk:        ", [f"{e:.1e}" for e in position_bug_errors(model, tokens, 60)])
