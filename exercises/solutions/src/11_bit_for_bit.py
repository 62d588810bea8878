# %% [markdown]
# # Exercises 11: bit for bit
#
# Four tasks from chapter 11: predict which runs are guaranteed the same bits (the checker
# then measures them), build a tool that finds the step that makes a pipeline
# batch-variant, write a streaming reduction whose bits do not depend on how its input is
# cut, and count distances in ulps. Each checker runs your function on fresh cases and
# switches off the engine's own answer while it runs. Fill in the bodies where it says
# `raise NotImplementedError`.

# %%
import math

import torch

import minillm.grading as ex

# %% [markdown]
# ## 1. Predict, then measure: which runs keep the bits
#
# A run prefills a prompt of `prompt_len` tokens (in dtype `dtype`: "float32", "bfloat16" or
# "float64") with a chunk size (`None`: whole), with `neighbours` other requests' decodes
# sharing each of its steps, on `threads` torch threads, in the default engine or with
# `batch_invariant=True`. Its reference is the same prompt, model, dtype and mode,
# prefilled whole, alone in its steps, on 1 thread.
#
# Return True when that run is *guaranteed* to give the reference's bits (KV and logits),
# False when nothing guarantees it. Decide from what each run computes, without running
# the model (the checker switches the engine off while your function runs, then measures
# every configuration itself and shows you what it saw). A run that happens to keep its
# bits on this machine is not guaranteed to. "Guaranteed" here means on one machine with
# one torch version (chapter 11, section 5): another CPU, GPU or library version may compute
# even the reference differently.
#
# <details><summary>Hint</summary>
#
# When do two runs execute exactly the same sequence of operations on the same shapes?
# Which of the four knobs change a shape, an order of summation or a split between
# threads, and which one removes all of that by construction?
#
# </details>

# %%
def keeps_bits(chunk_size, prompt_len, neighbours, threads, batch_invariant, dtype):
    ### BEGIN SOLUTION
    if batch_invariant:
        return True
    one_step = chunk_size is None or chunk_size >= prompt_len
    return one_step and neighbours == 0 and threads == 1
    ### END SOLUTION


# %%
ex.check_keeps_bits(keeps_bits)  # points: 3

# %% [markdown]
# ## 2. Find the step that makes a pipeline batch-variant
#
# A pipeline is a list of steps, each a function from a batch `[T, d]` to a batch `[T, d]`,
# applied in turn. A step is batch-variant for row `row` when the bits it produces for that
# row depend on the other rows of its input. Write `first_variant_step(steps, batch, row)`:
# the index of the first step that is batch-variant for `row` when the pipeline runs on
# `batch`, or None if none is. The checker plants such steps in random pipelines: some
# change the row's value, some only its rounding, and some change other rows only.
#
# <details><summary>Hint</summary>
#
# To test one step you need the row alone and the row inside the batch, fed to that step
# from the same input. What input does step i see inside the pipeline? And what does
# "the same bits" mean when a difference can be one unit in the last place?
#
# </details>

# %%
def first_variant_step(steps, batch, row):
    ### BEGIN SOLUTION
    x = batch
    for i, step in enumerate(steps):
        inside = step(x)
        if not torch.equal(inside[row:row + 1], step(x[row:row + 1])):
            return i
        x = inside
    return None
    ### END SOLUTION


# %%
ex.check_first_variant_step(first_variant_step)  # points: 3

# %% [markdown]
# ## 3. A streaming log-sum-exp whose bits do not depend on its chunks
#
# A chunked prefill sees a row's scores in pieces, one step at a time. Write a log-sum-exp
# that takes them that way: `lse_step(state, scores, tile)` receives the next piece (a 1-D
# tensor of float32 or float64, any length; `state` is None before the first) and returns
# `(state, value)`: the new state and the log-sum-exp of every score seen so far, as a
# one-element tensor. At any position, the value must be bit-identical however the scores
# before it were cut into pieces, and within 1e-5 of the log-sum-exp computed in float64
# (absolute while |log-sum-exp| <= 1, relative above). Compute in the scores' dtype: the
# value and every float the state keeps are tensors of that dtype (a wider type would only
# hide a moving order; float64 scores have none). The state may hold at most `tile + 8`
# numbers (you cannot keep every score). Some scores are `-inf` (masked keys), a whole
# tile of them included, never all.
#
# <details><summary>Hint</summary>
#
# Chapter 11's rule: the order of every sum must be fixed by positions alone, never by
# where a piece starts. Which boundaries do not move when the pieces do? What must wait
# in the state until such a boundary arrives, which running values summarise everything
# before it (chapter 9's online softmax keeps two), and how do you report a value that
# includes the scores still waiting, without changing the state?
#
# </details>

# %%
def lse_step(state, scores, tile):
    ### BEGIN SOLUTION
    def merge(m, s, tile_scores):
        m_new = torch.maximum(m, tile_scores.max())
        if m_new == -math.inf:
            return m, s
        return m_new, s * torch.exp(m - m_new) + torch.exp(tile_scores - m_new).sum()

    if state is None:
        state = (scores[:0], scores.new_tensor(-math.inf), scores.new_tensor(0.0))
    pending, m, s = state
    pending = torch.cat([pending, scores])
    while len(pending) >= tile:
        m, s = merge(m, s, pending[:tile])
        pending = pending[tile:]
    m_now, s_now = merge(m, s, pending) if len(pending) else (m, s)
    return (pending, m, s), (m_now + torch.log(s_now) if s_now > 0 else m_now)
    ### END SOLUTION


# %%
ex.check_streaming_logsumexp(lse_step)  # points: 3

# %% [markdown]
# ## 4. Distances in ulps
#
# Chapter 11 counts differences in ulps: 1 ulp is the gap from a float to the next one of
# its dtype. Write `ulp_distance(a, b)`: for two tensors of one shape and dtype (float32 or
# bfloat16), the elementwise number of representable values you step over to go from `a`
# to `b`, as an int64 tensor. +0 and -0 are one value (0 ulps apart); pairs may have
# opposite signs and be far apart.
#
# <details><summary>Hint</summary>
#
# A float's bits, read as an integer of the same width, grow with the float while it is
# positive. What happens for negative floats, whose bits are a sign and a magnitude? How
# would you map every float to an integer that grows with it, and how wide must that
# integer be for a distance across zero?
#
# </details>

# %%
def ulp_distance(a, b):
    ### BEGIN SOLUTION
    width = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[a.dtype]
    top = 1 << (8 * a.element_size() - 1)

    def rank(x):
        raw = x.contiguous().view(width).to(torch.int64)
        return torch.where(raw < 0, -(raw & (top - 1)), raw)

    return (rank(a) - rank(b)).abs()
    ### END SOLUTION


# %%
ex.check_ulp_distance(ulp_distance)  # points: 2
