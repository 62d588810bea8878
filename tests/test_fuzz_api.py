"""Fuzzing the public API: any input either works or raises ValueError /
TypeError naming the argument; after any refused or failed request, a valid
request still gets exactly the output it gets on a fresh engine, and every
block is back in the pool."""
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import minillm
from minillm import SamplingParams, SchedulerConfig
from minillm.config import ModelConfig
from minillm.sim.workloads import Workload, WorkloadRequest

SMALL = ModelConfig(name="small", vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, max_position=128, eos_token_id=96)
REFERENCE_PROMPT = [4, 5, 6, 7]
REFERENCE_PARAMS = SamplingParams(max_tokens=5, ignore_eos=True)
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
FUZZ_ENGINE = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))  # each builds an engine

# Anything a learner might type where a number, flag or list is expected.
anything = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 300), st.integers(-2**70, 2**70),
    st.integers(0, 50).map(np.int64), st.integers(0, 50).map(np.int32),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 2).map(np.float64),
    st.text(max_size=4), st.lists(st.integers(-2, 120), max_size=4), st.just({"a": 1}),
    st.just(np.array([1, 2])), st.just(float("nan")),
)


@pytest.fixture(scope="module")
def model():
    return minillm.build_model(SMALL, seed=5, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def reference(model):
    engine = minillm.LLMEngine(model, block_size=4, num_blocks=64)
    return engine.generate([REFERENCE_PROMPT], REFERENCE_PARAMS)[0].output_token_ids


def works_or_names(fn, *names):
    """Run fn; a refusal must be ValueError/TypeError naming one of `names`."""
    try:
        return fn()
    except (ValueError, TypeError) as e:
        assert any(name in str(e) for name in names), f"{type(e).__name__}: {e} names none of {names}"
        return None


def assert_serves_like_fresh(engine, reference):
    while engine.has_unfinished_requests():
        engine.step()
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and bm.num_leaked_blocks() == 0
    assert engine.generate([REFERENCE_PROMPT], REFERENCE_PARAMS)[0].output_token_ids == reference
    assert bm.num_free_blocks == bm.num_blocks


PARAM_NAMES = ("max_tokens", "temperature", "top_k", "top_p", "seed", "stop_token_ids", "ignore_eos")


@FUZZ
@given(field=st.sampled_from(PARAM_NAMES), value=anything)
def test_sampling_params_work_or_name_the_field(field, value):
    params = works_or_names(lambda: SamplingParams(**{field: value}), field)
    if params is not None:       # what passes is plain Python, ready for the sampler
        assert type(params.max_tokens) is int and isinstance(params.stop_token_ids, tuple)


@FUZZ
@given(field=st.sampled_from(["policy", "chunk_size", "token_budget", "max_num_seqs", "chunk_sizing",
                              "break_even_len"]), value=anything)
def test_scheduler_config_works_or_names_the_field(field, value):
    works_or_names(lambda: SchedulerConfig(**{field: value}), field)


@FUZZ_ENGINE
@given(field=st.sampled_from(["block_size", "num_blocks", "max_trace_steps", "max_finished_requests"]),
       value=anything)
def test_engine_arguments_work_or_name_themselves(model, reference, field, value):
    engine = works_or_names(lambda: minillm.LLMEngine(model, **{field: value}), field)
    if engine is not None and engine.block_manager.num_blocks >= 8 and engine.block_manager.block_size <= 64:
        assert_serves_like_fresh(engine, reference)


@FUZZ_ENGINE
@given(prompt=st.one_of(anything, st.lists(anything, max_size=3),
                        st.just(torch.tensor([[1, 2], [3, 4]])), st.just(np.array([3, 4], dtype=np.int16))),
       field=st.sampled_from(PARAM_NAMES), value=anything, arrival=anything)
def test_a_refused_or_failed_request_leaves_the_engine_serving(model, reference, prompt, field, value, arrival):
    engine = minillm.LLMEngine(model, SchedulerConfig(chunk_size=8, max_num_seqs=4), block_size=4, num_blocks=64)
    params = works_or_names(lambda: SamplingParams(**{field: value}), field)
    if params is not None:
        works_or_names(lambda: engine.add_request(prompt, params, arrival_time=arrival),
                       "prompt", "arrival_time", "params", "max_tokens")
    assert_serves_like_fresh(engine, reference)


@FUZZ_ENGINE
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "bad", "abort", "step"]), st.integers(0, 40),
                              st.integers(1, 12)), max_size=25))
def test_any_mix_of_adds_aborts_and_steps_returns_every_block(model, reference, ops):
    engine = minillm.LLMEngine(model, SchedulerConfig(chunk_size=8, max_num_seqs=3), block_size=4, num_blocks=24)
    for op, number, length in ops:
        if op == "add":
            engine.add_request(list(range(1, length + 1)), SamplingParams(max_tokens=length, ignore_eos=True))
        elif op == "bad":     # sampling fails inside the step: that request alone ends in "error"
            engine.add_request([1, 2], SamplingParams(max_tokens=3, temperature=1.0, seed=number))
            engine.executor._generators[engine._next_id - 1] = "not a generator"
        elif op == "abort":
            works_or_names(lambda: engine.abort_request(number), "request_id")
        else:
            for out in engine.step():
                assert out.finish_reason in (None, "length", "eos", "stop", "error")
    assert_serves_like_fresh(engine, reference)


@FUZZ
@given(prompt_len=anything, max_tokens=anything, arrival_time=anything)
def test_workload_requests_work_or_name_the_field(prompt_len, max_tokens, arrival_time):
    spec = works_or_names(lambda: WorkloadRequest(prompt_len, max_tokens, arrival_time=arrival_time),
                          "prompt_len", "max_tokens", "arrival_time")
    if spec is not None:
        assert spec.prompt_len >= 1 and spec.max_tokens >= 1 and math.isfinite(spec.arrival_time)


@settings(max_examples=25, deadline=None)
@given(specs=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 6), st.floats(0, 3),
                                st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.tuples(
                                    st.sampled_from(["a", "b", "c", "zz"]), st.integers(0, 8)))),
                      min_size=1, max_size=8),
       policy=st.sampled_from(minillm.scheduler.POLICIES))
def test_a_workload_is_refused_whole_or_every_request_gets_an_output(specs, policy):
    def build():
        return Workload(tuple(WorkloadRequest(p, m, arrival_time=t, tag=tag, after=after)
                              for p, m, t, tag, after in specs))
    workload = works_or_names(build, "after")
    if workload is None:
        return
    res = minillm.simulate(workload, SchedulerConfig(policy=policy, chunk_size=16, max_num_seqs=3),
                           model="llama-3-8b", hardware="A100-80GB", num_blocks=64)
    assert len(res.outputs) == len(specs) and all(o.finished for o in res.outputs)
    assert all(o.metrics.ttft >= 0 for o in res.outputs)
