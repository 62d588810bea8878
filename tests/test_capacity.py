"""capacity: the highest rate meeting the SLOs, found by bisection over a rate grid."""
import pytest

from minillm.scheduler import SchedulerConfig
from minillm.sim.capacity import CapacitySLO, capacity, load_point

RATES = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
SMALL = dict(lengths="uniform", model="llama-3-8b", hardware="A100-80GB", num_requests=12, seed=0)


def test_capacity_is_the_last_rate_that_passes_and_the_next_one_fails():
    cache = {}
    slo = CapacitySLO(itl_p99_ms=60, ttft_p50_ms=500)
    result = capacity(SchedulerConfig(policy="chunked", chunk_size=256), slo, rates=RATES, cache=cache, **SMALL)
    assert result.rate_per_s in RATES
    assert slo.met_by(result.points[result.rate_per_s])
    above = [r for r in RATES if r > result.rate_per_s]
    if above:
        assert not slo.met_by(load_point(SchedulerConfig(policy="chunked", chunk_size=256), above[0],
                                         cache=cache, **SMALL))
    # the runs are cached: a new SLO re-uses them
    before = len(cache)
    capacity(SchedulerConfig(policy="chunked", chunk_size=256), CapacitySLO(itl_p99_ms=61, ttft_p50_ms=500),
             rates=RATES, cache=cache, **SMALL)
    assert len(cache) == before


def test_a_looser_slo_never_lowers_capacity():
    sched = SchedulerConfig(policy="prefill_first")
    strict = capacity(sched, CapacitySLO(itl_p99_ms=40), rates=RATES, **SMALL).rate_per_s
    relaxed = capacity(sched, CapacitySLO(itl_p99_ms=400), rates=RATES, **SMALL).rate_per_s
    assert relaxed >= strict


def test_stall_free_chunking_has_more_capacity_than_prefill_first_under_a_strict_itl_slo():
    # Sarathi-Serve's headline, qualitatively: with a tight P99 ITL SLO the stalls of
    # whole prompts cap prefill_first's rate, chunking keeps every gap short.
    slo = CapacitySLO(itl_p99_ms=50, ttft_p50_ms=2000)
    kwargs = dict(SMALL, lengths="chat", model="mistral-7b", num_requests=16)
    base = capacity(SchedulerConfig(policy="prefill_first"), slo, rates=RATES, **kwargs).rate_per_s
    chunked = capacity(SchedulerConfig(policy="chunked", chunk_size=512, token_budget=512), slo,
                       rates=RATES, **kwargs).rate_per_s
    assert chunked > base


@pytest.mark.parametrize("make, arg", [
    (lambda: CapacitySLO(itl_p99_ms=0), "itl_p99_ms"),
    (lambda: CapacitySLO(ttft_p50_ms=-5), "ttft_p50_ms"),
    (lambda: capacity(SchedulerConfig(), slo="fast"), "slo"),
    (lambda: capacity(SchedulerConfig(), lengths="nope"), "lengths"),
    (lambda: capacity(SchedulerConfig(), rates=[0.0, 1.0]), "rates"),
    (lambda: capacity("chunked"), "sched")])
def test_bad_capacity_arguments_name_themselves(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()
