"""Checkers for exercises/05_flops_and_io: compare the learner's function with the engine."""
from __future__ import annotations

import random

from ..sim.accounting import step_cost
from ..config import PRESETS, ModelConfig

__all__ = ["check_layer_flops", "check_kv_bytes_per_token", "check_step_intensity"]


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


def _fail(message: str):
    print("Not yet: " + message)
    raise AssertionError(message)


def check_layer_flops(fn, seed: int | None = None):
    """fn(cfg, num_new_tokens, num_cached_tokens) -> FLOPs of ONE decoder layer (no LM head)."""
    rng = random.Random(seed)
    for cfg in _random_configs(rng):
        n, c = rng.randint(1, 2048), rng.choice([0, rng.randint(1, 4096)])
        cost = step_cost(cfg, [(n, c, False)])
        expected = cost.flops // cfg.num_layers
        got = fn(cfg, n, c)
        if got != expected:
            parts = {op: f // cfg.num_layers for op, (f, _) in cost.by_op.items() if op != "lm_head"}
            _fail(f"{cfg.name} shape (hidden {cfg.hidden_size}, heads {cfg.num_heads}/{cfg.num_kv_heads}, "
                  f"head_dim {cfg.head_dim}, intermediate {cfg.intermediate_size}), n={n}, c={c}: "
                  f"you return {got!r}, the engine counts {expected:,} = {parts}. "
                  "Remember: 2*M*N*K per matmul, fused q/k/v, gate+up, and n*c + n(n+1)/2 causal pairs.")
    print("check_layer_flops: correct on", len(_random_configs(random.Random(0))), "model shapes")


def check_kv_bytes_per_token(fn, seed: int | None = None):
    """fn(cfg, dtype_bytes) -> bytes of K and V one token adds to the cache (all layers)."""
    rng = random.Random(seed)
    for cfg in _random_configs(rng):
        dtype_bytes = rng.choice([1, 2, 4])
        expected = cfg.kv_bytes_per_token(dtype_bytes)
        got = fn(cfg, dtype_bytes)
        if got != expected:
            _fail(f"{cfg.name} (layers {cfg.num_layers}, kv heads {cfg.num_kv_heads}, head_dim "
                  f"{cfg.head_dim}), dtype_bytes={dtype_bytes}: you return {got!r}, expected {expected:,}. "
                  "K and V, every layer, only the KV heads (not the query heads).")
    print("check_kv_bytes_per_token: correct")


def check_step_intensity(fn, seed: int | None = None):
    """fn(cfg, requests, dtype_bytes) -> FLOPs per byte of the step, as accounting.step_cost counts them."""
    rng = random.Random(seed)
    for cfg in _random_configs(rng):
        requests = [(1, rng.randint(0, 4000)) for _ in range(rng.randint(0, 32))]
        requests.append((rng.randint(1, 1024), rng.randint(0, 2048), rng.random() < 0.5))
        expected = step_cost(cfg, requests, 2).intensity
        got = fn(cfg, requests, 2)
        if not isinstance(got, (int, float)) or abs(got - expected) > 1e-9 * expected:
            _fail(f"{cfg.name}, {len(requests)} requests (last {requests[-1]}): you return {got!r}, "
                  f"expected {expected:.3f} FLOP/byte.")
    print("check_step_intensity: correct")
