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
