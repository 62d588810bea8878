"""Checkers for exercises/04_chunked_prefill_is_exact: compare with the engine."""
from __future__ import annotations

import random

import torch

from ..attention import causal_mask
from ..config import ModelConfig
from ..loader import build_model
from ..model_runner import prefill_kv

__all__ = ["check_chunk_mask", "check_chunk_bounds", "check_chunked_prefill"]


def _fail(message: str):
    print("Not yet: " + message)
    raise AssertionError(message)


def check_chunk_mask(fn, seed: int | None = None):
    """fn(q_len, k_len) -> bool [q_len, k_len], True where a chunk's query may see a key."""
    rng = random.Random(seed)
    cases = [(4, 10), (1, 7), (5, 5), (3, 3)] + [(q, q + rng.randint(0, 40))
                                                 for q in (rng.randint(1, 30) for _ in range(20))]
    for q_len, k_len in cases:
        expected = causal_mask(q_len, k_len)
        got = fn(q_len, k_len)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (q_len, k_len):
            _fail(f"q_len={q_len}, k_len={k_len}: expected a tensor of shape {(q_len, k_len)}, "
                  f"got {getattr(got, 'shape', type(got).__name__)}")
        if not torch.equal(got.bool(), expected):
            if torch.equal(got.bool(), causal_mask(q_len, k_len, align="top_left")):
                _fail(f"q_len={q_len}, k_len={k_len}: that is the TOP-LEFT mask. The chunk's queries "
                      "are the last q_len positions: query i sits at position k_len - q_len + i.")
            _fail(f"q_len={q_len}, k_len={k_len}: expected\n{expected.int()}\ngot\n{got.int()}")
    print(f"check_chunk_mask: correct on {len(cases)} shapes")


def check_chunk_bounds(fn, seed: int | None = None):
    """fn(num_tokens, chunk_size) -> [(start, end), ...] covering [0, num_tokens) in order."""
    rng = random.Random(seed)
    cases = [(10, 3), (10, 10), (10, 64), (1, 1), (7, 1)] + \
        [(rng.randint(1, 3000), rng.randint(1, 600)) for _ in range(30)]
    for num_tokens, chunk_size in cases:
        expected = [(s, min(s + chunk_size, num_tokens)) for s in range(0, num_tokens, chunk_size)]
        got = [tuple(b) for b in fn(num_tokens, chunk_size)]
        if got != expected:
            _fail(f"num_tokens={num_tokens}, chunk_size={chunk_size}: you return {got[:4]}..., expected "
                  f"{expected[:4]}... ({len(expected)} chunks). The last chunk may be shorter; none "
                  "runs past num_tokens.")
    print(f"check_chunk_bounds: correct on {len(cases)} cases")


def check_chunked_prefill(fn, seed: int | None = None):
    """fn(model, token_ids, chunk_size) -> kv [layers, 2, T, Hkv, D], compared with prefill_kv."""
    rng = random.Random(seed)
    cfg = ModelConfig(name="check", vocab_size=64, hidden_size=64, intermediate_size=128,
                      num_layers=2, num_heads=4, num_kv_heads=2, max_position=256)
    model = build_model(cfg, seed=rng.randint(0, 1000), dtype=torch.float64)
    with torch.no_grad():   # sharper attention than the default init: mistakes show more
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8)
    for _ in range(3):
        num_tokens = rng.randint(40, 90)
        chunk_size = rng.choice([1, 7, 16, rng.randint(2, num_tokens - 1)])
        tokens = [rng.randrange(64) for _ in range(num_tokens)]
        expected, _ = prefill_kv(model, tokens)
        got = fn(model, tokens, chunk_size)
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            _fail(f"expected a tensor of shape {tuple(expected.shape)}, got "
                  f"{getattr(got, 'shape', type(got).__name__)}")
        error = (got - expected).abs()
        if error.max() > 1e-10:
            layer, kind, position = [int(i) for i in (error == error.max()).nonzero()[0][:3]]
            first = int((error.amax(dim=(0, 1, 3, 4)) > 1e-10).nonzero()[0])
            hint = ("layer 0 already differs: check the positions (absolute, start + i) and the slots"
                    if error[0].max() > 1e-10 else
                    "layer 0 is right, later layers differ: check what each chunk attends to "
                    "(cached_lens, the mask)")
            _fail(f"{num_tokens} tokens, chunk_size={chunk_size}: max |KV - full prefill| = "
                  f"{error.max():.2e} (layer {layer}, {'KV'[kind]}, position {position}); the first "
                  f"wrong position is {first}. {hint}.")
    print("check_chunked_prefill: your chunked KV equals the full prefill to 1e-10 (float64)")
