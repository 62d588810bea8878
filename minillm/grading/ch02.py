"""Checkers for chapter 2 (the model): RMSNorm, RoPE, GQA heads, SwiGLU.

Each compares the learner's function with the engine's layer (minillm.model)
on fresh random inputs in float64, prints what is wrong and raises
AssertionError; prints one line and returns True when it matches.
"""
from __future__ import annotations

import random

import torch

from ..attention import _expand_kv_heads
from ..config import ModelConfig
from ..model import MLP, RMSNorm, apply_rope, rope_cos_sin

__all__ = ["check_rms_norm", "check_rope", "check_repeat_kv", "check_swiglu"]


def _fail(message: str):
    print("✗ " + message)
    raise AssertionError(message)


def _generator(rng: random.Random) -> torch.Generator:
    return torch.Generator().manual_seed(rng.randrange(2**31))


def _compare(got, want, what: str, atol: float = 1e-9):
    if not isinstance(got, torch.Tensor):
        _fail(f"{what}: returned {type(got).__name__}, expected a torch.Tensor")
    if tuple(got.shape) != tuple(want.shape):
        _fail(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    err = (got.to(torch.float64) - want).abs().max().item()
    if err > atol:
        _fail(f"{what}: max error {err:.2e} (allowed {atol:.0e})")


def check_rms_norm(fn, trials: int = 10, seed: int | None = None) -> bool:
    """fn(x [T, d], weight [d], eps) -> [T, d], like minillm.model.RMSNorm."""
    rng = random.Random(seed)   # seed=None: fresh inputs every run
    for _ in range(trials):
        g = _generator(rng)
        rows, dim, eps = rng.randrange(1, 6), rng.choice([4, 16, 64]), rng.choice([1e-5, 1e-6, 0.1])
        x = 3 * torch.randn(rows, dim, generator=g, dtype=torch.float64)
        norm = RMSNorm(dim, eps).to(torch.float64)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(dim, generator=g, dtype=torch.float64))
            want = norm(x)
        _compare(fn(x.clone(), norm.weight.detach().clone(), eps), want, f"x {tuple(x.shape)}, eps={eps}")
    print(f"✓ RMSNorm matches the engine's on {trials} random inputs")
    return True


def check_rope(fn, trials: int = 10, seed: int | None = None) -> bool:
    """fn(x [T, H, D], positions [T], theta) -> x rotated, like rope_cos_sin + apply_rope."""
    rng = random.Random(seed)   # seed=None: fresh inputs every run
    for _ in range(trials):
        g = _generator(rng)
        head_dim, heads, T = rng.choice([4, 8, 64]), rng.choice([1, 3]), rng.randrange(1, 8)
        theta = rng.choice([10000.0, 500000.0])
        cfg = ModelConfig(name="check", vocab_size=8, hidden_size=head_dim * heads, intermediate_size=8,
                          num_layers=1, num_heads=heads, num_kv_heads=heads, head_dim=head_dim,
                          rope_theta=theta)
        x = torch.randn(T, heads, head_dim, generator=g, dtype=torch.float64)
        positions = torch.randint(0, 4000, (T,), generator=g)
        want = apply_rope(x, *rope_cos_sin(cfg, positions, torch.float64))
        _compare(fn(x.clone(), positions.clone(), theta), want,
                 f"x {tuple(x.shape)}, positions {positions.tolist()}, theta={theta:g}", atol=1e-8)
    print(f"✓ RoPE matches the engine's on {trials} random inputs (pairs (i, i + D/2))")
    return True


def check_repeat_kv(fn, trials: int = 10, seed: int | None = None) -> bool:
    """fn(k [m, Hkv, D], num_heads) -> [m, num_heads, D]: KV head j serves query heads j*g .. j*g+g-1."""
    rng = random.Random(seed)   # seed=None: fresh inputs every run
    # The first shapes have several KV heads AND groups, where tiling and grouping differ.
    shapes = [(2, 2), (4, 2)] + [(rng.choice([1, 2, 4]), rng.choice([1, 2, 4])) for _ in range(trials)]
    for num_kv_heads, group in shapes:
        g = _generator(rng)
        k = torch.randn(rng.randrange(1, 6), num_kv_heads, 4, generator=g, dtype=torch.float64)
        want = _expand_kv_heads(k, num_kv_heads * group)
        got = fn(k.clone(), num_kv_heads * group)
        if isinstance(got, torch.Tensor) and got.shape == want.shape and not torch.equal(got, want) \
                and torch.equal(got, k.repeat(1, group, 1)):
            _fail("heads are tiled (0,1,0,1) instead of grouped (0,0,1,1): use repeat_interleave")
        _compare(got, want, f"k {tuple(k.shape)}, num_heads={num_kv_heads * group}", atol=0)
    print(f"✓ KV heads expanded like the engine's on {len(shapes)} shapes")
    return True


def check_swiglu(fn, trials: int = 10, seed: int | None = None) -> bool:
    """fn(x [T, d], gate_w [f, d], up_w [f, d], down_w [d, f]) -> [T, d], like minillm.model.MLP."""
    rng = random.Random(seed)   # seed=None: fresh inputs every run
    for _ in range(trials):
        g = _generator(rng)
        d, f = rng.choice([4, 8]), rng.choice([6, 12])
        cfg = ModelConfig(name="check", vocab_size=8, hidden_size=d, intermediate_size=f,
                          num_layers=1, num_heads=1, num_kv_heads=1)
        mlp = MLP(cfg).to(torch.float64)
        with torch.no_grad():
            for p in mlp.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
            x = torch.randn(rng.randrange(1, 5), d, generator=g, dtype=torch.float64)
            want = mlp(x)
        weights = [w.detach().clone() for w in (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)]
        _compare(fn(x.clone(), *weights), want, f"x {tuple(x.shape)}, intermediate {f}")
    print(f"✓ SwiGLU MLP matches the engine's on {trials} random inputs")
    return True
