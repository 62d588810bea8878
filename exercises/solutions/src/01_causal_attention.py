# %% [markdown]
# # Exercises 1: causal attention
#
# Six tasks on chapter 1. The first two are warm-ups (the chapter's mask and attention, from
# memory); the others take its ideas where the chapter did not: a sliding window (Mistral's),
# a merge that the chapter's own formula gets wrong, a merge of any number of parts, and a
# number to predict before the engine measures it. Each checker runs your
# function on fixed random cases, compares it with the engine in float64 and names the
# likely mistake. Fill in the bodies where it says `raise NotImplementedError`, then run
# the check cell below each one.

# %%
import math

import torch

import minillm.grading as ex

# %% [markdown]
# ## 1. The mask of a chunk over a cache
#
# `causal_mask(q_len, k_len)` returns a boolean `[q_len, k_len]` tensor, `True` where
# query `i` may attend to key `j`, for a chunk of `q_len` new tokens whose cached prefix
# makes `k_len` keys in all. Build it from `torch.arange`; do not call
# `minillm.attention.causal_mask` or `torch.nn.attention.bias`'s masks.
#
# <details><summary>Hint</summary>
#
# Where does the chunk's first query sit among the `k_len` positions? Give every query its
# absolute position and every key its own, and ask which keys a query may see.
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
# `attention(q, k, v)` takes `q: [n, Hq, D]` and `k, v: [m, Hkv, D]` (`m >= n`, `Hq` a
# multiple of `Hkv`: grouped-query attention, chapter 2) for a chunk of `n` queries, the
# last `n` of the `m` positions. Return the attention output `[n, Hq, D]`, each query
# attending to the keys your mask from task 1 allows. You may use torch's tensor
# operations, your mask, and `scaled_dot_product_attention` given your mask; not the
# engine's attention functions.
#
# <details><summary>Hint</summary>
#
# Three questions in order: which KV head does query head `h` read, and how do `Hkv` heads
# become `Hq` so that neighbouring query heads share one? Over which dimension of the scores
# does each query's softmax run? Which entries must be `-inf` before it?
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
ex.check_attention(attention)  # points: 1


# %% [markdown]
# ## 3. A sliding window
#
# Mistral-7B's first release attends through a **sliding window**: each query sees at most
# `window` keys, the most recent ones, its own key among them (`sliding_window` in its
# `config.json`). The engine has no such mask. Write `window_mask(q_len, k_len, window)`:
# the mask of a chunk of `q_len` queries over `k_len` keys (cached prefix and chunk, as in
# task 1) under a window of `window` keys. Same rules: `torch.arange`, no engine mask.
#
# <details><summary>Hint</summary>
#
# Start from what task 1 allows and ask what the window takes away: for the query at
# absolute position `p`, which is the oldest key it may still see? Try it by hand on a
# chunk of 2 over 5 keys with a window of 2, and on a window longer than the context.
#
# </details>

# %%
def window_mask(q_len, k_len, window):
    ### BEGIN SOLUTION
    query_pos = torch.arange(q_len)[:, None] + (k_len - q_len)
    key_pos = torch.arange(k_len)[None, :]
    return (key_pos <= query_pos) & (key_pos > query_pos - window)
    ### END SOLUTION


# %%
ex.check_window_mask(window_mask)  # points: 2


# %% [markdown]
# ## 4. Debug: the merge that returns NaN
#
# Chapter 1, section 5 splits a chunk's keys in two, attends to each part and merges the
# parts with `merge_attention`. That split works because every query sees every cached key.
# With a sliding window it does not: a late query of the chunk may see **none** of the
# cached part. A kernel attending to a part a row cannot see returns for that row
# `lse = -inf` (the log of an empty sum) and `out = NaN` (0/0). The same happens to a
# split-KV kernel that cuts a chunk's keys through the chunk: an early query sees nothing
# of the late keys. Run the chapter's `merge_attention` on such parts and those rows come
# out NaN.
#
# Write `merge(out_a, lse_a, out_b, lse_b)` (`out_*: [n, H, D]`, `lse_*: [n, H]`) that returns
# `(out, lse)`, the attention over both parts, also in those rows and with scores in the
# hundreds. Only these four tensors; no keys, no values; not `merge_attention`. A row may see
# nothing of one part, never of both: every query sees its own key, and it lies in one of them.
#
# <details><summary>Hint</summary>
#
# Take the chapter's formula and follow one row that sees nothing of part B: what are its
# `lse_b`, its merged `lse`, the weight part B gets, and the product of that weight with
# `out_b`? What should the weight of a part the row cannot see be, and how do you make the
# product come out as that, even with `out_b` holding NaN?
#
# </details>

# %%
def merge(out_a, lse_a, out_b, lse_b):
    ### BEGIN SOLUTION
    lse = torch.logaddexp(lse_a, lse_b)                                # [n, H]
    out = torch.zeros_like(out_a)
    for part_out, part_lse in ((out_a, lse_a), (out_b, lse_b)):
        weight = torch.exp(part_lse - lse)[..., None]                  # 0 where the row sees none of it
        out = out + torch.where(weight > 0, part_out * weight, torch.zeros_like(part_out))
    return out, lse
    ### END SOLUTION


# %%
ex.check_merge_attention(merge)  # points: 2


# %% [markdown]
# ## 5. A chunk's keys in any number of pieces
#
# Split-KV kernels cut a long key range into many pieces. Here a chunk's keys (its `c`
# cached keys, then its own `n`) are cut at arbitrary positions, through the chunk too,
# and each piece is attended with the chunk's bottom-right mask cut to that piece.
# `merge_parts(parts)` gets the list of `(out, lse)` pairs, one per piece in key order, as
# the kernel returns them (NaN and `-inf` included), and returns `(out, lse)` over all the
# keys. Not `minillm.attention.merge_attention`.
#
# <details><summary>Hint</summary>
#
# Is merging associative, and does the order of the parts matter? If you fold task 4's
# merge over the list, check the case of a row that sees none of the FIRST part; if you
# merge all parts at once, which torch function gives the union's log-sum-exp?
#
# </details>

# %%
def merge_parts(parts):
    ### BEGIN SOLUTION
    lses = torch.stack([lse for _, lse in parts])                      # [P, n, H]
    lse = torch.logsumexp(lses, dim=0)                                  # [n, H]
    out = torch.zeros_like(parts[0][0])
    for part_out, part_lse in parts:
        weight = torch.exp(part_lse - lse)[..., None]
        out = out + torch.where(weight > 0, part_out * weight, torch.zeros_like(part_out))
    return out, lse
    ### END SOLUTION


# %%
ex.check_merge_parts(merge_parts)  # points: 2

# %% [markdown]
# ## 6. Predict, then measure: the scores a mask throws away
#
# Chapter 1, section 5: a kernel given an explicit mask computes every score of the chunk's
# `[n, s + n]` rectangle, then throws the masked ones away. Over a whole chunked prefill of
# `num_tokens` tokens in chunks of `chunk_size`, what fraction of all the scores computed is
# thrown away? Before you write code, put a number on 8192 tokens in chunks of 512, and say
# why in a sentence. Then `masked_fraction(num_tokens, chunk_size)` returns your
# **prediction** for any prompt, reasoned from the shape of each chunk's mask: the checker
# also asks about a billion-token prompt, so do not build masks. The checker measures the
# fraction by building every chunk's mask with the engine and counting; it accepts 0.1%.
#
# <details><summary>Hint</summary>
#
# For one chunk: how many scores does its rectangle hold, and how many of them does the
# mask drop (does the cached part lose any)? For the whole prefill: is it the mean of the
# chunks' fractions, or something else? And the last chunk: is it as long as the others?
# Check yourself on a chunk as large as the prompt, where you know the answer.
#
# </details>

# %%
def masked_fraction(num_tokens, chunk_size):
    ### BEGIN SOLUTION
    masked = computed = 0
    for start in range(0, num_tokens, chunk_size):
        n = min(chunk_size, num_tokens - start)
        masked += n * (n - 1) // 2            # above the diagonal of the chunk's own square
        computed += n * (start + n)           # the whole rectangle
    return masked / computed
    ### END SOLUTION


# %%
ex.check_masked_fraction(masked_fraction)  # points: 3
from minillm.attention import causal_mask as engine_mask   # the measurement, after the prediction

predicted = masked_fraction(8192, 512)
masks = [engine_mask(min(512, 8192 - s), min(s + 512, 8192)) for s in range(0, 8192, 512)]
measured = sum(int((~m).sum()) for m in masks) / sum(m.numel() for m in masks)
print(f"8192 tokens in chunks of 512: predicted {predicted:.4%} of the scores thrown away, measured {measured:.4%}")
assert abs(predicted - measured) <= 1e-3 * measured

# %% [markdown]
# Done: masks with and without a window, attention over grouped heads, and merges that stay
# right when a part is empty for a row: the pieces every chunked-prefill kernel is made of.
# The thrown-away fraction is why the engine never builds a chunk's mask. Chapter 2 puts
# attention inside the model.
