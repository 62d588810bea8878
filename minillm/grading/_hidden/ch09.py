"""Chapter 9's hidden cases (teacher only): other seeds, and shapes the public checkers do
not use by default (blocks of 48 and 64, 32-row query tiles with 64-key tiles, head_dim
32, 16 segments), plus, for the two counting tasks, steps far too long for mask building."""
from __future__ import annotations

import random

from .._common import call_text, fail, learner_call, passed
from .._reference import ch09 as _ref

HIDDEN = {
    "check_tile_mask": [dict(seed=90901, num_cases=150)],
    "check_fixed_chunk_kernel": [dict(seed=90902, block_m=32, tile_ns=(32, 64), head_dim=32, num_random=3)],
    "check_count_window_tiles": [dict(seed=90903, num_cases=60)],
    "check_attention_intensity": [dict(seed=90904, num_cases=60)],
    "check_merge_kernel": [dict(seed=90905, head_dim=32, max_segments=16, num_random=3)],
    "check_predicted_launch": [dict(seed=90906, num_random=3)],
}


def hidden_check_tile_mask(fn, seed: int = 90911):
    """Blocks of 48 (not a power of two) and 64, against the reference."""
    rng = random.Random(seed)
    for _ in range(60):
        block_size = rng.choice([48, 64])
        query_len, cached_len = rng.randint(1, 200), rng.randint(0, 300)
        args = (cached_len, query_len, rng.randrange(query_len), rng.choice([1, 16, 64]),
                rng.randrange(-(-(cached_len + query_len) // block_size)), block_size)
        expected = _ref.tile_mask(*args)
        got = learner_call(fn, *args)
        if not (hasattr(got, "shape") and tuple(got.shape) == tuple(expected.shape) and bool((got == expected).all())):
            fail(f"{call_text(fn, *args)}: differs from the reference mask (hidden case)")
    passed("tile_mask: hidden blocks of 48 and 64 agree")


def hidden_check_count_window_tiles(fn, seed: int = 90913):
    """Long steps (prompts of 20,000-100,000 tokens, windows of 4096): the arithmetic, not masks."""
    rng = random.Random(seed)
    cases = [([100_000], [0], 64, 64, 4096), ([1] * 8, [rng.randint(10_000, 90_000) for _ in range(8)], 32, 16, 4096),
             ([8192, 1, 1], [20_000, 50_000, 7], 16, 32, rng.randint(100, 9000))]
    for args in cases:
        expected = _ref.count_window_tiles(*args)
        got = learner_call(fn, *[list(a) if isinstance(a, list) else a for a in args])
        if tuple(got) != expected:
            fail(f"{call_text(fn, *args)} returned {tuple(got)}, expected {expected} (hidden long step)")
    passed("count_window_tiles: hidden long steps agree")


def hidden_check_predicted_launch(fn, seed: int = 90916):
    """Long steps with 8 KV heads and 16 segments, against the reference (no interpreter: too long for it)."""
    rng = random.Random(seed)
    for _ in range(20):
        k = rng.randint(1, 6)
        args = ([rng.choice([1, rng.randint(1, 4096)]) for _ in range(k)], [rng.randint(0, 30_000) for _ in range(k)],
                8, rng.choice([1, 4, 8]), rng.choice([16, 64]), rng.choice([16, 32, 64]), rng.choice([1, 4, 16]))
        expected = _ref.predicted_launch(*args)
        got = learner_call(fn, *[list(a) if isinstance(a, list) else a for a in args])
        if tuple(got) != expected:
            fail(f"{call_text(fn, *args)} returned {tuple(got)}, expected {expected} (hidden long step)")
    passed("predicted_launch: hidden long steps agree")
