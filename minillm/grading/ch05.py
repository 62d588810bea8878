"""Checkers for exercises/05_flops_and_io: the FLOPs of a layer with a sliding window (a
transfer: the chapter's count has no window), a prediction (how many decodes a step needs
before it reaches a GPU's ridge point, if any number does), and a design question (the
chunk to schedule beside a step's decodes when its GEMMs run in tiles), graded first on
operator times measured on A100s, then exactly.

Expected values come from the engine: chapter 5's accounting (step_cost) with the window's
(query, key) pairs counted on the engine's causal masks, step_cost's FLOPs and bytes for the
decode batches, and the A100 operator profiles (data/gpu-op-profiles, read with
minillm.sim.op_profiles' public loaders). The accounting module is switched off while the
learner's function runs, half the model shapes come as bare objects it refuses, and the
messages recognise the usual slips (1 FLOP per multiply-add, n*n causal pairs, KV heads
where query heads belong and the reverse, a window ignored or off by one, a chunk counted
from position 0, the LM head added, the KV read or write left out of a decode's bytes, a
decode's own key left out, one decode short of the ridge, a nearly full tile trimmed),
naming the term that differs and the learner's limit beside the engine's. Teacher-only
cases: _hidden/ch05.py.
"""
from __future__ import annotations

import math
import random
from fractions import Fraction
from types import SimpleNamespace

from ..attention import causal_mask
from ..config import PRESETS, ModelConfig
from ._common import call_text, checker, fail as _fail, learner_call, passed

__all__ = ["check_layer_flops", "check_decodes_to_ridge", "check_chunk_for_tiles"]

_ACCOUNTING = ("minillm.sim.accounting.step_cost", "minillm.sim.accounting.prefill_cost",
               "minillm.sim.accounting.prefill_flops", "minillm.sim.accounting.causal_pairs",
               "minillm.chunk_sizing.causal_pairs", "minillm.chunk_sizing.prefill_work",
               "minillm.sim.accounting.kv_write_bytes", "minillm.sim.cost_model.predict_step",
               "minillm.kv_cache.kv_bytes_per_token", "minillm.config.ModelConfig.kv_bytes_per_token")
_WHY = "count it from the shapes yourself (that is the exercise)."


def _random_configs(rng: random.Random, count: int = 6) -> list[ModelConfig]:
    """Real presets plus fresh random Llama shapes (GQA, odd sizes)."""
    configs = [PRESETS["llama-3-8b"], PRESETS["qwen3-0.6b"]]
    for _ in range(count):
        head_dim = rng.choice([32, 64, 128])
        num_kv_heads = rng.choice([1, 2, 4, 8])
        num_heads = num_kv_heads * rng.choice([1, 2, 4])
        configs.append(ModelConfig(
            name="random", vocab_size=rng.randint(100, 50000), hidden_size=rng.choice([256, 512, 768, 1024]),
            intermediate_size=rng.randint(300, 5000), num_layers=rng.randint(1, 40),
            num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim))
    return configs


def _bare(cfg: ModelConfig) -> SimpleNamespace:
    """The shape fields only: no methods, not a ModelConfig (accounting refuses it)."""
    fields = ("name", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
              "num_kv_heads", "head_dim", "q_size", "kv_size")
    return SimpleNamespace(**{f: getattr(cfg, f) for f in fields})


def _shape(cfg) -> str:
    return (f"{cfg.name} shape (hidden {cfg.hidden_size}, heads {cfg.num_heads}/{cfg.num_kv_heads}, "
            f"head_dim {cfg.head_dim}, intermediate {cfg.intermediate_size})")


# ---------------------------------------------------------------------------
# 1. A layer's FLOPs with a sliding window
# ---------------------------------------------------------------------------
def window_pairs_counted(n: int, c: int, window: int | None) -> int:
    """(query, key) pairs a chunk of n over c cached tokens attends to, counted on the engine's causal
    mask with the keys at least `window` positions behind each query taken out."""
    visible = causal_mask(n, c + n)
    if window is not None and c + n > window:
        visible = visible & ~_wide(causal_mask(n, c + n - window), c + n)
    return int(visible.sum())


def _wide(mask, k_len):
    import torch
    return torch.nn.functional.pad(mask, (0, k_len - mask.shape[1]), value=False)


def _engine_layer(cfg: ModelConfig, n: int, c: int) -> tuple[int, int]:
    """(GEMM FLOPs, attention FLOPs per (query, key) pair) of one layer, from the engine's step_cost."""
    from ..sim.accounting import step_cost
    cost = step_cost(cfg, [(n, c, False)])
    layer = {op: f // cfg.num_layers for op, (f, _) in cost.by_op.items()}
    return layer["qkv_proj"] + layer["o_proj"] + layer["mlp"], 4 * cfg.head_dim * cfg.num_heads


def expected_layer_flops(cfg: ModelConfig, n: int, c: int, window: int | None) -> int:
    gemm, per_pair = _engine_layer(cfg, n, c)
    return gemm + per_pair * window_pairs_counted(n, c, window)


def _flops_mistake(got, cfg, n: int, c: int, window=None) -> str:
    if not isinstance(got, int):
        return f"Return an int (FLOPs are counted exactly), not {type(got).__name__}. "
    gemm, per_pair = _engine_layer(cfg, n, c)
    pairs = window_pairs_counted(n, c, window)
    expected = gemm + per_pair * pairs
    d, q, kv = cfg.hidden_size, cfg.q_size, cfg.kv_size
    if window is not None and window < c + n:
        causal = window_pairs_counted(n, c, None)
        if got == gemm + per_pair * causal:
            return (f"That is the count without the window: a query sees at most window={window} keys, itself "
                    "included, cached or new, so queries far from the start attend to fewer keys than the "
                    "causal prefix. ")
        if got == gemm + per_pair * n * min(window, c + n):
            return ("You give every query the same number of keys: a query near the start of the sequence has "
                    "fewer than `window` keys before it. Count per query position. ")
        if got in (gemm + per_pair * window_pairs_counted(n, c, window + 1),
                   gemm + per_pair * window_pairs_counted(n, c, max(window - 1, 1))):
            return "Off by one at the window's edge: a query sees at most `window` keys INCLUDING its own. "
        if got == gemm + per_pair * (n * min(c, window) + n * (n + 1) // 2):
            return ("The window applies to every key a query sees, cached or new (the chunk's own keys too), "
                    "counted back from the query's position. ")
    else:
        if got == gemm + per_pair * n * (c + n):
            return ("You count n*(c+n) pairs: a new token sees the cache and the new tokens up to ITSELF, "
                    "n*c + n(n+1)/2 pairs. ")
    if c > 0 and got == gemm + per_pair * window_pairs_counted(n, 0, window):
        return (f"Your pairs are those of a chunk starting at position 0: the chunk's tokens sit at positions "
                f"c to c + n - 1 = {c} to {c + n - 1}, after the {c} cached ones. ")
    if got in (expected + 2 * n * d * cfg.vocab_size, expected + 2 * d * cfg.vocab_size):
        return "You add the LM head: the task counts one decoder layer, without the LM head. "
    own_key_out = sum(1 for p in range(c, c + n) if window is None or p < window)
    if got == expected - per_pair * own_key_out:
        return ("Each query also sees its own key: the query at position p sees p + 1 keys (at most `window` of "
                "them with a window, its own among them). ")
    if got * 2 == expected:
        return "You count 1 FLOP per multiply-add; a matmul [M, K] x [K, N] is 2*M*N*K. "
    if cfg.num_heads != cfg.num_kv_heads and got == gemm + 4 * cfg.head_dim * cfg.num_kv_heads * pairs:
        return ("Attention runs on every QUERY head (num_heads), not only the KV heads: grouped-query attention "
                "shares K and V, not the scores. ")
    if got == expected - 2 * n * d * cfg.intermediate_size:
        return "The MLP has gate AND up projections (2 * intermediate outputs) before down. "
    if got == expected - 2 * n * q * d:
        return "The output projection (q_size -> hidden) is missing. "
    if q != kv and got == expected + 4 * n * d * (q - kv):
        return ("K and V project to kv_size (num_kv_heads * head_dim), not q_size: grouped-query "
                "attention. ")
    if got == expected - per_pair * pairs // 2:
        return ("Attention is 2*head_dim FLOPs per pair and head for the scores AND as much again for the "
                "weighted values. ")
    return ""


def _flops_cases(rng: random.Random):
    """(cfg, n, c, window): the window cases first (the chapter's sketch has no window), full
    causal ones after. Windows are shorter than the context, longer, and in between."""
    configs = _random_configs(rng)
    cases = [(PRESETS["mistral-7b"], 512, 4000, 4096),       # the chunk crosses the window's edge
             (PRESETS["llama-3-8b"], 256, 8192, 4096),       # every query sees a full window
             (PRESETS["qwen3-0.6b"], 64, 0, 16)]             # a fresh prompt longer than its window
    for cfg in configs:
        n, c = rng.randint(1, 2048), rng.choice([0, rng.randint(1, 4096)])
        window = rng.choice([rng.randint(1, 64), rng.randint(1, c + n), rng.randint(c + n, c + n + 100)])
        cases.append((cfg, n, c, window))
    for cfg in configs:
        cases.append((cfg, rng.randint(1, 2048), rng.choice([0, rng.randint(1, 4096)]), None))
    return cases


@checker
def check_layer_flops(fn, seed: int | None = None):
    """fn(cfg, num_new_tokens, num_cached_tokens, window=None) -> FLOPs of ONE decoder layer (no LM head),
    each query attending to at most `window` keys (itself included); window=None: full causal attention."""
    rng = random.Random(seed)
    cases = _flops_cases(rng)
    for i, (cfg, n, c, window) in enumerate(cases):
        expected = expected_layer_flops(cfg, n, c, window)
        args = (cfg if i % 2 == 0 else _bare(cfg), n, c) + (() if window is None else (window,))
        got = learner_call(fn, *args, forbidden=_ACCOUNTING, why=_WHY)
        if got != expected:
            _fail(f"{_flops_mistake(got, cfg, n, c, window)}{call_text(fn, *args)} with the {_shape(cfg)} "
                  f"returned {got!r}, expected {expected:,}. Remember: 2*M*N*K per matmul, fused q/k/v, gate+up, and "
                  "4*head_dim FLOPs per (query, key) pair and query head.")
    return passed(f"check_layer_flops: correct on {len(cases)} layers, with and without a sliding window")


# ---------------------------------------------------------------------------
# 2. Predict, then measure: how many decodes reach the ridge point?
# ---------------------------------------------------------------------------
def decode_batch_terms(cfg: ModelConfig, context_len: int, dtype_bytes: int = 2,
                       lm_head: bool = True, kv_read: bool = True) -> tuple[int, int, int]:
    """(FLOPs per decode, bytes read once per step, bytes per decode) of B decodes over context_len
    cached tokens, from the engine's step_cost (activations left out). Both FLOPs and bytes are affine
    in B (checked on three batch sizes); lm_head=False / kv_read=False drop those terms (mistakes)."""
    from ..sim.accounting import step_cost
    costs = [step_cost(cfg, [(1, context_len)] * b, dtype_bytes) for b in (1, 2, 3)]
    total = [s.bytes_weights + (s.bytes_kv_read if kv_read else 0) + s.bytes_kv_write
             - (0 if lm_head else cfg.hidden_size * cfg.vocab_size * dtype_bytes) for s in costs]
    flops = [s.flops - (0 if lm_head else s.by_op["lm_head"][0]) for s in costs]
    per_decode, per_step = total[1] - total[0], 2 * total[0] - total[1]
    assert flops[1] == 2 * flops[0] and flops[2] == 3 * flops[0] and total[2] - total[1] == per_decode, \
        "step_cost is no longer affine in the number of decodes"
    return flops[0], per_step, per_decode


def intensity(terms: tuple[int, int, int], batch: int) -> Fraction:
    flops, per_step, per_decode = terms
    return Fraction(flops * batch, per_step + per_decode * batch)


def smallest_batch(terms: tuple[int, int, int], ridge_point: float, largest: int = 10**12) -> int | None:
    """The smallest batch whose intensity reaches ridge_point (intensity grows with the batch), by
    bisection; None if even `largest` decodes do not reach it."""
    ridge = Fraction(ridge_point)
    if intensity(terms, largest) < ridge:
        return None
    low, high = 1, largest
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if intensity(terms, middle) < ridge else (low, middle)
    return low


def _digits(a: float, b: float) -> tuple[str, str]:
    """a and b with as many decimals as it takes for them to read differently (at most 12)."""
    for decimals in range(2, 13):
        shown = f"{a:,.{decimals}f}", f"{b:,.{decimals}f}"
        if shown[0] != shown[1]:
            return shown
    return shown


def _limit(terms) -> float:
    """What a step's intensity approaches as its decodes grow: FLOPs per decode over bytes per decode."""
    flops, _, per_decode = terms
    return flops / per_decode if per_decode else float("inf")


def _ridge_variants(cfg, context_len: int, dtype_bytes: int, terms) -> list[tuple[tuple, str]]:
    """(terms, what the mistake is): the usual slips, each the engine's terms with one thing changed."""
    from ..sim.accounting import step_cost
    flops, per_step, per_decode = terms
    one = step_cost(cfg, [(1, context_len)], dtype_bytes)
    attention = one.by_op["attn_scores"][0] + one.by_op["attn_values"][0]     # all layers, one decode
    per_key = attention // (context_len + 1)
    embedding = cfg.hidden_size * cfg.vocab_size * dtype_bytes
    kv_heads = attention * cfg.num_kv_heads // cfg.num_heads
    return [
        (decode_batch_terms(cfg, context_len, dtype_bytes, kv_read=False),
         "you leave out the KV cache each decode reads (its whole context, every step)"),
        ((flops, per_step, per_decode - one.bytes_kv_write),
         "you leave out the K and V each decode writes (its new token's, in every layer): your bytes per decode "
         "are short by that much"),
        ((flops - per_key, per_step, per_decode),
         f"your per-decode FLOPs are short by one key's attention in every layer: a decode attends to its "
         f"{context_len} cached keys AND its own, {context_len + 1} keys"),
        ((flops - attention + kv_heads, per_step, per_decode),
         "your attention FLOPs count the KV heads: every QUERY head scores the keys (grouped-query attention "
         "shares K and V, not the scores)"),
        ((flops, per_step + embedding, per_decode),
         "you read the input embedding too: a step gathers one row of it per token, it does not stream the "
         "matrix (only the LM head's copy is read whole)"),
        (decode_batch_terms(cfg, context_len, dtype_bytes, lm_head=False),
         "you leave out the LM head: its weights are read once per step, its FLOPs paid per decode"),
        (decode_batch_terms(cfg.replace(num_kv_heads=cfg.num_heads), context_len, dtype_bytes),
         "you count the query heads in the KV cache: only the KV heads are cached"),
    ]


def _ridge_mistake(got, cfg, context_len, ridge_point, dtype_bytes, want) -> str:
    """The mistake, named by the term that differs, with the learner's limit beside the engine's."""
    terms = decode_batch_terms(cfg, context_len, dtype_bytes)
    flops, _, per_decode = terms
    limit = _limit(terms)
    ridge = Fraction(ridge_point)
    variants = [(variant, what) for variant, what in _ridge_variants(cfg, context_len, dtype_bytes, terms)
                if variant != terms]
    if want is not None and got is None:        # a term that pulls the limit under the ridge, or a search cut short
        engine, ridge_shown = _digits(limit, ridge_point)
        message = (f"{want:,} decodes reach it: as the batch grows the intensity approaches {engine} FLOP/byte, "
                   f"above the ridge point {ridge_shown} (a search that stops before {want:,} decodes finds none)")
        for variant, what in variants:
            if smallest_batch(variant, ridge_point) is None:
                yours, engine = _digits(_limit(variant), limit)
                return message + f"; if your count's limit is {yours} FLOP/byte, not {engine}: {what}"
        return message
    for variant, what in variants:
        if got == smallest_batch(variant, ridge_point):
            if _limit(variant) == limit:          # only the bytes paid once per step differ
                return what
            yours, engine = _digits(_limit(variant), limit)
            return (f"{what} (as the batch grows, your count's intensity approaches {yours} FLOP/byte, the "
                    f"engine's {engine}; the ridge point is {float(ridge_point):g})")
    if want is None and got is not None:
        engine, ridge_shown = _digits(limit, ridge_point)
        return (f"no batch reaches it: each decode adds {flops:,} FLOPs and {per_decode:,} bytes (its weights' "
                f"share is fixed, but it reads its {context_len}-token cache), so the intensity only approaches "
                f"{engine} FLOP/byte however many decodes share the step, under the ridge point {ridge_shown}")
    if isinstance(got, int) and want is not None and 0 < got < want:
        at, ridge_shown = _digits(float(intensity(terms, got)), ridge_point)
        return f"at {got:,} decodes the intensity is {at}, still under the ridge point {ridge_shown}"
    if isinstance(got, int) and want is not None and got > want and intensity(terms, got - 1) >= ridge:
        at, ridge_shown = _digits(float(intensity(terms, got - 1)), ridge_point)
        return (f"{got - 1:,} decodes already reach {at} FLOP/byte, at or above the ridge point {ridge_shown}: "
                "yours is not the smallest number that reaches it")
    return ""


def _close_enough(got, want) -> bool:
    """The answer reaches the ridge point (never fewer decodes than the smallest that does) and is at most
    1% (or one decode) more."""
    if got is None or want is None:
        return got is None and want is None
    return isinstance(got, int) and not isinstance(got, bool) and want <= got <= want + max(1, want // 100)


def _ridge_cases(rng: random.Random):
    from ..sim.hardware import PROFILES
    a100, h100 = PROFILES["A100-80GB"].ridge_point, PROFILES["H100-SXM"].ridge_point
    cases = [(PRESETS["llama-3-8b"], 128, a100, 2), (PRESETS["llama-3-8b"], 1024, a100, 2),
             (PRESETS["llama-2-7b"], 512, a100, 2), (PRESETS["llama-3-8b"], 512, h100, 2),
             (PRESETS["qwen3-0.6b"], 128, 20.0, 2), (PRESETS["mistral-7b"], 4096, 20.0, 2),
             (PRESETS["llama-3-8b"], 767, 153.1, 2)]           # just under the limit: millions of decodes
    for cfg in _random_configs(rng, 4)[2:]:
        cases.append((cfg, rng.choice([0, rng.randint(1, 4096)]), rng.choice([a100, h100, 20.0, 60.0]),
                      rng.choice([1, 2, 4])))
    return cases


@checker
def check_decodes_to_ridge(fn, seed: int | None = None):
    """fn(cfg, context_len, ridge_point, dtype_bytes=2) -> the smallest number of decodes, each over
    context_len cached tokens, whose step reaches ridge_point FLOPs per byte (chapter 5's counts: FLOPs over
    weight, KV-read and KV-write bytes), or None if no number of decodes does. Measured with step_cost; the
    answer must reach the ridge point and may be 1% (or one decode) more than the smallest."""
    rng = random.Random(seed)
    cases = _ridge_cases(rng)
    for i, (cfg, context_len, ridge_point, dtype_bytes) in enumerate(cases):
        want = smallest_batch(decode_batch_terms(cfg, context_len, dtype_bytes), ridge_point)
        args = (cfg if i % 2 == 0 else _bare(cfg), context_len, ridge_point) + \
            (() if dtype_bytes == 2 else (dtype_bytes,))
        got = learner_call(fn, *args, forbidden=_ACCOUNTING, why=_WHY)
        if isinstance(got, float) and got.is_integer():
            got = int(got)
        if not _close_enough(got, want):
            mistake = _ridge_mistake(got, cfg, context_len, ridge_point, dtype_bytes, want)
            _fail(f"{call_text(fn, *args)} with the {_shape(cfg)}: you predicted {got!r}, the engine's counts give "
                  f"{want!r}{': ' + mistake if mistake else ''}")
    return passed(f"check_decodes_to_ridge: your predictions match step_cost on {len(cases)} models, contexts "
                  "and GPUs")


# ---------------------------------------------------------------------------
# 3. Design: the chunk for a tiled GEMM, graded against measured A100 operator times
# ---------------------------------------------------------------------------
_LINEAR = ("qkv_proj", "o_proj", "mlp_gate_up_proj", "mlp_down_proj")
A100_TILE_ROWS = 128          # where the shipped A100 timings jump: 128 -> 136 rows, 256 -> 264, ...
MEASURED_GAIN = 1.03          # the least gain in prefill tokens per ms the chosen chunks must show


def _a100_linear_ms() -> dict:
    """{model: {rows: ms}}: one layer's four linear operators, summed, as measured on an A100."""
    from ..sim import op_profiles            # on first use: reads the CSVs (a few ms)
    tables = {}
    for path in op_profiles.profile_paths():
        profile = op_profiles.load_gpu_op_profile(path)
        if profile.gpu != "a100":
            continue
        tables[profile.cfg.name] = {rows: 1e3 * sum(profile.times_s[op][i] for op in _LINEAR)
                                    for i, rows in enumerate(profile.num_tokens)}
    return tables


def tokens_per_tile(chunk: int, num_decodes: int, tile_rows: int) -> Fraction:
    """Prefill tokens carried per GEMM tile when the step's rows are the chunk and the decodes."""
    return Fraction(chunk, -(-(chunk + num_decodes) // tile_rows))


def _better_chunk(got: int, num_decodes: int, chunk_size: int, tile_rows: int) -> int | None:
    """A chunk <= chunk_size that carries more prefill tokens per tile than `got` (or as many and is
    larger), if there is one: the first found from the largest down."""
    mine = tokens_per_tile(got, num_decodes, tile_rows)
    for other in range(chunk_size, 0, -1):
        theirs = tokens_per_tile(other, num_decodes, tile_rows)
        if theirs > mine or (theirs == mine and other > got):
            return other
    return None


def _tile_hint(got, num_decodes: int, chunk_size: int, tile_rows: int) -> str:
    if not isinstance(got, int) or isinstance(got, bool):
        return ""
    if got > chunk_size:
        return f"Your chunk is over chunk_size ({chunk_size}): trim, never grow. "
    if got == chunk_size and (got + num_decodes) % tile_rows and num_decodes:
        return ("You keep the whole chunk: with the decodes its rows spill past a tile boundary, and that last, "
                "nearly empty tile costs a whole one. ")
    if got == chunk_size // tile_rows * tile_rows and (got + num_decodes) % tile_rows:
        return "You rounded the chunk to the tile; the GEMM's rows are the chunk PLUS the decodes. "
    if got == chunk_size - num_decodes and num_decodes:
        return ("You take every decode's row out of the chunk; only the rows that spill past the last whole tile "
                "need to go. ")
    if (got + num_decodes) % tile_rows == 0 and tokens_per_tile(chunk_size, num_decodes, tile_rows) > \
            tokens_per_tile(got, num_decodes, tile_rows):
        return ("You trim to whole tiles, but here the last tile is nearly full: trimming it away costs more "
                "prefill tokens than the part of a tile it saves. ")
    return ""


@checker
def check_chunk_for_tiles(fn, seed: int | None = None):
    """fn(num_decodes, chunk_size, tile_rows) -> the chunk to schedule beside num_decodes decodes.

    First measured: on every A100 file, with 8-32 decodes and chunks of 256-512, the learner's
    step must carry its prefill tokens at least 3% cheaper per millisecond than the untrimmed
    chunk (the times are Vidur's measured per-layer linear operators). Then on random decode
    counts, chunk sizes and tiles: no chunk up to chunk_size may carry more prefill tokens per
    tile (a partial tile costs a whole one), and among equals the largest is taken.
    """
    rng = random.Random(seed)
    measured_gains = []
    for model, ms in sorted(_a100_linear_ms().items()):
        for num_decodes in (8, 16, 24, 32):
            for chunk_size in (256, 384, 512):
                got = learner_call(fn, num_decodes, chunk_size, A100_TILE_ROWS, forbidden=_ACCOUNTING, why=_WHY)
                call = call_text(fn, num_decodes, chunk_size, A100_TILE_ROWS)
                if not isinstance(got, int) or not 0 < got <= chunk_size or (num_decodes + got) not in ms:
                    _fail(f"{_tile_hint(got, num_decodes, chunk_size, A100_TILE_ROWS)}{call} returned {got!r}: "
                          f"return a chunk size, an int from 1 to chunk_size ({chunk_size}) tokens")
                untrimmed = chunk_size / ms[num_decodes + chunk_size]
                yours = got / ms[num_decodes + got]
                if yours < MEASURED_GAIN * untrimmed:
                    rows = num_decodes + got
                    hint = _tile_hint(got, num_decodes, chunk_size, A100_TILE_ROWS)
                    _fail(f"{hint}{call} = {got}: measured on an A100 ({model}, one layer's linear operators), "
                          f"your step's {rows} rows take {ms[rows]:.3f} ms, {yours:.0f} prefill tokens per ms; "
                          f"the untrimmed chunk's {num_decodes + chunk_size} rows take "
                          f"{ms[num_decodes + chunk_size]:.3f} ms, {untrimmed:.0f} per ms. A step that spills a "
                          "few rows into a new tile pays the whole tile: which rows does the GEMM see?")
                measured_gains.append(yours / untrimmed)
    # a nearly full last tile (trimming it loses more than it saves), none at all, decodes alone past a tile
    cases = [(8, 503, 128), (0, 512, 128), (8, 512, 128), (130, 512, 128), (40, 1000, 64), (300, 256, 128),
             (7, 100, 16)]
    cases += [(rng.randint(0, 300), rng.randint(256, 4096), rng.choice([16, 32, 64, 128, 256])) for _ in range(40)]
    for num_decodes, chunk_size, tile_rows in cases:
        got = learner_call(fn, num_decodes, chunk_size, tile_rows, forbidden=_ACCOUNTING, why=_WHY)
        call = call_text(fn, num_decodes, chunk_size, tile_rows)
        if not isinstance(got, int) or isinstance(got, bool) or not 0 < got <= chunk_size:
            _fail(f"{_tile_hint(got, num_decodes, chunk_size, tile_rows)}{call} returned {got!r}: return a chunk "
                  f"size, an int from 1 to chunk_size ({chunk_size})")
        better = _better_chunk(got, num_decodes, chunk_size, tile_rows)
        if better is not None:
            hint = _tile_hint(got, num_decodes, chunk_size, tile_rows)
            mine, theirs = (float(tokens_per_tile(c, num_decodes, tile_rows)) for c in (got, better))
            _fail(f"{hint}{call} returned {got} ({mine:.2f} prefill tokens per tile of {tile_rows} rows), but a chunk of "
                  f"{better} carries {theirs:.2f}{' (as many, and it is larger)' if mine == theirs else ''}: the "
                  "step's rows are the chunk and the decodes, and a partial tile costs a whole one")
    gains = sorted(measured_gains)
    return passed(f"check_chunk_for_tiles: measured on {len(gains)} A100 steps, your chunks carry "
                  f"{gains[0] - 1:.0%} to {gains[-1] - 1:.0%} more prefill tokens per ms than the untrimmed "
                  f"ones (median {gains[len(gains) // 2] - 1:.0%}); the best per tile on {len(cases)} more cases")
