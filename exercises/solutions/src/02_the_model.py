# %% [markdown]
# # Exercises 2: the model
#
# Four layers of the Llama-style decoder from chapter 2, written by you and
# checked against the engine's own (`minillm.model`) on fixed random inputs, then two
# tasks the chapter does not print: moving cached keys to new positions (what RoPE's
# rotations allow), and predicting a model's parameter count before the engine builds it.
# May not call: the engine's layers (`minillm.model.*`, `torch.nn.functional.rms_norm`).
# Fill in the bodies where it says `raise NotImplementedError`, then run the
# check cell below each one.

# %%
import torch
import torch.nn.functional as F

import minillm.grading as ex

# %% [markdown]
# ## 1. RMSNorm
#
# `rms_norm(x, weight, eps)`: divide each row of `x: [T, d]` by the root of
# the mean of its squares (plus `eps` inside the root), then multiply by
# `weight: [d]`. No mean is subtracted, unlike LayerNorm.
#
# <details><summary>Hint</summary>
#
# One normaliser per row: over which dimension does the mean of squares run, and how do
# you keep that dimension so it broadcasts back over the row? Where does `eps` go: inside
# the root or after it (the engine's `RMSNorm` says)?
#
# </details>

# %%
def rms_norm(x, weight, eps):
    ### BEGIN SOLUTION
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    ### END SOLUTION


# %%
ex.check_rms_norm(rms_norm)  # points: 1


# %% [markdown]
# ## 2. Grouped-query attention: sharing KV heads
#
# `repeat_kv(k, num_heads)`: `k` is `[m, Hkv, D]`; return `[m, num_heads, D]`
# where query head `h` gets KV head `h // (num_heads // Hkv)`. Mind the order:
# neighbouring query heads share a KV head.
#
# <details><summary>Hint</summary>
#
# Write out the KV head each query head needs for 4 query heads and 2 KV heads: is it
# 0,1,0,1 or 0,0,1,1? Of torch's two ways of repeating along a dimension, one tiles the
# whole tensor, the other repeats each element in place.
#
# </details>

# %%
def repeat_kv(k, num_heads):
    ### BEGIN SOLUTION
    return k.repeat_interleave(num_heads // k.shape[1], dim=1)
    ### END SOLUTION


# %%
ex.check_repeat_kv(repeat_kv)  # points: 1


# %% [markdown]
# ## 3. The SwiGLU MLP
#
# `swiglu(x, gate_w, up_w, down_w)`: `x: [T, d]`, `gate_w, up_w: [f, d]`,
# `down_w: [d, f]` (PyTorch's `nn.Linear` layout: out x in). Return
# `down(silu(gate(x)) * up(x))`.
#
# <details><summary>Hint</summary>
#
# `nn.Linear` stores its weight as out x in: which side of `x` does it go on, and which
# way round? Of the two projections, which one passes through SiLU, and which one only
# scales it?
#
# </details>

# %%
def swiglu(x, gate_w, up_w, down_w):
    ### BEGIN SOLUTION
    return (F.silu(x @ gate_w.T) * (x @ up_w.T)) @ down_w.T
    ### END SOLUTION


# %%
ex.check_swiglu(swiglu)  # points: 1

# %% [markdown]
# ## 4. RoPE
#
# `rope(x, positions, theta)`: `x` is `[T, H, D]`, `positions` the absolute
# position of each row `[T]`. Pair dimension `i` with `i + D/2` (Hugging
# Face's "rotate half" layout) and rotate each pair by the angle
# `position * theta ** (-2i / D)`, for `i` in `0 .. D/2 - 1`. The checker compares in
# float64 to 1e-8, so compute the frequencies **and** the angles in float64: torch makes
# float32 by default (`torch.arange(n) * 2 / D` is float32), and a float32 angle at
# position 4000 is already off by about 1e-4 radians.
#
# <details><summary>Hint</summary>
#
# Build one angle per (row, pair): which tensor has one entry per row, which one per pair,
# and how do they broadcast to `[T, D/2]`? Rotating a pair `(a, b)` by an angle is the 2-D
# rotation you know; here `a` is in the first half of the head and `b` in the second. The
# angles have no head axis: where must one go so that every head of a row turns alike?
# Print the dtype of every intermediate tensor once.
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
ex.check_rope(rope)  # points: 2

# %% [markdown]
# ## 5. Moving cached keys to new positions
#
# The cache stores K **after** RoPE. Suppose a cached block of keys computed at
# positions `old_positions` must now serve at `new_positions` (a shared system prompt
# reused at another offset, or a cache that drops its oldest tokens and shifts the rest
# down, as StreamingLLM does). The raw keys are gone: only `k_cached`, rotated at the old
# positions, remains. `move_rope(k_cached, old_positions, new_positions, theta)` returns
# the keys exactly as RoPE would have rotated them at `new_positions` (float64, to 1e-8).
# May call your `rope` from task 4; may not call the engine's RoPE functions.
#
# <details><summary>Hint</summary>
#
# Chapter 2, section 2: what does a rotation by `a` followed by a rotation by `b` give?
# The stored key has had one rotation already; which single rotation takes it from where
# it is to where it must be? Test your answer on one key at old position 5 that must move
# to position 2.
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
# ## 6. Predict, then measure: how many parameters?
#
# `num_parameters(cfg)`: **predict** the number of parameters of the engine's model for
# the config `cfg`, from its shapes alone (chapter 2, section 1 shows every module). Mind
# the fields that change the count: `head_dim` (not always `hidden_size // num_heads`),
# `num_kv_heads`, `tie_word_embeddings` (the LM head shares the embedding's matrix),
# `attention_bias` (biases on q, k and v) and `qk_norm` (an RMSNorm weight per head
# dimension on q and on k). The checker builds each model (on PyTorch's `meta` device,
# which allocates nothing) and counts; it accepts 0.1%. May not call
# `cfg.num_parameters()` or build a model.
#
# <details><summary>Hint</summary>
#
# Walk one decoder layer from input to output and write the shape of every weight and
# bias, in and out: which of them are `hidden_size` wide, which `num_heads * head_dim`,
# which `num_kv_heads * head_dim`? A norm has one weight per feature. Then what sits
# outside the layers, before and after them?
#
# </details>

# %%
def num_parameters(cfg):
    ### BEGIN SOLUTION
    d, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    attention = d * q + 2 * d * kv + q * d + (q + 2 * kv if cfg.attention_bias else 0) \
        + (2 * cfg.head_dim if cfg.qk_norm else 0)
    per_layer = attention + 3 * d * cfg.intermediate_size + 2 * d      # + the two RMSNorms
    lm_head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * d
    return cfg.num_layers * per_layer + cfg.vocab_size * d + d + lm_head
    ### END SOLUTION


# %%
ex.check_num_parameters(num_parameters)  # points: 2
import minillm                                            # the measurement, after the prediction
from minillm.model import LlamaModel

llama = minillm.ModelConfig.preset("llama-3-8b")
with torch.device("meta"):
    measured = sum(p.numel() for p in LlamaModel(llama).parameters())
print(f"Llama-3-8B: predicted {num_parameters(llama) / 1e9:.3f} B parameters, measured {measured / 1e9:.3f} B; "
      f"{2 * measured / 1e9:.1f} GB of weights in bf16")
assert num_parameters(llama) == measured

# %% [markdown]
# Done: with these layers and your attention from exercises 1 you have every
# piece of a decoder layer, and RoPE's algebra lets a cache move. Chapter 3 stores K and V
# so that decoding does not recompute them.
