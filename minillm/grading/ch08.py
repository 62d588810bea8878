"""Checkers for exercises/08_chunked_prefill_in_a_server: compare the learner's function with the engine.

Each checker draws cases and asks the engine's own pieces for the answer (the
prefix cache's hashes and block manager, the Scheduler and its step loop run
with a model-free executor); the engine functions the learner might call
instead are switched off while the learner's function runs. Where the task has
no engine function (a salted chain of hashes), the checker tests the
properties the answer must have. Nothing here imports the reference answers
(minillm.grading._reference).
"""
from __future__ import annotations

import random

from .. import prefix_cache
from ..prefix_cache import PrefixCachingBlockManager, make_block_manager
from ..request import Request, SamplingParams
from ..scheduler import SchedulerConfig
from ._common import fail as _fail, learner_call, passed, call_text, checker
from ._engine_runs import first_token_step, model_free_core, one_token, roomy_blocks

__all__ = ["check_salted_hashes", "check_tokens_to_compute", "check_first_token_steps",
           "check_threshold_for_short_ttft", "check_eviction_order", "check_prefill_tokens_saved"]

_HERE = "minillm.grading.ch08."
_HASHES = ("minillm.prefix_cache.block_hashes",)
_CACHED = ("minillm.prefix_cache.max_cached_tokens",
           "minillm.prefix_cache.PrefixCachingBlockManager.claim_cached_prefix")
_ENGINE_STEPS = ("minillm.scheduler.Scheduler.schedule", "minillm.engine.EngineCore.step",
                 "minillm.sim.simulator.simulate",
                 *(_HERE + name for name in ("_engine_first_token_steps", "_shorts_within",
                                             "_engine_eviction_order", "_engine_prefill_tokens")))


# ---------------------------------------------------------------------------
# 1. A salted chain of block hashes (vLLM's cache_salt)
# ---------------------------------------------------------------------------
def _chain_mistake(got, expected) -> str:
    if len(got) == len(expected) + 1:
        return ("; a partial last block gets no hash: only the len(token_ids) // block_size full blocks "
                "are named")
    if len(got) != len(expected):
        return ""
    first = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
    return (f"; the first wrong one is block {first} (each block's parent is the previous block's hash; the "
            "first block's is ROOT_HASH)")


def _salt_cases(rng: random.Random, num_cases: int):
    """(prompt a, prompt b sharing its first `shared` full blocks, block_size, shared)."""
    for case in range(num_cases):
        block_size = rng.choice([1, 2, 4, 16])
        shared = rng.randint(1, 4)
        head = [rng.randrange(50) for _ in range(shared * block_size)]
        a = head + [rng.randrange(50) for _ in range(rng.randint(block_size, 40))]
        b = head + [50 + rng.randrange(50) for _ in range(rng.randint(0, 40))]     # differs right after the head
        if case % 4 == 0:                      # the same block twice: only a chain tells them apart
            a = head[:block_size] * 2 + a
            b = head[:block_size] * 2 + b
            shared += 2
        yield a, b, block_size, shared


@checker
def check_salted_hashes(fn, seed: int | None = None, *, num_cases: int = 120):
    """fn(token_ids, block_size, salt=None) -> the names of the full blocks. Without a salt: vLLM's
    chain, as the engine's prefix_cache.block_hashes. With one: a tenant's prompts share prefix
    blocks as before, and no block is shared between salts (or with the unsalted chain)."""
    rng = random.Random(seed)
    forbidden = dict(forbidden=_HASHES, why="chain hash_block yourself, block by block.")
    for case, (a, b, block_size, shared) in enumerate(_salt_cases(rng, num_cases)):
        expected = prefix_cache.block_hashes(a, block_size)
        plain = list(learner_call(fn, list(a), block_size, None, **forbidden))
        if plain != expected:
            _fail(f"{call_text(fn, a, block_size, None)}: without a salt you returned {len(plain)} hashes, the "
                  f"engine's prefix cache names {len(expected)} blocks{_chain_mistake(plain, expected)}")
        tenant, other = f"tenant-{rng.randrange(1000)}", f"tenant-{1000 + rng.randrange(1000)}"
        if case % 5 == 1:              # an empty salt is a salt: it must not name blocks as no salt does
            tenant = ""
        mine_a = list(learner_call(fn, list(a), block_size, tenant, **forbidden))
        mine_b = list(learner_call(fn, list(b), block_size, tenant, **forbidden))
        again = list(learner_call(fn, list(a), block_size, tenant, **forbidden))
        theirs = list(learner_call(fn, list(a), block_size, other, **forbidden))
        call = call_text(fn, a, block_size, tenant)
        if again != mine_a:
            _fail(f"{call} returned other names on a second call: a block's name must be the same every time "
                  "(the cache looks it up later), so nothing random or time-dependent goes into it")
        if len(mine_a) != len(expected):
            _fail(f"{call} returned {len(mine_a)} hashes; the prompt has {len(expected)} full blocks, salted or not")
        if set(mine_a) & set(expected):
            same = next(i for i, h in enumerate(mine_a) if h in set(expected))
            empty = (" An empty salt is a salt too: salt='' must keep its requests apart from unsalted ones "
                     "(test `salt is None`, not the salt's truth)." if tenant == "" else "")
            _fail(f"{call}: block {same} gets the name it has without a salt: a salted request would hit "
                  f"blocks cached by unsalted ones. The salt must change the name of every block of the "
                  f"prompt.{empty}")
        if set(mine_a) & set(theirs):
            same = next(i for i, h in enumerate(mine_a) if h in set(theirs))
            _fail(f"{call}: tenants {tenant!r} and {other!r} give block {same} of the same prompt the same name, "
                  "so one tenant's request would hit the other's cached blocks. The salt must change the name "
                  "of every block of the prompt")
        if mine_a[:shared] != mine_b[:shared]:
            _fail(f"{call} and the same tenant's prompt that shares its first {shared} blocks name those blocks "
                  "differently: within a tenant the cache must still hit on a shared prefix, so a block's "
                  "name may depend on the salt and the tokens up to its end, nothing else")
        if len(mine_b) > shared and mine_a[shared] == mine_b[shared]:
            _fail(f"{call}: two prompts of one tenant that differ in block {shared} give it the same name: "
                  "a name must stand for every token up to the block's end")
    return passed(f"salted_hashes: {num_cases} prompt pairs; no salt gives the engine's chain, a salt keeps "
                  "tenants apart and prefixes shared")


# ---------------------------------------------------------------------------
# 2. Tokens a prompt still computes when its prefix is cached
# ---------------------------------------------------------------------------
def _engine_tokens_to_compute(prompt_len: int, cached_blocks: int, block_size: int) -> int:
    """Cache the first cached_blocks full blocks of a prompt, then ask the engine's
    block manager how much of the prompt a new request with it can skip."""
    rng = random.Random(prompt_len * 1009 + cached_blocks)
    prompt = [rng.randrange(1000) for _ in range(prompt_len)]
    bm = PrefixCachingBlockManager(2 * (prompt_len // block_size + 2), block_size)
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
        expected = _engine_tokens_to_compute(prompt_len, cached_blocks, block_size)
        got = learner_call(tokens_to_compute, prompt_len, cached_blocks, block_size, forbidden=_CACHED,
                           why="work it out from the rule.")
        if got != expected:
            _fail(f"prompt of {prompt_len} tokens, blocks of {block_size}, its first {cached_blocks} blocks cached: "
                  f"you said {got} tokens to compute, the engine computes {expected} (a hit covers whole blocks "
                  "and never the prompt's last token)")
    return passed(f"tokens_to_compute: {num_cases} random prompts agree with the engine's prefix cache")


# ---------------------------------------------------------------------------
# 3. When each prompt gets its first token under long_prefill_token_threshold
# ---------------------------------------------------------------------------
def _engine_first_token_steps(prompt_lens, chunk_size: int, threshold: int, max_steps: int = 100_000) -> list:
    """Prompts waiting in arrival order, nothing else running, the chunked policy with vLLM's cap:
    the step (from 1) at which each gets its first token, by the engine's own loop (None if not
    within max_steps)."""
    config = SchedulerConfig(chunk_size=chunk_size, long_prefill_token_threshold=threshold,
                             max_num_seqs=max(1, len(prompt_lens)))
    core = model_free_core(config, roomy_blocks(sum(prompt_lens) + 64 * len(prompt_lens), block_size=1))
    ids = [core.add_request(None, one_token(), prompt_len=n) for n in prompt_lens]
    found = first_token_step(core, ids, max_steps)
    return [found.get(rid) for rid in ids]


def _fcfs_steps(prompt_lens, chunk_size, cap_at):
    """First-token steps when the prompt at queue position i may take cap_at(step, i, waiting) tokens:
    the slips' variants, to name them (the engine gives the expected values)."""
    left, steps, step = list(prompt_lens), [None] * len(prompt_lens), 0
    while any(n > 0 for n in left):
        step += 1
        room = chunk_size
        pending = [i for i, n in enumerate(left) if n > 0]
        for i in pending:
            take = min(left[i], room, cap_at(step, i, pending))
            left[i] -= take
            room -= take
            if left[i] == 0:
                steps[i] = step
        if step > 100_000:
            break
    return steps


def _steps_mistake(got, prompt_lens, chunk_size, threshold) -> str:
    if not isinstance(got, (list, tuple)) or len(got) != len(prompt_lens):
        return f"Return one step number per prompt ({len(prompt_lens)}). "
    got = list(got)
    capped = (lambda s, i, pending: threshold) if threshold > 0 else (lambda s, i, pending: 10**9)
    variants = [
        ("The threshold caps every prompt's tokens in every step (when it is not 0); you let the first "
         "prompt take the whole chunk. ", lambda s, i, pending: 10**9),
        ("The cap holds in every step, also once the prompts behind are done (chapter 8, section 2: the long "
         "prompt's 8000 tokens took 32 steps instead of 16). ",
         lambda s, i, pending: threshold if threshold > 0 and len(pending) > 1 else 10**9),
    ]
    for why, cap in variants:
        if threshold > 0 and got == _fcfs_steps(prompt_lens, chunk_size, cap):
            return why
    if threshold > 0:
        total_cap = _fcfs_steps(prompt_lens, min(chunk_size, threshold), lambda s, i, pending: 10**9)
        if got == total_cap:
            return ("The threshold caps each prompt, not the step: the rest of the chunk goes to the prompts "
                    "behind the long one. ")
    right = _fcfs_steps(prompt_lens, chunk_size, capped)
    if got == [s - 1 for s in right]:
        return "Steps count from 1: the first step is step 1. "
    return ""


@checker
def check_first_token_steps(fn, seed: int | None = None, *, num_cases: int = 200):
    """fn(prompt_lens, chunk_size, threshold) -> the step at which each prompt gets its first token,
    counted by running the engine (chunked policy, long_prefill_token_threshold=threshold)."""
    rng = random.Random(seed)
    cases = [([8000, 64, 64, 64], 512, 256), ([300, 20, 20], 64, 0), ([300, 20, 20], 64, 16), ([40, 40], 64, 30)]
    while len(cases) < num_cases:
        chunk_size = rng.choice([16, 64, 128, 512])
        cases.append(([rng.choice([rng.randint(1, 40), rng.randint(100, 3000)]) for _ in range(rng.randint(1, 6))],
                      chunk_size, rng.choice([0, rng.randint(1, chunk_size), rng.randint(chunk_size, 2 * chunk_size)])))
    for prompt_lens, chunk_size, threshold in cases:
        expected = _engine_first_token_steps(prompt_lens, chunk_size, threshold)
        args = (list(prompt_lens), chunk_size, threshold)
        got = learner_call(fn, *args, forbidden=_ENGINE_STEPS, why="count the steps yourself from the rules.")
        if not isinstance(got, (list, tuple)) or list(got) != expected:
            _fail(f"{_steps_mistake(got, prompt_lens, chunk_size, threshold)}{call_text(fn, *args)} returned "
                  f"{got!r}; the engine gives the prompts their first tokens at steps {expected}")
    return passed(f"first_token_steps: {len(cases)} queues, the same steps as the engine's scheduler")


# ---------------------------------------------------------------------------
# 4. A threshold that gets short prompts through in time (design under a constraint)
# ---------------------------------------------------------------------------
def _shorts_within(long_len, short_lens, chunk_size, threshold, max_steps) -> bool:
    """Does every short prompt (queued behind the long one) get its first token within max_steps,
    by the engine's own loop?"""
    steps = _engine_first_token_steps([long_len, *short_lens], chunk_size, threshold, max_steps)
    return all(s is not None for s in steps[1:])


def _threshold_cases(rng: random.Random, num_cases: int):
    cases = [(8000, [64] * 8, 512, 4), (2000, [40, 40], 128, 3), (3000, [20, 300], 128, 4), (500, [10], 128, 6),
             (4000, [200, 200, 200], 128, 2)]
    while len(cases) < num_cases:
        chunk_size = rng.choice([32, 64, 128, 256])
        long_len = rng.randint(2 * chunk_size, 20 * chunk_size)
        shorts = [rng.choice([rng.randint(1, 16), rng.randint(8, chunk_size)]) for _ in range(rng.randint(1, 5))]
        cases.append((long_len, shorts, chunk_size, rng.randint(1, -(-long_len // chunk_size))))
    return cases


@checker
def check_threshold_for_short_ttft(fn, seed: int | None = None, *, num_cases: int = 10):
    """fn(long_len, short_lens, chunk_size, max_steps) -> 0 if no cap is needed for every short prompt to
    get its first token within max_steps, else the largest long_prefill_token_threshold (1 to
    chunk_size - 1) that does it, or None; every candidate measured by running the engine."""
    rng = random.Random(seed)
    cases = _threshold_cases(rng, num_cases)
    for long_len, shorts, chunk_size, max_steps in cases:
        if _shorts_within(long_len, shorts, chunk_size, 0, max_steps):
            expected = 0
        else:
            expected = next((t for t in range(chunk_size - 1, 0, -1)
                             if _shorts_within(long_len, shorts, chunk_size, t, max_steps)), None)
        args = (long_len, list(shorts), chunk_size, max_steps)
        call = call_text(fn, *args)
        got = learner_call(fn, *args, forbidden=_ENGINE_STEPS, why="search with your own step count.")
        if got == expected:
            continue
        if isinstance(got, bool) or not (got is None or isinstance(got, int)):
            _fail(f"{call} returned {got!r}: return 0 (no cap), a threshold in 1..{chunk_size - 1}, or None")
        if got is not None and got >= chunk_size:
            _fail(f"{call} returned {got}: a threshold of chunk_size ({chunk_size}) or more caps nothing, it is "
                  "the same as no cap: return 0 for that")
        if got is not None and got < 0:
            _fail(f"{call} returned {got}: a threshold is 0 (off) or a positive number of tokens")
        if expected == 0:
            _fail(f"{call} returned {got!r}: without any cap every short prompt already gets its first token "
                  f"within {max_steps} steps, and a cap only delays the long prompt: return 0")
        if got == 0 or got is None:
            _fail(f"{call} returned {got!r}: {'no cap misses' if got == 0 else 'a threshold exists that meets'} the "
                  f"target; with threshold {expected} every short prompt gets its first token within {max_steps} "
                  "steps" + ("" if got == 0 else ". Try the thresholds you have not tried"))
        if _shorts_within(long_len, shorts, chunk_size, got, max_steps):
            _fail(f"{call} returned {got}, which meets the target, but so does {expected}: the larger the "
                  "threshold, the more of each step the long prompt keeps and the sooner its own first token "
                  "comes. Take the largest that meets it")
        steps = _engine_first_token_steps([long_len, *shorts], chunk_size, got, 10 * max_steps + 100)
        late = next(i for i, s in enumerate(steps[1:]) if s is None or s > max_steps)
        why = ""
        if got < max(shorts) and (expected is None or expected > got):
            why = ("Your threshold also caps the short prompts: a prompt longer than the threshold gets at most "
                   "that many tokens a step too, so a cap too small delays them as well. ")
        _fail(f"{why}{call} returned {got}: with that threshold short prompt {late} ({shorts[late]} tokens) gets "
              f"its first token at step {steps[late + 1]}, after the {max_steps}-step target; the engine finds "
              f"{expected} works")
    return passed(f"threshold_for_short_ttft: {len(cases)} queues, your thresholds meet each target and are the "
                  "largest that do, by the engine's own steps")


# ---------------------------------------------------------------------------
# 5. Which cached blocks go first: reference counts and the LRU list
# ---------------------------------------------------------------------------
_BLOCK_MANAGER = ("minillm.prefix_cache.PrefixCachingBlockManager.free",
                  "minillm.prefix_cache.PrefixCachingBlockManager._take_free_block",
                  "minillm.prefix_cache.PrefixCachingBlockManager.allocate",
                  "minillm.kv_cache.BlockManager.allocate", "minillm.kv_cache.BlockManager.free",
                  _HERE + "_engine_eviction_order")


def _engine_eviction_order(tables: dict, finish_order, num_clean: int, num_needed: int) -> list[int]:
    """Blocks named in the cache, held by `tables`; the requests in finish_order leave;
    a new request takes num_needed blocks: which cached blocks does the block manager evict, in order?"""
    used = sorted({b for table in tables.values() for b in table})
    num_blocks = (max(used) + 1 if used else 0) + num_clean
    bm = PrefixCachingBlockManager(num_blocks, 1)
    clean = [b for b in range(num_blocks) if b not in used][:num_clean]
    bm.free_blocks.clear()
    bm.free_blocks.extend(clean)
    for request_id, table in tables.items():
        bm.block_tables[request_id] = list(table)
        for block in table:
            bm.ref_counts[block] += 1
    for block in used:                                   # every held block is full, computed and named
        name = f"block {block}".encode()
        bm.hash_to_block[name], bm.block_hash[block] = block, name
    for request_id in finish_order:
        bm.free(request_id)
    evicted = []
    for _ in range(num_needed):
        before = bm.num_evictions
        block = bm._take_free_block()
        if bm.num_evictions > before:
            evicted.append(block)
    return evicted


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
    """The eviction order with one of the engine's rules broken (to name the mistake)."""
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
        expected = _engine_eviction_order(tables, finish_order, num_clean, num_needed)
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
_ENGINE_RUN = _ENGINE_STEPS + ("minillm.engine.LLMEngine.generate",
                               "minillm.prefix_cache.PrefixCachingBlockManager.lookup") + _CACHED


def _engine_prefill_tokens(system_len: int, user_lens, block_size: int, seed: int = 0) -> list[int]:
    """Chats that share a system_len-token system prompt, each adding user_lens[i] tokens of
    its own, served one after another (each after the one before has finished) by the
    engine with prefix caching: the prompt tokens each chat's steps computed."""
    rng = random.Random(seed)
    system = [rng.randrange(1000) for _ in range(system_len)]
    longest = system_len + max(user_lens, default=0) + 8
    blocks = make_block_manager(len(user_lens) * (longest // block_size + 2) + 4, block_size, True)
    core = model_free_core(SchedulerConfig(policy="chunked", chunk_size=4096, max_num_seqs=4), blocks)
    computed = []
    for user_len in user_lens:
        prompt = system + [1000 + rng.randrange(1000) for _ in range(user_len)]
        rid = core.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True))
        first_step = len(core.trace)
        while core.has_unfinished_requests():
            core.step()
        assert core.requests[rid].output_token_ids, "the chat did not finish"
        computed.append(sum(step.num_prefill_tokens for step in core.trace[first_step:]))
    return computed


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
        measured = _engine_prefill_tokens(system_len, user_lens, block_size)
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
