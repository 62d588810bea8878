"""Checkers for exercises/07_the_lab: compare the learner's function with the simulator.

Each checker draws fresh random cases, computes the answer with the package
(plots.pick_chunk_size, the simulator's own run, metrics.summarize) and
compares; nothing here needs a model or a GPU.
"""
from __future__ import annotations

import math
import random
from dataclasses import replace

from ..config import ModelConfig
from ..sim.hardware import PROFILES, get_hardware
from ..metrics import summarize
from ..request import RequestMetrics
from ..scheduler import SchedulerConfig
from ..sim.simulator import simulate
from ..sim.workloads import poisson_mix
from ._common import fail as _fail, forbid, learner_call, passed, spy, call_text, checker
from ._reference import ch07 as _ref

_PICK = ("minillm.book.figures.pick_chunk_size", "minillm.book.lab.pick_chunk_size",
         "minillm.book.lab.best_chunk_size",
         "minillm.grading._reference.ch07.pick_chunk_size")
_SIMULATE = ("minillm.sim.simulator.simulate", "minillm.engine.EngineCore.step",
             "minillm.grading._reference.ch07.engine_long_ttft", "minillm.grading._reference.ch07.ttft_steps",
             "minillm.grading._reference.ch07.engine_worst_gap", "minillm.grading._reference.ch07.chunk_for_gap_slo",
             "minillm.book.lab.chunk_sweep")
_SUMMARY = ("minillm.metrics.summarize", "minillm.metrics.meets_slo", "minillm.sim.simulator.SimResult.summary")
_WHY = "write it from the statement; the checker compares with the package for you."

__all__ = ["check_choose_chunk_size", "check_expected_ttft", "check_goodput", "check_decode_floor",
           "check_chunk_for_gap_slo"]


def _close(a, b, rel=1e-9) -> bool:
    return a is not None and b is not None and math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)


# ---------------------------------------------------------------------------
# 1. The chunk size for an SLO
# ---------------------------------------------------------------------------
def _random_rows(rng: random.Random):
    sizes = sorted(rng.sample([16, 32, 64, 128, 256, 512, 1024, 2048, 4096], rng.randint(1, 9)))
    rows = []
    for c in sizes + ([_ref.OFF] if rng.random() < 0.7 else []):
        rows.append({"chunk_size": c, "long_ttft_s": rng.uniform(0.05, 2.0),
                     "itl_max_s": rng.uniform(0.005, 0.3)})
    if rng.random() < 0.3 and len(rows) > 1:                 # a tie in TTFT
        rows[1]["long_ttft_s"] = rows[0]["long_ttft_s"]
    rng.shuffle(rows)
    return rows


@checker
def check_choose_chunk_size(choose_chunk_size, seed: int | None = None, *, num_cases: int = 300):
    """choose_chunk_size(rows, itl_slo_ms) -> chunk size, "off" or None."""
    rng = random.Random(seed)
    # Hand-picked first: a TTFT tie (smaller chunk wins, "off" is the largest), an SLO
    # nobody meets, no rows at all, and a 0 ms SLO (the lab's own helper refuses it).
    tie = [{"chunk_size": "off", "long_ttft_s": 0.5, "itl_max_s": 0.01},
           {"chunk_size": 512, "long_ttft_s": 0.5, "itl_max_s": 0.01},
           {"chunk_size": 256, "long_ttft_s": 0.6, "itl_max_s": 0.005}]
    fixed = [(tie, 20.0), (tie, 7.0), (tie, 1.0), ([], 50.0), (tie, 0.0)]
    for i in range(num_cases + len(fixed)):
        rows, slo_ms = fixed[i] if i < len(fixed) else (_random_rows(rng), None)
        if slo_ms is None:
            slo_ms = rng.choice([rng.uniform(1, 400), min(r["itl_max_s"] for r in rows) * 1e3])
        expected = _ref.pick_chunk_size(rows, slo_ms)
        got = learner_call(choose_chunk_size, [dict(r) for r in rows], slo_ms, forbidden=_PICK, why=_WHY)
        if got != expected:
            table = "; ".join(f"{r['chunk_size']}: TTFT {r['long_ttft_s'] * 1e3:.0f} ms, worst gap "
                              f"{r['itl_max_s'] * 1e3:.1f} ms" for r in rows)
            meeting = [r for r in rows if r["itl_max_s"] * 1e3 <= slo_ms]
            hint = ""
            if isinstance(got, dict):
                hint = "Return the row's chunk_size, not the row. "
            elif meeting and got == min(meeting, key=lambda r: r["itl_max_s"])["chunk_size"]:
                hint = "You pick the smallest gap; among the rows that meet the SLO, pick the lowest TTFT. "
            elif meeting and got in {r["chunk_size"] for r in meeting
                                     if r["long_ttft_s"] == min(m["long_ttft_s"] for m in meeting)}:
                hint = 'Right TTFT, wrong tie-break: the smaller chunk wins, and "off" counts as the largest. '
            elif meeting and got in {r["chunk_size"] for r in rows if r not in meeting
                                     and r["long_ttft_s"] == min(m["long_ttft_s"] for m in rows)}:
                hint = "Your choice has the lowest TTFT but its worst gap misses the SLO: filter first. "
            _fail(f"{hint}For an ITL SLO of {slo_ms:.1f} ms and rows [{table}] you chose {got!r}, "
                  f"expected {expected!r} (lowest TTFT among rows meeting the SLO; ties: smaller chunk; "
                  f"None if no row meets it)")
    return passed(f"choose_chunk_size: {num_cases} random sweeps agree with the lab")


# ---------------------------------------------------------------------------
# 2. TTFT from the steps: sum the cost model over the chunk steps
# ---------------------------------------------------------------------------
def _diagnose_steps(case, calls):
    """Name the first step the learner priced differently from the simulator's."""
    model, hw, length, chunk, n, ctx = case
    want = _ref.ttft_steps(length, chunk, n, ctx)
    given = [list(args[1]) if len(args) > 1 else list(kwargs.get("requests", kwargs.get("step", [])))
             for args, kwargs in calls]
    where = f"{model} on {hw}, a {length}-token prompt in chunks of {chunk} with {n} streams at {ctx} cached tokens"
    if not given:
        return
    if len(given) != len(want):
        _fail(f"{where}: you call predict_step {len(given)} times; the prefill takes ceil({length} / {chunk}) = "
              f"{len(want)} steps, one call each")
    for k, (mine, theirs) in enumerate(zip(given, want)):
        mine = [tuple(r) if len(r) == 3 else (*r, True) for r in mine]
        if sorted(mine) != sorted(theirs):
            _fail(f"{where}: step {k} should be {theirs[:2]}{' + ...' if len(theirs) > 2 else ''} "
                  f"({len(theirs)} requests), you pass {mine[:2]}{' + ...' if len(mine) > 2 else ''} "
                  f"({len(mine)} requests). The chunk is (tokens, tokens cached before it, is it the last?), "
                  "each stream (1, context + k, True)")


@checker
def check_expected_ttft(expected_ttft, seed: int | None = None, *, num_cases: int = 6):
    """expected_ttft(model, hardware, prompt_len, chunk_size, num_decoders, decoder_context) -> seconds."""
    rng = random.Random(seed)
    cases = [("llama-3-8b", "A100-80GB", 2048, 512, 4, 72)]
    while len(cases) < num_cases:
        chunk, n = rng.choice([16, 64, 100, 256, 512, 1000, 2048]), rng.randint(0, 8)
        # the streams' prompts fit in one first step, so all streams are in step when the prompt arrives
        ctx = rng.randint(_ref.WARMUP_TOKENS, chunk // max(n, 1) + _ref.WARMUP_TOKENS - 1)
        cases.append((rng.choice(["llama-3-8b", "llama-2-7b", "qwen3-0.6b"]), rng.choice(sorted(PROFILES)),
                      rng.randint(100, 3000), chunk, n, ctx))
    for case in cases:
        expected = _ref.engine_long_ttft(*case)
        with spy(expected_ttft, "minillm.sim.simulator.predict_step") as calls, \
                forbid(expected_ttft, *_SIMULATE, why="sum predict_step over the steps you build."):
            got = expected_ttft(*case)
        if not _close(got, expected, 1e-9):
            _diagnose_steps(case, calls)
            model, hw, length, chunk, n, ctx = case
            steps = -(-length // chunk)
            _fail(f"{model} on {hw}, a {length}-token prompt in chunks of {chunk} ({steps} steps) with {n} "
                  f"streams at {ctx} cached tokens: you predict {got!r} s, the simulator measures "
                  f"{expected:.6f} s. Each step is [(chunk tokens, tokens already cached, is it the last "
                  f"chunk?)] + [(1, ctx + k, True)] * n at step k; sum predict_step(...).total")
    return passed(f"expected_ttft: {len(cases)} cases match the simulator to 1e-9")


# ---------------------------------------------------------------------------
# 3. Goodput
# ---------------------------------------------------------------------------
def _unfinished(output, rng: random.Random):
    """The same request caught mid-stream: a first token (fast), a few more, no finish yet."""
    m = output.metrics
    kept = m.token_times[:max(1, len(m.token_times) // 2)]
    metrics = RequestMetrics(arrival_time=m.arrival_time, first_token_time=kept[0], token_times=list(kept),
                             finish_time=None)
    return replace(output, finished=False, finish_reason=None, metrics=metrics,
                   output_token_ids=output.output_token_ids[:len(kept)])


@checker
def check_goodput(goodput, seed: int | None = None, *, num_cases: int = 4):
    """goodput(outputs, ttft_slo_s, tpot_slo_s) -> requests per second meeting both SLOs.

    Every load holds a few requests that have not finished (finish_time None, a fast
    first token): they are not good yet, and they do not stretch the time span.
    """
    rng = random.Random(seed)
    for case in range(num_cases):
        # Every other load is mostly 1- to 3-token answers (no TPOT), and the first
        # request (arriving at 0.0) is left out, so a span that starts at 0 shows.
        load = poisson_mix(num_requests=rng.randint(8, 24), rate_per_s=rng.uniform(2, 20),
                           prompt_len=(16, 2048), output_len=(1, 3) if case % 2 else (1, 64),
                           seed=rng.randrange(10**6))
        sched = rng.choice([SchedulerConfig(policy="prefill_first"), SchedulerConfig(chunk_size=256)])
        outputs = simulate(load, sched).outputs[1:]
        for i in rng.sample(range(len(outputs)), k=min(3, len(outputs) - 2)):
            outputs[i] = _unfinished(outputs[i], rng)
        ttft_slo_s, tpot_slo_s = rng.uniform(0.05, 1.0), rng.uniform(0.01, 0.05)
        expected = summarize(outputs, ttft_slo_s, tpot_slo_s)["goodput_req_s"]
        finished = [o for o in outputs if o.finished]
        span_s = max(o.metrics.finish_time for o in finished) - min(o.metrics.arrival_time for o in finished)
        call = call_text(goodput, outputs, round(ttft_slo_s, 3), round(tpot_slo_s, 3))
        num_unfinished = len(outputs) - len(finished)

        def unfinished_crash(error):
            if isinstance(error, (TypeError, AttributeError)):
                return (f"{num_unfinished} of the {len(outputs)} requests have not finished (o.finished is False, "
                        "o.metrics.finish_time is None): leave them out, a request is good only once it has "
                        "finished")
            return None
        got = learner_call(goodput, list(outputs), ttft_slo_s, tpot_slo_s, forbidden=_SUMMARY, why=_WHY,
                           explain=unfinished_crash)
        if not _close(got, expected, 1e-9):
            good = expected * span_s
            hint = ""
            if isinstance(got, (int, float)) and _close(got, good / max(o.metrics.finish_time for o in finished),
                                                         1e-9):
                hint = "Your time span starts at 0, not at the first arrival. "
            elif isinstance(got, (int, float)) and got > expected and _close(
                    got, sum(1 for o in outputs if o.metrics.ttft <= ttft_slo_s and (
                        o.metrics.tpot is None or o.metrics.tpot <= tpot_slo_s)) / span_s, 1e-9):
                hint = ("You count requests that have not finished (o.finished is False): they have a fast first "
                        "token but are not good yet. ")
            elif any(o.metrics.tpot is None for o in finished):
                hint = "Check the 1-token requests: they have no TPOT and meet any TPOT SLO. "
            _fail(f"{hint}{call} on {len(outputs)} requests ({len(finished)} finished) returned {got!r} req/s, "
                  f"expected {expected:.4f} (finished requests meeting both SLOs, divided by the time from the "
                  f"first arrival to the last finish among the finished ones; a 1-token request has no TPOT "
                  f"and meets any TPOT SLO)")
    return passed(f"goodput: {num_cases} loads, unfinished requests among them, agree with metrics.summarize")


# ---------------------------------------------------------------------------
# 4. The decode floor
# ---------------------------------------------------------------------------
@checker
def check_decode_floor(decode_floor_s, seed: int | None = None):
    """decode_floor_s(cfg, hardware, dtype_bytes) -> seconds to stream every weight once."""
    for name in ("llama-2-7b", "llama-3-8b", "qwen3-0.6b", "mistral-7b"):
        for hw_name in sorted(PROFILES):
            for dtype_bytes in (1, 2):
                cfg, hw = ModelConfig.preset(name), get_hardware(hw_name)
                expected = cfg.num_parameters() * dtype_bytes / hw.mem_bandwidth_bytes_s
                got = learner_call(decode_floor_s, cfg, hw, dtype_bytes)
                if not _close(got, expected, 1e-9):
                    _fail(f"{name} on {hw_name} at {dtype_bytes} bytes per weight: you return {got!r} s, "
                          f"expected {expected:.6f} s (all parameters x bytes, over the datasheet bandwidth)")
    return passed("decode_floor_s: matches for 4 models x 4 GPUs x 2 dtypes")


# ---------------------------------------------------------------------------
# 5. The largest chunk that meets a worst-gap target: predict, then measure
# ---------------------------------------------------------------------------
GAP_TOLERANCE = 0.02        # the predicted worst gap must be within 2% of the simulator's


def _gap_cases(rng: random.Random):
    """(model, hardware, prompt_len, num_decoders, decoder_context, candidates, chosen index or None):
    the target is put between two candidates' measured gaps, so one chunk is the answer."""
    candidates = [128, 256, 512, 1024, 2048]
    cases = [("llama-3-8b", "A100-80GB", 3000, 4, 32, candidates, 2),
             ("llama-3-8b", "H100-SXM", 4000, 8, 16, candidates, 3),
             ("qwen3-0.6b", "A100-40GB", 2500, 2, 40, candidates, None)]
    for _ in range(2):
        num_decoders = rng.randint(1, 8)
        context = rng.randint(_ref.WARMUP_TOKENS + 1, 128 // num_decoders + 3)
        cases.append((rng.choice(["llama-3-8b", "llama-2-7b"]), rng.choice(sorted(PROFILES)),
                      rng.randint(1500, 4000), num_decoders, context,
                      rng.sample(candidates, 4), rng.randint(0, 3)))
    return cases


@checker
def check_chunk_for_gap_slo(fn, seed: int | None = None):
    """fn(model, hardware, prompt_len, num_decoders, decoder_context, gap_slo_s, candidates)
    -> (chunk_size, predicted_worst_gap_s), or (None, None) when no candidate meets the target.

    Graded against the simulator: for every candidate the checker measures the streams'
    worst gap (max ITL) while the long prompt is served; the answer is the largest candidate
    that meets the target, and the predicted gap must be within 2% of the measured one.
    """
    rng = random.Random(seed)
    cases = _gap_cases(rng)
    for model, hw, prompt_len, n, ctx, candidates, chosen in cases:
        measured = {c: _ref.engine_worst_gap(model, hw, prompt_len, c, n, ctx) for c in candidates}
        ordered = sorted(candidates)
        if chosen is None:
            slo_s = 0.5 * measured[ordered[0]]
        else:
            below = measured[ordered[chosen]]
            above = measured[ordered[chosen + 1]] if chosen + 1 < len(ordered) else 2 * below
            slo_s = (below + above) / 2
        expected_chunk = max((c for c in candidates if measured[c] <= slo_s), default=None)
        call = call_text(fn, model, hw, prompt_len, n, ctx, round(slo_s, 5), list(candidates))
        with spy(fn, "minillm.sim.simulator.predict_step") as calls:
            got = learner_call(fn, model, hw, prompt_len, n, ctx, slo_s, list(candidates), forbidden=_SIMULATE,
                               why="predict the steps with predict_step; the checker simulates for you.")
        if not (isinstance(got, tuple) and len(got) == 2):
            _fail(f"{call} returned {got!r}: return a pair (chunk_size, predicted worst gap in seconds), "
                  "or (None, None)")
        chunk, gap_s = got
        table = ", ".join(f"{c}: {measured[c] * 1e3:.2f} ms" for c in ordered)
        if expected_chunk is None:
            if chunk is not None:
                _fail(f"{call} returned chunk {chunk!r}; measured worst gaps ({table}) all miss the "
                      f"{slo_s * 1e3:.2f} ms target: return (None, None)")
            continue
        if not calls:
            _fail(f"{call}: you never call predict_step. Predict each candidate's steps with the cost model; "
                  "the checker measures them with the simulator")
        if chunk != expected_chunk:
            hint = ""
            if chunk in measured and measured[chunk] > slo_s:
                hint = (f"Measured, chunk {chunk}'s worst gap is {measured[chunk] * 1e3:.2f} ms, over the target: "
                        "is your slowest step the slowest one? The last chunks attend over the most cached "
                        "keys, and every step carries the decodes. ")
            elif chunk in measured:
                hint = ("A larger candidate meets the target too: the largest chunk that meets it gives the long "
                        "prompt the fewest steps, so the best TTFT. ")
            _fail(f"{hint}{call} chose {chunk!r}; the simulator measures worst gaps {table} for a "
                  f"{slo_s * 1e3:.2f} ms target, so {expected_chunk}")
        truth = measured[expected_chunk]
        if not isinstance(gap_s, (int, float)) or abs(gap_s - truth) > GAP_TOLERANCE * truth:
            steps = _ref.ttft_steps(prompt_len, chunk, n, ctx)
            from ..sim.simulator import predict_step
            first = predict_step(model, steps[0], hw).total
            alone = max(predict_step(model, step[:1], hw).total for step in steps)
            hint = ""
            if isinstance(gap_s, (int, float)) and math.isclose(gap_s, first, rel_tol=1e-6):
                hint = ("That is the FIRST chunk's step: later chunks attend over more cached keys, so the "
                        "slowest step comes last. ")
            elif isinstance(gap_s, (int, float)) and math.isclose(gap_s, alone, rel_tol=1e-6):
                hint = "Your steps leave out the decodes: every step carries one token per stream. "
            _fail(f"{hint}{call}: right chunk ({chunk}), but you predict a worst gap of {gap_s!r} s and the "
                  f"simulator measures {truth:.6f} s (tolerance {GAP_TOLERANCE:.0%}): a stream's gap is one "
                  "whole step, chunk and decodes together")
    return passed(f"chunk_for_gap_slo: {len(cases)} targets, your chunks and worst gaps match the simulator's "
                  f"within {GAP_TOLERANCE:.0%}")
