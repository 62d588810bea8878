"""Checkers for exercises/06_the_scheduler: compare the learner's function with the engine.

The scheduler checks build the same state for the engine's real Scheduler
(requests decoding, prompts half prefilled, prompts waiting) and compare its
plan with the learner's; the step-count check runs EngineCore with a fake
executor, so nothing here needs a model or a clock.
"""
from __future__ import annotations

import math
import random

from ..chunk_sizing import prefill_work      # bound here: forbidding it in the module leaves this name
from ..request import RequestMetrics
from ._common import fail as _fail, grade_prediction, learner_call, passed, spy, call_text, checker
from ._reference import ch06 as _ref

_SCHEDULER = ("minillm.scheduler.Scheduler.schedule", "minillm.scheduler.Scheduler._schedule_chunked",
              "minillm.engine.EngineCore.step", "minillm.grading._reference.ch06.engine_schedule_chunked",
              "minillm.grading._reference.ch06.engine_num_prefill_steps",
              "minillm.grading._reference.ch06.engine_equal_work_chunks",
              "minillm.grading._reference.ch06.engine_schedule_decode_first",
              "minillm.scheduler.Scheduler._schedule_whole_prompts", "minillm.scheduler.Scheduler._schedule_decodes")
_CHUNK_SIZING = ("minillm.chunk_sizing.equal_work_chunks", "minillm.chunk_sizing.chunk_end",
                 "minillm.chunk_sizing.tokens_within", "minillm.chunk_sizing.prefill_work")
_METRICS = ("minillm.request.RequestMetrics.ttft", "minillm.request.RequestMetrics.tpot",
            "minillm.request.RequestMetrics.itl", "minillm.request.RequestMetrics.e2e",
            "minillm.metrics.summarize", "minillm.metrics.distribution")
_WHY = "work it out from the rules in the statement; the checker compares with the engine for you."

__all__ = ["check_schedule_chunked", "check_stream_metrics", "check_num_prefill_steps",
           "check_equal_work_chunks", "check_predicted_stall", "check_schedule_decode_first"]



# ---------------------------------------------------------------------------
# 1. The chunked policy as a pure function
# ---------------------------------------------------------------------------
def _random_state(rng: random.Random):
    num_decoding = rng.choice([0, rng.randint(1, 8), rng.randint(8, 40)])
    num_prefilling = rng.choice([0, 1, rng.randint(1, 6)])
    ids = rng.sample(range(1000), num_decoding + num_prefilling)
    decoding = ids[:num_decoding]
    prefilling = [(rid, rng.choice([1, rng.randint(1, 64), rng.randint(1, 3000)])) for rid in ids[num_decoding:]]
    chunk_size = rng.choice([1, 16, 64, 256, 512, rng.randint(1, 2048)])
    num_requests = max(1, num_decoding + num_prefilling)
    token_budget = rng.choice([None, num_requests, num_requests + rng.randint(0, 600), rng.randint(2048, 8192)])
    return decoding, prefilling, chunk_size, token_budget


def _check_plan_invariants(plan, decoding, prefilling, chunk_size, token_budget) -> str | None:
    """A message naming the first broken invariant, or None."""
    state = f"decoding={decoding}, prefilling={prefilling}, chunk_size={chunk_size}, token_budget={token_budget}"
    if not isinstance(plan, list) or not all(isinstance(p, tuple) and len(p) == 2 for p in plan):
        return f"return a list of (request_id, num_tokens) tuples; you returned {plan!r} for {state}"
    granted = {}
    for rid, n in plan:
        if rid in granted:
            return f"request {rid} appears twice in your plan {plan} for {state}"
        if not isinstance(n, int) or n < 1:
            return f"request {rid} gets {n!r} tokens: leave out requests that get nothing ({state})"
        granted[rid] = n
    known = set(decoding) | {rid for rid, _ in prefilling}
    strangers = set(granted) - known
    if strangers:
        return f"your plan schedules unknown request ids {sorted(strangers)} ({state})"
    decode_ids = set(decoding)
    kinds = [rid in decode_ids for rid, _ in plan]
    if True in kinds and False in kinds and kinds.index(False) < len(kinds) - 1 - kinds[::-1].index(True):
        return (f"your plan {plan} puts a prompt before a decode: every decode gets its 1 token first, "
                f"before any prompt, so the budget can never squeeze a decode out ({state})")
    total = sum(granted.values())
    if token_budget is not None and total > token_budget:
        return f"your plan {plan} holds {total} tokens, over token_budget={token_budget} ({state})"
    for rid in decoding:
        if granted.get(rid) != 1:
            return (f"decoding request {rid} gets {granted.get(rid, 0)} tokens; every decode gets exactly 1, "
                    f"first, before any prompt ({state})")
    prefill_tokens = sum(granted.get(rid, 0) for rid, _ in prefilling)
    if prefill_tokens > chunk_size:
        return f"your plan gives prompts {prefill_tokens} tokens in all, over chunk_size={chunk_size} ({state})"
    for rid, tokens_left in prefilling:
        if granted.get(rid, 0) > tokens_left:
            return f"prompt {rid} has {tokens_left} tokens left but gets {granted[rid]} ({state})"
    short = None
    for rid, tokens_left in prefilling:
        got = granted.get(rid, 0)
        if short is not None and got:
            return (f"prompt {rid} gets {got} tokens while prompt {short}, which came first, did not get all "
                    f"it needs: first come, first served ({state})")
        if got < tokens_left:
            short = rid if short is None else short
    return None


@checker
def check_schedule_chunked(fn, seed: int | None = None, num_states: int = 300):
    """fn(decoding, prefilling, chunk_size, token_budget) -> [(request_id, num_tokens)].

    Checked by the invariants on random states, then against the engine's
    Scheduler on the same states.
    """
    rng = random.Random(seed)
    # A few hand-picked states first: the ones that catch the usual slips.
    states = [([1, 2], [(3, 1000)], 512, None), ([1, 2, 3], [(4, 100), (5, 100)], 64, None),
              ([1, 2, 3, 4], [(5, 10), (6, 10)], 512, 12), ([], [(1, 5), (2, 7), (3, 9)], 10, None),
              ([7], [], 512, None)]
    states += [_random_state(rng) for _ in range(num_states)]
    for decoding, prefilling, chunk_size, token_budget in states:
        plan = learner_call(fn, list(decoding), list(prefilling), chunk_size, token_budget,
                            forbidden=_SCHEDULER, why=_WHY)
        problem = _check_plan_invariants(plan, decoding, prefilling, chunk_size, token_budget)
        if problem:
            _fail(problem)
        expected = _ref.engine_schedule_chunked(decoding, prefilling, chunk_size, token_budget, rng)
        if dict(plan) != expected:
            _fail(f"decoding={decoding}, prefilling={prefilling}, chunk_size={chunk_size}, "
                  f"token_budget={token_budget}: you plan {sorted(dict(plan).items())}, the engine's "
                  f"Scheduler plans {sorted(expected.items())}. Prompts should take as many tokens as the "
                  "step has left (min of chunk_size and the budget left after the decodes).")
    return passed(f"check_schedule_chunked: correct on {len(states)} states, same plans as the engine's Scheduler")


# ---------------------------------------------------------------------------
# 2. TTFT, TPOT and ITL from token timestamps
# ---------------------------------------------------------------------------
@checker
def check_stream_metrics(fn, seed: int | None = None):
    """fn(arrival_time, token_times) -> dict with "ttft", "tpot", "itl" (seconds).

    tpot is None for fewer than two tokens. Compared with RequestMetrics.
    """
    rng = random.Random(seed)
    cases = [(0.0, [0.5]), (1.0, [1.2, 1.25, 1.3, 2.3, 2.35])]   # one token; a stall
    for _ in range(50):
        arrival = rng.uniform(0, 10)
        t, times = arrival, []
        for _ in range(rng.randint(1, 40)):
            t += rng.expovariate(20) if rng.random() > 0.05 else rng.uniform(0.2, 1.0)
            times.append(t)
        cases.append((arrival, times))
    for arrival, times in cases:
        reference = RequestMetrics(arrival_time=arrival, first_token_time=times[0], token_times=list(times),
                                   finish_time=times[-1])
        expected = {"ttft": reference.ttft, "tpot": reference.tpot, "itl": reference.itl}
        got = learner_call(fn, arrival, list(times), forbidden=_METRICS, why=_WHY)
        if not isinstance(got, dict) or not {"ttft", "tpot", "itl"} <= set(got):
            _fail(f"return a dict with keys 'ttft', 'tpot' and 'itl'; you returned {got!r}")
        shown = f"arrival_time={arrival:.3f}, token_times={[round(x, 3) for x in times]}"
        if not math.isclose(got["ttft"], expected["ttft"], rel_tol=1e-9, abs_tol=1e-12):
            _fail(f"{shown}: ttft={got['ttft']!r}, expected {expected['ttft']:.6f} (first token - arrival)")
        if expected["tpot"] is None:
            if got["tpot"] is not None:
                _fail(f"{shown}: with one token there is no gap, so tpot must be None; you return {got['tpot']!r}")
        elif got["tpot"] is None or not math.isclose(got["tpot"], expected["tpot"], rel_tol=1e-9, abs_tol=1e-12):
            _fail(f"{shown}: tpot={got['tpot']!r}, expected {expected['tpot']:.6f}: (E2E - TTFT) / "
                  "(output tokens - 1), the mean gap AFTER the first token")
        itl = list(got["itl"])
        if len(itl) != len(expected["itl"]) or not all(
                math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) for a, b in zip(itl, expected["itl"])):
            _fail(f"{shown}: itl={itl!r}, expected {[round(x, 6) for x in expected['itl']]}: one gap per pair "
                  "of consecutive tokens (the wait for the first token is TTFT, not an ITL)")
    return passed(f"check_stream_metrics: correct on {len(cases)} streams, same as minillm.request.RequestMetrics")


# ---------------------------------------------------------------------------
# 3. How many steps does a prompt need?
# ---------------------------------------------------------------------------
@checker
def check_num_prefill_steps(fn, seed: int | None = None):
    """fn(prompt_len, chunk_size, num_decoding, token_budget) -> steps until the first token."""
    rng = random.Random(seed)
    cases = [(2048, 512, 4, None), (1024, 256, 0, None), (1000, 512, 4, 516), (1000, 512, 100, 300), (1, 64, 3, None)]
    for _ in range(12):
        num_decoding = rng.randint(0, 16)
        token_budget = rng.choice([None, num_decoding + rng.randint(1, 300)])
        cases.append((rng.randint(1, 1500), rng.choice([16, 64, 128, rng.randint(1, 700)]), num_decoding,
                      token_budget))
    for prompt_len, chunk_size, num_decoding, token_budget in cases:
        expected = _ref.engine_num_prefill_steps(prompt_len, chunk_size, num_decoding, token_budget)
        got = learner_call(fn, prompt_len, chunk_size, num_decoding, token_budget, forbidden=_SCHEDULER, why=_WHY)
        if got != expected:
            hint = ""
            if (isinstance(got, int) and token_budget is not None and num_decoding
                    and got == -(-prompt_len // min(chunk_size, token_budget))):
                hint = ("The decodes take num_decoding tokens of token_budget first: the prompt gets "
                        "min(chunk_size, token_budget - num_decoding) per step. ")
            elif isinstance(got, int) and got == expected - 1:
                hint = "One step short: the last, partial chunk needs a step of its own (round up). "
            _fail(f"{hint}prompt_len={prompt_len}, chunk_size={chunk_size}, {num_decoding} streams decoding, "
                  f"token_budget={token_budget}: you predict {got!r} steps, the engine took {expected}. "
                  "Each step the decodes take their tokens first; the prompt gets what is left, at most chunk_size.")
    return passed(f"check_num_prefill_steps: correct on {len(cases)} cases, same step counts as the engine")


# ---------------------------------------------------------------------------
# 4. Chunks of equal work
# ---------------------------------------------------------------------------
@checker
def check_equal_work_chunks(fn, seed: int | None = None):
    """fn(prompt_len, chunk_size, break_even) -> the chunk sizes of equal work."""
    rng = random.Random(seed)
    cases = [(2048, 256, 2944), (1024, 128, 2944), (1000, 256, 0), (100, 256, 500), (2048, 256, 10**9)]
    for _ in range(12):
        cases.append((rng.randint(1, 5000), rng.choice([16, 64, 256, rng.randint(4, 900)]),
                      rng.choice([0, rng.randint(1, 100), rng.randint(100, 30000)])))
    for prompt_len, chunk_size, break_even in cases:
        expected = _ref.engine_equal_work_chunks(prompt_len, chunk_size, break_even)
        got = learner_call(fn, prompt_len, chunk_size, break_even, forbidden=_SCHEDULER + _CHUNK_SIZING, why=_WHY)
        if got == expected:
            continue
        shown = f"prompt_len={prompt_len}, chunk_size={chunk_size}, break_even={break_even}"
        got_list = list(got) if isinstance(got, (list, tuple)) else None
        if got_list is None or not all(isinstance(x, int) for x in got_list):
            _fail(f"{shown}: return a list of chunk sizes (ints), got {got!r}")
        if sum(got_list) != prompt_len:
            _fail(f"{shown}: your chunks add up to {sum(got_list)} tokens, the prompt has {prompt_len}: "
                  "the chunks tile the prompt")
        if len(got_list) != len(expected):
            _fail(f"{shown}: {len(got_list)} chunks, the engine makes {len(expected)}: as many chunks as "
                  "chunk_size makes (ceil(prompt_len / chunk_size)), only their boundaries move")
        if len(set(got_list[:-1])) == 1 and len(set(expected)) > 1:
            _fail(f"{shown}: your chunks are {got_list[:3]}...: equal tokens is the fixed sizing; weigh each "
                  "token by its work, break_even + (its position + 1)")
        total = prefill_work(0, prompt_len, break_even)
        ends = [sum(got_list[:i + 1]) for i in range(len(got_list))]
        k = next(i for i, (a, b) in enumerate(zip(ends, [sum(expected[:i + 1]) for i in range(len(expected))]))
                 if a != b)
        engine_end = sum(expected[:k + 1])
        why = ("round up, not down" if ends[k] == engine_end - 1 else
               "check work(m) = m * break_even + m * (m + 1) // 2: the token at position p costs "
               "break_even + p + 1 (its own key included)")
        _fail(f"{shown}: chunk {k + 1} ends at token {ends[k]}, the engine's at {engine_end}: "
              f"boundary k is the FIRST token count m whose work reaches k/num_chunks of the total "
              f"({total} here), i.e. work(m) * num_chunks >= k * total: {why}")
    return passed(f"check_equal_work_chunks: correct on {len(cases)} prompts, the same chunks as the engine's "
                  "equal_work scheduler")


# ---------------------------------------------------------------------------
# 5. The stall a prompt causes: predict, then measure
# ---------------------------------------------------------------------------
STALL_TOLERANCE = 0.02
WARMUP = _ref.WARMUP_TOKENS       # the streams' tokens before the prompt arrives (a context is at least this + 1)
_SIMULATE = ("minillm.sim.simulator.simulate", "minillm.engine.EngineCore.step",
             "minillm.grading._reference.ch06.simulated_stall")


@checker
def check_predicted_stall(fn, seed: int | None = None, *, num_cases: int = 6):
    """fn(model, hardware, prompt_len, num_decoders, decoder_context) -> the streams' worst gap
    (seconds) under prefill_first, predicted with predict_step; graded against the simulator."""
    from ..sim.hardware import PROFILES
    from ..sim.simulator import predict_step
    rng = random.Random(seed)
    cases = [("llama-3-8b", "A100-80GB", 3000, 4, 72), ("qwen3-0.6b", "H100-SXM", 2000, 2, 200)]
    while len(cases) < num_cases:
        cases.append((rng.choice(["llama-3-8b", "llama-2-7b", "qwen3-0.6b"]), rng.choice(sorted(PROFILES)),
                      rng.randint(200, 4000), rng.randint(1, 16), rng.randint(WARMUP + 1, 400)))
    errors = []
    for model, hw, prompt_len, n, ctx in cases:
        measured = _ref.simulated_stall(model, hw, prompt_len, n, ctx)
        args = (model, hw, prompt_len, n, ctx)
        with spy(fn, "minillm.sim.simulator.predict_step") as calls:
            got = learner_call(fn, *args, forbidden=_SIMULATE, why="predict it with predict_step; the checker "
                               "simulates for you.")
        if not calls:
            _fail(f"{call_text(fn, *args)}: you never call predict_step. Price the steps the stream waits "
                  "through with the cost model; the checker measures them with the simulator")
        prefill_s = predict_step(model, [(prompt_len, 0)], hw).total
        decodes_s = predict_step(model, [(1, ctx)] * n, hw).total
        mixed_s = predict_step(model, [(prompt_len, 0)] + [(1, ctx)] * n, hw).total
        why = "a stream's gap runs from its token before the prompt's step to its next one"
        if isinstance(got, (int, float)) and not isinstance(got, bool):
            if math.isclose(got, prefill_s, rel_tol=1e-9):
                why = ("you price the prompt's step alone: the stream's next token comes at the end of the NEXT "
                       "step, a decode step, so the gap spans both")
            elif math.isclose(got, mixed_s, rel_tol=1e-9) or math.isclose(got, mixed_s + decodes_s, rel_tol=1e-9):
                why = ("under prefill_first the prompt runs whole and ALONE: the decodes wait for the next step, "
                       "they do not ride along")
        errors.append(grade_prediction(f"{call_text(fn, *args)} (the worst gap under prefill_first)", got, measured,
                                       STALL_TOLERANCE, why=why, unit=" s"))
    return passed(f"predicted_stall: {len(cases)} stalls predicted, worst error {max(errors):.2%} against the "
                  f"simulator (tolerance {STALL_TOLERANCE:.0%})")



# ---------------------------------------------------------------------------
# 6. The decode_first policy as a pure function
# ---------------------------------------------------------------------------
def _decode_first_state(rng: random.Random):
    decoding = rng.sample(range(100, 200), rng.choice([0, 0, rng.randint(1, 6), rng.randint(6, 30)]))
    waiting = [(rid, rng.choice([rng.randint(1, 64), rng.randint(64, 3000)]))
               for rid in rng.sample(range(300, 400), rng.randint(0, 6))]
    token_budget = rng.choice([None, rng.randint(1, 600), rng.randint(600, 4096), max(1, len(decoding) // 2)])
    return decoding, waiting, token_budget, rng.randint(max(1, len(decoding)), len(decoding) + 5)


def _decode_first_mistake(plan: dict, expected: dict, decoding, waiting, token_budget, max_num_seqs) -> str:
    waiting_ids = {rid for rid, _ in waiting}
    admitted = [rid for rid, _ in waiting if rid in plan]
    if decoding and admitted:
        return ("decode_first admits a prompt only when NOTHING is decoding: while streams decode, a step "
                "holds their tokens alone. ")
    lens = dict(waiting)
    if any(plan[rid] != lens[rid] for rid in admitted):
        return "decode_first does not chunk: an admitted prompt runs whole, all its tokens in one step. "
    if decoding and token_budget is not None and len(plan) > token_budget:
        return f"The decodes too stay within token_budget={token_budget}: the step holds at most that many tokens. "
    if not decoding and waiting and not admitted:
        return ("A step with no decodes admits at least one prompt, even one longer than token_budget "
                "(else it would wait forever). ")
    if admitted and admitted != [rid for rid, _ in waiting][:len(admitted)]:
        return ("First come, first served: admission stops at the first prompt that does not fit; a later, "
                "smaller one does not jump it. ")
    if len(admitted) > max_num_seqs:
        return f"At most max_num_seqs={max_num_seqs} requests run at once. "
    if set(plan) - set(decoding) - waiting_ids:
        return "Your plan schedules requests that are neither decoding nor waiting. "
    return ""


@checker
def check_schedule_decode_first(fn, seed: int | None = None, *, num_states: int = 300):
    """fn(decoding, waiting, token_budget, max_num_seqs) -> [(request_id, num_tokens)], compared with
    the engine's Scheduler under policy="decode_first"."""
    rng = random.Random(seed)
    states = [([1, 2, 3], [(4, 2048)], None, 8), ([], [(4, 2048), (5, 16)], None, 8),
              ([], [(4, 100), (5, 50), (6, 10)], 120, 8), ([], [(4, 500), (5, 50)], 120, 8),
              ([], [(4, 5), (5, 5), (6, 5)], None, 2), ([1, 2, 3, 4], [(5, 10)], 2, 8), ([], [], None, 4)]
    states += [_decode_first_state(rng) for _ in range(num_states)]
    for decoding, waiting, token_budget, max_num_seqs in states:
        expected = _ref.engine_schedule_decode_first(decoding, waiting, token_budget, max_num_seqs, rng)
        args = (list(decoding), list(waiting), token_budget, max_num_seqs)
        got = learner_call(fn, *args, forbidden=_SCHEDULER, why=_WHY)
        if not isinstance(got, list) or not all(isinstance(p, tuple) and len(p) == 2 for p in got):
            _fail(f"{call_text(fn, *args)} returned {got!r}: return a list of (request_id, num_tokens) tuples")
        plan = dict(got)
        if len(plan) != len(got) or any(n < 1 for n in plan.values()):
            _fail(f"{call_text(fn, *args)} returned {got!r}: each request at most once, and leave out requests "
                  "that get nothing")
        if plan != expected:
            _fail(f"{_decode_first_mistake(plan, expected, decoding, waiting, token_budget, max_num_seqs)}"
                  f"{call_text(fn, *args)} returned {sorted(plan.items())}, the engine's Scheduler plans "
                  f"{sorted(expected.items())}")
    return passed(f"check_schedule_decode_first: correct on {len(states)} states, same plans as the engine's "
                  "Scheduler")
