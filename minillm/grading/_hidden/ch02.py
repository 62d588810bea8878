"""Teacher-only cases for chapter 2's checkers (a student release leaves this folder out).

HIDDEN: more seeds for each public checker. hidden_check_*: the reference answers
(_reference/ch02.py) on shapes the public checkers do not try: real head sizes, long
positions, and parameter counts of configurations read from real checkpoints' shapes.
"""
from __future__ import annotations

import random

import torch

from .._common import call_text, fail, grade_count, learner_call, watch_copies
from .._reference import ch02 as ref
from ..ch02 import _HEADS, _ROPE, MODULES

HIDDEN = {
    "check_rope": [dict(seed=39_201)],
    "check_grouped_scores": [dict(seed=39_211), dict(seed=39_212, trials=20)],
    "check_move_rope": [dict(seed=39_221), dict(seed=39_222, trials=20)],
    "check_parameter_counts": [dict(seed=39_231)],
}


def hidden_check_grouped_scores(fn) -> None:
    """Real head layouts (Llama-3-8B's 32/8, Qwen3's 16/8, one KV head), K never copied."""
    g = torch.Generator().manual_seed(39_219)
    for n, m, heads, kv_heads, head_dim in ((3, 17, 32, 8, 128), (5, 9, 16, 8, 64), (2, 11, 12, 1, 32)):
        q = torch.randn(n, heads, head_dim, generator=g, dtype=torch.float64)
        k = torch.randn(m, kv_heads, head_dim, generator=g, dtype=torch.float64)
        with watch_copies(k) as copies:
            got = learner_call(fn, q, k, forbidden=_HEADS)
        want = ref.grouped_scores(q, k)
        if copies or not isinstance(got, torch.Tensor) or got.shape != want.shape or \
                not torch.allclose(got.to(torch.float64), want, atol=1e-9, rtol=0):
            fail(f"{call_text(fn, q, k)} differs from the reference (or copies K)")


def hidden_check_move_rope(fn) -> None:
    """Head dim 128, positions up to 100,000 (a long context moved by tens of thousands)."""
    rng = random.Random(39_229)
    g = torch.Generator().manual_seed(39_229)
    for theta in (10_000.0, 500_000.0, 1_000_000.0):
        raw = torch.randn(6, 2, 128, generator=g, dtype=torch.float64)
        old = torch.arange(6) + rng.randrange(0, 100_000)
        new = (old - rng.randrange(1, 50_000)).clamp(min=0)
        cached = ref.rope(raw, old, theta)
        got = learner_call(fn, cached.clone(), old, new, theta, forbidden=_ROPE)
        want = ref.rope(raw, new, theta)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or \
                not torch.allclose(got.to(torch.float64), want, atol=1e-8, rtol=0):
            fail(f"{call_text(fn, cached, old, new, theta)} differs from the keys rotated at the new positions")


def hidden_check_parameter_counts(fn) -> None:
    """Shapes of real checkpoints the presets do not hold (Llama-2-13B, Qwen2.5-1.5B with q/k/v biases
    and tied embeddings, a Qwen3 with head_dim apart from hidden / heads), module by module."""
    from ...config import ModelConfig
    configs = [
        ModelConfig(name="llama-2-13b", vocab_size=32000, hidden_size=5120, intermediate_size=13824,
                    num_layers=40, num_heads=40, num_kv_heads=40),
        ModelConfig(name="qwen2.5-1.5b", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                    num_layers=28, num_heads=12, num_kv_heads=2, attention_bias=True, tie_word_embeddings=True),
        ModelConfig(name="qwen3-4b", vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_layers=36,
                    num_heads=32, num_kv_heads=8, head_dim=128, qk_norm=True, tie_word_embeddings=True),
    ]
    for cfg in configs:
        got = learner_call(fn, cfg, forbidden=("minillm.config.ModelConfig.num_parameters", "minillm.build_model",
                                               "minillm.model.LlamaModel.__init__"))
        want = ref.parameter_counts(cfg)
        if not isinstance(got, dict):
            fail(f"{call_text(fn, cfg)} returned {type(got).__name__}, expected a dict")
        for module in MODULES:
            grade_count(f"{call_text(fn, cfg)} ({cfg.name}), {module}", got.get(module, 0), want[module])
