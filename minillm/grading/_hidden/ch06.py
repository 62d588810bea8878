"""Chapter 6's hidden cases (teacher only): the grader runs each public checker again on
these, against the function the student defined, after the public check passed."""
from __future__ import annotations

import random

from .._common import fail, passed
from .._reference import ch06 as ref

HIDDEN = {
    "check_schedule_chunked": [dict(seed=60_101), dict(seed=60_102, num_states=600)],
    "check_stream_metrics": [dict(seed=60_201)],
    "check_passes_to_first_token": [dict(seed=60_301, num_cases=60), dict(seed=60_302)],
    "check_chunks_for_work_budget": [dict(seed=60_401, num_cases=20)],
    "check_schedule_decode_first": [dict(seed=60_501, num_states=500)],
    "check_predicted_stall": [dict(seed=60_601, num_cases=8)],
}


def hidden_check_passes_to_first_token(fn, seed: int = 60_399, num_cases: int = 200):
    """Longer prompts and many streams (vLLM-sized budgets), against the reference."""
    rng = random.Random(seed)
    for _ in range(num_cases):
        n = rng.randint(0, 128)
        args = (rng.choice(("prefill_first", "decode_first", "chunked", "chunked_prefill_first")),
                rng.randint(1, 32_768), [rng.randint(1, 60) for _ in range(n)], rng.choice([512, 2048, 8192]),
                rng.choice([None, n + 1 + rng.randint(0, 64), n + 1 + rng.randint(0, 8192)]))
        expected = ref.passes_to_first_token(*args)
        got = fn(*args)
        if got != expected:
            fail(f"hidden case: {args[0]}, a {args[1]}-token prompt, {n} streams, chunk_size {args[3]}, "
                 f"token_budget {args[4]}: you say {got!r} steps, the reference {expected}")
    return passed(f"hidden: {num_cases} large arrivals agree with the reference")
