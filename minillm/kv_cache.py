"""The paged KV cache: a pool of fixed-size blocks and a table per request.

Two halves, as in vLLM:
  BlockManager   pure Python bookkeeping (free list, reference counts, block
                 tables, slot mapping). The scheduler uses it to decide what
                 fits; it never touches a tensor.
  PagedKVCache   the tensors themselves: for every layer, K and V of shape
                 [num_blocks, block_size, num_kv_heads, head_dim].

Token p of a request lives in block block_table[p // block_size], at offset
p % block_size; its flat slot is block * block_size + offset.
"""
from __future__ import annotations

from collections import deque
import torch

from .device import available_ram_bytes, free_memory_bytes
from .validation import check_int


class OutOfBlocksError(RuntimeError):
    """The pool has too few free blocks; the scheduler preempts and retries."""

    def __init__(self, request_id, blocks_needed: int, blocks_free: int):
        self.request_id, self.blocks_needed, self.blocks_free = request_id, blocks_needed, blocks_free
        super().__init__(f"request {request_id!r} needs {blocks_needed} more KV blocks but only "
                         f"{blocks_free} are free: preempt a request or grow num_blocks")


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold num_tokens tokens: the ceiling of num_tokens / block_size."""
    return -(-num_tokens // block_size)


def gather_kv(cache: torch.Tensor, block_table: list[int], num_tokens: int) -> torch.Tensor:
    """Tokens [0, num_tokens) of one request, read through its block table.

    cache: [..., num_blocks, block_size, Hkv, D] (one layer's K or V, or the
    whole pool) -> [..., num_tokens, Hkv, D]. When the request's blocks are
    consecutive in the pool (a prompt allocated in one go usually is) the
    result is a view and nothing is copied (view_kv); otherwise one
    index_select copies the blocks, all at once.
    """
    view = view_kv(cache, block_table, num_tokens)
    if view is not None:
        return view
    num_blocks = blocks_for(num_tokens, cache.shape[-3])
    picked = cache.index_select(-4, torch.as_tensor(block_table[:num_blocks], device=cache.device))
    return picked.flatten(-4, -3).narrow(-3, 0, num_tokens)


def view_kv(cache: torch.Tensor, block_table: list[int], num_tokens: int) -> torch.Tensor | None:
    """Tokens [0, num_tokens) as a view of the pool if their blocks are
    consecutive in it, else None (then only a copy can line them up)."""
    num_blocks = blocks_for(num_tokens, cache.shape[-3])
    table = list(block_table[:num_blocks])
    first = table[0] if table else 0
    if table != list(range(first, first + num_blocks)):
        return None
    return cache.narrow(-4, first, num_blocks).flatten(-4, -3).narrow(-3, 0, num_tokens)


def _check_num_tokens(num_tokens, arg: str = "num_tokens") -> int:
    return check_int(arg, num_tokens, 0)


# Host memory per block of bookkeeping: a free-list entry, an int object, a reference count.
BOOKKEEPING_BYTES_PER_BLOCK = 64


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        num_blocks = check_int("num_blocks", num_blocks, 1, hint="64, or None for the default")
        block_size = check_int("block_size", block_size, 1, hint="16")
        # Refuse before counting out the free list, which would otherwise grow
        # until the machine runs out of memory (the simulator has no pool to check).
        free_ram = available_ram_bytes()
        if free_ram is not None and num_blocks * BOOKKEEPING_BYTES_PER_BLOCK > free_ram:
            raise ValueError(f"num_blocks={num_blocks}: keeping track of that many blocks needs "
                             f"{num_blocks * BOOKKEEPING_BYTES_PER_BLOCK / 2**30:.3g} GiB of host memory, "
                             f"{free_ram / 2**30:.1f} GiB are free (try a number of blocks that fits)")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks
        self.block_tables: dict[object, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def capacity_tokens(self, request_id) -> int:
        return len(self.block_tables.get(request_id, ())) * self.block_size

    def blocks_missing(self, request_id, num_tokens: int) -> int:
        """How many more blocks request_id needs to hold num_tokens tokens."""
        num_tokens = _check_num_tokens(num_tokens)
        have = len(self.block_tables.get(request_id, ()))
        return max(0, blocks_for(num_tokens, self.block_size) - have)

    def can_allocate(self, request_id, num_tokens: int) -> bool:
        return self.blocks_missing(request_id, num_tokens) <= self.num_free_blocks

    def allocate(self, request_id, num_tokens: int) -> list[int]:
        """Grow request_id's table until it holds num_tokens tokens."""
        missing = self.blocks_missing(request_id, num_tokens)
        if missing > self.num_free_blocks:
            raise OutOfBlocksError(request_id, missing, self.num_free_blocks)
        table = self.block_tables.setdefault(request_id, [])
        for _ in range(missing):
            block = self._take_free_block()
            self.ref_counts[block] = 1
            table.append(block)
        return table

    def _take_free_block(self) -> int:
        return self.free_blocks.popleft()

    def share(self, src_id, dst_id, num_tokens: int) -> list[int]:
        """Let dst_id reuse the blocks holding src_id's first num_tokens tokens
        (whole blocks only): the basis of prefix caching."""
        if src_id not in self.block_tables:
            raise ValueError(f"src_id={src_id!r}: no such request holds blocks")
        if self.block_tables.get(dst_id):
            # Replacing a table that owns blocks would leak them.
            raise ValueError(f"dst_id={dst_id!r} already holds blocks; share before allocating")
        num_tokens = _check_num_tokens(num_tokens)
        shared = self.block_tables[src_id][:num_tokens // self.block_size]
        for block in shared:
            self.ref_counts[block] += 1
        self.block_tables[dst_id] = list(shared)
        return self.block_tables[dst_id]

    def free(self, request_id) -> None:
        """Return every block of request_id whose last user it was."""
        for block in self.block_tables.pop(request_id, ()):
            self._release(block)

    def shrink(self, request_id, num_tokens: int) -> None:
        """Give back request_id's blocks past those holding its first num_tokens tokens
        (speculative decoding: blocks that only a rejected draft wrote). Such a block
        holds no computed token, so prefix caching never named it."""
        table = self.block_tables.get(request_id)
        if not table:
            return
        keep = blocks_for(_check_num_tokens(num_tokens), self.block_size)
        while len(table) > keep:
            self._release(table.pop())

    def checkpoint(self) -> dict:
        """What rollback() needs to undo the allocations and frees that follow:
        each table (the list itself, not a copy) and its length. O(requests):
        cheap enough to take before every step. Relies on tables only growing
        at the end (allocate) or going whole (free)."""
        return {request_id: (table, len(table)) for request_id, table in self.block_tables.items()}

    def rollback(self, checkpoint: dict) -> None:
        """Put every table back as it was at checkpoint(); blocks taken since
        return to the pool, blocks freed since are owned again."""
        for request_id in [r for r in self.block_tables if r not in checkpoint]:
            self.free(request_id)                     # allocated after the checkpoint
        reowned = set()
        for request_id, (table, length) in checkpoint.items():
            if self.block_tables.get(request_id) is table:
                for block in table[length:]:          # grown since: give the growth back
                    self._release(block)
            else:                                     # freed since: take its blocks back
                for block in table[:length]:
                    if self.ref_counts[block] == 0:
                        reowned.add(block)
                    self.ref_counts[block] += 1
                self.block_tables[request_id] = table
            del table[length:]
        if reowned:
            self.free_blocks = deque(b for b in self.free_blocks if b not in reowned)

    def _release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_blocks.append(block)

    def slot_mapping(self, request_id, start: int, end: int) -> list[int]:
        """Flat cache slots of positions [start, end) of request_id."""
        if request_id not in self.block_tables:
            raise ValueError(f"request_id={request_id!r}: holds no blocks; allocate first")
        table = self.block_tables[request_id]
        if not 0 <= start <= end:
            raise ValueError(f"start={start}, end={end}: need 0 <= start <= end")
        if end > len(table) * self.block_size:
            raise ValueError(f"end={end}: request {request_id!r} has blocks for only "
                             f"{len(table) * self.block_size} tokens; allocate first")
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    # Hooks for prefix caching (prefix_cache.PrefixCachingBlockManager
    # overrides them); a plain pool caches nothing.
    def claim_cached_prefix(self, request) -> int:
        return 0

    def release_cached_prefix(self, request, num_tokens: int) -> None:
        pass

    def cache_computed_blocks(self, request) -> None:
        pass

    def num_leaked_blocks(self) -> int:
        """Blocks neither free nor owned by any table (must always be 0)."""
        owned = {b for table in self.block_tables.values() for b in table}
        free = set(self.free_blocks)
        return sum(1 for b in range(self.num_blocks) if b not in owned and b not in free)


def check_pool_fits(num_blocks, bytes_per_block: int, device) -> int:
    """num_blocks, refused by name when a pool of that many blocks cannot fit
    in the memory free on `device`: an error, not the machine running out."""
    num_blocks = check_int("num_blocks", num_blocks, 1, hint="64, or None for a default that fits")
    pool_bytes = num_blocks * bytes_per_block
    free_bytes = free_memory_bytes(device)
    if free_bytes is not None and pool_bytes > free_bytes:
        raise ValueError(f"num_blocks={num_blocks}: a KV pool of {pool_bytes / 2**30:.3g} GiB does not fit in the "
                         f"{free_bytes / 2**30:.1f} GiB free on {torch.device(device).type} "
                         "(try num_blocks=None for a default that fits)")
    return num_blocks


class PagedKVCache:
    """K and V tensors for every layer: [num_layers, 2, num_blocks, block_size, Hkv, D]."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype=torch.float32, device="cpu"):
        check_pool_fits(num_blocks, block_size * 2 * num_layers * num_kv_heads * head_dim
                        * torch.empty(0, dtype=dtype).element_size(), device)
        self.block_size = block_size
        self.num_blocks = num_blocks
        # Zeros, not empty: attention reads whole blocks and masks the unused
        # slots, and a masked slot must hold a finite number (NaN * 0 = NaN).
        self.data = torch.zeros(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim,
                                dtype=dtype, device=device)

    @classmethod
    def for_model(cls, cfg, num_blocks: int, block_size: int, dtype, device) -> "PagedKVCache":
        return cls(cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim,
                   dtype=dtype, device=device)

    def layer(self, i: int):
        """(k_cache, v_cache) of layer i, each [num_blocks, block_size, Hkv, D]."""
        return self.data[i, 0], self.data[i, 1]

    def gather(self, block_table: list[int], num_tokens: int) -> torch.Tensor:
        """One request's KV, every layer: [num_layers, 2, num_tokens, Hkv, D]."""
        return gather_kv(self.data, block_table, num_tokens)

    @property
    def num_bytes(self) -> int:
        return self.data.numel() * self.data.element_size()


def kv_bytes_per_token(cfg, dtype_bytes: int = 2) -> int:
    """2 (K and V) x layers x kv heads x head dim x bytes per element."""
    return cfg.kv_bytes_per_token(dtype_bytes)


def blocks_that_fit(cfg, num_bytes: int, block_size: int, dtype_bytes: int = 2) -> int:
    """How many blocks of block_size tokens fit in num_bytes of KV memory."""
    return int(num_bytes) // (block_size * kv_bytes_per_token(cfg, dtype_bytes))
