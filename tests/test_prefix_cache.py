"""Prefix caching: hits start chunks at the first uncached token, change no output,
share only full computed blocks, evict only free cached blocks, leak nothing."""
import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

import minillm
from minillm import LLMEngine, SamplingParams, SchedulerConfig
from minillm.engine import EngineCore, VirtualClock
from minillm.prefix_cache import (PrefixCachingBlockManager, block_hashes, make_block_manager,
                                  max_cached_tokens)
from minillm.request import Request
from minillm.sim.chat_workloads import shared_system_prompt_chat
from minillm.sim.simulator import simulate

VOCAB = 50


class KVCheckingExecutor:
    """A model-free executor that keeps the token id each cache slot holds.

    Every step it writes the new tokens into their slots, refusing a block
    that another request shares or the cache has named (a shared block must
    never be written), then reads the request's whole context back through
    its block table and checks it is the request's own tokens. The "sampled"
    token is a hash of that context, so a wrong cached block changes the
    output, as wrong K and V would.
    """

    def __init__(self, block_manager):
        self.blocks = block_manager
        self.slots: dict[int, int] = {}
        self.problems: list[str] = []

    def execute(self, plan, samples):
        bm, bs = self.blocks, self.blocks.block_size
        tokens = {}
        for (request, n), sample in zip(plan.scheduled, samples):
            start, table = request.num_computed_tokens, bm.block_tables[request.request_id]
            for p in range(start, start + n):
                block = table[p // bs]
                if bm.ref_counts[block] > 1 or block in getattr(bm, "block_hash", {}):
                    self.problems.append(f"request {request.request_id} writes shared block {block}")
                self.slots[block * bs + p % bs] = request.token_ids(p, p + 1)[0]
            context = [self.slots.get(table[p // bs] * bs + p % bs) for p in range(start + n)]
            if context != request.token_ids(0, start + n):
                self.problems.append(f"request {request.request_id} reads a wrong cached prefix")
            if sample:
                tokens[request.request_id] = hash(tuple(context)) % VOCAB
        return tokens, 0.001

    def release(self, request):
        pass


def run_fake(prompts, max_tokens, sched, num_blocks, block_size, caching):
    bm = make_block_manager(num_blocks, block_size, caching)
    executor = KVCheckingExecutor(bm)
    core = EngineCore(sched, bm, executor, VirtualClock())
    ids = [core.add_request(p, SamplingParams(max_tokens=m, ignore_eos=True)) for p, m in zip(prompts, max_tokens)]
    while core.has_unfinished_requests():
        core.step()
        if caching:
            executor.problems += bm.check_invariants(core.scheduler.running)
    assert not executor.problems, executor.problems[:3]
    assert bm.num_leaked_blocks() == 0 and bm.num_free_blocks == num_blocks   # everything back
    prefill = sum(r.num_prefill_tokens for r in core.trace)
    return [core.requests[i].output_token_ids for i in ids], prefill


@st.composite
def shared_prefix_workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    prefixes = [draw(st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=40)) for _ in range(draw(st.integers(1, 3)))]
    prompts, max_tokens = [], []
    for _ in range(draw(st.integers(1, 7))):
        prefix = prefixes[draw(st.integers(0, len(prefixes) - 1))]
        own = draw(st.lists(st.integers(0, VOCAB - 1), min_size=0 if prefix else 1, max_size=12))
        prompts.append(prefix + own)
        max_tokens.append(draw(st.integers(1, 8)))
    if draw(st.booleans()):                      # a prompt again: its whole prompt is cached
        prompts.append(list(prompts[0]))
        max_tokens.append(2)
    longest = max(len(p) + m for p, m in zip(prompts, max_tokens))
    # From one request's worth of blocks (forcing preemption and eviction) to plenty.
    num_blocks = draw(st.integers(-(-longest // block_size) + 1, 3 * len(prompts) * (-(-longest // block_size))))
    policy = draw(st.sampled_from(["chunked", "decode_first", "prefill_first"]))
    if policy == "prefill_first":                # prefill_first thrashes in pools this small
        num_blocks = len(prompts) * (-(-longest // block_size)) + 1
    sched = SchedulerConfig(policy=policy, chunk_size=draw(st.sampled_from([1, 3, 8, 64])),
                            max_num_seqs=draw(st.integers(1, 5)))
    return prompts, max_tokens, sched, num_blocks, block_size


@settings(max_examples=150, deadline=None)
@given(shared_prefix_workloads())
def test_random_shared_prefix_workloads_same_outputs_no_leaks_no_shared_writes(case):
    prompts, max_tokens, sched, num_blocks, block_size = case
    off, _ = run_fake(prompts, max_tokens, sched, num_blocks, block_size, caching=False)
    on, _ = run_fake(prompts, max_tokens, sched, num_blocks, block_size, caching=True)
    assert on == off


def test_hash_names_the_whole_prefix():
    a = list(range(40))
    b = a[:20] + [99] + a[21:]
    ha, hb = block_hashes(a, 8), block_hashes(b, 8)
    assert len(ha) == 5 and ha[:2] == hb[:2]
    assert all(x != y for x, y in zip(ha[2:], hb[2:]))     # one token differs: that block and all after
    assert block_hashes(a[8:16], 8) != ha[1:2]             # same tokens, other position: other name


@pytest.mark.parametrize("prompt_len, expected", [(1, 0), (16, 0), (17, 16), (32, 16), (33, 32)])
def test_a_hit_leaves_the_last_token_to_compute(prompt_len, expected):
    assert max_cached_tokens(prompt_len, 16) == expected


@pytest.fixture(scope="module")
def model64():
    return minillm.build_model("tiny", seed=0, dtype=torch.float64, device="cpu")


def test_fully_cached_prompt_still_computes_its_last_block(model64):
    """vLLM PRs #6144/#7753: with every block cached, the last token must still
    run through the model, or there are no logits to sample from."""
    prompt = random.Random(0).choices(range(model64.cfg.vocab_size), k=48)   # 3 full blocks
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    engine = LLMEngine(model64, SchedulerConfig(chunk_size=16), enable_prefix_caching=True)
    first = engine.generate([prompt], params)[0]
    before = sum(r.num_prefill_tokens for r in engine.trace)
    again = engine.generate([prompt], params)[0]
    recomputed = sum(r.num_prefill_tokens for r in engine.trace) - before
    assert recomputed == 16                              # the last block, not 0 and not 48
    assert again.output_token_ids == first.output_token_ids
    assert engine.block_manager.num_hit_tokens == 32


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("policy, chunk_size, num_blocks", [
    ("chunked", 8, None), ("chunked", 32, 12), ("chunked", 5, 9), ("decode_first", 16, 12),
    ("prefill_first", 16, None)])
def test_cache_on_and_off_give_the_same_greedy_tokens(dtype, policy, chunk_size, num_blocks):
    model = minillm.build_model("tiny", seed=1, dtype=dtype, device="cpu")
    rng = random.Random(1)
    system = rng.choices(range(model.cfg.vocab_size), k=40)
    prompts = [system + rng.choices(range(model.cfg.vocab_size), k=rng.randint(1, 20)) for _ in range(4)]
    prompts += [list(prompts[1]), system[:32]]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    runs = {}
    for caching in (False, True):
        engine = LLMEngine(model, SchedulerConfig(policy=policy, chunk_size=chunk_size, max_num_seqs=3),
                           num_blocks=num_blocks, enable_prefix_caching=caching)
        runs[caching] = [o.output_token_ids for o in engine.generate(prompts, params)]
        assert engine.block_manager.num_leaked_blocks() == 0
    assert runs[True] == runs[False]


def test_chunks_start_at_the_first_uncached_token(model64):
    rng = random.Random(2)
    system = rng.choices(range(model64.cfg.vocab_size), k=64)
    engine = LLMEngine(model64, SchedulerConfig(chunk_size=24), enable_prefix_caching=True)
    engine.generate([system + [1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True))
    steps_before = len(engine.trace)
    rid = engine.add_request(system + [7, 8, 9, 10], SamplingParams(max_tokens=1, ignore_eos=True))
    engine.step()
    first = engine.trace[steps_before]
    assert first.scheduled == [(rid, 4)]                 # 64 cached; only the 4 new tokens run


def test_eviction_takes_only_free_cached_blocks_least_recently_used_first():
    bm = PrefixCachingBlockManager(num_blocks=6, block_size=2)

    def run(rid, tokens):
        r = Request(rid, tokens, SamplingParams(), 0.0)
        hit = bm.claim_cached_prefix(r)
        bm.allocate(rid, len(tokens))
        r.num_computed_tokens = len(tokens)
        bm.cache_computed_blocks(r)
        return hit

    run("a", [1, 2, 3, 4])          # 2 cached blocks
    bm.free("a")
    run("b", [5, 6, 7, 8])
    bm.free("b")
    assert len(bm.evictable) == 4 and len(bm.free_blocks) == 2
    assert run("c", [1, 2, 3, 4, 9]) == 4                 # hits a's two blocks and holds them
    assert bm.num_hit_tokens == 4 and len(bm.evictable) == 2
    lru_before = list(bm.evictable)
    bm.allocate("d", 6)                                   # 3 blocks: the clean one, then evict 2
    assert bm.num_evictions == 2 and not bm.evictable
    assert bm.block_tables["c"][0] not in bm.block_tables["d"]    # a held block is never evicted
    evicted = [b for b in lru_before if b not in bm.evictable]
    assert evicted == lru_before[:len(evicted)]           # oldest first
    assert not bm.check_invariants()


def test_enable_prefix_caching_must_be_a_bool(model64):
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        LLMEngine(model64, enable_prefix_caching="yes")
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        simulate(shared_system_prompt_chat(2), enable_prefix_caching=1)


def test_simulated_chats_compute_fewer_prefill_tokens_and_wait_less():
    wl = shared_system_prompt_chat(24, system_prompt_len=1024, user_len=(16, 64), output_len=8, rate_per_s=20)
    off = simulate(wl, SchedulerConfig(chunk_size=512), model="llama-3-8b", hardware="H100-SXM")
    on = simulate(wl, SchedulerConfig(chunk_size=512), model="llama-3-8b", hardware="H100-SXM",
                  enable_prefix_caching=True)
    computed = lambda res: sum(r.num_prefill_tokens for r in res.trace)
    assert computed(on) < 0.3 * computed(off)
    assert on.summary()["ttft"]["mean"] < off.summary()["ttft"]["mean"]
    assert [len(o.output_token_ids) for o in on.outputs] == [len(o.output_token_ids) for o in off.outputs]
