"""Checkers for chapter 1 (causal attention).

Each checker calls the learner's function on fresh random shapes, compares it
with the engine (minillm.attention) in float64, prints the first thing that
is wrong and raises AssertionError; it prints one line and returns True when
everything matches.
"""
from __future__ import annotations

import random

import torch

from ..attention import causal_mask, merge_attention, reference_attention

__all__ = ["check_causal_mask", "check_attention", "check_merge_attention"]


def _fail(message: str):
    print("✗ " + message)
    raise AssertionError(message)


def _random_qkv(rng: random.Random, n: int, m: int):
    num_kv_heads = rng.choice([1, 2])
    num_heads = num_kv_heads * rng.choice([1, 2, 4])
    head_dim = rng.choice([4, 8])
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    q = torch.randn(n, num_heads, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(m, num_kv_heads, head_dim, generator=g, dtype=torch.float64)
    v = torch.randn(m, num_kv_heads, head_dim, generator=g, dtype=torch.float64)
    return q, k, v


def check_causal_mask(fn, trials: int = 20, seed: int | None = None) -> bool:
    """fn(q_len, k_len) -> bool [q_len, k_len], bottom-right aligned (a chunk over a cache)."""
    rng = random.Random(seed)   # seed=None: fresh inputs every run
    cases = [(1, 1), (4, 4), (1, 7), (3, 8)] + [
        (n, n + rng.randrange(0, 10)) for n in (rng.randrange(1, 9) for _ in range(trials))]
    for q_len, k_len in cases:
        got = fn(q_len, k_len)
        want = causal_mask(q_len, k_len)
        if not isinstance(got, torch.Tensor):
            _fail(f"fn({q_len}, {k_len}) returned {type(got).__name__}, expected a torch.Tensor")
        if tuple(got.shape) != (q_len, k_len):
            _fail(f"fn({q_len}, {k_len}).shape = {tuple(got.shape)}, expected ({q_len}, {k_len})")
        if got.dtype != torch.bool:
            _fail(f"fn({q_len}, {k_len}).dtype = {got.dtype}, expected torch.bool (True = may attend)")
        if not torch.equal(got.cpu(), want):
            if torch.equal(got.cpu(), causal_mask(q_len, k_len, align="top_left")):
                _fail(f"fn({q_len}, {k_len}) is aligned top-left: query i must sit at position "
                      f"k_len - q_len + i = {k_len - q_len} + i, not at i")
            _fail(f"fn({q_len}, {k_len}) differs from the expected mask:\n{want.int()}\ngot:\n{got.int()}")
    print(f"✓ causal mask correct on {len(cases)} shapes, including chunks over a cache")
    return True


def check_attention(fn, trials: int = 20, seed: int | None = None) -> bool:
    """fn(q [n,Hq,D], k [m,Hkv,D], v [m,Hkv,D]) -> [n,Hq,D]: causal (bottom-right), GQA."""
    rng = random.Random(seed)   # seed=None: fresh inputs every run
    cases = [(3, 3), (1, 6), (4, 9)] + [(n, n + rng.randrange(0, 12))
                                        for n in (rng.randrange(1, 8) for _ in range(trials))]
    for n, m in cases:
        q, k, v = _random_qkv(rng, n, m)
        got = fn(q, k, v)
        want = reference_attention(q, k, v)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            _fail(f"q {tuple(q.shape)}, k {tuple(k.shape)}: got {shape}, expected shape {tuple(want.shape)}")
        if not torch.allclose(got.to(torch.float64), want, atol=1e-8, rtol=0):
            hint = ""
            if torch.allclose(got.to(torch.float64), reference_attention(q, k, v, align="top_left"), atol=1e-8):
                hint = " (your mask is aligned top-left)"
            elif torch.allclose(got.to(torch.float64), reference_attention(q, k, v, causal=False), atol=1e-8):
                hint = " (no causal mask: queries see future keys)"
            err = (got.to(torch.float64) - want).abs().max().item()
            _fail(f"q {tuple(q.shape)}, k {tuple(k.shape)}: max error {err:.2e}{hint}")
    print(f"✓ attention matches the engine's reference on {len(cases)} shapes (GQA, chunks over a cache)")
    return True


def check_merge_attention(fn, trials: int = 20, seed: int | None = None) -> bool:
    """fn(out_a, lse_a, out_b, lse_b) -> (out, lse) over the union of the two key sets."""
    rng = random.Random(seed)   # seed=None: fresh inputs every run
    for _ in range(trials):
        n, m_a, m_b = rng.randrange(1, 6), rng.randrange(1, 9), rng.randrange(1, 9)
        q, k, v = _random_qkv(rng, n, m_a + m_b)
        out_a, lse_a = reference_attention(q, k[:m_a], v[:m_a], causal=False, return_lse=True)
        out_b, lse_b = reference_attention(q, k[m_a:], v[m_a:], causal=False, return_lse=True)
        got = fn(out_a.clone(), lse_a.clone(), out_b.clone(), lse_b.clone())
        if not (isinstance(got, tuple) and len(got) == 2):
            _fail("fn must return a pair (out, lse)")
        out, lse = got
        want_out, want_lse = merge_attention(out_a, lse_a, out_b, lse_b)
        if tuple(lse.shape) != tuple(want_lse.shape) or not torch.allclose(lse, want_lse, atol=1e-9, rtol=0):
            _fail(f"lse wrong for n={n}, keys {m_a}+{m_b}: expected log(exp(lse_a) + exp(lse_b)), shape {tuple(want_lse.shape)}")
        if tuple(out.shape) != tuple(want_out.shape) or not torch.allclose(out, want_out, atol=1e-9, rtol=0):
            _fail(f"out wrong for n={n}, keys {m_a}+{m_b}: weight each part by exp(lse_part - lse)")
    print(f"✓ merge matches attention over the union on {trials} random splits")
    return True
