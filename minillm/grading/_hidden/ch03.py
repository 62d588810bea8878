"""Teacher-only cases for chapter 3's checkers (a student release leaves this folder out).

HIDDEN: more seeds for each public checker. hidden_check_*: the reference answers
(_reference/ch03.py) where the public checkers only bound the answer (generations far too
long to run) or on budgets of real GPUs.
"""
from __future__ import annotations

from .._common import call_text, fail, grade_count, learner_call
from .._reference import ch03 as ref
from ..ch03 import _BLOCKS_FOR, _FIT

HIDDEN = {
    "check_blocks_needed": [dict(seed=39_301)],
    "check_requests_that_fit": [dict(seed=39_311), dict(seed=39_312)],
    "check_append_slot": [dict(seed=39_321), dict(seed=39_322)],
    "check_forward_tokens": [dict(seed=39_331)],
}


def hidden_check_blocks_needed(fn) -> None:
    """Counts past float precision the public check does not try: any step through a float is off."""
    for num_tokens, block_size in ((10**30 + 1, 5), (2**64 - 1, 1024), (10**18 + 3, 10), (3 * 10**17 + 1, 3),
                                   (10**20 - 1, 10**20)):
        got = learner_call(fn, num_tokens, block_size, forbidden=_BLOCKS_FOR)
        want = ref.blocks_needed(num_tokens, block_size)
        if got != want:
            fail(f"{call_text(fn, num_tokens, block_size)} returned {got!r}, expected {want}")


def hidden_check_requests_that_fit(fn) -> None:
    """Llama-3-8B on an 80 GB GPU's 64 GB of KV: 8192-token prompts, then a mix just past block edges."""
    from ...config import PRESETS
    cfg = PRESETS["llama-3-8b"]
    for prompt_lens in ([8192] * 100, [17, 33, 4096, 1] * 3000, [100_000] + [1] * 10):
        got = learner_call(fn, cfg, 64 * 10**9, 16, 2, list(prompt_lens), forbidden=_FIT)
        want = ref.requests_that_fit(cfg, 64 * 10**9, 16, 2, prompt_lens)
        if got != want:
            fail(f"{call_text(fn, cfg, 64 * 10**9, 16, 2, '<prompts>')} returned {got!r}, expected {want}")


def hidden_check_forward_tokens(fn) -> None:
    """Generations far too long to run, with and without a preemption."""
    for args in ((100_000, 10_000), (1, 1), (8192, 4096, 4000), (7, 2, 1)):
        got = learner_call(fn, *args, forbidden=("minillm.prefill.prefill_kv",))
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            fail(f"{call_text(fn, *args)} returned {got!r}: a pair")
        want = ref.forward_tokens(*args)
        grade_count(f"{call_text(fn, *args)}, without a cache", got[0], want[0])
        grade_count(f"{call_text(fn, *args)}, with a cache", got[1], want[1])
