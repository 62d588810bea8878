"""Checkers for exercises/01_causal_attention: the mask, attention, the merge.

Each computes the engine's answer (minillm.attention, float64) first, then
calls the learner's function with that engine function switched off, and names
the likely mistake when the two differ (top-left mask, missing diagonal,
missing 1/sqrt(D), tiled GQA heads, unweighted merge).
"""
from __future__ import annotations

import math
import random

import torch

from ..attention import causal_mask, merge_attention, reference_attention
from ._common import fail, learner_call, passed

__all__ = ["check_causal_mask", "check_attention", "check_merge_attention"]

_MASKS = ("minillm.attention.causal_mask", "torch.nn.attention.bias.causal_lower_right",
          "torch.nn.attention.bias.causal_upper_left")
_ATTENTION = ("minillm.attention.reference_attention", "minillm.attention.sdpa_attention",
              "minillm.attention.paged_attention", "torch.nn.functional.scaled_dot_product_attention",
              "minillm.kernels.paged_decode", "torch.ops.minillm.paged_decode")


def _random_qkv(rng: random.Random, n: int, m: int):
    num_kv_heads = rng.choice([1, 2])
    num_heads = num_kv_heads * rng.choice([1, 2, 4])
    head_dim = rng.choice([4, 8])
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    q = torch.randn(n, num_heads, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(m, num_kv_heads, head_dim, generator=g, dtype=torch.float64)
    v = torch.randn(m, num_kv_heads, head_dim, generator=g, dtype=torch.float64)
    return q, k, v


def mask_mistake(got: torch.Tensor, q_len: int, k_len: int) -> str:
    """The usual wrong masks, recognised (shared with chapter 4's checker)."""
    want = causal_mask(q_len, k_len)
    if torch.equal(got, causal_mask(q_len, k_len, align="top_left")):
        return (f"that is the TOP-LEFT mask: the chunk's queries are the last {q_len} positions, so query i "
                f"sits at position k_len - q_len + i = {k_len - q_len} + i, not at i")
    if torch.equal(got, _strict(q_len, k_len)):
        return "each query must also see its own key (<=, not <): the diagonal is missing"
    if torch.equal(got, ~want):
        return "True and False are swapped: True means the query MAY attend to the key"
    if torch.equal(got, torch.ones_like(want)):
        return "everything is True: a query must not see the keys after its own position"
    return ""


def _strict(q_len: int, k_len: int) -> torch.Tensor:
    query_pos = torch.arange(q_len)[:, None] + (k_len - q_len)
    return torch.arange(k_len)[None, :] < query_pos


def check_causal_mask(fn, trials: int = 20, seed: int | None = None) -> bool:
    """fn(q_len, k_len) -> bool [q_len, k_len], bottom-right aligned (a chunk over a cache)."""
    rng = random.Random(seed)   # seed=None: fresh inputs every run
    cases = [(1, 1), (4, 4), (1, 7), (3, 8)] + [
        (n, n + rng.randrange(0, 10)) for n in (rng.randrange(1, 9) for _ in range(trials))]
    for q_len, k_len in cases:
        want = causal_mask(q_len, k_len)
        got = learner_call(fn, q_len, k_len, forbidden=_MASKS,
                           why="build the mask from torch.arange and a comparison.")
        if not isinstance(got, torch.Tensor):
            fail(f"fn({q_len}, {k_len}) returned {type(got).__name__}, expected a torch.Tensor")
        if tuple(got.shape) != (q_len, k_len):
            fail(f"fn({q_len}, {k_len}).shape = {tuple(got.shape)}, expected ({q_len}, {k_len})")
        if got.dtype != torch.bool:
            fail(f"fn({q_len}, {k_len}).dtype = {got.dtype}, expected torch.bool (True = may attend)")
        if not torch.equal(got.cpu(), want):
            mistake = mask_mistake(got.cpu(), q_len, k_len)
            fail(f"fn({q_len}, {k_len}) is wrong: {mistake or 'it differs from the expected mask'}\n"
                 f"expected\n{want.int()}\ngot\n{got.int()}")
    return passed(f"causal mask correct on {len(cases)} shapes, including chunks over a cache")


def _attention_mistake(got, q, k, v) -> str:
    head_dim = q.shape[-1]
    near = lambda other: torch.allclose(got, other, atol=1e-8, rtol=0)
    if near(reference_attention(q, k, v, align="top_left")):
        return " (your mask is aligned top-left)"
    if near(reference_attention(q, k, v, causal=False)):
        return " (no causal mask: queries see future keys)"
    if near(reference_attention(q * math.sqrt(head_dim), k, v)):
        return " (the scores are not divided by sqrt(head_dim))"
    group = q.shape[1] // k.shape[1]
    if group > 1 and k.shape[1] > 1 and near(reference_attention(q, k.repeat(1, group, 1), v.repeat(1, group, 1))):
        return " (KV heads are tiled 0,1,0,1 instead of grouped 0,0,1,1: use repeat_interleave)"
    return ""


def check_attention(fn, trials: int = 20, seed: int | None = None) -> bool:
    """fn(q [n,Hq,D], k [m,Hkv,D], v [m,Hkv,D]) -> [n,Hq,D]: causal (bottom-right), GQA."""
    rng = random.Random(seed)   # seed=None: fresh inputs every run
    # The first shapes have a cache (m > n) AND several KV heads with groups:
    # they catch a top-left mask and tiled heads.
    cases = [(3, 3), (1, 6), (4, 9)] + [(n, n + rng.randrange(0, 12))
                                        for n in (rng.randrange(1, 8) for _ in range(trials))]
    for i, (n, m) in enumerate(cases):
        q, k, v = _random_qkv(rng, n, m)
        if i == 2:      # two KV heads, two query heads each
            g = torch.Generator().manual_seed(rng.randrange(2**31))
            q, k, v = (torch.randn(n, 4, 8, generator=g, dtype=torch.float64),
                       torch.randn(m, 2, 8, generator=g, dtype=torch.float64),
                       torch.randn(m, 2, 8, generator=g, dtype=torch.float64))
        want = reference_attention(q, k, v)
        got = learner_call(fn, q.clone(), k.clone(), v.clone(), forbidden=_ATTENTION + _MASKS[1:],
                           why="compute softmax(q k^T / sqrt(D)) over the allowed keys yourself "
                               "(your causal_mask from task 1 is fine).")
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            fail(f"q {tuple(q.shape)}, k {tuple(k.shape)}: got {shape}, expected shape {tuple(want.shape)}")
        got = got.to(torch.float64)
        if torch.isnan(got).any():
            fail(f"q {tuple(q.shape)}, k {tuple(k.shape)}: your output has NaN: some query row has every key "
                 "masked, a softmax of all -inf; each query must see its own key (<=, not <)")
        if not torch.allclose(got, want, atol=1e-8, rtol=0):
            err = (got - want).abs().max().item()
            fail(f"q {tuple(q.shape)}, k {tuple(k.shape)}: max error {err:.2e}{_attention_mistake(got, q, k, v)}")
    return passed(f"attention matches the engine's reference on {len(cases)} shapes (GQA, chunks over a cache)")


def check_merge_attention(fn, trials: int = 20, seed: int | None = None) -> bool:
    """fn(out_a, lse_a, out_b, lse_b) -> (out, lse) over the union of the two key sets."""
    rng = random.Random(seed)   # seed=None: fresh inputs every run
    for trial in range(trials):
        n, m_a, m_b = rng.randrange(1, 6), rng.randrange(1, 9), rng.randrange(1, 9)
        if trial == 0:
            m_a, m_b = 1, 8      # unequal parts: an unweighted average is far off
        q, k, v = _random_qkv(rng, n, m_a + m_b)
        q = q * 3                # sharper scores: the parts' weights differ a lot
        out_a, lse_a = reference_attention(q, k[:m_a], v[:m_a], causal=False, return_lse=True)
        out_b, lse_b = reference_attention(q, k[m_a:], v[m_a:], causal=False, return_lse=True)
        if trial == 1:           # large scores, as long contexts have: exp(lse) overflows
            lse_a, lse_b = lse_a + 800, lse_b + 800
        want_out, want_lse = merge_attention(out_a, lse_a, out_b, lse_b)
        got = learner_call(fn, out_a.clone(), lse_a.clone(), out_b.clone(), lse_b.clone(),
                           forbidden=("minillm.attention.merge_attention",),
                           why="combine the two parts with their log-sum-exps yourself.")
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            fail("fn must return a pair (out, lse)")
        out, lse = got
        if tuple(lse.shape) != tuple(want_lse.shape) or not torch.allclose(lse, want_lse, atol=1e-9, rtol=0):
            hint = "expected log(exp(lse_a) + exp(lse_b)) (torch.logaddexp)"
            if tuple(lse.shape) == tuple(want_lse.shape) and torch.allclose(lse, torch.maximum(lse_a, lse_b)):
                hint = "you return max(lse_a, lse_b): the new normaliser adds both parts, log(exp(a) + exp(b))"
            elif not torch.isfinite(lse).all():
                hint = ("your lse overflows for scores near 800: exp(800) is inf in float64; use "
                        "torch.logaddexp(lse_a, lse_b), which subtracts the maximum first")
            fail(f"lse wrong for n={n}, keys {m_a}+{m_b}: {hint}; shape {tuple(want_lse.shape)}")
        if tuple(out.shape) != tuple(want_out.shape) or not torch.allclose(out, want_out, atol=1e-9, rtol=0):
            hint = "weight each part by exp(lse_part - lse)"
            if tuple(out.shape) == tuple(want_out.shape) and torch.allclose(out, (out_a + out_b) / 2):
                hint = ("you average the two outputs: a part with larger scores weighs more; "
                        "weight each by exp(lse_part - lse)")
            fail(f"out wrong for n={n}, keys {m_a}+{m_b}: {hint}")
    return passed(f"merge matches attention over the union on {trials} random splits")
