"""Chapter 4's expected values: a chunked prefill built from the engine's pieces (with
the chapter's bugs on demand), the per-layer KV error when every chunk's positions
restart at 0 (the chapter's bug 3), and a packed chunked prefill of several prompts."""
from __future__ import annotations

import torch

from ...attention import AttentionBatch
from ...kv_cache import BlockManager, PagedKVCache
from ...prefill import prefill_kv


def chunked_prefill(model, token_ids, chunk_size, block_size: int = 16, positions_from_zero: bool = False):
    T = len(token_ids)
    blocks = BlockManager(-(-T // block_size), block_size)
    table = blocks.allocate("prompt", T)
    cache = PagedKVCache.for_model(model.cfg, blocks.num_blocks, block_size, model.dtype, model.device)
    for start in range(0, T, chunk_size):
        end = min(start + chunk_size, T)
        batch = AttentionBatch([end - start], [start], [table], block_size,
                               torch.tensor(blocks.slot_mapping("prompt", start, end)))
        positions = torch.arange(0, end - start) if positions_from_zero else torch.arange(start, end)
        model(torch.tensor(token_ids[start:end]), positions, batch, cache, backend="reference")
    return cache.gather(table, T)


def position_bug_errors(model, token_ids, chunk_size, block_size: int = 16) -> list[float]:
    kv = chunked_prefill(model, token_ids, chunk_size, block_size, positions_from_zero=True)
    full, _ = prefill_kv(model, token_ids)
    return [(kv[layer] - full[layer]).abs().max().item() for layer in range(model.cfg.num_layers)]


def packed_chunked_prefill(model, prompts, chunk_size, block_size: int = 16):
    """Every step: the next chunk of every unfinished prompt, packed into ONE forward pass."""
    blocks = BlockManager(sum(-(-len(p) // block_size) for p in prompts), block_size)
    tables = [blocks.allocate(r, len(p)) for r, p in enumerate(prompts)]
    cache = PagedKVCache.for_model(model.cfg, blocks.num_blocks, block_size, model.dtype, model.device)
    done = [0] * len(prompts)
    while any(d < len(p) for d, p in zip(done, prompts)):
        rows = [r for r, p in enumerate(prompts) if done[r] < len(p)]
        ends = {r: min(done[r] + chunk_size, len(prompts[r])) for r in rows}
        batch = AttentionBatch([ends[r] - done[r] for r in rows], [done[r] for r in rows], [tables[r] for r in rows],
                               block_size, torch.tensor(sum((blocks.slot_mapping(r, done[r], ends[r]) for r in rows), [])))
        tokens = torch.tensor(sum((prompts[r][done[r]:ends[r]] for r in rows), []))
        positions = torch.cat([torch.arange(done[r], ends[r]) for r in rows])
        model(tokens, positions, batch, cache, backend="reference")
        done = [ends.get(r, d) for r, d in enumerate(done)]
    return [cache.gather(tables[r], len(p)) for r, p in enumerate(prompts)]
