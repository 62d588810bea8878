"""Teacher-only cases for chapter 11's checkers (a student release leaves this folder out).

HIDDEN: more seeds for each public checker, and longer runs. hidden_check_*: the reference
answers (_reference/ch11.py) on inputs the public checkers do not draw: pairs of floats of
any magnitude and sign, longer pipelines.
"""
from __future__ import annotations

import random

import torch

from .. import ch11
from .._common import call_text, fail, learner_call, passed
from .._reference import ch11 as ref

HIDDEN = {
    "check_keeps_bits": [dict(seed=11_001), dict(seed=11_002)],
    "check_first_variant_step": [dict(seed=11_011, num_cases=80), dict(seed=11_012, num_cases=30)],
    "check_streaming_logsumexp": [dict(seed=11_021, num_cases=60), dict(seed=11_022, num_cases=20)],
    "check_ulp_distance": [dict(seed=11_031), dict(seed=11_032)],
}


def hidden_check_ulp_distance(fn, seed: int = 11_033, num_pairs: int = 2000):
    """Random float32 and bfloat16 pairs of any magnitude and sign, against the reference."""
    gen = torch.Generator().manual_seed(seed)
    for dtype in (torch.float32, torch.bfloat16):
        magnitude = torch.exp(torch.randn(num_pairs, generator=gen, dtype=torch.float64) * 20)
        sign = torch.where(torch.rand(num_pairs, generator=gen) < 0.5, -1.0, 1.0).double()
        a = (magnitude * sign).to(dtype)
        b = (a.double() * (1 + torch.randn(num_pairs, generator=gen, dtype=torch.float64) * 1e-3)).to(dtype)
        b[::7] = -b[::7]                                   # some pairs across zero
        expected = ref.ulp_distance(a, b)
        got = learner_call(fn, a, b, forbidden=ch11._ULPS, why="count the ulps yourself.")
        if not isinstance(got, torch.Tensor) or not torch.equal(got, expected):
            fail(f"{call_text(fn, a, b)}: {num_pairs} random {dtype} pairs do not match the reference")
    passed("ulp_distance: random pairs of any magnitude and sign")


def hidden_check_first_variant_step(fn, seed: int = 11_013, num_cases: int = 40):
    """Longer pipelines and bigger batches, against the reference tool."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(num_cases):
        steps, batch, row, _, _ = ch11._pipeline(rng, gen)
        steps = steps + [rng.choice(ch11._ROW_WISE) for _ in range(rng.randint(0, 5))]
        expected = ref.first_variant_step(steps, batch, row)
        got = learner_call(fn, list(steps), batch.clone(), row)
        if got != expected:
            fail(f"{call_text(fn, steps, batch, row)} returned {got!r}, expected {expected!r}")
    passed(f"first_variant_step: {num_cases} longer pipelines")
