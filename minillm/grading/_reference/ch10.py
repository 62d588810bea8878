"""Reference answers for exercises/10_serving_from_the_client (private to the checkers)."""
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
    per_token = []
    for gap, k in zip(itl, tokens_per_chunk[1:]):
        per_token += [gap / k] * k
    # the first chunk's extra tokens came with the first token: gaps of zero
    per_token = [0.0] * (tokens_per_chunk[0] - 1) + per_token
    tpot = (latency - ttft) / (n - 1) if n > 1 else None
    return {"ttft": ttft, "tpot": tpot, "itl": itl, "itl_per_token": per_token}


def guidellm_metrics(ttft, latency, num_tokens):
    """guidellm 0.8's names for the same request: its ITL is vLLM's TPOT; its TPOT counts the first token."""
    return {"itl": (latency - ttft) / (num_tokens - 1) if num_tokens > 1 else None,
            "tpot": latency / num_tokens}
