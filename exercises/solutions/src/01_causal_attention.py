# %% [markdown]
# # Exercises 1: causal attention
#
# Five tasks on chapter 1, warm-up to hard. The first three rebuild what the chapter
# shows (the mask, attention, the merge of two parts); the last two ask you to apply its
# reasoning to cases it did not print: a merge of any number of parts, and a number to
# predict before the engine measures it. Each checker runs your function on fixed random
# cases, compares it with the engine in float64 and names the likely mistake.
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
# May not call `minillm.attention.causal_mask` or `torch.nn.attention.bias`'s masks: build
# it from `torch.arange`.
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
# the allowed keys, times `v`: shape `[n, Hq, D]`. The queries are the last `n`
# of the `m` positions (a chunk over a cache), so use your mask from task 1.
#
# May call: torch's tensor operations, your `causal_mask`, and
# `torch.nn.functional.scaled_dot_product_attention` *with your mask as `attn_mask`*
# (it is the kernel; the mask is the task). May not call: the engine's attention
# functions (`minillm.attention.*`) or `torch.nn.attention.bias`'s masks.
#
# <details><summary>Hint</summary>
#
# Three questions in order: how do `Hkv` heads become `Hq` heads so that neighbouring query
# heads share one (chapter 2 calls this the head expansion)? Which dimension of the scores
# tensor does each query's softmax run over, so that its weights sum to one across its
# keys? Which entries must become `-inf` before the softmax, and which of your mask's
# alignments puts the queries at the end?
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
# four tensors. May not call `minillm.attention.merge_attention`.
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
ex.check_merge_attention(merge)  # points: 2


# %% [markdown]
# ## 4. A chunk's keys in any number of pieces
#
# Split-KV kernels cut a long key range into pieces and merge the partial results. Here
# the keys of a chunk (its `c` cached keys, then its own `n`) are cut at arbitrary
# positions, **through the chunk too**, and each piece is attended with the chunk's
# bottom-right mask cut to that piece. `merge_parts(parts)` gets the list of
# `(out, lse)` pairs, one per piece in key order (`out: [n, H, D]`, `lse: [n, H]`), and
# returns `(out, lse)` over all the keys: what one attention over the whole range gives.
# The parts come exactly as a kernel returns them, nothing cleaned up. May not call
# `minillm.attention.merge_attention`.
#
# <details><summary>Hint</summary>
#
# Folding the two-part merge over the list is the idea, but first look at a piece that
# lies wholly after some query's position: what is that row's sum of `exp(scores)` over
# the piece, its log, and the "normalised" output (a sum divided by that sum)? What weight
# must such a part get in that row, and what does a weight of zero times its output give
# in floating point?
#
# </details>

# %%
def merge_parts(parts):
    ### BEGIN SOLUTION
    lses = torch.stack([lse for _, lse in parts])                      # [P, n, H]
    lse = torch.logsumexp(lses, dim=0)                                  # [n, H]
    out = torch.zeros_like(parts[0][0])
    for part_out, part_lse in parts:
        weight = torch.exp(part_lse - lse)[..., None]                   # 0 where the row sees none of it
        out = out + torch.where(weight > 0, part_out * weight, torch.zeros_like(part_out))
    return out, lse
    ### END SOLUTION


# %%
ex.check_merge_parts(merge_parts)  # points: 3

# %% [markdown]
# ## 5. Predict, then measure: the scores a mask throws away
#
# Chapter 1, section 5: a kernel given an explicit mask computes every score of the
# chunk's `[n, s + n]` rectangle, then throws the masked ones away. Over a whole chunked
# prefill of `num_tokens` tokens in chunks of `chunk_size`, what fraction of all the
# scores computed is thrown away? `masked_fraction(num_tokens, chunk_size)` returns your
# **prediction**, reasoned from the shape of each chunk's mask (do not build the masks:
# the checker also asks about a billion-token prompt). The checker measures the fraction
# by building every chunk's mask with the engine and counting, and accepts 0.1% relative
# error. May not call `minillm.attention.causal_mask`.
#
# <details><summary>Hint</summary>
#
# For one chunk: how many scores does its rectangle hold, and how many of them lie above
# its diagonal (does the cached part have any)? Then: is the fraction for the whole
# prefill the average of the chunks' fractions, or something else? Check yourself on a
# chunk size as large as the prompt, where you know the answer.
#
# </details>

# %%
def masked_fraction(num_tokens, chunk_size):
    ### BEGIN SOLUTION
    masked = computed = 0
    for start in range(0, num_tokens, chunk_size):
        n = min(chunk_size, num_tokens - start)
        masked += n * (n - 1) // 2
        computed += n * (start + n)
    return masked / computed
    ### END SOLUTION


# %%
ex.check_masked_fraction(masked_fraction)  # points: 2
from minillm.attention import causal_mask as engine_mask   # the measurement, after the prediction

predicted = masked_fraction(8192, 512)
masks = [engine_mask(min(512, 8192 - s), min(s + 512, 8192)) for s in range(0, 8192, 512)]
measured = sum(int((~m).sum()) for m in masks) / sum(m.numel() for m in masks)
print(f"8192 tokens in chunks of 512: predicted {predicted:.4%} of the scores thrown away, measured {measured:.4%}")
assert abs(predicted - measured) <= 1e-3 * measured

# %% [markdown]
# Done: the mask, the attention and the merge (of two parts or of many) are the pieces
# every chunked-prefill kernel is made of, and the thrown-away fraction is why the engine
# never builds a chunk's mask. Chapter 2 puts attention inside the model.
