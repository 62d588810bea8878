"""Chapter 8's hidden cases (teacher only): the grader runs each public checker again on
these, against the function the student defined, after the public check passed."""
from __future__ import annotations

import random

from .._common import fail, passed
from .._reference import ch08 as ref

HIDDEN = {
    "check_salted_hashes": [dict(seed=80_101, num_cases=200)],
    "check_tokens_to_compute": [dict(seed=80_201, num_cases=500)],
    "check_first_token_steps": [dict(seed=80_301, num_cases=300)],
    "check_threshold_for_short_ttft": [dict(seed=80_401, num_cases=14)],
    "check_eviction_order": [dict(seed=80_501, num_cases=300)],
    "check_prefill_tokens_saved": [dict(seed=80_601, num_cases=20)],
}


def hidden_check_first_token_steps(fn, seed: int = 80_399, num_cases: int = 100):
    """Long queues of long prompts (vLLM-sized chunks), against the reference."""
    rng = random.Random(seed)
    for _ in range(num_cases):
        chunk_size = rng.choice([512, 2048, 8192])
        lens = [rng.choice([rng.randint(1, 200), rng.randint(1000, 100_000)]) for _ in range(rng.randint(1, 12))]
        threshold = rng.choice([0, rng.randint(1, chunk_size)])
        expected, got = ref.first_token_steps(lens, chunk_size, threshold), fn(list(lens), chunk_size, threshold)
        if list(got) != expected:
            fail(f"hidden case: prompts {lens}, chunk_size {chunk_size}, threshold {threshold}: you say {got}, "
                 f"the reference {expected}")
    return passed(f"hidden: {num_cases} long queues agree with the reference")
