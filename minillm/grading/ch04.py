"""Checkers for exercises/04_chunked_prefill_is_exact: compare with the engine, and
watch the method.

check_chunked_prefill does not only compare the KV: it records every forward
pass the learner's function makes (there must be ceil(T / chunk_size), with the
chunk's query length, the cached length before it, its absolute positions and a
block table that covers its keys) and switches the engine's own prefill_kv and
ModelRunner off while it runs. Past the chapter: the packed chunked prefill of
several prompts (one forward pass per step), a graded question on which of layer
0's tensors each bug touches, and a prediction of the work and the KV re-reads of
a chunked prefill, measured on the engine's forward passes.
"""
from __future__ import annotations

import random

import torch

from ..attention import causal_mask
from ..config import ModelConfig
from ..loader import build_model
from ..prefill import prefill_kv
from ._common import (call_text, checker, crashed, ExerciseFailed, fail as _fail, forbid, function_name,
                      grade_prediction, learner_call, passed, record_forward)
from ._reference import ch04 as _ref

__all__ = ["check_step_mask", "check_chunk_bounds", "check_chunked_prefill", "check_position_bug_errors",
           "check_layer0_question", "check_packed_chunked_prefill", "check_chunked_prefill_work"]

_MASKS = ("minillm.attention.causal_mask", "torch.nn.attention.bias.causal_lower_right")
_PREFILL = ("minillm.model_runner.ModelRunner.execute",
            "minillm.model_runner.ModelRunner.prepare", "minillm.prefill.prefill_kv",
            "minillm.prefill.chunked_prefill")


def _packed(query_lens, cached_lens, align: str = "bottom_right") -> torch.Tensor:
    """One request's [q, c + q] causal rectangle per block, the blocks on the diagonal."""
    return torch.block_diag(*(causal_mask(q, c + q, align=align) for q, c in zip(query_lens, cached_lens)))


def _step_mask_mistake(got: torch.Tensor, query_lens, cached_lens) -> str:
    total_q, total_k = sum(query_lens), sum(q + c for q, c in zip(query_lens, cached_lens))
    if torch.equal(got, _packed(query_lens, cached_lens, align="top_left")):
        return ("each request's block is TOP-LEFT aligned: its queries are the last q of its c + q keys, "
                "so query i sits at position c + i")
    if torch.equal(got, causal_mask(total_q, total_k)):
        return ("one causal mask over the whole step lets a request see the keys of the requests before it: "
                "a query sees only its own request's keys (one block per request on the diagonal)")
    if torch.equal(got, ~_packed(query_lens, cached_lens)):
        return "True and False are swapped: True means the query MAY attend to the key"
    return ""


@checker
def check_step_mask(fn, seed: int | None = None):
    """fn(query_lens, cached_lens) -> bool [sum q, sum (c + q)]: the mask of a packed step."""
    rng = random.Random(seed)
    cases = [([1], [0]), ([3], [4]), ([2, 2], [2, 2]), ([3, 1, 1], [0, 5, 9])]
    for _ in range(20):
        n = rng.randint(1, 5)
        cases.append(([rng.randint(1, 12) for _ in range(n)], [rng.choice([0, rng.randint(1, 30)]) for _ in range(n)]))
    for query_lens, cached_lens in cases:
        expected = _packed(query_lens, cached_lens)
        where = call_text(fn, list(query_lens), list(cached_lens))
        got = learner_call(fn, list(query_lens), list(cached_lens), forbidden=_MASKS,
                           why="build each request's block from torch.arange, as the statement asks.")
        if not isinstance(got, torch.Tensor):
            _fail(f"{where} returned a {type(got).__name__}, expected a torch.Tensor")
        if tuple(got.shape) != tuple(expected.shape):
            hint = (" the keys are every request's cached AND new tokens, sum(c + q)"
                    if got.dim() == 2 and got.shape[1] == sum(query_lens) else "")
            _fail(f"{where}: expected shape {tuple(expected.shape)} (sum of q, sum of c + q), got "
                  f"{tuple(got.shape)};{hint or ' one row per new token, one column per key'}")
        if got.dtype != torch.bool:
            _fail(f"{where}: dtype = {got.dtype}, expected torch.bool (a comparison of aranges gives one)")
        if not torch.equal(got, expected):
            mistake = _step_mask_mistake(got.cpu(), query_lens, cached_lens)
            _fail(f"{where}: {mistake or 'wrong mask'}\nexpected\n{expected.int()}\ngot\n{got.int()}")
    passed(f"check_step_mask: correct on {len(cases)} packed steps")


@checker
def check_chunk_bounds(fn, seed: int | None = None):
    """fn(num_tokens, chunk_size) -> [(start, end), ...] covering [0, num_tokens) in order."""
    rng = random.Random(seed)
    cases = [(10, 3), (10, 10), (10, 64), (1, 1), (7, 1), (1024, 512), (1025, 512)] + \
        [(rng.randint(1, 3000), rng.randint(1, 600)) for _ in range(30)]
    for num_tokens, chunk_size in cases:
        expected = [(s, min(s + chunk_size, num_tokens)) for s in range(0, num_tokens, chunk_size)]
        call = call_text(fn, num_tokens, chunk_size)
        returned = learner_call(fn, num_tokens, chunk_size)
        if not isinstance(returned, list) or not all(isinstance(b, tuple) and len(b) == 2 for b in returned):
            first = returned[0] if isinstance(returned, (list, tuple)) and returned else returned
            _fail(f"{call} returned {str(returned)[:60]}: the statement asks for a LIST of (start, end) TUPLES "
                  f"(the first item is {first!r}, a {type(first).__name__}); [(0, 4), (4, 8)] == [[0, 4], [4, 8]] "
                  "is False in Python")
        got = list(returned)
        if got != expected:
            hint = "The last chunk may be shorter; none runs past num_tokens."
            if got and got[-1][1] > num_tokens:
                hint = f"Your last chunk ends at {got[-1][1]}, past num_tokens: cut it at num_tokens."
            elif len(got) < len(expected):
                hint = f"You return {len(got)} chunks, {len(expected)} are needed: don't drop the short last one."
            elif any(b[0] != a[1] for a, b in zip(got, got[1:])):
                hint = "Chunks must be contiguous: each starts where the previous ended (end is exclusive)."
            _fail(f"{call} returned {got[:4]}..., expected {expected[:4]}... ({len(expected)} chunks). {hint}")
    passed(f"check_chunk_bounds: correct on {len(cases)} cases")


def _check_forward_calls(calls, num_tokens: int, chunk_size: int):
    """The learner's forward passes, one per chunk, in order, with the right batch."""
    where = f"<{num_tokens} tokens>, chunk_size={chunk_size}"
    starts = list(range(0, num_tokens, chunk_size))
    if len(calls) != len(starts):
        _fail(f"{where}: your function ran {len(calls)} forward pass(es); a chunked prefill runs "
              f"ceil({num_tokens} / {chunk_size}) = {len(starts)}, one per chunk (one pass over the whole "
              "prompt is the full prefill, not a chunked one)")
    for i, (call, start) in enumerate(zip(calls, starts)):
        end = min(start + chunk_size, num_tokens)
        if call.query_lens != [end - start] or call.num_tokens != end - start:
            _fail(f"{where}: forward pass {i} got {call.num_tokens} tokens with query_lens={call.query_lens}; "
                  f"chunk {i} is tokens [{start}, {end}): query_lens=[{end - start}]")
        if call.cached_lens != [start]:
            _fail(f"{where}: forward pass {i} has cached_lens={call.cached_lens}, expected [{start}]: the "
                  "chunk attends to the tokens the earlier chunks cached")
        table_problem = _table_problem(call, 0, end, i)
        if table_problem:
            _fail(f"{where}: {table_problem}")
        if call.positions != list(range(start, end)):
            _fail(f"{where}: forward pass {i} has positions {call.positions[:4]}..., expected "
                  f"{list(range(start, min(end, start + 4)))}...: positions are absolute, start + i, "
                  "or RoPE rotates the keys by the wrong angles")


def _table_problem(call, request: int, seq_len: int, step: int) -> str:
    """A block table that does not cover the keys [0, seq_len) of the request, named."""
    if call.block_size is None or request >= len(call.block_tables):
        return ""
    needed = -(-seq_len // call.block_size)
    table = call.block_tables[request]
    if len(table) < needed:
        return (f"forward pass {step} passes a block table that does not cover the keys: {len(table)} block(s) of "
                f"{call.block_size} hold {len(table) * call.block_size} positions, but the chunk attends to keys "
                f"[0, {seq_len}), which need {needed}. The table is the request's WHOLE table (its cached prefix and "
                "the chunk), in order, not only the chunk's blocks")
    return ""


def _table_crash(record, fn, args):
    """A crash inside the engine's cache code is most often a table that does not cover the keys."""
    def explain(exc) -> str | None:
        for step, call in enumerate(record.calls):
            for r, (q, c) in enumerate(zip(call.query_lens, call.cached_lens)):
                problem = _table_problem(call, r, q + c, step)
                if problem:
                    return problem
        return None
    return explain


def _run_recorded(fn, args, model, forbidden, why):
    """fn(*args) with forward passes recorded and the engine's answer forbidden; a crash is explained."""
    with record_forward(model) as record, forbid(fn, *forbidden, why=why):
        try:
            got = fn(*args)
        except (NotImplementedError, ExerciseFailed):
            raise
        except Exception as exc:           # noqa: BLE001
            crashed(fn, args, {}, exc, _table_crash(record, fn, args))
    return got, record


def _top_left_kv(model, tokens, chunk_size):
    """The KV a chunked prefill gets with the top-left mask (the chapter's bug 1)."""
    from unittest import mock
    from .. import attention
    original = attention.reference_attention
    with mock.patch.object(attention, "reference_attention",
                           lambda q, k, v, *a, **kw: original(q, k, v, align="top_left")):
        return _ref.chunked_prefill(model, tokens, chunk_size)


def _check_model(rng: random.Random):
    """A small float64 model with sharper attention than the default init: mistakes show more."""
    cfg = ModelConfig(name="check", vocab_size=64, hidden_size=64, intermediate_size=128,
                      num_layers=2, num_heads=4, num_kv_heads=2, max_position=256)
    model = build_model(cfg, seed=rng.randint(0, 1000), dtype=torch.float64)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8)
    return model


@checker
def check_chunked_prefill(fn, seed: int | None = None):
    """fn(model, token_ids, chunk_size) -> kv [layers, 2, T, Hkv, D], compared with prefill_kv."""
    rng = random.Random(seed)
    model = _check_model(rng)
    # chunks of 7 or 16, a random size, and single-token chunks on a short prompt
    cases = [(rng.randint(40, 90), rng.choice([7, 16]))]
    cases.append((rng.randint(40, 90), rng.randint(2, cases[0][0] // 2)))
    cases.append((rng.randint(12, 24), 1))
    for num_tokens, chunk_size in cases:
        tokens = [rng.randrange(64) for _ in range(num_tokens)]
        expected, _ = prefill_kv(model, tokens)
        got, record = _run_recorded(fn, (model, list(tokens), chunk_size), model, _PREFILL,
                                    "run the chunks through model.forward yourself, one AttentionBatch per chunk.")
        _check_forward_calls(record.calls, num_tokens, chunk_size)
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            _fail(f"expected a tensor of shape {tuple(expected.shape)}, got "
                  f"{getattr(got, 'shape', type(got).__name__)}")
        error = (got - expected).abs()
        if error.max() > 1e-10:
            layer, kind, position = [int(i) for i in (error == error.max()).nonzero()[0][:3]]
            first = int((error.amax(dim=(0, 1, 3, 4)) > 1e-10).nonzero()[0])
            if error[0].max() > 1e-10:
                hint = "Layer 0 already differs: check the positions (absolute, start + i) and the slots"
            elif (got - _top_left_kv(model, tokens, chunk_size)).abs().max() < 1e-10:
                hint = ("That is the TOP-LEFT mask: your attention puts the chunk's queries at positions 0..n-1 "
                        "(is_causal=True does that when q and k lengths differ); they are the LAST n of the s + n "
                        "keys, so the mask is aligned bottom-right")
            else:
                hint = ("Layer 0 is right, later layers differ: the chunk's attention reads the wrong keys; check "
                        "cached_lens and the block table (the request's whole table, in order)")
            _fail(f"{function_name(fn)}(model, <{num_tokens} tokens>, {chunk_size}): max |KV - full prefill| = "
                  f"{error.max():.2e} (layer {layer}, {'KV'[kind]}, position {position}); the first "
                  f"wrong position is {first}. {hint}.")
    passed("check_chunked_prefill: one forward pass per chunk, and your chunked KV equals the full "
                  "prefill to 1e-10 (float64)")


@checker
def check_position_bug_errors(fn, seed: int | None = None):
    """fn(model, token_ids, chunk_size) -> the largest |KV - full prefill| per layer when
    every chunk's positions restart at 0 (the chapter's bug 3)."""
    rng = random.Random(seed)
    model = _check_model(rng)
    cases = [(rng.randint(40, 90), rng.choice([7, 16])), (rng.randint(40, 90), rng.randint(2, 20)),
             (rng.randint(10, 30), None)]                       # None: one chunk, the whole prompt
    for num_tokens, chunk_size in cases:
        chunk_size = chunk_size or num_tokens
        tokens = [rng.randrange(64) for _ in range(num_tokens)]
        expected = _ref.position_bug_errors(model, tokens, chunk_size)
        with record_forward(model) as record:
            got = learner_call(fn, model, list(tokens), chunk_size,
                               forbidden=("minillm.grading._reference.ch04.position_bug_errors",),
                               why="run the chunks with restarted positions yourself.")
        where = f"{function_name(fn)}(model, <{num_tokens} tokens>, {chunk_size})"
        got = [float(e) for e in got] if isinstance(got, (list, tuple, torch.Tensor)) else got
        if not isinstance(got, list) or len(got) != len(expected):
            _fail(f"{where}: return one error per layer, a list of {len(expected)} floats; you return {got!r}")
        restarting = [c for c in record.calls if c.cached_lens and c.cached_lens[0] > 0]
        if chunk_size < num_tokens and not any(c.positions == list(range(c.num_tokens)) for c in restarting):
            _fail(f"{where}: none of your chunks after the first has positions restarting at 0; the bug to "
                  "reproduce is positions = torch.arange(0, end - start), with the cache as before")
        if not all(abs(g - e) <= 1e-6 * abs(e) + 1e-12 for g, e in zip(got, expected)):
            _fail(f"{where}: you return {[f'{g:.3e}' for g in got]}, expected {[f'{e:.3e}' for e in expected]}: "
                  "per layer, the largest |your chunked KV - prefill_kv's KV| (K and V, every position)")
    passed(f"check_position_bug_errors: {len(cases)} prompts, per-layer errors as the engine measures them")



# ---------------------------------------------------------------------------
# A graded question: which of layer 0's tensors does each bug touch?
# ---------------------------------------------------------------------------
_CHOICES = ("K", "V", "both", "neither")
_LAYER0 = {"positions restart": "K", "top-left mask": "neither"}
_WHY_LAYER0 = {
    "positions restart": ("layer 0's K and V are projections of the token embeddings; RoPE then rotates K (and q) by "
                          "the position, never V. So wrong positions change layer 0's K only"),
    "top-left mask": ("the mask acts inside attention, which runs AFTER layer 0's K and V are computed from the "
                      "embeddings and written to the cache: layer 0's KV cannot see it; it shows from layer 1 on"),
}


@checker
def check_layer0_question(answer, seed: int | None = None):
    """answer: {"positions restart": one of K/V/both/neither, "top-left mask": one of them}."""
    if not isinstance(answer, dict) or set(answer) != set(_LAYER0):
        _fail(f"answer = {answer!r}: a dict with exactly the keys {sorted(_LAYER0)}, each one of {list(_CHOICES)}")
    for bug, value in answer.items():
        if value not in _CHOICES:
            _fail(f"answer[{bug!r}] = {value!r}: choose one of {list(_CHOICES)}")
    wrong = [bug for bug in _LAYER0 if answer[bug] != _LAYER0[bug]]
    if wrong:
        bug = wrong[0]
        _fail(f"answer[{bug!r}] = {answer[bug]!r} is not what the engine shows: measure it (compare layer 0's K and "
              f"V separately, cache.gather(...)[0, 0] and [0, 1], against prefill_kv's) and ask where in the layer "
              f"{'RoPE' if bug == 'positions restart' else 'the mask'} acts")
    passed("layer 0 tells the bugs apart: wrong positions change its K (RoPE), a wrong mask cannot reach it")


# ---------------------------------------------------------------------------
# Transfer: several prompts, chunked and packed into one forward pass per step
# ---------------------------------------------------------------------------
def _expected_steps(lengths, chunk_size):
    done, steps = [0] * len(lengths), []
    while any(d < n for d, n in zip(done, lengths)):
        rows = [r for r, n in enumerate(lengths) if done[r] < n]
        steps.append([(r, done[r], min(done[r] + chunk_size, lengths[r])) for r in rows])
        done = [min(d + chunk_size, n) for d, n in zip(done, lengths)]
    return steps


@checker
def check_packed_chunked_prefill(fn, seed: int | None = None):
    """fn(model, prompts, chunk_size) -> [kv of each prompt]: each step one forward pass packing the next chunk
    of every unfinished prompt; every KV equal to that prompt's full prefill (float64, 1e-10)."""
    rng = random.Random(seed)
    model = _check_model(rng)
    cases = [([20, 7], 8), ([5, 33, 12], 16)] + [([rng.randint(1, 50) for _ in range(rng.randint(2, 4))],
                                                 rng.randint(3, 20))]
    for lengths, chunk_size in cases:
        prompts = [[rng.randrange(64) for _ in range(n)] for n in lengths]
        expected = [prefill_kv(model, p)[0] for p in prompts]
        where = f"{function_name(fn)}(model, <prompts of {lengths} tokens>, {chunk_size})"
        got, record = _run_recorded(fn, (model, [list(p) for p in prompts], chunk_size), model, _PREFILL,
                                    "pack the chunks into model.forward yourself, one AttentionBatch per step.")
        steps = _expected_steps(lengths, chunk_size)
        calls = record.calls
        if len(calls) != len(steps):
            one_per_chunk = sum(len(s) for s in steps)
            hint = (" one per request and chunk: PACK them, one pass per step carries a chunk of every unfinished "
                    "prompt" if len(calls) == one_per_chunk else
                    " one per step: as many as the longest prompt has chunks")
            _fail(f"{where}: {len(calls)} forward passes, expected {len(steps)};{hint}")
        for i, (call, step) in enumerate(zip(calls, steps)):
            want_q = [e - s for _, s, e in step]
            want_c = [s for _, s, _ in step]
            if call.query_lens != want_q or call.cached_lens != want_c:
                _fail(f"{where}: step {i} has query_lens={call.query_lens}, cached_lens={call.cached_lens}; expected "
                      f"query_lens={want_q}, cached_lens={want_c} (the unfinished prompts, in order, each with its "
                      "next chunk and what it has cached)")
            want_pos = sum((list(range(s, e)) for _, s, e in step), [])
            if call.positions != want_pos:
                _fail(f"{where}: step {i}'s positions start {call.positions[:6]}..., expected {want_pos[:6]}...: each "
                      "request's tokens carry ITS OWN absolute positions, one after the other in the packed step")
            for r, (_, s, e) in enumerate(step):
                problem = _table_problem(call, r, e, i)
                if problem:
                    _fail(f"{where}: request {r}: {problem}")
        if not isinstance(got, (list, tuple)) or len(got) != len(prompts):
            _fail(f"{where}: return a list of {len(prompts)} KV tensors, one per prompt, in order")
        for r, (kv, want) in enumerate(zip(got, expected)):
            if not isinstance(kv, torch.Tensor) or kv.shape != want.shape:
                _fail(f"{where}: prompt {r}'s KV has shape {getattr(kv, 'shape', type(kv).__name__)}, expected "
                      f"{tuple(want.shape)}")
            error = (kv - want).abs().max().item()
            if error > 1e-10:
                _fail(f"{where}: prompt {r}'s KV differs from its full prefill by {error:.2e}: each request must "
                      "attend only to its own keys (its own block table, its own slots)")
    passed(f"packed chunked prefill: one forward pass per step, every prompt's KV equal to its full prefill "
           f"({len(cases)} batches)")


# ---------------------------------------------------------------------------
# Predict, then measure: the attention work and the KV re-reads of a chunked prefill
# ---------------------------------------------------------------------------
def measured_work(model, num_tokens: int, chunk_size: int, rng: random.Random) -> tuple[int, int]:
    """(query-key pairs attended, cached keys re-read) summed over the engine's forward passes."""
    tokens = [rng.randrange(model.cfg.vocab_size) for _ in range(num_tokens)]
    with record_forward(model) as record:
        prefill_kv(model, tokens, chunk_size=chunk_size)
    pairs = sum(q * c + q * (q + 1) // 2 for call in record.calls for q, c in zip(call.query_lens, call.cached_lens))
    reads = sum(c for call in record.calls for c in call.cached_lens)
    return pairs, reads


@checker
def check_chunked_prefill_work(fn, seed: int | None = None):
    """fn(num_tokens, chunk_size) -> (pairs, cached_reads): predicted query-key pairs attended (each query with the
    keys at or before it) and cached keys read (each chunk reads its whole cached prefix), over a chunked prefill;
    measured on the engine's forward passes, exact."""
    rng = random.Random(seed)
    model = build_model(ModelConfig(name="work", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1,
                                    num_heads=2, num_kv_heads=1, max_position=512), seed=0)
    cases = [(64, 64), (64, 16), (50, 16), (7, 1)] + [(rng.randint(1, 300), rng.randint(1, 100)) for _ in range(3)]
    for num_tokens, chunk_size in cases:
        pairs, reads = measured_work(model, num_tokens, chunk_size, rng)
        call = call_text(fn, num_tokens, chunk_size)
        got = learner_call(fn, num_tokens, chunk_size, forbidden=_PREFILL,
                           why="predict the counts from the chunks' shapes; the checker runs the engine.")
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            _fail(f"{call} returned {got!r}: return a pair (pairs, cached_reads)")
        why_pairs = "a query at position p attends to the p + 1 keys at or before it, whatever the chunking"
        if isinstance(got[0], int) and got[0] != pairs:
            rectangles = sum(min(chunk_size, num_tokens - s) * min(s + chunk_size, num_tokens)
                             for s in range(0, num_tokens, chunk_size))
            if got[0] == rectangles:
                why_pairs = ("you count every chunk's whole [n, s + n] rectangle; the keys after a query are masked, "
                             "not attended: chunking does not change the pairs")
        grade_prediction(f"{call}, pairs", got[0], pairs, 0.0, why_pairs)
        grade_prediction(f"{call}, cached keys read", got[1], reads, 0.0,
                         "each chunk reads the keys cached before it (its start), once per chunk")
    big = learner_call(fn, 10**6, 512, forbidden=_PREFILL)
    starts = range(0, 10**6, 512)
    grade_prediction(call_text(fn, 10**6, 512) + ", cached keys read", big[1] if isinstance(big, (tuple, list)) else big,
                     sum(starts), 0.0, "reason from the small cases")
    passed(f"your predicted work and re-reads match the engine's forward passes on {len(cases)} prefills")
