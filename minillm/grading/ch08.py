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
from ._common import fail as _fail, learner_call, passed

__all__ = ["check_chain_hashes", "check_tokens_to_compute", "check_plan_prefill_step", "check_goodput_rate"]

_HASHES = ("minillm.prefix_cache.block_hashes",)
_CACHED = ("minillm.prefix_cache.max_cached_tokens",
           "minillm.prefix_cache.PrefixCachingBlockManager.claim_cached_prefix")


# ---------------------------------------------------------------------------
# 1. Chained block hashes
# ---------------------------------------------------------------------------
def check_chain_hashes(chain_hashes, seed: int | None = None, *, num_cases: int = 200):
    """chain_hashes(token_ids, block_size) -> list of bytes, vLLM's scheme."""
    rng = random.Random(0 if seed is None else seed)      # a fixed case list unless asked
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


def check_tokens_to_compute(tokens_to_compute, seed: int | None = None, *, num_cases: int = 300):
    """tokens_to_compute(prompt_len, cached_blocks, block_size) -> prompt tokens the step computes."""
    rng = random.Random(0 if seed is None else seed)      # a fixed case list unless asked
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


def check_plan_prefill_step(plan_prefill_step, seed: int | None = None, *, num_cases: int = 300):
    """plan_prefill_step(prompt_lens, chunk_size, threshold) -> tokens per prompt in this step."""
    rng = random.Random(0 if seed is None else seed)      # a fixed case list unless asked
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
def check_goodput_rate(goodput_rate, seed: int | None = None, *, num_cases: int = 300):
    """goodput_rate(attainment_by_rate, target) -> the highest rate before attainment first drops below target."""
    rng = random.Random(0 if seed is None else seed)      # a fixed case list unless asked
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
