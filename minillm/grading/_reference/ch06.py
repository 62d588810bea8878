"""Chapter 6's reference answers (teacher only): the solutions of exercises/06_the_scheduler,
used by the hidden cases (minillm.grading._hidden.ch06) and the tests. The public checkers
never import this module: their expected values come from the engine."""
from __future__ import annotations

from ...chunk_sizing import prefill_work


def schedule_chunked(decoding, prefilling, chunk_size, token_budget):
    plan = [(request_id, 1) for request_id in decoding]
    prefill_left = chunk_size if token_budget is None else min(chunk_size, token_budget - len(decoding))
    for request_id, tokens_left in prefilling:
        if prefill_left <= 0:
            break
        num_tokens = min(tokens_left, prefill_left)
        plan.append((request_id, num_tokens))
        prefill_left -= num_tokens
    return plan


def stream_metrics(arrival_time, token_times):
    itl = [later - earlier for earlier, later in zip(token_times, token_times[1:])]
    tpot = (token_times[-1] - token_times[0]) / (len(token_times) - 1) if len(token_times) > 1 else None
    return {"ttft": token_times[0] - arrival_time, "tpot": tpot, "itl": itl}


def passes_to_first_token(policy, prompt_len, steps_left, chunk_size, token_budget):
    if policy == "prefill_first":
        return 1
    if policy == "decode_first":
        return max(steps_left, default=0) + 1
    steps, done = 0, 0
    while done < prompt_len:
        steps += 1
        share = chunk_size if token_budget is None else token_budget
        if policy == "chunked":
            share -= sum(1 for k in steps_left if k >= steps) if token_budget is not None else 0
        done += min(chunk_size, share)
    return steps


def chunks_for_work_budget(prompt_len, break_even, max_work, decode_contexts):
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


def schedule_decode_first(decoding, waiting, token_budget, max_num_seqs):
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


def predicted_stall(model, hardware, prompt_len, num_decoders, decoder_context):
    from ...sim.simulator import predict_step
    prompt_step_s = predict_step(model, [(prompt_len, 0)], hardware).total
    next_step = [(1, decoder_context)] * num_decoders + [(1, prompt_len)]      # the newcomer decodes too
    return prompt_step_s + predict_step(model, next_step, hardware).total

