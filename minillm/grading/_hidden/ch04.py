"""Teacher-only cases for chapter 4's checkers (a student release leaves this folder out).

HIDDEN: more seeds for each public checker. hidden_check_*: bugs the public locator check
never shows (a bug that starts in the LAST chunk only, one that corrupts layer 1 alone, an
exact prefill in another backend), packed prefills of more prompts, and the exact work of
prompts far too long to run.
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


def _last_chunk_positions(chunk_size: int):
    """Only the last chunk's positions restart (the bug shows late in the prompt)."""
    def context(model, token_ids):
        last_start = (len(token_ids) - 1) // chunk_size * chunk_size
        return ch04._forward_changed(model, lambda ids, pos, batch: (ids, pos - pos[0], batch)
                                     if int(pos[0]) == last_start else (ids, pos, batch))
    return context


def _layer1_value_bug(model, token_ids):
    """Layer 1's V projection sees the chunk's rows shifted (chunks after the first): K untouched."""
    layer = model.model.layers[1].self_attn if hasattr(model, "model") else model.layers[1].self_attn
    original = layer.v_proj.forward

    def shifted(x):
        out = original(x)
        return out.roll(1, 0) if shifted.active else out
    shifted.active = False
    forward = model.forward

    def wrapped(ids, positions, batch, *args, **kwargs):
        shifted.active = batch.cached_lens[0] > 0
        return forward(ids, positions, batch, *args, **kwargs)

    @contextlib.contextmanager
    def context():
        with mock.patch.object(layer.v_proj, "forward", shifted), mock.patch.object(model, "forward", wrapped):
            yield
    return context()


def hidden_check_locate_bug(fn) -> None:
    """Bugs the public check never shows, where they first show measured with the reference locator."""
    rng = random.Random(39_419)
    model = ch04._check_model(rng)
    for name, context, chunk_size in (("last chunk's positions", _last_chunk_positions(16), 16),
                                      ("layer 1's V rows shifted", _layer1_value_bug, 8)):
        prefill = ch04._buggy(context)
        tokens = [rng.randrange(model.cfg.vocab_size) for _ in range(rng.randint(50, 80))]
        want = ref.locate_bug(prefill, model, tokens, chunk_size)
        got = learner_call(fn, prefill, model, list(tokens), chunk_size)
        if (tuple(got) if isinstance(got, list) else got) != want:
            fail(f"locate_bug on the hidden bug {name!r} returned {got!r}, expected {want!r}")


def hidden_check_chunked_prefill_work(fn) -> None:
    """Prompts far too long to run: the exact counts."""
    for args in ((10**6, 512), (10**6 + 1, 4096), (131_072, 131_072), (3, 10**6)):
        got = learner_call(fn, *args, forbidden=ch04._PREFILL)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            fail(f"{call_text(fn, *args)} returned {got!r}: a pair")
        pairs, reads = ref.chunked_prefill_work(*args)
        grade_count(f"{call_text(fn, *args)}, pairs", got[0], pairs)
        grade_count(f"{call_text(fn, *args)}, cached keys read", got[1], reads)
