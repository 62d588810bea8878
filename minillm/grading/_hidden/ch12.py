"""Hidden cases for exercises/12_speculative_decoding (teacher only).

Each entry: keyword arguments for the public checker, run after the public check
against the function the student defined; other seeds, more cases. The
hidden_check_* functions compare with the reference answers on shapes the public
checkers never draw.
"""
from __future__ import annotations

import math
import random

import torch

from .._common import fail, learner_call, passed
from .._reference import ch12 as ref

HIDDEN = {
    "check_verify_packed_step": [dict(seed=120_001, num_cases=400), dict(seed=120_002)],
    "check_plan_step": [dict(seed=120_011, num_cases=300), dict(seed=120_012)],
    "check_long_prompt_steps": [dict(seed=120_021, num_cases=20), dict(seed=120_022)],
    "check_speculative_sample": [dict(seed=120_031, num_cases=5)],
    "check_best_k": [dict(seed=120_041, num_cases=120)],
}


def hidden_check_verify_packed_step(fn, seed: int = 120_099):
    """Long drafts (k up to 16) and a large vocabulary, against the reference."""
    rng = random.Random(seed)
    for _ in range(50):
        k = rng.randint(8, 16)
        targets = [rng.randrange(5000) for _ in range(k + 1)]
        agree = rng.randint(0, k)
        drafts = targets[:agree] + [(t + 1) % 5000 for t in targets[agree:k]]
        logits = torch.randn(k + 1, 5000)
        logits[torch.arange(k + 1), torch.tensor(targets)] = 10.0
        expected = ref.verify_packed_step(logits, [k + 1], [drafts])
        got = learner_call(fn, logits.clone(), [k + 1], [list(drafts)])
        if [list(g) for g in got] != expected:
            fail(f"k={k}, {agree} drafts right: you emitted {got}, expected {expected}")
    passed("verify_packed_step: long drafts over a 5000-token vocabulary")


def hidden_check_long_prompt_steps(fn, seed: int = 120_098):
    """Long prompts and large budgets, against the reference formula (checked on the engine
    by the public checker's cases)."""
    rng = random.Random(seed)
    for _ in range(100):
        n, k = rng.randint(1, 64), rng.randint(1, 16)
        budget = rng.randint(n + 1, 16384)
        case = (rng.randint(1, 100_000), n, k, budget, rng.choice([budget, rng.randint(64, 8192)]),
                rng.choice(["drafts_first", "chunk_first"]))
        expected, got = ref.predict_long_prompt_steps(*case), learner_call(fn, *case)
        if got != expected and not (math.isinf(expected) and math.isinf(got or 0)):
            fail(f"long_prompt_steps{case} = {got}, expected {expected}")
    passed("long_prompt_steps: 100 large settings")
