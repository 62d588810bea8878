"""Turn a scheduled step into tensors, run the model, return the logits.

The scheduler hands over, per request, which of its tokens to compute this
step; the runner packs them into one batch (token ids, absolute positions,
cache slots, block tables) and calls the model once. The harnesses that
drive it by hand for the book (`prefill_kv`, `prepare_step`) live in
prefill.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import host_memory
from .attention import AttentionBatch
from .kv_cache import BlockManager, PagedKVCache


@dataclass
class StepChunk:
    """The part of one request that a step computes."""
    request_id: object
    token_ids: list[int]     # the new tokens, at positions [num_cached, num_cached + len)
    num_cached: int          # tokens of this request already in the cache
    sample: bool = True      # return logits for the last new token
    # Or name the rows (0-based within the chunk, ascending) whose logits to return:
    # a request that asked for prompt logprobs needs every prompt row, not only the last.
    logits_rows: list[int] | None = None

    def rows_with_logits(self) -> list[int]:
        if self.logits_rows is not None:
            return self.logits_rows
        return [len(self.token_ids) - 1] if self.sample else []


class ModelRunner:
    def __init__(self, model, block_manager: BlockManager, backend: str | None = None,
                 batch_invariant: bool = False):
        self.model = model
        self.block_manager = block_manager
        self.backend = backend
        self.batch_invariant = batch_invariant    # every row's bits independent of its step (chapter 11)
        # A big step's activations would otherwise be mmapped and page-faulted
        # in afresh every step (host_memory.py).
        host_memory.keep_freed_memory()
        self.kv_cache = PagedKVCache.for_model(model.cfg, block_manager.num_blocks,
                                               block_manager.block_size, model.dtype, model.device)

    def prepare(self, chunks: list[StepChunk]):
        """Pack the chunks: (token_ids [T], positions [T], AttentionBatch, logits_indices [S]),
        S the rows whose logits are wanted, chunk after chunk."""
        device = self.model.device
        token_ids, positions, slots, logits_indices = [], [], [], []
        for chunk in chunks:
            n, start = len(chunk.token_ids), chunk.num_cached
            logits_indices += [len(token_ids) + row for row in chunk.rows_with_logits()]
            token_ids += chunk.token_ids
            positions += range(start, start + n)
            slots += self.block_manager.slot_mapping(chunk.request_id, start, start + n)
        batch = AttentionBatch(
            query_lens=[len(c.token_ids) for c in chunks],
            cached_lens=[c.num_cached for c in chunks],
            block_tables=[self.block_manager.block_tables[c.request_id] for c in chunks],
            block_size=self.block_manager.block_size,
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        )
        return (torch.tensor(token_ids, dtype=torch.long, device=device),
                torch.tensor(positions, dtype=torch.long, device=device),
                batch,
                torch.tensor(logits_indices, dtype=torch.long, device=device))

    def execute(self, chunks: list[StepChunk], all_logits: bool = False) -> torch.Tensor:
        """Run one step; logits [S, vocab] of the rows the chunks ask for (or [T, vocab] if all_logits)."""
        token_ids, positions, batch, logits_indices = self.prepare(chunks)
        # Named only when on, so a stand-in model (a test's, a chapter's) need not know the mode.
        mode = {"batch_invariant": True} if self.batch_invariant else {}
        return self.model(token_ids, positions, batch, self.kv_cache,
                          logits_indices=None if all_logits else logits_indices,
                          backend=self.backend, **mode)
