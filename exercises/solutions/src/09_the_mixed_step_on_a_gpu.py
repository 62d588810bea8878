# %% [markdown]
# # Exercises 9: the mixed step on a GPU
#
# Six tasks on chapter 9's kernel. Two are Triton: you repair a broken attention kernel
# and write the merge of a split-KV decode, and both run here in Triton's interpreter (on
# CPU tensors, GPU or not). The others ask for the tile arithmetic of a case the chapter
# did not show (a sliding window), an intensity counted from the model's shapes, and a
# prediction of a launch that the interpreter then counts. Each checker runs your code on
# fresh cases against the engine (its reference attention, its merge, its accounting, its
# kernel) and names the usual mistakes; the engine's own answers are switched off while
# yours runs. Fill in the bodies where it says `raise NotImplementedError`.

# %%
import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: the interpreter, on CPU tensors

import torch
import triton
import triton.language as tl

import minillm.grading as ex
from minillm import ModelConfig
from minillm.attention import reference_attention

# %% [markdown]
# ## 1. The mask of one tile
#
# A program holds rows `[first_row, first_row + num_rows)` of a request's new tokens; the
# request has `cached_len` tokens in the cache and `query_len` new ones, and the program
# may hold rows past `query_len` (the last tile of a chunk is partly empty). Return the
# `[num_rows, block_size]` bool mask of key tile `tile` (keys
# `[tile * block_size, (tile + 1) * block_size)`): True exactly where that row's query
# may see that key. A slot past the end of the sequence holds no key, and a row past
# `query_len` holds no query.
#
# <details><summary>Hint</summary>
#
# Take one entry, row `r` and slot `k` of the tile: which absolute position does each
# stand for? Then list the conditions under which the answer is True, and ask whether one
# of them already follows from the others. Check your mask by hand on a decode (one real
# row, the rest padding) and on a chunk that starts in the middle of a block.
#
# </details>

# %%
def tile_mask(cached_len, query_len, first_row, num_rows, tile, block_size):
    ### BEGIN SOLUTION
    rows = first_row + torch.arange(num_rows)
    query_pos = cached_len + rows
    key_pos = tile * block_size + torch.arange(block_size)
    visible = key_pos[None, :] <= query_pos[:, None]
    return visible & (key_pos[None, :] < cached_len + query_len) & (rows < query_len)[:, None]
    ### END SOLUTION


# %%
ex.check_tile_mask(tile_mask)  # points: 1

# %% [markdown]
# ## 2. Debug: a kernel that returns wrong rows
#
# A colleague wrote `chunk_kernel` below: chapter 9's idea for one request and one head,
# with no paging, laid out as FlashAttention's Triton kernels are. `num_new` queries at
# positions `[cached_len, cached_len + num_new)` attend to keys `[0, cached_len +
# num_new)`; `q` and `out` are `[num_new, HEAD_DIM]`, `k` and `v` `[cached_len + num_new,
# HEAD_DIM]`, all float32 and contiguous. Program `i` of the grid `(ceil(num_new /
# BLOCK_M),)` holds query rows `[i * BLOCK_M, (i + 1) * BLOCK_M)` and walks the keys
# `TILE_N` at a time in two loops, as vLLM's `prefix_prefill` kernel does: first the keys
# that every row of the program sees, with no mask, then the keys across its diagonal,
# masked; keys past the diagonal are never loaded. Its online softmax works in base 2, as
# FlashAttention's does (`exp2` is one instruction on a GPU, `exp` is not).
#
# It is wrong: the cell after it compares it with the engine's reference attention. Find
# every bug (there is more than one), and hand in the repaired kernel as
# `fixed_chunk_kernel`: the same arguments, the same two loops, the softmax still in base 2.
# The checker launches it in the interpreter on chunks that start mid-tile, decodes and
# whole prompts, with several tile sizes, against `reference_attention`; it also counts the
# key tiles each program loads and the ones it masks.

# %%
@triton.jit
def chunk_kernel(q_ptr, k_ptr, v_ptr, out_ptr, cached_len, num_new, scale,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, TILE_N: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)                 # this program's query rows
    offs_n = tl.arange(0, TILE_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_pos = cached_len + offs_m                               # their positions in the sequence
    seq_end = cached_len + num_new                            # keys [0, seq_end)
    q = tl.load(q_ptr + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=offs_m[:, None] < num_new, other=0.0)
    qk_scale = scale                                          # scores go to exp2
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    first_q = cached_len + start_m                            # the program's first and last positions
    last_q = tl.minimum(first_q + BLOCK_M, seq_end) - 1
    prefix_end = tl.cdiv(first_q + 1, TILE_N) * TILE_N        # keys [0, prefix_end): no mask needed
    diag_end = (last_q + 1) // TILE_N * TILE_N                # keys [prefix_end, diag_end): the diagonal
    for start_n in range(0, prefix_end, TILE_N):
        k_pos = start_n + offs_n
        k = tl.load(k_ptr + k_pos[:, None] * HEAD_DIM + offs_d[None, :], mask=k_pos[:, None] < seq_end, other=0.0)
        v = tl.load(v_ptr + k_pos[:, None] * HEAD_DIM + offs_d[None, :], mask=k_pos[:, None] < seq_end, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.math.exp2(m_i - m_ij)
        p = tl.math.exp2(qk - m_ij[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_ij
    for start_n in range(prefix_end, diag_end, TILE_N):
        k_pos = start_n + offs_n
        k = tl.load(k_ptr + k_pos[:, None] * HEAD_DIM + offs_d[None, :], mask=k_pos[:, None] < seq_end, other=0.0)
        v = tl.load(v_ptr + k_pos[:, None] * HEAD_DIM + offs_d[None, :], mask=k_pos[:, None] < seq_end, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        qk = tl.where(k_pos[None, :] <= q_pos[:, None], qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.math.exp2(m_i - m_ij)
        p = tl.math.exp2(qk - m_ij[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_ij
    tl.store(out_ptr + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc / l_i[:, None], mask=offs_m[:, None] < num_new)


# %%
def run_chunk_kernel(kernel, cached_len, num_new, head_dim=16, block_m=16, tile_n=16, seed=0):
    """Launch `kernel` on a random chunk; returns (its output, the reference attention's)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(num_new, head_dim, generator=g) * 2
    k, v = torch.randn(2, cached_len + num_new, head_dim, generator=g)
    out = torch.zeros(num_new, head_dim)
    kernel[(triton.cdiv(num_new, block_m),)](q, k, v, out, cached_len, num_new, head_dim ** -0.5,
                                             HEAD_DIM=head_dim, BLOCK_M=block_m, TILE_N=tile_n)
    return out, reference_attention(q[:, None], k[:, None], v[:, None])[:, 0]


got, expected = run_chunk_kernel(chunk_kernel, cached_len=13, num_new=37)
wrong = ~torch.isclose(got, expected, atol=1e-4).all(dim=1)
print(f"chunk_kernel on 37 new tokens over 13 cached: {int(wrong.sum())} of 37 rows wrong "
      f"(max |error| {(got - expected).abs().nan_to_num(float('inf')).max():.3g}); right: "
      f"{(~wrong).nonzero().flatten().tolist()}")

# %% [markdown]
# <details><summary>Hint</summary>
#
# Shrink the case until one row is wrong: a chunk that fits one query tile, then one key
# tile, then a row whose keys sit in two tiles. For each loop's bounds, ask which keys it
# lets through for the program's first row and for its last row, and test them on a tile
# that ends exactly at a row and on one that ends past it. For the softmax, work one row of
# two keys by hand, once with `exp` and once with what the kernel computes: do the weights
# agree?
#
# </details>

# %%
@triton.jit
def fixed_chunk_kernel(q_ptr, k_ptr, v_ptr, out_ptr, cached_len, num_new, scale,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, TILE_N: tl.constexpr):
    ### BEGIN SOLUTION
    start_m = tl.program_id(0) * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, TILE_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_pos = cached_len + offs_m
    seq_end = cached_len + num_new
    q = tl.load(q_ptr + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=offs_m[:, None] < num_new, other=0.0)
    qk_scale = scale * 1.4426950408889634                    # log2(e): exp(x) = exp2(x * log2(e))
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    first_q = cached_len + start_m
    last_q = tl.minimum(first_q + BLOCK_M, seq_end) - 1
    prefix_end = (first_q + 1) // TILE_N * TILE_N             # whole tiles whose last key is <= first_q
    diag_end = last_q + 1                                     # every tile whose first key is <= last_q
    for start_n in range(0, prefix_end, TILE_N):
        k_pos = start_n + offs_n
        k = tl.load(k_ptr + k_pos[:, None] * HEAD_DIM + offs_d[None, :], mask=k_pos[:, None] < seq_end, other=0.0)
        v = tl.load(v_ptr + k_pos[:, None] * HEAD_DIM + offs_d[None, :], mask=k_pos[:, None] < seq_end, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.math.exp2(m_i - m_ij)
        p = tl.math.exp2(qk - m_ij[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_ij
    for start_n in range(prefix_end, diag_end, TILE_N):
        k_pos = start_n + offs_n
        k = tl.load(k_ptr + k_pos[:, None] * HEAD_DIM + offs_d[None, :], mask=k_pos[:, None] < seq_end, other=0.0)
        v = tl.load(v_ptr + k_pos[:, None] * HEAD_DIM + offs_d[None, :], mask=k_pos[:, None] < seq_end, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        qk = tl.where(k_pos[None, :] <= q_pos[:, None], qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.math.exp2(m_i - m_ij)
        p = tl.math.exp2(qk - m_ij[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_ij
    tl.store(out_ptr + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc / l_i[:, None], mask=offs_m[:, None] < num_new)
    ### END SOLUTION


# %%
ex.check_fixed_chunk_kernel(fixed_chunk_kernel)  # points: 3

# %% [markdown]
# ## 3. The tiles of a sliding-window step
#
# Mistral-style models attend over a **sliding window**: the query at position `p` sees
# only the last `window` keys, its own included. vLLM's unified kernel takes the window as
# `SLIDING_WINDOW` and bounds its tile loop with it, so tiles wholly before a query tile's
# window are skipped like those past its diagonal. For a packed step (each request's new
# rows cut into query tiles of `rows_per_tile`, its keys into tiles of `tile_n`), count
# the (query tile, key tile) pairs by kind: **unmasked** (every real row of the query tile
# sees every slot of the key tile), **masked** (some, not all) and **skipped** (none). A
# request's last query tile may be partly filled: its rows past the request's new tokens
# hold no query and do not count, either way. Each request has `ceil((cached + new) /
# tile_n)` key tiles; a slot past the sequence's end is seen by nobody. Return
# `(unmasked, masked, skipped)`, with arithmetic on positions, not by building masks: the
# checker also asks about a 100,000-token prompt.
#
# <details><summary>Hint</summary>
#
# Chapter 9's staircase had two edges; the window adds a third, and it moves with the row.
# For a query tile, which of its rows decides each edge: whose window starts latest, whose
# diagonal ends earliest? Check your count on a window longer than every sequence (you
# know that answer from the chapter) and on a window of one key.
#
# </details>

# %%
def count_window_tiles(query_lens, cached_lens, tile_n, rows_per_tile, window):
    ### BEGIN SOLUTION
    unmasked = masked = skipped = 0
    for n, c in zip(query_lens, cached_lens):
        seq_len = c + n
        num_key_tiles = -(-seq_len // tile_n)
        for first in range(0, n, rows_per_tile):
            p0, p1 = c + first, c + min(first + rows_per_tile, n) - 1   # first and last row's positions
            # Seen by some row: a key k is seen by rows [k, k + window - 1].
            lo_tile = max(0, p0 - window + 1) // tile_n               # first tile holding a key row p0 sees
            hi_tile = p1 // tile_n                                     # last tile holding a key row p1 sees
            seen = hi_tile - lo_tile + 1
            # Seen whole by every row: last key <= p0, first key > p1 - window, no slot past the end.
            first_full = -(-(p1 - window + 1) // tile_n) if p1 - window + 1 > 0 else 0
            last_full = (p0 + 1) // tile_n - 1
            full = max(0, last_full - first_full + 1)
            unmasked += full
            masked += seen - full
            skipped += num_key_tiles - seen
    return unmasked, masked, skipped
    ### END SOLUTION


# %%
ex.check_count_window_tiles(count_window_tiles)  # points: 2

# %% [markdown]
# ## 4. Arithmetic intensity of one request's attention, with an fp8 KV cache
#
# Chapter 9 read the arithmetic intensity of one request's attention (its scores and its
# values, one layer) off chapter 5's accounting, every tensor in one dtype. A server that
# stores its KV cache in fp8 (vLLM's `kv_cache_dtype="fp8"`, vllm-project/vllm
# `docs/source/quantization/fp8_e5m2_kvcache.rst` at commit 440055e) keeps K and V at one
# byte per element while Q and the attention's output stay in the model's dtype. Derive the
# intensity from the model's shapes for such a server:
# `attention_intensity(cfg, num_new, num_cached, dtype_bytes, kv_dtype_bytes)` returns FLOPs
# per byte for a request bringing `num_new` tokens over `num_cached` cached ones, K and V
# (read from the cache and written to it) in `kv_dtype_bytes` per element, Q and the output
# in `dtype_bytes`, counted otherwise as the accounting counts attention (chapter 5 says
# what it counts and why). Decide which (query, key) pairs do work, what each costs, and
# which tensors cross HBM. The checker compares with the accounting's counts on decodes and
# chunks of several models, MHA and GQA, and 1- to 4-byte dtypes; the accounting is switched
# off while your function runs.
#
# <details><summary>Hint</summary>
#
# Start from a decode of a model with one KV head and work up: how many keys does the one
# query see, how many multiply-adds per key and head, and how many elements of K, V, Q
# and output move, each in which dtype? Then ask what grouped-query attention changes in
# each count, and what a chunk's causal mask changes. The number of layers cancels.
#
# </details>

# %%
def attention_intensity(cfg: ModelConfig, num_new, num_cached, dtype_bytes, kv_dtype_bytes):
    ### BEGIN SOLUTION
    pairs = num_new * num_cached + num_new * (num_new + 1) // 2
    flops = 2 * 2 * pairs * cfg.head_dim * cfg.num_heads
    kv_elements = 2 * (num_cached + num_new) * cfg.num_kv_heads * cfg.head_dim
    q_out_elements = 2 * num_new * cfg.num_heads * cfg.head_dim
    return flops / (kv_elements * kv_dtype_bytes + q_out_elements * dtype_bytes)
    ### END SOLUTION


# %%
ex.check_attention_intensity(attention_intensity)  # points: 2
llama = ModelConfig.preset("llama-3-8b")
for kv_bytes in (2, 1):
    print(f"Llama-3-8B, a decode over 4096 tokens, KV cache at {kv_bytes} byte(s): "
          f"{attention_intensity(llama, 1, 4096, 2, kv_bytes):.2f} FLOP/byte")

# %% [markdown]
# ## 5. The split-KV merge, in Triton
#
# A split decode leaves, for each row (one query head of one decode), the result of each
# segment of its keys computed apart: the segment's softmax-normalised output `o_s`
# (`HEAD_DIM` floats) and the log-sum-exp `lse_s` of its scores. Write the kernel that
# merges them into the row's attention over all its keys. The layout differs from the
# engine's: `seg_out` is `[rows, MAX_SEGMENTS, HEAD_DIM]`, `seg_lse` `[rows, MAX_SEGMENTS]`
# (float32, contiguous), `out` `[rows, HEAD_DIM]`; one program per row, grid `(rows,)`.
# Only the first `num_segments` segments of a row are real (`MAX_SEGMENTS` is a power of
# two, what lies past them is garbage); a real segment that held no key has
# `lse_s = -inf` and an undefined output. Log-sum-exps reach a few hundred.
#
# <details><summary>Hint</summary>
#
# Chapter 1 merged two parts; here there are up to `MAX_SEGMENTS`, in one program. What
# share of the row's softmax does segment `s` hold, and how do you compute it without
# `exp` overflowing float32 (it does past 88)? Then: what must an empty segment contribute,
# and what does `0 * nan` give?
#
# </details>

# %%
@triton.jit
def merge_kernel(seg_out_ptr, seg_lse_ptr, out_ptr, num_segments,
                 HEAD_DIM: tl.constexpr, MAX_SEGMENTS: tl.constexpr):
    ### BEGIN SOLUTION
    row = tl.program_id(0)
    segments = tl.arange(0, MAX_SEGMENTS)
    dims = tl.arange(0, HEAD_DIM)
    real = segments < num_segments
    lse = tl.load(seg_lse_ptr + row * MAX_SEGMENTS + segments, mask=real, other=float("-inf"))
    top = tl.max(lse, 0)
    weight = tl.where(lse > float("-inf"), tl.exp(lse - top), 0.0)     # each segment's share, unnormalised
    has_keys = weight > 0.0
    o = tl.load(seg_out_ptr + (row * MAX_SEGMENTS + segments)[:, None] * HEAD_DIM + dims[None, :],
                mask=has_keys[:, None], other=0.0)
    tl.store(out_ptr + row * HEAD_DIM + dims, tl.sum(o * weight[:, None], 0) / tl.sum(weight, 0))
    ### END SOLUTION


# %%
ex.check_merge_kernel(merge_kernel)  # points: 3

# %% [markdown]
# ## 6. Predict, then count: a launch
#
# Before the engine's kernel runs a step, say what it will do. For a step
# (`query_lens`, `cached_lens`), a model with `num_kv_heads` KV heads each shared by
# `group` query heads, query tiles of `block_m` rows, key tiles of `tile_n` keys and
# `num_kv_splits` segments per sequence (1: no split; given, not picked by the rule),
# `predicted_launch(...)` returns `(programs, tile_visits)`: how many programs the attention
# kernel's grid holds, and how many times, summed over all of them, a program runs one key
# tile (each run is two `tl.dot`s). Reason it out from chapter 9 and write the reason in a
# comment; then the check cell **measures**: it runs `triton_paged_attention` on such a
# step in the interpreter, reads the grid and counts the interpreter's `tl.dot` calls. The
# count must be exact. The engine's planners are switched off while your function runs.
#
# <details><summary>Hint</summary>
#
# Grouped-query attention folds heads into a tile's rows: how many of a request's
# positions fit one query tile? A segment is a slice of the tiles a program would visit
# anyway: does splitting change the total of tile runs, or only how many programs share
# them? Check yourself on a single decode, then on a chunk that fills exactly one tile.
#
# </details>

# %%
def predicted_launch(query_lens, cached_lens, num_kv_heads, group, block_m, tile_n, num_kv_splits):
    ### BEGIN SOLUTION
    # A query tile holds block_m // group positions; each (query tile, KV head, segment) is a
    # program. A program runs the tiles up to its last row's, cut to its segment: the
    # segments of a query tile share those tiles, so splitting adds programs, not tile runs.
    rows_per_tile = block_m // group
    query_tiles = tile_runs = 0
    for n, c in zip(query_lens, cached_lens):
        for first in range(0, n, rows_per_tile):
            last_pos = c + min(first + rows_per_tile, n) - 1
            query_tiles += 1
            tile_runs += last_pos // tile_n + 1
    return query_tiles * num_kv_heads * num_kv_splits, tile_runs * num_kv_heads
    ### END SOLUTION


# %%
ex.check_predicted_launch(predicted_launch)  # points: 2

# %% [markdown]
# Done: a tile's mask, the diagonal rule and the online softmax inside a real kernel, a
# window's third edge, the bytes that make a decode memory-bound, the merge that lets a
# few long decodes fill a GPU, and what a launch costs before it runs. Chapter 10 serves
# the engine over HTTP and measures it from the client.
