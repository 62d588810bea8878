import math

import numpy as np
import pytest

from minillm import metrics
from minillm.request import RequestMetrics, RequestOutput


def output(arrival, times, finished=True):
    m = RequestMetrics(arrival_time=arrival, first_token_time=times[0], token_times=list(times),
                       finish_time=times[-1])
    return RequestOutput(0, None, 4, list(range(len(times))), finished, m)


def test_percentile_matches_numpy():
    rng = np.random.default_rng(0)
    values = rng.exponential(size=37).tolist()
    for q in (0, 50, 90, 99, 100):
        assert metrics.percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_ttft_tpot_itl_follow_the_benchmark_conventions():
    out = output(1.0, [1.5, 1.6, 2.6, 2.7])
    m = out.metrics
    assert m.ttft == pytest.approx(0.5)
    assert m.e2e == pytest.approx(1.7)
    assert m.tpot == pytest.approx((m.e2e - m.ttft) / 3)
    assert m.itl == pytest.approx([0.1, 1.0, 0.1])


def test_one_stall_moves_max_itl_not_mean_tpot():
    smooth = [0.0 + 0.01 * i for i in range(101)]
    stalled = smooth[:50] + [t + 0.2 for t in smooth[50:]]
    a = metrics.summarize([output(0.0, smooth)])
    b = metrics.summarize([output(0.0, stalled)])
    assert b["tpot"]["mean"] / a["tpot"]["mean"] < 1.25       # mean barely moves
    assert b["itl"]["max"] / a["itl"]["max"] > 15              # the gap is 21x


def test_goodput_counts_requests_meeting_both_slos():
    outs = [output(0.0, [0.1, 0.2, 0.3]), output(0.0, [0.5, 0.6]), output(0.0, [0.1, 1.1])]
    s = metrics.summarize(outs, ttft_slo_s=0.2, tpot_slo_s=0.15)
    assert s["slo_attainment"] == pytest.approx(1 / 3)
    assert s["goodput_req_s"] == pytest.approx(1 / 1.1)
    assert s["throughput_tok_s"] == pytest.approx(7 / 1.1)


def test_empty_distribution_is_nan_and_summary_needs_finished_requests():
    assert math.isnan(metrics.distribution([])["p99"])
    with pytest.raises(ValueError, match="outputs"):
        metrics.summarize([output(0.0, [0.1], finished=False)])
    with pytest.raises(ValueError, match="q="):
        metrics.percentile([1.0], 101)


def test_goodput_with_vllm_slo_keys_in_ms_and_an_itl_slo_that_a_stall_fails():
    smooth = output(0.0, [0.1, 0.2, 0.3, 0.4])                 # gaps of 100 ms
    stalled = output(0.0, [0.1, 0.2, 0.8, 0.9])                # one 600 ms gap, mean TPOT 267 ms
    s = metrics.summarize([smooth, stalled], slo_ms={"ttft": 150, "tpot": 300})
    assert s["slo_attainment"] == 1.0                          # the mean hides the stall
    s = metrics.summarize([smooth, stalled], slo_ms={"ttft": 150, "itl": 300})
    assert s["slo_attainment"] == 0.5                          # the worst gap does not
    assert s["goodput_req_s"] == pytest.approx(1 / 0.9)
    assert metrics.summarize([smooth], slo_ms={"e2el": 300})["slo_attainment"] == 0.0


def test_summary_reports_total_token_throughput():
    s = metrics.summarize([output(0.0, [0.5, 1.0])])
    assert s["input_tokens"] == 4 and s["output_tokens"] == 2
    assert s["total_throughput_tok_s"] == pytest.approx(6.0)
    assert s["request_throughput_s"] == pytest.approx(1.0)


@pytest.mark.parametrize("slo_ms, match", [
    ({"latency": 10}, "latency"), ({"ttft": 0}, "ttft"), ({"tpot": -1}, "tpot"),
    ({"itl": float("inf")}, "itl"), ([("ttft", 1)], "slo_ms")])
def test_bad_slo_names_the_key_and_what_is_allowed(slo_ms, match):
    with pytest.raises(ValueError, match=match):
        metrics.summarize([output(0.0, [0.1, 0.2])], slo_ms=slo_ms)
