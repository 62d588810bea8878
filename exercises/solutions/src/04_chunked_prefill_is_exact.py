# %% [markdown]
# # Exercises 4: Chunked prefill is exact
#
# Four tasks that take chapter 4's proof where it did not go: the mask of a step that packs
# several requests, a tool that tells where a broken chunked prefill first leaves the full
# prefill's cache (graded on bugs it has never seen), a chunked prefill of several prompts
# packed into one forward pass per step, and the work and re-reads of a chunked prefill,
# predicted before the engine measures them. Write each function, then run the check cell
# below it: it compares your function with the engine and says what is wrong.

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
# where a query may attend to a key. Build it from `torch.arange`; do not call
# `minillm.attention.causal_mask`.
#
# <details><summary>Hint</summary>
#
# Which keys may a query of request 0 see among request 1's? And among its own: where does
# its first new token sit? Draw the mask of two requests, `query_lens=[2, 1]` and
# `cached_lens=[1, 3]`, by hand first.
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
# ## 2. Debug: where does a chunked prefill first go wrong?
#
# Chapter 4, section 5 catches three bugs with one check: chunked against full KV. A check
# that only says "wrong" leaves the hunt to you. Write the tool that narrows it down:
# `locate_bug(prefill_fn, model, token_ids, chunk_size)`, where `prefill_fn(model,
# token_ids, chunk_size)` is some chunked prefill returning the KV
# `[num_layers, 2, T, num_kv_heads, head_dim]` (K at index 0, V at 1 of the second axis).
# Return `None` if it gives the full prefill's KV (`minillm.prefill_kv(model, token_ids)`)
# up to floating-point rounding, else a triple `(layer, which, position)`: the first layer
# whose cache differs, which of its tensors differ (`"K"`, `"V"` or `"both"`), and the first
# position where that layer differs. The model is float64. The checker runs your tool on
# the chapter's bugs and on others it never shows you, each built from the engine with one
# thing changed, and on an exact prefill whose sums run in another order than one pass.
#
# Before you run the check, say for the chapter's three bugs with chunks of 16 what your
# tool should return, from where in a layer each bug acts.
#
# <details><summary>Hint</summary>
#
# How large is a rounding difference in float64, and how large is a bug's? Which axis of
# the KV is the layer, which K and V, which the position? A layer can differ in K alone:
# when would that happen, and can it happen to V alone?
#
# </details>

# %%
def locate_bug(prefill_fn, model, token_ids, chunk_size):
    ### BEGIN SOLUTION
    error = (prefill_fn(model, token_ids, chunk_size) - minillm.prefill_kv(model, token_ids)[0]).abs()
    for layer in range(error.shape[0]):
        wrong = ~(error[layer].amax(dim=(2, 3)) <= 1e-9)      # [K or V, position]: beyond rounding, or NaN
        if wrong.any():
            which = "both" if wrong.any(1).all() else "KV"[int(wrong.any(1).nonzero()[0])]
            return layer, which, int(wrong.any(0).nonzero()[0])
    return None
    ### END SOLUTION

# %%
ex.check_locate_bug(locate_bug)  # points: 3

# %% [markdown]
# ## 3. Several prompts, chunked and packed
#
# The proof of chapter 4 is about one prompt, but the engine packs the chunks of several
# requests into one forward pass (chapter 1, section 6; your `step_mask` from task 1).
# `packed_chunked_prefill(model, prompts, chunk_size)`: run all the prompts (a list of
# token lists) chunk by chunk, where **each step is one `model(...)` call** carrying the
# next `chunk_size` tokens (fewer at the end) of every prompt not yet done, in the order
# given. Return the list of each prompt's KV `[num_layers, 2, T_r, num_kv_heads, head_dim]`.
# Each must equal that prompt's own full prefill (float64, 1e-10). One `BlockManager` and
# one `PagedKVCache` hold them all; chapter 4's `my_chunked_prefill` shows the calls for one
# prompt. May not call `minillm.prefill_kv` or the `ModelRunner`.
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
# ## 4. Predict, then measure: the work of a chunked prefill
#
# Chapter 4 argues that chunking cannot change the KV. What does it change in the work?
# `chunked_prefill_work(num_tokens, chunk_size)` returns your **predicted** pair
# `(pairs, cached_reads)` for a chunked prefill of one prompt, in one layer:
# - `pairs`: the (query, key) scores that survive the causal mask, over the whole prefill;
# - `cached_reads`: the keys the prefill's forward passes read back from the cache (the
#   keys a pass computes itself come with the step, as chapter 1's split takes them).
#
# Put numbers on 8192 tokens in chunks of 512 first, and say why. The checker measures both
# on the engine (`prefill_kv(..., chunk_size=...)`, its forward passes recorded) and
# accepts no difference: these are counts. It also asks about a million-token prompt. May
# not run the model.
#
# <details><summary>Hint</summary>
#
# For `pairs`: does the number of keys a query at position `p` sees depend on which chunk
# it landed in? For `cached_reads`: what does a chunk find in the cache when its pass
# starts, and what does a single full prefill find? Check both on `chunk_size =
# num_tokens`.
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
ex.check_chunked_prefill_work(chunked_prefill_work)  # points: 3
for size in (8192, 2048, 512, 128):
    pairs, reads = chunked_prefill_work(8192, size)
    print(f"8192 tokens in chunks of {size:>4}: {pairs:,} pairs attended, {reads:>10,} cached keys re-read "
          f"({reads / 8192:.1f}x the prompt)")

# %% [markdown]
# Done: a packed step's mask, a tool that finds the first layer and position a bug touches,
# packing several prompts' chunks into one pass, and the price of chunking: the same
# attended pairs, paid for in re-reads of the cache that grow as the chunks shrink.
# Chapter 5 prices both.
