"""Capacity: the highest request rate at which a configuration meets its SLOs.

Sarathi-Serve (Agrawal et al., OSDI'24) measures a serving system by its
capacity: the most queries per second it sustains while the P99 time between
tokens (our ITL) stays under an SLO and the median scheduling delay stays
low. We search the rate on the simulator: serve the same seeded requests
(steady_traffic: the lengths do not depend on the rate, only the arrivals)
at rates on a geometric grid, and bisect for the last rate that passes.
Latency grows with the rate, so the pass/fail line is crossed once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from ..validation import check_real

from ..scheduler import SchedulerConfig
from .simulator import resolve_hardware, resolve_model, simulate
from .workloads import LENGTH_MIXES, steady_traffic

__all__ = ["CapacitySLO", "RATE_GRID", "CapacityResult", "capacity", "load_point", "sarathi_headline"]

# Request rates tried: 2^(k/4) req/s, from 1/16 to 64 (steps of 19%).
RATE_GRID = tuple(2 ** (k / 4) for k in range(-16, 25))


@dataclass(frozen=True)
class CapacitySLO:
    """What "meets the SLO" means for a whole run: P99 of every token gap (ITL,
    Sarathi-Serve's P99 TBT) and the median TTFT, in milliseconds; None: no limit."""
    itl_p99_ms: float | None = 100.0
    ttft_p50_ms: float | None = 2000.0

    def __post_init__(self):
        for name in ("itl_p99_ms", "ttft_p50_ms"):
            value = getattr(self, name)
            check_real(name, value, 0, exclusive_minimum=True, allow_none=True, hint="milliseconds, or None")

    def met_by(self, point: dict) -> bool:
        """point: a load_point row."""
        return ((self.itl_p99_ms is None or point["itl_p99_s"] * 1e3 <= self.itl_p99_ms)
                and (self.ttft_p50_ms is None or point["ttft_p50_s"] * 1e3 <= self.ttft_p50_ms))


def _key(sched, lengths, model, hardware, num_requests, seed, rate):
    name = hardware if isinstance(hardware, str) else hardware.name
    model_name = model if isinstance(model, str) else model.name
    return (sched, lengths, model_name, name, num_requests, seed, rate)


def load_point(sched: SchedulerConfig, rate_per_s: float, lengths: str = "chat", model="mistral-7b",
               hardware="A100-80GB", num_requests: int = 48, seed: int = 0, cache: dict | None = None) -> dict:
    """Serve num_requests of `lengths` at rate_per_s; the numbers capacity and the
    lab need (seconds): TTFT p50/p90/p99, TPOT mean/p50/p99, ITL p50/p99/max,
    throughputs. cache: a dict to memoize in (the lab keeps one)."""
    key = _key(sched, lengths, model, hardware, num_requests, seed, rate_per_s)
    if cache is not None and key in cache:
        return cache[key]
    cfg = resolve_model(model)
    workload = steady_traffic(rate_per_s, num_requests, lengths, max_model_len=cfg.max_position, seed=seed)
    s = simulate(workload, sched, model=cfg, hardware=hardware).summary()
    point = {"rate_per_s": rate_per_s,
             "ttft_p50_s": s["ttft"]["median"], "ttft_p90_s": s["ttft"]["p90"], "ttft_p99_s": s["ttft"]["p99"],
             "tpot_mean_s": s["tpot"]["mean"], "tpot_p50_s": s["tpot"]["median"], "tpot_p99_s": s["tpot"]["p99"],
             "itl_p50_s": s["itl"]["median"], "itl_p99_s": s["itl"]["p99"], "itl_max_s": s["itl"]["max"],
             "request_throughput_s": s["request_throughput_s"], "throughput_tok_s": s["throughput_tok_s"],
             "num_steps": s["num_steps"]}
    if cache is not None:
        cache[key] = point
    return point


@dataclass
class CapacityResult:
    rate_per_s: float                 # highest grid rate meeting the SLO (0.0: not even the lowest)
    slo: CapacitySLO
    points: dict = field(default_factory=dict)      # rate -> load_point row, every rate tried


def capacity(sched: SchedulerConfig, slo: CapacitySLO | None = None, lengths: str = "chat",
             model="mistral-7b", hardware="A100-80GB", num_requests: int = 48, seed: int = 0,
             rates=RATE_GRID, cache: dict | None = None, on_point=None) -> CapacityResult:
    """The highest rate in `rates` (ascending) at which `sched` meets `slo`, by bisection.

    About log2(len(rates)) simulations (6 on the default grid); every one is
    kept in cache when given, and the SLO does not enter the key, so a new
    SLO re-uses the runs. on_point(rate): called before each simulation (a
    progress hook for the lab).
    """
    slo = slo if slo is not None else CapacitySLO()
    if not isinstance(slo, CapacitySLO):
        raise ValueError(f"slo={slo!r}: give a CapacitySLO(itl_p99_ms=..., ttft_p50_ms=...)")
    if not isinstance(sched, SchedulerConfig):
        raise ValueError(f"sched={sched!r}: give a SchedulerConfig")
    if lengths not in LENGTH_MIXES:
        raise ValueError(f"lengths={lengths!r}: choose one of {tuple(LENGTH_MIXES)}")
    rates = sorted(rates)
    if not rates or rates[0] <= 0:
        raise ValueError(f"rates={rates!r}: give positive request rates")
    resolve_hardware(hardware)
    result = CapacityResult(0.0, slo)

    def passes(i: int) -> bool:
        if on_point is not None:
            on_point(rates[i])
        point = load_point(sched, rates[i], lengths, model, hardware, num_requests, seed, cache)
        result.points[rates[i]] = point
        return slo.met_by(point)

    low, high = -1, len(rates)            # rates[low] passes (or none), rates[high] fails (or none)
    while high - low > 1:
        mid = (low + high) // 2
        if passes(mid):
            low = mid
        else:
            high = mid
    result.rate_per_s = rates[low] if low >= 0 else 0.0
    return result


def sarathi_headline(num_requests: int = 48, seed: int = 0, cache: dict | None = None) -> dict:
    """Sarathi-Serve's capacity experiment, qualitatively, on the simulator.

    Mistral-7B on one A100 (our A100-80GB profile), the chat mix (lengths of
    openchat_sharegpt4 as the paper reports them, cut to the preset's 4096-token
    context), a strict and a relaxed P99 ITL SLO with the median TTFT under 2 s.
    Baseline: prefill_first (vLLM before chunking); Sarathi-Serve: chunked with
    a token budget of 512 (strict) or 2048 (relaxed), the budgets the paper runs.
    Strict and relaxed SLOs follow the paper's recipe as we read it: 5x and 25x
    the time of a decode step (here: 32 decodes over 2048 cached tokens).
    Returns per SLO: both capacities, our ratio and the paper's 2.6x (strict).
    """
    from .cost_model import predict_step
    decode_s = predict_step(resolve_model("mistral-7b"), [(1, 2048)] * 32, "A100-80GB").total
    out = {"decode_step_ms": decode_s * 1e3}
    for name, factor, budget in (("strict", 5, 512), ("relaxed", 25, 2048)):
        slo = CapacitySLO(itl_p99_ms=factor * decode_s * 1e3, ttft_p50_ms=2000.0)
        runs = {}
        for label, sched in (("prefill_first", SchedulerConfig(policy="prefill_first", max_num_seqs=128)),
                             (f"chunked {budget}", SchedulerConfig(policy="chunked", chunk_size=budget,
                                                                   token_budget=budget, max_num_seqs=128))):
            runs[label] = capacity(sched, slo, "chat", "mistral-7b", "A100-80GB", num_requests, seed,
                                   cache=cache).rate_per_s
        base, ours = runs["prefill_first"], runs[f"chunked {budget}"]
        out[name] = {"itl_p99_slo_ms": slo.itl_p99_ms, "capacity_req_s": runs,
                     "ratio": ours / base if base else math.inf,
                     "paper_ratio": 2.6 if name == "strict" else None}
    return out
