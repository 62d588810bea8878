"""Checkers for exercises/05_flops_and_io: FLOPs and bytes, counted by the learner.

The accounting module is switched off while the learner's function runs (the
answer to every task here is some part of accounting.step_cost), the expected
numbers come from _reference/ch05 (held equal to step_cost by the tests), half
the model shapes are bare objects the engine's helpers refuse, and the
messages recognise the usual slips (1 FLOP per multiply-add, n*n causal pairs,
query heads where KV heads belong, K without V, a window ignored).

Two tasks go past what chapter 5 prints: the FLOPs of a layer whose attention
has a sliding window (the chapter's sketch counts full causal attention), and
the GEMM tile rule, graded first against operator times measured on A100s
(data/gpu-op-profiles, read with minillm.sim.op_profiles' public loaders, not
the cost model's fitted factors), then on exact cases.
"""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

from ..config import PRESETS, ModelConfig
from ._common import fail as _fail, learner_call, passed, call_text, checker
from ._reference import ch05 as _ref

__all__ = ["check_layer_flops", "check_kv_bytes_per_token", "check_step_traffic", "check_tile_aligned_chunk"]

_ACCOUNTING = ("minillm.sim.accounting.step_cost", "minillm.sim.accounting.prefill_cost",
               "minillm.sim.accounting.prefill_flops", "minillm.sim.accounting.causal_pairs",
               "minillm.chunk_sizing.causal_pairs", "minillm.chunk_sizing.prefill_work",
               "minillm.sim.accounting.kv_write_bytes", "minillm.sim.cost_model.predict_step",
               "minillm.kv_cache.kv_bytes_per_token", "minillm.config.ModelConfig.kv_bytes_per_token",
               "minillm.grading._reference.ch05.layer_flops", "minillm.grading._reference.ch05.step_traffic",
               "minillm.grading._reference.ch05.kv_bytes_per_token",
               "minillm.grading._reference.ch05.window_layer_flops", "minillm.grading._reference.ch05.window_pairs",
               "minillm.grading._reference.ch05.tile_aligned_chunk")
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


def _flops_mistake(got, cfg, n: int, c: int, window=None) -> str:
    if not isinstance(got, int):
        return f"Return an int (FLOPs are counted exactly), not {type(got).__name__}. "
    expected = _ref.window_layer_flops(cfg, n, c, window)
    per_pair = 4 * cfg.head_dim * cfg.num_heads
    attention = per_pair * _ref.window_pairs(n, c, window)
    gemm = expected - attention
    if window is not None and window < c + n:
        if got == _ref.layer_flops(cfg, n, c):
            return (f"That is the count without the window: a query sees at most window={window} keys, itself "
                    "included, cached or new, so queries far from the start attend to fewer keys than the "
                    "causal prefix. ")
        if got == gemm + per_pair * n * min(window, c + n):
            return ("You give every query the same number of keys: a query near the start of the sequence has "
                    "fewer than `window` keys before it. Count per query position. ")
        if got in (gemm + per_pair * _ref.window_pairs(n, c, window + 1),
                   gemm + per_pair * _ref.window_pairs(n, c, max(window - 1, 1))):
            return "Off by one at the window's edge: a query sees at most `window` keys INCLUDING its own. "
        if got == gemm + per_pair * (n * min(c, window) + n * (n + 1) // 2):
            return ("The window applies to every key a query sees, cached or new (the chunk's own keys too), "
                    "counted back from the query's position. ")
        if got * 2 == expected:
            return "You count 1 FLOP per multiply-add; a matmul [M, K] x [K, N] is 2*M*N*K. "
        return ""
    if got * 2 == expected:
        return "You count 1 FLOP per multiply-add; a matmul [M, K] x [K, N] is 2*M*N*K. "
    if got == gemm:
        return "The attention FLOPs (scores and values over the causal pairs) are missing. "
    if got == gemm + 4 * n * (c + n) * cfg.head_dim * cfg.num_heads:
        return ("You count n*(c+n) pairs: a new token sees the cache and the new tokens up to ITSELF, "
                "n*c + n(n+1)/2 pairs. ")
    if got == gemm + 4 * (n * c + n * (n + 1) // 2) * cfg.head_dim * cfg.num_kv_heads:
        return "Attention runs on every QUERY head (num_heads), not only the KV heads. "
    if got == expected - 2 * n * cfg.hidden_size * cfg.intermediate_size:
        return "The MLP has gate AND up projections (2 * intermediate outputs) before down. "
    d, q, kv = cfg.hidden_size, cfg.q_size, cfg.kv_size
    if got == expected - 2 * n * q * d:
        return "The output projection (q_size -> hidden) is missing. "
    if q != kv and got == expected + 4 * n * d * (q - kv):
        return ("K and V project to kv_size (num_kv_heads * head_dim), not q_size: grouped-query "
                "attention. ")
    if got == expected - attention // 2:
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
        expected = _ref.window_layer_flops(cfg, n, c, window)
        args = (cfg if i % 2 == 0 else _bare(cfg), n, c) + (() if window is None else (window,))
        got = learner_call(fn, *args, forbidden=_ACCOUNTING, why=_WHY)
        if got != expected:
            _fail(f"{_flops_mistake(got, cfg, n, c, window)}{call_text(fn, *args)} with the {_shape(cfg)} "
                  f"returned {got!r}, expected {expected:,}. Remember: 2*M*N*K per matmul, fused q/k/v, gate+up, and "
                  "4*head_dim FLOPs per (query, key) pair and query head.")
    return passed(f"check_layer_flops: correct on {len(cases)} layers, with and without a sliding window")


@checker
def check_kv_bytes_per_token(fn, seed: int | None = None):
    """fn(cfg, dtype_bytes) -> bytes of K and V one token adds to the cache (all layers)."""
    rng = random.Random(seed)
    configs = _random_configs(rng)
    for i, cfg in enumerate(configs):
        dtype_bytes = rng.choice([1, 2, 4])
        expected = _ref.kv_bytes_per_token(cfg, dtype_bytes)
        got = learner_call(fn, cfg if i % 2 == 0 else _bare(cfg), dtype_bytes, forbidden=_ACCOUNTING, why=_WHY)
        if got != expected:
            hint = "K and V, every layer, only the KV heads (not the query heads)."
            if got == expected // 2:
                hint = "You count K only: V takes as much again."
            elif got == expected // cfg.num_kv_heads * cfg.num_heads:
                hint = "You count the query heads: only the KV heads are cached (grouped-query attention)."
            elif got == expected // cfg.num_layers:
                hint = "That is one layer: every layer caches its own K and V."
            _fail(f"{cfg.name} (layers {cfg.num_layers}, kv heads {cfg.num_kv_heads}, head_dim "
                  f"{cfg.head_dim}), dtype_bytes={dtype_bytes}: you return {got!r}, expected {expected:,}. {hint}")
    return passed("check_kv_bytes_per_token: correct")


_TRAFFIC_KEYS = ("flops", "bytes_weights", "bytes_kv_read", "bytes_kv_write", "intensity")


def _traffic_hint(key: str, got, expected: dict, requests, cfg) -> str:
    num_sampled = sum(1 for r in requests if len(r) == 2 or r[2])
    head_flops = 2 * num_sampled * cfg.hidden_size * cfg.vocab_size
    if key == "flops" and got == expected["flops"] - head_flops:
        return "The LM head is missing: 2 * d * vocab FLOPs for each request that samples"
    if key == "flops" and got == expected["flops"] + 2 * (len(requests) - num_sampled) * cfg.hidden_size \
            * cfg.vocab_size:
        return "A middle chunk (samples=False) computes no logits: only sampling requests pay the LM head"
    if key == "flops":
        return ("layers x your layer_flops per request, plus the LM head 2*d*vocab for each request that "
                "samples (a decode, or a prompt's last chunk: samples=True)")
    if key == "bytes_weights":
        return ("every weight once per step, however many tokens: the layers' q/k/v, o, gate+up and down "
                "matrices, plus the LM head (d x vocab) if any request samples")
    if key == "bytes_kv_read":
        return "each request reads the K and V of its cached tokens once: sum of num_cached x KV bytes per token"
    if key == "bytes_kv_write":
        return "each new token writes its K and V: sum of num_new x KV bytes per token"
    return "flops / (bytes_weights + bytes_kv_read + bytes_kv_write)"


@checker
def check_step_traffic(fn, seed: int | None = None):
    """fn(cfg, requests, dtype_bytes) -> dict of flops, bytes_weights, bytes_kv_read, bytes_kv_write, intensity."""
    rng = random.Random(seed)
    for i, cfg in enumerate(_random_configs(rng)):
        requests = [(1, rng.randint(0, 4000)) for _ in range(rng.randint(0, 32))]
        requests.append((rng.randint(1, 1024), rng.randint(0, 2048), rng.random() < 0.5))
        if i == 0:       # a step whose only request is a middle chunk: no LM head at all
            requests = [(512, 1024, False)]
        dtype_bytes = rng.choice([1, 2, 4])
        expected = _ref.step_traffic(cfg, requests, dtype_bytes)
        got = learner_call(fn, cfg if i % 2 == 0 else _bare(cfg), list(requests), dtype_bytes,
                           forbidden=_ACCOUNTING, why=_WHY)
        if not isinstance(got, dict) or not set(_TRAFFIC_KEYS) <= set(got):
            _fail(f"return a dict with the keys {list(_TRAFFIC_KEYS)}; you returned {got!r}")
        where = f"{_shape(cfg)}, {len(requests)} requests (last {requests[-1]}), dtype_bytes={dtype_bytes}"
        for key in _TRAFFIC_KEYS:
            ok = math.isclose(got[key], expected[key], rel_tol=1e-12) if key == "intensity" \
                else got[key] == expected[key]
            if not ok:
                _fail(f"{key}: you return {got[key]!r}, expected {expected[key]:,} for {where}. "
                      f"{_traffic_hint(key, got[key], expected, requests, cfg)}.")
    return passed("check_step_traffic: FLOPs, weight and KV bytes and the intensity all correct")


# ---------------------------------------------------------------------------
# 4. The GEMM tile rule, graded against measured A100 operator times
# ---------------------------------------------------------------------------
_LINEAR = ("qkv_proj", "o_proj", "mlp_gate_up_proj", "mlp_down_proj")
A100_TILE_ROWS = 128          # where the shipped A100 timings jump: 128 -> 136 rows, 256 -> 264, ...
MEASURED_GAIN = 1.03          # the least gain in prefill tokens per ms a tile-aligned step must show


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


def _tile_hint(got, num_decodes: int, chunk_size: int, tile_rows: int) -> str:
    expected = _ref.tile_aligned_chunk(num_decodes, chunk_size, tile_rows)
    if not isinstance(got, int) or isinstance(got, bool) or got == expected:
        return ""
    if got > chunk_size:
        return f"Your chunk is over chunk_size ({chunk_size}): trim, never grow. "
    if got == chunk_size // tile_rows * tile_rows:
        return "You rounded the chunk to the tile; it is the chunk PLUS the decodes that fills the tiles. "
    if got == chunk_size - num_decodes:
        return ("You take every decode's row out of the chunk; only the rows that spill past the last whole tile "
                "need to go. ")
    if (got + num_decodes) % tile_rows == 0 and got < expected:
        return "Your step is a whole number of tiles, but not the largest one that chunk_size allows. "
    return ""


@checker
def check_tile_aligned_chunk(fn, seed: int | None = None):
    """fn(num_decodes, chunk_size, tile_rows) -> the chunk to schedule beside num_decodes decodes.

    First measured: on every A100 file, with 8-32 decodes and chunks of 256-512, the learner's
    step must carry its prefill tokens at least 3% cheaper per millisecond than the untrimmed
    chunk (the times are Vidur's measured per-layer linear operators). Then exact, on random
    decode counts, chunk sizes and tiles.
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
    cases = [(0, 512, 128), (8, 512, 128), (130, 512, 128), (40, 1000, 64), (300, 256, 128), (7, 100, 16)]
    cases += [(rng.randint(0, 300), rng.randint(256, 4096), rng.choice([16, 32, 64, 128, 256])) for _ in range(40)]
    for num_decodes, chunk_size, tile_rows in cases:
        expected = _ref.tile_aligned_chunk(num_decodes, chunk_size, tile_rows)
        got = learner_call(fn, num_decodes, chunk_size, tile_rows, forbidden=_ACCOUNTING, why=_WHY)
        if got != expected:
            call = call_text(fn, num_decodes, chunk_size, tile_rows)
            hint = _tile_hint(got, num_decodes, chunk_size, tile_rows)
            _fail(f"{hint}{call} returned {got!r}, expected {expected}: the step's rows, chunk + decodes, "
                  "should end on a tile boundary, with the chunk as large as chunk_size allows.")
    gains = sorted(measured_gains)
    return passed(f"check_tile_aligned_chunk: measured on {len(gains)} A100 steps, your chunks carry "
                  f"{gains[0] - 1:.0%} to {gains[-1] - 1:.0%} more prefill tokens per ms than the untrimmed "
                  f"ones (median {gains[len(gains) // 2] - 1:.0%}); exact on {len(cases)} more cases")
