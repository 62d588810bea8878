# %% [markdown]
# # Exercises 5: FLOPs, bytes, the ridge point and the GEMM tile
#
# Three problems chapter 5's counts can answer but the chapter does not: the FLOPs of a
# layer whose attention has a sliding window, how many decodes a step needs before a GPU
# stops waiting on memory (if any number will do), and which chunk to schedule when the
# GEMMs run in tiles. Each check cell compares your numbers with chapter 5's accounting (or
# with operator times measured on A100 GPUs) and says what is wrong. The accounting module
# is off limits while a check runs (it holds the counts), and half the shapes come as bare
# objects with only the shape fields (`cfg.hidden_size`, `cfg.q_size`, `cfg.kv_size`,
# `cfg.intermediate_size`, `cfg.num_layers`, `cfg.num_heads`, `cfg.num_kv_heads`,
# `cfg.head_dim`, `cfg.vocab_size`): use those, not the config's methods.

# %%
import math

import minillm.grading as ex
from minillm.config import ModelConfig
from minillm.sim import op_profiles

cfg = ModelConfig.preset("llama-3-8b")

# %% [markdown]
# ## 1. FLOPs of one decoder layer, with a sliding window
#
# Chapter 5 (section 1) counts one layer's FLOPs for a chunk of `n` new tokens over `c`
# cached ones under full causal attention. Some models limit attention to a **sliding
# window**: Mistral-7B's first release lets each query see at most its last 4096 keys,
# itself included (`sliding_window` in its `config.json`; exercises 1 built its mask).
# Write `layer_flops(cfg, n, c, window=None)`: the FLOPs of one layer for that chunk,
# without the LM head, when every query attends to at most `window` keys (itself
# included); `window=None` means full causal attention. The chunk's tokens sit at
# positions `c` to `c + n - 1` of the sequence.
#
# The chapter's counting rules hold: a matmul `[M, K] x [K, N]` is `2*M*N*K`; q, k and v
# are one fused projection (`cfg.q_size + 2 * cfg.kv_size` outputs); the MLP has a fused
# gate+up projection (`2 * cfg.intermediate_size` outputs) and a down projection; attention
# costs `4 * head_dim` FLOPs per (query, key) pair and query head. You may not call
# `minillm.sim.accounting` (nor copy the chapter's sketch: it has no window). The checker
# tries windows shorter than the context, longer, and in between, on fresh model shapes.
#
# <details><summary>Hint</summary>
#
# The window changes attention only. Ask, for the query at position `p`: how many keys
# does it see without a window, and how many with one? Then add that up over the chunk's
# positions (a loop is fine; a closed form is a bonus). Check your count by hand on a
# tiny case: a fresh 4-token prompt with a window of 2.
#
# </details>

# %%
def layer_flops(cfg, n, c, window=None):
    ### BEGIN SOLUTION
    d, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    gemm = 2 * n * d * (q + 2 * kv) + 2 * n * q * d + 2 * n * d * 2 * inter + 2 * n * inter * d
    pairs = sum(p + 1 if window is None else min(p + 1, window) for p in range(c, c + n))
    return gemm + 4 * pairs * cfg.head_dim * cfg.num_heads
    ### END SOLUTION


# %%
ex.check_layer_flops(layer_flops)  # points: 3
mistral = ModelConfig.preset("mistral-7b")
saved = 1 - layer_flops(mistral, 512, 8000, 4096) / layer_flops(mistral, 512, 8000)
print(f"Mistral-7B, a 512-token chunk over 8000 cached tokens: the window saves {saved:.0%} of a layer's FLOPs")
assert 0 < saved < 0.5

# %% [markdown]
# ## 2. Predict, then measure: how many decodes reach the ridge point?
#
# Chapter 5, section 4: a decode batch is memory-bound, far below a GPU's ridge point (peak
# FLOP/s over bandwidth: about 153 FLOP/byte on an A100-80GB). More decodes in one step
# share the weights' read, so the step's intensity grows with the batch. How many does it
# take to reach the ridge point, if any number does?
#
# `decodes_to_ridge(cfg, context_len, ridge_point, dtype_bytes=2)` returns your prediction:
# the smallest number of decodes, each over `context_len` cached tokens, whose step's
# intensity reaches `ridge_point`, or `None` if no number of decodes ever does. Count the
# step as chapter 5's `step_cost` does, activations left out: intensity = FLOPs / (weight
# bytes + KV bytes read + KV bytes written). The weights are every layer's four matrices
# (no norms, no biases here) and the LM head, each read once per step; every decode
# samples. Before writing code, put a number on Llama-3-8B at a 1024-token context on an
# A100, and say why. The checker measures with `step_cost`. Your number must reach the ridge
# point: up to 1% (or one decode) more than the smallest number that does, never fewer.
#
# <details><summary>Hint</summary>
#
# Which of the step's FLOPs and bytes grow with the number of decodes `B`, and which are
# paid once? Write the intensity as a function of `B`. What does it tend to as `B` grows,
# and what does that limit depend on? Only then solve for `B`.
#
# </details>

# %%
def decodes_to_ridge(cfg, context_len, ridge_point, dtype_bytes=2):
    ### BEGIN SOLUTION
    d, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    weights = (cfg.num_layers * (d * (q + 2 * kv) + q * d + 3 * d * inter) + d * cfg.vocab_size) * dtype_bytes
    flops = cfg.num_layers * layer_flops(cfg, 1, context_len) + 2 * d * cfg.vocab_size      # per decode
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes
    per_decode = (context_len + 1) * kv_per_token           # its cache read, its new K and V written
    # intensity(B) = B * flops / (weights + B * per_decode) -> flops / per_decode as B grows
    if flops <= ridge_point * per_decode:
        return None
    return max(1, math.ceil(ridge_point * weights / (flops - ridge_point * per_decode)))
    ### END SOLUTION


# %%
ex.check_decodes_to_ridge(decodes_to_ridge)  # points: 3
import minillm                                    # the measurement, after the prediction: chapter 5's accounting

step_cost = minillm.accounting.step_cost
ridge = minillm.hardware.get_hardware("A100-80GB").ridge_point
for context_len in (128, 512, 1024):
    batch = decodes_to_ridge(cfg, context_len, ridge)
    if batch is None:
        cost = step_cost(cfg, [(1, context_len)] * 4096)
        reached = cost.flops / (cost.bytes_weights + cost.bytes_kv_read + cost.bytes_kv_write)
        print(f"Llama-3-8B, context {context_len}: never; 4096 decodes reach {reached:.0f} FLOP/byte "
              f"(ridge {ridge:.0f})")
    else:
        cost = step_cost(cfg, [(1, context_len)] * batch)
        reached = cost.flops / (cost.bytes_weights + cost.bytes_kv_read + cost.bytes_kv_write)
        print(f"Llama-3-8B, context {context_len}: {batch} decodes reach {reached:.1f} FLOP/byte (ridge {ridge:.0f})")

# %% [markdown]
# ## 3. Design: the chunk for a GEMM that runs in tiles
#
# A GEMM kernel computes its output rows in tiles, and a tile costs the same however many
# of its rows are used. Chapter 5, section 5's operator times measured on an A100 show it:
# one Llama-3-8B layer's four linear operators take 0.377 ms for 128 rows and 0.529 ms for
# 136 (+40% time for +6% rows), and the times jump again past 256, 384 and 512 rows: the
# A100's tile is 128 rows. A mixed step runs its chunk's tokens and its decodes through the
# same GEMMs (the chapter's introduction: the decodes ride on the chunk's weight read).
#
# `chunk_for_tiles(num_decodes, chunk_size, tile_rows)`: the step will carry `num_decodes`
# decodes and at most `chunk_size` prefill tokens (`chunk_size >= tile_rows` in every case).
# Return the chunk, from 1 to `chunk_size` tokens, that carries the
# most prefill tokens per tile the step's GEMMs compute; among chunks that carry as many,
# the largest. You may read the profiles (`op_profiles.load_gpu_op_profile`) to look
# around, but not call `minillm.sim.accounting` or the cost model.
#
# The checker first measures your choices: for each A100 file in `data/gpu-op-profiles`
# (four models), 8 to 32 decodes and chunks of 256 to 512, your step must carry its prefill
# tokens at least 3% cheaper per millisecond than the untrimmed chunk would. Then, on
# random decode counts, chunk sizes and tiles, it checks that no other chunk carries more
# prefill tokens per tile than yours.
#
# <details><summary>Hint</summary>
#
# Which rows does the GEMM see: the chunk, or more? Write the prefill tokens per tile of a
# chunk `x` as a function of `x`. Which values of `x` are worth comparing: does a chunk that
# leaves its last tile half empty ever win? And is trimming always right: try 8 decodes
# beside a chunk of 503 with tiles of 128.
#
# </details>

# %%
def chunk_for_tiles(num_decodes, chunk_size, tile_rows):
    ### BEGIN SOLUTION
    def per_tile(chunk):                                   # prefill tokens per tile of the step's GEMMs
        return chunk / -(-(chunk + num_decodes) // tile_rows)
    aligned = (num_decodes + chunk_size) // tile_rows * tile_rows - num_decodes   # fills its last tile
    candidates = [c for c in (aligned, chunk_size) if 0 < c <= chunk_size]        # or keep the nearly full one
    return max(candidates, key=lambda c: (per_tile(c), c))
    ### END SOLUTION


# %%
ex.check_chunk_for_tiles(chunk_for_tiles)  # points: 3
# Your choice on the measured A100 times: 8 decodes beside a 512-token chunk.
profile = op_profiles.load_gpu_op_profile(op_profiles.profile_dir() / "a100_Meta-Llama-3-8B.csv")
linear_ms = {rows: 1e3 * sum(profile.times_s[op][i] for op in ("qkv_proj", "o_proj", "mlp_gate_up_proj",
                                                               "mlp_down_proj"))
             for i, rows in enumerate(profile.num_tokens)}
chunk = chunk_for_tiles(8, 512, 128)
for label, c in (("chunk 512, untrimmed", 512), (f"chunk {chunk}, yours", chunk)):
    print(f"{label:24s} {8 + c} rows: {linear_ms[8 + c]:.3f} ms a layer, "
          f"{c / linear_ms[8 + c]:.0f} prefill tokens per ms")
assert chunk / linear_ms[8 + chunk] > 512 / linear_ms[520]
