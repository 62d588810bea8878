"""Serving metrics, with the conventions of the serving benchmarks.

TTFT  first token time - arrival time
TPOT  (E2E - TTFT) / (output tokens - 1): a per-request MEAN gap
ITL   every gap between two consecutive tokens of a request
E2E   finish time - arrival time

A stall is one long gap: it barely moves a stream's mean TPOT but it is the
max ITL, and with enough streams it is the p99 ITL. Report both.
"""
from __future__ import annotations

import math


def distribution(values) -> dict[str, float]:
    """mean, median, p90, p99 and max of a list (NaN when empty)."""
    values = sorted(float(v) for v in values)
    if not values:
        nan = float("nan")
        return {"mean": nan, "median": nan, "p90": nan, "p99": nan, "max": nan}
    return {"mean": sum(values) / len(values), "median": percentile(values, 50),
            "p90": percentile(values, 90), "p99": percentile(values, 99), "max": values[-1]}


def percentile(values, q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not 0 <= q <= 100:
        raise ValueError(f"q={q}: percentiles are in [0, 100]")
    values = sorted(values)
    if not values:
        return float("nan")
    rank = (len(values) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return values[low] + (values[high] - values[low]) * (rank - low)


def meets_slo(output, ttft_slo_s: float | None = None, tpot_slo_s: float | None = None) -> bool:
    m = output.metrics
    if ttft_slo_s is not None and (m.ttft is None or m.ttft > ttft_slo_s):
        return False
    if tpot_slo_s is not None and m.tpot is not None and m.tpot > tpot_slo_s:
        return False
    return output.finished


def summarize(outputs, ttft_slo_s: float | None = None, tpot_slo_s: float | None = None) -> dict:
    """Aggregate metrics of finished requests; times in seconds.

    throughput: output tokens per second over the whole run (first arrival
    to last finish); goodput: requests per second that met both SLOs.
    """
    outputs = [o for o in outputs if o.finished]
    if not outputs:
        raise ValueError("outputs: no finished request to summarize")
    start = min(o.metrics.arrival_time for o in outputs)
    end = max(o.metrics.finish_time for o in outputs)
    duration_s = max(end - start, 1e-12)
    num_output_tokens = sum(len(o.output_token_ids) for o in outputs)
    summary = {
        "num_requests": len(outputs),
        "duration_s": duration_s,
        "output_tokens": num_output_tokens,
        "throughput_tok_s": num_output_tokens / duration_s,
        "request_throughput_s": len(outputs) / duration_s,
        "ttft": distribution(o.metrics.ttft for o in outputs),
        "tpot": distribution(o.metrics.tpot for o in outputs if o.metrics.tpot is not None),
        "itl": distribution(g for o in outputs for g in o.metrics.itl),
        "e2e": distribution(o.metrics.e2e for o in outputs),
    }
    if ttft_slo_s is not None or tpot_slo_s is not None:
        good = [o for o in outputs if meets_slo(o, ttft_slo_s, tpot_slo_s)]
        summary["slo_attainment"] = len(good) / len(outputs)
        summary["goodput_req_s"] = len(good) / duration_s
    return summary
