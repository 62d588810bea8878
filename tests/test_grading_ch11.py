"""Chapter 11's checkers: a correct answer passes (public and hidden cases), and every
shortcut fails with a message that names the mistake. Costs ~40 s: the keeps_bits checker
runs the engine on a two-layer tiny model for ~30 configurations.
"""
import math

import pytest
import torch

import minillm.grading as ex
from minillm.grading import ch11
from minillm.grading._common import ExerciseFailed
from minillm.grading._hidden import ch11 as hidden
from minillm.grading._reference import ch11 as ref


# ---- correct answers (the tests' own; the notebook has its own) ------------------------------
def keeps_bits(chunk_size, prompt_len, neighbours, threads, batch_invariant, dtype):
    return batch_invariant or ((chunk_size or prompt_len) >= prompt_len and not neighbours and threads == 1)


def first_variant_step(steps, batch, row):
    x = batch
    for i, step in enumerate(steps):
        y = step(x)
        if not torch.equal(y[row], step(x[row:row + 1])[0]):
            return i
        x = y
    return None


def streaming(merge_fn, count_pending=True, fold_on_report=False):
    """A streaming log-sum-exp with a given tile merge, in the scores' dtype (the tests' own answer, and its slips)."""
    def lse_step(state, scores, tile):
        pending, m, s = state if state is not None else (scores[:0], scores.new_tensor(-math.inf),
                                                           scores.new_tensor(0.0))
        pending = torch.cat([pending, scores])
        done = len(pending) // tile * tile
        for start in range(0, done, tile):
            m, s = merge_fn(m, s, pending[start:start + tile])
        pending = pending[done:]
        m_now, s_now = merge_fn(m, s, pending) if len(pending) and count_pending else (m, s)
        if fold_on_report:                       # the slip: reporting folds the waiting scores into the state
            pending, m, s = pending[:0], m_now, s_now
        return (pending, m, s), (m_now + torch.log(s_now) if s_now > 0 else m_now)
    return lse_step


def merge(m, s, tile_scores):
    top = torch.maximum(m, tile_scores.max())
    if top == -math.inf:
        return m, s
    return top, s * torch.exp(m - top) + torch.exp(tile_scores - top).sum()


lse_step = streaming(merge)


def ulp_distance(a, b):
    as_int = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[a.dtype]
    def ordered(x):
        raw = x.view(as_int).long()
        return torch.where(raw < 0, -(raw & (2 ** (8 * x.element_size() - 1) - 1)), raw)
    return (ordered(a) - ordered(b)).abs()


def fails(check, *fns, match: str):
    with pytest.raises(ExerciseFailed, match=match):
        check(*fns)


def test_correct_answers_pass_the_public_and_hidden_cases():
    ex.check_keeps_bits(keeps_bits)
    ex.check_first_variant_step(first_variant_step)
    ex.check_streaming_logsumexp(lse_step)
    ex.check_ulp_distance(ulp_distance)
    answers = {"check_keeps_bits": (keeps_bits,), "check_first_variant_step": (first_variant_step,),
               "check_streaming_logsumexp": (lse_step,), "check_ulp_distance": (ulp_distance,)}
    assert set(hidden.HIDDEN) == set(answers) == set(ch11.__all__)
    for name, cases in hidden.HIDDEN.items():
        for kwargs in cases[:1]:                    # one hidden seed each here (the grader runs them all)
            getattr(ex, name)(*answers[name], **kwargs)
    hidden.hidden_check_ulp_distance(ulp_distance)
    hidden.hidden_check_first_variant_step(first_variant_step)


def test_the_references_agree_with_the_engine_and_the_book():
    from minillm.book.bits import ulp_distance as book_ulps
    a, b = torch.randn(500) * 1e3, torch.randn(500) * 1e-3
    assert torch.equal(ref.ulp_distance(a, b), book_ulps(a, b))
    assert torch.equal(ref.ulp_distance(a.bfloat16(), b.bfloat16()), book_ulps(a.bfloat16(), b.bfloat16()))
    scores = torch.randn(77) * 30
    state = None
    for piece in (scores[:5], scores[5:40], scores[40:]):
        state, value = ref.lse_step(state, piece, 16)
    assert abs(value.item() - torch.logsumexp(scores.double(), 0).item()) < 1e-5


# ---- 1. keeps_bits ---------------------------------------------------------------------
def test_keeps_bits_shortcuts_are_named():
    fails(ex.check_keeps_bits, lambda *case: True, match="chunks move the log-sum-exp merge")
    fails(ex.check_keeps_bits, lambda *case: False, match="same computation gives the same bits")
    fails(ex.check_keeps_bits, lambda c, n, nb, t, inv, d: inv or ((c or n) >= n and not nb),
          match="another thread count")
    fails(ex.check_keeps_bits, lambda c, n, nb, t, inv, d: inv or (c is None and not nb and t == 1),
          match="a chunk at least as long as the prompt is one whole prefill")
    fails(ex.check_keeps_bits, lambda c, n, nb, t, inv, d: inv or ((c or n) >= n and t == 1),
          match="neighbours change the row count")
    fails(ex.check_keeps_bits, lambda c, n, nb, t, inv, d: inv or d == "float64" or keeps_bits(c, n, nb, t, inv, d),
          match="float64 rounds too")
    fails(ex.check_keeps_bits, lambda c, n, nb, t, inv, d: keeps_bits(c, n, nb, t, False, d),
          match="batch_invariant=True every row is computed alone")
    fails(ex.check_keeps_bits, lambda *case: 1, match="return True")
    # chunk_size == prompt_len counted as chunked: the PUBLIC check names it (only a hidden case did)
    fails(ex.check_keeps_bits, lambda c, n, nb, t, inv, d: inv or ((c or n + 1) > n and not nb and t == 1),
          match=r"\(40, 40, 0, 1, False, 'float32'\) returned False: .*one whole prefill")


def test_keeps_bits_may_not_run_the_engine():
    import minillm

    def measures(chunk_size, prompt_len, neighbours, threads, batch_invariant, dtype):
        model = minillm.build_model("tiny", seed=0)
        return minillm.prefill_kv(model, list(range(prompt_len))) is not None

    fails(ex.check_keeps_bits, measures, match="calls minillm.prefill.prefill_kv")


# ---- 2. first_variant_step -------------------------------------------------------------
def test_first_variant_step_shortcuts_are_named():
    def close_enough(steps, batch, row):
        x = batch
        for i, step in enumerate(steps):
            y = step(x)
            if not torch.allclose(y[row], step(x[row:row + 1])[0]):
                return i
            x = y
        return None

    def any_row(steps, batch, row):
        x = batch
        for i, step in enumerate(steps):
            y = step(x)
            if any(not torch.equal(y[r], step(x[r:r + 1])[0]) for r in range(len(x))):
                return i
            x = y
        return None

    def original_batch(steps, batch, row):
        return next((i for i, step in enumerate(steps)
                     if not torch.equal(step(batch)[row], step(batch[row:row + 1])[0])), None)

    fails(ex.check_first_variant_step, original_batch, match="you fed every step the original batch")
    fails(ex.check_first_variant_step, close_enough, match="compare bits")
    fails(ex.check_first_variant_step, any_row, match="changes row 0, not row")
    fails(ex.check_first_variant_step, lambda s, b, r: None if first_variant_step(s, b, r) is None
          else first_variant_step(s, b, r) + 1, match="numbered from 0")
    fails(ex.check_first_variant_step, lambda s, b, r: 0, match="expected")


# ---- 3. streaming log-sum-exp ----------------------------------------------------------
def test_streaming_logsumexp_shortcuts_are_named():
    def at_chunk_boundaries(state, scores, tile):              # the default engine's merge
        part = torch.logsumexp(scores, 0)
        value = part if state is None else torch.logaddexp(state, part)
        return value, value

    def keep_everything(state, scores, tile):
        kept = scores if state is None else torch.cat([state, scores])
        return kept, torch.logsumexp(kept, 0)

    def no_rescale(m, s, tile_scores):
        top = torch.maximum(m, tile_scores.max())
        return (m, s) if top == -math.inf else (top, s + torch.exp(tile_scores - top).sum())

    def unguarded(m, s, tile_scores):
        top = torch.maximum(m, tile_scores.max())
        return top, s * torch.exp(m - top) + torch.exp(tile_scores - top).sum()

    def fold_each_piece(state, scores, tile):     # online softmax over the pieces as they come
        m, s = state if state is not None else (scores.new_tensor(-math.inf), scores.new_tensor(0.0))
        return (m, s) if torch.maximum(m, scores.max()) == -math.inf else merge(m, s, scores), None

    def folded(state, scores, tile):
        state, _ = fold_each_piece(state, scores, tile)
        return state, state[0] + torch.log(state[1])

    def float64_running_value(state, scores, tile):   # the trial's shortcut: passed 100/100 seeds before
        total = torch.tensor(-math.inf, dtype=torch.float64) if state is None else state
        total = torch.logaddexp(total, torch.logsumexp(scores.double(), 0))
        return total, total.to(scores.dtype)

    def default_float32_state(state, scores, tile):
        return lse_step(state if state is not None else (scores[:0], torch.tensor(-math.inf), torch.tensor(0.0)),
                        scores, tile)

    def float64_value(state, scores, tile):
        state, value = lse_step(state, scores, tile)
        return state, value.double()

    fails(ex.check_streaming_logsumexp, float64_running_value, match="keeps numbers as float64. A wider type")
    fails(ex.check_streaming_logsumexp, default_float32_state, match="float64 scores: your state keeps float32")
    fails(ex.check_streaming_logsumexp, float64_value, match="you returned the log-sum-exp as float64")
    fails(ex.check_streaming_logsumexp, folded, match="a partial tile must wait in the state")
    fails(ex.check_streaming_logsumexp, streaming(merge, fold_on_report=True),
          match="reporting the value folded them into the running values")

    fails(ex.check_streaming_logsumexp, at_chunk_boundaries, match="the bits depend on where the pieces start")
    fails(ex.check_streaming_logsumexp, keep_everything, match="keeping every score")
    fails(ex.check_streaming_logsumexp, streaming(no_rescale), match="rescaled by exp")
    fails(ex.check_streaming_logsumexp, streaming(unguarded), match="the first tile is all -inf")
    fails(ex.check_streaming_logsumexp, streaming(merge, count_pending=False), match="last, partial tile are missing")
    fails(ex.check_streaming_logsumexp, lambda state, scores, tile: torch.logsumexp(scores, 0),
          match="return \\(state, log-sum-exp so far\\)")


# ---- 4. ulp_distance -------------------------------------------------------------------
def test_ulp_distance_shortcuts_are_named():
    from minillm.book.bits import ulp_distance as book_ulps

    def raw_bits(a, b):
        as_int = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[a.dtype]
        return (a.view(as_int).long() - b.view(as_int).long()).abs()

    def int32_result(a, b):
        return ulp_distance(a, b).to(torch.int32)

    def two_zeros(a, b):                              # -0 mapped one below +0
        as_int = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[a.dtype]
        def ordered(x):
            raw = x.view(as_int).long()
            return torch.where(raw < 0, -(raw & (2 ** (8 * x.element_size() - 1) - 1)) - 1, raw)
        return (ordered(a) - ordered(b)).abs()

    def always_int32(a, b):                          # right for float32, and bfloat16 viewed as 32 bits
        def ordered(x):
            raw = x.view(torch.int32).long()
            return torch.where(raw < 0, -(raw & (2 ** 31 - 1)), raw)
        return (ordered(a) - ordered(b)).abs()

    def minus_zero_at_minus_one(a, b):
        as_int = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[a.dtype]
        def ordered(x):
            raw = x.view(as_int).long()
            return torch.where(raw < 0, ~(raw & (2 ** (8 * x.element_size() - 1) - 1)), raw)
        return (ordered(a) - ordered(b)).abs()

    fails(ex.check_ulp_distance, minus_zero_at_minus_one, match="-0 must map to the same integer as \\+0")
    fails(ex.check_ulp_distance, raw_bits, match="opposite signs")
    fails(ex.check_ulp_distance, int32_result, match="return torch.int64")
    fails(ex.check_ulp_distance, two_zeros, match="-0 must map to the same integer as \\+0|\\+0 and -0")
    fails(ex.check_ulp_distance, always_int32, match="bfloat16 is 16 bits")
    fails(ex.check_ulp_distance, book_ulps, match="you handed in minillm.book.bits.ulp_distance")


def test_the_chapters_printed_sums_do_not_pass_the_streaming_task():
    """Chapter 11 prints a row's sum over absolute tiles with every term at hand; pasted into
    the streaming task it must keep every score, which the checker refuses."""
    import ast
    from pathlib import Path

    source = (Path(__file__).resolve().parents[1] / "notebooks" / "src" / "11_bit_for_bit.py").read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "row_sum_invariant")
    namespace = {"torch": torch}
    exec(compile(ast.fix_missing_locations(ast.Module([node], [])), "<chapter 11>", "exec"), namespace)
    row_sum_invariant = namespace["row_sum_invariant"]

    def pasted(state, scores, tile):
        kept = scores if state is None else torch.cat([state, scores])
        top = kept.max()
        return kept, top + torch.log(row_sum_invariant(torch.exp(kept - top), len(kept) - 1, tile))

    fails(ex.check_streaming_logsumexp, pasted, match="keeping every score")
