"""Checkers for exercises/01_causal_attention: the mask, attention, the merge of two
parts, the merge of any number of parts (a transfer task), and a prediction.

Each computes the engine's answer (minillm.attention, float64) first, then
calls the learner's function with that engine function switched off, and names
the likely mistake when the two differ (top-left mask, missing diagonal, 1/D or
no scale, softmax over the wrong dimension, tiled or missing GQA heads,
unweighted merge, a part a row cannot see).
"""
from __future__ import annotations

import math
import random

import torch

from ..attention import causal_mask, merge_attention, reference_attention
from ._common import call_text, checker, fail, grade_prediction, learner_call, passed

__all__ = ["check_causal_mask", "check_attention", "check_merge_attention", "check_merge_parts",
           "check_masked_fraction"]

_MASKS = ("minillm.attention.causal_mask", "torch.nn.attention.bias.causal_lower_right",
          "torch.nn.attention.bias.causal_upper_left")
# torch's scaled_dot_product_attention is allowed (with the learner's own bottom-right mask):
# the task is the mask and the heads, not the softmax kernel.
_ATTENTION = ("minillm.attention.reference_attention", "minillm.attention.sdpa_attention",
              "minillm.attention.paged_attention", "minillm.attention.chunk_attention",
              "minillm.attention.causal_block_attention", "minillm.attention.unmasked_attention",
              "minillm.attention._expand_kv_heads",
              "minillm.kernels.paged_decode", "torch.ops.minillm.paged_decode")


def _random_qkv(rng: random.Random, n: int, m: int):
    num_kv_heads = rng.choice([1, 2])
    num_heads = num_kv_heads * rng.choice([1, 2, 4])
    head_dim = rng.choice([4, 8])
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    q = torch.randn(n, num_heads, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(m, num_kv_heads, head_dim, generator=g, dtype=torch.float64)
    v = torch.randn(m, num_kv_heads, head_dim, generator=g, dtype=torch.float64)
    return q, k, v


def mask_mistake(got: torch.Tensor, q_len: int, k_len: int) -> str:
    """The usual wrong masks, recognised (shared with chapter 4's checker)."""
    want = causal_mask(q_len, k_len)
    if torch.equal(got, causal_mask(q_len, k_len, align="top_left")):
        return (f"that is the TOP-LEFT mask: the chunk's queries are the last {q_len} positions, so query i "
                f"sits at position k_len - q_len + i = {k_len - q_len} + i, not at i")
    if torch.equal(got, _strict(q_len, k_len)):
        return "each query must also see its own key (<=, not <): the diagonal is missing"
    if torch.equal(got, ~want):
        return "True and False are swapped: True means the query MAY attend to the key"
    if torch.equal(got, torch.ones_like(want)):
        return "everything is True: a query must not see the keys after its own position"
    return ""


def _strict(q_len: int, k_len: int) -> torch.Tensor:
    query_pos = torch.arange(q_len)[:, None] + (k_len - q_len)
    return torch.arange(k_len)[None, :] < query_pos


@checker
def check_causal_mask(fn, trials: int = 20, seed: int | None = None):
    """fn(q_len, k_len) -> bool [q_len, k_len], bottom-right aligned (a chunk over a cache)."""
    rng = random.Random(seed)
    cases = [(1, 1), (4, 4), (1, 7), (3, 8)] + [
        (n, n + rng.randrange(0, 10)) for n in (rng.randrange(1, 9) for _ in range(trials))]
    for q_len, k_len in cases:
        want = causal_mask(q_len, k_len)
        call = call_text(fn, q_len, k_len)
        got = learner_call(fn, q_len, k_len, forbidden=_MASKS,
                           why="build the mask from torch.arange and a comparison.")
        if not isinstance(got, torch.Tensor):
            fail(f"{call} returned {type(got).__name__}, expected a torch.Tensor")
        if tuple(got.shape) != (q_len, k_len):
            fail(f"{call} has shape {tuple(got.shape)}, expected ({q_len}, {k_len})")
        if got.dtype != torch.bool:
            fail(f"{call} has dtype {got.dtype}, expected torch.bool (True = may attend)")
        if not torch.equal(got.cpu(), want):
            mistake = mask_mistake(got.cpu(), q_len, k_len)
            fail(f"{call} is wrong: {mistake or 'it differs from the expected mask'}\n"
                 f"expected\n{want.int()}\ngot\n{got.int()}")
    passed(f"causal mask correct on {len(cases)} shapes, including chunks over a cache")


def _variant(q, k, v, scale=None, softmax_dim=-1, tiled=False, align="bottom_right", causal=True):
    """Attention with one thing changed: the mistakes the messages name."""
    n, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    k, v = (k.repeat(1, group, 1), v.repeat(1, group, 1)) if tiled else \
        (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
    scores = torch.einsum("nhd,mhd->hnm", q, k) * (1 / math.sqrt(head_dim) if scale is None else scale)
    if causal:
        scores = scores.masked_fill(~causal_mask(n, k.shape[0], align=align), float("-inf"))
    probs = scores.softmax(softmax_dim).nan_to_num(0.0)
    return torch.einsum("hnm,mhd->nhd", probs, v)


def _attention_mistake(got, q, k, v) -> str:
    head_dim = q.shape[-1]
    near = lambda other: torch.allclose(got, other, atol=1e-8, rtol=0)
    if near(_variant(q, k, v, align="top_left")):
        return (" (your mask is aligned TOP-LEFT: is_causal=True does that when q and k lengths differ; "
                "the chunk's queries are the LAST n of the m positions)")
    if near(_variant(q, k, v, causal=False)):
        return " (no causal mask: queries see future keys)"
    if near(_variant(q, k, v, scale=1.0)):
        return " (the scores are not divided by sqrt(head_dim))"
    if near(_variant(q, k, v, scale=1.0 / head_dim)):
        return f" (you divide the scores by D = {head_dim}; the scale is 1/sqrt(D) = 1/{math.sqrt(head_dim):.3g})"
    if near(_variant(q, k, v, softmax_dim=-2)):
        return (" (your softmax runs over the QUERIES: each query's weights must sum to 1 over its keys, "
                "the softmax runs over the key dimension)")
    if near(_variant(q, k, v, softmax_dim=0)):
        return " (your softmax runs over the HEADS: each head has its own softmax over the keys)"
    group = q.shape[1] // k.shape[1]
    if group > 1 and k.shape[1] > 1 and near(_variant(q, k, v, tiled=True)):
        return " (KV heads are tiled 0,1,0,1 instead of grouped 0,0,1,1: use repeat_interleave)"
    return ""


def _gqa_crash(q, k):
    def explain(exc) -> str | None:
        if q.shape[1] != k.shape[1] and isinstance(exc, RuntimeError):
            return (f"q has {q.shape[1]} heads but k and v have {k.shape[1]}: grouped-query attention; "
                    f"expand K and V to {q.shape[1]} heads first (query head h uses KV head "
                    f"h // {q.shape[1] // k.shape[1]})")
        return None
    return explain


@checker
def check_attention(fn, trials: int = 20, seed: int | None = None):
    """fn(q [n,Hq,D], k [m,Hkv,D], v [m,Hkv,D]) -> [n,Hq,D]: causal (bottom-right), GQA."""
    rng = random.Random(seed)
    # The first shapes have a cache (m > n) AND several KV heads with groups:
    # they catch a top-left mask and tiled heads.
    cases = [(3, 3), (1, 6), (4, 9)] + [(n, n + rng.randrange(0, 12))
                                        for n in (rng.randrange(1, 8) for _ in range(trials))]
    for i, (n, m) in enumerate(cases):
        q, k, v = _random_qkv(rng, n, m)
        if i == 2:      # two KV heads, two query heads each
            g = torch.Generator().manual_seed(rng.randrange(2**31))
            q, k, v = (torch.randn(n, 4, 8, generator=g, dtype=torch.float64),
                       torch.randn(m, 2, 8, generator=g, dtype=torch.float64),
                       torch.randn(m, 2, 8, generator=g, dtype=torch.float64))
        want = reference_attention(q, k, v)
        call = call_text(fn, q, k, v)
        got = learner_call(fn, q.clone(), k.clone(), v.clone(), forbidden=_ATTENTION + _MASKS[1:],
                           why="compute softmax(q k^T / sqrt(D)) over the allowed keys yourself "
                               "(your causal_mask from task 1, and torch's scaled_dot_product_attention "
                               "given that mask, are fine).", explain=_gqa_crash(q, k))
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            fail(f"{call} returned {shape}, expected shape {tuple(want.shape)}")
        got = got.to(torch.float64)
        if torch.isnan(got).any():
            fail(f"{call} has NaN: some query row has every key masked, a softmax of all -inf; each query "
                 "must see its own key (<=, not <)")
        if not torch.allclose(got, want, atol=1e-8, rtol=0):
            err = (got - want).abs().max().item()
            fail(f"{call}: max error {err:.2e}{_attention_mistake(got, q, k, v)}")
    passed(f"attention matches the engine's reference on {len(cases)} shapes (GQA, chunks over a cache)")


@checker
def check_merge_attention(fn, trials: int = 20, seed: int | None = None):
    """fn(out_a, lse_a, out_b, lse_b) -> (out, lse) over the union of the two key sets."""
    rng = random.Random(seed)
    for trial in range(trials):
        n, m_a, m_b = rng.randrange(1, 6), rng.randrange(1, 9), rng.randrange(1, 9)
        if trial == 0:
            m_a, m_b = 1, 8      # unequal parts: an unweighted average is far off
        q, k, v = _random_qkv(rng, n, m_a + m_b)
        q = q * 3                # sharper scores: the parts' weights differ a lot
        out_a, lse_a = reference_attention(q, k[:m_a], v[:m_a], causal=False, return_lse=True)
        out_b, lse_b = reference_attention(q, k[m_a:], v[m_a:], causal=False, return_lse=True)
        if trial == 1:           # large scores, as long contexts have: exp(lse) overflows
            lse_a, lse_b = lse_a + 800, lse_b + 800
        want_out, want_lse = merge_attention(out_a, lse_a, out_b, lse_b)
        call = call_text(fn, out_a, lse_a, out_b, lse_b)
        got = learner_call(fn, out_a.clone(), lse_a.clone(), out_b.clone(), lse_b.clone(),
                           forbidden=("minillm.attention.merge_attention",),
                           why="combine the two parts with their log-sum-exps yourself.")
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            fail(f"{call} must return a pair (out, lse)")
        out, lse = got
        if tuple(lse.shape) != tuple(want_lse.shape) or not torch.allclose(lse, want_lse, atol=1e-9, rtol=0):
            hint = "the new log-sum-exp is the log of the sum of both parts' exp-sums"
            if tuple(lse.shape) == tuple(want_lse.shape) and torch.allclose(lse, torch.maximum(lse_a, lse_b)):
                hint = "you return max(lse_a, lse_b): the new normaliser adds both parts' sums"
            elif not torch.isfinite(lse).all():
                hint = ("your lse overflows for scores near 800: exp(800) is inf in float64; a log-sum-exp "
                        "must subtract the maximum first (torch has one that does)")
            fail(f"{call}: lse wrong ({n} queries, keys {m_a}+{m_b}): {hint}; shape {tuple(want_lse.shape)}")
        if tuple(out.shape) != tuple(want_out.shape) or not torch.allclose(out, want_out, atol=1e-9, rtol=0):
            hint = "each part's output was normalised by its own sum: rescale it to the union's"
            if tuple(out.shape) == tuple(want_out.shape) and torch.allclose(out, (out_a + out_b) / 2):
                hint = "you average the two outputs: a part with larger scores weighs more"
            fail(f"{call}: out wrong ({n} queries, keys {m_a}+{m_b}): {hint}")
    passed(f"merge matches attention over the union on {trials} random splits")


# ---------------------------------------------------------------------------
# Transfer: a chunk's keys cut into any number of pieces
# ---------------------------------------------------------------------------
def _piece(q, k, v, start: int, end: int, num_cached: int):
    """Attention of a chunk's queries (positions num_cached + i) over keys [start, end), with the
    chunk's bottom-right mask cut to that piece: a row that sees none of the piece gets lse = -inf
    and out = NaN (0/0), as a kernel that does not special-case it returns."""
    n, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    kp, vp = k[start:end].repeat_interleave(group, 1), v[start:end].repeat_interleave(group, 1)
    scores = torch.einsum("nhd,mhd->hnm", q, kp) / math.sqrt(head_dim)
    visible = torch.arange(start, end)[None, :] <= (num_cached + torch.arange(n))[:, None]
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    out = torch.einsum("hnm,mhd->nhd", torch.exp(scores - lse[..., None]), vp)
    return out, lse.transpose(0, 1)


def _parts_case(rng: random.Random, n: int, num_cached: int, cuts: list[int]):
    m = num_cached + n
    q, k, v = _random_qkv(rng, n, m)
    q = q * 3
    bounds = [0] + cuts + [m]
    parts = [_piece(q, k, v, a, b, num_cached) for a, b in zip(bounds, bounds[1:])]
    return parts, reference_attention(q, k, v, return_lse=True)


@checker
def check_merge_parts(fn, trials: int = 12, seed: int | None = None):
    """fn(parts: list of (out [n,H,D], lse [n,H])) -> (out, lse) over the union of all parts' keys.

    The parts are a chunk's keys cut into pieces ANYWHERE (through the chunk itself, so some
    rows see none of a late piece), each piece attended with the chunk's mask cut to it."""
    rng = random.Random(seed)
    # hand-picked: three parts, the last two inside the chunk (rows that see none of them);
    # a part no row sees at the first query; one part only; large scores.
    cases = [(4, 5, [5, 7]), (3, 2, [3]), (5, 0, [1, 2, 3, 4]), (2, 6, [])]
    for _ in range(trials):
        n, c = rng.randrange(1, 7), rng.randrange(0, 9)
        m = n + c
        cuts = sorted(rng.sample(range(1, m), min(m - 1, rng.randrange(1, 5)))) if m > 1 else []
        cases.append((n, c, cuts))
    for i, (n, c, cuts) in enumerate(cases):
        parts, (want_out, want_lse) = _parts_case(rng, n, c, cuts)
        if i == 3:
            parts = [(o, l + 800) for o, l in parts]
            want_lse = want_lse + 800
        where = f"a chunk of {n} over {c} cached keys, cut at key positions {cuts} ({len(parts)} parts)"
        call = f"{call_text(fn, '<' + str(len(parts)) + ' parts>')}".replace("'", "")
        got = learner_call(fn, [(o.clone(), l.clone()) for o, l in parts],
                           forbidden=("minillm.attention.merge_attention",),
                           why="this task is the merge of ANY number of parts, some of them empty for some "
                               "rows: write it yourself.")
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
            fail(f"{call}, {where}: return a pair of tensors (out, lse)")
        out, lse = got
        if tuple(out.shape) != tuple(want_out.shape) or tuple(lse.shape) != tuple(want_lse.shape):
            fail(f"{call}, {where}: shapes {tuple(out.shape)}, {tuple(lse.shape)}; expected "
                 f"{tuple(want_out.shape)}, {tuple(want_lse.shape)}")
        empty = [(p, r) for p, (_, l) in enumerate(parts) for r in range(n) if torch.isinf(l[r]).all()]
        if torch.isnan(out).any() or torch.isnan(lse).any():
            p, r = empty[0] if empty else (None, None)
            detail = (f": part {p} holds only keys after query row {r}'s position, so that row sees none of "
                      f"it; its lse is -inf and its out is NaN (0/0). A part a row cannot see must weigh "
                      "nothing in that row, and NaN times 0 is still NaN") if empty else ""
            fail(f"{call}, {where}: your out has NaN{detail}")
        if not torch.allclose(lse, want_lse, atol=1e-9, rtol=0):
            hint = ("lse overflows for scores near 800: subtract the maximum before exp" if not torch.isfinite(lse).all()
                    else "the union's log-sum-exp is the log of the sum of every part's exp-sum")
            if len(parts) > 2 and torch.allclose(lse, torch.logaddexp(parts[0][1], parts[1][1]), atol=1e-9):
                hint = "you merged only the first two parts"
            fail(f"{call}, {where}: lse wrong: {hint}")
        if not torch.allclose(out, want_out, atol=1e-9, rtol=0):
            fail(f"{call}, {where}: out wrong (max error {(out - want_out).abs().max():.2e}): rescale each part "
                 "from its own normaliser to the union's")
    passed(f"merge of any number of parts correct on {len(cases)} cuts, rows that see nothing of a part included")


# ---------------------------------------------------------------------------
# Predict, then measure: the scores an explicit-mask kernel computes and throws away
# ---------------------------------------------------------------------------
def measured_masked_fraction(num_tokens: int, chunk_size: int) -> float:
    """Build every chunk's mask with the engine and count: masked scores / scores computed."""
    masked = computed = 0
    for start in range(0, num_tokens, chunk_size):
        end = min(start + chunk_size, num_tokens)
        mask = causal_mask(end - start, end)
        masked += int((~mask).sum())
        computed += mask.numel()
    return masked / computed


@checker
def check_masked_fraction(fn, seed: int | None = None):
    """fn(num_tokens, chunk_size) -> the fraction of the scores an explicit-mask kernel computes over a
    whole chunked prefill that the mask throws away; graded against the engine's masks, to 0.1%."""
    rng = random.Random(seed)
    cases = [(256, 256), (2048, 256), (1000, 1), (1000, 7), (100, 300)] + \
        [(rng.randint(1, 1500), rng.randint(1, 400)) for _ in range(6)]
    for num_tokens, chunk_size in cases:
        measured = measured_masked_fraction(num_tokens, chunk_size)
        call = call_text(fn, num_tokens, chunk_size)
        got = learner_call(fn, num_tokens, chunk_size, forbidden=_MASKS,
                           why="predict it from the shape of each chunk's mask, without building the masks.")
        why = "each chunk of n queries over s + n keys computes n(s + n) scores and masks the ones above its diagonal"
        if isinstance(got, (int, float)) and not isinstance(got, bool) and num_tokens > chunk_size:
            one_chunk = (num_tokens - 1) / (2 * num_tokens)
            if abs(got - one_chunk) < 1e-9 and abs(measured - one_chunk) > 1e-3:
                why = ("that is the fraction of ONE full prefill's square; a chunked prefill computes every "
                       "chunk's [n, s + n] rectangle, sum over the chunks")
        grade_prediction(call, got, measured, 1e-3, why)
    # the method: a prediction, not a mask count; a prompt far too long for any mask
    big = (10**9, 10**6)
    got = learner_call(fn, *big, forbidden=_MASKS, why="predict it without building the masks.")
    expected = _masked_fraction_formula(*big)
    grade_prediction(call_text(fn, *big), got, expected, 1e-3,
                     "on a billion-token prompt too: reason about the chunks' shapes, do not build masks")
    passed(f"your prediction matches the engine's masks on {len(cases)} chunked prefills (within 0.1%)")


def _masked_fraction_formula(num_tokens: int, chunk_size: int) -> float:
    masked = computed = 0
    for start in range(0, num_tokens, chunk_size):
        n = min(chunk_size, num_tokens - start)
        masked += n * (n - 1) // 2
        computed += n * (start + n)
    return masked / computed
