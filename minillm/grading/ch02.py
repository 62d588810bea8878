"""Checkers for chapter 2 (the model): RMSNorm, GQA heads, SwiGLU, RoPE, then
two tasks past the chapter's printed code: moving cached keys to new positions
(RoPE's rotations compose) and predicting a model's parameter count before the
engine builds the model and counts.

Each compares the learner's function with the engine's layer (minillm.model)
on fixed random inputs in float64 and names the likely mistake.
"""
from __future__ import annotations

import random

import torch

from ..attention import _expand_kv_heads
from ..config import ModelConfig
from ..model import MLP, RMSNorm, apply_rope, rope_cos_sin
from ._common import call_text, checker, fail as _fail, grade_prediction, learner_call, passed

__all__ = ["check_rms_norm", "check_rope", "check_repeat_kv", "check_swiglu", "check_move_rope",
           "check_num_parameters"]

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
    inv32 = theta ** (-torch.arange(half) * 2 / x.shape[-1])                 # torch's default: float32
    angles32 = positions[:, None] * inv32[None, :]
    c32, s32 = angles32.cos()[:, None, :], angles32.sin()[:, None, :]
    all32 = torch.cat([x[..., :half] * c32 - x[..., half:] * s32, x[..., half:] * c32 + x[..., :half] * s32], -1)
    if torch.allclose(got, all32.to(torch.float64), atol=1e-6):
        return (" (your frequencies and angles are float32: torch.arange(...) * 2 / D makes float32, and at "
                "positions in the thousands a float32 angle is off by ~1e-4 rad; ask for dtype=torch.float64 and turn the "
                "positions into float64 before multiplying)")
    float32_angles = (positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]).to(torch.float64)
    cos32, sin32 = float32_angles.cos()[:, None, :], float32_angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    if torch.allclose(got, torch.cat([x1 * cos32 - x2 * sin32, x2 * cos32 + x1 * sin32], dim=-1), atol=1e-8) \
            or torch.allclose(got, _rotate_half(x, positions, inv_freq.to(torch.float32)).to(torch.float64), atol=1e-6):
        return (" (your angles are float32: at positions in the thousands a float32 angle is off by ~1e-4 rad; compute the "
                "frequencies AND the angles in float64, positions included: torch makes float32 unless asked)")
    if torch.allclose(got, _rotate_half(x, torch.arange(len(positions)), inv_freq), atol=1e-8) \
            and not torch.equal(positions, torch.arange(len(positions))):
        return (" (you ignore `positions`: you rotate row t by position t, as if every chunk started at 0; "
                "rotate each row by ITS absolute position, positions[t])")
    if torch.allclose(got, x, atol=1e-8):
        return " (x came back unrotated)"
    if (got - _rotate_half(x, positions, inv_freq)).abs().max() < 1e-2:
        return (" (close but not float64-close: some step ran in float32 (the frequencies, the positions "
                "or the angles); keep all of them float64)")
    return ""


def _generator(rng: random.Random) -> torch.Generator:
    return torch.Generator().manual_seed(rng.randrange(2**31))


def _compare(got, want, what: str, atol: float = 1e-9, hint: str = ""):
    if not isinstance(got, torch.Tensor):
        _fail(f"{what}: returned {type(got).__name__}, expected a torch.Tensor")
    if tuple(got.shape) != tuple(want.shape):
        _fail(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    err = (got.to(torch.float64) - want).abs().max().item()
    if err > atol:
        _fail(f"{what}: max error {err:.2e} (allowed {atol:.0e}){hint}")


@checker
def check_rms_norm(fn, trials: int = 10, seed: int | None = None):
    """fn(x [T, d], weight [d], eps) -> [T, d], like minillm.model.RMSNorm."""
    rng = random.Random(seed)
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
        _compare(got, want, call_text(fn, x, weight, eps), hint=hint)
    passed(f"RMSNorm matches the engine's on {trials} random inputs")


@checker
def check_rope(fn, trials: int = 10, seed: int | None = None):
    """fn(x [T, H, D], positions [T], theta) -> x rotated, like rope_cos_sin + apply_rope."""
    rng = random.Random(seed)
    for trial in range(trials):
        g = _generator(rng)
        head_dim, heads, T = rng.choice([4, 8, 64]), rng.choice([1, 3]), rng.randrange(1, 8)
        theta = rng.choice([10000.0, 500000.0])
        cfg = ModelConfig(name="check", vocab_size=8, hidden_size=head_dim * heads, intermediate_size=8,
                          num_layers=1, num_heads=heads, num_kv_heads=heads, head_dim=head_dim,
                          rope_theta=theta)
        x = torch.randn(T, heads, head_dim, generator=g, dtype=torch.float64)
        positions = torch.randint(0, 4000, (T,), generator=g)
        if trial == 0:                     # a chunk that starts mid-prompt: positions s, s+1, ...
            positions = torch.arange(1000, 1000 + T)
        want = apply_rope(x, *rope_cos_sin(cfg, positions, torch.float64))
        got = learner_call(fn, x.clone(), positions.clone(), theta, forbidden=_ROPE, why=_WHY)
        hint = _rope_mistake(got, x, positions, theta) \
            if isinstance(got, torch.Tensor) and got.shape == x.shape else ""
        _compare(got, want, call_text(fn, x, positions, theta), atol=1e-8, hint=hint)
    passed(f"RoPE matches the engine's on {trials} random inputs (pairs (i, i + D/2))")


@checker
def check_repeat_kv(fn, trials: int = 10, seed: int | None = None):
    """fn(k [m, Hkv, D], num_heads) -> [m, num_heads, D]: KV head j serves query heads j*g .. j*g+g-1."""
    rng = random.Random(seed)
    # The first shapes have several KV heads AND groups, where tiling and grouping differ.
    shapes = [(2, 2), (4, 2)] + [(rng.choice([1, 2, 4]), rng.choice([1, 2, 4])) for _ in range(trials)]
    for num_kv_heads, group in shapes:
        g = _generator(rng)
        k = torch.randn(rng.randrange(1, 6), num_kv_heads, 4, generator=g, dtype=torch.float64)
        want = _expand_kv_heads(k, num_kv_heads * group)
        got = learner_call(fn, k.clone(), num_kv_heads * group, forbidden=_REPEAT, why=_WHY)
        if isinstance(got, torch.Tensor) and got.shape == want.shape and not torch.equal(got, want) \
                and torch.equal(got, k.repeat(1, group, 1)):
            _fail(f"{call_text(fn, k, num_kv_heads * group)}: heads are tiled (0,1,0,1) instead of grouped "
                  "(0,0,1,1): neighbouring query heads share a KV head")
        _compare(got, want, call_text(fn, k, num_kv_heads * group), atol=0)
    passed(f"KV heads expanded like the engine's on {len(shapes)} shapes")


@checker
def check_swiglu(fn, trials: int = 10, seed: int | None = None):
    """fn(x [T, d], gate_w [f, d], up_w [f, d], down_w [d, f]) -> [T, d], like minillm.model.MLP."""
    rng = random.Random(seed)
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
        _compare(got, want, call_text(fn, x, *weights), hint=hint)
    passed(f"SwiGLU MLP matches the engine's on {trials} random inputs")


# ---------------------------------------------------------------------------
# Transfer: cached keys moved to new positions
# ---------------------------------------------------------------------------
def _rope64(x, positions, theta):
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    return _rotate_half(x, positions, inv_freq)


@checker
def check_move_rope(fn, trials: int = 10, seed: int | None = None):
    """fn(k_cached [T, H, D], old_positions [T], new_positions [T], theta) -> the keys as if RoPE had
    rotated them at new_positions. k_cached is stored AFTER RoPE at old_positions; the raw keys are gone."""
    rng = random.Random(seed)
    for trial in range(trials):
        g = _generator(rng)
        head_dim, heads, T = rng.choice([4, 8, 64]), rng.choice([1, 2]), rng.randrange(1, 9)
        theta = rng.choice([10000.0, 500000.0])
        raw = torch.randn(T, heads, head_dim, generator=g, dtype=torch.float64)
        old = torch.arange(T) + rng.randrange(0, 3000)           # where the keys were computed
        shift = rng.choice([-1, 1]) * rng.randrange(1, 2000)
        if trial == 0:
            old, shift = torch.arange(T) + 700, -700              # a cached prefix moved to the start
        new = (old + shift).clamp(min=0) if trial else old + shift
        cached = _rope64(raw, old, theta)
        want = _rope64(raw, new, theta)
        call = call_text(fn, cached, old, new, theta)
        got = learner_call(fn, cached.clone(), old.clone(), new.clone(), theta, forbidden=_ROPE,
                           why="use your own rope from task 4 (or the rotation itself), not the engine's.")
        hint = ""
        if isinstance(got, torch.Tensor) and got.shape == want.shape:
            got64 = got.to(torch.float64)
            if torch.allclose(got64, _rope64(cached, new, theta), atol=1e-8):
                hint = (" (you rotate the stored keys by their NEW positions' full angle, but they are already "
                        "rotated by the old ones: the result sits at old + new)")
            elif torch.allclose(got64, _rope64(cached, old - new, theta), atol=1e-8):
                hint = " (you rotate by old - new: the opposite direction)"
            elif torch.allclose(got64, cached, atol=1e-8):
                hint = " (the keys came back unchanged: they still sit at their old positions)"
        _compare(got, want, call, atol=1e-8, hint=hint)
    passed(f"cached keys moved to new positions on {trials} cases, with no raw keys to recompute from")


# ---------------------------------------------------------------------------
# Predict, then measure: the parameter count
# ---------------------------------------------------------------------------
def measured_parameters(cfg: ModelConfig) -> int:
    """Build the engine's model for cfg on the meta device (no memory) and count its parameters."""
    from ..model import LlamaModel
    with torch.device("meta"):
        model = LlamaModel(cfg)
    return sum(p.numel() for p in model.parameters())


def _random_shapes(rng: random.Random):
    shapes = []
    for i in range(6):
        kv = rng.choice([1, 2, 4])
        heads = kv * rng.choice([1, 2, 4])
        head_dim = rng.choice([4, 8, 16])
        shapes.append(ModelConfig(
            name=f"random-{i}", vocab_size=rng.randint(10, 300), hidden_size=rng.choice([8, 16, 32, 48]),
            intermediate_size=rng.randint(8, 100), num_layers=rng.randint(1, 4), num_heads=heads,
            num_kv_heads=kv, head_dim=head_dim, tie_word_embeddings=i % 2 == 1,
            attention_bias=i in (2, 5), qk_norm=i in (3, 5)))
    return shapes


@checker
def check_num_parameters(fn, seed: int | None = None):
    """fn(cfg) -> the number of parameters of the engine's model for cfg, predicted from the shapes; the
    checker builds the model and counts (tolerance 0.1%)."""
    from ..config import PRESETS
    rng = random.Random(seed)
    configs = _random_shapes(rng) + [PRESETS["tiny"], PRESETS["qwen3-0.6b"], PRESETS["llama-3-8b"]]
    for cfg in configs:
        measured = measured_parameters(cfg)
        got = learner_call(fn, cfg, forbidden=("minillm.config.ModelConfig.num_parameters",
                                               "minillm.loader.build_model", "minillm.build_model",
                                               "minillm.model.LlamaModel.__init__"),
                           why="predict it from the shapes in cfg: the checker builds the model and counts.")
        d, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        why = ("count, per layer, q, k, v and o projections, the MLP's three matrices and the two norms; then "
               "the embedding, the final norm and the LM head")
        if isinstance(got, int) and not cfg.tie_word_embeddings and got == measured - cfg.vocab_size * d:
            why = "the LM head is its own matrix here (tie_word_embeddings=False): vocab_size x hidden_size more"
        elif isinstance(got, int) and cfg.tie_word_embeddings and got == measured + cfg.vocab_size * d:
            why = "tie_word_embeddings=True: the LM head IS the embedding matrix, counted once"
        elif isinstance(got, int) and cfg.num_heads != cfg.num_kv_heads and \
                got == measured + 2 * cfg.num_layers * (q - kv) * d + (2 * (q - kv) if cfg.attention_bias else 0) * cfg.num_layers:
            why = "k_proj and v_proj project to num_kv_heads x head_dim, not num_heads x head_dim (GQA)"
        elif isinstance(got, int) and cfg.head_dim != d // cfg.num_heads and got != measured:
            why += f"; head_dim is {cfg.head_dim} here, not hidden_size // num_heads = {d // cfg.num_heads}"
        flags = [f for f in ("tie_word_embeddings", "attention_bias", "qk_norm") if getattr(cfg, f)]
        grade_prediction(f"{call_text(fn, cfg)} (hidden {d}, {cfg.num_layers} layers, heads {cfg.num_heads}/"
                         f"{cfg.num_kv_heads}, head_dim {cfg.head_dim}{', ' + ', '.join(flags) if flags else ''})",
                         got, measured, 1e-3, why)
    passed(f"your parameter counts match the engine's models on {len(configs)} shapes (within 0.1%)")
