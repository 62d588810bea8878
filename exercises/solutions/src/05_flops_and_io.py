# %% [markdown]
# # Exercises 5: FLOPs, bytes and intensity
#
# Write each function, then run the check cell below it: it compares your function with
# `minillm.accounting` on fresh random model shapes and says what is wrong.

# %%
import minillm.grading as ex
from minillm.sim.accounting import step_cost
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

# %%
def layer_flops(cfg, n, c):
    ### BEGIN SOLUTION
    d, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    gemm = 2 * n * d * (q + 2 * kv) + 2 * n * q * d + 2 * n * d * 2 * inter + 2 * n * inter * d
    pairs = n * c + n * (n + 1) // 2
    return gemm + 2 * 2 * pairs * cfg.head_dim * cfg.num_heads
    ### END SOLUTION

# %%
ex.check_layer_flops(layer_flops)

# %% [markdown]
# ## 2. KV bytes per token
#
# `kv_bytes_per_token(cfg, dtype_bytes)`: bytes one token adds to the KV cache, all layers.
# Use it to recompute the articles' 67,108,864 bytes for a 512-token chunk of Llama-3-8B.

# %%
def kv_bytes_per_token(cfg, dtype_bytes):
    ### BEGIN SOLUTION
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes
    ### END SOLUTION

# %%
ex.check_kv_bytes_per_token(kv_bytes_per_token)
assert 512 * kv_bytes_per_token(cfg, 2) == 67_108_864

# %% [markdown]
# ## 3. The intensity of a mixed batch
#
# `step_intensity(cfg, requests, dtype_bytes)`: FLOPs per byte of a step, using
# `step_cost` (read its fields: which bytes make up the total?). Then compare 32 decodes
# alone with the same decodes sharing a step with a 512-token chunk.

# %%
def step_intensity(cfg, requests, dtype_bytes):
    ### BEGIN SOLUTION
    cost = step_cost(cfg, requests, dtype_bytes)
    return cost.flops / (cost.bytes_weights + cost.bytes_kv_read + cost.bytes_kv_write
                         + cost.bytes_activations)
    ### END SOLUTION

# %%
ex.check_step_intensity(step_intensity)
mixed = step_intensity(cfg, [(512, 0, False)] + [(1, 1024)] * 32, 2)
decodes_only = step_intensity(cfg, [(1, 1024)] * 32, 2)
print(f"32 decodes: {decodes_only:.1f} FLOP/byte; with a 512-token chunk: {mixed:.1f} FLOP/byte")
assert decodes_only < mixed
