"""Chapter 10's hidden cases (teacher only): the grader runs each public checker again on
these, against the function the student defined, after the public check passed."""
from __future__ import annotations

HIDDEN = {
    "check_token_chunk_times": [dict(seed=100_101, num_cases=300)],
    "check_client_metrics": [dict(seed=100_201, num_cases=400)],
    "check_guidellm_names": [dict(seed=100_301, num_cases=300)],
    "check_client_goodput": [dict(seed=100_401, num_cases=300)],
    "check_itl_over_tpot": [dict(seed=100_501, num_cases=200)],
}
