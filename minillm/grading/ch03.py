"""Checkers for exercises/03_kv_cache: compare the learner's function with the engine.

The engine's own helpers (blocks_for, BlockManager.slot_mapping,
PagedKVCache.gather, blocks_that_fit) raise while the learner's function runs;
some inputs are ones those helpers would not take (a token count far past any
cache, a bare shape object instead of a ModelConfig), so a wrapper cannot pass.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import torch

from ..config import PRESETS, ModelConfig
from ..kv_cache import BlockManager, PagedKVCache, blocks_for, blocks_that_fit
from ._common import fail as _fail, learner_call, passed

__all__ = ["check_blocks_needed", "check_slot_mapping", "check_gather_kv", "check_blocks_that_fit"]

_WHY = "the exercise is to compute it yourself."
_BLOCKS_FOR = ("minillm.kv_cache.blocks_for", "minillm.kv_cache.BlockManager.blocks_missing")
_SLOTS = ("minillm.kv_cache.BlockManager.slot_mapping",)
_GATHER = ("minillm.kv_cache.PagedKVCache.gather", "minillm.attention.gather_kv")
_FIT = ("minillm.kv_cache.blocks_that_fit", "minillm.kv_cache.kv_bytes_per_token",
        "minillm.config.ModelConfig.kv_bytes_per_token")


def _random_table(rng: random.Random, num_tokens: int, block_size: int, num_blocks: int) -> list[int]:
    """A block table as a busy pool hands it out: distinct blocks in no particular order."""
    return rng.sample(range(num_blocks), blocks_for(num_tokens, block_size))


def check_blocks_needed(fn, seed: int | None = None):
    """fn(num_tokens, block_size) -> blocks a request of num_tokens tokens occupies."""
    rng = random.Random(seed)
    # 10**18 + 1 tokens: far past any cache, and past float precision (math.ceil of a
    # float division rounds it to 10**18 // 16 exactly, one block short).
    cases = [(0, 16), (1, 16), (16, 16), (17, 16), (1, 1), (10**18 + 1, 16), (2**60 + 3, 256)] + \
        [(rng.randint(0, 5000), rng.choice([1, 8, 16, 32, 256])) for _ in range(50)]
    for num_tokens, block_size in cases:
        expected = blocks_for(num_tokens, block_size)
        got = learner_call(fn, num_tokens, block_size, forbidden=_BLOCKS_FOR, why=_WHY)
        if got != expected:
            hint = "A partly filled last block still counts as a whole block."
            if num_tokens > 2**53:
                hint = "Use integer arithmetic only: a float cannot hold this count exactly (try -(-a // b))."
            elif got == num_tokens // block_size:
                hint = "That is the floor: a partly filled last block still counts as a whole block."
            _fail(f"num_tokens={num_tokens}, block_size={block_size}: you return {got!r}, expected "
                  f"{expected}. {hint}")
    return passed(f"check_blocks_needed: correct on {len(cases)} cases")


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
        got = learner_call(fn, list(table), start, end, block_size, forbidden=_SLOTS, why=_WHY)
        got = got.tolist() if isinstance(got, torch.Tensor) else list(got)
        if len(got) != len(expected):
            _fail(f"block_table={table}, start={start}, end={end}, block_size={block_size}: you return "
                  f"{len(got)} slots, expected {len(expected)}, one per position in [start, end): end is "
                  "excluded")
        if got != expected:
            _fail(f"block_table={table}, start={start}, end={end}, block_size={block_size}: you "
                  f"return {got[:8]}{'...' if len(got) > 8 else ''}, expected {expected[:8]}"
                  f"{'...' if len(expected) > 8 else ''}. Position p lives in block "
                  "block_table[p // block_size] at offset p % block_size.")
    return passed("check_slot_mapping: correct on 30 random block tables")


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
        got = learner_call(fn, cache.data[0, 0].clone(), list(table), num_tokens, forbidden=_GATHER, why=_WHY)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(expected.shape):
            _fail(f"num_tokens={num_tokens}, block_size={block_size}: expected a tensor of shape "
                  f"{tuple(expected.shape)}, got {getattr(got, 'shape', type(got).__name__)}")
        if not torch.equal(got, expected):
            wrong = (got != expected).any(-1).any(-1).nonzero().flatten().tolist()
            _fail(f"block_table={table}, num_tokens={num_tokens}, block_size={block_size}: positions "
                  f"{wrong[:6]} hold the wrong keys. Read the blocks in table order and cut at num_tokens.")
    return passed("check_gather_kv: correct on 20 random caches")


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
        # Half the shapes come as a bare object with only the three fields the
        # formula needs: the engine's helpers would not take it.
        shape = cfg if rng.random() < 0.5 else SimpleNamespace(
            name=cfg.name, num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            num_heads=cfg.num_heads, hidden_size=cfg.hidden_size)
        got = learner_call(fn, shape, num_bytes, block_size, dtype_bytes, forbidden=_FIT, why=_WHY)
        if got != expected:
            per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes
            hint = ""
            derived = cfg.hidden_size // cfg.num_heads
            if derived != cfg.head_dim and got == num_bytes // (block_size * per_token // cfg.head_dim * derived):
                hint = (f"Use head_dim ({cfg.head_dim}), not hidden_size // num_heads ({derived}): some models "
                        "set it separately. ")
            elif got == num_bytes // (block_size * per_token // 2):
                hint = "You count K only (or V only): a token stores both. "
            elif got == num_bytes // (block_size * per_token // cfg.num_kv_heads * cfg.num_heads):
                hint = "You count the query heads: only the KV heads are cached (grouped-query attention). "
            elif isinstance(got, float):
                hint = "Return a whole number of blocks (integer division). "
            _fail(f"{hint}{cfg.name} (layers {cfg.num_layers}, kv heads {cfg.num_kv_heads}, head_dim {cfg.head_dim}), "
                  f"num_bytes={num_bytes:,}, block_size={block_size}, dtype_bytes={dtype_bytes}: you return "
                  f"{got!r}, expected {expected:,}. A block holds block_size tokens of K and V for every "
                  "layer and KV head; count whole blocks only.")
    return passed(f"check_blocks_that_fit: correct on {len(configs)} model shapes")
