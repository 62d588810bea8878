"""Chapter 4's expected values: the per-layer KV error of a chunked prefill whose
positions restart at 0 in every chunk (the chapter's bug 3), measured on the engine."""
from __future__ import annotations

import torch

from ...attention import AttentionBatch
from ...kv_cache import BlockManager, PagedKVCache
from ...prefill import prefill_kv


def position_bug_errors(model, token_ids, chunk_size, block_size: int = 16) -> list[float]:
    T = len(token_ids)
    blocks = BlockManager(-(-T // block_size), block_size)
    table = blocks.allocate("prompt", T)
    cache = PagedKVCache.for_model(model.cfg, blocks.num_blocks, block_size, model.dtype, model.device)
    for start in range(0, T, chunk_size):
        end = min(start + chunk_size, T)
        batch = AttentionBatch([end - start], [start], [table], block_size,
                               torch.tensor(blocks.slot_mapping("prompt", start, end)))
        model(torch.tensor(token_ids[start:end]), torch.arange(0, end - start), batch, cache, backend="reference")
    full, _ = prefill_kv(model, token_ids)
    kv = cache.gather(table, T)
    return [(kv[layer] - full[layer]).abs().max().item() for layer in range(model.cfg.num_layers)]
