"""Chapter 5's reference answers, written out from the formulas (not from
accounting.step_cost, which the checkers forbid while the learner's code runs);
tests/test_grading_shortcuts.py holds them equal to step_cost."""
from __future__ import annotations


def layer_flops(cfg, num_new: int, num_cached: int) -> int:
    d, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    gemm = 2 * num_new * d * (q + 2 * kv) + 2 * num_new * q * d + 2 * num_new * d * 2 * inter \
        + 2 * num_new * inter * d
    pairs = num_new * num_cached + num_new * (num_new + 1) // 2
    return gemm + 2 * 2 * pairs * cfg.head_dim * cfg.num_heads


def kv_bytes_per_token(cfg, dtype_bytes: int) -> int:
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes


def step_traffic(cfg, requests, dtype_bytes: int) -> dict:
    """FLOPs, weight bytes, KV bytes read and written of one step (no activations, no biases)."""
    steps = [(r[0], r[1], bool(r[2]) if len(r) == 3 else True) for r in requests]
    num_sampled = sum(1 for _, _, samples in steps if samples)
    d, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    flops = cfg.num_layers * sum(layer_flops(cfg, n, c) for n, c, _ in steps) \
        + 2 * num_sampled * d * cfg.vocab_size
    layer_weights = d * (q + 2 * kv) + q * d + d * 2 * inter + inter * d
    bytes_weights = (cfg.num_layers * layer_weights + (d * cfg.vocab_size if num_sampled else 0)) * dtype_bytes
    per_token = kv_bytes_per_token(cfg, dtype_bytes)
    bytes_kv_read = sum(c for _, c, _ in steps) * per_token
    bytes_kv_write = sum(n for n, _, _ in steps) * per_token
    return {"flops": flops, "bytes_weights": bytes_weights, "bytes_kv_read": bytes_kv_read,
            "bytes_kv_write": bytes_kv_write,
            "intensity": flops / (bytes_weights + bytes_kv_read + bytes_kv_write)}


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


def tile_aligned_chunk(num_decodes: int, chunk_size: int, tile_rows: int) -> int:
    """The largest chunk <= chunk_size whose step (chunk + decodes rows) is a whole number of tiles."""
    return (num_decodes + chunk_size) // tile_rows * tile_rows - num_decodes
