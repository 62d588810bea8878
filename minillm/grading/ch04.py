"""Checkers for exercises/04_chunked_prefill_is_exact: the mask of a packed step, a tool that
locates a chunked-prefill bug (a debug task graded on bugs it has never seen), a packed
chunked prefill of several prompts (one forward pass per step), and a prediction of the work
and the KV re-reads of a chunked prefill, measured on the engine's forward passes.

Expected values come from the engine (causal_mask, prefill_kv, the forward passes recorded),
computed before the learner's function runs with the engine's own answer switched off. The
bugs the locator is tried on are the engine's prefill_kv with one thing changed (a forward
pass fed other positions or tokens, a mask aligned top-left, keys read past the chunk, V
written to the wrong slots); where each first shows is known by construction, and the
tests hold it against a measurement. Teacher-only cases: _hidden/ch04.py.
"""
from __future__ import annotations

import contextlib
import random
from unittest import mock

import torch

from .. import attention
from ..attention import AttentionBatch, causal_mask
from ..config import ModelConfig
from ..loader import build_model
from ..prefill import prefill_kv
from ._common import (call_text, checker, crashed, ExerciseFailed, fail as _fail, forbid, function_name,
                      grade_count, learner_call, passed, record_forward)

__all__ = ["check_step_mask", "check_locate_bug", "check_packed_chunked_prefill", "check_chunked_prefill_work"]

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


# ---------------------------------------------------------------------------
# Debug: a tool that says where a chunked prefill first goes wrong
# ---------------------------------------------------------------------------
TOLERANCE = 1e-9      # float64: rounding moves a KV entry by ~1e-15; every bug here moves it by ~1e-2 or more


class _KeysToPromptEnd(AttentionBatch):
    """An AttentionBatch whose key length runs to the end of the prompt (the chapter's bug 2)."""
    prompt_len: int = 0

    @property
    def seq_lens(self):
        return [self.prompt_len]


@contextlib.contextmanager
def _forward_changed(model, change, first_chunk_too: bool = False):
    """model.forward with its (token_ids, positions, batch) changed by `change` for every chunk after
    the first (or every chunk)."""
    original = model.forward

    def forward(token_ids, positions, batch, *args, **kwargs):
        if first_chunk_too or batch.cached_lens[0] > 0:
            token_ids, positions, batch = change(token_ids, positions, batch)
        return original(token_ids, positions, batch, *args, **kwargs)

    model.forward = forward
    try:
        yield
    finally:
        del model.forward


def _buggy(context, backend: str | None = "reference"):
    """A chunked prefill: the engine's prefill_kv inside `context(model, token_ids)`. Every bug (and the
    exact prefill) is a function of the same name and shape: the learner's tool can only measure it."""
    def chunked_prefill(model, token_ids, chunk_size):
        with context(model, token_ids):
            return prefill_kv(model, token_ids, chunk_size=chunk_size, backend=backend)[0]
    return chunked_prefill


# The engine's chunked prefill itself, its default backend: sums in another order than one pass.
_exact = _buggy(lambda model, token_ids: contextlib.nullcontext(), backend=None)


def _v_written_late(model, token_ids):
    original = attention.write_kv

    def write_kv(k_cache, v_cache, k_new, v_new, slot_mapping):
        late = v_new.roll(1, 0) if int(slot_mapping[0]) != 0 else v_new       # chunks after the first
        original(k_cache, v_cache, k_new, late, slot_mapping)
    return mock.patch.object(attention, "write_kv", write_kv)


def _top_left(model, token_ids):
    original = attention.reference_attention
    return mock.patch.object(attention, "reference_attention",
                             lambda q, k, v, *a, **kw: original(q, k, v, align="top_left"))


def _keys_to_prompt_end(model, token_ids):
    def change(ids, positions, batch):
        wide = _KeysToPromptEnd(batch.query_lens, batch.cached_lens, batch.block_tables, batch.block_size,
                                batch.slot_mapping)
        wide.prompt_len = len(token_ids)
        return ids, positions, wide
    return _forward_changed(model, change, first_chunk_too=True)


# Each bug, and where it first shows, by construction (layer, tensors, first position; c = chunk_size):
#   positions restarting at 0  layer 0's K only (RoPE turns K, never V), from the second chunk on
#   token ids off by one       layer 0's K and V (both come from the embedding), from the second chunk on
#   V written one slot late    layer 0's V only, from the second chunk on
#   top-left mask              layer 1 (the mask acts in attention, after layer 0's K and V are written)
#   keys to the prompt's end   layer 1, from position 0 (the first chunk already reads unwritten slots)
BUGS = {
    "exact": (_exact, lambda c: None),
    "positions restart": (_buggy(lambda m, t: _forward_changed(
        m, lambda ids, pos, batch: (ids, pos - pos[0], batch))), lambda c: (0, "K", c)),
    "token ids off by one": (_buggy(lambda m, t: _forward_changed(
        m, lambda ids, pos, batch: ((ids + 1) % m.cfg.vocab_size, pos, batch))), lambda c: (0, "both", c)),
    "V written late": (_buggy(_v_written_late), lambda c: (0, "V", c)),
    "top-left mask": (_buggy(_top_left), lambda c: (1, "both", c)),
    "keys to the prompt's end": (_buggy(_keys_to_prompt_end), lambda c: (1, "both", 0)),
}


def kv_differences(kv, full, layer: int) -> tuple[float, float]:
    """(max |K - K_full|, max |V - V_full|) of one layer."""
    return (kv[layer, 0] - full[layer, 0]).abs().max().item(), (kv[layer, 1] - full[layer, 1]).abs().max().item()


def _locate_mistake(got, want, kv, full, chunk_size: int) -> str:
    """Why the learner's answer is not where the bug first shows, in measured numbers."""
    worst = (kv - full).abs().max().item()
    if want is None:
        return (f"this prefill is exact: it differs from the full one by {worst:.1e} at most, float64 rounding "
                f"(the sums run in another order); a bug moves the cache by orders of magnitude more: compare "
                "with a tolerance, not ==")
    layer, which, position = want
    k_err, v_err = kv_differences(kv, full, layer)
    measured = f"layer {layer}: K differs by up to {k_err:.1e}, V by {v_err:.1e}"
    if got is None:
        return f"this prefill is not exact: {measured}"
    if not (isinstance(got, (tuple, list)) and len(got) == 3):
        return "return None, or a triple (layer, which, first position)"
    got_layer, got_which, got_position = got
    if got_layer != layer:
        earlier = [l for l in range(layer) if max(kv_differences(kv, full, l)) > TOLERANCE]
        if got_layer > layer:
            return f"an earlier layer already differs ({measured}): the layers go in order, report the first"
        return (f"layer {got_layer} agrees with the full prefill (to rounding)" if not earlier else "") + \
            f"; {measured}"
    if got_which != which:
        return f"{measured}: which of them differ beyond rounding? ('K', 'V' or 'both')"
    return (f"{measured}; in that layer the first position that differs is {position} (chunk_size {chunk_size}); "
            "positions are the third axis of the KV")


@checker
def check_locate_bug(fn, seed: int | None = None):
    """fn(prefill_fn, model, token_ids, chunk_size) -> None when prefill_fn(model, token_ids, chunk_size) gives
    the full prefill's KV (to float64 rounding), else (layer, which, position): the first layer whose cache
    differs, which of its tensors differ ('K', 'V' or 'both'), and the first position that differs there."""
    rng = random.Random(seed)
    model = _check_model(rng)
    names = list(BUGS)
    rng.shuffle(names)                        # the exact prefill is not always the first one asked about
    for name in names:
        prefill, where_it_shows = BUGS[name]
        num_tokens, chunk_size = rng.randint(40, 90), rng.choice([8, 16, 20])
        tokens = [rng.randrange(model.cfg.vocab_size) for _ in range(num_tokens)]
        want = where_it_shows(chunk_size)
        got = learner_call(fn, prefill, model, list(tokens), chunk_size,
                           why="run the prefill and compare it with the full prefill yourself.")
        if isinstance(got, list):
            got = tuple(got)
        if got != want:
            full = prefill_kv(model, tokens)[0]
            kv = prefill(model, tokens, chunk_size)
            call = f"{function_name(fn)}(<a chunked prefill>, model, <{num_tokens} tokens>, {chunk_size})"
            _fail(f"{call} returned {got!r}, expected {want!r}: {_locate_mistake(got, want, kv, full, chunk_size)}")
    passed(f"your locator finds where each of {len(names)} chunked prefills first goes wrong (or that it does not)")


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
                row = next((j for j, (a, b) in enumerate(zip(call.positions, want_pos)) if a != b),
                           min(len(call.positions), len(want_pos)))
                starts = [sum(e - s for _, s, e in step[:r]) for r in range(len(step))]
                r = max(r for r, start in enumerate(starts) if start <= min(row, len(want_pos) - 1))
                shown = slice(max(0, row - 2), row + 3)
                _fail(f"{where}: step {i}'s positions first differ at row {row} (request {r} of the step, its token "
                      f"{row - starts[r]}): rows {shown.start}.. hold {call.positions[shown]}, expected "
                      f"{want_pos[shown]}. Each request's tokens carry ITS OWN absolute positions (cached + i), "
                      "one request after the other in the packed step")
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
    cases = [(64, 64), (64, 16), (50, 16), (7, 1), (40, 100)] + \
        [(rng.randint(1, 300), rng.randint(1, 100)) for _ in range(3)]
    for num_tokens, chunk_size in cases:
        pairs, reads = measured_work(model, num_tokens, chunk_size, rng)
        call = call_text(fn, num_tokens, chunk_size)
        got = learner_call(fn, num_tokens, chunk_size, forbidden=_PREFILL,
                           why="predict the counts from the chunks' shapes; the checker runs the engine.")
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            _fail(f"{call} returned {got!r}: return a pair (pairs, cached_reads)")
        why_pairs = "a query at position p attends to the p + 1 keys at or before it, whatever the chunking"
        if isinstance(got[0], int) and got[0] != pairs:
            starts = range(0, num_tokens, chunk_size)
            rectangles = sum(min(chunk_size, num_tokens - s) * min(s + chunk_size, num_tokens) for s in starts)
            if got[0] == rectangles:
                why_pairs = ("you count every chunk's whole [n, s + n] rectangle; the keys after a query are masked, "
                             "not attended: chunking does not change the pairs")
            elif got[0] == pairs - num_tokens:
                why_pairs = "each query also attends to its own key: p + 1 keys at position p, not p"
        grade_count(f"{call}, pairs", got[0], pairs, why_pairs)
        why_reads = "each chunk reads the keys cached before it (its start), once per chunk"
        if isinstance(got[1], int) and got[1] != reads:
            ends = sum(min(s + chunk_size, num_tokens) for s in range(0, num_tokens, chunk_size))
            if got[1] == ends:
                why_reads = ("you count each chunk's own keys too: they come from the step itself, the cache holds "
                             "only the prefix BEFORE the chunk")
            elif reads == 0:
                why_reads = (f"a chunk of {chunk_size} holds the whole {num_tokens}-token prompt: one pass, nothing "
                             "cached before it, nothing re-read")
        grade_count(f"{call}, cached keys read", got[1], reads, why_reads)
    # far too long to run: the answer must be a pair of whole numbers (its exact value: _hidden/ch04.py)
    big = learner_call(fn, 10**6, 512, forbidden=_PREFILL)
    if not (isinstance(big, (tuple, list)) and len(big) == 2 and all(isinstance(x, int) for x in big)) or big[1] <= 0:
        _fail(f"{call_text(fn, 10**6, 512)} returned {big!r}: a pair of whole numbers, some keys re-read")
    passed(f"your predicted work and re-reads match the engine's forward passes on {len(cases)} prefills")
