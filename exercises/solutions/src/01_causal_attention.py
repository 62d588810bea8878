# %% [markdown]
# # Exercises 1: causal attention
#
# Three functions from chapter 1, written by you and checked against the engine
# (`minillm.attention`). Each checker runs your function on fresh random shapes,
# compares it with the engine in float64 and tells you what is wrong.
# Fill in the bodies where it says `raise NotImplementedError`, then run the
# check cell below each one.

# %%
import math

import torch

import minillm.grading as ex

# %% [markdown]
# ## 1. The mask of a chunk over a cache
#
# `causal_mask(q_len, k_len)` returns a boolean `[q_len, k_len]` tensor, `True`
# where query `i` may attend to key `j`. The queries are the *last* `q_len` of
# the `k_len` positions (a chunk whose prefix is already cached), so query `i`
# sits at position `k_len - q_len + i` and sees every key up to and including
# that position: the mask is aligned bottom-right.
#
# <details><summary>Hint</summary>
#
# Give every query its absolute position (the chunk's queries are the last `q_len` of
# the `k_len` positions) and every key its own; a query may see a key at or before it.
# A column of query positions compared with a row of key positions broadcasts to the
# whole `[q_len, k_len]` mask.
#
# </details>

# %%
def causal_mask(q_len, k_len):
    ### BEGIN SOLUTION
    query_pos = torch.arange(q_len)[:, None] + (k_len - q_len)   # [q_len, 1]
    key_pos = torch.arange(k_len)[None, :]                        # [1, k_len]
    return key_pos <= query_pos
    ### END SOLUTION


# %%
ex.check_causal_mask(causal_mask)  # points: 1


# %% [markdown]
# ## 2. Causal attention with grouped-query heads
#
# `attention(q, k, v)` takes `q: [n, Hq, D]` and `k, v: [m, Hkv, D]` with
# `m >= n` and `Hq` a multiple of `Hkv` (grouped-query attention: query head
# `h` uses KV head `h // (Hq // Hkv)`). Return `softmax(q k^T / sqrt(D))` over
# the allowed keys, times `v`: shape `[n, Hq, D]`. Use your mask from task 1.
#
# <details><summary>Hint</summary>
#
# Expand K and V to `Hq` heads with `repeat_interleave(group, dim=1)`, compute the scores with
# `torch.einsum("nhd,mhd->hnm", q, k) / sqrt(D)`, set the masked scores to `-inf` with
# `masked_fill(~mask, float("-inf"))`, softmax over the keys, then weight `v`.
#
# </details>

# %%
def attention(q, k, v):
    ### BEGIN SOLUTION
    n, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    k = k.repeat_interleave(group, dim=1)                              # [m, Hq, D]
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(head_dim)  # [Hq, n, m]
    scores = scores.masked_fill(~causal_mask(n, k.shape[0]), float("-inf"))
    return torch.einsum("hnm,mhd->nhd", scores.softmax(-1), v)         # [n, Hq, D]
    ### END SOLUTION


# %%
ex.check_attention(attention)  # points: 2


# %% [markdown]
# ## 3. Merging two partial attentions
#
# You attended the same queries to two disjoint sets of keys, A and B, and kept
# each row's log-sum-exp of the scores (`lse_a`, `lse_b`: `[n, H]`, with the
# outputs `out_a`, `out_b`: `[n, H, D]`). Return `(out, lse)`: the attention
# over A and B together, and its log-sum-exp. No keys, no values: only these
# four tensors.
#
# <details><summary>Hint</summary>
#
# Each part's output was divided by its own sum of `exp(scores)`, whose log is `lse_part`.
# What is the sum over A and B together, and its log (chapter 1, section 4, and the one
# torch function that computes it without overflow)? By what factor must each part's output
# then be rescaled before you add them?
#
# </details>

# %%
def merge(out_a, lse_a, out_b, lse_b):
    ### BEGIN SOLUTION
    lse = torch.logaddexp(lse_a, lse_b)                      # [n, H]
    out = out_a * torch.exp(lse_a - lse)[..., None] + out_b * torch.exp(lse_b - lse)[..., None]
    return out, lse
    ### END SOLUTION


# %%
ex.check_merge_attention(merge)  # points: 3


# %% [markdown]
# Done: the mask, the attention and the merge are the three pieces every
# chunked-prefill kernel is made of. Chapter 2 puts attention inside the model.
