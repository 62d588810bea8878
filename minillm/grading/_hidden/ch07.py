"""Chapter 7's hidden cases (teacher only): the grader runs each public checker again on
these, against the function the student defined, after the public check passed."""
from __future__ import annotations

import random

from ...config import ModelConfig
from ...sim.hardware import PROFILES, get_hardware
from .._common import fail, passed
from .._reference import ch07 as ref

HIDDEN = {
    "check_decode_floor": [dict(seed=70_101)],
    "check_choose_chunk_size": [dict(seed=70_201, num_cases=500)],
    "check_goodput": [dict(seed=70_301, num_cases=6)],
    "check_expected_ttft": [dict(seed=70_401, num_cases=8)],
    "check_chunk_for_gap_slo": [dict(seed=70_501)],
}


def hidden_check_decode_floor(fn, seed: int = 70_199, num_cases: int = 40):
    """Model shapes no preset has (GQA ratios, vocabularies, tied and untied heads), against the reference."""
    rng = random.Random(seed)
    base = ModelConfig.preset("llama-3-8b")
    for _ in range(num_cases):
        heads = rng.choice([8, 16, 32, 64])
        cfg = base.replace(name="hidden-shape", hidden_size=heads * 128, num_heads=heads,
                           num_kv_heads=rng.choice([h for h in (1, 2, 4, 8, heads) if heads % h == 0]),
                           intermediate_size=rng.choice([2048, 8192, 14336, 28672]), num_layers=rng.randint(2, 80),
                           vocab_size=rng.choice([32_000, 128_256, 151_936, 256_000]),
                           tie_word_embeddings=rng.random() < 0.5)
        hw = get_hardware(rng.choice(sorted(PROFILES)))
        dtype_bytes = rng.choice([1, 2, 4])
        expected, got = ref.decode_floor_s(cfg, hw, dtype_bytes), fn(cfg, hw, dtype_bytes)
        if not isinstance(got, (int, float)) or abs(got - expected) > 1e-3 * expected:
            fail(f"hidden case: a {cfg.num_layers}-layer model, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}, "
                 f"tied embeddings {cfg.tie_word_embeddings}: you say {got!r} s, the reference {expected:.6g} s")
    return passed(f"hidden: {num_cases} model shapes agree with the reference")
