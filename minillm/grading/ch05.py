"""Checkers for exercises/05_flops_and_io: FLOPs and bytes, counted by the learner.

The accounting module is switched off while the learner's function runs (the
answer to every task here is some part of accounting.step_cost), the expected
numbers come from _reference/ch05 (held equal to step_cost by the tests), half
the model shapes are bare objects the engine's helpers refuse, and the
messages recognise the usual slips (1 FLOP per multiply-add, n*n causal pairs,
query heads where KV heads belong, K without V).
"""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

from ..config import PRESETS, ModelConfig
from ._common import fail as _fail, learner_call, passed
from ._reference import ch05 as _ref

__all__ = ["check_layer_flops", "check_kv_bytes_per_token", "check_step_traffic"]

_ACCOUNTING = ("minillm.sim.accounting.step_cost", "minillm.sim.accounting.prefill_cost",
               "minillm.sim.accounting.prefill_flops", "minillm.sim.accounting.causal_pairs",
               "minillm.chunk_sizing.causal_pairs", "minillm.chunk_sizing.prefill_work",
               "minillm.sim.accounting.kv_write_bytes", "minillm.sim.cost_model.predict_step",
               "minillm.kv_cache.kv_bytes_per_token", "minillm.config.ModelConfig.kv_bytes_per_token",
               "minillm.grading._reference.ch05.layer_flops", "minillm.grading._reference.ch05.step_traffic",
               "minillm.grading._reference.ch05.kv_bytes_per_token")
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


def _flops_mistake(got, cfg, n: int, c: int) -> str:
    if not isinstance(got, int):
        return f"Return an int (FLOPs are counted exactly), not {type(got).__name__}. "
    expected = _ref.layer_flops(cfg, n, c)
    attention = 4 * (n * c + n * (n + 1) // 2) * cfg.head_dim * cfg.num_heads
    gemm = expected - attention
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


def check_layer_flops(fn, seed: int | None = None):
    """fn(cfg, num_new_tokens, num_cached_tokens) -> FLOPs of ONE decoder layer (no LM head)."""
    rng = random.Random(seed)
    configs = _random_configs(rng)
    for i, cfg in enumerate(configs):
        n, c = rng.randint(1, 2048), rng.choice([0, rng.randint(1, 4096)])
        expected = _ref.layer_flops(cfg, n, c)
        got = learner_call(fn, cfg if i % 2 == 0 else _bare(cfg), n, c, forbidden=_ACCOUNTING, why=_WHY)
        if got != expected:
            _fail(f"{_flops_mistake(got, cfg, n, c)}{_shape(cfg)}, n={n}, c={c}: you return {got!r}, "
                  f"expected {expected:,}. Remember: 2*M*N*K per matmul, fused q/k/v, gate+up, and "
                  "n*c + n(n+1)/2 causal pairs.")
    return passed(f"check_layer_flops: correct on {len(configs)} model shapes")


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
