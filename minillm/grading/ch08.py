"""Checkers for exercises/08_chunked_prefill_in_a_server: compare the learner's function with the engine.

Each checker draws fresh random cases and asks the engine's own pieces for the
answer (the prefix cache's block manager, the Scheduler, the disaggregation
module's goodput); the engine functions the learner might call instead are
switched off while the learner's function runs.
"""
from __future__ import annotations

import random

from .. import prefix_cache
from ..kv_cache import BlockManager
from ..request import Request, SamplingParams
from ..scheduler import Scheduler, SchedulerConfig
from ..sim.disaggregation import highest_rate_meeting
from ._common import fail as _fail, learner_call, passed, call_text, checker
from ._reference import ch08 as _ref

__all__ = ["check_chain_hashes", "check_tokens_to_compute", "check_plan_prefill_step", "check_goodput_rate",
           "check_eviction_order", "check_prefill_tokens_saved"]

_HASHES = ("minillm.prefix_cache.block_hashes",)
_CACHED = ("minillm.prefix_cache.max_cached_tokens",
           "minillm.prefix_cache.PrefixCachingBlockManager.claim_cached_prefix")


# ---------------------------------------------------------------------------
# 1. Chained block hashes
# ---------------------------------------------------------------------------
@checker
def check_chain_hashes(chain_hashes, seed: int | None = None, *, num_cases: int = 200):
    """chain_hashes(token_ids, block_size) -> list of bytes, vLLM's scheme."""
    rng = random.Random(seed)
    for case in range(num_cases):
        block_size = rng.choice([1, 2, 4, 16])
        block = [rng.randrange(50) for _ in range(block_size)]
        tokens = [rng.randrange(50) for _ in range(rng.randint(0, 70))]
        if case % 3 == 0:                       # the same block twice: only a chain tells them apart
            tokens = block + block + tokens
        expected = prefix_cache.block_hashes(tokens, block_size)
        got = list(learner_call(chain_hashes, list(tokens), block_size, forbidden=_HASHES,
                                why="chain hash_block yourself, block by block."))
        if got != expected:
            if len(got) == len(expected) + 1:
                why = ("; a partial last block gets no hash: loop over the len(token_ids) // block_size "
                       "full blocks only")
            elif len(got) != len(expected):
                why = ""
            else:
                first = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
                why = (f"; the first wrong one is block {first} (each block's parent is the previous block's "
                       "hash; the first block's is ROOT_HASH)")
            _fail(f"for {len(tokens)} tokens in blocks of {block_size} you returned {len(got)} hashes, "
                  f"expected {len(expected)}{why}")
    return passed(f"chain_hashes: {num_cases} random prompts hash as the engine's prefix cache does")


# ---------------------------------------------------------------------------
# 2. Tokens a prompt still computes when its prefix is cached
# ---------------------------------------------------------------------------
def engine_tokens_to_compute(prompt_len: int, cached_blocks: int, block_size: int) -> int:
    """Cache the first cached_blocks full blocks of a prompt, then ask the engine's
    block manager how much of the prompt a new request with it can skip."""
    rng = random.Random(prompt_len * 1009 + cached_blocks)
    prompt = [rng.randrange(1000) for _ in range(prompt_len)]
    bm = prefix_cache.PrefixCachingBlockManager(2 * (prompt_len // block_size + 2), block_size)
    if cached_blocks:
        earlier = Request("earlier", prompt[:cached_blocks * block_size], SamplingParams(), 0.0)
        bm.allocate("earlier", earlier.num_tokens)
        earlier.num_computed_tokens = earlier.num_tokens
        bm.cache_computed_blocks(earlier)
        bm.free("earlier")
    return prompt_len - bm.claim_cached_prefix(Request("new", prompt, SamplingParams(), 0.0))


@checker
def check_tokens_to_compute(tokens_to_compute, seed: int | None = None, *, num_cases: int = 300):
    """tokens_to_compute(prompt_len, cached_blocks, block_size) -> prompt tokens the step computes."""
    rng = random.Random(seed)
    for case in range(num_cases):
        block_size = rng.choice([1, 4, 16])
        prompt_len = rng.randint(1, 100)
        full = prompt_len // block_size
        cached_blocks = full if case % 3 == 0 else rng.randint(0, full)     # whole prompt cached, often
        expected = engine_tokens_to_compute(prompt_len, cached_blocks, block_size)
        got = learner_call(tokens_to_compute, prompt_len, cached_blocks, block_size, forbidden=_CACHED,
                           why="work it out from the rule.")
        if got != expected:
            _fail(f"prompt of {prompt_len} tokens, blocks of {block_size}, its first {cached_blocks} blocks cached: "
                  f"you said {got} tokens to compute, the engine computes {expected} (a hit covers whole blocks "
                  "and never the prompt's last token)")
    return passed(f"tokens_to_compute: {num_cases} random prompts agree with the engine's prefix cache")


# ---------------------------------------------------------------------------
# 3. One step under the long-prefill cap
# ---------------------------------------------------------------------------
def engine_plan_prefill_step(prompt_lens, chunk_size: int, threshold: int) -> list[int]:
    """Tokens each waiting prompt gets in the first step of the engine's Scheduler."""
    config = SchedulerConfig(chunk_size=chunk_size, long_prefill_token_threshold=threshold,
                             max_num_seqs=max(1, len(prompt_lens)))
    sched = Scheduler(config, BlockManager(sum(prompt_lens) + 64, 1))   # room to spare: no memory limit here
    requests = [Request(i, None, SamplingParams(), 0.0, prompt_len=n) for i, n in enumerate(prompt_lens)]
    for r in requests:
        sched.add(r)
    got = {r.request_id: n for r, n in sched.schedule().scheduled}
    return [got.get(i, 0) for i in range(len(prompt_lens))]


@checker
def check_plan_prefill_step(plan_prefill_step, seed: int | None = None, *, num_cases: int = 300):
    """plan_prefill_step(prompt_lens, chunk_size, threshold) -> tokens per prompt in this step."""
    rng = random.Random(seed)
    for _ in range(num_cases):
        prompt_lens = [rng.choice([rng.randint(1, 40), rng.randint(200, 3000)]) for _ in range(rng.randint(1, 6))]
        chunk_size = rng.choice([64, 128, 512])
        threshold = rng.choice([0, rng.randint(1, chunk_size), rng.randint(chunk_size, 2 * chunk_size)])
        expected = engine_plan_prefill_step(prompt_lens, chunk_size, threshold)
        got = learner_call(plan_prefill_step, list(prompt_lens), chunk_size, threshold,
                           forbidden=("minillm.scheduler.Scheduler.schedule",),
                           why="plan the step yourself from the rule.")
        if list(got) != expected:
            _fail(f"prompts {prompt_lens}, chunk_size {chunk_size}, long_prefill_token_threshold {threshold}: "
                  f"you planned {list(got)}, the scheduler plans {expected} (first come first served, no prompt "
                  "above the threshold per step when it is > 0, the rest of the chunk to the next prompts)")
    return passed(f"plan_prefill_step: {num_cases} random queues planned as the engine's scheduler plans them")


# ---------------------------------------------------------------------------
# 4. DistServe's goodput
# ---------------------------------------------------------------------------
@checker
def check_goodput_rate(goodput_rate, seed: int | None = None, *, num_cases: int = 300):
    """goodput_rate(attainment_by_rate, target) -> the highest rate before attainment first drops below target."""
    rng = random.Random(seed)
    for _ in range(num_cases):
        rates = sorted(rng.sample([0.5, 1, 2, 3, 4, 6, 8, 12, 16], rng.randint(1, 9)))
        attainment = {r: rng.choice([1.0, 0.95, 0.9, 0.85, 0.5, 0.0]) for r in rates}
        target = rng.choice([0.9, 0.95, 0.5])
        shuffled = dict(rng.sample(list(attainment.items()), len(attainment)))
        expected = highest_rate_meeting(attainment, target)
        got = learner_call(goodput_rate, shuffled, target,
                           forbidden=("minillm.sim.disaggregation.highest_rate_meeting",),
                           why="scan the rates yourself.")
        if got != expected:
            _fail(f"attainment by rate {attainment}, target {target}: you said {got}, expected {expected} "
                  "(scan rates upward, stop at the first that misses the target; 0.0 if the lowest misses)")
    return passed(f"goodput: {num_cases} random sweeps agree with the disaggregation module")


# ---------------------------------------------------------------------------
# 5. Which cached blocks go first: reference counts and the LRU list
# ---------------------------------------------------------------------------
_BLOCK_MANAGER = ("minillm.prefix_cache.PrefixCachingBlockManager.free",
                  "minillm.prefix_cache.PrefixCachingBlockManager._take_free_block",
                  "minillm.prefix_cache.PrefixCachingBlockManager.allocate",
                  "minillm.kv_cache.BlockManager.allocate", "minillm.kv_cache.BlockManager.free",
                  "minillm.grading._reference.ch08.engine_eviction_order")


def _eviction_case(rng: random.Random):
    """Requests holding named blocks, some sharing a prefix of them; some finish."""
    next_block, tables = 0, {}
    prefixes = []
    for name in "abcdefg"[:rng.randint(2, 6)]:
        shared = list(rng.choice(prefixes)) if prefixes and rng.random() < 0.6 else []
        shared = shared[:rng.randint(0, len(shared))]
        own = list(range(next_block, next_block + rng.randint(1, 4)))
        next_block += len(own)
        tables[name] = shared + own
        prefixes.append(tables[name])
    names = list(tables)
    finish_order = rng.sample(names, rng.randint(1, len(names)))
    num_clean = rng.randint(0, 3)
    freed = len({b for n in finish_order for b in tables[n]} - {b for n in names if n not in finish_order
                                                                for b in tables[n]})
    num_needed = num_clean + rng.randint(0, freed)
    return tables, finish_order, num_clean, num_needed


def _lru(tables, finish_order, num_clean, num_needed, tail_first=True, ref_counts=True, clean_first=True):
    """The eviction order under the engine's rules, or with one of them broken (to name the mistake)."""
    holders = {}
    for table in tables.values():
        for block in table:
            holders[block] = holders.get(block, 0) + 1
    lru = []
    for request_id in finish_order:
        for block in (reversed(tables[request_id]) if tail_first else tables[request_id]):
            holders[block] -= 1
            if (holders[block] == 0 or not ref_counts) and block not in lru:
                lru.append(block)
    return lru[:max(0, num_needed - num_clean)] if clean_first else lru[:num_needed]


@checker
def check_eviction_order(fn, seed: int | None = None, *, num_cases: int = 200):
    """fn(tables, finish_order, num_clean, num_needed) -> the cached blocks evicted, in order."""
    rng = random.Random(seed)
    cases = [({"a": [0, 1, 2], "b": [0, 1, 3], "c": [4]}, ["a", "c", "b"], 2, 5),   # shared head, tail first
             ({"a": [0, 1], "b": [0, 1, 2]}, ["a"], 0, 0),                          # b still holds them all
             ({"a": [0, 1, 2, 3]}, ["a"], 1, 3)]                                     # clean block first
    cases += [_eviction_case(rng) for _ in range(num_cases)]
    for tables, finish_order, num_clean, num_needed in cases:
        expected = _ref.engine_eviction_order(tables, finish_order, num_clean, num_needed)
        args = ({k: list(v) for k, v in tables.items()}, list(finish_order), num_clean, num_needed)
        got = learner_call(fn, *args, forbidden=_BLOCK_MANAGER, why="follow the blocks yourself.")
        if list(got) == expected:
            continue
        got = list(got)
        hint = ""
        if got == _lru(tables, finish_order, num_clean, num_needed, ref_counts=False):
            hint = ("A block shared by several requests becomes evictable only when its LAST holder leaves (its "
                    "reference count reaches 0); until then a running request still reads it. ")
        elif got == _lru(tables, finish_order, num_clean, num_needed, tail_first=False):
            hint = ("A leaving request releases its blocks tail first (its last block first), so the head of a "
                    "prefix, the part other prompts share, stays longest. ")
        elif got == _lru(tables, finish_order, num_clean, num_needed, clean_first=False):
            hint = "Clean blocks are taken before any cached block is evicted: taking one is not an eviction. "
        elif got == _lru(tables, finish_order, num_clean, num_needed)[::-1] or got == list(reversed(expected)):
            hint = "The LRU list is evicted from its front: the block freed longest ago goes first. "
        _fail(f"{hint}{call_text(fn, *args)} returned {got}, the engine's block manager evicts {expected}")
    return passed(f"eviction_order: {len(cases)} pools evict in the engine's order")


# ---------------------------------------------------------------------------
# 6. The prefill a shared system prompt saves: predict, then measure
# ---------------------------------------------------------------------------
_ENGINE_RUN = ("minillm.engine.EngineCore.step", "minillm.engine.LLMEngine.generate",
               "minillm.sim.simulator.simulate", "minillm.prefix_cache.PrefixCachingBlockManager.lookup",
               "minillm.prefix_cache.PrefixCachingBlockManager.claim_cached_prefix",
               "minillm.grading._reference.ch08.engine_prefill_tokens") + _CACHED


@checker
def check_prefill_tokens_saved(fn, seed: int | None = None, *, num_cases: int = 12):
    """fn(system_len, user_lens, block_size) -> the prompt tokens each chat computes, a list.

    The checker runs the engine (its scheduler and prefix-caching block manager, a
    model-free executor) on the same chats and measures what each one computed.
    """
    rng = random.Random(seed)
    cases = [(40, [3, 0, 10, 5], 16),          # the system prompt ends mid-block
             (128, [8, 16, 0], 16),            # a chat that is the system prompt alone: its last block reruns
             (10, [5, 5], 16)]                 # a system prompt shorter than a block: nothing to share
    while len(cases) < num_cases:
        block_size = rng.choice([4, 16, 32])
        cases.append((rng.randint(1, 300), [rng.choice([0, rng.randint(1, 5), rng.randint(1, 80)])
                                             for _ in range(rng.randint(1, 6))], block_size))
    total_measured = total_prompt = 0
    for system_len, user_lens, block_size in cases:
        measured = _ref.engine_prefill_tokens(system_len, user_lens, block_size)
        args = (system_len, list(user_lens), block_size)
        got = learner_call(fn, *args, forbidden=_ENGINE_RUN, why="predict it from the rules; the checker runs "
                           "the engine for you.")
        if not isinstance(got, (list, tuple)) or len(got) != len(user_lens):
            _fail(f"{call_text(fn, *args)} returned {got!r}: return one number per chat ({len(user_lens)})")
        got = list(got)
        if got == measured:
            total_measured += sum(measured)
            total_prompt += sum(system_len + u for u in user_lens)
            continue
        k = next(i for i, (a, b) in enumerate(zip(got, measured)) if a != b)
        prompt_len = system_len + user_lens[k]
        shared_blocks = system_len // block_size
        hint = ""
        if k == 0:
            hint = "The first chat finds nothing cached: it computes its whole prompt. "
        elif user_lens[k] == 0 and got[k] == prompt_len - shared_blocks * block_size:
            hint = ("A chat whose prompt is all cached still runs its last prompt token (its logits give the "
                    "first output token), and blocks are the unit: its last block reruns. ")
        elif got[k] == prompt_len - system_len and system_len % block_size:
            hint = ("A hit covers whole blocks only: the system prompt's last, partial block holds user tokens "
                    "too, so no other chat shares it. ")
        elif got[k] == prompt_len:
            hint = "Later chats reuse the system prompt's full blocks, cached by the first chat. "
        _fail(f"{hint}{call_text(fn, *args)}: you predict {got[k]} tokens for chat {k} ({prompt_len}-token prompt, "
              f"blocks of {block_size}), the engine computed {measured[k]} (all chats: you {got}, the engine "
              f"{measured})")
    saved = 1 - total_measured / total_prompt
    return passed(f"prefill_tokens_saved: {len(cases)} chat sequences, your counts are the engine's to the token; "
                  f"the cache saved {saved:.0%} of their prompt tokens")
