"""Prefix caching: reuse the KV blocks of a prefix some request already computed.

vLLM's scheme (vllm/v1/core/kv_cache_utils.py, `hash_block_tokens`): a FULL
block of `block_size` tokens is named by a hash of its own tokens AND of the
hash of the block before it, so one hash stands for the whole prefix up to
the end of that block. Two prompts that share their first 1000 tokens share
the hashes of their first 1000 // block_size blocks, and the block holding
those tokens' K and V can serve both. (SGLang keys the same idea on a radix
tree of token sequences instead; chapter 8 compares the two.)

`PrefixCachingBlockManager` is the BlockManager with three changes:
  claim_cached_prefix   a waiting request takes the longest run of cached
                        blocks matching its tokens (a reference each), and
                        starts computing at the first token after them;
  cache_computed_blocks after a step, every block that is now full and
                        computed gets its hash, so later requests can find it;
  free                  a cached block whose last user leaves is kept, with
                        its K and V, on an LRU list; allocation takes clean
                        blocks first and evicts the least recently used cached
                        block only when no clean one is left.

Two rules keep it exact. Only full, computed blocks are ever shared, so no
request writes into a block another one reads (a shared block is never
writable). And a hit stops one token short of the request: the last prompt
token must run through the model to give the logits of the first output token
(vLLM PRs #6144 and #7753 met this case; vLLM V1's kv_cache_manager.py caps the
hit at num_tokens - 1). Blocks are the unit, so a prompt whose every block is
cached recomputes its whole last block, as vLLM V1 does.
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from .kv_cache import BlockManager

ROOT_HASH = b"minillm-prefix-root"    # the "parent" of a prompt's first block


def hash_block(parent_hash: bytes, token_ids) -> bytes:
    """The hash of one full block: sha256 of its parent's hash and its tokens.

    A cryptographic hash, not Python's hash(): two different prefixes must
    never get one name, or a request would read another prompt's K and V.
    """
    return hashlib.sha256(parent_hash + array("q", token_ids).tobytes()).digest()


def block_hashes(token_ids, block_size: int, num_blocks: int | None = None) -> list[bytes]:
    """Chained hashes of the full blocks of token_ids (the first num_blocks of them)."""
    full = len(token_ids) // block_size
    full = full if num_blocks is None else min(full, num_blocks)
    hashes, parent = [], ROOT_HASH
    for i in range(full):
        parent = hash_block(parent, token_ids[i * block_size:(i + 1) * block_size])
        hashes.append(parent)
    return hashes


def max_cached_tokens(num_tokens: int, block_size: int) -> int:
    """The most tokens a hit may cover: whole blocks, and at least the last
    token left to compute (its logits give the next token)."""
    return (num_tokens - 1) // block_size * block_size


class PrefixCachingBlockManager(BlockManager):
    """A BlockManager whose full blocks outlive their requests, found by hash."""

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self.hash_to_block: dict[bytes, int] = {}
        self.block_hash: dict[int, bytes] = {}
        # Cached blocks no request holds, least recently used first: the only
        # blocks eviction may take.
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self._chains: dict[object, list[bytes]] = {}   # request -> hashes of its full blocks
        self.num_hit_tokens = 0                         # tokens served from the cache, all requests
        self.num_evictions = 0

    # ---- the free pool: clean blocks + evictable cached blocks -------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks) + len(self.evictable)

    def _take_free_block(self) -> int:
        """A clean block if there is one, else evict the least recently used cached block."""
        if self.free_blocks:
            return self.free_blocks.popleft()
        block, _ = self.evictable.popitem(last=False)          # least recently used
        del self.hash_to_block[self.block_hash.pop(block)]
        self.num_evictions += 1
        return block

    def free(self, request_id) -> None:
        # Tail blocks first: they join the LRU list before the shared head of
        # the prefix, so they are evicted first (a long prefix's tail is the
        # part other prompts are least likely to share).
        for block in reversed(self.block_tables.pop(request_id, ())):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                if block in self.block_hash:
                    self.evictable[block] = None
                else:
                    self.free_blocks.append(block)
        self._chains.pop(request_id, None)

    # ---- undoing a failed step -------------------------------------------------------
    def checkpoint(self):
        """Prefix caching moves blocks between three places (tables, the clean
        free list, the LRU of cached blocks) and names and evicts them: a step
        that fails is undone from a copy of all of it (O(blocks), not O(requests))."""
        return ({r: list(t) for r, t in self.block_tables.items()}, list(self.free_blocks),
                list(self.ref_counts), dict(self.hash_to_block), dict(self.block_hash),
                OrderedDict(self.evictable), {r: list(c) for r, c in self._chains.items()},
                self.num_hit_tokens, self.num_evictions)

    def rollback(self, checkpoint) -> None:
        (tables, free, ref_counts, hash_to_block, block_hash, evictable, chains,
         self.num_hit_tokens, self.num_evictions) = checkpoint
        # In place: the model runner holds these very objects.
        self.block_tables.clear()
        self.block_tables.update(tables)
        self.free_blocks.clear()
        self.free_blocks.extend(free)
        self.ref_counts[:] = ref_counts
        self.hash_to_block, self.block_hash, self.evictable, self._chains = \
            hash_to_block, block_hash, evictable, chains

    # ---- hits and registration ---------------------------------------------------
    def lookup(self, token_ids) -> list[int]:
        """The cached blocks holding the longest cached prefix of token_ids
        (whole blocks, at most len(token_ids) - 1 tokens). Changes nothing."""
        limit = max_cached_tokens(len(token_ids), self.block_size) // self.block_size
        blocks = []
        for h in block_hashes(token_ids, self.block_size, limit):
            block = self.hash_to_block.get(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def claim_cached_prefix(self, request) -> int:
        """Give a request that holds no blocks the cached blocks of its longest
        cached prefix; returns how many of its tokens they hold (0: none)."""
        if self.block_tables.get(request.request_id) or request.prompt_token_ids is None:
            return 0
        token_ids = request.token_ids(0, request.num_tokens)
        blocks = self.lookup(token_ids)
        if not blocks:
            return 0
        for block in blocks:
            if self.ref_counts[block] == 0:
                del self.evictable[block]                       # in use again: not evictable
            self.ref_counts[block] += 1
        self.block_tables[request.request_id] = list(blocks)
        self._chains[request.request_id] = [self.block_hash[b] for b in blocks]
        num_tokens = len(blocks) * self.block_size
        self.num_hit_tokens += num_tokens
        return num_tokens

    def release_cached_prefix(self, request, num_tokens: int) -> None:
        """Undo claim_cached_prefix for a request that could not start after all."""
        self.free(request.request_id)
        self.num_hit_tokens -= num_tokens

    def cache_computed_blocks(self, request) -> None:
        """Name every block of request that is full and computed, so that
        later requests can reuse it. A block whose content another block
        already holds stays unnamed (it is freed, not cached, at the end)."""
        if request.prompt_token_ids is None:
            return
        table = self.block_tables.get(request.request_id)
        if not table:
            return
        chain = self._chains.setdefault(request.request_id, [])
        # A verification's accepted drafts are computed before the engine appends them as
        # tokens: name only blocks whose tokens the request already holds.
        full = min(min(request.num_computed_tokens, request.num_tokens) // self.block_size, len(table))
        bs = self.block_size
        for i in range(len(chain), full):
            parent = chain[-1] if chain else ROOT_HASH
            h = hash_block(parent, request.token_ids(i * bs, (i + 1) * bs))
            chain.append(h)
            block = table[i]
            if h not in self.hash_to_block and block not in self.block_hash:
                self.hash_to_block[h] = block
                self.block_hash[block] = h

    # ---- invariants ---------------------------------------------------------------
    def num_leaked_blocks(self) -> int:
        owned = {b for table in self.block_tables.values() for b in table}
        free = set(self.free_blocks) | set(self.evictable)
        return sum(1 for b in range(self.num_blocks) if b not in owned and b not in free)

    def check_invariants(self, requests=()) -> list[str]:
        """Every way the pool could be inconsistent; [] when it is sound.

        requests: the running requests, to check that no block shared by two
        tables (or named in the cache) sits where its request still writes.
        """
        problems = []
        holders: dict[int, int] = {}
        for table in self.block_tables.values():
            for b in table:
                holders[b] = holders.get(b, 0) + 1
        for b in range(self.num_blocks):
            if self.ref_counts[b] != holders.get(b, 0):
                problems.append(f"block {b}: ref count {self.ref_counts[b]} but {holders.get(b, 0)} tables")
        free, evictable = set(self.free_blocks), set(self.evictable)
        if free & evictable or (free | evictable) & set(holders):
            problems.append("a block is both free and in use")
        if any(b not in self.block_hash for b in evictable) or any(b in self.block_hash for b in free):
            problems.append("evictable list and cache names disagree")
        if any(self.hash_to_block.get(h) != b for b, h in self.block_hash.items()):
            problems.append("hash_to_block and block_hash disagree")
        if self.num_leaked_blocks():
            problems.append(f"{self.num_leaked_blocks()} blocks leaked")
        for r in requests:
            table = self.block_tables.get(r.request_id, ())
            first_writable = r.num_computed_tokens // self.block_size
            for b in table[first_writable:]:
                if self.ref_counts[b] > 1 or b in self.block_hash:
                    problems.append(f"request {r.request_id}: block {b} is shared or cached but still written")
        return problems


def make_block_manager(num_blocks: int, block_size: int, enable_prefix_caching: bool = False) -> BlockManager:
    """The engine's block manager: with or without prefix caching (vLLM's switch name)."""
    if not isinstance(enable_prefix_caching, bool):
        raise ValueError(f"enable_prefix_caching={enable_prefix_caching!r}: must be True or False")
    cls = PrefixCachingBlockManager if enable_prefix_caching else BlockManager
    return cls(num_blocks, block_size)
