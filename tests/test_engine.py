"""The real engine: same tokens whatever the policy, chunk size or pool size."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import minillm
from minillm import SamplingParams, SchedulerConfig
from minillm.scheduler import POLICIES
from minillm.config import ModelConfig

SMALL = ModelConfig(name="small", vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, max_position=256, eos_token_id=96)


@pytest.fixture(scope="module")
def model64():
    return minillm.build_model(SMALL, seed=3, dtype=torch.float64, device="cpu")


def plain_greedy(model, prompt, max_tokens):
    """Generation without batching or a persistent cache: recompute everything."""
    tokens = list(prompt)
    for _ in range(max_tokens):
        _, logits = minillm.prefill_kv(model, tokens)
        tokens.append(int(logits[-1].argmax()))
    return tokens[len(prompt):]


def prompts_for(seed, count, low=1, high=40):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 96, (int(torch.randint(low, high, (1,), generator=g)),), generator=g).tolist()
            for _ in range(count)]


@settings(max_examples=12, deadline=None)
@given(policy=st.sampled_from(POLICIES),
       chunk_size=st.integers(1, 48), seed=st.integers(0, 1000), max_num_seqs=st.integers(1, 5))
def test_greedy_outputs_do_not_depend_on_policy_or_chunk_size(model64, policy, chunk_size, seed, max_num_seqs):
    prompts = prompts_for(seed, 4)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    engine = minillm.LLMEngine(model64, SchedulerConfig(policy=policy, chunk_size=chunk_size,
                                                        max_num_seqs=max_num_seqs), block_size=4)
    outs = engine.generate(prompts, params)
    expected = [plain_greedy(model64, p, 6) for p in prompts]
    assert [o.output_token_ids for o in outs] == expected
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_tenth_of_the_kv_pool_gives_the_same_outputs(model64):
    prompts = prompts_for(7, 8, 20, 60)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    block_size = 4
    needed = sum(-(-(len(p) + 12) // block_size) for p in prompts)
    sched = SchedulerConfig(policy="chunked", chunk_size=16)
    roomy = minillm.LLMEngine(model64, sched, block_size=block_size, num_blocks=needed)
    tight = minillm.LLMEngine(model64, sched, block_size=block_size,
                              num_blocks=max(needed // 10, -(-(60 + 12) // block_size)))
    expected = [o.output_token_ids for o in roomy.generate(prompts, params)]
    got = tight.generate(prompts, params)
    assert [o.output_token_ids for o in got] == expected
    assert all(o.finished for o in got)
    assert sum(len(r.preempted) for r in tight.trace) > 0, "the tight pool should have forced preemption"
    assert tight.block_manager.num_free_blocks == tight.block_manager.num_blocks


def test_stop_at_eos_unless_ignored_and_at_stop_tokens(model64):
    prompt = prompts_for(1, 1)[0]
    free_run = plain_greedy(model64, prompt, 8)
    stop = free_run[3]
    engine = minillm.LLMEngine(model64, SchedulerConfig(), block_size=4)
    out = engine.generate([prompt], SamplingParams(max_tokens=8, stop_token_ids=[stop]))[0]
    assert out.output_token_ids == free_run[:free_run.index(stop) + 1] and out.finish_reason == "stop"
    eos_model = minillm.build_model(SMALL.replace(eos_token_id=stop), seed=3, dtype=torch.float64)
    engine = minillm.LLMEngine(eos_model, SchedulerConfig(), block_size=4)
    out = engine.generate([prompt], SamplingParams(max_tokens=8))[0]
    assert out.finish_reason == "eos" and out.output_token_ids[-1] == stop
    out = engine.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert len(out.output_token_ids) == 8 and out.finish_reason == "length"


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(model64):
    prompt = prompts_for(2, 1)[0]
    params = SamplingParams(max_tokens=10, temperature=1.0, top_k=20, top_p=0.9, seed=123, ignore_eos=True)
    alone = minillm.LLMEngine(model64, SchedulerConfig()).generate([prompt], params)[0]
    others = prompts_for(4, 3)
    batched = minillm.LLMEngine(model64, SchedulerConfig(chunk_size=8)).generate(
        others + [prompt], [SamplingParams(max_tokens=5, temperature=1.0, seed=9)] * 3 + [params])[-1]
    assert alone.output_token_ids == batched.output_token_ids
    greedy = minillm.LLMEngine(model64).generate([prompt], SamplingParams(max_tokens=10, ignore_eos=True))[0]
    assert alone.output_token_ids != greedy.output_token_ids


def test_top_k_one_is_greedy(model64):
    prompt = prompts_for(5, 1)[0]
    sampled = minillm.LLMEngine(model64).generate(
        [prompt], SamplingParams(max_tokens=6, temperature=2.0, top_k=1, seed=0, ignore_eos=True))[0]
    assert sampled.output_token_ids == plain_greedy(model64, prompt, 6)


def test_metrics_are_timestamped_per_token(model64):
    engine = minillm.LLMEngine(model64, SchedulerConfig(chunk_size=8), block_size=4)
    out = engine.generate(prompts_for(6, 2), SamplingParams(max_tokens=5, ignore_eos=True))[0]
    m = out.metrics
    assert len(m.token_times) == 5 and m.first_token_time == m.token_times[0]
    assert m.ttft > 0 and m.tpot == pytest.approx(sum(m.itl) / 4) and len(m.itl) == 4
    assert m.e2e == pytest.approx(m.ttft + sum(m.itl))
    steps = engine.trace
    assert all(a.end <= b.start + 1e-9 for a, b in zip(steps, steps[1:]))


@pytest.mark.parametrize("prompt, params, arg", [
    ([], SamplingParams(), "prompt_token_ids"),
    ([1] * 300, SamplingParams(), "prompt"),
    ([1, 2, 97], SamplingParams(), "prompt_token_ids"),
    ([1, -1], SamplingParams(), "prompt_token_ids"),
])
def test_bad_request_is_refused_alone(model64, prompt, params, arg):
    engine = minillm.LLMEngine(model64, SchedulerConfig(chunk_size=8), block_size=4)
    good = engine.add_request([1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True))
    with pytest.raises(ValueError, match=arg):
        engine.add_request(prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
    assert len(engine.requests) == 1 and engine.requests[good].is_finished
    assert len(engine.requests[good].output_token_ids) == 3


@pytest.mark.parametrize("kwargs, arg", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(temperature=-0.5), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=0), "top_k"),
])
def test_bad_sampling_params_name_the_argument(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        SamplingParams(**kwargs)


def test_request_larger_than_the_pool_is_refused(model64):
    engine = minillm.LLMEngine(model64, SchedulerConfig(), block_size=4, num_blocks=4)
    with pytest.raises(ValueError, match="num_blocks"):
        engine.add_request(list(range(20)), SamplingParams(max_tokens=4))


def test_generate_refuses_a_bad_prompt_before_queuing_any(model64):
    engine = minillm.LLMEngine(model64)
    with pytest.raises(ValueError, match=r"prompts\[1\]"):
        engine.generate([[1, 2], []], SamplingParams(max_tokens=2))
    assert not engine.has_unfinished_requests()


def test_interference_workload_runs_on_the_real_engine(model64):
    wl = minillm.workloads.long_prompt_interference(prompt_len=64, num_decoders=3, decoder_prompt_len=8,
                                                    warmup_tokens=2, long_output_len=2)
    engine = minillm.LLMEngine(model64, SchedulerConfig(policy="chunked", chunk_size=16), block_size=4)
    outs = engine.run_workload(wl)
    long = next(o for o in outs if o.tag == "long")
    decoders = [o for o in outs if o.tag == "decoder"]
    assert all(o.finished for o in outs) and len(decoders) == 3
    assert all(len(o.output_token_ids) >= 2 for o in decoders)
    # The long prompt arrived after every stream had two tokens.
    assert all(o.metrics.token_times[1] <= long.metrics.arrival_time for o in decoders)
    chunks = [n for r in engine.trace for rid, n in r.scheduled if rid == long.request_id]
    assert chunks[:4] == [16, 16, 16, 16]


def test_ttft_counts_the_wait_for_the_step_boundary():
    """A request that arrives while a step runs is served from the next one;
    its TTFT starts at its own arrival, not at that boundary."""
    from minillm.engine import EngineCore, VirtualClock
    from minillm.kv_cache import BlockManager
    from minillm.sim.workloads import Workload, WorkloadRequest

    class OneSecondSteps:
        def execute(self, plan, samples):
            return {r.request_id: 1 for (r, _), s in zip(plan.scheduled, samples) if s}, 1.0

        def release(self, request):
            pass

    core = EngineCore(SchedulerConfig(), BlockManager(64, 4), OneSecondSteps(), VirtualClock())
    wl = Workload((WorkloadRequest(8, 4, arrival_time=0.0), WorkloadRequest(8, 1, arrival_time=0.5)))
    first, late = core.run_workload(wl)
    assert late.metrics.arrival_time == 0.5
    assert late.metrics.first_token_time == 2.0 and late.metrics.ttft == pytest.approx(1.5)


def test_a_dropped_engine_and_its_kv_pool_go_at_once_not_at_the_next_garbage_collection():
    # run_workload's arrival closure once called itself, which held it and the engine in a
    # reference cycle: the pool of a dropped engine lived on until the garbage collector
    # freed it, mid-step in whatever ran next (10-20 ms on a CPU).
    import gc
    import weakref
    from minillm.sim import workloads

    model = minillm.build_model("tiny", seed=0)
    workload = workloads.long_prompt_interference(prompt_len=64, num_decoders=2, decoder_prompt_len=8,
                                                  warmup_tokens=2, decoder_output_len=4, long_output_len=2)
    gc.collect()
    gc.disable()
    try:
        for serve in (lambda e: e.run_workload(workload),
                      lambda e: e.generate([[1, 2, 3], [4, 5]], minillm.SamplingParams(max_tokens=3))):
            engine = minillm.LLMEngine(model, minillm.SchedulerConfig(chunk_size=32))
            serve(engine)
            pool = weakref.ref(engine.executor.runner.kv_cache.data)
            del engine
            assert pool() is None
    finally:
        gc.enable()


def test_a_pool_that_cannot_fit_is_refused_by_name_before_anything_is_allocated():
    # num_blocks=2**40 once built a free list of 2**40 entries until the machine ran out of
    # memory (the fuzz test drew it); now the engine compares the pool with free memory first
    model = minillm.build_model("tiny", seed=0)
    for num_blocks in (2**40, 2**70):
        with pytest.raises(ValueError, match=f"num_blocks={num_blocks}: a KV pool of .* does not fit"):
            minillm.LLMEngine(model, num_blocks=num_blocks)
    with pytest.raises(ValueError, match="num_blocks=0"):
        minillm.LLMEngine(model, num_blocks=0)
    assert minillm.LLMEngine(model, num_blocks=8).block_manager.num_blocks == 8
