"""Teacher-only cases for chapter 4's checkers (a student release leaves this folder out).

HIDDEN: more seeds for each public checker. hidden_check_*: bugs the public locator check
never shows (a bug that starts in the LAST chunk only, one that corrupts layer 1 alone, two
bugs in one layer at different positions, a small bug under a large one, NaN in layer 0's V
alone), and the exact work of prompts far too long to run.
"""
from __future__ import annotations

import contextlib
import random
from unittest import mock

from .. import ch04
from .._common import call_text, fail, grade_count, learner_call
from .._reference import ch04 as ref

HIDDEN = {
    "check_step_mask": [dict(seed=39_401)],
    "check_locate_bug": [dict(seed=39_411), dict(seed=39_412)],
    "check_packed_chunked_prefill": [dict(seed=39_421)],
    "check_chunked_prefill_work": [dict(seed=39_431)],
}


def _first_chunks_last_v_unwritten(model, token_ids):
    """The cache starts as NaN and the first chunk's last V is never written: NaN in layer 0's V only."""
    from ...kv_cache import PagedKVCache
    original_for_model, original_write = PagedKVCache.for_model.__func__, ch04.attention.write_kv

    def for_model(cls, *args, **kwargs):
        cache = original_for_model(cls, *args, **kwargs)
        cache.data.fill_(float("nan"))
        return cache

    def write_kv(k_cache, v_cache, k_new, v_new, slot_mapping):
        original_write(k_cache, v_cache, k_new, v_new, slot_mapping)
        if int(slot_mapping[0]) == 0:                      # the first chunk: its last V stays unwritten
            v_cache.view(-1, *v_cache.shape[2:])[slot_mapping[-1]] = float("nan")

    @contextlib.contextmanager
    def context():
        with mock.patch.object(PagedKVCache, "for_model", classmethod(for_model)), \
                mock.patch.object(ch04.attention, "write_kv", write_kv):
            yield
    return context()


def _hidden_bugs(chunk_size: int):
    """(name, prefill, chunk_size): bugs the public check never shows, each alone or two at once."""
    last_chunk = lambda m, t: ch04._last_chunk_positions(m, t, chunk_size)
    return [
        ("last chunk's positions", ch04._buggy(last_chunk)),
        ("layer 1's V rows shifted", ch04._buggy(ch04._layer1_value_rows_shifted)),
        # layer 0: V from the second chunk, K from the last: the layer's first position counts both
        ("V late, and the last chunk's positions", ch04._buggy(ch04._both(ch04._v_written_late, last_chunk))),
        # a small bug in layer 0 under a large one in layer 1: a loose tolerance reports layer 1
        ("RoPE in float32, and a top-left mask", ch04._buggy(ch04._both(ch04._rope_float32_after_first_chunk,
                                                                        ch04._top_left))),
        # NaN in layer 0's V alone: a NaN-blind comparison sees no bug at all
        ("the first chunk's last V unwritten", ch04._buggy(_first_chunks_last_v_unwritten)),
        ("exact, in the engine's default backend", ch04._exact),
    ]


def hidden_check_locate_bug(fn) -> None:
    """Bugs the public check never shows, where they first show measured with the reference locator."""
    rng = random.Random(39_419)
    model = ch04._check_model(rng)
    for chunk_size in (16, 8):
        for name, prefill in _hidden_bugs(chunk_size):
            tokens = [rng.randrange(model.cfg.vocab_size) for _ in range(rng.randint(50, 80))]
            want = ref.locate_bug(prefill, model, tokens, chunk_size)
            got = learner_call(fn, prefill, model, list(tokens), chunk_size)
            if (tuple(got) if isinstance(got, list) else got) != want:
                full = ch04.prefill_kv(model, tokens)[0]
                why = ch04._locate_mistake(got, want, prefill(model, tokens, chunk_size), full, chunk_size)
                fail(f"locate_bug on the hidden bug {name!r} (chunks of {chunk_size}) returned {got!r}, expected "
                     f"{want!r}: {why}")


def hidden_check_chunked_prefill_work(fn) -> None:
    """Prompts far too long to run: the exact counts."""
    for args in ((10**6, 512), (10**6 + 1, 4096), (131_072, 131_072), (3, 10**6)):
        got = learner_call(fn, *args, forbidden=ch04._PREFILL)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            fail(f"{call_text(fn, *args)} returned {got!r}: a pair")
        pairs, reads = ref.chunked_prefill_work(*args)
        grade_count(f"{call_text(fn, *args)}, pairs", got[0], pairs)
        grade_count(f"{call_text(fn, *args)}, cached keys read", got[1], reads)
