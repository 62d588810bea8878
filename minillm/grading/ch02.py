"""Checkers for chapter 2 (the model): RoPE (a warm-up), grouped-query scores computed
without copying K (a debug task: a fold of the query heads that pairs them with the wrong KV
head), cached keys repaired to new positions (RoPE's rotations compose: the raw keys are
gone), and a prediction of every module's parameter count before the engine builds the
model and counts.

Expected values come from the engine (minillm.model's RoPE, the attention module's head
expansion, the model built on the meta device and counted), computed before the learner's
function runs with those functions switched off; the messages name the likely mistake.
Teacher-only cases: minillm/grading/_hidden/ch02.py.
"""
from __future__ import annotations

import math
import random

import torch

from ..attention import _expand_kv_heads
from ..config import ModelConfig
from ..model import apply_rope, rope_cos_sin
from ._common import (call_text, checker, fail as _fail, grade_count, learner_call, passed,
                      watch_copies)

__all__ = ["check_rope", "check_grouped_scores", "check_move_rope", "check_parameter_counts"]

_WHY = "this task asks you to write it from tensor operations."
_ROPE = ("minillm.model.apply_rope", "minillm.model.rope_cos_sin", "minillm.model.rope_inverse_frequencies")
_HEADS = ("minillm.attention._expand_kv_heads", "minillm.attention.reference_attention",
          "minillm.attention.unmasked_attention", "minillm.attention.sdpa_attention",
          "minillm.attention.causal_block_attention", "minillm.attention.chunk_attention",
          "torch.nn.functional.scaled_dot_product_attention")


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
    half_freq = theta ** (-torch.arange(half, dtype=torch.float64) / x.shape[-1])
    if torch.allclose(got, _rotate_half(x, positions, half_freq), atol=1e-6):
        return (" (your pair i turns at theta^(-i/D) radians per position: every pair but the first turns too "
                "fast; the statement's frequency of pair i is theta^(-2i/D))")
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


# ---------------------------------------------------------------------------
# Debug: grouped-query scores without copying K
# ---------------------------------------------------------------------------
def _scores(q, k, tiled: bool = False, scale: float | None = None) -> torch.Tensor:
    """[Hq, n, m] scores, K expanded to the query heads by the engine (grouped) or tiled (a mistake)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    keys = k.repeat(1, num_heads // k.shape[1], 1) if tiled else _expand_kv_heads(k, num_heads)
    return torch.einsum("nhd,mhd->hnm", q, keys) * (1 / math.sqrt(head_dim) if scale is None else scale)


def _folded_group_major(q, k, scale: float) -> torch.Tensor:
    """The fold that views q as [n, group, Hkv, D]: query head h meets KV head h % Hkv, and the
    output's heads come out in (KV head, group) order (the mistake the task's code makes)."""
    n, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    q_rows = q.reshape(n, num_heads // num_kv_heads, num_kv_heads, head_dim)
    return torch.einsum("ngkd,mkd->kgnm", q_rows, k).reshape(num_heads, n, k.shape[0]) * scale


def _scores_mistake(got, q, k) -> str:
    head_dim = q.shape[-1]
    group = q.shape[1] // k.shape[1]
    near = lambda other: got.shape == other.shape and torch.allclose(got, other, atol=1e-9, rtol=0)
    pairing = (f"query head h meets KV head h % {k.shape[1]} (tiled 0,1,0,1), but neighbouring query heads "
               f"share a KV head (grouped 0,0,1,1): look at which query heads your reshape puts together "
               "with KV head 0")
    scales = ((1 / math.sqrt(head_dim), ""), (1 / head_dim, f"you divide by D = {head_dim}; the scale is 1/sqrt(D)"),
              (1.0, "the scores are not divided by sqrt(D)"))
    for scale, what in scales:
        for candidate, paired in ((_scores(q, k, scale=scale), ""), (_scores(q, k, True, scale), pairing),
                                  (_folded_group_major(q, k, scale), pairing)):
            if (paired or what) and near(candidate):
                return " (" + "; and ".join(part for part in (paired, what) if part) + ")"
    if got.dim() == 3 and tuple(got.shape) == (q.shape[0], q.shape[1], k.shape[0]):
        return " (that is [n, Hq, m]: return the scores head first, [Hq, n, m])"
    reordered = _scores(q, k).reshape(k.shape[1], group, q.shape[0], k.shape[0]).transpose(0, 1)
    if group > 1 and k.shape[1] > 1 and near(reordered.reshape(got.shape)):
        return (" (every query head meets its right KV head, but your heads come out in another order: "
                "output head h must be query head h, and yours are ordered group by group)")
    return ""


@checker
def check_grouped_scores(fn, trials: int = 10, seed: int | None = None):
    """fn(q [n, Hq, D], k [m, Hkv, D]) -> scores [Hq, n, m] = q_h . k_(h // group) / sqrt(D), computed
    WITHOUT copying K to the query heads (no repeat, expand, gather or concatenation of k)."""
    rng = random.Random(seed)
    # several KV heads with groups first: where grouped and tiled pairings differ
    shapes = [(2, 2), (4, 2), (2, 3)] + [(rng.choice([1, 2, 4]), rng.choice([1, 2, 4])) for _ in range(trials)]
    for num_kv_heads, group in shapes:
        g = _generator(rng)
        n, m, head_dim = rng.randrange(1, 6), rng.randrange(1, 9), rng.choice([4, 8, 16])
        q = torch.randn(n, num_kv_heads * group, head_dim, generator=g, dtype=torch.float64)
        k = torch.randn(m, num_kv_heads, head_dim, generator=g, dtype=torch.float64)
        want = _scores(q, k)
        call = call_text(fn, q, k)
        q_in, k_in = q.clone(), k.clone()
        with watch_copies(k_in) as copies:
            got = learner_call(fn, q_in, k_in, forbidden=_HEADS,
                               why="fold the query heads yourself: the task is reading K without copying it.")
        if copies:
            op, before, after = copies[0]
            _fail(f"{call} copies K: {op} turns k {list(before)} into {list(after)}. The fold's point is that "
                  "each KV head is read as it is, by the query heads of its group: reshape q, not k")
        if not isinstance(got, torch.Tensor):
            _fail(f"{call} returned {type(got).__name__}, expected a torch.Tensor")
        got = got.to(torch.float64)
        if tuple(got.shape) != tuple(want.shape):
            _fail(f"{call}: shape {tuple(got.shape)}, expected {tuple(want.shape)}{_scores_mistake(got, q, k)}")
        hint = "" if torch.allclose(got, want, atol=1e-9, rtol=0) else _scores_mistake(got, q, k)
        _compare(got, want, call, hint=hint)
    passed(f"grouped-query scores right on {len(shapes)} shapes, K never copied")


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
                           why="use your own rope from task 1 (or the rotation itself), not the engine's.")
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
            elif torch.allclose(got64, _rope64(cached, old + new, theta), atol=1e-8):
                hint = (" (you rotate the stored keys by old + new: they already carry the old positions' "
                        "rotation, and you add it once more)")
            elif (got64 - want).abs().max() < 1e-4:
                hint = (" (close but not float64-close: some step ran in float32 (the frequencies, the positions "
                        "or the angles); keep all of them float64)")
        _compare(got, want, call, atol=1e-8, hint=hint)
    passed(f"cached keys moved to new positions on {trials} cases, with no raw keys to recompute from")


# ---------------------------------------------------------------------------
# Predict, then measure: every module's parameters
# ---------------------------------------------------------------------------
MODULES = ("embed_tokens", "input_layernorm", "q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm",
           "post_attention_layernorm", "gate_proj", "up_proj", "down_proj", "norm", "lm_head")


def measured_parameter_counts(cfg: ModelConfig) -> dict[str, int]:
    """Build the engine's model for cfg on the meta device (no memory) and count its parameters per
    module name (q_proj, k_proj, ...: weights and biases, summed over the layers). The layers' random
    init is skipped: it changes no shape, and on the meta device its first call imports torch's
    decompositions (seconds)."""
    from unittest import mock
    from ..model import LlamaModel
    skip = lambda module: None
    with mock.patch.object(torch.nn.Linear, "reset_parameters", skip), \
            mock.patch.object(torch.nn.Embedding, "reset_parameters", skip), torch.device("meta"):
        model = LlamaModel(cfg)
    counts = dict.fromkeys(MODULES, 0)
    for name, parameter in model.named_parameters():       # a tied LM head is the embedding: listed once
        counts[name.split(".")[-2]] += parameter.numel()
    return counts


def _random_shapes(rng: random.Random):
    shapes = []
    for i in range(6):
        kv = rng.choice([1, 2, 4])
        heads = kv * rng.choice([1, 2, 4])
        head_dim = rng.choice([4, 8, 16])
        shapes.append(ModelConfig(
            name=f"random-{i}", vocab_size=rng.randint(10, 300), hidden_size=rng.choice([8, 16, 32, 48]),
            intermediate_size=rng.randint(8, 100), num_layers=rng.randint(2, 4), num_heads=heads,
            num_kv_heads=kv, head_dim=head_dim, tie_word_embeddings=i % 2 == 1,
            attention_bias=i in (2, 5), qk_norm=i in (3, 5)))
    return shapes


def _count_mistake(module: str, got: int, want: int, cfg: ModelConfig) -> str:
    """The usual slips, one module at a time."""
    d, layers = cfg.hidden_size, cfg.num_layers
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    derived = cfg.num_heads and d // cfg.num_heads
    if want and got * layers == want and layers > 1:
        return f"that is one layer's count: each of the {layers} layers has its own {module}"
    if module in ("q_norm", "k_norm"):
        if not cfg.qk_norm and got:
            return "this model has no q_norm / k_norm (qk_norm=False)"
        heads = cfg.num_heads if module == "q_norm" else cfg.num_kv_heads
        if cfg.qk_norm and got == want * heads:
            return (f"{module} normalises each head's vector with ONE weight per head dimension "
                    f"({cfg.head_dim}), shared by all {heads} heads: not one per head")
        return f"an RMSNorm over each head's {cfg.head_dim} dimensions, in every layer"
    if module == "lm_head":
        if cfg.tie_word_embeddings:
            return ("tie_word_embeddings=True: the LM head IS the embedding matrix, a parameter the model "
                    "holds once (under embed_tokens): lm_head adds nothing")
        return "tie_word_embeddings=False: the LM head is its own [vocab_size, hidden_size] matrix"
    if module in ("k_proj", "v_proj") and cfg.num_kv_heads != cfg.num_heads and \
            got in (layers * q * d, layers * (q * d + q)):
        return (f"{module} projects to num_kv_heads x head_dim = {kv} outputs, not num_heads x head_dim = {q}: "
                "grouped-query attention shares KV heads")
    if module in ("q_proj", "k_proj", "v_proj", "o_proj") and cfg.head_dim != derived:
        heads = cfg.num_kv_heads if module in ("k_proj", "v_proj") else cfg.num_heads
        if got in (layers * heads * derived * d, layers * (heads * derived * d + heads * derived)):
            return (f"head_dim is {cfg.head_dim} here, not hidden_size // num_heads = {derived}: read it from "
                    "cfg.head_dim")
    if module in ("q_proj", "k_proj", "v_proj"):
        outputs = q if module == "q_proj" else kv
        if cfg.attention_bias and got == want - layers * outputs:
            return f"attention_bias=True: {module} has a bias of {outputs} per layer"
        if not cfg.attention_bias and got == want + layers * outputs:
            return f"attention_bias=False: {module} has no bias"
    if module == "o_proj" and got == want + layers * d:
        return "o_proj has no bias, whatever attention_bias says (only q, k and v have one)"
    if module in ("gate_proj", "up_proj", "down_proj"):
        return f"a [{cfg.intermediate_size} x {d}] (or transposed) matrix in every layer"
    if module in ("input_layernorm", "post_attention_layernorm", "norm"):
        return "an RMSNorm has one weight per feature (hidden_size of them), no bias"
    return ""


@checker
def check_parameter_counts(fn, seed: int | None = None):
    """fn(cfg) -> {module name: parameters}, summed over the layers (weights and biases); predicted from
    the shapes in cfg. The checker builds the engine's model and counts each module, exactly."""
    from ..config import PRESETS
    rng = random.Random(seed)
    configs = _random_shapes(rng) + [PRESETS["tiny"], PRESETS["qwen3-0.6b"], PRESETS["llama-3-8b"]]
    for cfg in configs:
        measured = measured_parameter_counts(cfg)
        got = learner_call(fn, cfg, forbidden=("minillm.config.ModelConfig.num_parameters",
                                               "minillm.loader.build_model", "minillm.build_model",
                                               "minillm.model.LlamaModel.__init__"),
                           why="predict it from the shapes in cfg: the checker builds the model and counts.")
        flags = [f for f in ("tie_word_embeddings", "attention_bias", "qk_norm") if getattr(cfg, f)]
        where = (f"{call_text(fn, cfg)} (hidden {cfg.hidden_size}, {cfg.num_layers} layers, heads {cfg.num_heads}/"
                 f"{cfg.num_kv_heads}, head_dim {cfg.head_dim}, intermediate {cfg.intermediate_size}, vocab "
                 f"{cfg.vocab_size}{', ' + ', '.join(flags) if flags else ''})")
        if not isinstance(got, dict):
            _fail(f"{where} returned {type(got).__name__}: return a dict {{module name: parameters}}, e.g. "
                  f"{{'q_proj': ..., 'k_proj': ...}}")
        unknown = sorted(set(got) - set(MODULES))
        if unknown:
            _fail(f"{where}: {unknown[0]!r} is not a module of the engine's model; the names are {list(MODULES)}")
        for module in MODULES:
            predicted = got.get(module, 0)
            if predicted != measured[module]:
                grade_count(f"{where}, {module}", predicted, measured[module],
                            _count_mistake(module, predicted, measured[module], cfg) if isinstance(predicted, int)
                            else "", unit=" parameters")
    passed(f"your parameter counts match the engine's models, module by module, on {len(configs)} shapes")
