# %% [markdown]
# # Exercises 4: Chunked prefill is exact
#
# Write each function, then run the check cell below it: it compares your function with
# the engine on fixed random inputs and says what is wrong. Tasks 2-4 rebuild what chapter 4
# shows; tasks 1 and 5-7 take its reasoning to cases it does not print (a packed step of
# several requests, which of layer 0's tensors a bug can touch, and the work and re-reads
# of a chunked prefill, predicted before the engine measures them).

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
ex.check_step_mask(step_mask)  # points: 2
print(step_mask([2, 1], [1, 3]).int())

# %% [markdown]
# ## 2. Chunk boundaries
#
# `chunk_bounds(num_tokens, chunk_size)`: a list of `(start, end)` tuples that split
# `[0, num_tokens)` into chunks of `chunk_size` tokens, in order; the last may be shorter.
# (Tuples, not lists: `[(0, 4)] == [[0, 4]]` is False in Python.)
#
# <details><summary>Hint</summary>
#
# Where does each chunk start (which `range` lists those numbers)? Where does the last one
# end, if `num_tokens` is not a multiple of `chunk_size`?
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
# May not call `minillm.prefill_kv` or the engine's `ModelRunner`.
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
ex.check_chunked_prefill(chunked_prefill)  # points: 2


# %% [markdown]
# ## 4. The positions bug, measured layer by layer
#
# Make a copy of your `chunked_prefill` that passes `torch.arange(0, end - start)` as the
# positions (bug 3 of the chapter) and measure, per layer, the largest KV error against
# `minillm.prefill_kv`: return a list of `num_layers` floats, each the largest
# `|your KV - prefill_kv's KV|` over K and V and every position of that layer. The checker
# runs it on prompts of a few chunks and on a prompt that is one chunk.
#
# <details><summary>Hint</summary>
#
# Start from your `chunked_prefill` and change only what the bug changes. Which tensor
# holds every layer's KV side by side, for yours and for the full prefill, and over which
# dimensions does "every position, K and V" take its maximum?
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

# %% [markdown]
# ## 5. Which of layer 0's tensors does each bug touch?
#
# Layer 0's cache holds a K and a V per position. For two of the chapter's bugs (chunked,
# with chunks of 16), which of layer 0's tensors differ from the full prefill's: `"K"`,
# `"V"`, `"both"` or `"neither"`? Reason from where in the layer each bug acts, then
# measure it with a copy of your code (compare layer 0's K, `[0, 0]`, and V, `[0, 1]`,
# separately; for the mask, the chapter patches the reference attention's `align`).
# `layer0_answer()` returns a dict with the keys `"positions restart"` and `"top-left mask"`.
#
# <details><summary>Hint</summary>
#
# Follow one token's embedding into layer 0: which projections make its K and V, and
# which of the two does RoPE turn? Does the attention (where the mask lives) run before or
# after layer 0's K and V are written to the cache?
#
# </details>

# %%
def layer0_answer():
    ### BEGIN SOLUTION
    return {"positions restart": "K", "top-left mask": "neither"}
    ### END SOLUTION


# %%
ex.check_layer0_question(layer0_answer())  # points: 1

# %% [markdown]
# ## 6. Several prompts, chunked and packed
#
# The proof of chapter 4 is about one prompt, but the engine packs the chunks of several
# requests into one forward pass (chapter 1, section 6; your `step_mask` from task 1).
# `packed_chunked_prefill(model, prompts, chunk_size)`: run all the prompts (a list of
# token lists) chunk by chunk, where **each step is one `model(...)` call** carrying the
# next `chunk_size` tokens (fewer at the end) of every prompt not yet done, in the order
# given. Return the list of each prompt's KV `[num_layers, 2, T_r, num_kv_heads, head_dim]`.
# Each must equal that prompt's own full prefill (float64, 1e-10). One `BlockManager` and
# one `PagedKVCache` hold them all. May not call `minillm.prefill_kv` or the `ModelRunner`.
#
# <details><summary>Hint</summary>
#
# An `AttentionBatch` takes one entry per request in every one of its lists. For a step,
# which requests are still prefilling, how many new tokens and how many cached tokens does
# each bring, and in what order do their tokens, positions and slots follow each other in
# the packed tensors? Which request ids did you give the block manager?
#
# </details>

# %%
def packed_chunked_prefill(model, prompts, chunk_size, block_size=16):
    ### BEGIN SOLUTION
    blocks = BlockManager(sum(-(-len(p) // block_size) for p in prompts), block_size)
    tables = [blocks.allocate(r, len(p)) for r, p in enumerate(prompts)]
    cache = PagedKVCache.for_model(model.cfg, blocks.num_blocks, block_size, model.dtype, model.device)
    done = [0] * len(prompts)
    while any(d < len(p) for d, p in zip(done, prompts)):
        rows = [r for r, p in enumerate(prompts) if done[r] < len(p)]          # still prefilling
        ends = {r: min(done[r] + chunk_size, len(prompts[r])) for r in rows}
        slots = sum((blocks.slot_mapping(r, done[r], ends[r]) for r in rows), [])
        batch = AttentionBatch(query_lens=[ends[r] - done[r] for r in rows], cached_lens=[done[r] for r in rows],
                               block_tables=[tables[r] for r in rows], block_size=block_size,
                               slot_mapping=torch.tensor(slots))
        tokens = torch.tensor(sum((prompts[r][done[r]:ends[r]] for r in rows), []))
        positions = torch.cat([torch.arange(done[r], ends[r]) for r in rows])
        model(tokens, positions, batch, cache, backend="reference")
        for r in rows:
            done[r] = ends[r]
    return [cache.gather(tables[r], len(p)) for r, p in enumerate(prompts)]
    ### END SOLUTION


# %%
ex.check_packed_chunked_prefill(packed_chunked_prefill)  # points: 3

# %% [markdown]
# ## 7. Predict, then measure: the work and the re-reads of a chunked prefill
#
# Chapter 4 argues that chunking cannot change the KV. What does it change in the work?
# `chunked_prefill_work(num_tokens, chunk_size)` returns your **predicted** pair
# `(pairs, cached_reads)` for a chunked prefill of one prompt:
# - `pairs`: the query-key pairs attended, each query with every key at or before it,
#   summed over all chunks (the scores that survive the mask);
# - `cached_reads`: the cached keys read, each chunk reading the whole prefix cached
#   before it (once per chunk, per layer: count one layer).
#
# The checker measures both on the engine (`prefill_kv(..., chunk_size=...)`, its forward
# passes recorded) and accepts no difference: these are counts. It also asks about a
# million-token prompt. May not run the model.
#
# <details><summary>Hint</summary>
#
# For `pairs`: does the number of keys a query at position `p` sees depend on which chunk
# it landed in? For `cached_reads`: how long is the prefix before chunk `k`? Check both on
# `chunk_size = num_tokens`, where the answer is the full prefill's.
#
# </details>

# %%
def chunked_prefill_work(num_tokens, chunk_size):
    ### BEGIN SOLUTION
    pairs = num_tokens * (num_tokens + 1) // 2                  # position p sees p + 1 keys, chunked or not
    cached_reads = sum(range(0, num_tokens, chunk_size))         # chunk k reads the prefix before its start
    return pairs, cached_reads
    ### END SOLUTION


# %%
ex.check_chunked_prefill_work(chunked_prefill_work)  # points: 2
for size in (8192, 2048, 512, 128):
    pairs, reads = chunked_prefill_work(8192, size)
    print(f"8192 tokens in chunks of {size:>4}: {pairs:,} pairs attended, {reads:>10,} cached keys re-read "
          f"({reads / 8192:.1f}x the prompt)")

# %% [markdown]
# Done: chunking leaves the KV and the attended pairs unchanged, and pays for it in
# re-reads of the cache, which grow as the chunks shrink. Chapter 5 prices both.
