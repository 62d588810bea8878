"""Chunked (aggregated) vs disaggregated prefill at equal GPU count, in the simulator."""
import pytest

from minillm.config import ModelConfig
from minillm.sim import workloads
from minillm.sim.cost_model import predict_step
from minillm.sim.disaggregation import (ServingRun, goodput_rate, kv_transfer_s, simulate_aggregated,
                                        simulate_disaggregated)
from minillm.sim.hardware import get_hardware
from minillm.sim.workloads import Workload, WorkloadRequest

MODEL, GPU = "llama-3-8b", "A100-80GB"


def test_kv_transfer_is_prompt_kv_bytes_over_bandwidth():
    cfg = ModelConfig.preset(MODEL)
    assert kv_transfer_s(cfg, 2048, 25e9) == pytest.approx(2048 * 128 * 1024 / 25e9)   # 128 KiB a token


def test_a_lone_request_first_token_is_its_prefill_and_the_kv_transfer_delays_the_second():
    wl = Workload((WorkloadRequest(1024, 4),))
    cfg, hw = ModelConfig.preset(MODEL), get_hardware(GPU)
    fast = simulate_disaggregated(wl, 1, 1, model=MODEL, hardware=GPU, interconnect_bytes_s=1e12).outputs[0]
    slow = simulate_disaggregated(wl, 1, 1, model=MODEL, hardware=GPU, interconnect_bytes_s=1e9).outputs[0]
    assert fast.metrics.ttft == pytest.approx(predict_step(cfg, [(1024, 0, True)], hw).total)
    gap_fast = fast.metrics.token_times[1] - fast.metrics.token_times[0]
    gap_slow = slow.metrics.token_times[1] - slow.metrics.token_times[0]
    assert gap_slow - gap_fast == pytest.approx(kv_transfer_s(cfg, 1024, 1e9) - kv_transfer_s(cfg, 1024, 1e12))
    assert len(fast.output_token_ids) == 4 and fast.finished


def test_every_request_gets_all_its_tokens_in_both_layouts():
    wl = workloads.poisson_mix(20, rate_per_s=5, prompt_len=(64, 512), output_len=(1, 40), seed=3)
    for run in (simulate_aggregated(wl, 2, model=MODEL, hardware=GPU),
                simulate_disaggregated(wl, 1, 1, model=MODEL, hardware=GPU)):
        assert [len(o.output_token_ids) for o in run.outputs] == [r.max_tokens for r in wl.requests]
        assert run.num_gpus == 2


def test_aggregation_wins_on_ttft_and_disaggregation_on_tpot_under_load():
    wl = workloads.poisson_mix(60, rate_per_s=12, prompt_len=(512, 2048), output_len=(64, 256), seed=0)
    agg = simulate_aggregated(wl, 2, model=MODEL, hardware=GPU).summary()
    dis = simulate_disaggregated(wl, 1, 1, model=MODEL, hardware=GPU).summary()
    assert agg["ttft"]["p90"] < dis["ttft"]["p90"]
    assert dis["tpot"]["p90"] < agg["tpot"]["p90"]


def test_goodput_is_the_highest_rate_before_attainment_drops():
    def run(ttfts):
        wl = Workload(tuple(WorkloadRequest(8, 1) for _ in ttfts))
        outs = simulate_aggregated(wl, 1, model=MODEL, hardware=GPU).outputs
        for o, t in zip(outs, ttfts):
            o.metrics.first_token_time = o.metrics.arrival_time + t
        return ServingRun("x", outs, 1)
    runs = {1.0: run([0.1] * 10), 2.0: run([0.1] * 9 + [9]), 3.0: run([9] * 5 + [0.1] * 5), 4.0: run([0.1] * 10)}
    assert goodput_rate(runs, ttft_slo_s=1.0, tpot_slo_s=None) == 2.0     # stops at the first failure
    assert goodput_rate(runs, ttft_slo_s=0.01, tpot_slo_s=None) == 0.0


@pytest.mark.parametrize("kwargs, arg", [(dict(num_prefill=0), "num_prefill"), (dict(num_decode=1.5), "num_decode"),
                                         (dict(interconnect_bytes_s=0), "interconnect_bytes_s")])
def test_bad_arguments_name_themselves(kwargs, arg):
    wl = Workload((WorkloadRequest(8, 2),))
    args = dict(num_prefill=1, num_decode=1) | kwargs
    with pytest.raises(ValueError, match=arg):
        simulate_disaggregated(wl, model=MODEL, hardware=GPU, **args)
    with pytest.raises(ValueError, match="num_gpus"):
        simulate_aggregated(wl, 0)
