"""Checkers for exercises/03_kv_cache: compare the learner's function with the engine.

The engine's own helpers (blocks_for, BlockManager.slot_mapping,
PagedKVCache.gather, blocks_that_fit, kv_bytes_per_token) raise while the
learner's function runs; some inputs are ones those helpers would not take (a
token count far past any cache), so a wrapper cannot pass. Two tasks go past the
chapter: copy-on-write when a forked request appends to a shared block, and a
prediction of the tokens the forward passes process with and without a cache,
measured on the engine.
"""
from __future__ import annotations

import random

import torch

from ..config import PRESETS, ModelConfig
from ..kv_cache import BlockManager, PagedKVCache, blocks_for, blocks_that_fit
from ._common import call_text, checker, fail as _fail, grade_prediction, learner_call, passed, record_forward
from ._reference import ch03 as _ref

__all__ = ["check_blocks_needed", "check_slot_mapping", "check_gather_kv", "check_blocks_that_fit",
           "check_append_slot", "check_forward_tokens"]

_WHY = "the exercise is to compute it yourself."
_BLOCKS_FOR = ("minillm.kv_cache.blocks_for", "minillm.kv_cache.BlockManager.blocks_missing")
_SLOTS = ("minillm.kv_cache.BlockManager.slot_mapping",)
_GATHER = ("minillm.kv_cache.PagedKVCache.gather", "minillm.attention.gather_kv")
_FIT = ("minillm.kv_cache.blocks_that_fit", "minillm.kv_cache.kv_bytes_per_token",
        "minillm.config.ModelConfig.kv_bytes_per_token")


def _random_table(rng: random.Random, num_tokens: int, block_size: int, num_blocks: int) -> list[int]:
    """A block table as a busy pool hands it out: distinct blocks in no particular order."""
    return rng.sample(range(num_blocks), blocks_for(num_tokens, block_size))


@checker
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
            _fail(f"{call_text(fn, num_tokens, block_size)} returned {got!r}, expected {expected}. {hint}")
    passed(f"check_blocks_needed: correct on {len(cases)} cases")


@checker
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
        call = call_text(fn, list(table), start, end, block_size)
        got = learner_call(fn, list(table), start, end, block_size, forbidden=_SLOTS, why=_WHY)
        got = got.tolist() if isinstance(got, torch.Tensor) else list(got)
        if len(got) != len(expected):
            _fail(f"{call} returned {len(got)} slots, expected {len(expected)}, one per position in "
                  "[start, end): end is excluded")
        if got != expected:
            _fail(f"{call} returned {got[:8]}{'...' if len(got) > 8 else ''}, expected {expected[:8]}"
                  f"{'...' if len(expected) > 8 else ''}. Position p lives in block "
                  "block_table[p // block_size] at offset p % block_size.")
    passed("check_slot_mapping: correct on 30 random block tables")


@checker
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
        call = call_text(fn, cache.data[0, 0], list(table), num_tokens)
        got = learner_call(fn, cache.data[0, 0].clone(), list(table), num_tokens, forbidden=_GATHER, why=_WHY)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(expected.shape):
            _fail(f"{call}: expected a tensor of shape "
                  f"{tuple(expected.shape)}, got {getattr(got, 'shape', type(got).__name__)}")
        if not torch.equal(got, expected):
            wrong = (got != expected).any(-1).any(-1).nonzero().flatten().tolist()
            _fail(f"{call} (block_table={table}, block_size={block_size}): positions "
                  f"{wrong[:6]} hold the wrong keys. Read the blocks in table order and cut at num_tokens.")
    passed("check_gather_kv: correct on 20 random caches")


@checker
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
        # Always a real ModelConfig: a learner who calls cfg.kv_bytes_per_token (chapter 3 shows it)
        # gets the forbidden-call message, not an AttributeError on a stand-in object.
        got = learner_call(fn, cfg, num_bytes, block_size, dtype_bytes, forbidden=_FIT, why=_WHY)
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
            _fail(f"{call_text(fn, cfg, num_bytes, block_size, dtype_bytes)} returned {got!r}, expected "
                  f"{expected:,} ({cfg.name}: layers {cfg.num_layers}, kv heads {cfg.num_kv_heads}, head_dim "
                  f"{cfg.head_dim}). {hint}A block holds block_size tokens of K and V for every layer and KV head; "
                  "count whole blocks only.")
    passed(f"check_blocks_that_fit: correct on {len(configs)} model shapes")


# ---------------------------------------------------------------------------
# Transfer: copy-on-write after a fork
# ---------------------------------------------------------------------------
def _forked_state(rng: random.Random, block_size: int):
    """A pool where a parent and 1-3 forks share the parent's blocks (ref counts > 1), plus an
    unrelated request; returns (tables {name: (table, num_tokens)}, ref_counts, free_blocks)."""
    num_blocks = 64
    free = list(range(num_blocks))
    rng.shuffle(free)
    refs = [0] * num_blocks
    tables = {}
    for name in ("parent", "other"):
        n = rng.randint(1, 5 * block_size)
        table = [free.pop(0) for _ in range(blocks_for(n, block_size))]
        for b in table:
            refs[b] = 1
        tables[name] = (table, n)
    for i in range(rng.randint(1, 3)):                 # forks share every block of the parent
        table, n = tables["parent"]
        for b in table:
            refs[b] += 1
        tables[f"fork{i}"] = (list(table), n)
    return tables, refs, free


def _describe_append_mistake(got, want, before_refs, refs, want_refs, free, want_free, table, num_tokens, block_size):
    got_table, got_slot, got_copy = got
    last = table[-1] if table else None
    offset = num_tokens % block_size
    shared = last is not None and offset and before_refs[last] > 1
    if shared and got_slot == last * block_size + offset:
        return (f"the last block ({last}) is shared by {before_refs[last]} requests and has room: writing your token "
                "there changes what the others read. Copy it to a fresh block first (copy-on-write)")
    if offset and not shared and got_copy is not None:
        return (f"block {last} is this request's alone (ref count 1): no copy is needed, write at offset "
                f"{offset} in place")
    if offset and got_table is not None and len(got_table) == len(table) + 1:
        return (f"the last block has room (position {num_tokens} is offset {offset} of it): only a full last "
                "block needs a new one")
    if not offset and got_copy is not None:
        return "a full last block is never written again: take a fresh block, nothing to copy"
    if shared and got_copy == want[2] and refs[last] == before_refs[last]:
        return (f"after the copy this request no longer holds block {last}: its ref count must drop by one "
                f"(to {want_refs[last]}), or it is never freed")
    if got_copy != want[2]:
        return f"copy should be {want[2]} (source block, new block) and is {got_copy}"
    if free != want_free:
        return "take the new block from the FRONT of free_blocks (pop(0)) and only when one is needed"
    if refs != want_refs:
        return "the new block's ref count must be 1, the others unchanged"
    return "compare with the statement's three cases"


@checker
def check_append_slot(fn, seed: int | None = None):
    """fn(block_table, num_tokens, ref_counts, free_blocks, block_size) -> (new_table, slot, copy)."""
    rng = random.Random(seed)
    cases = 0
    for trial in range(30):
        block_size = rng.choice([1, 4, 16]) if trial > 2 else 4
        tables, refs, free = _forked_state(rng, block_size)
        names = list(tables)
        if trial == 0:                                  # a fork appends into the shared, partly filled block
            tables["fork0"] = (tables["parent"][0], 6)
            names = ["fork0"]
        for name in rng.sample(names, len(names)) if trial else names:
            table, n = tables[name]
            if trial == 0:
                parent_table = [free.pop(0), free.pop(0)]
                for b in parent_table:
                    refs[b] = 2
                table, n = parent_table, 6
            want_refs, want_free = list(refs), list(free)
            want = _ref.append_slot(table, n, want_refs, want_free, block_size)
            got_refs, got_free = list(refs), list(free)
            call = call_text(fn, list(table), n, "<ref_counts>", "<free_blocks>", block_size).replace("'", "")
            got = learner_call(fn, list(table), n, got_refs, got_free, block_size,
                               forbidden=_SLOTS + ("minillm.kv_cache.BlockManager.allocate",),
                               why="the engine has no copy-on-write: write it from the statement.")
            if not (isinstance(got, (tuple, list)) and len(got) == 3):
                _fail(f"{call} returned {got!r}: return (new_table, slot, copy), copy None or (src, dst)")
            got = (list(got[0]), got[1], None if got[2] is None else tuple(got[2]))
            if got != want or got_refs != want_refs or got_free != want_free:
                mistake = _describe_append_mistake(got, want, refs, got_refs, want_refs, got_free, want_free,
                                                   table, n, block_size)
                shared = table and refs[table[-1]] > 1
                _fail(f"{call} (last block {table[-1] if table else None}, ref count "
                      f"{refs[table[-1]] if table else '-'}{', shared' if shared else ''}) returned {got}, "
                      f"expected {want}: {mistake}")
            refs, free = want_refs, want_free
            tables[name] = (want[0], n + 1)
            cases += 1
    passed(f"copy-on-write correct on {cases} appends to forked requests (ref counts and free list too)")


# ---------------------------------------------------------------------------
# Predict, then measure: tokens through the forward passes, with and without a cache
# ---------------------------------------------------------------------------
def measured_forward_tokens(model, prompt_len: int, num_output_tokens: int, rng: random.Random):
    """(without a cache, with one): tokens the forward passes process to generate num_output_tokens
    greedy tokens, measured by recording the engine's forward passes."""
    from ..engine import LLMEngine
    from ..prefill import prefill_kv
    from ..request import SamplingParams
    from ..scheduler import SchedulerConfig
    prompt = [rng.randrange(model.cfg.vocab_size) for _ in range(prompt_len)]
    with record_forward(model) as no_cache:
        tokens = list(prompt)
        for _ in range(num_output_tokens):                # recompute everything for every new token
            _, logits = prefill_kv(model, tokens)
            tokens.append(int(logits[-1].argmax()))
    engine = LLMEngine(model, SchedulerConfig(), block_size=16, num_blocks=8)
    with record_forward(model) as cached:
        engine.generate([prompt], SamplingParams(max_tokens=num_output_tokens, ignore_eos=True))
    return sum(c.num_tokens for c in no_cache.calls), sum(c.num_tokens for c in cached.calls)


@checker
def check_forward_tokens(fn, seed: int | None = None):
    """fn(prompt_len, num_output_tokens) -> (without_cache, with_cache): predicted token counts through the
    forward passes; the checker measures them on the engine (exact counts: tolerance 0)."""
    from ..config import ModelConfig as _Config
    from ..loader import build_model
    rng = random.Random(seed)
    model = build_model(_Config(name="count", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1,
                                num_heads=2, num_kv_heads=1, max_position=256), seed=0)
    cases = [(5, 1), (5, 4), (1, 3)] + [(rng.randint(1, 30), rng.randint(1, 8)) for _ in range(4)]
    for prompt_len, num_out in cases:
        measured = measured_forward_tokens(model, prompt_len, num_out, rng)
        call = call_text(fn, prompt_len, num_out)
        got = learner_call(fn, prompt_len, num_out, forbidden=("minillm.prefill.prefill_kv",
                                                               "minillm.engine.LLMEngine.step"),
                           why="predict the counts from how generation runs, without running it.")
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            _fail(f"{call} returned {got!r}: return a pair (without_cache, with_cache)")
        for what, g, m in (("without a cache", got[0], measured[0]), ("with a cache", got[1], measured[1])):
            why = "count the tokens each forward pass takes, one pass per generated token"
            if isinstance(g, int) and g == m + 1 and what == "with a cache":
                why = ("the prefill's pass already produces the first output token: only the later tokens need "
                       "a decode pass each")
            elif isinstance(g, int) and what == "without a cache" and g == m + prompt_len + num_out:
                why = "the last generated token is never fed back: it needs no forward pass"
            grade_prediction(f"{call}, {what}", g, m, 0.0, why, unit=" tokens")
    big = learner_call(fn, 100_000, 10_000, forbidden=("minillm.prefill.prefill_kv",))
    if not (isinstance(big, (tuple, list)) and len(big) == 2):
        _fail(f"{call_text(fn, 100_000, 10_000)} returned {big!r}: return a pair")
    grade_prediction(call_text(fn, 100_000, 10_000) + ", without a cache", big[0],
                     10_000 * 100_000 + 10_000 * 9_999 // 2, 0.0, "reason from the small cases", unit=" tokens")
    passed(f"your predicted token counts match the engine's forward passes on {len(cases)} generations")
