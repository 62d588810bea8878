# %% [markdown]
# # Exercises 10: serving, measured from the client
#
# Five problems a benchmark client poses: repair a parser that misreads some servers'
# streams, recover TTFT, TPOT and the per-token gaps when a chunk carries several tokens,
# turn a guidellm report back into vLLM's numbers, score a run by goodput, and predict how
# far a client's mean ITL reads above its TPOT before the client measures it. Each checker
# draws streams from a model of a server (it knows when every token was produced) and
# compares your numbers with that truth and with the book's client
# (`minillm.serve.bench_client`), whose own functions are switched off while yours run.

# %%
import json

import minillm.grading as ex

# %% [markdown]
# ## 1. Which events carry a token: repair a parser
#
# `events` is a server-sent-event stream as a client reads it: a list of
# `(arrival_time_s, line)` pairs, from `/v1/completions` or `/v1/chat/completions`. A
# colleague's parser (below) returns the arrival times of the events that carry a token. It
# reads the stream of chapter 10's section 2 right when every token has some text and no
# usage is asked for; on the streams `vllm bench serve` meets it is wrong, or it crashes.
# Write `token_chunk_times(events)` so that it counts the events `vllm bench serve` counts
# (chapter 10, section 2, gives its rules, read in vLLM's client).

# %%
def colleague_token_chunk_times(events):
    times = []
    for time_s, line in events:
        if line.startswith("data: ") and line != "data: [DONE]":
            chunk = json.loads(line[len("data: "):])
            text = chunk["choices"][0]["text"] if chunk["choices"] else ""
            if text or chunk.get("usage"):
                times.append(time_s)
    return times


plain = [(0.10, 'data: {"choices": [{"index": 0, "text": "He"}]}'), (0.10, ""),
         (0.15, 'data: {"choices": [{"index": 0, "text": "llo"}]}'), (0.15, ""), (0.16, "data: [DONE]")]
assert colleague_token_chunk_times(plain) == [0.10, 0.15]

# %% [markdown]
# <details><summary>Hint</summary>
#
# Go through the kinds of line a stream can hold (chapter 10, section 2, printed one) and,
# for each, ask what the colleague's code does with it. Which field tells that a chunk
# carries a token, whatever its text and whatever the endpoint? Running the check on the
# colleague's function shows the first stream it misreads.
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
ex.check_token_chunk_times(token_chunk_times)  # points: 2

# %% [markdown]
# ## 2. TTFT, TPOT and ITL when chunks carry several tokens
#
# A server may put several tokens in one chunk (speculative decoding, a slow client that
# lets tokens pile up, ...). `chunk_times` are the arrival times of a request's token
# chunks, `tokens_per_chunk[i]` how many tokens chunk `i` carried, and `start_s` when the
# POST was sent. Return a dict with
#
# * `ttft`, `tpot`, `itl`: what `vllm bench serve` reports for this request (chapter 10,
#   section 3: TPOT uses the completion tokens; `None` for a one-token request), and
# * `itl_per_token`: the gaps between consecutive *tokens* as the server produced them.
#   The client cannot see inside a chunk; assume the server produced the tokens of a chunk
#   at an even pace over the gap before it, and the first chunk's tokens together with the
#   first token.
#
# This is vLLM #27485's complaint: a chunk of k tokens reads as one long gap. The chapter
# does not work `itl_per_token` out for you.
#
# <details><summary>Hint</summary>
#
# How many gaps does a request of n tokens have, and how many does the chunk list show?
# Where do the missing ones hide, and what must they add up to?
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
# ## 3. A guidellm report, back in vLLM's words
#
# Someone sends you a guidellm 0.8 run: per request, its `inter_token_latency_ms`, its
# `time_per_output_token_ms` and its output tokens. Chapter 10 (section 3) gives what
# guidellm means by each (`src/guidellm/schemas/request_stats.py`; its ITL is `None` for a
# one-token request). Write `vllm_from_guidellm(itl_ms, tpot_ms, num_tokens)`: the same
# request's numbers as `vllm bench serve` would report them, `{"ttft_ms": ..., "tpot_ms":
# ..., "e2el_ms": ...}` (`tpot_ms` is `None` for one token), so that you can put the two
# benchmarks side by side.
#
# <details><summary>Hint</summary>
#
# Write each guidellm number as vLLM's quantities would give it, then solve for those.
#
# </details>

# %%
def vllm_from_guidellm(itl_ms, tpot_ms, num_tokens):
    ### BEGIN SOLUTION
    e2el_ms = tpot_ms * num_tokens
    gaps_ms = itl_ms * (num_tokens - 1) if num_tokens > 1 else 0.0
    return {"ttft_ms": e2el_ms - gaps_ms, "tpot_ms": itl_ms if num_tokens > 1 else None, "e2el_ms": e2el_ms}
    ### END SOLUTION


# %%
ex.check_guidellm_names(vllm_from_guidellm)  # points: 1

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
# Which requests can count at all? For one that can, what are its three numbers, in the
# unit the SLOs use?
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
        if all(values[k] is None or 1e3 * values[k] <= limit for k, limit in slo_ms.items()):
            good += 1
    return good / duration_s
    ### END SOLUTION


# %%
ex.check_client_goodput(client_goodput)  # points: 1

# %% [markdown]
# ## 5. How far does mean ITL read above TPOT? Predict, then measure
#
# A server produces its tokens at a steady pace (the first one after the prefill, then one
# every few milliseconds) but sends them in chunks: a chunk whenever it holds
# `tokens_per_chunk` tokens, and what is left at the end. `vllm bench serve` reports the
# request's TPOT and, across its chunk gaps, its mean ITL. Write `itl_over_tpot(num_tokens,
# tokens_per_chunk)`: predict the ratio mean ITL / TPOT the client will report for a
# `num_tokens`-token request, or `None` when the client reports no ITL gap or no TPOT for
# it. Predict from the definitions (chapter 10, section 3); you may not call the client.
#
# The checker then **measures**: it builds such streams at two paces and lets the book's
# client compute both numbers. Your ratio must be within 0.5% of the measured one.
#
# <details><summary>Hint</summary>
#
# Both numbers divide the same stretch of time: which one, and by how many gaps each?
#
# </details>

# %%
def itl_over_tpot(num_tokens, tokens_per_chunk):
    ### BEGIN SOLUTION
    num_chunks = -(-num_tokens // tokens_per_chunk)
    if num_chunks < 2:
        return None
    return (num_tokens - 1) / (num_chunks - 1)
    ### END SOLUTION


# %%
ex.check_itl_over_tpot(itl_over_tpot)  # points: 2
for k in (1, 2, 4, 8):
    print(f"256 tokens in chunks of {k}: mean ITL reads {itl_over_tpot(256, k):.2f}x the TPOT")
