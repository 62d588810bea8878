# %% [markdown]
# # Exercises 9: the mixed step on a GPU
#
# Four functions from chapter 9, in plain torch (no GPU, no triton needed): the mask of
# one key tile, the online-softmax update a program does per tile, the tiles a whole
# packed step visits, and the arithmetic intensity of one request's attention. Each
# checker compares your function with a brute-force reference or with the engine's
# accounting on fresh random cases (and switches off the engine's helpers while yours
# runs). Fill in the bodies where it says `raise NotImplementedError`.

# %%
import torch

import minillm.grading as ex
from minillm import ModelConfig

# %% [markdown]
# ## 1. The mask of one tile
#
# A program holds rows `[first_row, first_row + num_rows)` of a request's new tokens; the
# request has `cached_len` tokens in the cache and `query_len` new ones. Return the
# `[num_rows, block_size]` bool mask of key tile `tile` (keys
# `[tile * block_size, (tile + 1) * block_size)`): True where the row may see the key. A
# row sees keys at or before its own position; slots past the sequence's end hold
# nothing (a real row never sees them anyway: why?); rows past `query_len` (the tile's
# padding) see nothing.
#
# <details><summary>Hint</summary>
#
# Where does new row `r` sit in the sequence? Build the query positions and the key
# positions as two `arange`s and compare them with broadcasting, then AND in the two
# bounds.
#
# </details>

# %%
def tile_mask(cached_len, query_len, first_row, num_rows, tile, block_size):
    ### BEGIN SOLUTION
    rows = first_row + torch.arange(num_rows)
    query_pos = cached_len + rows
    key_pos = tile * block_size + torch.arange(block_size)
    visible = key_pos[None, :] <= query_pos[:, None]
    return visible & (key_pos[None, :] < cached_len + query_len) & (rows < query_len)[:, None]
    ### END SOLUTION


# %%
ex.check_tile_mask(tile_mask)  # points: 1

# %% [markdown]
# ## 2. The online-softmax update of one key tile
#
# A program keeps, per row, the running maximum `m` of the scores seen so far, the sum
# `l` of `exp(score - m)` and the accumulator `acc` of `exp(score - m) * v`. Given the
# scores of the next key tile (`[R, K]`, `-inf` where masked) and its values (`[K, D]`),
# return the new `(m, l, acc)`. The caller starts from `m = -inf`, `l = 0`, `acc = 0`
# and divides `acc / l` after the last tile; the scores can be large (up to ~120), so
# never take `exp` of a raw score.
#
# <details><summary>Hint</summary>
#
# When the maximum grows from `m` to `m_new`, everything summed so far was weighted by
# `exp(score - m)` and must now be weighted by `exp(score - m_new)`: what single factor
# turns one into the other? Apply it to both `l` and `acc`.
#
# </details>

# %%
def online_softmax_update(m, l, acc, scores, v):
    ### BEGIN SOLUTION
    m_new = torch.maximum(m, scores.max(dim=1).values)
    alpha = torch.exp(m - m_new)
    p = torch.exp(scores - m_new[:, None])
    return m_new, l * alpha + p.sum(dim=1), acc * alpha[:, None] + p @ v
    ### END SOLUTION


# %%
ex.check_online_softmax_update(online_softmax_update)  # points: 2

# %% [markdown]
# ## 3. The tiles of a whole packed step
#
# The engine's kernel gives each request `ceil(query_len / rows_per_tile)` query tiles
# and walks, for each, the request's key tiles (one cache block each,
# `ceil((cached_len + query_len) / block_size)` of them). Count the (query tile, key tile)
# pairs of a whole step by kind: **unmasked** (every row of the query tile sees every slot
# of the key tile), **masked** (some but not all), **skipped** (none). Return
# `(unmasked, masked, skipped)`. Chapter 9 drew these for one chunk; this time do it for
# a packed step, with the arithmetic, not by building masks.
#
# <details><summary>Hint</summary>
#
# For a query tile, only two positions matter: its first row's and its last row's. Which
# key tiles end at or before the first? Which start after the last? And the partly filled
# last block of a sequence: can every row see every one of its slots?
#
# </details>

# %%
def count_tiles(query_lens, cached_lens, block_size, rows_per_tile):
    ### BEGIN SOLUTION
    unmasked = masked = skipped = 0
    for n, c in zip(query_lens, cached_lens):
        num_key_tiles = -(-(c + n) // block_size)
        for first in range(0, n, rows_per_tile):
            first_pos = c + first
            last_pos = c + min(first + rows_per_tile, n) - 1
            full = (first_pos + 1) // block_size          # tiles whose last slot <= first_pos
            seen = last_pos // block_size + 1             # tiles whose first slot <= last_pos
            unmasked += full
            masked += seen - full
            skipped += num_key_tiles - seen
    return unmasked, masked, skipped
    ### END SOLUTION


# %%
ex.check_count_tiles(count_tiles)  # points: 2

# %% [markdown]
# ## 4. Arithmetic intensity of one request's attention
#
# Count one request's attention (scores `Q K^T` and values `P V`) in one layer as
# chapter 5's accounting does, and return FLOPs per byte. The request brings `num_new`
# tokens over `num_cached` cached ones:
#
# * FLOPs: every (query, key) pair the causal mask allows, for every query head, costs
#   `2 * head_dim` for its score and as much again for its share of the values.
# * Bytes (`dtype_bytes` per element): the cached K and V are read, the new tokens' K and
#   V are written, Q is read and the output written.
#
# For a decode of Llama-3-8B over 4096 tokens in bf16 the answer is about 4.
#
# <details><summary>Hint</summary>
#
# The pairs of a chunk are `num_new * num_cached` plus a triangle. K and V have
# `num_kv_heads` heads; Q and the output have `num_heads`. The number of layers cancels.
#
# </details>

# %%
def attention_intensity(cfg: ModelConfig, num_new, num_cached, dtype_bytes):
    ### BEGIN SOLUTION
    pairs = num_new * num_cached + num_new * (num_new + 1) // 2
    flops = 2 * 2 * pairs * cfg.head_dim * cfg.num_heads
    kv_elements = 2 * (num_cached + num_new) * cfg.num_kv_heads * cfg.head_dim
    q_out_elements = 2 * num_new * cfg.num_heads * cfg.head_dim
    return flops / ((kv_elements + q_out_elements) * dtype_bytes)
    ### END SOLUTION


# %%
ex.check_attention_intensity(attention_intensity)  # points: 3
