"""One bad request never breaks the engine (issue 10): failure isolation,
abort, workloads that cannot hang or drop, bounded memory, and the items of
the issue's list, each a test."""
import math

import numpy as np
import pytest
import torch

import minillm
from minillm import SamplingParams, SchedulerConfig
from minillm.config import ModelConfig
from minillm.engine import EngineCore, VirtualClock
from minillm.kv_cache import BlockManager
from minillm.sim.workloads import Workload, WorkloadRequest, poisson_mix

SMALL = ModelConfig(name="small", vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, max_position=256, eos_token_id=96)
GREEDY4 = SamplingParams(max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    return minillm.build_model(SMALL, seed=3, dtype=torch.float32, device="cpu")


def fresh_output(model, prompt, params=GREEDY4):
    return minillm.LLMEngine(model, block_size=4, num_blocks=64).generate([prompt], params)[0].output_token_ids


def all_blocks_free(engine) -> bool:
    bm = engine.block_manager
    return bm.num_free_blocks == bm.num_blocks and bm.num_leaked_blocks() == 0


# ---- 1. failure isolation ------------------------------------------------------

def test_numpy_seed_samples_like_the_same_python_seed(model):
    engine = minillm.LLMEngine(model, block_size=4, num_blocks=64)
    a, b = engine.generate([[4, 5, 6]] * 2, [SamplingParams(temperature=0.8, seed=np.int64(7), max_tokens=6),
                                             SamplingParams(temperature=0.8, seed=7, max_tokens=6)])
    assert a.output_token_ids == b.output_token_ids and a.finish_reason in ("length", "eos")


def test_a_request_whose_sampling_fails_finishes_with_error_and_the_others_go_on(model, monkeypatch):
    engine = minillm.LLMEngine(model, block_size=4, num_blocks=64)
    bad = engine.add_request([1, 2, 3], SamplingParams(temperature=0.5, seed=1, max_tokens=5))
    good = engine.add_request([4, 5, 6], GREEDY4)
    real = minillm.engine.sample_token

    def failing(logits, params, generator):
        if params.temperature > 0:
            raise TypeError("an integer is required")
        return real(logits, params, generator)
    monkeypatch.setattr(minillm.engine, "sample_token", failing)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert finished[bad].finish_reason == "error" and "an integer is required" in finished[bad].error
    assert finished[bad].output_token_ids == []
    assert finished[good].output_token_ids == fresh_output(model, [4, 5, 6])
    assert all_blocks_free(engine)
    assert engine.generate([[4, 5, 6]], GREEDY4)[0].output_token_ids == fresh_output(model, [4, 5, 6])


def test_a_failed_forward_pass_leaves_the_engine_as_before_the_step(model, monkeypatch):
    engine = minillm.LLMEngine(model, SchedulerConfig(chunk_size=4), block_size=4, num_blocks=64)
    ids = [engine.add_request(p, GREEDY4) for p in ([1, 2, 3, 4, 5, 6], [7, 8, 9])]
    engine.step()

    def state():
        bm = engine.block_manager
        return ([(r.request_id, r.status, r.num_computed_tokens, list(r.output_token_ids))
                 for r in engine.requests.values()], sorted(bm.free_blocks),   # which, not in what order
                {k: list(v) for k, v in bm.block_tables.items()},
                [r.request_id for r in engine.scheduler.waiting], [r.request_id for r in engine.scheduler.running])
    before = state()
    runner = engine.executor.runner
    monkeypatch.setattr(runner, "execute", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("CUDA OOM")))
    with pytest.raises(RuntimeError, match="OOM"):
        engine.step()
    assert state() == before
    monkeypatch.undo()
    final = {}
    while engine.has_unfinished_requests():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    assert [final[i].output_token_ids for i in ids] == [fresh_output(model, p) for p in
                                                        ([1, 2, 3, 4, 5, 6], [7, 8, 9])]
    assert all_blocks_free(engine)


def test_abort_request_frees_blocks_at_once_and_says_abort(model):
    engine = minillm.LLMEngine(model, block_size=4, num_blocks=64)
    running = engine.add_request(list(range(1, 20)), SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    waiting = engine.add_request([3, 4], GREEDY4)
    assert engine.block_manager.num_free_blocks < 64
    out = engine.abort_request(running)
    assert out.finished and out.finish_reason == "abort" and len(out.output_token_ids) == 1
    assert engine.abort_request(np.int64(waiting)).finish_reason == "abort"
    assert all_blocks_free(engine) and not engine.has_unfinished_requests()
    assert engine.abort_request(running) is None                 # already finished: nothing to do
    with pytest.raises(ValueError, match="request_id=99"):
        engine.abort_request(99)
    assert engine.generate([[4, 5, 6]], GREEDY4)[0].output_token_ids == fresh_output(model, [4, 5, 6])


# ---- 2-4. workloads that cannot hang or drop ----------------------------------------

@pytest.mark.parametrize("kwargs, arg", [
    (dict(prompt_len=0, max_tokens=4), "prompt_len"), (dict(prompt_len=-5, max_tokens=4), "prompt_len"),
    (dict(prompt_len=4, max_tokens=0), "max_tokens"),
    (dict(prompt_len=4, max_tokens=4, arrival_time=math.nan), "arrival_time"),
    (dict(prompt_len=4, max_tokens=4, arrival_time=-1.0), "arrival_time"),
    (dict(prompt_len=4, max_tokens=4, arrival_time=math.inf), "arrival_time"),
    (dict(prompt_len=4, max_tokens=4, after="decoder"), "after"),
    (dict(prompt_len=4, max_tokens=4, after=("decoder", -1)), "after"),
])
def test_a_workload_request_that_could_hang_is_refused_at_construction(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        WorkloadRequest(**kwargs)


@pytest.mark.parametrize("requests", [
    (WorkloadRequest(4, 4, tag="a"), WorkloadRequest(4, 4, after=("ghost", 1))),          # unknown tag
    (WorkloadRequest(4, 4, tag="a", after=("b", 1)), WorkloadRequest(4, 4, tag="b", after=("a", 1))),  # cycle
])
def test_a_workload_that_would_drop_requests_is_refused(requests):
    with pytest.raises(ValueError, match=r"requests\[\d\]\.after"):
        Workload(requests)


def test_numpy_lengths_are_accepted_in_workloads():
    spec = WorkloadRequest(np.int64(4), np.int32(2), arrival_time=np.float64(0.5))
    assert (spec.prompt_len, spec.max_tokens) == (4, 2) and type(spec.prompt_len) is int


def test_arrival_times_count_from_the_start_of_the_run():
    """On an engine whose clock already reads 100 s, a request due at t=0 of
    the run waits one step for its token, not 100 s."""
    workload = Workload((WorkloadRequest(4, 2, arrival_time=0.0), WorkloadRequest(4, 2, arrival_time=0.5)))
    ttfts = []
    for already_s in (0.0, 100.0):
        core = EngineCore(SchedulerConfig(), BlockManager(64, 4), _UnitSteps(), VirtualClock())
        core.clock.skip_to(already_s)
        ttfts.append([o.metrics.ttft for o in core.run_workload(workload)])
    assert ttfts[0] == ttfts[1] == [1.0, 1.5]      # one-second steps; the second waits for a boundary


def test_every_request_of_a_workload_yields_an_output_and_no_ttft_is_negative():
    core = EngineCore(SchedulerConfig(max_num_seqs=2), BlockManager(64, 4), _UnitSteps(), VirtualClock())
    workload = Workload((WorkloadRequest(8, 4, arrival_time=0.0, tag="a"),
                         WorkloadRequest(8, 3, arrival_time=5.0, tag="b"),
                         WorkloadRequest(8, 2, after=("b", 1), tag="c"),
                         WorkloadRequest(8, 2, after=("a", 100))))   # more tokens than "a" makes: still due
    core.clock.skip_to(3.0)
    outs = core.run_workload(workload)
    assert len(outs) == 4 and all(o.finished for o in outs)
    assert all(o.metrics.ttft >= 0 for o in outs)
    assert outs[1].metrics.arrival_time == pytest.approx(3.0 + 5.0)


def test_add_request_refuses_an_arrival_in_the_future(model):
    engine = minillm.LLMEngine(model, block_size=4, num_blocks=64)
    with pytest.raises(ValueError, match="arrival_time"):
        engine.add_request([1, 2], GREEDY4, arrival_time=engine.clock.now() + 100.0)
    assert not engine.requests


class _UnitSteps:
    def execute(self, plan, emits_token):
        return {r.request_id: 1 for (r, _), e in zip(plan.scheduled, emits_token) if e}, 1.0

    def release(self, request):
        pass


# ---- 5. prefill_first on a tight pool ------------------------------------------------

def test_prefill_first_does_not_thrash_on_a_tight_pool():
    """Four 100-token prompts, max_tokens=40, 9 blocks of 16 (one request at a
    time): it used to compute 14,479 tokens for 556 needed, 117 preemptions."""
    core = EngineCore(SchedulerConfig(policy="prefill_first"), BlockManager(9, 16), _UnitSteps(), VirtualClock())
    ids = [core.add_request(None, SamplingParams(max_tokens=40, ignore_eos=True), prompt_len=100)
           for _ in range(4)]
    outs = core._serve(ids, progress=False)
    computed = sum(n for record in core.trace for _, n in record.scheduled)
    assert all(len(outs[i].output_token_ids) == 40 for i in ids)
    assert computed <= 2 * 4 * (100 + 40)
    assert sum(len(record.preempted) for record in core.trace) <= 4


# ---- 6. bounded memory -------------------------------------------------------------

def test_finished_requests_leave_the_engine_and_the_trace_is_bounded():
    core = EngineCore(SchedulerConfig(max_num_seqs=2), BlockManager(64, 4), _UnitSteps(), VirtualClock(),
                      max_trace_steps=10, max_finished_requests=5)
    for _ in range(50):
        core.add_request(None, SamplingParams(max_tokens=2, ignore_eos=True), prompt_len=3)
    while core.has_unfinished_requests():
        core.step()
    assert len(core.requests) == 5 and len(core.trace) == 10
    assert core.trace[-1].end == core.clock.now()


# ---- 8. raw errors become ValueError/TypeError naming the argument ---------------------------

@pytest.mark.parametrize("kwargs, arg", [
    (dict(block_size=0), "block_size"), (dict(block_size="16"), "block_size"),
    (dict(block_size=2**22), "block_size"), (dict(num_blocks=0), "num_blocks"),
    (dict(sched={"policy": "chunked"}), "sched"), (dict(max_trace_steps=0), "max_trace_steps"),
])
def test_bad_engine_arguments_name_themselves(model, kwargs, arg):
    with pytest.raises((ValueError, TypeError), match=arg):
        minillm.LLMEngine(model, **kwargs)


def test_engine_of_a_name_and_params_as_a_dict_are_refused_by_name(model):
    with pytest.raises(TypeError, match="model='tiny'"):
        minillm.LLMEngine("tiny")
    engine = minillm.LLMEngine(model, block_size=4, num_blocks=64)
    with pytest.raises(TypeError, match="params"):
        engine.add_request([1, 2], {"max_tokens": 4})
    with pytest.raises(TypeError, match="params"):
        engine.generate([[1, 2]], {"max_tokens": 4})
    with pytest.raises(TypeError, match=r"config=.*SchedulerConfig"):
        EngineCore("chunked", BlockManager(4, 4), _UnitSteps(), VirtualClock())
    assert not engine.requests


@pytest.mark.parametrize("kwargs, arg", [
    (dict(stop_token_ids=5), "stop_token_ids"), (dict(stop_token_ids=[1.5]), "stop_token_ids"),
    (dict(ignore_eos="no"), "ignore_eos"), (dict(seed=2**32), "seed"), (dict(seed=-1), "seed"),
    (dict(max_tokens=True), "max_tokens"), (dict(temperature=math.nan), "temperature"),
    (dict(top_k=0), "top_k"),
])
def test_bad_sampling_params_name_themselves(kwargs, arg):
    with pytest.raises((ValueError, TypeError), match=arg):
        SamplingParams(**kwargs)


# ---- 9. silent surprises -----------------------------------------------------------

def test_stop_token_ids_zero_is_a_stop_id_not_none(model):
    assert SamplingParams(stop_token_ids=[0]).stop_token_ids == (0,)
    assert SamplingParams(stop_token_ids=np.array([3, 4])).stop_token_ids == (3, 4)


def test_a_2d_prompt_is_refused_not_flattened(model):
    engine = minillm.LLMEngine(model, block_size=4, num_blocks=64)
    with pytest.raises(ValueError, match="prompt_token_ids has shape"):
        engine.add_request(torch.tensor([[1, 2], [3, 4]]), GREEDY4)
    assert engine.generate([torch.tensor([4, 5, 6])], GREEDY4)[0].output_token_ids == \
        fresh_output(model, [4, 5, 6])


def test_distinct_seeds_sample_differently(model):
    logits = torch.zeros(SMALL.vocab_size)
    draws = {}
    for seed in (0, 1, 2**32 - 1):
        params = SamplingParams(temperature=1.0, seed=seed)
        gen = minillm.sampler.make_generator(params, 0)
        draws[seed] = [minillm.sampler.sample_token(logits, params, gen) for _ in range(8)]
    assert len({tuple(d) for d in draws.values()}) == 3


def test_top_k_1_is_greedy_even_when_logits_tie():
    logits = torch.tensor([0.0, 5.0, 5.0, 1.0])
    params = SamplingParams(temperature=1.0, top_k=1, seed=0)
    picks = {minillm.sampler.sample_token(logits, params, torch.Generator().manual_seed(s)) for s in range(40)}
    assert picks == {int(torch.argmax(logits))}


def test_output_prompt_ids_are_a_copy(model):
    engine = minillm.LLMEngine(model, block_size=4, num_blocks=64)
    rid = engine.add_request([4, 5, 6], SamplingParams(max_tokens=3, ignore_eos=True))
    out = engine.step()[0]
    out.prompt_token_ids.append(99)
    assert engine.requests[rid].prompt_token_ids == [4, 5, 6]


def test_an_empty_step_costs_nothing():
    cost = minillm.accounting.step_cost("llama-3-8b", [])
    assert cost.bytes_total == 0 and cost.flops == 0


def test_simulator_refuses_dtype_bytes_zero():
    with pytest.raises(ValueError, match="dtype_bytes=0"):
        minillm.simulate(poisson_mix(num_requests=2), dtype_bytes=0)


def test_numpy_integers_work_where_ints_do(model):
    sched = SchedulerConfig(chunk_size=np.int64(8), max_num_seqs=np.int32(4))
    engine = minillm.LLMEngine(model, sched, block_size=np.int64(4), num_blocks=np.int64(64))
    prompt = np.array([4, 5, 6])
    out = engine.generate([prompt], SamplingParams(max_tokens=np.int64(4), ignore_eos=np.bool_(True)))[0]
    assert out.output_token_ids == fresh_output(model, [4, 5, 6])


def test_block_rollback_undoes_allocations_and_frees_of_a_step():
    bm = BlockManager(8, 4)
    bm.allocate("a", 8)
    bm.allocate("b", 4)
    tables = {k: list(v) for k, v in bm.block_tables.items()}
    free = sorted(bm.free_blocks)
    checkpoint = bm.checkpoint()
    bm.free("b")                       # a preemption ...
    bm.allocate("a", 16)               # ... growth that reuses b's block ...
    bm.allocate("c", 4)                # ... and an admission
    bm.rollback(checkpoint)
    assert {k: list(v) for k, v in bm.block_tables.items()} == tables
    assert sorted(bm.free_blocks) == free and bm.num_leaked_blocks() == 0
    assert [bm.ref_counts[b] for b in range(8)] == [1 if b not in free else 0 for b in range(8)]
