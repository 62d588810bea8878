"""Serving metrics, with the conventions of the serving benchmarks.

TTFT  first token time - arrival time
TPOT  (E2E - TTFT) / (output tokens - 1): a per-request MEAN gap
ITL   every gap between two consecutive arrivals of a request's tokens; a step
      that emits several tokens (speculative decoding) delivers them as one
      streamed chunk, so that is ONE gap, as `vllm bench serve` counts it (one
      ITL per chunk that carries a token: vllm/benchmarks/lib/
      endpoint_request_func.py, commit 3aee4a4). With speculation the mean ITL
      is then above the TPOT, which divides by tokens, not chunks.
E2E   finish time - arrival time

A stall is one long gap: it barely moves a stream's mean TPOT but it is the
max ITL, and with enough streams it is the p99 ITL. Report both.
"""
from __future__ import annotations

import math
from .validation import check_real


def distribution(values) -> dict[str, float]:
    """mean, median, p90, p99 and max of a list (NaN when empty)."""
    values = sorted(float(v) for v in values)
    if not values:
        nan = float("nan")
        return {"mean": nan, "median": nan, "p90": nan, "p99": nan, "max": nan}
    return {"mean": sum(values) / len(values), "median": percentile(values, 50),
            "p90": percentile(values, 90), "p99": percentile(values, 99), "max": values[-1]}


def percentile(values, q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default).

    The one percentile of the package: metrics, the cost model's and the
    simulator's error summaries and the book's figures all call it."""
    if not 0 <= q <= 100:
        raise ValueError(f"q={q}: percentiles are in [0, 100]")
    values = sorted(values)
    if not values:
        return float("nan")
    rank = (len(values) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return values[low] + (values[high] - values[low]) * (rank - low)


# The SLO keys of `vllm bench serve --goodput KEY:VALUE ...` (values in ms), plus "itl":
# a request meets an ITL SLO when its WORST gap does, so a stall fails it.
SLO_KEYS = ("ttft", "tpot", "itl", "e2el")


def check_slo_ms(slo_ms) -> dict[str, float]:
    """{key: milliseconds} with keys from SLO_KEYS and positive values, or ValueError."""
    if slo_ms is None:
        return {}
    if not isinstance(slo_ms, dict):
        raise ValueError(f"slo_ms={slo_ms!r}: give a dict such as {{'ttft': 2000, 'tpot': 100}} (milliseconds)")
    for key, value in slo_ms.items():
        if key not in SLO_KEYS:
            raise ValueError(f"slo_ms key {key!r}: choose from {SLO_KEYS}")
        check_real(f"slo_ms[{key!r}]", value, 0, exclusive_minimum=True, hint="milliseconds")
    return {key: float(value) for key, value in slo_ms.items()}


def _slo_values_s(output) -> dict[str, float | None]:
    """What each SLO key measures for one request, in seconds (None: not defined)."""
    m = output.metrics
    return {"ttft": m.ttft, "tpot": m.tpot, "itl": max(m.itl) if m.itl else None, "e2el": m.e2e}


def meets_slo(output, ttft_slo_s: float | None = None, tpot_slo_s: float | None = None,
              slo_ms: dict | None = None) -> bool:
    """Did this finished request meet every SLO? DistServe's per-request test, as
    `vllm bench serve --goodput` applies it. A request with one token has no TPOT
    or ITL: those SLOs hold vacuously."""
    limits_s = {key: value / 1e3 for key, value in check_slo_ms(slo_ms).items()}
    if ttft_slo_s is not None:
        limits_s["ttft"] = ttft_slo_s
    if tpot_slo_s is not None:
        limits_s["tpot"] = tpot_slo_s
    if not output.finished:
        return False
    values = _slo_values_s(output)
    for key, limit_s in limits_s.items():
        value = values[key]
        if value is None and key in ("ttft", "e2el"):
            return False
        if value is not None and value > limit_s:
            return False
    return True


def summarize(outputs, ttft_slo_s: float | None = None, tpot_slo_s: float | None = None,
              slo_ms: dict | None = None) -> dict:
    """Aggregate metrics of finished requests as `vllm bench serve` reports them; times in seconds.

    ttft, tpot, itl, e2e: mean, median, p90, p99, max. Throughputs over the
    whole run (first arrival to last finish): requests/s, output tokens/s and
    total (prompt + output) tokens/s. With SLOs (slo_ms in milliseconds, keys
    from SLO_KEYS, or the older ttft_slo_s / tpot_slo_s in seconds):
    slo_attainment, the fraction of requests meeting all of them, and
    goodput_req_s, those requests per second (DistServe's goodput, as vLLM's
    --goodput computes it).
    """
    slo_ms = check_slo_ms(slo_ms)
    outputs = [o for o in outputs if o.finished]
    if not outputs:
        raise ValueError("outputs: no finished request to summarize")
    start = min(o.metrics.arrival_time for o in outputs)
    end = max(o.metrics.finish_time for o in outputs)
    duration_s = max(end - start, 1e-12)
    num_output_tokens = sum(len(o.output_token_ids) for o in outputs)
    num_prompt_tokens = sum(o.prompt_len for o in outputs)
    summary = {
        "num_requests": len(outputs),
        "duration_s": duration_s,
        "input_tokens": num_prompt_tokens,
        "output_tokens": num_output_tokens,
        "throughput_tok_s": num_output_tokens / duration_s,
        "total_throughput_tok_s": (num_prompt_tokens + num_output_tokens) / duration_s,
        "request_throughput_s": len(outputs) / duration_s,
        "ttft": distribution(o.metrics.ttft for o in outputs),
        "tpot": distribution(o.metrics.tpot for o in outputs if o.metrics.tpot is not None),
        "itl": distribution(g for o in outputs for g in o.metrics.itl),
        "e2e": distribution(o.metrics.e2e for o in outputs),
    }
    if ttft_slo_s is not None or tpot_slo_s is not None or slo_ms:
        good = [o for o in outputs if meets_slo(o, ttft_slo_s, tpot_slo_s, slo_ms)]
        summary["slo_attainment"] = len(good) / len(outputs)
        summary["goodput_req_s"] = len(good) / duration_s
    return summary
