"""Chapter 5's reference answers (teacher only), written out from the formulas (not from
accounting.step_cost, which the checkers forbid while the learner's code runs); the tests
hold them equal to step_cost and to the engine's masks."""
from __future__ import annotations

import math
from fractions import Fraction


def layer_flops(cfg, num_new: int, num_cached: int) -> int:
    d, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    gemm = 2 * num_new * d * (q + 2 * kv) + 2 * num_new * q * d + 2 * num_new * d * 2 * inter \
        + 2 * num_new * inter * d
    pairs = num_new * num_cached + num_new * (num_new + 1) // 2
    return gemm + 2 * 2 * pairs * cfg.head_dim * cfg.num_heads


def kv_bytes_per_token(cfg, dtype_bytes: int) -> int:
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes


def window_pairs(num_new: int, num_cached: int, window: int | None) -> int:
    """Causal (query, key) pairs of a chunk when each query sees at most `window` keys,
    itself included (a sliding window; None: the whole causal prefix)."""
    def pairs_before(k: int) -> int:          # pairs of the first k positions, from a fresh start
        if window is None or k <= window:
            return k * (k + 1) // 2
        return window * (window + 1) // 2 + (k - window) * window
    return pairs_before(num_cached + num_new) - pairs_before(num_cached)


def window_layer_flops(cfg, num_new: int, num_cached: int, window: int | None) -> int:
    """layer_flops with a sliding-window attention: the GEMMs do not change, the pairs do."""
    attention = 4 * window_pairs(num_new, num_cached, window) * cfg.head_dim * cfg.num_heads
    return layer_flops(cfg, num_new, 0) - 4 * (num_new * (num_new + 1) // 2) * cfg.head_dim * cfg.num_heads \
        + attention


def decodes_to_ridge(cfg, context_len: int, ridge_point: float, dtype_bytes: int = 2):
    """Intensity of B decodes = B f / (W + B b): f FLOPs per decode (its layers and its LM-head row), W the
    weights read once per step, b the bytes per decode (its cache read, its new K and V). It grows with B
    towards f / b: the smallest B with B f >= ridge (W + B b), or None when f / b <= ridge."""
    layer_weights = cfg.hidden_size * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * cfg.hidden_size \
        + 3 * cfg.hidden_size * cfg.intermediate_size
    weights = (cfg.num_layers * layer_weights + cfg.hidden_size * cfg.vocab_size) * dtype_bytes
    flops = cfg.num_layers * layer_flops(cfg, 1, context_len) + 2 * cfg.hidden_size * cfg.vocab_size
    per_decode = (context_len + 1) * kv_bytes_per_token(cfg, dtype_bytes)
    ridge = Fraction(ridge_point)                      # exact: B is a threshold, a float could land on it
    if flops <= ridge * per_decode:
        return None
    return max(1, math.ceil(ridge * weights / (flops - ridge * per_decode)))


def chunk_for_tiles(num_decodes: int, chunk_size: int, tile_rows: int) -> int:
    """Most prefill tokens per tile: the chunk that fills the last whole tile, or the untrimmed chunk
    when its last tile is so nearly full that it carries more per tile (ties: the larger)."""
    def per_tile(chunk):
        return Fraction(chunk, -(-(chunk + num_decodes) // tile_rows))
    aligned = (num_decodes + chunk_size) // tile_rows * tile_rows - num_decodes
    candidates = [c for c in (aligned, chunk_size) if 0 < c <= chunk_size]
    return max(candidates, key=lambda c: (per_tile(c), c))
