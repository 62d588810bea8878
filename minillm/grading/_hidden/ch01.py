"""Teacher-only cases for chapter 1's checkers (a student release leaves this folder out).

HIDDEN: more seeds for each public checker. hidden_check_*: the reference answers
(_reference/ch01.py) on shapes the public checkers do not try, and the exact value of the
masked fraction on prompts far too long for any mask (the public checker only bounds it).
"""
from __future__ import annotations

import random

import torch

from .._common import call_text, fail, grade_prediction, learner_call
from .._reference import ch01 as ref
from ..ch01 import _MASKS, _ATTENTION

HIDDEN = {
    "check_causal_mask": [dict(seed=39_101), dict(seed=39_102, trials=40)],
    "check_window_mask": [dict(seed=39_111), dict(seed=39_112, trials=40)],
    "check_attention": [dict(seed=39_121)],
    "check_merge_attention": [dict(seed=39_131), dict(seed=39_132, trials=30)],
    "check_merge_parts": [dict(seed=39_141)],
    "check_masked_fraction": [dict(seed=39_151)],
}


def hidden_check_window_mask(fn) -> None:
    """Long chunks and windows, against the reference mask."""
    for q_len, k_len, window in ((64, 300, 50), (128, 128, 127), (1, 4096, 4096), (33, 97, 1)):
        got = learner_call(fn, q_len, k_len, window, forbidden=_MASKS)
        want = ref.window_mask(q_len, k_len, window)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape) or not torch.equal(got.cpu(), want):
            fail(f"{call_text(fn, q_len, k_len, window)} differs from the reference window mask")


def hidden_check_attention(fn) -> None:
    """Wider heads and longer chunks against the reference."""
    rng = random.Random(39_129)
    for n, m, heads, kv_heads, head_dim in ((16, 80, 8, 2, 16), (7, 40, 6, 3, 8), (1, 64, 4, 1, 32), (12, 12, 4, 4, 8)):
        g = torch.Generator().manual_seed(rng.randrange(2**31))
        q = torch.randn(n, heads, head_dim, generator=g, dtype=torch.float64)
        k = torch.randn(m, kv_heads, head_dim, generator=g, dtype=torch.float64)
        v = torch.randn(m, kv_heads, head_dim, generator=g, dtype=torch.float64)
        args = (q, k, v)
        got = learner_call(fn, *args, forbidden=_ATTENTION + _MASKS[1:])
        want = ref.attention(q, k, v)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or \
                not torch.allclose(got.to(torch.float64), want, atol=1e-8, rtol=0):
            fail(f"{call_text(fn, *args)} differs from the reference attention")


def hidden_check_masked_fraction(fn) -> None:
    """Prompts no mask could be built for: the exact fraction, to 0.1%."""
    for num_tokens, chunk_size in ((10**9, 10**6), (10**9 + 7, 4096), (3 * 10**6, 2048), (5 * 10**5, 10**6)):
        got = learner_call(fn, num_tokens, chunk_size, forbidden=_MASKS)
        grade_prediction(call_text(fn, num_tokens, chunk_size), got, ref.masked_fraction(num_tokens, chunk_size),
                         1e-3, "reason about the chunks' shapes; do not build masks")
