import pytest

from minillm.sim import workloads


def test_interference_streams_outlast_a_finely_chunked_prefill():
    wl = workloads.long_prompt_interference(prompt_len=2048, num_decoders=8)
    decoders = [r for r in wl.requests if r.tag == "decoder"]
    (long,) = [r for r in wl.requests if r.tag == "long"]
    assert len(decoders) == 8 and long.prompt_len == 2048 and long.after == ("decoder", 8)
    # Even chunked into 16-token pieces the prefill ends before the streams do.
    assert all(r.max_tokens - 8 > 2048 // 16 for r in decoders)


def test_poisson_mix_is_seeded_and_in_range():
    a = workloads.poisson_mix(50, rate_per_s=2.0, prompt_len=(32, 512), output_len=(16, 128), seed=1)
    b = workloads.poisson_mix(50, rate_per_s=2.0, prompt_len=(32, 512), output_len=(16, 128), seed=1)
    assert a == b
    times = [r.arrival_time for r in a.requests]
    assert times == sorted(times) and 10 < times[-1] < 50     # ~25 s on average for 49 gaps at 2/s
    assert all(32 <= r.prompt_len <= 512 and 16 <= r.max_tokens <= 128 for r in a.requests)
    assert a.prompt_ids(3, 100) == b.prompt_ids(3, 100) != a.prompt_ids(4, 100)


@pytest.mark.parametrize("kwargs, arg", [
    (dict(prompt_len=0), "prompt_len"), (dict(prompt_len=-5), "prompt_len"),
    (dict(num_decoders=-1), "num_decoders"), (dict(warmup_tokens=0), "warmup_tokens"),
])
def test_bad_interference_settings_name_the_argument(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        workloads.long_prompt_interference(**kwargs)


def test_bad_poisson_settings_name_the_argument():
    with pytest.raises(ValueError, match="rate_per_s"):
        workloads.poisson_mix(rate_per_s=0)
    with pytest.raises(ValueError, match="prompt_len"):
        workloads.poisson_mix(prompt_len=(10, 5))


def test_arrivals_have_the_asked_rate_and_burstiness_bunches_them():
    import statistics
    from minillm.sim.workloads import arrival_times
    for burstiness in (0.25, 1.0, 4.0):
        times = arrival_times(4000, rate_per_s=8.0, burstiness=burstiness, seed=1)
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert statistics.mean(gaps) == pytest.approx(1 / 8.0, rel=0.1)
        # a gamma of shape k has coefficient of variation 1/sqrt(k)
        assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(burstiness ** -0.5, rel=0.15)
    assert arrival_times(5, float("inf")) == [0.0] * 5


def test_steady_traffic_is_seeded_and_the_rate_moves_only_the_arrivals():
    from minillm.sim.workloads import steady_traffic
    a = steady_traffic(2.0, 50, "chat", seed=3)
    b = steady_traffic(2.0, 50, "chat", seed=3)
    c = steady_traffic(8.0, 50, "chat", seed=3)
    assert a.requests == b.requests
    assert [(r.prompt_len, r.max_tokens) for r in a.requests] == [(r.prompt_len, r.max_tokens) for r in c.requests]
    assert c.requests[-1].arrival_time < a.requests[-1].arrival_time
    assert all(r.prompt_len + r.max_tokens < 4096 for r in a.requests)


@pytest.mark.parametrize("lengths, prompt_median, output_median", [
    ("uniform", 562, 562), ("chat", 1730, 415), ("long_prompt", 7059, 208)])
def test_length_mixes_match_their_published_medians(lengths, prompt_median, output_median):
    import statistics
    from minillm.sim.workloads import steady_traffic
    w = steady_traffic(1.0, 3000, lengths, max_model_len=10**6, seed=0)
    assert statistics.median(r.prompt_len for r in w.requests) == pytest.approx(prompt_median, rel=0.08)
    assert statistics.median(r.max_tokens for r in w.requests) == pytest.approx(output_median, rel=0.08)


@pytest.mark.parametrize("lengths, prompt_p90, output_p90", [
    # Sarathi-Serve (arXiv:2403.02310), Table 2: P90 of prompt and output tokens
    ("chat", 5696, 834), ("long_prompt", 12985, 371)])
def test_length_mixes_match_their_published_p90s(lengths, prompt_p90, output_p90):
    from minillm.metrics import percentile
    from minillm.sim.workloads import steady_traffic
    w = steady_traffic(1.0, 3000, lengths, max_model_len=10**6, seed=0)
    assert percentile([r.prompt_len for r in w.requests], 90) == pytest.approx(prompt_p90, rel=0.08)
    assert percentile([r.max_tokens for r in w.requests], 90) == pytest.approx(output_p90, rel=0.08)


def test_a_higher_rate_is_the_same_trace_compressed():
    # capacity's probes share their random numbers: arrivals at rate r are the
    # unit-rate arrivals divided by r, whatever the burstiness
    from minillm.sim.workloads import arrival_times
    for burstiness in (0.5, 1.0, 3.0):
        unit = arrival_times(200, 1.0, burstiness, seed=5)
        fast = arrival_times(200, 8.0, burstiness, seed=5)
        assert fast == pytest.approx([t / 8.0 for t in unit], rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("kwargs, arg", [
    (dict(rate_per_s=0), "rate_per_s"), (dict(rate_per_s=-1.0), "rate_per_s"),
    (dict(num_requests=0), "num_requests"), (dict(lengths="sharegpt"), "lengths"),
    (dict(burstiness=0), "burstiness"), (dict(max_model_len=1), "max_model_len")])
def test_bad_steady_traffic_names_the_argument(kwargs, arg):
    from minillm.sim.workloads import steady_traffic
    with pytest.raises(ValueError, match=arg):
        steady_traffic(**kwargs)
