"""Checkers for exercises/04_chunked_prefill_is_exact: the mask of a packed step, a tool that
locates a chunked-prefill bug (a debug task graded on bugs it has never seen), a packed
chunked prefill of several prompts (one forward pass per step), and a prediction of the work
and the KV re-reads of a chunked prefill, measured on the engine's forward passes.

Expected values come from the engine (causal_mask, prefill_kv, the forward passes recorded),
computed before the learner's function runs with the engine's own answer switched off. The
bugs the locator is tried on are the engine's prefill_kv with one thing changed (a forward
pass fed other positions or tokens, a mask aligned top-left, keys read past the chunk, V
written to the wrong slots, K turned by float32 angles: a difference of ~1e-6, NaN read from
unwritten slots) or two at once (an earlier position of a later layer); where each first
shows is known by construction, and the tests hold it against a measurement. The packed
prefill's forward passes are compared step by step: their lengths, positions, block tables
and slots. Teacher-only cases: _hidden/ch04.py.
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


def _strict_packed(query_lens, cached_lens) -> torch.Tensor:
    """The packed mask without its diagonals: no query sees its own key (a mistake)."""
    return torch.block_diag(*(torch.nn.functional.pad(causal_mask(q, c + q - 1), (0, 1), value=False)
                              for q, c in zip(query_lens, cached_lens)))


_SWAPPED = "True and False are swapped: True means the query MAY attend to the key"
_STRICT = "no query sees its own key: the diagonal of each request's block is missing"


def _step_mask_mistake(got: torch.Tensor, query_lens, cached_lens) -> str:
    total_q, total_k = sum(query_lens), sum(q + c for q, c in zip(query_lens, cached_lens))
    if torch.equal(got, _packed(query_lens, cached_lens, align="top_left")):
        return ("each request's block is TOP-LEFT aligned: its queries are the last q of its c + q keys, "
                "so query i sits at position c + i")
    if torch.equal(got, causal_mask(total_q, total_k)):
        return ("one causal mask over the whole step lets a request see the keys of the requests before it: "
                "a query sees only its own request's keys (one block per request on the diagonal)")
    if torch.equal(got, _strict_packed(query_lens, cached_lens)):     # on one 1 x 1 block: also the swapped mask
        return _STRICT
    if torch.equal(got, ~_packed(query_lens, cached_lens)):
        return _SWAPPED
    return ""


def _tell_strict_from_swapped(fn, mistake: str) -> str:
    """A strict mask and a swapped one coincide on a lone 1 x 1 block: ask about a step where they differ."""
    if mistake != _STRICT:
        return mistake
    query_lens, cached_lens = [3, 2], [4, 1]
    probe = learner_call(fn, list(query_lens), list(cached_lens), forbidden=_MASKS,
                         why="build each request's block from torch.arange, as the statement asks.")
    if isinstance(probe, torch.Tensor) and probe.shape == (5, 10) and \
            torch.equal(probe.cpu(), ~_packed(query_lens, cached_lens)):
        return _SWAPPED + f" ({call_text(fn, query_lens, cached_lens)} is the exact inverse too)"
    return mistake


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
            mistake = _tell_strict_from_swapped(fn, _step_mask_mistake(got.cpu(), query_lens, cached_lens))
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


def _slots_recorded(model, slots: list):
    """Append each forward pass's slot mapping (a list of ints) to `slots`."""
    def wrap(original):
        def forward(token_ids, positions, batch, *args, **kwargs):
            mapping = getattr(batch, "slot_mapping", None)
            slots.append(mapping.tolist() if isinstance(mapping, torch.Tensor) else list(mapping or []))
            return original(token_ids, positions, batch, *args, **kwargs)
        return forward
    return _forward_wrapped(model, wrap)


def _run_recorded(fn, args, model, forbidden, why):
    """fn(*args) with forward passes recorded (their slot mappings too, as record.slots) and the engine's
    answer forbidden; a crash is explained."""
    slots: list = []
    with record_forward(model) as record, _slots_recorded(model, slots), forbid(fn, *forbidden, why=why):
        try:
            got = fn(*args)
        except (NotImplementedError, ExerciseFailed):
            raise
        except Exception as exc:           # noqa: BLE001
            crashed(fn, args, {}, exc, _table_crash(record, fn, args))
    record.slots = slots
    return got, record


def _slot_problem(call, slots: list, step: list, i: int) -> str:
    """Whether each request's new tokens go to the slots its own block table gives their positions; the
    first request whose slots do not, named with the positions those slots belong to."""
    size = call.block_size
    if size is None or len(call.block_tables) < len(step):
        return ""
    row = 0
    for r, (request, start, end) in enumerate(step):
        table, mine = call.block_tables[r], slots[row:row + end - start]
        row += end - start
        want = [table[p // size] * size + p % size for p in range(start, end)]
        if mine == want:
            continue
        where = {table[b] * size + o: b * size + o for b in range(len(table)) for o in range(size)}
        positions = [where.get(slot) for slot in mine]
        if not positions or None in positions:
            return (f"step {i} writes prompt {request}'s tokens {start}.. to slots {mine[:4]}{'...' if len(mine) > 4 else ''} "
                    f"that the block table it attends through ({table}) does not hold: each request attends through "
                    "its own block table, and its tokens go to that table's slots")
        written = f"the slots of its positions {positions[0]}.." if positions == sorted(positions) else \
            f"the slots of its positions {positions[:4]}"
        return (f"step {i} writes prompt {request}'s tokens {start}.. to {written}: a token's K and V go to the "
                "slot its block table gives ITS position, where a later chunk reads them")
    return ""


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
TOLERANCE = 1e-9      # float64: rounding moves a KV entry by ~1e-15; every bug here moves it by ~1e-6 or more


class _KeysToPromptEnd(AttentionBatch):
    """An AttentionBatch whose key length runs to the end of the prompt (the chapter's bug 2)."""
    prompt_len: int = 0

    @property
    def seq_lens(self):
        return [self.prompt_len]


@contextlib.contextmanager
def _forward_wrapped(model, wrap):
    """model.forward replaced by wrap(the current forward) for the block, then put back as it was (an
    instance attribute of an outer wrapper, or none): wrappers nest."""
    before = vars(model).get("forward")
    model.forward = wrap(model.forward)
    try:
        yield
    finally:
        if before is None:
            del model.forward
        else:
            model.forward = before


def _forward_changed(model, change, first_chunk_too: bool = False):
    """model.forward with its (token_ids, positions, batch) changed by `change` for every chunk after
    the first (or every chunk)."""
    def wrap(original):
        def forward(token_ids, positions, batch, *args, **kwargs):
            if first_chunk_too or batch.cached_lens[0] > 0:
                token_ids, positions, batch = change(token_ids, positions, batch)
            return original(token_ids, positions, batch, *args, **kwargs)
        return forward
    return _forward_wrapped(model, wrap)


def _buggy(context, backend: str | None = "reference"):
    """A chunked prefill: the engine's prefill_kv inside `context(model, token_ids)`. Every bug (and the
    exact prefill) is a function of the same name and shape: the learner's tool can only measure it."""
    def chunked_prefill(model, token_ids, chunk_size):
        with context(model, token_ids):
            return prefill_kv(model, token_ids, chunk_size=chunk_size, backend=backend)[0]
    return chunked_prefill


def _both(first, second):
    """Two bugs at once: `first` and `second` are contexts of (model, token_ids)."""
    @contextlib.contextmanager
    def context(model, token_ids):
        with first(model, token_ids), second(model, token_ids):
            yield
    return context


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


def _rope_float32_after_first_chunk(model, token_ids):
    """The chunks after the first turn K by angles computed in float32: K moves by ~1e-6, no more."""
    from .. import model as model_module
    original = model_module.rope_cos_sin

    def rope_cos_sin(cfg, positions, dtype):
        if len(positions) and int(positions[0]) > 0:
            cos, sin = original(cfg, positions, torch.float32)
            return cos.to(dtype), sin.to(dtype)
        return original(cfg, positions, dtype)
    return mock.patch.object(model_module, "rope_cos_sin", rope_cos_sin)


def _unwritten_slots_nan(model, token_ids):
    """The cache starts as NaN (memory nobody wrote, as torch.empty leaves it), and every pass reads keys
    to the prompt's end: what it reads before a later chunk writes there is NaN."""
    from ..kv_cache import PagedKVCache
    original = PagedKVCache.for_model.__func__

    def for_model(cls, *args, **kwargs):
        cache = original(cls, *args, **kwargs)
        cache.data.fill_(float("nan"))
        return cache

    @contextlib.contextmanager
    def context():
        with mock.patch.object(PagedKVCache, "for_model", classmethod(for_model)), \
                _keys_to_prompt_end(model, token_ids):
            yield
    return context()


def _last_chunk_positions(model, token_ids, chunk_size: int):
    """Only the last chunk's positions restart at 0: layer 0's K differs from the last chunk's start."""
    last_start = (len(token_ids) - 1) // chunk_size * chunk_size
    return _forward_changed(model, lambda ids, pos, batch: (ids, pos - pos[0], batch)
                            if int(pos[0]) == last_start else (ids, pos, batch))


def _layer1_value_rows_shifted(model, token_ids):
    """Layer 1's V projection sees the chunk's rows shifted, in the chunks after the first: K untouched."""
    layer = model.layers[1].self_attn if hasattr(model, "layers") else model.model.layers[1].self_attn
    original = layer.v_proj.forward
    active = [False]

    def shifted(x):
        out = original(x)
        return out.roll(1, 0) if active[0] else out

    def wrap(original_forward):
        def forward(token_ids, positions, batch, *args, **kwargs):
            active[0] = batch.cached_lens[0] > 0          # the chunks after the first
            return original_forward(token_ids, positions, batch, *args, **kwargs)
        return forward

    @contextlib.contextmanager
    def context():
        with mock.patch.object(layer.v_proj, "forward", shifted), _forward_wrapped(model, wrap):
            yield
    return context()


def _last_start(chunk_size: int, num_tokens: int) -> int:
    return (num_tokens - 1) // chunk_size * chunk_size


# Each bug, and where it first shows, by construction (layer, tensors, first position; c = chunk_size,
# t = the prompt's length):
#   positions restarting at 0  layer 0's K only (RoPE turns K, never V), from the second chunk on
#   token ids off by one       layer 0's K and V (both come from the embedding), from the second chunk on
#   V written one slot late    layer 0's V only, from the second chunk on
#   top-left mask              layer 1 (the mask acts in attention, after layer 0's K and V are written)
#   keys to the prompt's end   layer 1, from position 0 (the first chunk already reads unwritten slots)
#   RoPE in float32            layer 0's K only, from the second chunk on, by ~1e-6: small, but a
#                              billion times float64's rounding
#   NaN in unwritten slots     layer 1 from position 0, as NaN (a difference NaN > tolerance is False)
#   two bugs                   the last chunk's positions (layer 0's K, from the last chunk's start) and
#                              layer 1's V (from the second chunk, an EARLIER position of a LATER layer)
BUGS = {
    "exact": (_exact, lambda c, t: None),
    "positions restart": (_buggy(lambda m, t: _forward_changed(
        m, lambda ids, pos, batch: (ids, pos - pos[0], batch))), lambda c, t: (0, "K", c)),
    "token ids off by one": (_buggy(lambda m, t: _forward_changed(
        m, lambda ids, pos, batch: ((ids + 1) % m.cfg.vocab_size, pos, batch))), lambda c, t: (0, "both", c)),
    "V written late": (_buggy(_v_written_late), lambda c, t: (0, "V", c)),
    "top-left mask": (_buggy(_top_left), lambda c, t: (1, "both", c)),
    "keys to the prompt's end": (_buggy(_keys_to_prompt_end), lambda c, t: (1, "both", 0)),
    "RoPE in float32": (_buggy(_rope_float32_after_first_chunk), lambda c, t: (0, "K", c)),
    "NaN in unwritten slots": (_buggy(_unwritten_slots_nan), lambda c, t: (1, "both", 0)),
}


def _two_bugs_last_chunk_and_layer1(chunk_size: int):
    return _buggy(_both(lambda m, t: _last_chunk_positions(m, t, chunk_size), _layer1_value_rows_shifted))


def bug_cases(chunk_size: int):
    """Every bug the public check tries, at one chunk size: {name: (prefill, where_it_shows(c, t))}."""
    return {**BUGS, "last chunk's positions, and layer 1's V": (
        _two_bugs_last_chunk_and_layer1(chunk_size), lambda c, t: (0, "K", _last_start(c, t)))}


def kv_differences(kv, full, layer: int) -> tuple[float, float]:
    """(max |K - K_full|, max |V - V_full|) of one layer; NaN where either holds NaN."""
    def worst(a, b):
        error = (a - b).abs()
        return float("nan") if torch.isnan(error).any() else error.max().item()
    return worst(kv[layer, 0], full[layer, 0]), worst(kv[layer, 1], full[layer, 1])


def first_wrong_position(kv, full, layer: int | None = None, tensor: int | None = None) -> int | None:
    """The first position that differs beyond TOLERANCE (NaN counts), in one layer (or any) and one tensor
    (or either)."""
    error = (kv - full).abs()
    error = error if layer is None else error[layer:layer + 1]
    error = error if tensor is None else error[:, tensor:tensor + 1]
    wrong = ~(error <= TOLERANCE)                                   # NaN <= x is False: NaN is wrong
    rows = wrong.transpose(0, 2).flatten(1).any(1)
    return int(rows.nonzero()[0]) if rows.any() else None


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
    has_nan = bool(torch.isnan(kv[layer]).any())
    if has_nan:
        measured = (f"layer {layer}'s cache holds NaN from position {position} on, and NaN compared with anything "
                    "is False (NaN > tolerance too)")
    if got is None:
        if has_nan:
            return f"this prefill is not exact: {measured}"
        if max(k_err, v_err) < 1e-2:
            return (f"this prefill is not exact: {measured}. Small, but float64's rounding is ~1e-15 for values of "
                    "this size: your tolerance lets a real bug through")
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
        small = [name for name, err in (("K", k_err), ("V", v_err)) if 0 < err <= TOLERANCE]
        if small:
            return (f"{measured}: {small[0]} differs only by float64 rounding (under 1e-9), not beyond it; which "
                    "of them differ beyond rounding? ('K', 'V' or 'both')")
        return f"{measured}: which of them differ beyond rounding? ('K', 'V' or 'both')"
    anywhere = first_wrong_position(kv, full)
    if got_position == anywhere and anywhere != position:
        later = next(l for l in range(kv.shape[0]) if first_wrong_position(kv, full, l) == anywhere)
        return (f"{measured}; position {got_position} is the first that differs in ANY layer (layer {later}), but "
                f"the position asked for is the first in layer {layer}, the first layer that differs: {position}")
    for tensor, name in ((0, "K"), (1, "V")):
        alone = first_wrong_position(kv, full, layer, tensor)
        if which == "both" and got_position == alone and alone != position:
            return (f"{measured}; position {got_position} is where {name} first differs, but the layer's first "
                    f"position counts K and V: {position}")
    if isinstance(got_position, int) and got_position > position:
        at = (kv[layer, :, position] - full[layer, :, position]).abs().max().item()
        if at < 1e-4:
            return (f"{measured}; at position {position} layer {layer} already differs by {at:.1e}: small, but far "
                    "above float64's rounding (~1e-15 for values of this size): your tolerance lets it through")
    return (f"{measured}; in that layer the first position that differs is {position} (chunk_size {chunk_size}); "
            "positions are the third axis of the KV")


@checker
def check_locate_bug(fn, seed: int | None = None):
    """fn(prefill_fn, model, token_ids, chunk_size) -> None when prefill_fn(model, token_ids, chunk_size) gives
    the full prefill's KV (to float64 rounding), else (layer, which, position): the first layer whose cache
    differs, which of its tensors differ ('K', 'V' or 'both'), and the first position that differs there.
    The bugs move the cache by as little as ~1e-6, or fill it with NaN."""
    rng = random.Random(seed)
    model = _check_model(rng)
    names = list(bug_cases(8))
    rng.shuffle(names)                        # the exact prefill is not always the first one asked about
    for name in names:
        num_tokens, chunk_size = rng.randint(45, 90), rng.choice([8, 16, 20])     # at least three chunks
        prefill, where_it_shows = bug_cases(chunk_size)[name]
        tokens = [rng.randrange(model.cfg.vocab_size) for _ in range(num_tokens)]
        want = where_it_shows(chunk_size, num_tokens)
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
            problem = _slot_problem(call, record.slots[i], step, i)
            if problem:
                _fail(f"{where}: {problem}")
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
            starts = list(range(0, num_tokens, chunk_size))
            if got[1] == ends:
                why_reads = ("you count each chunk's own keys too: they come from the step itself, the cache holds "
                             "only the prefix BEFORE the chunk")
            elif num_tokens % chunk_size and len(starts) > 1 and got[1] == sum(starts[:-1]):
                why_reads = (f"you leave out the last, shorter chunk: {num_tokens} tokens in chunks of {chunk_size} "
                             f"end with a chunk of {num_tokens - starts[-1]}, and it too reads the {starts[-1]} keys "
                             "cached before it")
            elif reads == 0:
                why_reads = (f"a chunk of {chunk_size} holds the whole {num_tokens}-token prompt: one pass, nothing "
                             "cached before it, nothing re-read")
        grade_count(f"{call}, cached keys read", got[1], reads, why_reads)
    # far too long to run: the answer must be a pair of whole numbers (its exact value: _hidden/ch04.py)
    big = learner_call(fn, 10**6, 512, forbidden=_PREFILL)
    if not (isinstance(big, (tuple, list)) and len(big) == 2 and all(isinstance(x, int) for x in big)) or big[1] <= 0:
        _fail(f"{call_text(fn, 10**6, 512)} returned {big!r}: a pair of whole numbers, some keys re-read")
    passed(f"your predicted work and re-reads match the engine's forward passes on {len(cases)} prefills")
