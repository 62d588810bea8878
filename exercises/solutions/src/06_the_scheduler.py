# %% [markdown]
# # Exercises 6: the scheduler
#
# Six problems on chapter 6. Each check cell compares your function with the engine: its
# `Scheduler`, its step loop (run with a stand-in for the model, so nothing here needs a
# model), its `RequestMetrics`, its simulator. None of them hands you the rule: the
# chapter does. You repair a colleague's scheduler step, count the passes a newcomer
# waits under each policy, design chunks for a per-step work budget, write the
# `decode_first` step the chapter only describes, and predict a stall before the
# simulator measures it.

# %%
import minillm.grading as ex
from minillm.chunk_sizing import prefill_work
from minillm.sim.simulator import predict_step

# %% [markdown]
# ## 1. Repair a colleague's chunked step
#
# A colleague wrote one step of the `chunked` policy as a pure function over a simplified
# state (plenty of KV blocks, no limit on the number of requests):
#
# * `decoding`: ids of the requests that are decoding, in order;
# * `prefilling`: `(request_id, tokens_left)` of the prompts still to prefill, in arrival
#   order;
# * `chunk_size` and `token_budget` (`None`: no cap): the `SchedulerConfig` fields of the
#   same names; when set, the budget is at least `len(decoding)`.
#
# It returns the plan, a list of `(request_id, num_tokens)`. It gives the articles' example
# (three streams, a 2048-token prompt, chunks of 512) the right plan, but on other states
# the engine's `Scheduler` plans differently. Find what is wrong and write the corrected
# `schedule_chunked`. Running `ex.check_schedule_chunked(colleague_schedule_chunked)` shows
# the first state where it goes wrong, as a test would. You may not call the engine's
# `Scheduler`.

# %%
def colleague_schedule_chunked(decoding, prefilling, chunk_size, token_budget):
    plan = [(request_id, 1) for request_id in decoding]
    room = chunk_size if token_budget is None else min(chunk_size, token_budget)
    for request_id, tokens_left in sorted(prefilling, key=lambda prompt: prompt[1]):
        plan.append((request_id, min(tokens_left, room)))
        room -= min(tokens_left, room)
    return plan


assert colleague_schedule_chunked([1, 2, 3], [(4, 2048)], 512, None) == [(1, 1), (2, 1), (3, 1), (4, 512)]

# %% [markdown]
# <details><summary>Hint</summary>
#
# Read each line against chapter 6's description of `chunked` (section 2): who takes tokens
# from which limit, in which order are the prompts served, and what does a plan say about a
# request that gets nothing this step? The example above has no budget, one prompt and a
# step that never fills: try states that have each.
#
# </details>

# %%
def schedule_chunked(decoding, prefilling, chunk_size, token_budget):
    ### BEGIN SOLUTION
    plan = [(request_id, 1) for request_id in decoding]
    prefill_left = chunk_size if token_budget is None else min(chunk_size, token_budget - len(decoding))
    for request_id, tokens_left in prefilling:
        if prefill_left <= 0:
            break
        num_tokens = min(tokens_left, prefill_left)
        plan.append((request_id, num_tokens))
        prefill_left -= num_tokens
    return plan
    ### END SOLUTION

# %%
ex.check_schedule_chunked(schedule_chunked)  # points: 2
assert schedule_chunked([1, 2, 3], [(4, 2048)], 512, None) == [(1, 1), (2, 1), (3, 1), (4, 512)]

# %% [markdown]
# ## 2. TTFT, TPOT and ITL from timestamps
#
# `stream_metrics(arrival_time, token_times)` returns a dict with `"ttft"`, `"tpot"` (`None`
# with a single token) and `"itl"` (a list), in seconds, with the serving benchmarks'
# conventions that chapter 6 (section 4) states and `RequestMetrics` follows (you may not
# call it). Then use it on a stream with one stall.
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
# ## 3. How long does a newcomer wait, in passes?
#
# Streams are decoding when a `prompt_len`-token prompt arrives; stream `i` still has
# `steps_left[i]` tokens to produce (it leaves once it has produced them). Under `policy`
# (one of `"prefill_first"`, `"decode_first"`, `"chunked"`, `"chunked_prefill_first"`) with
# the given `chunk_size` and `token_budget` (`None`, or at least `len(steps_left) + 1`),
# how many engine steps run from the prompt's arrival to its first token, that step
# included? Write `passes_to_first_token(policy, prompt_len, steps_left, chunk_size,
# token_budget)`. Plenty of KV blocks; nothing else arrives; and no limit on the number of
# running requests (`max_num_seqs` is at least `len(steps_left) + 1`, so every stream and the
# prompt may run at once).
#
# Chapter 6 (section 6) counted passes for streams that all outlast the prompt. Here they
# need not: some finish while the prompt is still prefilling. The checker runs the engine's
# own step loop on the same arrival and counts. You may not call the engine or its
# `Scheduler`.
#
# <details><summary>Hint</summary>
#
# Take the policies one at a time and ask what a step holds while the prompt is in the
# queue, and what it holds once the prompt is being served. For the policies that split a
# prompt: which limit decides the prompt's share of a step, who else draws on that limit,
# and does that change from one step to the next? Then count, and be careful with the last
# chunk.
#
# </details>

# %%
def passes_to_first_token(policy, prompt_len, steps_left, chunk_size, token_budget):
    ### BEGIN SOLUTION
    if policy == "prefill_first":
        return 1
    if policy == "decode_first":
        return max(steps_left, default=0) + 1
    steps, done = 0, 0
    while done < prompt_len:
        steps += 1
        share = chunk_size if token_budget is None else token_budget
        if policy == "chunked" and token_budget is not None:
            share -= sum(1 for k in steps_left if k >= steps)          # the decodes still running
        done += min(chunk_size, share)
    return steps
    ### END SOLUTION

# %%
ex.check_passes_to_first_token(passes_to_first_token)  # points: 4
# vLLM-style, one budget for everything: 64 streams decoding when an 8192-token prompt arrives
# (no limit on running requests, as in the task: under a max_num_seqs of 64 the prompt would
# wait for a stream to leave).
for left in (5, 500):
    print(f"streams with {left} tokens to go: chunked {passes_to_first_token('chunked', 8192, [left] * 64, 512, 512)}"
          f" passes, decode_first {passes_to_first_token('decode_first', 8192, [left] * 64, 512, 512)}")

# %% [markdown]
# ## 4. Chunks for a work budget per step
#
# Chapter 6 (section 7) measured work in query-key pairs (`prefill_work(start, num_tokens,
# break_even)`: a token's matmuls count `break_even`, its attention one pair per key it
# sees) and kept the number of chunks while giving them equal work. Turn the question
# around, as Sarathi-Serve does with its token budget: the service sets the most work one
# step may do, `max_work`, because the step's time is the gap every stream waits through.
#
# A `prompt_len`-token prompt arrives (nothing of it cached) while one stream per entry of
# `decode_contexts` is decoding; stream `i` has `decode_contexts[i]` tokens cached when the
# prompt's first chunk runs, and every step of the prefill carries one decode of every
# stream. Write `chunks_for_work_budget(prompt_len, break_even, max_work, decode_contexts)`:
# the chunk sizes, in order, that prefill the prompt in as **few steps** as possible with
# **no step** doing more than `max_work`. You may call `prefill_work`; not the rest of
# `minillm.chunk_sizing` or the scheduler. The checker prices your steps with
# `prefill_work` and compares your step count with the fewest the engine's own
# `chunk_sizing` finds.
#
# <details><summary>Hint</summary>
#
# What does a step compute besides its chunk, and what is the work of that, in the same
# unit? Does it stay the same from step to step? Then: is there any reason to leave room
# unused in a step?
#
# </details>

# %%
def chunks_for_work_budget(prompt_len, break_even, max_work, decode_contexts):
    ### BEGIN SOLUTION
    sizes, start = [], 0
    while start < prompt_len:
        step = len(sizes)
        room = max_work - sum(prefill_work(c + step, 1, break_even) for c in decode_contexts)
        n = 1
        while start + n < prompt_len and prefill_work(start, n + 1, break_even) <= room:
            n += 1
        sizes.append(n)
        start += n
    return sizes
    ### END SOLUTION

# %%
ex.check_chunks_for_work_budget(chunks_for_work_budget)  # points: 3
# The `tiny` model (break-even 2944): a 2048-token prompt, 4 streams at 100 cached tokens,
# a budget of the work of 256 tokens after 1792 cached plus the decodes of that eighth step
# (each stream then has 107 tokens cached).
budget = prefill_work(1792, 256, 2944) + 4 * prefill_work(107, 1, 2944)
sizes = chunks_for_work_budget(2048, 2944, budget, [100] * 4)
print(f"{len(sizes)} steps: {sizes}")
assert len(sizes) < 8 and sizes[0] > sizes[-2]

# %% [markdown]
# Fewer than the 8 equal-token chunks of 256, and the early chunks are the long ones: the
# budget that the last 256-token chunk needs holds more tokens while the prefix is short.
#
# ## 5. The decode_first step the chapter only describes
#
# Chapter 6 gives `decode_first` one line in its list of policies (section 2), and
# `Scheduler.schedule` shows which of the scheduler's helpers it calls, and when; the steps
# it builds are yours to work out. Write one step of it over a simplified state (plenty of
# KV blocks), as in task 1:
#
# * `decoding`: ids of the requests that are decoding, in order;
# * `waiting`: `(request_id, prompt_len)` of the prompts waiting, in arrival order;
# * `token_budget`: the most tokens of any kind in the step, or `None` for no cap;
# * `max_num_seqs`: the most requests that may run at once.
#
# Return the plan, a list of `(request_id, num_tokens)`, as the engine's `Scheduler` under
# `policy="decode_first"` plans it. You may not call the engine's `Scheduler` (the checker
# asks it for you, and names the rule your plan breaks).
#
# <details><summary>Hint</summary>
#
# Two kinds of step, never mixed: which one is this? For the prompt step, read what the
# chapter says `prefill_first` does with waiting prompts; what happens to a prompt longer
# than the budget, and to a short one queued behind a prompt that does not fit?
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
ex.check_schedule_decode_first(schedule_decode_first)  # points: 2
# The interference scenario: while three streams decode, the 2048-token prompt waits.
assert schedule_decode_first([1, 2, 3], [(4, 2048)], None, 8) == [(1, 1), (2, 1), (3, 1)]

# %% [markdown]
# ## 6. The stall a prompt causes: predict, then measure
#
# Chapter 6 measured the stall: under `prefill_first` one long prompt stops every stream
# for a whole prefill. Now predict it before anything runs. `num_decoders` streams are
# decoding, each with `decoder_context` tokens in its KV cache, when a `prompt_len`-token
# prompt arrives; the policy is `prefill_first`, and the newcomer, once it has its first
# token, keeps generating like the streams. Write `predicted_stall(model, hardware,
# prompt_len, num_decoders, decoder_context)`: the worst gap, in seconds, between two
# tokens of a stream, from the cost model's step times `predict_step(model, step,
# hardware).total` (a step is a list of `(num_new_tokens, num_cached_tokens)`, one per
# request in it). You may call `predict_step`; not the simulator.
#
# The checker then **measures**: the simulator serves the same streams and prompt and
# reads the streams' max ITL. It prices its steps with the same cost model, so a right
# prediction is exact: yours must be within 0.1% of it.
#
# <details><summary>Hint</summary>
#
# A stream's gap runs from one of its tokens to the next. Which steps end between those two
# tokens, and what does each of them hold? Count every request in each of them.
#
# </details>

# %%
def predicted_stall(model, hardware, prompt_len, num_decoders, decoder_context):
    ### BEGIN SOLUTION
    prompt_step_s = predict_step(model, [(prompt_len, 0)], hardware).total
    # The next step: every stream's decode, and the newcomer's first decode over its whole prompt.
    next_step = [(1, decoder_context)] * num_decoders + [(1, prompt_len)]
    return prompt_step_s + predict_step(model, next_step, hardware).total
    ### END SOLUTION

# %%
ex.check_predicted_stall(predicted_stall)  # points: 4
stall_s = predicted_stall("llama-3-8b", "A100-80GB", 2048, 4, 72)
print(f"a 2048-token prompt stalls 4 Llama-3-8B streams on an A100 for {stall_s * 1e3:.0f} ms")
