# %% [markdown]
# # Exercises 2: the model
#
# Four tasks on chapter 2. A warm-up (RoPE, which the later tasks use), then three
# problems the chapter does not print: a grouped-query fold that pairs heads wrongly, a
# cache whose keys sit at the wrong positions, and a parameter count to predict, module by
# module, before the engine builds the model. May not call the engine's layers
# (`minillm.model.*`) or its attention functions. Fill in the bodies where it says
# `raise NotImplementedError`, then run the check cell below each one.

# %%
import math

import torch

import minillm.grading as ex

# %% [markdown]
# ## 1. Warm-up: RoPE
#
# `rope(x, positions, theta)`: `x` is `[T, H, D]`, `positions` the absolute position of each
# row `[T]`. Rotate as the engine does (chapter 2, section 2: Hugging Face's "rotate half"
# layout, the frequency of pair `i` is `theta ** (-2i / D)`). The checker compares in
# float64 to 1e-8, at positions in the thousands.
#
# <details><summary>Hint</summary>
#
# Which tensor has one entry per row, which one per pair, and how do they broadcast to one
# angle per (row, pair)? Where must an axis go so that every head of a row turns alike? And
# print the dtype of every intermediate tensor once: torch makes float32 unless asked.
#
# </details>

# %%
def rope(x, positions, theta):
    ### BEGIN SOLUTION
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])   # [D/2]
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]                # [T, D/2]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]                    # [T, 1, D/2]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    ### END SOLUTION


# %%
ex.check_rope(rope)  # points: 1


# %% [markdown]
# ## 2. Debug: grouped-query scores without copying K
#
# Chapter 2, section 3: with grouped-query attention, `Hq` query heads share `Hkv` KV heads.
# Expanding K to `Hq` heads (a `repeat_interleave`) costs a copy of the keys for every
# layer and step. The engine's prefix attention avoids it (chapter 1, section 5): it folds
# the query heads of a group into rows, so each KV head is read as it is. A colleague wrote
# that fold for the scores, below. On Llama-2-7B (as many KV heads as query heads) its
# scores are only scaled wrong; on Llama-3-8B (32 query heads, 8 KV heads) they are also
# paired with the wrong keys.
#
# Write `grouped_scores(q, k)`: `q: [n, Hq, D]`, `k: [m, Hkv, D]`, returns the scores
# `[Hq, n, m]` of query head `h` against its KV head, divided by `sqrt(D)`, **without
# copying K** (no repeat, expand, gather or concatenation of `k`: the checker watches).
#
# <details><summary>Hint</summary>
#
# Write down, for 4 query heads and 2 KV heads, which KV head each query head reads. Then
# look at the reshape below: which query heads end up in the same row group as KV head 0?
# And is the scale the one the chapter's attention uses?
#
# </details>

# %%
def broken_grouped_scores(q, k):
    """q [n, Hq, D], k [m, Hkv, D] -> scores [Hq, n, m], K read as it is (not copied)."""
    n, num_heads, head_dim = q.shape
    m, num_kv_heads, _ = k.shape
    q_rows = q.reshape(n, num_heads // num_kv_heads, num_kv_heads, head_dim)   # [n, group, Hkv, D]
    scores = torch.einsum("ngkd,mkd->kgnm", q_rows, k) / head_dim            # [Hkv, group, n, m]
    return scores.reshape(num_heads, n, m)


# %%
def grouped_scores(q, k):
    ### BEGIN SOLUTION
    n, num_heads, head_dim = q.shape
    m, num_kv_heads, _ = k.shape
    q_rows = q.reshape(n, num_kv_heads, num_heads // num_kv_heads, head_dim)   # [n, Hkv, group, D]
    scores = torch.einsum("nkgd,mkd->kgnm", q_rows, k) / math.sqrt(head_dim)  # [Hkv, group, n, m]
    return scores.reshape(num_heads, n, m)
    ### END SOLUTION


# %%
ex.check_grouped_scores(grouped_scores)  # points: 2

# %% [markdown]
# ## 3. Repair a cache whose keys sit at the wrong positions
#
# The cache stores K **after** RoPE. A server ran for a while with the bug chapter 2,
# section 2 warns about: the keys of each chunk were rotated as if the chunk started at
# position 0. The
# same situation arises on purpose when a cached block must serve at another offset (a
# system prompt reused after a different preamble, or a cache that drops its oldest tokens
# and shifts the rest down, as StreamingLLM does). Either way the raw keys are gone; only
# `k_cached`, rotated at `old_positions`, remains. `move_rope(k_cached, old_positions,
# new_positions, theta)` returns the keys exactly as RoPE would have rotated them at
# `new_positions` (float64, to 1e-8). You may call your `rope`; not the engine's RoPE.
#
# <details><summary>Hint</summary>
#
# Chapter 2, section 2: what does a rotation by `a` followed by a rotation by `b` give?
# The stored key has had one rotation already; which single rotation takes it from where it
# is to where it must be? Test your answer on one key at old position 5 that must move to
# position 2.
#
# </details>

# %%
def move_rope(k_cached, old_positions, new_positions, theta):
    ### BEGIN SOLUTION
    return rope(k_cached, new_positions - old_positions, theta)
    ### END SOLUTION


# %%
ex.check_move_rope(move_rope)  # points: 3

# %% [markdown]
# ## 4. Predict, then measure: every module's parameters
#
# Before building a model, predict what each of its modules holds. `parameter_counts(cfg)`
# returns a dict from module name to its number of parameters (weights and biases, summed
# over the layers) for the engine's model of the config `cfg`. The names are the engine's
# (and Hugging Face's, chapter 2, section 5): `embed_tokens`, `input_layernorm`, `q_proj`,
# `k_proj`, `v_proj`, `o_proj`, `q_norm`, `k_norm`, `post_attention_layernorm`,
# `gate_proj`, `up_proj`, `down_proj`, `norm`, `lm_head`; a module the model does not have
# counts 0 (or is left out). Read every field of `cfg` that changes a shape: `head_dim` is
# not always `hidden_size // num_heads`, and `num_kv_heads`, `tie_word_embeddings`,
# `attention_bias` and `qk_norm` matter too. The checker builds each model on PyTorch's
# `meta` device (no memory) and counts, exactly. May not call `cfg.num_parameters()` or
# build a model. Before you write it, guess which module holds the most of Llama-3-8B's
# parameters, and why; the cell after the check tells.
#
# <details><summary>Hint</summary>
#
# For each module ask: what goes in, what comes out (which of hidden size, query heads x
# head dim, KV heads x head dim, intermediate size, vocabulary), and does it have a bias?
# A norm has one weight per feature it normalises: which features does `q_norm` see? And
# what does "tied" mean for the number of matrices the model holds?
#
# </details>

# %%
def parameter_counts(cfg):
    ### BEGIN SOLUTION
    d, layers, head_dim = cfg.hidden_size, cfg.num_layers, cfg.head_dim
    q, kv = cfg.num_heads * head_dim, cfg.num_kv_heads * head_dim
    bias = cfg.attention_bias
    return {
        "embed_tokens": cfg.vocab_size * d,
        "input_layernorm": layers * d, "post_attention_layernorm": layers * d,
        "q_proj": layers * (d * q + (q if bias else 0)),
        "k_proj": layers * (d * kv + (kv if bias else 0)),
        "v_proj": layers * (d * kv + (kv if bias else 0)),
        "o_proj": layers * q * d,                                  # never a bias
        "q_norm": layers * head_dim if cfg.qk_norm else 0,         # one weight per head dimension
        "k_norm": layers * head_dim if cfg.qk_norm else 0,
        "gate_proj": layers * d * cfg.intermediate_size, "up_proj": layers * d * cfg.intermediate_size,
        "down_proj": layers * cfg.intermediate_size * d,
        "norm": d,
        "lm_head": 0 if cfg.tie_word_embeddings else cfg.vocab_size * d,
    }
    ### END SOLUTION


# %%
ex.check_parameter_counts(parameter_counts)  # points: 3
import minillm                                            # the measurement, after the prediction
from minillm.model import LlamaModel

for name in ("llama-3-8b", "qwen3-0.6b"):
    cfg = minillm.ModelConfig.preset(name)
    predicted = parameter_counts(cfg)
    with torch.device("meta"):
        measured = sum(p.numel() for p in LlamaModel(cfg).parameters())
    attention = sum(predicted[m] for m in ("q_proj", "k_proj", "v_proj", "o_proj"))
    mlp = sum(predicted[m] for m in ("gate_proj", "up_proj", "down_proj"))
    print(f"{name}: predicted {sum(predicted.values()) / 1e9:.3f} B parameters, measured {measured / 1e9:.3f} B; "
          f"attention {attention / measured:.0%}, MLP {mlp / measured:.0%}, "
          f"embedding and head {(predicted['embed_tokens'] + predicted['lm_head']) / measured:.0%}")
    assert sum(predicted.values()) == measured

# %% [markdown]
# Done: RoPE, the grouped-query fold that reads each KV head in place, keys repaired by
# one more rotation, and where a model's parameters sit. Chapter 3 stores K and V so that
# decoding does not recompute them.
