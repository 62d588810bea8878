"""Checkers for exercises/01_causal_attention: the mask and grouped-query attention (two
warm-ups), the mask of a sliding window (a transfer: the engine has no window), the
chapter's merge repaired for rows that see nothing of a part (a debug task),
the merge of any number of parts, and a prediction (the scores an explicit mask throws
away over a chunked prefill).

Every expected value comes from the engine (minillm.attention, float64), computed before
the learner's function runs with that engine function switched off: a window's mask is
the engine's causal mask less the keys that fell out of the window, a merge is compared
with one attention over all the keys, a masked fraction with the engine's masks counted.
The messages name the likely mistake (top-left mask, inverted mask, missing diagonal, a
window off by one, 1/D or no scale, softmax over the wrong dimension, tiled GQA heads,
unweighted merge, a part a row cannot see, the three usual wrong predictions).
Teacher-only cases: minillm/grading/_hidden/ch01.py.
"""
from __future__ import annotations

import math
import random
import statistics

import torch

from ..attention import causal_mask, merge_attention, reference_attention
from ._common import call_text, checker, fail, grade_prediction, learner_call, passed

__all__ = ["check_causal_mask", "check_window_mask", "check_attention", "check_merge_attention",
           "check_merge_parts", "check_masked_fraction"]

_MASKS = ("minillm.attention.causal_mask", "torch.nn.attention.bias.causal_lower_right",
          "torch.nn.attention.bias.causal_upper_left")
# torch's scaled_dot_product_attention is allowed (with the learner's own bottom-right mask):
# the task is the mask and the heads, not the softmax kernel.
_ATTENTION = ("minillm.attention.reference_attention", "minillm.attention.sdpa_attention",
              "minillm.attention.paged_attention", "minillm.attention.chunk_attention",
              "minillm.attention.causal_block_attention", "minillm.attention.unmasked_attention",
              "minillm.attention._expand_kv_heads",
              "minillm.kernels.paged_decode", "torch.ops.minillm.paged_decode")
_MERGE = ("minillm.attention.merge_attention",)


def _random_qkv(rng: random.Random, n: int, m: int):
    num_kv_heads = rng.choice([1, 2])
    num_heads = num_kv_heads * rng.choice([1, 2, 4])
    head_dim = rng.choice([4, 8])
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    q = torch.randn(n, num_heads, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(m, num_kv_heads, head_dim, generator=g, dtype=torch.float64)
    v = torch.randn(m, num_kv_heads, head_dim, generator=g, dtype=torch.float64)
    return q, k, v


# ---------------------------------------------------------------------------
# Masks: the engine's causal mask, and a window cut out of it
# ---------------------------------------------------------------------------
def _strict(q_len: int, k_len: int) -> torch.Tensor:
    """The causal mask without its diagonal (a query that may not see its own key)."""
    return _pad(causal_mask(q_len, k_len - 1), k_len) if k_len else causal_mask(q_len, k_len)


def _pad(mask: torch.Tensor, k_len: int) -> torch.Tensor:
    """A [q, j] mask widened to [q, k_len] with False columns on the right."""
    return torch.nn.functional.pad(mask, (0, k_len - mask.shape[1]), value=False)


def window_of(q_len: int, k_len: int, window: int | None, align: str = "bottom_right") -> torch.Tensor:
    """The engine's causal mask less the keys at least `window` positions behind each query:
    a key j stays visible to the query at position p when p - window < j <= p."""
    allowed = causal_mask(q_len, k_len, align=align)
    if window is None:
        return allowed
    if align == "top_left":          # query i at position i: keys j <= i - window fell out
        return allowed & ~causal_mask(q_len, k_len + window, align="top_left")[:, window:]
    # query i at position p = k_len - q_len + i: the keys j <= p - window are the causal mask of
    # the same queries over k_len - window keys
    return allowed & ~_pad(causal_mask(q_len, max(0, k_len - window)), k_len)


def mask_mistake(got: torch.Tensor, q_len: int, k_len: int, window: int | None = None) -> str:
    """The usual wrong masks, recognised. An inverted mask and a missing diagonal coincide on a
    1 x 1 mask: `_disambiguate` asks the learner's function about a larger shape first."""
    want = window_of(q_len, k_len, window)
    if torch.equal(got, ~want):
        return "the mask is inverted (True and False swapped): True means the query MAY attend to the key"
    if torch.equal(got, window_of(q_len, k_len, window, align="top_left")):
        return (f"that is the TOP-LEFT mask: the chunk's queries are the last {q_len} positions, so query i "
                f"sits at position k_len - q_len + i = {k_len - q_len} + i, not at i")
    if window is None and torch.equal(got, _strict(q_len, k_len)):
        return "each query must also see its own key: the diagonal is missing"
    if torch.equal(got, torch.ones_like(want)):
        return "everything is True: a query must not see the keys after its own position"
    if q_len == k_len and torch.equal(got, want.T):
        return "the mask is transposed: row i is query i, column j is key j"
    if window is None and torch.equal(got, causal_mask(q_len, k_len + 1)[:, :k_len]):
        return (f"each query sees one key too far: query i may see the keys up to its own position, "
                f"k_len - q_len + i = {k_len - q_len} + i, and yours also sees the key after it")
    if window is not None:
        row_index = _window_from_row_index(q_len, k_len, window)
        if torch.equal(got, row_index) and not torch.equal(row_index, causal_mask(q_len, k_len)):
            return _ROW_INDEX_WINDOW.format(offset=k_len - q_len)
        if torch.equal(got, causal_mask(q_len, k_len)):
            return f"that is the plain causal mask: with window={window} a query sees at most {window} keys"
        for other, what in ((window + 1, "one key too many"), (window - 1, "one key too few")):
            if other >= 1 and torch.equal(got, window_of(q_len, k_len, other)):
                return (f"{what} per query: a window of {window} holds the query's own key and the "
                        f"{window - 1} before it")
        if torch.equal(got, window_of(q_len, k_len, window) & _strict(q_len, k_len)):
            return "each query must also see its own key: the window includes it"
    return ""


_ROW_INDEX_WINDOW = ("your window counts back from the row index i; a query's window ends at its own "
                     "position, k_len - q_len + i = {offset} + i, as its causal limit does")


def _window_from_row_index(q_len: int, k_len: int, window: int) -> torch.Tensor:
    """The causal mask cut by a window counted back from row i instead of the query's position (a mistake)."""
    return causal_mask(q_len, k_len) & ~causal_mask(q_len, k_len + window, align="top_left")[:, window:]


def _disambiguate(fn, mistake: str, q_len: int, k_len: int, window: int | None) -> str:
    """An inverted 1 x 1 mask is also a mask without its diagonal (and, with a window, other
    mistakes coincide on tiny shapes): when the inverse of the right mask is also another named
    mistake, ask the learner's function about a larger shape and name what that one shows. A
    window counted from the row index looks like no window at all when the window reaches back
    past the first key: a short window over a cache tells them apart."""
    if window is not None and "plain causal mask" in mistake:
        probe = learner_call(fn, 2, 6, 1, forbidden=_MASKS, why="build the mask from torch.arange and a comparison.")
        if isinstance(probe, torch.Tensor) and tuple(probe.shape) == (2, 6) and \
                torch.equal(probe.cpu(), _window_from_row_index(2, 6, 1)):
            return _ROW_INDEX_WINDOW.format(offset=k_len - q_len) + f" ({call_text(fn, 2, 6, 1)} shows it)"
        return mistake
    if "inverted" not in mistake:
        return mistake
    inverse = ~window_of(q_len, k_len, window)
    others = [_strict(q_len, k_len), window_of(q_len, k_len, window, align="top_left")]
    if not any(torch.equal(inverse, other) for other in others):
        return mistake
    args = (3, 6) if window is None else (3, 6, 2)
    probe = learner_call(fn, *args, forbidden=_MASKS, why="build the mask from torch.arange and a comparison.")
    if isinstance(probe, torch.Tensor) and tuple(probe.shape) == (3, 6) and probe.dtype == torch.bool:
        named = mask_mistake(probe.cpu(), 3, 6, args[2] if window is not None else None)
        if named and "inverted" not in named:
            return named
        if named:
            return mistake + f" ({call_text(fn, *args)} is the exact inverse of the right mask too)"
    return mistake


def _check_mask(fn, args: tuple, want: torch.Tensor, window: int | None):
    call = call_text(fn, *args)
    got = learner_call(fn, *args, forbidden=_MASKS, why="build the mask from torch.arange and a comparison.")
    if not isinstance(got, torch.Tensor):
        fail(f"{call} returned {type(got).__name__}, expected a torch.Tensor")
    if tuple(got.shape) != tuple(want.shape):
        transposed = " (rows are the queries, columns the keys)" if tuple(got.shape) == tuple(want.shape[::-1]) else ""
        fail(f"{call} has shape {tuple(got.shape)}, expected {tuple(want.shape)}{transposed}")
    if got.dtype != torch.bool:
        fail(f"{call} has dtype {got.dtype}, expected torch.bool (True = may attend)")
    if not torch.equal(got.cpu(), want):
        mistake = _disambiguate(fn, mask_mistake(got.cpu(), *args[:2], window), *args[:2], window)
        fail(f"{call} is wrong: {mistake or 'it differs from the expected mask'}\n"
             f"expected\n{want.int()}\ngot\n{got.int()}")


@checker
def check_causal_mask(fn, trials: int = 20, seed: int | None = None):
    """fn(q_len, k_len) -> bool [q_len, k_len], bottom-right aligned (a chunk over a cache)."""
    rng = random.Random(seed)
    cases = [(1, 1), (4, 4), (1, 7), (3, 8)] + [
        (n, n + rng.randrange(0, 10)) for n in (rng.randrange(1, 9) for _ in range(trials))]
    for q_len, k_len in cases:
        _check_mask(fn, (q_len, k_len), causal_mask(q_len, k_len), None)
    passed(f"causal mask correct on {len(cases)} shapes, including chunks over a cache")


@checker
def check_window_mask(fn, trials: int = 20, seed: int | None = None):
    """fn(q_len, k_len, window) -> bool [q_len, k_len]: a chunk's mask when each query sees at most
    `window` keys, its own included (a sliding window); the queries are the last q_len positions."""
    rng = random.Random(seed)
    # a chunk over a cache whose window ends inside the cache, a square, a decode, a window
    # longer than the context, a window of one (only the query's own key)
    cases = [(3, 8, 4), (4, 4, 2), (1, 9, 3), (5, 12, 20), (2, 6, 1)]
    for _ in range(trials):
        n = rng.randrange(1, 9)
        m = n + rng.randrange(0, 12)
        cases.append((n, m, rng.randrange(1, m + 3)))
    for q_len, k_len, window in cases:
        _check_mask(fn, (q_len, k_len, window), window_of(q_len, k_len, window), window)
    passed(f"sliding-window mask correct on {len(cases)} chunks, windows shorter and longer than the context")


# ---------------------------------------------------------------------------
# Attention with grouped-query heads, and a window
# ---------------------------------------------------------------------------
def _expand(x: torch.Tensor, num_heads: int, tiled: bool = False) -> torch.Tensor:
    group = num_heads // x.shape[1]
    return x.repeat(1, group, 1) if tiled else x.repeat_interleave(group, 1)


def _softmax_over(q, k, v, dim: int) -> torch.Tensor:
    """The bottom-right causal attention with its softmax run over another dimension (a mistake)."""
    n, num_heads, head_dim = q.shape
    k, v = _expand(k, num_heads), _expand(v, num_heads)
    scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(head_dim)
    scores = scores.masked_fill(~causal_mask(n, k.shape[0]), float("-inf"))
    return torch.einsum("hnm,mhd->nhd", scores.softmax(dim).nan_to_num(0.0), v)


def _attention_mistake(got, q, k, v) -> str:
    head_dim, num_heads = q.shape[-1], q.shape[1]
    near = lambda other: torch.allclose(got, other, atol=1e-8, rtol=0)
    if near(reference_attention(q, k, v, align="top_left")):
        return (" (your mask is aligned TOP-LEFT: is_causal=True does that when q and k lengths differ; "
                "the chunk's queries are the LAST n of the m positions)")
    if near(reference_attention(q, k, v, causal=False)):
        return " (no causal mask: queries see future keys)"
    if near(reference_attention(q * math.sqrt(head_dim), k, v)):
        return " (the scores are not divided by sqrt(head_dim))"
    if near(reference_attention(q / math.sqrt(head_dim), k, v)):
        return f" (you divide the scores by D = {head_dim}; the scale is 1/sqrt(D) = 1/{math.sqrt(head_dim):.3g})"
    if near(_softmax_over(q, k, v, -2)):
        return (" (your softmax runs over the QUERIES: each query's weights must sum to 1 over its keys, "
                "the softmax runs over the key dimension)")
    if near(_softmax_over(q, k, v, 0)):
        return " (your softmax runs over the HEADS: each head has its own softmax over the keys)"
    group = num_heads // k.shape[1]
    if group > 1 and k.shape[1] > 1 and near(reference_attention(q, _expand(k, num_heads, tiled=True),
                                                                 _expand(v, num_heads, tiled=True))):
        return " (KV heads are tiled 0,1,0,1 instead of grouped 0,0,1,1: use repeat_interleave)"
    return ""


def _runs(fn, *args) -> bool:
    """Whether the learner's function runs on other inputs (a probe to tell one crash from another)."""
    try:
        learner_call(fn, *args, forbidden=_ATTENTION + _MASKS[1:])
    except Exception:                      # noqa: BLE001 (any crash, NotImplementedError included)
        return False
    return True


def _attention_crash(fn, q, k, v):
    """Name a crash by the inputs it needs: it runs once K and V have as many heads as q (grouped-query
    heads), or once the keys are as many as the queries (something built square, from n alone)."""
    n, m = q.shape[0], k.shape[0]

    def explain(exc) -> str | None:
        if not isinstance(exc, RuntimeError):
            return None
        group = q.shape[1] // k.shape[1]
        if group > 1 and _runs(fn, q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)):
            return (f"q has {q.shape[1]} heads but k and v have {k.shape[1]} (and it runs once they have as many): "
                    f"grouped-query attention; expand K and V to {q.shape[1]} heads first (query head h uses KV "
                    f"head h // {group})")
        if m != n:
            same = _runs(fn, q, k[-n:].repeat_interleave(group, 1), v[-n:].repeat_interleave(group, 1))
            return (f"it crashed on a chunk of n={n} queries over m={m} keys"
                    + (" and runs when the keys are as many as the queries: something in it has the chunk's "
                       "shape where it needs the keys' (the scores of a chunk are [n, m])" if same else ""))
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
                               "given that mask, are fine).", explain=_attention_crash(fn, q, k, v))
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            fail(f"{call} returned {shape}, expected shape {tuple(want.shape)}")
        dtype, got = got.dtype, got.to(torch.float64)
        if torch.isnan(got).any():
            fail(f"{call} has NaN: some query row has every key masked, a softmax of all -inf; each query "
                 "sees at least its own key")
        if not torch.allclose(got, want, atol=1e-8, rtol=0):
            err = (got - want).abs().max().item()
            mistake = _attention_mistake(got, q, k, v)
            if not mistake and dtype != torch.float64:
                mistake = f" (you return {str(dtype).removeprefix('torch.')} for float64 inputs)"
            elif not mistake and err < 1e-4:
                mistake = (" (right to float32's rounding, not float64's: some step runs in float32, "
                           "though the inputs are float64)")
            fail(f"{call}: max error {err:.2e}{mistake}")
    passed(f"attention matches the engine's reference on {len(cases)} shapes (GQA, chunks over a cache)")


# ---------------------------------------------------------------------------
# Debug: the chapter's merge, for rows that see nothing of a part
# ---------------------------------------------------------------------------
def _piece(q, k, v, start: int, end: int, num_cached: int, window: int | None = None):
    """Attention of a chunk's queries (positions num_cached + i) over keys [start, end), with the
    chunk's mask (bottom-right, and the window if any) cut to that piece: a row that sees none of
    the piece gets lse = -inf and out = NaN (0/0), as a kernel that does not special-case it returns."""
    n, num_heads, head_dim = q.shape
    kp, vp = _expand(k[start:end], num_heads), _expand(v[start:end], num_heads)
    scores = torch.einsum("nhd,mhd->hnm", q, kp) / math.sqrt(head_dim)
    visible = window_of(n, num_cached + n, window)[:, start:end]
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    out = torch.einsum("hnm,mhd->nhd", torch.exp(scores - lse[..., None]), vp)
    return out, lse.transpose(0, 1)


def _parts_case(rng: random.Random, n: int, num_cached: int, cuts: list[int], window: int | None = None):
    m = num_cached + n
    q, k, v = _random_qkv(rng, n, m)
    q = q * 3                                   # sharper scores: the parts' weights differ a lot
    bounds = [0] + cuts + [m]
    parts = [_piece(q, k, v, a, b, num_cached, window) for a, b in zip(bounds, bounds[1:])]
    return parts, _windowed_lse(q, k, v, window)


def _windowed_lse(q, k, v, window):
    """(out, lse) of the whole chunk over all its keys: the engine's reference attention."""
    if window is None:
        return reference_attention(q, k, v, return_lse=True)
    n, m = q.shape[0], k.shape[0]
    outs, lses = [], []
    for i in range(n):
        end = m - n + i + 1
        start = max(0, end - window)
        out, lse = reference_attention(q[i:i + 1], k[start:end], v[start:end], causal=False, return_lse=True)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def _empty_rows(parts, n: int) -> list[tuple[int, int]]:
    """(part, row) pairs where the row sees none of the part's keys (its lse is -inf)."""
    return [(p, r) for p, (_, lse) in enumerate(parts) for r in range(n) if torch.isinf(lse[r]).all()]


def _nan_message(parts, n: int) -> str:
    empty = _empty_rows(parts, n)
    if not empty:
        return ""
    p, r = empty[0]
    name = f"{'AB'[p]}" if len(parts) == 2 else f"{p}"
    return (f": part {name} holds no key that query row {r} may see (its keys lie after the row's position, or "
            f"before its window), so in that row the part's lse is -inf and its out is NaN (0/0, as a kernel "
            "returns it); follow that row through your merge")


def _merged(got, where: str, want_out, want_lse, parts, n: int):
    """The learner's (out, lse): a pair of tensors of the right shapes, without NaN."""
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
        fail(f"{where}: return a pair of tensors (out, lse)")
    out, lse = got
    if tuple(out.shape) != tuple(want_out.shape) or tuple(lse.shape) != tuple(want_lse.shape):
        fail(f"{where}: shapes {tuple(out.shape)}, {tuple(lse.shape)}; expected "
             f"{tuple(want_out.shape)}, {tuple(want_lse.shape)}")
    if torch.isnan(out).any() or torch.isnan(lse).any():
        why = _nan_message(parts, n)
        if not why and (lse == float("inf")).any():
            why = (": your lse is +inf where the scores are near 800 (exp(800) overflows float64), and the weights "
                   "you derive from it are inf/inf")
        fail(f"{where}: your {'out' if torch.isnan(out).any() else 'lse'} has NaN{why}")
    return out, lse


def _lse_mistake(lse, parts) -> str:
    """The usual wrong log-sum-exps of a merge, named by what they equal; '' if none."""
    lses = torch.stack([part_lse for _, part_lse in parts])
    if torch.allclose(lse, lses.sum(0), atol=1e-9, rtol=0, equal_nan=True):
        return ("your lse is the SUM of the parts' lse: that is the log of their exp-sums' product; the union's "
                "exp-sum is the sum of the parts' exp-sums")
    if len(parts) > 1 and torch.allclose(lse, lses.amax(0), atol=1e-9, rtol=0):
        return ("your lse is the largest of the parts' lse: the union's exp-sum adds every part's exp-sum")
    if (lse == float("inf")).any():
        return ("your lse is +inf where the scores are near 800: exp(800) overflows float64 (its largest value is "
                "about exp(709)); the union's log-sum-exp is finite there")
    return ""


@checker
def check_merge_attention(fn, trials: int = 20, seed: int | None = None):
    """fn(out_a, lse_a, out_b, lse_b) -> (out, lse) over the union of the two key sets.

    After two plain cases (unequal parts, scores near 800), the parts are a chunk's keys cut in
    two: some rows see none of one part (the chunk's late keys, or a cached prefix that fell out of
    a sliding window), so that part's lse is -inf and its out NaN in those rows."""
    rng = random.Random(seed)
    for trial in range(trials):
        n = rng.randrange(1, 6)
        if trial < 2:                                        # two parts every row sees in full
            m_a, m_b = (1, 8) if trial == 0 else (rng.randrange(1, 9), rng.randrange(1, 9))
            q, k, v = _random_qkv(rng, n, m_a + m_b)
            q = q * 3
            out_a, lse_a = reference_attention(q, k[:m_a], v[:m_a], causal=False, return_lse=True)
            out_b, lse_b = reference_attention(q, k[m_a:], v[m_a:], causal=False, return_lse=True)
            if trial == 1:           # large scores, as long contexts have: exp(lse) overflows
                lse_a, lse_b = lse_a + 800, lse_b + 800
            want_out, want_lse = merge_attention(out_a, lse_a, out_b, lse_b)
            where = f"{n} queries, keys {m_a}+{m_b}"
            parts = [(out_a, lse_a), (out_b, lse_b)]
        else:                                                # a chunk's keys cut in two, a window or not
            n = rng.randrange(2, 7)
            cached = rng.randrange(0, 8)
            window = None if trial % 2 else rng.randrange(1, n + 1)
            cut = rng.randrange(max(1, cached + 1), cached + n)        # inside the chunk: late rows only
            if window is not None:
                cut = rng.randrange(1, cached + 1) if cached else cut  # the cache is the part that falls out
            parts, (want_out, want_lse) = _parts_case(rng, n, cached, [cut], window)
            where = (f"a chunk of {n} over {cached} cached keys{f', window {window}' if window else ''}, "
                     f"cut at key {cut}")
        (out_a, lse_a), (out_b, lse_b) = parts
        call = call_text(fn, out_a, lse_a, out_b, lse_b)
        got = learner_call(fn, out_a.clone(), lse_a.clone(), out_b.clone(), lse_b.clone(), forbidden=_MERGE,
                           why="combine the two parts with their log-sum-exps yourself.")
        out, lse = _merged(got, f"{call} ({where})", want_out, want_lse, parts, n)
        if not torch.allclose(lse, want_lse, atol=1e-9, rtol=0):
            hint = _lse_mistake(lse, parts) or "the new log-sum-exp is the log of the sum of both parts' exp-sums"
            if torch.allclose(lse, torch.maximum(lse_a, lse_b)):
                hint = "you return max(lse_a, lse_b): the new normaliser adds both parts' sums"
            fail(f"{call}: lse wrong ({where}): {hint}; shape {tuple(want_lse.shape)}")
        if not torch.allclose(out, want_out, atol=1e-9, rtol=0):
            hint = "each part's output was normalised by its own sum: rescale it to the union's"
            if trial < 2 and torch.allclose(out, (out_a + out_b) / 2):
                hint = "you average the two outputs: a part with larger scores weighs more"
            fail(f"{call}: out wrong ({where}): {hint}")
    passed(f"merge matches attention over the union on {trials} splits, rows that see nothing of a part included")


# ---------------------------------------------------------------------------
# Transfer: a chunk's keys cut into any number of pieces
# ---------------------------------------------------------------------------
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
        got = learner_call(fn, [(o.clone(), l.clone()) for o, l in parts], forbidden=_MERGE,
                           why="this task is the merge of ANY number of parts, some of them empty for some "
                               "rows: write it yourself.")
        out, lse = _merged(got, f"{call}, {where}", want_out, want_lse, parts, n)
        if not torch.allclose(lse, want_lse, atol=1e-9, rtol=0):
            hint = _lse_mistake(lse, parts) or "the union's log-sum-exp is the log of the sum of every part's exp-sum"
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
def chunk_mask_counts(num_tokens: int, chunk_size: int) -> list[tuple[int, int, int]]:
    """(chunk length, scores the mask throws away, scores computed) of every chunk, counted on the
    engine's masks."""
    counts = []
    for start in range(0, num_tokens, chunk_size):
        end = min(start + chunk_size, num_tokens)
        mask = causal_mask(end - start, end)
        counts.append((end - start, int((~mask).sum()), mask.numel()))
    return counts


def measured_masked_fraction(num_tokens: int, chunk_size: int) -> float:
    """Build every chunk's mask with the engine and count: masked scores / scores computed."""
    counts = chunk_mask_counts(num_tokens, chunk_size)
    return sum(m for _, m, _ in counts) / sum(c for _, _, c in counts)


def _fraction_mistake(got: float, num_tokens: int, chunk_size: int) -> str:
    """Name the usual wrong predictions, each rebuilt from the engine's per-chunk counts."""
    counts = chunk_mask_counts(num_tokens, chunk_size)
    close = lambda value: abs(got - value) <= 1e-9 + 1e-3 * abs(value)
    if len(counts) > 1 and close((num_tokens - 1) / (2 * num_tokens)):
        return ("that is the fraction of ONE full prefill's square; a chunked prefill computes every chunk's "
                "[n, s + n] rectangle: sum the masked and the computed scores over the chunks")
    if len(counts) > 1 and close(statistics.mean(m / c for _, m, c in counts)):
        return ("that is the AVERAGE of the chunks' fractions; the late chunks compute far more scores (their "
                "rectangles are wider), so the whole prefill's fraction is total masked / total computed, not a "
                "mean of ratios")
    if close(sum(m + n for n, m, _ in counts) / sum(c for _, _, c in counts)):
        return ("you count the diagonal as masked, n(n+1)/2 per chunk of n; each query sees its own key, the mask "
                "keeps the diagonal")
    if close(sum(m + n / 2 for n, m, _ in counts) / sum(c for _, _, c in counts)):
        return ("you count n^2/2 masked scores per chunk of n; the diagonal is kept (each query sees its own "
                "key), so a chunk masks n(n-1)/2")
    full = [(n, m, c) for n, m, c in counts if n == chunk_size]
    if len(full) < len(counts):
        if full and close(sum(m for _, m, _ in full) / sum(c for _, _, c in full)):
            return (f"you leave out the last chunk: {num_tokens} tokens in chunks of {chunk_size} end with a "
                    f"chunk of {counts[-1][0]}, and its scores count too")
        full_chunk = causal_mask(chunk_size, chunk_size)            # what a whole chunk's square masks
        masked_full = int((~full_chunk).sum())
        as_full = [(masked_full, chunk_size * (start + chunk_size)) for start in range(0, num_tokens, chunk_size)]
        if close(sum(m for m, _ in as_full) / sum(c for _, c in as_full)):
            return (f"you treat every chunk as {chunk_size} tokens long; the last one holds the remainder, "
                    f"{counts[-1][0]} tokens")
    return ""


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
        if isinstance(got, (int, float)) and not isinstance(got, bool):
            why = _fraction_mistake(got, num_tokens, chunk_size) or why
        grade_prediction(call, got, measured, 1e-3, why)
    # the method: a prediction, not a mask count; a prompt far too long for any mask (its exact
    # value is a teacher-side case: minillm/grading/_hidden/ch01.py)
    big = (10**9, 10**6)
    got = learner_call(fn, *big, forbidden=_MASKS, why="predict it without building the masks.")
    if isinstance(got, bool) or not isinstance(got, (int, float)) or not 0 < got < 0.5:
        fail(f"{call_text(fn, *big)} returned {got!r}: on a billion-token prompt too the answer is a fraction "
             "between 0 and 1/2; reason about the chunks' shapes, do not build masks")
    passed(f"your prediction matches the engine's masks on {len(cases)} chunked prefills (within 0.1%)")
