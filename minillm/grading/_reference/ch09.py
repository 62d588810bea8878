"""Chapter 9's reference answers, written out from their definitions (brute force
where the kernel uses arithmetic): tests/test_grading_ch09.py holds them equal to
the engine (kernels.triton_attention.key_tiles, plan_tiles; accounting.step_cost)."""
from __future__ import annotations

import torch


def tile_mask(cached_len: int, query_len: int, first_row: int, num_rows: int, tile: int,
              block_size: int) -> torch.Tensor:
    """[num_rows, block_size] bool: may query row first_row + r see key tile * block_size + k?"""
    seq_len = cached_len + query_len
    query_pos = cached_len + first_row + torch.arange(num_rows)
    key_pos = tile * block_size + torch.arange(block_size)
    row_valid = (first_row + torch.arange(num_rows)) < query_len
    return (key_pos[None, :] <= query_pos[:, None]) & (key_pos[None, :] < seq_len) & row_valid[:, None]


def online_softmax_update(m, l, acc, scores, v):
    """One key tile: (m, l, acc) of R rows, scores [R, K] (-inf where masked), v [K, D]."""
    m_new = torch.maximum(m, scores.max(dim=1).values)
    alpha = torch.exp(m - m_new)
    p = torch.exp(scores - m_new[:, None])
    return m_new, l * alpha + p.sum(dim=1), acc * alpha[:, None] + p @ v


def count_tiles(query_lens, cached_lens, block_size: int, rows_per_tile: int) -> tuple[int, int, int]:
    """(unmasked, masked, skipped) (query tile, key tile) pairs of a step, by looking at each mask."""
    unmasked = masked = skipped = 0
    for n, c in zip(query_lens, cached_lens):
        num_key_tiles = -(-(c + n) // block_size)
        for first in range(0, n, rows_per_tile):
            rows = min(rows_per_tile, n - first)
            for tile in range(num_key_tiles):
                # A slot past the sequence's end must be masked too: a tile that holds one is not "unmasked".
                seen = tile_mask(c, n, first, rows, tile, block_size)
                if bool(seen.all()):
                    unmasked += 1
                elif bool(seen.any()):
                    masked += 1
                else:
                    skipped += 1
    return unmasked, masked, skipped


def attention_intensity(cfg, num_new: int, num_cached: int, dtype_bytes: int) -> float:
    """FLOPs per byte of one request's attention (scores and values) in one step, counted as
    accounting.step_cost counts them: 2 * head_dim FLOPs per (query, key) pair and query head for
    the scores and as many for the values; bytes: the cached K and V read, the new K and V
    written, Q read and the output written."""
    pairs = num_new * num_cached + num_new * (num_new + 1) // 2
    flops = 4 * pairs * cfg.head_dim * cfg.num_heads
    kv = cfg.num_kv_heads * cfg.head_dim
    traffic = (2 * num_cached * kv + 2 * num_new * kv + 2 * num_new * cfg.num_heads * cfg.head_dim) * dtype_bytes
    return flops / traffic
