"""Chunks of equal work: the arithmetic, the scheduler that uses it, and the
engine and simulator that run it."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import minillm
from minillm import SamplingParams, SchedulerConfig
from minillm.chunk_sizing import chunk_end, equal_work_chunks, prefill_work
from minillm.config import ModelConfig
from minillm.engine import EngineCore, VirtualClock
from minillm.kv_cache import BlockManager
from minillm.scheduler import Scheduler

from test_scheduler import FakeExecutor


def brute_force_work(start, n, break_even):
    # every token: its matmuls (break_even) plus one per key it attends to (itself included)
    return sum(break_even + position + 1 for position in range(start, start + n))


@given(start=st.integers(0, 3000), n=st.integers(0, 600), break_even=st.integers(0, 5000))
def test_prefill_work_counts_matmuls_and_causal_pairs(start, n, break_even):
    assert prefill_work(start, n, break_even) == brute_force_work(start, n, break_even)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 4000), chunk=st.integers(4, 512), break_even=st.integers(0, 6000),
       start=st.integers(0, 2000))
def test_equal_work_chunks_tile_the_prompt_in_as_many_chunks_of_equal_work(n, chunk, break_even, start):
    sizes = equal_work_chunks(n, chunk, break_even, start=start)
    assert sum(sizes) == n and min(sizes) >= 1
    assert len(sizes) == math.ceil(n / chunk)                 # the same number of steps as fixed chunks
    total = prefill_work(start, n, break_even)
    heaviest_token = break_even + start + n                  # the last token's work
    position = start
    for size in sizes:
        # each chunk ends at the first token where its share is reached: within one token of it
        assert abs(prefill_work(position, size, break_even) - total / len(sizes)) <= heaviest_token
        position += size
    # later tokens see more keys, so later chunks are no longer (up to one token of rounding)
    assert all(b <= a + 1 for a, b in zip(sizes, sizes[1:]))


def test_equal_work_shortens_the_late_chunks_by_the_models_own_ratio():
    tiny = ModelConfig.preset("tiny")
    sizes = equal_work_chunks(2048, 256, tiny.attention_break_even_len)
    assert len(sizes) == 8 and sizes[0] > 256 > sizes[-1]
    matmuls_only = equal_work_chunks(2048, 256, 10**12)          # equal tokens, to a token
    assert len(matmuls_only) == 8 and all(abs(size - 256) <= 1 for size in matmuls_only)
    assert equal_work_chunks(100, 256, 0) == [100]                 # a prompt shorter than a chunk


def test_the_break_even_length_is_where_attention_flops_equal_the_matmuls():
    from minillm.sim.accounting import step_cost
    for name in ("tiny", "llama-3-8b", "qwen3-0.6b"):
        cfg = ModelConfig.preset(name)
        k = cfg.attention_break_even_len
        one = step_cost(cfg, [(1, 0, False)], dtype_bytes=2).by_op
        attention = one["attn_scores"][0] + one["attn_values"][0]          # one key: itself
        matmuls = one["qkv_proj"][0] + one["o_proj"][0] + one["mlp"][0]
        assert matmuls / attention == pytest.approx(k, rel=0.01), name


def test_aligned_boundaries_fall_on_kv_blocks():
    sizes = equal_work_chunks(2048, 256, 2944, align=16)
    ends = [sum(sizes[:i + 1]) for i in range(len(sizes))]
    assert all(end % 16 == 0 for end in ends) and ends[-1] == 2048 and len(sizes) == 8
    # a cached prefix that is not block-aligned: boundaries still land on blocks
    sizes = equal_work_chunks(1000, 256, 2944, start=5, align=16)
    assert all((5 + sum(sizes[:i + 1])) % 16 == 0 for i in range(len(sizes) - 1))


def test_chunk_end_is_the_next_boundary_from_anywhere_inside_a_chunk():
    sizes = equal_work_chunks(1024, 128, 500)
    boundaries = [sum(sizes[:i + 1]) for i in range(len(sizes))]
    for position in range(0, 1024, 37):
        assert chunk_end(0, 1024, len(sizes), position, 500) == min(b for b in boundaries if b > position)


@pytest.mark.parametrize("kwargs, name", [
    (dict(num_tokens=0, chunk_size=4, break_even=1), "num_tokens"),
    (dict(num_tokens=8, chunk_size=0, break_even=1), "chunk_size"),
    (dict(num_tokens=8, chunk_size=4, break_even=-1), "break_even"),
    (dict(num_tokens=8, chunk_size=4, break_even=1, align=0), "align"),
])
def test_bad_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        equal_work_chunks(**kwargs)


# ---- the scheduler ---------------------------------------------------------------

def run(prompts, config, num_blocks=400, block_size=16, decoders=0):
    """prompts: lengths arriving together after `decoders` 4-token streams have started."""
    core = EngineCore(config, BlockManager(num_blocks, block_size), FakeExecutor(), VirtualClock())
    for _ in range(decoders):
        core.add_request(None, SamplingParams(max_tokens=200, ignore_eos=True), prompt_len=4)
    core.step()
    ids = [core.add_request(None, SamplingParams(max_tokens=2, ignore_eos=True), prompt_len=n) for n in prompts]
    while any(not core.requests[i].output_token_ids for i in ids):
        core.step()
    return core, ids


def test_a_long_prompt_goes_in_the_planned_chunks_with_every_decode_riding_along():
    config = SchedulerConfig(policy="chunked", chunk_size=256, chunk_sizing="equal_work", break_even_len=2944)
    core, (rid,) = run([2048], config, decoders=3)
    chunks = [(n, rec.num_decode_tokens) for rec in core.trace for r, n in rec.scheduled if r == rid]
    assert [n for n, _ in chunks] == equal_work_chunks(2048, 256, 2944, align=16)
    assert all(decodes == 3 for _, decodes in chunks)


def test_short_prompts_count_their_tokens_not_a_whole_chunk():
    # four 64-token prompts fill one 256-token step, as with fixed chunks
    for sizing in ("fixed", "equal_work"):
        config = SchedulerConfig(policy="chunked", chunk_size=256, chunk_sizing=sizing, break_even_len=100)
        core, ids = run([64] * 4, config)
        first = next(rec for rec in core.trace if rec.num_prefill_tokens)
        assert first.num_prefill_tokens == 256 and len(first.scheduled) == 4, sizing


def test_a_prompt_behind_another_gets_what_the_budget_has_left():
    config = SchedulerConfig(policy="chunked", chunk_size=256, chunk_sizing="equal_work", break_even_len=0)
    core, (a, b) = run([100, 1000], config)
    first = next(rec for rec in core.trace if rec.num_prefill_tokens)
    got = dict(first.scheduled)
    assert got[a] == 100
    # b gets the work of the 156 budget tokens left, counted at b's average token; its first
    # tokens see few keys (attention only here), so that buys b more than 156 of them
    share = 156 * prefill_work(0, 1000, 0) / 1000
    assert prefill_work(0, got[b], 0) <= share < prefill_work(0, got[b] + 1, 0) and got[b] > 156


def test_token_budget_still_caps_the_real_tokens():
    config = SchedulerConfig(policy="chunked", chunk_size=256, token_budget=200, max_num_seqs=8,
                             chunk_sizing="equal_work", break_even_len=2944)
    core, _ = run([2048], config, decoders=2)
    assert max(sum(n for _, n in rec.scheduled) for rec in core.trace) <= 200


def test_a_preempted_prompt_is_replanned_from_where_it_restarts():
    config = SchedulerConfig(policy="chunked", chunk_size=64, chunk_sizing="equal_work", break_even_len=50)
    core = EngineCore(config, BlockManager(64, 16), FakeExecutor(), VirtualClock())
    rid = core.add_request(None, SamplingParams(max_tokens=2, ignore_eos=True), prompt_len=300)
    core.step()
    request = core.requests[rid]
    assert core.scheduler._prefill_plans[rid] == (0, 300, 5)
    core.scheduler._preempt(request, minillm.scheduler.ScheduledStep())
    assert rid not in core.scheduler._prefill_plans
    core.step()                                          # back in, planned afresh from token 0
    assert core.scheduler._prefill_plans[rid] == (0, 300, 5)
    core.abort_request(rid)                              # an abort mid-prefill drops the plan too
    assert rid not in core.scheduler._prefill_plans and core.block_manager.num_free_blocks == 64


def test_configs_say_what_is_wrong():
    with pytest.raises(ValueError, match="chunk_sizing='even'"):
        SchedulerConfig(chunk_sizing="even")
    with pytest.raises(ValueError, match="chunk_sizing='equal_work'.*prefill_first"):
        SchedulerConfig(policy="prefill_first", chunk_sizing="equal_work")
    with pytest.raises(ValueError, match="break_even_len=-1"):
        SchedulerConfig(break_even_len=-1)
    with pytest.raises(ValueError, match="needs break_even_len"):
        Scheduler(SchedulerConfig(chunk_sizing="equal_work"), BlockManager(8, 16))
    tiny = ModelConfig.preset("tiny")
    assert SchedulerConfig(chunk_sizing="equal_work").for_model(tiny).break_even_len == 2944
    assert SchedulerConfig(chunk_sizing="equal_work", break_even_len=7).for_model(tiny).break_even_len == 7
    assert SchedulerConfig().for_model(tiny).break_even_len is None


# ---- the engine and the simulator ----------------------------------------------------

def test_the_engine_gives_the_same_tokens_with_equal_work_chunks():
    model = minillm.build_model("tiny", dtype=torch.float32)
    prompts = [[(7 * i + 3) % 500 for i in range(700)], [5, 6, 7] * 30]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    fixed = minillm.LLMEngine(model, SchedulerConfig(chunk_size=128)).generate(prompts, params)
    engine = minillm.LLMEngine(model, SchedulerConfig(chunk_size=128, chunk_sizing="equal_work"))
    equal = engine.generate(prompts, params)
    assert engine.config.break_even_len == model.cfg.attention_break_even_len
    assert [o.output_token_ids for o in equal] == [o.output_token_ids for o in fixed]
    assert max(rec.num_prefill_tokens for rec in engine.trace) > 128      # the early chunks are longer


def test_on_a_simulated_gpu_equal_work_shortens_the_worst_gap_at_the_same_step_count():
    workload = minillm.workloads.long_prompt_interference(prompt_len=8000, num_decoders=8)
    runs = {sizing: minillm.simulate(workload, SchedulerConfig(chunk_size=1024, chunk_sizing=sizing),
                                     model="llama-3-8b", hardware="H100-SXM")
            for sizing in ("fixed", "equal_work")}

    def long_steps(result):
        rid = next(o.request_id for o in result.outputs if o.tag == "long")
        return [rec.duration for rec in result.trace if any(r == rid and n > 1 for r, n in rec.scheduled)]

    fixed, equal = long_steps(runs["fixed"]), long_steps(runs["equal_work"])
    assert len(fixed) == len(equal) == 8
    assert max(equal) < max(fixed) and max(equal) / min(equal) < max(fixed) / min(fixed)


def test_equal_work_with_partial_prefills_serves_everyone_and_leaks_nothing():
    config = SchedulerConfig(policy="chunked", chunk_size=64, max_num_partial_prefills=2,
                             long_prefill_token_threshold=100, chunk_sizing="equal_work", break_even_len=30)
    core, ids = run([500, 40, 300, 20], config, num_blocks=200, decoders=2)
    assert all(core.requests[i].output_token_ids for i in ids)
    # two prompts share a step's prefill budget: neither is starved
    shared = [rec for rec in core.trace if sum(1 for r, n in rec.scheduled if n > 1) == 2]
    assert shared
    while core.has_unfinished_requests():
        core.step()
    assert core.block_manager.num_free_blocks == 200 and not core.scheduler._prefill_plans


def test_equal_work_with_prefix_caching_plans_from_the_cached_prefix():
    model = minillm.build_model("tiny", dtype=torch.float32)
    system = [(3 * i + 1) % 500 for i in range(320)]
    prompts = [system + [7, 8, 9] * 40, system + [4, 5] * 50]
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    outputs = {}
    for sizing in ("fixed", "equal_work"):
        engine = minillm.LLMEngine(model, SchedulerConfig(chunk_size=64, chunk_sizing=sizing),
                                   enable_prefix_caching=True)
        outputs[sizing] = [o.output_token_ids for o in engine.generate(prompts[:1], params)]
        outputs[sizing] += [o.output_token_ids for o in engine.generate(prompts[1:], params)]
        second = max(engine.requests)
        chunks = [n for rec in engine.trace for r, n in rec.scheduled if r == second and n > 1]
        if sizing == "equal_work":
            # the second prompt starts after its 320 cached tokens: its plan covers only the other 100
            # (chunks of 4 blocks: boundaries are not rounded to blocks)
            assert chunks == equal_work_chunks(100, 64, model.cfg.attention_break_even_len, start=320)
        else:
            assert chunks == [64, 36]
    assert outputs["fixed"] == outputs["equal_work"]
