"""Chapter 4's reference answers (teacher only): the mask of a packed step, a locator of the
first layer, tensor and position where a chunked prefill leaves the full prefill's KV, a
packed chunked prefill of several prompts, and the work and re-reads of a chunked prefill."""
from __future__ import annotations

import torch

from ...attention import AttentionBatch
from ...kv_cache import BlockManager, PagedKVCache
from ...prefill import prefill_kv

TOLERANCE = 1e-9


def step_mask(query_lens, cached_lens):
    parts = []
    for q, c in zip(query_lens, cached_lens):
        query_pos = torch.arange(q)[:, None] + c
        parts.append(torch.arange(c + q)[None, :] <= query_pos)
    return torch.block_diag(*parts)


def locate_bug(prefill_fn, model, token_ids, chunk_size):
    error = (prefill_fn(model, token_ids, chunk_size) - prefill_kv(model, token_ids)[0]).abs()  # [L, 2, T, Hkv, D]
    for layer in range(error.shape[0]):
        wrong = ~(error[layer].amax(dim=(2, 3)) <= TOLERANCE)                    # [2, T]; NaN is wrong too
        if wrong.any():
            which = "both" if wrong.any(1).all() else "KV"[int(wrong.any(1).nonzero()[0])]
            return layer, which, int(wrong.any(0).nonzero()[0])
    return None


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


def chunked_prefill_work(num_tokens, chunk_size):
    pairs = num_tokens * (num_tokens + 1) // 2                  # position p sees p + 1 keys, chunked or not
    cached_reads = sum(range(0, num_tokens, chunk_size))         # chunk k reads the prefix before its start
    return pairs, cached_reads
