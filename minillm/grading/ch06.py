"""Checkers for exercises/06_the_scheduler: compare the learner's function with the engine.

The scheduler checks build the same state for the engine's real Scheduler
(requests decoding, prompts half prefilled, prompts waiting) and compare its
plan with the learner's; the step counts come from EngineCore with a
model-free executor (_engine_runs), the stall from the simulator, the fewest
steps under a work budget from the engine's own chunk_sizing.tokens_within.
Nothing here imports the reference answers (minillm.grading._reference).
"""
from __future__ import annotations

import math
import random

from ..chunk_sizing import prefill_work, tokens_within   # bound here: forbidding them in the module leaves these
from ..request import Request, RequestMetrics, RequestStatus, SamplingParams
from ..scheduler import Scheduler, SchedulerConfig
from ._common import fail as _fail, grade_prediction, learner_call, passed, spy, call_text, checker
from ._engine_runs import first_token_step, model_free_core, one_token, roomy_blocks
from ._units import units_hint

_HERE = "minillm.grading.ch06."
_SCHEDULER = ("minillm.scheduler.Scheduler.schedule", "minillm.scheduler.Scheduler._schedule_chunked",
              "minillm.engine.EngineCore.step", "minillm.scheduler.Scheduler._schedule_whole_prompts",
              "minillm.scheduler.Scheduler._schedule_decodes",
              *(_HERE + name for name in ("_engine_schedule_chunked", "_engine_passes_to_first_token",
                                          "_engine_schedule_decode_first", "_fewest_steps_within",
                                          "_simulated_stall")))
_CHUNK_SIZING = ("minillm.chunk_sizing.equal_work_chunks", "minillm.chunk_sizing.chunk_end",
                 "minillm.chunk_sizing.tokens_within", "minillm.chunk_sizing._tokens_for_work")
_METRICS = ("minillm.request.RequestMetrics.ttft", "minillm.request.RequestMetrics.tpot",
            "minillm.request.RequestMetrics.itl", "minillm.request.RequestMetrics.e2e",
            "minillm.metrics.summarize", "minillm.metrics.distribution")
_WHY = "work it out from the chapter; the checker asks the engine for you."

__all__ = ["check_schedule_chunked", "check_stream_metrics", "check_passes_to_first_token",
           "check_chunks_for_work_budget", "check_schedule_decode_first", "check_predicted_stall"]


# ---------------------------------------------------------------------------
# The engine, asked: one step of its Scheduler on a hand-built state
# ---------------------------------------------------------------------------
def _decoding_request(rid, params, rng: random.Random) -> Request:
    request = Request(rid, None, params, 0.0, prompt_len=rng.randint(1, 40))
    request.output_token_ids = [0] * rng.randint(1, 20)
    request.num_computed_tokens = request.num_tokens - 1
    return request


def _engine_schedule_chunked(decoding, prefilling, chunk_size, token_budget, rng=None) -> dict:
    """The engine's Scheduler (policy "chunked") on one step: decoding request ids, and
    (request_id, tokens_left) prompts in arrival order, the first ones already running
    (part-prefilled), the rest waiting, as in a live engine. {request_id: num_new_tokens}."""
    from ..kv_cache import BlockManager
    rng = rng or random.Random(0)
    num_requests = len(decoding) + len(prefilling)
    config = SchedulerConfig(policy="chunked", chunk_size=chunk_size, token_budget=token_budget,
                             max_num_seqs=max(1, num_requests))
    longest = max([tokens_left for _, tokens_left in prefilling] + [1]) + 64
    blocks = BlockManager(num_requests * (longest // 16 + 2) + 1, 16)
    scheduler = Scheduler(config, blocks)
    params = SamplingParams(max_tokens=10_000, ignore_eos=True)
    num_running_prompts = rng.randint(0, len(prefilling))
    running_decodes = [_decoding_request(rid, params, rng) for rid in decoding]
    running_prompts = []
    for i, (rid, tokens_left) in enumerate(prefilling):
        already_computed = rng.randint(1, 48) if i < num_running_prompts else 0
        request = Request(rid, None, params, 0.0, prompt_len=already_computed + tokens_left)
        request.num_computed_tokens = already_computed
        (running_prompts if i < num_running_prompts else scheduler.waiting).append(request)
    # Interleave decodes and part-prefilled prompts (keeping each group's order), as admissions over time would.
    while running_decodes or running_prompts:
        source = running_decodes if (running_decodes and (not running_prompts or rng.random() < 0.5)) \
            else running_prompts
        request = source.pop(0)
        request.status = RequestStatus.RUNNING
        blocks.allocate(request.request_id, request.num_computed_tokens)
        scheduler.running.append(request)
    return {r.request_id: n for r, n in scheduler.schedule().scheduled}


def _engine_schedule_decode_first(decoding, waiting, token_budget, max_num_seqs, rng=None) -> dict:
    """The engine's Scheduler (policy "decode_first") on one step. {request_id: num_new_tokens}."""
    from ..kv_cache import BlockManager
    rng = rng or random.Random(0)
    config = SchedulerConfig(policy="decode_first", token_budget=token_budget, max_num_seqs=max_num_seqs)
    longest = max([n for _, n in waiting] + [64]) + 64
    blocks = BlockManager((len(decoding) + len(waiting)) * (longest // 16 + 2) + 1, 16)
    scheduler = Scheduler(config, blocks)
    params = SamplingParams(max_tokens=10_000, ignore_eos=True)
    for rid in decoding:
        request = _decoding_request(rid, params, rng)
        request.status = RequestStatus.RUNNING
        blocks.allocate(rid, request.num_computed_tokens)
        scheduler.running.append(request)
    for rid, prompt_len in waiting:
        scheduler.waiting.append(Request(rid, None, params, 0.0, prompt_len=prompt_len))
    return {r.request_id: n for r, n in scheduler.schedule().scheduled}


# ---------------------------------------------------------------------------
# 1. The chunked policy as a pure function: repair a colleague's step
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
    """A message naming the first broken rule of stall-free batching, or None."""
    state = f"decoding={decoding}, prefilling={prefilling}, chunk_size={chunk_size}, token_budget={token_budget}"
    if not isinstance(plan, list) or not all(isinstance(p, tuple) and len(p) == 2 for p in plan):
        return f"return a list of (request_id, num_tokens) tuples; you returned {plan!r} for {state}"
    granted = {}
    for rid, n in plan:
        if rid in granted:
            return f"request {rid} appears twice in your plan {plan} for {state}"
        if not isinstance(n, int) or n < 1:
            return (f"request {rid} gets {n!r} tokens: a plan lists only requests that get tokens; leave out "
                    f"requests that get nothing ({state})")
        granted[rid] = n
    strangers = set(granted) - set(decoding) - {rid for rid, _ in prefilling}
    if strangers:
        return f"your plan schedules unknown request ids {sorted(strangers)} ({state})"
    decode_ids = set(decoding)
    kinds = [rid in decode_ids for rid, _ in plan]
    if True in kinds and False in kinds and kinds.index(False) < len(kinds) - 1 - kinds[::-1].index(True):
        return (f"your plan {plan} puts a prompt before a decode: every decode gets its 1 token first, "
                f"before any prompt, so the budget can never squeeze a decode out ({state})")
    total = sum(granted.values())
    for rid in decoding:
        if granted.get(rid) != 1:
            return (f"decoding request {rid} gets {granted.get(rid, 0)} tokens; every decode gets exactly 1, "
                    f"first, before any prompt ({state})")
    if token_budget is not None and total > token_budget:
        return (f"your plan {plan} holds {total} tokens, over token_budget={token_budget}: the decodes take "
                f"their {len(decoding)} tokens from the budget first, the prompts get what is left ({state})")
    prefill_tokens = sum(granted.get(rid, 0) for rid, _ in prefilling)
    if prefill_tokens > chunk_size:
        return (f"your plan gives prompts {prefill_tokens} tokens in all, over chunk_size={chunk_size}: "
                f"chunk_size bounds the step's prefill tokens, all prompts together ({state})")
    for rid, tokens_left in prefilling:
        if granted.get(rid, 0) > tokens_left:
            return f"prompt {rid} has {tokens_left} tokens left but gets {granted[rid]} ({state})"
    short = None
    for rid, tokens_left in prefilling:
        got = granted.get(rid, 0)
        if short is not None and got:
            return (f"prompt {rid} gets {got} tokens while prompt {short}, which came first, did not get all "
                    f"it needs: first come, first served; a prompt that does not fit takes what is left and "
                    f"goes on next step ({state})")
        if got < tokens_left:
            short = rid if short is None else short
    return None


@checker
def check_schedule_chunked(fn, seed: int | None = None, num_states: int = 300):
    """fn(decoding, prefilling, chunk_size, token_budget) -> [(request_id, num_tokens)].

    Checked by the rules of stall-free batching on random states, then against the
    engine's Scheduler on the same states.
    """
    rng = random.Random(seed)
    # A few hand-picked states first: the ones that catch the usual slips.
    states = [([1, 2], [(3, 1000)], 512, None), ([1, 2, 3], [(4, 100), (5, 100)], 64, None),
              ([1, 2, 3, 4], [(5, 10), (6, 10)], 512, 12), ([], [(1, 5), (2, 7), (3, 9)], 10, None),
              ([], [(1, 30), (2, 5)], 20, None), ([7], [], 512, None)]
    states += [_random_state(rng) for _ in range(num_states)]
    for decoding, prefilling, chunk_size, token_budget in states:
        expected = _engine_schedule_chunked(decoding, prefilling, chunk_size, token_budget, rng)
        plan = learner_call(fn, list(decoding), list(prefilling), chunk_size, token_budget,
                            forbidden=_SCHEDULER, why=_WHY)
        problem = _check_plan_invariants(plan, decoding, prefilling, chunk_size, token_budget)
        if problem:
            _fail(problem)
        if dict(plan) != expected:
            _fail(f"decoding={decoding}, prefilling={prefilling}, chunk_size={chunk_size}, "
                  f"token_budget={token_budget}: you plan {sorted(dict(plan).items())}, the engine's "
                  f"Scheduler plans {sorted(expected.items())}. Prompts should take as many tokens as the "
                  "step has left: the decodes' tokens come off the budget, chunk_size caps the prompts.")
    return passed(f"check_schedule_chunked: correct on {len(states)} states, same plans as the engine's Scheduler")


# ---------------------------------------------------------------------------
# 2. TTFT, TPOT and ITL from token timestamps
# ---------------------------------------------------------------------------
def _tpot_mistake(got, arrival: float, times: list) -> str:
    """Name the usual wrong TPOTs (the variants are computed here; the expected one comes from the engine)."""
    n, e2e = len(times), times[-1] - arrival
    variants = {
        "you divide the whole E2E latency by the n tokens (guidellm's TPOT): TPOT leaves out the wait for the "
        "first token and divides by the n - 1 gaps after it": e2e / n,
        "you divide the E2E latency by n - 1: the wait for the first token (TTFT) is not a gap between tokens, "
        "leave it out": e2e / (n - 1),
        "you divide the time after the first token by n: n tokens have n - 1 gaps between them": (e2e - (times[0]
                                                                                                        - arrival)) / n,
    }
    return next((why for why, value in variants.items()
                 if isinstance(got, (int, float)) and math.isclose(got, value, rel_tol=1e-9)), "")


@checker
def check_stream_metrics(fn, seed: int | None = None):
    """fn(arrival_time, token_times) -> dict with "ttft", "tpot", "itl" (seconds).

    tpot is None for fewer than two tokens. Compared with RequestMetrics.
    """
    rng = random.Random(seed)
    cases = [(1.0, [1.2, 1.25, 1.3, 2.3, 2.35]), (0.0, [0.5])]   # a stall first (it shows a wrong TPOT); one token
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
            _fail(f"{units_hint(got['ttft'], expected['ttft'])}{shown}: ttft={got['ttft']!r}, expected "
                  f"{expected['ttft']:.6f} (first token - arrival)")
        if expected["tpot"] is None:
            if got["tpot"] is not None:
                _fail(f"{shown}: with one token there is no gap, so tpot must be None; you return {got['tpot']!r}")
        elif got["tpot"] is None or not math.isclose(got["tpot"], expected["tpot"], rel_tol=1e-9, abs_tol=1e-12):
            why = units_hint(got["tpot"], expected["tpot"]) or _tpot_mistake(got["tpot"], arrival, times)
            _fail(f"{shown}: tpot={got['tpot']!r}, expected {expected['tpot']:.6f}: "
                  f"{why or '(E2E - TTFT) / (output tokens - 1), the mean gap AFTER the first token'}")
        itl = list(got["itl"])
        if len(itl) != len(expected["itl"]) or not all(
                math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) for a, b in zip(itl, expected["itl"])):
            why = units_hint(itl[-1], expected["itl"][-1]) if len(itl) == len(expected["itl"]) and itl else ""
            _fail(f"{why}{shown}: itl={itl!r}, expected {[round(x, 6) for x in expected['itl']]}: one gap per pair "
                  "of consecutive tokens (the wait for the first token is TTFT, not an ITL)")
    return passed(f"check_stream_metrics: correct on {len(cases)} streams, same as minillm.request.RequestMetrics")


# ---------------------------------------------------------------------------
# 3. Passes before the newcomer's first token, under each policy
# ---------------------------------------------------------------------------
POLICIES = ("prefill_first", "decode_first", "chunked", "chunked_prefill_first")


def _engine_passes_to_first_token(policy, prompt_len, steps_left, chunk_size, token_budget) -> int:
    """Run the engine (model-free): streams decoding, each with steps_left[i] tokens to go,
    then the prompt arrives; the steps from its arrival to its first token."""
    n = len(steps_left)
    config = SchedulerConfig(policy=policy, chunk_size=chunk_size, token_budget=token_budget, max_num_seqs=n + 1)
    core = model_free_core(config, roomy_blocks(prompt_len + sum(steps_left) + 64 * (n + 1)))
    streams = [core.add_request(None, SamplingParams(max_tokens=1 + k, ignore_eos=True), prompt_len=1)
               for k in steps_left]
    first_token_step(core, streams)                 # every stream is decoding: its first token is out
    rid = core.add_request(None, one_token(), prompt_len=prompt_len)
    return first_token_step(core, [rid])[rid]


def _active_decodes(steps_left, step: int) -> int:
    """Streams still decoding in the prompt's step `step` (from 1): a stream with k tokens to go
    decodes in steps 1..k and has left by step k + 1."""
    return sum(1 for k in steps_left if k >= step)


def _fractional_steps(prompt_len, share_at_step) -> float:
    """Steps to prefill the prompt when step s gives it share_at_step(s) tokens, the last, partial
    chunk counted as the fraction of a step it fills (rounding it is the slip to name)."""
    done, step = 0, 0
    while True:
        share = max(1, share_at_step(step + 1))
        if done + share >= prompt_len:
            return step + (prompt_len - done) / share
        done, step = done + share, step + 1


def _rounding_mistake(got, expected, steps: float) -> str:
    """The three ways to round a step count wrong, each named (where rounding down and to the
    nearest step give the same number, the message names both)."""
    whole = steps == int(steps)
    if whole and got == int(steps) + 1:
        return ("One step too many: here the last chunk is exactly full, and no extra step follows "
                "(`tokens // share + 1` over-counts whenever the share divides the prompt; round up instead). ")
    if not whole and got == math.floor(steps):
        if got == round(steps):
            return (f"One step short: the last chunk fills {steps - math.floor(steps):.2f} of a step and still "
                    "takes a whole one: round up, not down, nor to the nearest step. ")
        return ("One step short: you round down, but the prompt's last, partial chunk still needs a step of "
                "its own (round up). ")
    if got == round(steps) != expected:
        return "Rounded to the nearest step: a partial last chunk takes a whole step, however small (round up). "
    return ""


def _passes_mistake(got, expected, policy, prompt_len, steps_left, chunk_size, token_budget) -> str:
    """Name the usual slip behind a wrong count: the wrong variants are computed here, not the answer."""
    if not isinstance(got, int) or isinstance(got, bool):
        return "Return a whole number of steps. "
    budget, n = token_budget, len(steps_left)
    if policy == "prefill_first":
        return ("Under prefill_first a waiting prompt runs whole in the very next step (the decodes wait, and "
                "a budget smaller than the prompt still admits it: at least one). ")
    if policy == "decode_first":
        if len(set(steps_left)) > 1 and got == min(steps_left) + 1:
            return ("decode_first admits a prompt only when NOTHING decodes: it waits for the stream with the "
                    "most steps left, not the first to finish. ")
        if n and got == max(steps_left):
            return "After the last stream finishes, the prompt's own prefill still takes a step of its own. "
        if got == math.ceil(prompt_len / chunk_size) + max(steps_left, default=0):
            return "decode_first does not chunk: the prompt waits for the streams, then runs whole, in one step. "
        return ""
    if policy == "chunked_prefill_first":
        if budget is not None and n and got == math.ceil(_fractional_steps(
                prompt_len, lambda s: min(chunk_size, budget - _active_decodes(steps_left, s)))):
            return ("chunked_prefill_first's prompt steps carry no decodes (SGLang's default: a step is "
                    "prefill-only or decode-only), so nothing comes off the budget before the prompt's share. ")
        if budget is not None and budget < chunk_size and got == math.ceil(prompt_len / chunk_size):
            return (f"token_budget={budget} bounds a prompt step too: with a budget below chunk_size={chunk_size}, "
                    "the budget, not the chunk, caps the prompt's share. ")
        share = chunk_size if budget is None else min(chunk_size, budget)
        return _rounding_mistake(got, expected, _fractional_steps(prompt_len, share_at_step=lambda s: share))
    # chunked: every running decode first, the prompt gets the rest, at most chunk_size
    if budget is not None and n and got in (math.ceil(prompt_len / min(chunk_size, budget)),
                                            math.ceil(prompt_len / chunk_size)):
        return ("token_budget bounds the whole step, and the decodes take their tokens from token_budget first: "
                "the prompt gets what the budget has left after them, at most chunk_size. ")
    if budget is not None and n and got == math.ceil(prompt_len / max(1, min(chunk_size, budget - n))):
        return (f"The streams finish while the prompt prefills (one has {min(steps_left)} tokens to go): a "
                "stream that has produced its last token leaves, and its share of the budget goes to the "
                "prompt. ")
    if n and got == max(steps_left) + 1 and got != expected:
        return "That is decode_first's count: under chunked the prompt does not wait for the streams. "
    if budget is not None and n:
        for shift, why in ((1, "early"), (-1, "late")):
            leaving = math.ceil(_fractional_steps(
                prompt_len, lambda s: min(chunk_size, budget - _active_decodes(steps_left, s + shift))))
            if got == leaving != expected:
                return (f"Off by one on when a stream leaves (yours leave a step {why}): a stream with k tokens to "
                        "go decodes in the prompt's steps 1 to k, so it holds its token of the budget through "
                        "step k and frees it from step k + 1. ")
    share = (lambda s: chunk_size) if budget is None else \
        (lambda s: min(chunk_size, budget - _active_decodes(steps_left, s)))
    return _rounding_mistake(got, expected, _fractional_steps(prompt_len, share))


@checker
def check_passes_to_first_token(fn, seed: int | None = None, *, num_cases: int = 40):
    """fn(policy, prompt_len, steps_left, chunk_size, token_budget) -> engine steps from the prompt's
    arrival to its first token, counted by running the engine's loop (model-free)."""
    rng = random.Random(seed)
    # Hand-picked first: a prompt that fills its last chunk exactly, one whose last chunk is nearly
    # full, one whose last chunk is small (the three rounding slips show in that order), budgets.
    cases = [("chunked", 2048, [40, 40, 40, 40], 512, None), ("chunked", 2000, [40, 40, 40, 40], 512, None),
             ("chunked", 1100, [50] * 4, 512, None), ("chunked", 1000, [50] * 4, 256, 260),
             ("chunked", 1024, [3, 60, 60, 60], 512, 260), ("chunked", 1000, [100] * 8, 512, 100),
             ("chunked_prefill_first", 1000, [5, 9], 256, 200), ("decode_first", 300, [4, 12, 7], 64, None),
             ("prefill_first", 4000, [30, 2], 128, 512), ("chunked", 1024, [90] * 4, 256, 260),
             ("chunked", 100, [], 64, None), ("chunked_prefill_first", 768, [3], 256, None),
             ("chunked", 34, [3, 3, 9, 9], 64, 6)]      # a tight budget: when a stream leaves decides the count
    while len(cases) < num_cases:
        n = rng.randint(0, 8)
        chunk_size = rng.choice([16, 64, 128, 256, rng.randint(n + 1, 600)])
        cases.append((rng.choice(POLICIES), rng.randint(1, 3000), [rng.randint(1, 40) for _ in range(n)],
                      chunk_size, rng.choice([None, n + 1 + rng.randint(0, 400), n + 1 + rng.randint(0, 30)])))
    for policy, prompt_len, steps_left, chunk_size, token_budget in cases:
        expected = _engine_passes_to_first_token(policy, prompt_len, steps_left, chunk_size, token_budget)
        args = (policy, prompt_len, list(steps_left), chunk_size, token_budget)
        got = learner_call(fn, *args, forbidden=_SCHEDULER, why=_WHY)
        if got != expected:
            hint = _passes_mistake(got, expected, policy, prompt_len, steps_left, chunk_size, token_budget)
            _fail(f"{hint}{call_text(fn, *args)} returned {got!r}; the engine took {expected} steps from the "
                  f"prompt's arrival to its first token")
    return passed(f"check_passes_to_first_token: {len(cases)} arrivals under the four policies, the same step "
                  "counts as the engine")


# ---------------------------------------------------------------------------
# 4. Chunks within a work budget per step (design under a constraint)
# ---------------------------------------------------------------------------
def _decode_work(decode_contexts, step: int, break_even: int, grows: bool = True) -> int:
    """Work of the streams' decodes in the prefill's step `step` (from 0): each a chunk of one token."""
    return sum(prefill_work(c + (step if grows else 0), 1, break_even) for c in decode_contexts)


def _fewest_steps_within(prompt_len, break_even, max_work, decode_contexts, decode_work=None) -> list[int] | None:
    """The engine's tokens_within, step after step: the most tokens that fit each step's
    budget left after the decodes; None if a step cannot hold even one prompt token.
    decode_work(contexts, step, break_even) prices the decodes (a slip's pricing, to name it)."""
    decode_work = decode_work or _decode_work
    sizes, start = [], 0
    while start < prompt_len:
        room = max_work - decode_work(decode_contexts, len(sizes), break_even)
        n = min(tokens_within(start, room, break_even), prompt_len - start)
        if room < 0 or prefill_work(start, n, break_even) > room:
            return None
        sizes.append(n)
        start += n
    return sizes


def _work_cases(rng: random.Random, num_cases: int):
    cases = [(2048, 2944, 600_000 + 4 * (2944 + 101), [100, 100, 100, 100]),     # tiny's break-even, 4 streams
             (400, 0, 5191, [10, 10, 10, 10]),                                  # a decode's own key decides step 0
             (1000, 0, 60_000, []),                                            # attention only, nothing decoding
             (3000, 26_624, 20_000_000, [500, 20, 3000]),                     # llama-3-8b's break-even
             (1943, 0, 457_252, [36, 114, 37, 332, 155, 180])]                # one key more per decode per step counts
    while len(cases) < num_cases:
        prompt_len = rng.randint(64, 4000)
        break_even = rng.choice([0, 2944, 26_624, rng.randint(1, 5000), rng.randint(5000, 40_000)])
        contexts = [rng.randint(1, 2000) for _ in range(rng.randint(0, 8))]
        target_steps = rng.randint(2, 16)
        last = -(-prompt_len // target_steps)
        max_work = _decode_work(contexts, target_steps, break_even) + prefill_work(prompt_len - last, last, break_even)
        max_work = int(max_work * rng.uniform(1.0, 1.3))
        if _fewest_steps_within(prompt_len, break_even, max_work, contexts) is not None:
            cases.append((prompt_len, break_even, max_work, contexts))
    return cases


_DECODE_SLIPS = {   # a wrong price for the streams' decodes: the greedy chunks it leads to name it
    "The streams' decodes are missing: every step carries one token per stream, a chunk of one token over its "
    "context, and its work counts against max_work too. ": lambda ctx, k, be: 0,
    "Each stream's cache grows by one token per step, so its decode costs one key more every step: price the "
    "decodes of step k at their context then. ": lambda ctx, k, be: _decode_work(ctx, k, be, grows=False),
    "A decode sees its own key too: a token with c tokens cached before it attends to c + 1 keys (a chunk of "
    "one token over its context). ": lambda ctx, k, be: _decode_work(ctx, k, be) - len(ctx),
    "A decode attends too: besides its matmuls (break_even) it does one pair per key it sees, its context and "
    "itself. ": lambda ctx, k, be: be * len(ctx),
    "A decode runs the matmuls too: break_even per token, besides one pair per key it sees. ":
        lambda ctx, k, be: _decode_work(ctx, k, be) - be * len(ctx),
}


def _over_budget_mistake(sizes, k, start, prompt_len, break_even, max_work, contexts, answered=()) -> str:
    """Name the slip behind a step over the budget: the wrong decode price that gives these chunks
    AND the learner's chunks on every case answered before (two slips can agree on one case)."""
    history = [*answered, ((prompt_len, break_even, max_work, contexts), sizes)]
    for why, decode_work in _DECODE_SLIPS.items():
        if contexts and all(list(got) == _fewest_steps_within(*case, decode_work) for case, got in history):
            return why
    chunk = prefill_work(start, sizes[k], break_even)
    if chunk <= max_work and contexts:
        if chunk + _decode_work(contexts, k, break_even, grows=False) <= max_work:
            return ("Each stream's cache grows by one token per step, so its decode costs one key more every "
                    "step: price the decodes of step k at their context then. ")
        return ("Every step also carries the streams' decodes, one token each: a decode is a chunk of one "
                "token over its context, and its work counts against max_work too. ")
    if sizes[k] * break_even <= max_work - _decode_work(contexts, k, break_even):
        return ("A chunk's attention grows with where it starts: the same number of tokens costs more "
                "late in the prompt (chapter 6, section 7). ")
    return ""


@checker
def check_chunks_for_work_budget(fn, seed: int | None = None, *, num_cases: int = 12):
    """fn(prompt_len, break_even, max_work, decode_contexts) -> chunk sizes: as few steps as possible,
    no step (the chunk and every stream's decode) over max_work; graded with the engine's prefill_work
    and tokens_within."""
    rng = random.Random(seed)
    cases = _work_cases(rng, num_cases)
    answered = []                 # (case, the learner's chunks): what a slip must also reproduce
    for prompt_len, break_even, max_work, contexts in cases:
        fewest = _fewest_steps_within(prompt_len, break_even, max_work, contexts)
        args = (prompt_len, break_even, max_work, list(contexts))
        got = learner_call(fn, *args, forbidden=_SCHEDULER + _CHUNK_SIZING, why=_WHY)
        call = call_text(fn, *args)
        if not isinstance(got, (list, tuple)) or not all(isinstance(n, int) and not isinstance(n, bool)
                                                          for n in got):
            _fail(f"{call} returned {got!r}: return the chunk sizes, a list of ints")
        sizes = list(got)
        if any(n < 1 for n in sizes):
            _fail(f"{call} returned {sizes[:8]}...: a chunk of {min(sizes)} tokens; every step takes at least "
                  "one prompt token")
        if sum(sizes) != prompt_len:
            _fail(f"{call}: your chunks add up to {sum(sizes)} tokens, the prompt has {prompt_len}: the chunks "
                  "tile the prompt")
        start = 0
        for k, n in enumerate(sizes):
            work = prefill_work(start, n, break_even) + _decode_work(contexts, k, break_even)
            if work > max_work:
                why = _over_budget_mistake(sizes, k, start, prompt_len, break_even, max_work, contexts, answered)
                _fail(f"{why}{call}: step {k} (tokens {start}-{start + n - 1} and {len(contexts)} decodes) "
                      f"does {work:,} units of work, over max_work={max_work:,}")
            start += n
        if len(sizes) > len(fewest):
            why = ("A step can take more tokens: take the most that fit in each one. ")
            if len(set(sizes[:-1])) == 1 and len(sizes) > 2:
                why = ("Equal chunks sized for the slowest step leave room in the early ones: early tokens see "
                       "fewer keys and cost less, so early chunks can be longer. ")
            _fail(f"{why}{call}: your {len(sizes)} steps {sizes[:6]}{'...' if len(sizes) > 6 else ''} stay "
                  f"within the budget, but {len(fewest)} steps suffice")
        answered.append(((prompt_len, break_even, max_work, list(contexts)), sizes))
    return passed(f"check_chunks_for_work_budget: {len(cases)} prompts in the fewest steps the budget allows, "
                  "every step within it")


# ---------------------------------------------------------------------------
# 5. The decode_first policy as a pure function
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
        expected = _engine_schedule_decode_first(decoding, waiting, token_budget, max_num_seqs, rng)
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


# ---------------------------------------------------------------------------
# 6. The stall a prompt causes: predict, then measure
# ---------------------------------------------------------------------------
STALL_TOLERANCE = 0.001      # the simulator prices its steps with the same cost model: a right prediction is exact
WARMUP = 4          # the streams' tokens before the prompt arrives (a context is at least this + 1)
NEWCOMER_TOKENS = 16         # the prompt keeps generating: its decodes ride in the streams' steps
_SIMULATE = ("minillm.sim.simulator.simulate", "minillm.engine.EngineCore.step", _HERE + "_simulated_stall")


def _simulated_stall(model, hardware, prompt_len: int, num_decoders: int, decoder_context: int) -> float:
    """The worst gap (max ITL) the streams see when the long prompt arrives under prefill_first,
    measured by the simulator: num_decoders streams with decoder_context tokens cached each; the
    prompt then generates NEWCOMER_TOKENS tokens, as the streams do."""
    from ..sim.simulator import simulate
    from ..sim.workloads import long_prompt_interference
    workload = long_prompt_interference(prompt_len=prompt_len, num_decoders=num_decoders, warmup_tokens=WARMUP,
                                        decoder_prompt_len=decoder_context - WARMUP + 1,
                                        long_output_len=NEWCOMER_TOKENS)
    res = simulate(workload, SchedulerConfig(policy="prefill_first"), model=model, hardware=hardware)
    return res.summary()["decoder_itl_max_s"]


def _stall_mistake(got, model, hw, prompt_len, n, ctx) -> str:
    """The usual ways to price the stall wrong, each named (wrong variants, not the answer)."""
    from ..sim.simulator import predict_step
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        return ""
    price = lambda step: predict_step(model, step, hw).total
    prefill_s, decodes_s = price([(prompt_len, 0)]), price([(1, ctx)] * n)
    variants = {
        "you price the prompt's step alone: the stream's next token comes at the end of the NEXT step, a decode "
        "step, so the gap spans both": [prefill_s],
        "under prefill_first the prompt runs whole and ALONE: the decodes wait for the next step, they do not "
        "ride along": [price([(prompt_len, 0)] + [(1, ctx)] * n), price([(prompt_len, 0)] + [(1, ctx)] * n)
                       + decodes_s],
        "the newcomer decodes too: its first token came out of its prefill, and in the very next step it decodes "
        "beside the streams, over its whole prompt": [prefill_s + decodes_s],
    }
    return next((why for why, values in variants.items()
                 if any(math.isclose(got, v, rel_tol=1e-9) for v in values)), "")


@checker
def check_predicted_stall(fn, seed: int | None = None, *, num_cases: int = 6):
    """fn(model, hardware, prompt_len, num_decoders, decoder_context) -> the streams' worst gap
    (seconds) under prefill_first, predicted with predict_step; graded against the simulator."""
    from ..sim.hardware import PROFILES
    rng = random.Random(seed)
    # Hand-picked first: a small model, where the newcomer's own decode weighs most in the next step.
    cases = [("qwen3-0.6b", "H100-SXM", 2000, 2, 200), ("llama-3-8b", "A100-80GB", 3000, 4, 72)]
    while len(cases) < num_cases:
        cases.append((rng.choice(["llama-3-8b", "llama-2-7b", "qwen3-0.6b"]), rng.choice(sorted(PROFILES)),
                      rng.randint(200, 4000), rng.randint(1, 16), rng.randint(WARMUP + 1, 400)))
    errors = []
    for model, hw, prompt_len, n, ctx in cases:
        measured = _simulated_stall(model, hw, prompt_len, n, ctx)
        args = (model, hw, prompt_len, n, ctx)
        with spy(fn, "minillm.sim.simulator.predict_step") as calls:
            got = learner_call(fn, *args, forbidden=_SIMULATE, why="predict it with predict_step; the checker "
                               "simulates for you.")
        if not calls:
            _fail(f"{call_text(fn, *args)}: you never call predict_step. Price the steps the stream waits "
                  "through with the cost model; the checker measures them with the simulator")
        units = units_hint(got, measured)
        if units:
            _fail(f"{units}{call_text(fn, *args)}: you predicted {got:,.6g} s, the simulator measures "
                  f"{measured:,.6g} s")
        why = (_stall_mistake(got, *args)
               or "a stream's gap runs from its token before the prompt's step to its next one")
        errors.append(grade_prediction(f"{call_text(fn, *args)} (the worst gap under prefill_first)", got, measured,
                                       STALL_TOLERANCE, why=why, unit=" s"))
    return passed(f"predicted_stall: {len(cases)} stalls predicted, worst error {max(errors):.2%} against the "
                  f"simulator (tolerance {STALL_TOLERANCE:.1%})")
