# %% [markdown]
# # Exercises 5: FLOPs, bytes and intensity
#
# Count the work and the memory traffic of a step yourself, from the model's shapes. Each
# check cell compares your numbers with chapter 5's accounting on fresh random model
# shapes and says what is wrong. The accounting module itself is off limits while a check
# runs (it holds every answer), and half the shapes come as bare objects with only the
# shape fields (`cfg.hidden_size`, `cfg.q_size`, `cfg.kv_size`, `cfg.intermediate_size`,
# `cfg.num_layers`, `cfg.num_heads`, `cfg.num_kv_heads`, `cfg.head_dim`,
# `cfg.vocab_size`): use those, not the config's methods.

# %%
import minillm.grading as ex
from minillm.config import ModelConfig

cfg = ModelConfig.preset("llama-3-8b")

# %% [markdown]
# ## 1. FLOPs of one decoder layer
#
# `layer_flops(cfg, n, c)`: the FLOPs of one layer for a chunk of `n` new tokens over `c`
# cached ones, without the LM head. A matmul `[M, K] x [K, N]` is `2*M*N*K`; q, k and v
# are one fused projection (`cfg.q_size + 2 * cfg.kv_size` outputs); the MLP has a fused
# gate+up projection (`2 * cfg.intermediate_size` outputs) and a down projection;
# attention does `2 * head_dim` FLOPs per head per causal pair for the scores and the same
# for the values.
#
# <details><summary>Hint</summary>
#
# Four GEMMs with `M = n` rows: `d -> q + 2kv`, `q -> d`, `d -> 2 * intermediate`,
# `intermediate -> d`. The causal pairs: each new token sees the `c` cached tokens and the
# new tokens up to itself, `n*c + n(n+1)/2`; every query head (`num_heads`) works on each.
#
# </details>

# %%
def layer_flops(cfg, n, c):
    ### BEGIN SOLUTION
    d, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    gemm = 2 * n * d * (q + 2 * kv) + 2 * n * q * d + 2 * n * d * 2 * inter + 2 * n * inter * d
    pairs = n * c + n * (n + 1) // 2
    return gemm + 2 * 2 * pairs * cfg.head_dim * cfg.num_heads
    ### END SOLUTION


# %%
ex.check_layer_flops(layer_flops)  # points: 2


# %% [markdown]
# ## 2. KV bytes per token
#
# `kv_bytes_per_token(cfg, dtype_bytes)`: bytes one token adds to the KV cache, all layers.
# Use it to recompute the articles' 67,108,864 bytes for a 512-token chunk of Llama-3-8B.
#
# <details><summary>Hint</summary>
#
# K and V (2), in every layer, for every KV head (not the query heads), `head_dim`
# elements of `dtype_bytes` each.
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
# leave them out here. Norms and biases too: the checked shapes have none.) Then compare
# 32 decodes alone with the same decodes sharing a step with a 512-token chunk.
#
# <details><summary>Hint</summary>
#
# A layer's weights are `d*(q + 2kv) + q*d + d*2*intermediate + intermediate*d` elements.
# `num_sampled = sum(1 for r in requests if len(r) == 2 or r[2])`. The KV bytes are your
# `kv_bytes_per_token` times the summed cached (read) or new (written) tokens.
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
ex.check_step_traffic(step_traffic)  # points: 3
mixed = step_traffic(cfg, [(512, 0, False)] + [(1, 1024)] * 32, 2)["intensity"]
decodes_only = step_traffic(cfg, [(1, 1024)] * 32, 2)["intensity"]
print(f"32 decodes: {decodes_only:.1f} FLOP/byte; with a 512-token chunk: {mixed:.1f} FLOP/byte")
assert decodes_only < mixed
