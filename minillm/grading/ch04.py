"""Checkers for exercises/04_chunked_prefill_is_exact: compare with the engine, and
watch the method.

check_chunked_prefill does not only compare the KV: it records every forward
pass the learner's function makes (there must be ceil(T / chunk_size), with the
chunk's query length, the cached length before it and its absolute positions)
and switches the engine's own prefill_kv and ModelRunner off while it runs.
"""
from __future__ import annotations

import random

import torch

from ..attention import causal_mask
from ..config import ModelConfig
from ..loader import build_model
from ..prefill import prefill_kv
from ._common import fail as _fail, learner_call, passed, forbid, record_forward
from ._reference import ch04 as _ref

__all__ = ["check_step_mask", "check_chunk_bounds", "check_chunked_prefill", "check_position_bug_errors"]

_MASKS = ("minillm.attention.causal_mask", "torch.nn.attention.bias.causal_lower_right")
_PREFILL = ("minillm.model_runner.prefill_kv", "minillm.model_runner.ModelRunner.execute",
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


def check_step_mask(fn, seed: int | None = None):
    """fn(query_lens, cached_lens) -> bool [sum q, sum (c + q)]: the mask of a packed step."""
    rng = random.Random(seed)
    cases = [([1], [0]), ([3], [4]), ([2, 2], [2, 2]), ([3, 1, 1], [0, 5, 9])]
    for _ in range(20):
        n = rng.randint(1, 5)
        cases.append(([rng.randint(1, 12) for _ in range(n)], [rng.choice([0, rng.randint(1, 30)]) for _ in range(n)]))
    for query_lens, cached_lens in cases:
        expected = _packed(query_lens, cached_lens)
        where = f"query_lens={query_lens}, cached_lens={cached_lens}"
        got = learner_call(fn, list(query_lens), list(cached_lens), forbidden=_MASKS,
                           why="build each request's block from torch.arange, as the statement asks.")
        if not isinstance(got, torch.Tensor):
            _fail(f"{where}: you return a {type(got).__name__}, expected a torch.Tensor")
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
    return passed(f"check_step_mask: correct on {len(cases)} packed steps")


def check_chunk_bounds(fn, seed: int | None = None):
    """fn(num_tokens, chunk_size) -> [(start, end), ...] covering [0, num_tokens) in order."""
    rng = random.Random(seed)
    cases = [(10, 3), (10, 10), (10, 64), (1, 1), (7, 1), (1024, 512), (1025, 512)] + \
        [(rng.randint(1, 3000), rng.randint(1, 600)) for _ in range(30)]
    for num_tokens, chunk_size in cases:
        expected = [(s, min(s + chunk_size, num_tokens)) for s in range(0, num_tokens, chunk_size)]
        got = [tuple(b) for b in learner_call(fn, num_tokens, chunk_size)]
        if got != expected:
            hint = "The last chunk may be shorter; none runs past num_tokens."
            if got and got[-1][1] > num_tokens:
                hint = f"Your last chunk ends at {got[-1][1]}, past num_tokens: cut it at num_tokens."
            elif len(got) < len(expected):
                hint = f"You return {len(got)} chunks, {len(expected)} are needed: don't drop the short last one."
            elif any(b[0] != a[1] for a, b in zip(got, got[1:])):
                hint = "Chunks must be contiguous: each starts where the previous ended (end is exclusive)."
            _fail(f"num_tokens={num_tokens}, chunk_size={chunk_size}: you return {got[:4]}..., expected "
                  f"{expected[:4]}... ({len(expected)} chunks). {hint}")
    return passed(f"check_chunk_bounds: correct on {len(cases)} cases")


def _check_forward_calls(calls, num_tokens: int, chunk_size: int):
    """The learner's forward passes, one per chunk, in order, with the right batch."""
    where = f"{num_tokens} tokens, chunk_size={chunk_size}"
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
        if call.positions != list(range(start, end)):
            _fail(f"{where}: forward pass {i} has positions {call.positions[:4]}..., expected "
                  f"{list(range(start, min(end, start + 4)))}...: positions are absolute, start + i, "
                  "or RoPE rotates the keys by the wrong angles")


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
        with record_forward(model) as record, forbid(fn, *_PREFILL, why="run the chunks through "
                                                     "model.forward yourself, one AttentionBatch per chunk."):
            got = fn(model, list(tokens), chunk_size)
        _check_forward_calls(record.calls, num_tokens, chunk_size)
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            _fail(f"expected a tensor of shape {tuple(expected.shape)}, got "
                  f"{getattr(got, 'shape', type(got).__name__)}")
        error = (got - expected).abs()
        if error.max() > 1e-10:
            layer, kind, position = [int(i) for i in (error == error.max()).nonzero()[0][:3]]
            first = int((error.amax(dim=(0, 1, 3, 4)) > 1e-10).nonzero()[0])
            hint = ("layer 0 already differs: check the positions (absolute, start + i) and the slots"
                    if error[0].max() > 1e-10 else
                    "layer 0 is right, later layers differ: the chunk reads its cached prefix through "
                    "block_tables; pass the request's whole table, in order")
            _fail(f"{num_tokens} tokens, chunk_size={chunk_size}: max |KV - full prefill| = "
                  f"{error.max():.2e} (layer {layer}, {'KV'[kind]}, position {position}); the first "
                  f"wrong position is {first}. {hint}.")
    return passed("check_chunked_prefill: one forward pass per chunk, and your chunked KV equals the full "
                  "prefill to 1e-10 (float64)")


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
        where = f"{num_tokens} tokens, chunk_size={chunk_size}"
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
    return passed(f"check_position_bug_errors: {len(cases)} prompts, per-layer errors as the engine measures them")

