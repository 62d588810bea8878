# %% [markdown]
# # Exercises 6: the scheduler
#
# Write each function, then run the check cell below it: it compares your function with
# the engine (its `Scheduler`, its `RequestMetrics`, its step loop, its simulator) and
# says what is wrong. None of these needs a model: they run in seconds. The last two tasks
# go past the chapter: write the `decode_first` policy's step, and predict the stall a
# prompt causes from the cost model, then let the simulator measure it.

# %%
import math

import minillm.grading as ex
from minillm.request import RequestMetrics
from minillm.sim.simulator import predict_step

# %% [markdown]
# ## 1. The chunked policy as a pure function
#
# Write one step of the `chunked` policy over a simplified state (plenty of KV blocks,
# no limit on the number of requests):
#
# * `decoding`: ids of the requests that are decoding, in order;
# * `prefilling`: `(request_id, tokens_left)` of the prompts still prefilling, in arrival
#   order (first come, first served);
# * `chunk_size`: the most prefill tokens the step may hold, all prompts together;
# * `token_budget`: the most tokens of any kind in the step, or `None` for no cap (when
#   set, it is at least `len(decoding)`).
#
# Return the plan, a list of `(request_id, num_tokens)`: every decode gets its one token
# first, then prompts in order take what the step has left, each no more than it needs.
# Leave out requests that get nothing. The checker tests the invariants (budget never
# exceeded, at most `chunk_size` prefill tokens, every decode gets its token, first come
# first served, nobody gets more than it needs) on random states, then compares your plan
# with what `Scheduler._schedule_chunked` decides on the same state. You may not call the
# engine's `Scheduler` (nor paste its method: it works on `Request` objects, not this state).
#
# <details><summary>Hint</summary>
#
# Who is served first, and what is left of the step for the prompts once they are? Two
# limits bound the prompts' share; then walk the prompts in order and ask how much each
# one can take.
#
# </details>

# %%
def schedule_chunked(decoding, prefilling, chunk_size, token_budget):
    ### BEGIN SOLUTION
    plan = [(request_id, 1) for request_id in decoding]
    prefill_left = chunk_size
    if token_budget is not None:
        prefill_left = min(prefill_left, token_budget - len(decoding))
    for request_id, tokens_left in prefilling:
        if prefill_left <= 0:
            break
        num_tokens = min(tokens_left, prefill_left)
        plan.append((request_id, num_tokens))
        prefill_left -= num_tokens
    return plan
    ### END SOLUTION

# %%
ex.check_schedule_chunked(schedule_chunked)  # points: 1
# The articles' example: three streams decoding, a 2048-token prompt, chunks of 512.
assert schedule_chunked([1, 2, 3], [(4, 2048)], 512, None) == [(1, 1), (2, 1), (3, 1), (4, 512)]

# %% [markdown]
# ## 2. TTFT, TPOT and ITL from timestamps
#
# `stream_metrics(arrival_time, token_times)` returns a dict with
# `"ttft"` (first token minus arrival), `"tpot"` ((E2E - TTFT) / (output tokens - 1), or
# `None` with a single token) and `"itl"` (the list of gaps between consecutive tokens),
# all in seconds, with the serving benchmarks' conventions that `RequestMetrics` follows
# (which you may not call).
# Then use it on a stream with one stall.
#
# <details><summary>Hint</summary>
#
# Which gaps does an ITL list hold, and is the wait for the first token one of them?
# TPOT is a mean over which gaps, and what is it when there are none?
#
# </details>

# %%
def stream_metrics(arrival_time, token_times):
    ### BEGIN SOLUTION
    itl = [later - earlier for earlier, later in zip(token_times, token_times[1:])]
    tpot = (token_times[-1] - token_times[0]) / (len(token_times) - 1) if len(token_times) > 1 else None
    return {"ttft": token_times[0] - arrival_time, "tpot": tpot, "itl": itl}
    ### END SOLUTION

# %%
ex.check_stream_metrics(stream_metrics)  # points: 1
# 41 tokens 5 ms apart, except one 205 ms stall: the articles' "TPOT jumps to 205 ms".
gaps = [0.005] * 20 + [0.205] + [0.005] * 19
times = [0.1 + sum(gaps[:i]) for i in range(len(gaps) + 1)]
stalled = stream_metrics(0.0, times)
print(f"mean TPOT {stalled['tpot'] * 1e3:.1f} ms, max ITL {max(stalled['itl']) * 1e3:.0f} ms")
assert stalled["tpot"] < 0.011 and max(stalled["itl"]) > 0.2

# %% [markdown]
# One 205 ms gap among 40 moves the mean TPOT from 5 ms to 10 ms; the max ITL shows the
# stall itself. That is why a benchmark reports both.
#
# ## 3. How many steps does a prompt need?
#
# `num_prefill_steps(prompt_len, chunk_size, num_decoding, token_budget)`: a prompt of
# `prompt_len` tokens arrives while `num_decoding` streams are decoding, under the
# `chunked` policy. How many engine steps from its arrival until its first token? (The
# streams keep decoding all along; `token_budget` is `None` or at least
# `num_decoding + 1`.) The checker runs the engine's step loop with a fake model and
# counts. You may not call the engine or its `Scheduler`.
#
# <details><summary>Hint</summary>
#
# Each step, what is left of the budget for the prompt once the decodes have taken theirs,
# and what does `chunk_size` cap it at? Then count whole steps, the last one partial.
#
# </details>

# %%
def num_prefill_steps(prompt_len, chunk_size, num_decoding, token_budget):
    ### BEGIN SOLUTION
    per_step = chunk_size if token_budget is None else min(chunk_size, token_budget - num_decoding)
    return math.ceil(prompt_len / per_step)
    ### END SOLUTION

# %%
ex.check_num_prefill_steps(num_prefill_steps)  # points: 1
# vLLM-style: one budget for everything. 64 streams and a 512-token budget leave 448
# prefill tokens per step, so an 8192-token prompt takes 19 steps, not 16.
assert num_prefill_steps(8192, 512, 64, 512) == 19

# %% [markdown]
# ## 4. Chunks of equal work
#
# With chunks of equal tokens the last chunk of a long prompt is the slowest step (its
# attention sees the whole prefix), and the decoding streams wait through it. Chapter 6
# (section 7) keeps the number of chunks but moves the boundaries so that every chunk has
# the same *work*. Count a token's work in query-key pairs: the token at position `p`
# (from 0, nothing cached) costs `break_even + p + 1`: its matmuls, worth `break_even`
# pairs, plus one pair per key it attends to, itself included. So the first `m` tokens
# cost `work(m) = m * break_even + m * (m + 1) / 2`.
#
# `equal_work_chunks(prompt_len, chunk_size, break_even)`: split the prompt into
# `num_chunks = ceil(prompt_len / chunk_size)` chunks; boundary `k` (for `k` from 1 to
# `num_chunks - 1`) is the **smallest** `m` with `work(m) * num_chunks >= k * work(prompt_len)`
# (integers: no rounding question), and the last chunk ends at `prompt_len`. Return the
# chunk sizes, a list of ints. The checker runs the engine's scheduler
# (`chunk_sizing="equal_work"`, KV blocks of one token so that no boundary is rounded to a
# block) and compares. You may not call `minillm.chunk_sizing` (it holds the answer).
#
# <details><summary>Hint</summary>
#
# Walk `m` up from the previous boundary until the inequality holds (a few thousand steps
# at most), or solve the quadratic `m^2 / 2 + m (break_even + 1/2) = k * total / num_chunks`
# and step `m` by one until the integer inequality holds.
#
# </details>

# %%
def equal_work_chunks(prompt_len, chunk_size, break_even):
    ### BEGIN SOLUTION
    def work(m):
        return m * break_even + m * (m + 1) // 2

    num_chunks = math.ceil(prompt_len / chunk_size)
    total = work(prompt_len)
    ends, m = [], 0
    for k in range(1, num_chunks):
        while work(m) * num_chunks < k * total:
            m += 1
        ends.append(m)
    ends.append(prompt_len)
    return [end - start for start, end in zip([0] + ends, ends)]
    ### END SOLUTION

# %%
ex.check_equal_work_chunks(equal_work_chunks)  # points: 2
# The `tiny` model's break-even length is 2944: a 2048-token prompt in 8 chunks of equal
# work starts with chunks longer than 256 tokens and ends with shorter ones.
sizes = equal_work_chunks(2048, 256, 2944)
print(sizes)
assert len(sizes) == 8 and sizes[0] > 256 > sizes[-1]

# %% [markdown]
# ## 5. The decode_first policy, from the chunked one
#
# Chapter 6 gives `decode_first` one sentence (a waiting prompt is admitted only when
# nothing is decoding) and the engine's dispatch (`Scheduler.schedule`); the steps it
# builds are yours to work out. Write one step of it over a simplified state (plenty of KV
# blocks), as you wrote the chunked one in task 1:
#
# * `decoding`: ids of the requests that are decoding, in order;
# * `waiting`: `(request_id, prompt_len)` of the prompts waiting, in arrival order;
# * `token_budget`: the most tokens of any kind in the step, or `None` for no cap;
# * `max_num_seqs`: the most requests that may run at once (decoding or admitted).
#
# The rules: while anything decodes, the step gives the decodes their one token each (no
# more decodes than `token_budget` allows) and admits nobody. When nothing decodes, it
# admits waiting prompts **whole** (no chunking), first come first served, as many as
# `token_budget` allows, but always at least one (a prompt longer than the budget would
# otherwise wait forever), and never more than `max_num_seqs`; admission stops at the
# first prompt that does not fit. Return the plan, a list of `(request_id, num_tokens)`.
# You may not call the engine's `Scheduler` (the checker asks it for you).
#
# <details><summary>Hint</summary>
#
# Two kinds of step, never mixed: which one is this? For the prompt step, what does the
# first prompt get whatever its length, and what stops the walk through the rest?
#
# </details>

# %%
def schedule_decode_first(decoding, waiting, token_budget, max_num_seqs):
    ### BEGIN SOLUTION
    if decoding:
        allowed = len(decoding) if token_budget is None else min(len(decoding), token_budget)
        return [(request_id, 1) for request_id in decoding[:allowed]]
    plan, used = [], 0
    for request_id, prompt_len in waiting:
        if len(plan) >= max_num_seqs or (plan and token_budget is not None and used + prompt_len > token_budget):
            break
        plan.append((request_id, prompt_len))
        used += prompt_len
    return plan
    ### END SOLUTION

# %%
ex.check_schedule_decode_first(schedule_decode_first)  # points: 3
# The interference scenario: while three streams decode, the 2048-token prompt waits.
assert schedule_decode_first([1, 2, 3], [(4, 2048)], None, 8) == [(1, 1), (2, 1), (3, 1)]
assert schedule_decode_first([], [(4, 2048)], 512, 8) == [(4, 2048)]

# %% [markdown]
# ## 6. The stall a prompt causes: predict, then measure
#
# Chapter 6 measured the stall: under `prefill_first` one long prompt stops every stream
# for a whole prefill. Now predict it before anything runs. `num_decoders` streams are
# decoding, each with `decoder_context` tokens in its KV cache, when a `prompt_len`-token
# prompt arrives; the policy is `prefill_first` (a step that has a waiting prompt runs it
# whole, and the running decodes wait). Write `predicted_stall(model, hardware, prompt_len,
# num_decoders, decoder_context)`: the worst gap, in seconds, between two tokens of a
# stream, from the cost model's step times `predict_step(model, step, hardware).total`
# (a step is a list of `(num_new_tokens, num_cached_tokens)`; a decode is `(1, context)`).
# You may call `predict_step`; not the simulator.
#
# The checker then **measures**: the simulator serves the same streams and prompt and
# reads the streams' max ITL. Your prediction must be within 2% of it.
#
# <details><summary>Hint</summary>
#
# A stream's gap runs from one of its tokens to the next. Which steps end between those two
# tokens, and what does each of them hold?
#
# </details>

# %%
def predicted_stall(model, hardware, prompt_len, num_decoders, decoder_context):
    ### BEGIN SOLUTION
    prompt_step_s = predict_step(model, [(prompt_len, 0)], hardware).total
    next_decode_s = predict_step(model, [(1, decoder_context)] * num_decoders, hardware).total
    return prompt_step_s + next_decode_s
    ### END SOLUTION

# %%
ex.check_predicted_stall(predicted_stall)  # points: 5
stall_s = predicted_stall("llama-3-8b", "A100-80GB", 2048, 4, 72)
decode_s = predict_step("llama-3-8b", [(1, 72)] * 4, "A100-80GB").total
print(f"a 2048-token prompt stalls 4 Llama-3-8B streams on an A100 for {stall_s * 1e3:.0f} ms, "
      f"{stall_s / decode_s:.0f}x their usual gap")
assert stall_s > 5 * decode_s
