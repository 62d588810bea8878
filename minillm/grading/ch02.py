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
from ._common import fail as _fail, learner_call, passed

__all__ = ["check_rms_norm", "check_rope", "check_repeat_kv", "check_swiglu"]

_WHY = "this task asks you to write the layer from tensor operations."
_NORMS = ("minillm.model.RMSNorm.forward", "torch.nn.functional.rms_norm", "torch.nn.RMSNorm.forward")
_ROPE = ("minillm.model.apply_rope", "minillm.model.rope_cos_sin", "minillm.model.rope_inverse_frequencies")
_REPEAT = ("minillm.attention._expand_kv_heads",)
_MLP = ("minillm.model.MLP.forward",)


def _rms_mistake(got, x, weight, eps) -> str:
    near = lambda other: torch.allclose(got.to(torch.float64), other, atol=1e-9, rtol=0)
    if near(weight * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps)):
        return " (eps goes INSIDE the root: rsqrt(mean(x^2) + eps))"
    if near(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)):
        return " (multiply by weight at the end)"
    centred = x - x.mean(-1, keepdim=True)
    if near(weight * centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)):
        return " (that is LayerNorm: RMSNorm subtracts no mean)"
    if near(weight * x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + eps)):
        return " (the mean runs over the last dimension, one value per row)"
    return ""


def _rotate_half(x, positions, inv_freq):
    half = x.shape[-1] // 2
    angles = positions.to(torch.float64)[:, None] * inv_freq.to(torch.float64)[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _rope_mistake(got, x, positions, theta) -> str:
    """The usual slips: interleaved pairs (GPT-J / Meta's original) instead of rotate-half,
    the angle's sign, float32 frequencies, no rotation."""
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    interleaved = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)
    got = got.to(torch.float64)
    if torch.allclose(got, interleaved, atol=1e-8):
        return " (you rotate pairs (2i, 2i+1); the engine pairs i with i + D/2, \"rotate half\")"
    if torch.allclose(got, _rotate_half(x, -positions, inv_freq), atol=1e-8):
        return " (you rotate by -angle: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin))"
    float32_freq = 1.0 / (theta ** (torch.arange(0, x.shape[-1], 2, dtype=torch.float32) / x.shape[-1]))
    if torch.allclose(got, _rotate_half(x, positions, float32_freq), atol=1e-8):
        return (" (your frequencies are float32: torch.arange(0, D, 2) / D is float32 unless you ask for "
                "dtype=torch.float64)")
    if torch.allclose(got, x, atol=1e-8):
        return " (x came back unrotated)"
    return ""


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
        weight = norm.weight.detach().clone()
        got = learner_call(fn, x.clone(), weight.clone(), eps, forbidden=_NORMS, why=_WHY)
        hint = _rms_mistake(got, x, weight, eps) if isinstance(got, torch.Tensor) and got.shape == x.shape else ""
        _compare(got, want, f"x {tuple(x.shape)}, eps={eps}{hint}")
    return passed(f"RMSNorm matches the engine's on {trials} random inputs")


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
        got = learner_call(fn, x.clone(), positions.clone(), theta, forbidden=_ROPE, why=_WHY)
        hint = _rope_mistake(got, x, positions, theta) \
            if isinstance(got, torch.Tensor) and got.shape == x.shape else ""
        _compare(got, want, f"x {tuple(x.shape)}, positions {positions.tolist()}, theta={theta:g}{hint}",
                 atol=1e-8)
    return passed(f"RoPE matches the engine's on {trials} random inputs (pairs (i, i + D/2))")


def check_repeat_kv(fn, trials: int = 10, seed: int | None = None) -> bool:
    """fn(k [m, Hkv, D], num_heads) -> [m, num_heads, D]: KV head j serves query heads j*g .. j*g+g-1."""
    rng = random.Random(seed)   # seed=None: fresh inputs every run
    # The first shapes have several KV heads AND groups, where tiling and grouping differ.
    shapes = [(2, 2), (4, 2)] + [(rng.choice([1, 2, 4]), rng.choice([1, 2, 4])) for _ in range(trials)]
    for num_kv_heads, group in shapes:
        g = _generator(rng)
        k = torch.randn(rng.randrange(1, 6), num_kv_heads, 4, generator=g, dtype=torch.float64)
        want = _expand_kv_heads(k, num_kv_heads * group)
        got = learner_call(fn, k.clone(), num_kv_heads * group, forbidden=_REPEAT, why=_WHY)
        if isinstance(got, torch.Tensor) and got.shape == want.shape and not torch.equal(got, want) \
                and torch.equal(got, k.repeat(1, group, 1)):
            _fail("heads are tiled (0,1,0,1) instead of grouped (0,0,1,1): use repeat_interleave")
        _compare(got, want, f"k {tuple(k.shape)}, num_heads={num_kv_heads * group}", atol=0)
    return passed(f"KV heads expanded like the engine's on {len(shapes)} shapes")


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
        got = learner_call(fn, x.clone(), *[w.clone() for w in weights], forbidden=_MLP, why=_WHY)
        gate_w, up_w, down_w = weights
        hint = ""
        if isinstance(got, torch.Tensor) and got.shape == want.shape:
            if torch.allclose(got.to(torch.float64), (torch.nn.functional.silu(x @ up_w.T) * (x @ gate_w.T)) @ down_w.T):
                hint = " (SiLU goes on the gate projection, not on up)"
            elif torch.allclose(got.to(torch.float64), (torch.nn.functional.gelu(x @ gate_w.T) * (x @ up_w.T)) @ down_w.T):
                hint = " (that is GeGLU: SwiGLU uses SiLU, x * sigmoid(x))"
        _compare(got, want, f"x {tuple(x.shape)}, intermediate {f}{hint}")
    return passed(f"SwiGLU MLP matches the engine's on {trials} random inputs")
