# %% [markdown]
# # Exercises 10: serving, measured from the client
#
# Four small functions a benchmark client needs: find the events of a stream that carry a
# token, turn their times into TTFT, TPOT and ITL when a chunk may carry several tokens,
# rename the numbers as guidellm names them, and score a run by goodput. Each checker
# compares your function with the book's client (`minillm.serve.bench_client`) and a
# reference on fresh random streams, with the client's own functions switched off while
# yours runs. Fill in the bodies where it says `raise NotImplementedError`.

# %%
import json

import minillm.grading as ex

# %% [markdown]
# ## 1. Which events carry a token
#
# `events` is a server-sent-event stream as a client reads it: a list of
# `(arrival_time_s, line)` pairs. Lines are `data: {json}`, blank separators, comments
# such as `: ping`, and finally `data: [DONE]`. Return the arrival times of the events
# that carry a token, as `vllm bench serve` counts them: a `data:` event whose `choices`
# list is not empty. Its text may be empty (a token that completes no character yet); the
# usage chunk at the end has `choices: []`.
#
# <details><summary>Hint</summary>
#
# Skip lines that do not start with `data:`, stop at `[DONE]`, and test
# `json.loads(...).get("choices")`, not the text.
#
# </details>

# %%
def token_chunk_times(events):
    ### BEGIN SOLUTION
    times = []
    for time_s, line in events:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        if json.loads(data).get("choices"):
            times.append(time_s)
    return times
    ### END SOLUTION


# %%
ex.check_token_chunk_times(token_chunk_times)  # points: 1

# %% [markdown]
# ## 2. TTFT, TPOT and ITL when chunks carry several tokens
#
# A server may put several tokens in one chunk (speculative decoding, a slow client that
# lets tokens pile up, llama.cpp's `n_probs`...). `chunk_times` are the arrival times of a
# request's token chunks, `tokens_per_chunk[i]` how many tokens chunk `i` carried, and
# `start_s` when the POST was sent. Return a dict:
#
# * `ttft`: first chunk minus start;
# * `tpot`: vLLM's (latency - TTFT) / (completion tokens - 1), latency being the last chunk
#   minus start; `None` for a one-token request;
# * `itl`: vLLM's list, one gap per pair of consecutive chunks (this is vLLM #27485's
#   complaint: a chunk of k tokens reads as one long gap);
# * `itl_per_token`: one gap per pair of consecutive *tokens*: spread each chunk's gap
#   evenly over the tokens it carried, and count the first chunk's extra tokens as gaps
#   of 0 (they came with the first). Its mean is the TPOT.
#
# The chapter does not print this one: work it out from the definitions.
#
# <details><summary>Hint</summary>
#
# A request of n tokens has n - 1 token gaps: `tokens_per_chunk[0] - 1` zeros, then, for
# every later chunk of k tokens after a gap g, k gaps of g / k.
#
# </details>

# %%
def client_metrics(start_s, chunk_times, tokens_per_chunk):
    ### BEGIN SOLUTION
    n = sum(tokens_per_chunk)
    ttft = chunk_times[0] - start_s
    latency = chunk_times[-1] - start_s
    itl = [b - a for a, b in zip(chunk_times, chunk_times[1:])]
    per_token = [0.0] * (tokens_per_chunk[0] - 1)
    for gap, k in zip(itl, tokens_per_chunk[1:]):
        per_token += [gap / k] * k
    tpot = (latency - ttft) / (n - 1) if n > 1 else None
    return {"ttft": ttft, "tpot": tpot, "itl": itl, "itl_per_token": per_token}
    ### END SOLUTION


# %%
ex.check_client_metrics(client_metrics)  # points: 3

# %% [markdown]
# ## 3. The same request in guidellm's words
#
# guidellm 0.8 (`src/guidellm/schemas/request_stats.py`) names per-request quantities
# differently from vLLM: its `inter_token_latency_ms` is vLLM's TPOT (time between the
# first and the last token over n - 1), and its `time_per_output_token_ms` is the whole
# latency over n, the first token included. Given vLLM's `ttft`, `latency` (seconds) and
# `num_tokens`, return `{"itl": ..., "tpot": ...}` in guidellm's meanings (seconds;
# `itl` is `None` for one token).
#
# <details><summary>Hint</summary>
#
# Both are one line; only the numerator and the denominator move.
#
# </details>

# %%
def guidellm_metrics(ttft, latency, num_tokens):
    ### BEGIN SOLUTION
    itl = (latency - ttft) / (num_tokens - 1) if num_tokens > 1 else None
    return {"itl": itl, "tpot": latency / num_tokens}
    ### END SOLUTION


# %%
ex.check_guidellm_names(guidellm_metrics)  # points: 1

# %% [markdown]
# ## 4. Goodput from a client's records
#
# `records` is a list of dicts with `success`, `ttft` and `latency` (seconds, `None` when
# the request failed) and `output_tokens`; `slo_ms` maps some of `"ttft"`, `"tpot"`,
# `"e2el"` to milliseconds. Return the goodput as `vllm bench serve --goodput` reports it:
# successful requests that meet **every** SLO given, per second of `duration_s`. TPOT is
# (latency - ttft) / (output_tokens - 1); a one-token request has none and meets a TPOT
# SLO vacuously; e2el is the latency. Do not call the book's client.
#
# <details><summary>Hint</summary>
#
# Build `{"ttft": ..., "tpot": ..., "e2el": ...}` in milliseconds per request, then
# `all(...)` over the SLO keys, treating a `None` TPOT as met.
#
# </details>

# %%
def client_goodput(records, duration_s, slo_ms):
    ### BEGIN SOLUTION
    good = 0
    for r in records:
        if not r["success"]:
            continue
        n = r["output_tokens"]
        values = {"ttft": r["ttft"], "e2el": r["latency"],
                  "tpot": (r["latency"] - r["ttft"]) / (n - 1) if n > 1 else None}
        if all(values[k] is None and k == "tpot" or (values[k] is not None and 1e3 * values[k] <= limit)
               for k, limit in slo_ms.items()):
            good += 1
    return good / duration_s
    ### END SOLUTION


# %%
ex.check_client_goodput(client_goodput)  # points: 2
