# %% [markdown]
# # Exercises 2: the model
#
# Four layers of the Llama-style decoder from chapter 2, written by you and
# checked against the engine's own (`minillm.model`) on fresh random inputs.
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
# `x.pow(2).mean(-1, keepdim=True)` is one value per row; `torch.rsqrt(... + eps)` puts eps inside the root.
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
# `torch.repeat_interleave` repeats each KV head `group` times in a row (0,0,1,1);
# `Tensor.repeat` would tile them (0,1,0,1).
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
# `nn.Linear` computes `x @ W.T`. SiLU goes on the gate projection only: `F.silu(x @ gate_w.T) * (x @ up_w.T)`.
#
# </details>

# %%
def swiglu(x, gate_w, up_w, down_w):
    ### BEGIN SOLUTION
    return (F.silu(x @ gate_w.T) * (x @ up_w.T)) @ down_w.T
    ### END SOLUTION


# %%
ex.check_swiglu(swiglu)  # points: 2

# %% [markdown]
# ## 4. RoPE
#
# `rope(x, positions, theta)`: `x` is `[T, H, D]`, `positions` the absolute
# position of each row `[T]`. Pair dimension `i` with `i + D/2` (Hugging
# Face's "rotate half" layout) and rotate each pair by the angle
# `position * theta ** (-2i / D)`, for `i` in `0 .. D/2 - 1`. Compute the
# angles in float64.
#
# <details><summary>Hint</summary>
#
# `inv_freq = theta ** (-torch.arange(D // 2) * 2 / D)` (float64), `angles = positions[:, None] * inv_freq`,
# then with `x1, x2 = x[..., :D//2], x[..., D//2:]` the rotated halves are `x1 cos - x2 sin` and
# `x2 cos + x1 sin`; add a head axis to cos and sin (`[:, None, :]`).
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
ex.check_rope(rope)  # points: 3

# %% [markdown]
# Done: with these four and your attention from exercises 1 you have every
# piece of a decoder layer. Chapter 3 stores K and V so that decoding does not
# recompute them.
