"""Checkers for exercises/10_serving_from_the_client: a client's arithmetic.

Each checker draws random streams (the same ones every run: @checker fixes seed=None) (SSE lines with blank separators, ping
comments, a usage chunk, chunks that carry several tokens) and compares the
learner's numbers with the reference and with the book's client
(minillm.serve.bench_client), whose own functions are switched off while the
learner's run.
"""
from __future__ import annotations

import json
import math
import random

from ..serve.bench_client import RequestRecord, group_metrics
from ._common import checker, fail as _fail, learner_call, passed
from ._reference import ch10 as ref

__all__ = ["check_token_chunk_times", "check_client_metrics", "check_guidellm_names", "check_client_goodput"]

_CLIENT = ("minillm.serve.bench_client.group_metrics", "minillm.serve.bench_client.meets_slo_ms",
           "minillm.serve.bench_client.RequestRecord.tpot", "minillm.serve.bench_client.RequestRecord.itl",
           "minillm.metrics.summarize", "minillm.metrics.meets_slo")


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def random_stream(rng: random.Random, num_chunks: int | None = None):
    """(events, tokens per chunk): an SSE stream as (arrival time s, line) pairs."""
    num_chunks = num_chunks or rng.randint(1, 12)
    t, events, tokens = rng.uniform(0.05, 0.5), [], []
    if rng.random() < 0.5:
        events.append((t, ": ping"))                     # an SSE comment: no data
    for i in range(num_chunks):
        t += rng.uniform(0.001, 0.3)
        k = rng.choice([1, 1, 1, 2, 3, 5])
        tokens.append(k)
        text = "" if rng.random() < 0.2 else "".join(rng.choice("abc ") for _ in range(k))
        chunk = {"id": "cmpl-x", "object": "text_completion",
                 "choices": [{"index": 0, "text": text, "finish_reason": "length" if i == num_chunks - 1 else None}]}
        events.append((t, "data: " + json.dumps(chunk)))
        events.append((t, ""))
    t += rng.uniform(0.0001, 0.01)
    events.append((t, "data: " + json.dumps({"id": "cmpl-x", "choices": [], "usage": {"completion_tokens": sum(tokens)}})))
    events.append((t, ""))
    events.append((t + 1e-4, "data: [DONE]"))
    return events, tokens


# ---------------------------------------------------------------------------
# 1. Which events carry a token
# ---------------------------------------------------------------------------
@checker
def check_token_chunk_times(token_chunk_times, seed: int | None = None, *, num_cases: int = 200):
    """token_chunk_times(events) -> times of the events that carry a token."""
    rng = random.Random(seed)
    for _ in range(num_cases):
        events, _ = random_stream(rng)
        expected = ref.token_chunk_times(events)
        got = learner_call(token_chunk_times, list(events))
        if list(got) != expected:
            extra = len(got) - len(expected)
            why = ("; the usage chunk (choices: []) carries no token" if extra == 1 else
                   "; a chunk whose text is empty still carries a token (vLLM counts it)" if extra < 0 else "")
            _fail(f"for a stream of {len(expected)} token chunks you returned {len(got)} times{why}")
    return passed(f"token_chunk_times: {num_cases} random streams read as vllm bench serve reads them")


# ---------------------------------------------------------------------------
# 2. TTFT, TPOT, ITL when a chunk carries several tokens
# ---------------------------------------------------------------------------
@checker
def check_client_metrics(client_metrics, seed: int | None = None, *, num_cases: int = 300):
    """client_metrics(start_s, chunk_times, tokens_per_chunk) -> dict ttft, tpot, itl, itl_per_token."""
    rng = random.Random(seed)
    cases = [([0.5, 0.6, 0.7], [1, 1, 1], 0.0), ([1.0, 1.3], [1, 3], 0.2), ([2.0], [4], 1.0), ([0.4], [1], 0.1)]
    for case in range(num_cases):
        if case < len(cases):
            times, tokens, start = cases[case]
        else:
            events, tokens = random_stream(rng)
            times, start = ref.token_chunk_times(events), 0.0
        expected = ref.client_metrics(start, times, tokens)
        record = RequestRecord("x", output_tokens=sum(tokens), ttft=times[0] - start, latency=times[-1] - start,
                               chunk_times=list(times))
        assert _close(record.tpot, expected["tpot"]) and len(record.itl) == len(expected["itl"])
        got = learner_call(client_metrics, start, list(times), list(tokens), forbidden=_CLIENT,
                           why="compute it from the chunk times.")
        label = f"start {start}, chunks at {[round(t, 4) for t in times][:6]}, tokens per chunk {tokens[:6]}"
        for key in ("ttft", "tpot"):
            if not _close(got.get(key), expected[key]):
                hint = (" (TPOT divides by completion tokens - 1, not by chunks - 1; one token: None)"
                        if key == "tpot" else " (from the POST to the first chunk)")
                _fail(f"{label}: {key} = {got.get(key)}, expected {expected[key]}{hint}")
        if len(got.get("itl", ())) != len(expected["itl"]) or not all(map(_close, got["itl"], expected["itl"])):
            _fail(f"{label}: itl = {got.get('itl')}, expected {expected['itl']} (one gap per pair of chunks, as vLLM)")
        per_token = got.get("itl_per_token", ())
        if len(per_token) != sum(tokens) - 1:
            _fail(f"{label}: itl_per_token has {len(per_token)} gaps, a request of {sum(tokens)} tokens has "
                  f"{sum(tokens) - 1} (a chunk of k tokens hides k gaps)")
        if not all(map(_close, per_token, expected["itl_per_token"])):
            _fail(f"{label}: itl_per_token = {[round(g, 4) for g in per_token][:8]}, expected "
                  f"{[round(g, 4) for g in expected['itl_per_token']][:8]} (spread a chunk's gap evenly over its "
                  "tokens; the first chunk's extra tokens came with the first: gaps of 0)")
    return passed(f"client_metrics: {num_cases} streams with multi-token chunks measured as vLLM does, "
                  "and their per-token gaps recovered")


# ---------------------------------------------------------------------------
# 3. guidellm's names
# ---------------------------------------------------------------------------
@checker
def check_guidellm_names(guidellm_metrics, seed: int | None = None, *, num_cases: int = 200):
    """guidellm_metrics(ttft, latency, num_tokens) -> {"itl": ..., "tpot": ...} in guidellm 0.8's meanings."""
    rng = random.Random(seed)
    for case in range(num_cases):
        n = 1 if case == 0 else rng.randint(1, 300)
        ttft = rng.uniform(0.01, 2.0)
        latency = ttft + (0 if n == 1 else rng.uniform(0.01, 10.0))
        expected = ref.guidellm_metrics(ttft, latency, n)
        got = learner_call(guidellm_metrics, ttft, latency, n, forbidden=_CLIENT, why="use the definitions.")
        for key, hint in (("itl", "guidellm's ITL is vLLM's TPOT: (latency - ttft) / (n - 1); None for one token"),
                          ("tpot", "guidellm's TPOT is latency / n, the first token included")):
            if not _close(got.get(key), expected[key]):
                _fail(f"ttft {ttft:.3f} s, latency {latency:.3f} s, {n} tokens: {key} = {got.get(key)}, "
                      f"expected {expected[key]} ({hint})")
    return passed(f"guidellm_metrics: {num_cases} requests renamed as guidellm 0.8 names them")


# ---------------------------------------------------------------------------
# 4. Goodput from a client's records
# ---------------------------------------------------------------------------
@checker
def check_client_goodput(client_goodput, seed: int | None = None, *, num_cases: int = 200):
    """client_goodput(records, duration_s, slo_ms) -> requests/s that succeeded and met every SLO."""
    rng = random.Random(seed)
    for case in range(num_cases):
        records = []
        for i in range(rng.randint(1, 12)):
            n = rng.choice([1, 2, rng.randint(3, 100)])
            ttft = rng.uniform(0.01, 1.0)
            latency = ttft + (0.0 if n == 1 else rng.uniform(0.01, 3.0))
            ok = rng.random() > 0.15
            records.append({"success": ok, "ttft": ttft if ok else None, "latency": latency if ok else None,
                            "output_tokens": n if ok else 0})
        slo_ms = {k: v for k, v in (("ttft", rng.choice([None, 200, 500, 900])), ("tpot", rng.choice([None, 20, 50])),
                                    ("e2el", rng.choice([None, None, 1500]))) if v is not None} or {"ttft": 500}
        duration_s = rng.uniform(1, 20)
        objs = [RequestRecord(f"r{i}", output_tokens=r["output_tokens"], ttft=r["ttft"], latency=r["latency"],
                              success=r["success"]) for i, r in enumerate(records)]
        expected = group_metrics(objs, duration_s, slo_ms)["goodput"]
        got = learner_call(client_goodput, [dict(r) for r in records], duration_s, dict(slo_ms), forbidden=_CLIENT,
                           why="apply the SLOs yourself.")
        if not _close(got, expected):
            _fail(f"{len(records)} records over {duration_s:.2f} s, SLOs {slo_ms} ms: you said {got}, expected "
                  f"{expected} (count successful requests meeting EVERY SLO given, TPOT = (latency - ttft) / (n - 1) "
                  "holding vacuously for one token; divide by the duration)")
    return passed(f"client_goodput: {num_cases} runs scored as vllm bench serve --goodput scores them")
