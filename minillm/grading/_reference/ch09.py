"""Chapter 9's reference answers (teacher only): the tile mask, the repaired chunk kernel,
the sliding-window tile count by arithmetic, the intensity, the split-KV merge kernel and
the predicted launch. tests/test_grading_ch09.py holds them equal to the engine (its
masks, reference attention, merge, accounting and kernel) and passes them through the
public checkers."""
from __future__ import annotations

import torch

from ...kernels.triton_attention import tl, triton


def tile_mask(cached_len: int, query_len: int, first_row: int, num_rows: int, tile: int,
              block_size: int) -> torch.Tensor:
    """[num_rows, block_size] bool: may query row first_row + r see key tile * block_size + k?"""
    seq_len = cached_len + query_len
    query_pos = cached_len + first_row + torch.arange(num_rows)
    key_pos = tile * block_size + torch.arange(block_size)
    row_valid = (first_row + torch.arange(num_rows)) < query_len
    return (key_pos[None, :] <= query_pos[:, None]) & (key_pos[None, :] < seq_len) & row_valid[:, None]


def _fixed_chunk_kernel(q_ptr, k_ptr, v_ptr, out_ptr, cached_len, num_new, scale,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, TILE_N: tl.constexpr):
    """The handed-out kernel with its three bugs repaired: qk_scale lacked log2(e) (the scores go to
    exp2), prefix_end rounded up into the diagonal tile, diag_end rounded down past the last row's tile."""
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


def count_window_tiles(query_lens, cached_lens, tile_n: int, rows_per_tile: int, window: int) -> tuple[int, int, int]:
    """(unmasked, masked, skipped) under a sliding window of `window` keys, by arithmetic on positions:
    a query tile's rows p0..p1 see key k iff p - window < k <= p. A key tile [k0, k1] is seen by some
    row iff k0 <= p1 and k1 >= p0 - window + 1; by every row, every slot iff k1 <= p0 and
    k0 >= p1 - window + 1 (k1 <= p0 also keeps it inside the sequence)."""
    unmasked = masked = skipped = 0
    for n, c in zip(query_lens, cached_lens):
        num_key_tiles = -(-(c + n) // tile_n)
        for first in range(0, n, rows_per_tile):
            p0, p1 = c + first, c + min(first + rows_per_tile, n) - 1
            seen = p1 // tile_n - max(0, p0 - window + 1) // tile_n + 1
            first_full = max(0, -(-(p1 - window + 1) // tile_n))
            full = max(0, (p0 + 1) // tile_n - first_full)
            unmasked += full
            masked += seen - full
            skipped += num_key_tiles - seen
    return unmasked, masked, skipped


def attention_intensity(cfg, num_new: int, num_cached: int, dtype_bytes: int, kv_dtype_bytes: int) -> float:
    """FLOPs per byte of one request's attention (scores and values) in one step, counted as
    accounting.step_cost counts them: 2 * head_dim FLOPs per (query, key) pair and query head for
    the scores and as many for the values; bytes: the cached K and V read and the new K and V
    written (kv_dtype_bytes each), Q read and the output written (dtype_bytes each)."""
    pairs = num_new * num_cached + num_new * (num_new + 1) // 2
    flops = 4 * pairs * cfg.head_dim * cfg.num_heads
    kv = cfg.num_kv_heads * cfg.head_dim
    traffic = (2 * num_cached * kv + 2 * num_new * kv) * kv_dtype_bytes \
        + 2 * num_new * cfg.num_heads * cfg.head_dim * dtype_bytes
    return flops / traffic


def _merge_kernel(seg_out_ptr, seg_lse_ptr, out_ptr, num_segments,
                  HEAD_DIM: tl.constexpr, MAX_SEGMENTS: tl.constexpr):
    """Row r's segments (normalised outputs, log-sum-exps) merged by their shares of the softmax."""
    row = tl.program_id(0)
    segments = tl.arange(0, MAX_SEGMENTS)
    dims = tl.arange(0, HEAD_DIM)
    real = segments < num_segments
    lse = tl.load(seg_lse_ptr + row * MAX_SEGMENTS + segments, mask=real, other=float("-inf"))
    top = tl.max(lse, 0)
    weight = tl.where(lse > float("-inf"), tl.exp(lse - top), 0.0)
    o = tl.load(seg_out_ptr + (row * MAX_SEGMENTS + segments)[:, None] * HEAD_DIM + dims[None, :],
                mask=(weight > 0.0)[:, None], other=0.0)
    tl.store(out_ptr + row * HEAD_DIM + dims, tl.sum(o * weight[:, None], 0) / tl.sum(weight, 0))


def predicted_launch(query_lens, cached_lens, num_kv_heads: int, group: int, block_m: int, tile_n: int,
                     num_kv_splits: int) -> tuple[int, int]:
    """(programs, key-tile runs) of the engine's kernel: query tiles of block_m // group positions, one
    program per (query tile, KV head, segment); a query tile runs the key tiles up to its last row's,
    shared among its segments, so the split multiplies programs and not tile runs."""
    rows_per_tile = block_m // group
    query_tiles = tile_runs = 0
    for n, c in zip(query_lens, cached_lens):
        for first in range(0, n, rows_per_tile):
            query_tiles += 1
            tile_runs += (c + min(first + rows_per_tile, n) - 1) // tile_n + 1
    return query_tiles * num_kv_heads * num_kv_splits, tile_runs * num_kv_heads


fixed_chunk_kernel = triton.jit(_fixed_chunk_kernel) if triton is not None else None
merge_kernel = triton.jit(_merge_kernel) if triton is not None else None
