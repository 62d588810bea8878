"""Checkers for exercises/03_kv_cache: compare the learner's function with the engine."""
from __future__ import annotations

import random

import torch

from ..config import PRESETS, ModelConfig
from ..kv_cache import BlockManager, PagedKVCache, blocks_for, blocks_that_fit

__all__ = ["check_blocks_needed", "check_slot_mapping", "check_gather_kv", "check_blocks_that_fit"]


def _fail(message: str):
    print("Not yet: " + message)
    raise AssertionError(message)


def _random_table(rng: random.Random, num_tokens: int, block_size: int, num_blocks: int) -> list[int]:
    """A block table as a busy pool hands it out: distinct blocks in no particular order."""
    return rng.sample(range(num_blocks), blocks_for(num_tokens, block_size))


def check_blocks_needed(fn, seed: int | None = None):
    """fn(num_tokens, block_size) -> blocks a request of num_tokens tokens occupies."""
    rng = random.Random(seed)
    cases = [(0, 16), (1, 16), (16, 16), (17, 16), (1, 1)] + \
        [(rng.randint(0, 5000), rng.choice([1, 8, 16, 32, 256])) for _ in range(50)]
    for num_tokens, block_size in cases:
        expected, got = blocks_for(num_tokens, block_size), fn(num_tokens, block_size)
        if got != expected:
            _fail(f"num_tokens={num_tokens}, block_size={block_size}: you return {got!r}, expected "
                  f"{expected}. A partly filled last block still counts as a whole block.")
    print(f"check_blocks_needed: correct on {len(cases)} cases")


def check_slot_mapping(fn, seed: int | None = None):
    """fn(block_table, start, end, block_size) -> flat slots of positions [start, end)."""
    rng = random.Random(seed)
    for _ in range(30):
        block_size = rng.choice([1, 4, 16, 32])
        num_tokens = rng.randint(1, 200)
        spare_blocks = rng.randint(0, 20)
        manager = BlockManager(num_blocks=blocks_for(num_tokens, block_size) + spare_blocks,
                               block_size=block_size)
        rng.shuffle(manager.free_blocks)       # a busy pool hands out blocks in any order
        manager.allocate("noise", rng.randint(0, spare_blocks * block_size))
        manager.allocate("r", num_tokens)
        table = manager.block_tables["r"]
        start = rng.randint(0, num_tokens - 1)
        end = rng.randint(start + 1, num_tokens)
        expected = manager.slot_mapping("r", start, end)
        got = fn(list(table), start, end, block_size)
        got = got.tolist() if isinstance(got, torch.Tensor) else list(got)
        if got != expected:
            _fail(f"block_table={table}, start={start}, end={end}, block_size={block_size}: you "
                  f"return {got[:8]}{'...' if len(got) > 8 else ''}, expected {expected[:8]}"
                  f"{'...' if len(expected) > 8 else ''}. Position p lives in block "
                  "block_table[p // block_size] at offset p % block_size.")
    print("check_slot_mapping: correct on 30 random block tables")


def check_gather_kv(fn, seed: int | None = None):
    """fn(k_cache [num_blocks, block_size, Hkv, D], block_table, num_tokens) -> [num_tokens, Hkv, D]."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(rng.randint(0, 2**31))
    for _ in range(20):
        block_size, hkv, d = rng.choice([1, 4, 16]), rng.randint(1, 4), rng.choice([2, 8])
        num_tokens = rng.randint(1, 100)
        num_blocks = blocks_for(num_tokens, block_size) + rng.randint(0, 10)
        cache = PagedKVCache(1, num_blocks, block_size, hkv, d, dtype=torch.float64)
        cache.data.copy_(torch.randn(cache.data.shape, generator=gen, dtype=torch.float64))
        table = _random_table(rng, num_tokens, block_size, num_blocks)
        expected = cache.gather(table, num_tokens)[0, 0]
        got = fn(cache.data[0, 0], list(table), num_tokens)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(expected.shape):
            _fail(f"num_tokens={num_tokens}, block_size={block_size}: expected a tensor of shape "
                  f"{tuple(expected.shape)}, got {getattr(got, 'shape', type(got).__name__)}")
        if not torch.equal(got, expected):
            wrong = (got != expected).any(-1).any(-1).nonzero().flatten().tolist()
            _fail(f"block_table={table}, num_tokens={num_tokens}, block_size={block_size}: positions "
                  f"{wrong[:6]} hold the wrong keys. Read the blocks in table order and cut at num_tokens.")
    print("check_gather_kv: correct on 20 random caches")


def check_blocks_that_fit(fn, seed: int | None = None):
    """fn(cfg, num_bytes, block_size, dtype_bytes) -> whole blocks that fit in num_bytes."""
    rng = random.Random(seed)
    configs = [PRESETS[n] for n in ("llama-3-8b", "llama-2-7b", "qwen3-0.6b", "tiny")]
    for _ in range(4):
        kv = rng.choice([1, 2, 4, 8])
        configs.append(ModelConfig(name="random", vocab_size=1000, hidden_size=512, intermediate_size=1024,
                                   num_layers=rng.randint(1, 48), num_heads=kv * rng.choice([1, 4]),
                                   num_kv_heads=kv, head_dim=rng.choice([64, 128])))
    for cfg in configs:
        num_bytes = rng.randint(1, 80) * 10**9 + rng.randint(0, 10**6)
        block_size, dtype_bytes = rng.choice([16, 32, 256]), rng.choice([1, 2, 4])
        expected = blocks_that_fit(cfg, num_bytes, block_size, dtype_bytes)
        got = fn(cfg, num_bytes, block_size, dtype_bytes)
        if got != expected:
            _fail(f"{cfg.name} (layers {cfg.num_layers}, kv heads {cfg.num_kv_heads}, head_dim {cfg.head_dim}), "
                  f"num_bytes={num_bytes:,}, block_size={block_size}, dtype_bytes={dtype_bytes}: you return "
                  f"{got!r}, expected {expected:,}. A block holds block_size tokens of K and V for every "
                  "layer and KV head; count whole blocks only.")
    print(f"check_blocks_that_fit: correct on {len(configs)} model shapes")
