"""Chapter 10's reference answers (teacher only): the solutions of
exercises/10_serving_from_the_client, used by the hidden cases (minillm.grading._hidden.ch10)
and the tests. The public checkers never import this module: their expected values come from
the streams' own truth and from the book's client (minillm.serve.bench_client)."""
from __future__ import annotations

import json


def token_chunk_times(events):
    """Times of the SSE events that carry a token: `data: {...}` with non-empty choices."""
    times = []
    for time_s, line in events:
        if not line.startswith("data:"):
            continue                       # blank separators, ": ping" comments
        data = line[5:].strip()
        if data == "[DONE]":
            break
        if json.loads(data).get("choices"):
            times.append(time_s)
    return times


def client_metrics(start_s, chunk_times, tokens_per_chunk):
    """vLLM's per-request numbers, and the per-token gaps a chunk of k tokens hides."""
    n = sum(tokens_per_chunk)
    ttft = chunk_times[0] - start_s
    latency = chunk_times[-1] - start_s
    itl = [b - a for a, b in zip(chunk_times, chunk_times[1:])]
    per_token = [0.0] * (tokens_per_chunk[0] - 1)          # the first chunk's extra tokens came with the first
    for gap, k in zip(itl, tokens_per_chunk[1:]):
        per_token += [gap / k] * k
    tpot = (latency - ttft) / (n - 1) if n > 1 else None
    return {"ttft": ttft, "tpot": tpot, "itl": itl, "itl_per_token": per_token}


def vllm_from_guidellm(itl_ms, tpot_ms, num_tokens):
    """guidellm 0.8's ITL is vLLM's TPOT; its TPOT is the latency over n tokens."""
    e2el_ms = tpot_ms * num_tokens
    gaps_ms = itl_ms * (num_tokens - 1) if num_tokens > 1 else 0.0
    return {"ttft_ms": e2el_ms - gaps_ms, "tpot_ms": itl_ms if num_tokens > 1 else None, "e2el_ms": e2el_ms}


def client_goodput(records, duration_s, slo_ms):
    good = 0
    for r in records:
        if not r["success"]:
            continue
        n = r["output_tokens"]
        values = {"ttft": r["ttft"], "e2el": r["latency"],
                  "tpot": (r["latency"] - r["ttft"]) / (n - 1) if n > 1 else None}
        if all(values[k] is None or 1e3 * values[k] <= limit for k, limit in slo_ms.items()):
            good += 1
    return good / duration_s


def itl_over_tpot(num_tokens, tokens_per_chunk):
    """m chunks: m - 1 ITL gaps share the time after the first chunk; TPOT shares it among
    num_tokens - 1 tokens. None where one of the two is missing (one chunk)."""
    num_chunks = -(-num_tokens // tokens_per_chunk)
    if num_chunks < 2:
        return None
    return (num_tokens - 1) / (num_chunks - 1)
