# %% [markdown]
# # Exercises 5: FLOPs, bytes, intensity and the GEMM tile
#
# Count the work and the memory traffic of a step yourself, from the model's shapes, then
# use a measurement to size a step. Each check cell compares your numbers with chapter 5's
# accounting (or with operator times measured on A100 GPUs) and says what is wrong. The
# accounting module itself is off limits while a check runs (it holds every answer), and
# half the shapes come as bare objects with only the shape fields (`cfg.hidden_size`,
# `cfg.q_size`, `cfg.kv_size`, `cfg.intermediate_size`, `cfg.num_layers`,
# `cfg.num_heads`, `cfg.num_kv_heads`, `cfg.head_dim`, `cfg.vocab_size`): use those, not
# the config's methods. Tasks 1 and 4 go past what the chapter prints.

# %%
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
# itself included (`sliding_window` in its `config.json`; `ModelConfig.from_hf_config` reads
# it). Write `layer_flops(cfg, n, c, window=None)`: the FLOPs of one layer for that chunk,
# without the LM head, when every query attends to at most `window` keys (itself
# included); `window=None` means full causal attention. The chunk's tokens sit at
# positions `c` to `c + n - 1` of the sequence.
#
# The chapter's counting rules hold: a matmul `[M, K] x [K, N]` is `2*M*N*K`; q, k and v
# are one fused projection (`cfg.q_size + 2 * cfg.kv_size` outputs); the MLP has a fused
# gate+up projection (`2 * cfg.intermediate_size` outputs) and a down projection; attention
# costs `4 * head_dim` FLOPs per (query, key) pair and query head. You may not call
# `minillm.sim.accounting` (nor the chapter's sketch: it has no window). The checker tries
# windows shorter than the context, longer, and in between, on fresh model shapes.
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
ex.check_layer_flops(layer_flops)  # points: 2
mistral = ModelConfig.preset("mistral-7b")
saved = 1 - layer_flops(mistral, 512, 8000, 4096) / layer_flops(mistral, 512, 8000)
print(f"Mistral-7B, a 512-token chunk over 8000 cached tokens: the window saves {saved:.0%} of a layer's FLOPs")
assert 0 < saved < 0.5

# %% [markdown]
# ## 2. KV bytes per token
#
# `kv_bytes_per_token(cfg, dtype_bytes)`: bytes one token adds to the KV cache, all layers.
# Use it to recompute the articles' 67,108,864 bytes for a 512-token chunk of Llama-3-8B.
#
# <details><summary>Hint</summary>
#
# What does one token leave behind in one layer, for one KV head? Then how many KV heads
# (grouped-query attention: not the query heads), and how many layers?
#
# </details>

# %%
def kv_bytes_per_token(cfg, dtype_bytes):
    ### BEGIN SOLUTION
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes
    ### END SOLUTION


# %%
ex.check_kv_bytes_per_token(kv_bytes_per_token)  # points: 1
assert 512 * kv_bytes_per_token(cfg, 2) == 67_108_864

# %% [markdown]
# ## 3. The traffic and intensity of a mixed step
#
# `step_traffic(cfg, requests, dtype_bytes)`: a step is a list of requests
# `(num_new, num_cached)` or `(num_new, num_cached, samples)`; `samples` (default True)
# says whether the step computes that request's next-token logits (a decode, or a prompt's
# last chunk; a middle chunk only fills the cache). Return a dict:
#
# * `flops`: every layer's FLOPs for every request (your `layer_flops`), plus the LM head,
#   `2 * hidden_size * vocab_size` for each request that samples;
# * `bytes_weights`: every weight read once per step, whatever the number of tokens: the
#   four matrices of each layer, plus the LM head (`hidden_size x vocab_size`) when any
#   request samples;
# * `bytes_kv_read`: each request reads the K and V of its cached tokens once;
# * `bytes_kv_write`: each new token writes its K and V;
# * `intensity`: `flops / (bytes_weights + bytes_kv_read + bytes_kv_write)`.
#
# (Chapter 5's `step_cost` also counts the activations each operation reads and writes;
# leave them out here. Norms and biases too: the checked shapes have none.) You may call
# your own `layer_flops` and `kv_bytes_per_token`, not `minillm.sim.accounting`. Then
# compare 32 decodes alone with the same decodes sharing a step with a 512-token chunk.
#
# <details><summary>Hint</summary>
#
# A layer's weight count is the same four matrices whose FLOPs you counted in task 1: what
# are their shapes? Which requests pay the LM head, and does the LM head's weight read
# depend on how many of them there are? The KV bytes follow from task 2 and the token
# counts of the step.
#
# </details>

# %%
def step_traffic(cfg, requests, dtype_bytes):
    ### BEGIN SOLUTION
    d, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    num_sampled = sum(1 for r in requests if len(r) == 2 or r[2])
    flops = cfg.num_layers * sum(layer_flops(cfg, r[0], r[1]) for r in requests) \
        + 2 * num_sampled * d * cfg.vocab_size
    layer_weights = d * (q + 2 * kv) + q * d + d * 2 * inter + inter * d
    head_weights = d * cfg.vocab_size if num_sampled else 0
    bytes_weights = (cfg.num_layers * layer_weights + head_weights) * dtype_bytes
    per_token = kv_bytes_per_token(cfg, dtype_bytes)
    bytes_kv_read = sum(r[1] for r in requests) * per_token
    bytes_kv_write = sum(r[0] for r in requests) * per_token
    return {"flops": flops, "bytes_weights": bytes_weights, "bytes_kv_read": bytes_kv_read,
            "bytes_kv_write": bytes_kv_write,
            "intensity": flops / (bytes_weights + bytes_kv_read + bytes_kv_write)}
    ### END SOLUTION


# %%
ex.check_step_traffic(step_traffic)  # points: 2
mixed = step_traffic(cfg, [(512, 0, False)] + [(1, 1024)] * 32, 2)["intensity"]
decodes_only = step_traffic(cfg, [(1, 1024)] * 32, 2)["intensity"]
print(f"32 decodes: {decodes_only:.1f} FLOP/byte; with a 512-token chunk: {mixed:.1f} FLOP/byte")
assert decodes_only < mixed

# %% [markdown]
# ## 4. The GEMM tile: choose the budget, not the chunk
#
# A GEMM kernel computes its output in tiles of rows; a step whose rows spill a few past a
# tile boundary pays for the whole next tile. The measured operator times that chapter 5
# (section 5) compares the cost model with show it on an A100: one Llama-3-8B layer's four
# linear operators take 0.377 ms for 128 rows and 0.529 ms for 136 (+40% time for +6%
# rows), and the times jump again past 256, 384 and 512 rows: the A100's tile is 128
# rows. The rows of a mixed step's GEMMs are its **chunk plus its decodes** (vLLM's token
# budget, `max_num_batched_tokens`, counts both).
#
# `tile_aligned_chunk(num_decodes, chunk_size, tile_rows)`: the step will carry
# `num_decodes` decodes and at most `chunk_size` prefill tokens. Return the chunk to
# schedule: the largest chunk, no larger than `chunk_size`, for which the step's rows
# are a whole number of tiles (`chunk_size >= tile_rows` in every case). You may read the
# profiles (`op_profiles.load_gpu_op_profile`) to look around, but not call
# `minillm.sim.accounting` or the cost model.
#
# **Predict, then measure.** The checker first measures your choice: for each A100 file in
# `data/gpu-op-profiles` (four models), 8 to 32 decodes and chunks of 256 to 512, it reads
# the measured time of your step's rows and of the untrimmed `chunk_size + num_decodes`
# rows, and requires your step to carry its prefill tokens at least 3% cheaper per
# millisecond (the stated tolerance: a choice that only ties the untrimmed chunk fails).
# Then it checks the rule exactly on random decode counts, chunk sizes and tiles.
#
# <details><summary>Hint</summary>
#
# Which number must be a multiple of the tile: the chunk, or the rows the GEMM sees? Start
# from the most rows the step may hold and ask how many of them fall past the last whole
# tile.
#
# </details>

# %%
def tile_aligned_chunk(num_decodes, chunk_size, tile_rows):
    ### BEGIN SOLUTION
    rows = (num_decodes + chunk_size) // tile_rows * tile_rows
    return rows - num_decodes
    ### END SOLUTION


# %%
ex.check_tile_aligned_chunk(tile_aligned_chunk)  # points: 3
# Your rule on the measured A100 times: 8 decodes beside a 512-token chunk.
profile = op_profiles.load_gpu_op_profile(op_profiles.profile_dir() / "a100_Meta-Llama-3-8B.csv")
linear_ms = {rows: 1e3 * sum(profile.times_s[op][i] for op in ("qkv_proj", "o_proj", "mlp_gate_up_proj",
                                                               "mlp_down_proj"))
             for i, rows in enumerate(profile.num_tokens)}
chunk = tile_aligned_chunk(8, 512, 128)
for label, c in (("chunk 512, untrimmed", 512), (f"chunk {chunk}, tile-aligned", chunk)):
    print(f"{label:24s} {8 + c} rows: {linear_ms[8 + c]:.3f} ms a layer, "
          f"{c / linear_ms[8 + c]:.0f} prefill tokens per ms")
assert chunk / linear_ms[8 + chunk] > 512 / linear_ms[520]
