"""The simulator is the engine's scheduler with predicted time: same schedule, sane metrics."""
import pytest
import torch

from minillm.config import ModelConfig
from minillm.sim.cost_model import predict_step as cost_model_predict_step
from minillm.engine import LLMEngine
from minillm.sim.hardware import PROFILES
from minillm.loader import build_model
from minillm.scheduler import SchedulerConfig
from minillm.sim.simulator import SimResult, predict_step, simulate
from minillm.sim.workloads import long_prompt_interference, poisson_mix

SMALL = dict(prompt_len=80, num_decoders=3, decoder_prompt_len=8, warmup_tokens=3, long_output_len=4)
POLICY_CONFIGS = [SchedulerConfig(policy="chunked", chunk_size=24),
                  SchedulerConfig(policy="chunked", chunk_size=7, token_budget=16, max_num_seqs=8),
                  SchedulerConfig(policy="prefill_first"),
                  SchedulerConfig(policy="decode_first"),
                  SchedulerConfig(policy="chunked_prefill_first", chunk_size=24)]


@pytest.fixture(scope="module")
def tiny_model():
    return build_model("tiny", seed=0, dtype=torch.float32, device="cpu")


@pytest.mark.parametrize("sched", POLICY_CONFIGS, ids=lambda s: f"{s.policy}-{s.chunk_size}")
def test_simulator_and_engine_produce_the_same_schedule(tiny_model, sched):
    workload = long_prompt_interference(**SMALL)
    num_blocks = 64
    engine = LLMEngine(tiny_model, sched, block_size=16, num_blocks=num_blocks)
    engine.run_workload(workload)
    sim = simulate(workload, sched, model="tiny", hardware="A100-80GB", dtype_bytes=4,
                   block_size=16, num_blocks=num_blocks)
    assert [r.scheduled for r in sim.trace] == [r.scheduled for r in engine.trace]
    assert [r.num_prefill_tokens for r in sim.trace] == [r.num_prefill_tokens for r in engine.trace]


def test_simulated_outputs_carry_prompt_len_without_token_ids():
    res = simulate(long_prompt_interference(**SMALL), SchedulerConfig(chunk_size=16), model="tiny")
    assert isinstance(res, SimResult)
    assert all(o.prompt_token_ids is None and o.finished for o in res.outputs)
    assert sorted(o.prompt_len for o in res.outputs) == [8, 8, 8, 80]
    assert all(len(o.metrics.token_times) == len(o.output_token_ids) for o in res.outputs)


def test_step_durations_are_the_cost_models_predictions():
    res = simulate(long_prompt_interference(**SMALL), SchedulerConfig(chunk_size=32), model="llama-3-8b",
                   hardware="H100-SXM")
    cfg = ModelConfig.preset("llama-3-8b")
    first = res.trace[0]                                  # three 8-token prompts, nothing cached
    expected = cost_model_predict_step(cfg, [(8, 0)] * 3, "H100-SXM", 2).total
    assert first.duration == pytest.approx(expected, rel=1e-12)
    assert predict_step is cost_model_predict_step


def test_chunking_caps_the_stall_and_does_not_lower_the_long_prompts_ttft():
    workload = long_prompt_interference(prompt_len=2048, num_decoders=4)
    whole = simulate(workload, SchedulerConfig(policy="prefill_first")).summary()
    chunked = simulate(workload, SchedulerConfig(policy="chunked", chunk_size=256)).summary()
    assert chunked["decoder_itl_max_s"] < whole["decoder_itl_max_s"] / 3
    assert chunked["long_ttft_s"] > whole["long_ttft_s"]


def test_summary_has_tagged_metrics_and_slo_attainment():
    res = simulate(long_prompt_interference(**SMALL), SchedulerConfig(chunk_size=16), model="tiny",
                   tpot_slo_s=1.0, ttft_slo_s=1.0)
    s = res.summary()
    for key in ("long_ttft_s", "decoder_itl_p50_s", "decoder_itl_p99_s", "decoder_itl_max_s",
                "decoder_tpot_mean_s", "num_steps", "ttft", "tpot", "itl", "goodput_req_s"):
        assert key in s, key
    assert s["slo_attainment"] == 1.0
    assert s["decoder_itl_p50_s"] <= s["decoder_itl_p99_s"] <= s["decoder_itl_max_s"]


def test_simulate_accepts_hardware_objects_and_model_configs():
    hw = PROFILES["A100-80GB"].replace(name="slow A100", peak_flops_s=PROFILES["A100-80GB"].peak_flops_s / 2)
    cfg = ModelConfig.preset("llama-3-8b")
    workload = long_prompt_interference(**SMALL)
    fast = simulate(workload, SchedulerConfig(chunk_size=16), model=cfg, hardware="A100-80GB")
    slow = simulate(workload, SchedulerConfig(chunk_size=16), model=cfg, hardware=hw)
    assert [r.scheduled for r in fast.trace] == [r.scheduled for r in slow.trace]
    assert slow.summary()["duration_s"] > fast.summary()["duration_s"]


def test_simulation_is_deterministic_under_poisson_arrivals():
    workload = poisson_mix(num_requests=12, rate_per_s=20.0, seed=3)
    a = simulate(workload, SchedulerConfig(chunk_size=128))
    b = simulate(workload, SchedulerConfig(chunk_size=128))
    assert [(r.start, r.end, r.scheduled) for r in a.trace] == [(r.start, r.end, r.scheduled) for r in b.trace]


@pytest.mark.parametrize("kwargs, word", [
    (dict(hardware="B200"), "hardware"),
    (dict(hardware=3), "hardware"),
    (dict(model="gpt-5"), "preset"),
    (dict(num_blocks=0), "num_blocks"),
    (dict(block_size=-16), "block_size"),
])
def test_simulate_rejects_bad_arguments_with_a_named_value_error(kwargs, word):
    with pytest.raises(ValueError, match=word):
        simulate(long_prompt_interference(**SMALL), SchedulerConfig(), **kwargs)


def test_bad_workloads_and_chunk_sizes_are_value_errors():
    with pytest.raises(ValueError, match="workload"):
        simulate([(1, 2)], SchedulerConfig())
    with pytest.raises(ValueError, match="chunk_size"):
        simulate(long_prompt_interference(**SMALL), SchedulerConfig(chunk_size=0))
    with pytest.raises(ValueError, match="prompt_len"):
        long_prompt_interference(prompt_len=-5)


def test_the_trace_says_how_each_step_was_priced():
    """Issue 28: each record is still a StepRecord, with the step's kind, graph and reason."""
    from minillm.engine import StepRecord
    from minillm.sim.simulator import SimStepRecord
    from minillm.sim import workloads as wl
    work = wl.long_prompt_interference(prompt_len=1024, num_decoders=4)
    res = simulate(work, SchedulerConfig(chunk_size=256), model="llama-3-8b", hardware="A100-80GB")
    assert all(isinstance(r, SimStepRecord) and isinstance(r, StepRecord) for r in res.trace)
    kinds = {r.kind for r in res.trace}
    assert {"decode", "mixed"} <= kinds
    decode = next(r for r in res.trace if r.kind == "decode")
    assert decode.graph == "full" and "uniform decode batch" in decode.reason
    mixed = next(r for r in res.trace if r.kind == "mixed")
    assert mixed.graph == "piecewise" and mixed.rows >= mixed.num_prefill_tokens + mixed.num_decode_tokens
    eager = simulate(work, SchedulerConfig(chunk_size=256), model="llama-3-8b", hardware="A100-80GB",
                     graph_mode="none", async_scheduling=False)
    assert {r.graph for r in eager.trace} == {"none"}
    assert eager.trace[-1].end > res.trace[-1].end        # eager and synchronous: slower
