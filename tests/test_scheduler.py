"""The scheduler's invariants, over random workloads, policies and chunk sizes.

A fake executor stands in for the model (tokens are a function of the
request and position, time advances one unit per step), so these tests run
the real Scheduler and EngineCore in milliseconds.
"""
import pytest
from hypothesis import given, settings, strategies as st

from minillm.engine import EngineCore, VirtualClock
from minillm.kv_cache import BlockManager
from minillm.request import SamplingParams
from minillm.scheduler import CHUNKING_POLICIES, POLICIES, SchedulerConfig


class FakeExecutor:
    """Records what each step computed; samples a token that depends only on
    the request and how many tokens it has, like a deterministic model."""

    def __init__(self):
        self.computed = {}          # request_id -> list of (start, end) positions computed

    def execute(self, plan, samples):
        tokens = {}
        for (request, n), sample in zip(plan.scheduled, samples):
            start = request.num_computed_tokens
            self.computed.setdefault(request.request_id, []).append((start, start + n))
            if sample:
                tokens[request.request_id] = (request.request_id * 7919 + request.num_tokens) % 1000
        return tokens, 1.0

    def release(self, request):
        pass


def run_engine(workload, config, num_blocks, block_size=4, on_schedule=None):
    blocks = BlockManager(num_blocks, block_size)
    executor = FakeExecutor()
    core = EngineCore(config, blocks, executor, VirtualClock())
    if on_schedule is not None:
        original = core.scheduler.schedule

        def wrapped():
            before = {r.request_id for r in core.scheduler.running if r.is_decoding}
            plan = original()
            on_schedule(before, plan)
            return plan
        core.scheduler.schedule = wrapped
    pending = list(enumerate(workload))
    ids = {}
    step = 0
    while pending or core.has_unfinished_requests():
        for index, (prompt_len, max_tokens, arrival_step) in list(pending):
            if arrival_step <= step or not core.has_unfinished_requests():
                ids[index] = core.add_request(None, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                                              prompt_len=prompt_len)
                pending.remove((index, (prompt_len, max_tokens, arrival_step)))
        core.step()
        step += 1
        assert step < 10_000, "the engine made no progress"
    return core, executor, [core.requests[ids[i]] for i in range(len(workload))]


workloads = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12), st.integers(0, 30)),
                     min_size=1, max_size=8)
configs = st.builds(
    lambda policy, chunk, budget_extra, seqs, break_even: SchedulerConfig(
        policy=policy, chunk_size=chunk, max_num_seqs=seqs,
        token_budget=None if budget_extra is None else seqs + budget_extra,
        # equal_work where the policy chunks, weighing attention from heavy (0) to light
        chunk_sizing="equal_work" if break_even is not None and policy in CHUNKING_POLICIES else "fixed",
        break_even_len=break_even if policy in CHUNKING_POLICIES else None),
    st.sampled_from(POLICIES), st.integers(1, 48), st.one_of(st.none(), st.integers(0, 40)),
    st.integers(1, 6), st.one_of(st.none(), st.integers(0, 64)))


@settings(max_examples=150, deadline=None)
@given(workload=workloads, config=configs, tight=st.booleans())
def test_scheduler_invariants(workload, config, tight):
    block_size = 4
    longest = max(p + m for p, m, _ in workload)
    need = -(-longest // block_size)
    # tight: barely enough blocks for the largest request alone -> preemption
    num_blocks = need if tight else need * len(workload)
    decoding_missed = []

    def on_schedule(before, plan):
        got = {r.request_id for r, _ in plan.scheduled}
        preempted = {r.request_id for r in plan.preempted}
        decoding_missed.extend(before - got - preempted)

    core, executor, requests = run_engine(workload, config, num_blocks, block_size, on_schedule)

    # Every request finishes with all its tokens.
    for request, (prompt_len, max_tokens, _) in zip(requests, workload):
        assert request.is_finished and len(request.output_token_ids) == max_tokens
    # No block leaked.
    assert core.block_manager.num_free_blocks == num_blocks
    assert core.block_manager.num_leaked_blocks() == 0
    for record in core.trace:
        total = sum(n for _, n in record.scheduled)
        if config.policy in ("chunked", "chunked_prefill_first"):
            if config.chunk_sizing == "fixed":      # (equal_work: early chunks are longer, test_chunk_sizing)
                assert record.num_prefill_tokens <= config.chunk_size
            if config.token_budget is not None:
                assert total <= config.token_budget
        if config.policy == "chunked_prefill_first":      # never a mixed step
            assert not (record.num_prefill_tokens and record.num_decode_tokens)
        elif config.token_budget is not None and total > config.token_budget:
            # Whole-prompt policies may exceed the budget only with one prompt alone.
            assert len(record.scheduled) == 1
        assert len({rid for rid, _ in record.scheduled}) == len(record.scheduled)
        assert len(record.scheduled) <= config.max_num_seqs
    # Each token computed exactly once, unless its request was preempted.
    for request in requests:
        spans = executor.computed[request.request_id]
        if request.num_preemptions == 0:
            positions = [p for start, end in spans for p in range(start, end)]
            assert positions == list(range(request.num_tokens - 1))
    # Under "chunked" a running decode never misses a step.
    if config.policy == "chunked":
        assert decoding_missed == []


def test_chunked_splits_a_long_prompt_across_steps():
    config = SchedulerConfig(policy="chunked", chunk_size=16)
    core, _, (request,) = run_engine([(50, 2, 0)], config, num_blocks=100)
    assert [n for record in core.trace for _, n in record.scheduled][:4] == [16, 16, 16, 2]


def test_prefill_first_stalls_decodes_and_chunked_does_not():
    # Two streams decoding, then a 64-token prompt.
    workload = [(4, 30, 0), (4, 30, 0), (64, 2, 5)]
    pf, _, _ = run_engine(workload, SchedulerConfig(policy="prefill_first"), num_blocks=200)
    ch, _, _ = run_engine(workload, SchedulerConfig(policy="chunked", chunk_size=16), num_blocks=200)
    stalled = [r for r in pf.trace if r.num_prefill_tokens == 64]
    assert stalled and stalled[0].num_decode_tokens == 0
    mixed = [r for r in ch.trace if r.num_prefill_tokens and r.num_decode_tokens]
    assert len(mixed) == 4 and all(r.num_decode_tokens == 2 for r in mixed)


def test_chunked_prefill_first_chunks_but_still_stalls_every_decode():
    # SGLang's default: the 64-token prompt is cut into chunks of 16, but the
    # chunks run in prefill-only steps back to back, so the streams wait for all four.
    workload = [(4, 30, 0), (4, 30, 0), (64, 2, 5)]
    core, _, (a, b, long) = run_engine(workload, SchedulerConfig(policy="chunked_prefill_first", chunk_size=16),
                                       num_blocks=200)
    prefill_steps = [i for i, r in enumerate(core.trace) if r.num_prefill_tokens == 16]
    assert len(prefill_steps) == 4 and prefill_steps == list(range(prefill_steps[0], prefill_steps[0] + 4))
    assert all(core.trace[i].num_decode_tokens == 0 for i in prefill_steps)
    # one virtual second per step: the streams' longest gap spans the four chunks and a step
    assert max(a.metrics.itl) == max(b.metrics.itl) == 5.0


def test_decode_first_admits_a_prompt_only_when_nothing_decodes():
    workload = [(4, 10, 0), (8, 3, 2)]
    core, _, (first, second) = run_engine(workload, SchedulerConfig(policy="decode_first"), num_blocks=100)
    assert second.metrics.first_token_time > first.metrics.finish_time


def test_preemption_frees_blocks_and_the_request_recomputes():
    # Two requests that cannot both hold their full length.
    config = SchedulerConfig(policy="chunked", chunk_size=8)
    core, executor, requests = run_engine([(8, 12, 0), (8, 12, 0)], config, num_blocks=6, block_size=4)
    assert sum(r.num_preemptions for r in requests) >= 1
    assert all(len(r.output_token_ids) == 12 for r in requests)
    assert core.block_manager.num_free_blocks == 6


@pytest.mark.parametrize("kwargs, arg", [
    (dict(policy="fastest"), "policy"),
    (dict(chunk_size=0), "chunk_size"),
    (dict(chunk_size=2.5), "chunk_size"),
    (dict(token_budget=0), "token_budget"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(policy="chunked", token_budget=8, max_num_seqs=16), "token_budget"),
])
def test_bad_scheduler_config_names_the_argument(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        SchedulerConfig(**kwargs)


def test_scheduler_module_knows_no_torch():
    import minillm.scheduler as module
    source = open(module.__file__).read()
    assert "import torch" not in source and "time." not in source


def test_a_preempted_request_is_not_readmitted_in_the_same_step():
    # Four requests in a pool that holds about two: a preempted one must not
    # bounce straight back in with the blocks its eviction freed.
    config = SchedulerConfig(policy="chunked", chunk_size=64, max_num_seqs=4)
    core, _, requests = run_engine([(40, 24, 0)] * 4, config, num_blocks=10, block_size=16)
    for record in core.trace:
        assert not set(record.preempted) & {rid for rid, _ in record.scheduled}
    assert all(len(r.output_token_ids) == 24 for r in requests)
    assert sum(r.num_preemptions for r in requests) < 5   # 21 when admission ignored this
