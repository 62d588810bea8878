"""Checkers for exercises/07_the_lab: compare the learner's function with the simulator.

Each checker draws cases and asks the package for the answer: the accounting
module for the bytes a decode reads (the chapter's own definition), the lab's
rule for a chunk size, metrics.summarize for goodput, the simulator's own run
(its trace and its metrics) for a prefill's TTFT and the streams' worst gap.
Nothing here imports the reference answers (minillm.grading._reference), and
nothing here needs a model or a GPU.
"""
from __future__ import annotations

import math
import random
from dataclasses import replace

from ..config import ModelConfig
from ..metrics import summarize
from ..request import RequestMetrics
from ..scheduler import SchedulerConfig
from ..sim.accounting import step_cost
from ..sim.hardware import PROFILES, get_hardware
from ..sim.simulator import simulate
from ..sim.workloads import long_prompt_interference, poisson_mix
from ._common import fail as _fail, forbid, learner_call, passed, spy, call_text, checker
from ._units import units_hint

_HERE = "minillm.grading.ch07."
_PICK = ("minillm.book.figures.pick_chunk_size", "minillm.book.lab.pick_chunk_size",
         "minillm.book.lab.best_chunk_size")
_SIMULATE = ("minillm.sim.simulator.simulate", "minillm.engine.EngineCore.step", "minillm.book.lab.chunk_sweep",
             *(_HERE + name for name in ("_simulated_prefill", "_simulated_worst_gap")))
_SUMMARY = ("minillm.metrics.summarize", "minillm.metrics.meets_slo", "minillm.sim.simulator.SimResult.summary")
_ACCOUNTING = ("minillm.sim.accounting.step_cost", "minillm.sim.accounting.prefill_cost",
               "minillm.sim.cost_model.predict_step", "minillm.sim.simulator.predict_step")
_WHY = "work it out from the chapter; the checker compares with the package for you."

__all__ = ["check_decode_floor", "check_choose_chunk_size", "check_goodput", "check_expected_ttft",
           "check_chunk_for_gap_slo"]
OFF = "off"                  # a sweep row without chunking (the prefill_first policy)
WARMUP_TOKENS = 4            # the streams' tokens before the long prompt arrives


def _close(a, b, rel=1e-9) -> bool:
    return a is not None and b is not None and math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# ---------------------------------------------------------------------------
# 1. The decode floor: what a decode step must read
# ---------------------------------------------------------------------------
FLOOR_TOLERANCE = 0.001      # norms (a few KB per layer) may be counted or not; the embedding may not


def _floor_cases():
    """Presets (untied and tied embeddings) and two shapes no chapter printed."""
    cfgs = [ModelConfig.preset(name) for name in ("llama-2-7b", "llama-3-8b", "mistral-7b", "qwen3-0.6b", "tiny")]
    cfgs.append(ModelConfig.preset("llama-3-8b").replace(name="llama-3-8b-16-kv-heads", num_kv_heads=16,
                                                         vocab_size=200_000))
    cfgs.append(ModelConfig.preset("qwen3-0.6b").replace(name="qwen3-like-untied", tie_word_embeddings=False,
                                                         num_layers=12))
    return cfgs


def _floor_mistake(results) -> str:
    """The usual ways to count a decode's bytes wrong, each named (wrong variants, not the answer).

    results: [(cfg, hw, dtype_bytes, expected_s, got), ...] over every case, so a slip is named only
    when it explains ALL of the learner's numbers: on one shape two slips can agree (Llama-2-7B's
    embedding is exactly the KV cache of 500 tokens)."""
    cfg, hw, dtype_bytes, expected, got = results[0]
    if not _number(got):
        return "Return the time in seconds, a number. "

    def explains(excess_elements) -> bool:
        """Does got = expected + excess_elements(cfg) weights' time, within the tolerance, in every case?"""
        return all(_number(g) and abs(g - (e + excess_elements(c) * b / h.mem_bandwidth_bytes_s))
                   <= FLOOR_TOLERANCE * e for c, h, b, e, g in results)

    def scaled(factor) -> bool:
        return all(_number(g) and abs(g - e * factor(c, h, b)) <= FLOOR_TOLERANCE * e * factor(c, h, b)
                   for c, h, b, e, g in results)

    def matches(elements) -> bool:
        """Does got = elements(cfg) weights' time, within the tolerance, in every case?"""
        return all(_number(g) and abs(g - elements(c) * b / h.mem_bandwidth_bytes_s) <= FLOOR_TOLERANCE * e
                   for c, h, b, e, g in results)

    units = units_hint(got, expected)
    if units and scaled(lambda c, h, b: 1e3):
        return units
    vh = lambda c: c.vocab_size * c.hidden_size
    if matches(lambda c: c.num_parameters()) or explains(vh):
        if cfg.tie_word_embeddings:
            return ("With tied embeddings the LM head IS the embedding table: the decode streams it once, as "
                    "the head. ")
        return ("You count every parameter, the input embedding too: a decode gathers ONE row of the "
                "embedding table per token, it does not stream the table (chapter 7, section 7). ")
    per_token = [((g - e) * h.mem_bandwidth_bytes_s / b) / c.kv_bytes_per_token(1) for c, h, b, e, g in results
                 if _number(g)]
    num_tokens = round(sorted(per_token)[len(per_token) // 2]) if per_token else 0
    if num_tokens >= 1 and explains(lambda c: num_tokens * c.kv_bytes_per_token(1)):
        return (f"You add a KV cache (about {num_tokens} tokens' worth): the floor is the least a decode step can "
                "take, and what it must read whatever its context is the weights (a short context reads next "
                "to no KV). ")
    if explains(lambda c: -vh(c) if c.tie_word_embeddings else 0) and cfg.tie_word_embeddings:
        return ("With tied embeddings the table is still read every decode, as the LM head: one [hidden, vocab] "
                "matmul per step, to get the next token's logits. ")
    if explains(lambda c: -vh(c)):
        return "A decode also runs the LM head, a [hidden, vocab] matmul, to get its next token's logits. "
    if explains(lambda c: 2 * c.num_layers * c.hidden_size * (c.q_size - c.kv_size)) and cfg.q_size != cfg.kv_size:
        return (f"K and V have {cfg.num_kv_heads} heads here, not {cfg.num_heads}: their projections are kv_size "
                "wide (grouped-query attention), smaller than Q's. ")
    if dtype_bytes != 2 and scaled(lambda c, h, b: 2 / b):
        return f"The weights are {dtype_bytes} byte(s) each here, not 2. "
    if scaled(lambda c, h, b: 8) or scaled(lambda c, h, b: 1 / 8):
        return "Bits or bytes? The bandwidth is in bytes per second, dtype_bytes in bytes per weight. "
    if scaled(lambda c, h, b: 1 / h.bandwidth_efficiency):
        return ("You divide by the bandwidth a kernel achieves (bandwidth_efficiency): the floor is what the "
                "datasheet's bandwidth allows, mem_bandwidth_bytes_s; no kernel beats it. ")
    return units


@checker
def check_decode_floor(decode_floor_s, seed: int | None = None):
    """decode_floor_s(cfg, hw, dtype_bytes) -> the least time a decode step can take: the bytes it
    must read (accounting.step_cost's bytes_weights, the chapter's count) over the bandwidth."""
    cases = [(cfg, hw_name, dtype_bytes) for cfg in _floor_cases() for hw_name in sorted(PROFILES)
             for dtype_bytes in (1, 2)]
    results = []
    for cfg, hw_name, dtype_bytes in cases:
        hw = get_hardware(hw_name)
        expected = step_cost(cfg, [(1, 0)], dtype_bytes).bytes_weights / hw.mem_bandwidth_bytes_s
        got = learner_call(decode_floor_s, cfg, hw, dtype_bytes, forbidden=_ACCOUNTING,
                           why="count what a decode reads from the model's shape.")
        results.append((cfg, hw, dtype_bytes, expected, got))
    for (cfg, hw, dtype_bytes, expected, got), (_, hw_name, _) in zip(results, cases):
        if not _number(got) or abs(got - expected) > FLOOR_TOLERANCE * expected:
            failing = results.index((cfg, hw, dtype_bytes, expected, got))
            hint = _floor_mistake([results[failing]] + results[:failing] + results[failing + 1:])
            _fail(f"{hint}{cfg.name} on {hw_name} at {dtype_bytes} byte(s) per weight: you return {got!r} s, "
                  f"the least a decode step can take is {expected:.6g} s")
    return passed(f"decode_floor_s: right for {len(_floor_cases())} model shapes x {len(PROFILES)} GPUs x 2 dtypes")


# ---------------------------------------------------------------------------
# 2. The chunk size for an SLO
# ---------------------------------------------------------------------------
def _pick(rows, itl_slo_ms):
    """The lab's own rule (minillm.book.figures.pick_chunk_size); no worst gap meets a 0 ms target,
    which that function refuses as an argument."""
    if itl_slo_ms <= 0:
        return None
    from ..book.figures import pick_chunk_size
    return pick_chunk_size(rows, itl_slo_ms)


def _random_rows(rng: random.Random):
    sizes = sorted(rng.sample([16, 32, 64, 128, 256, 512, 1024, 2048, 4096], rng.randint(1, 9)))
    rows = []
    for c in sizes + ([OFF] if rng.random() < 0.7 else []):
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
    # A sweep with a 9 s stall first: compared in the wrong unit, the filter keeps a row that misses the
    # SLO and drops the stalled one, so that slip and no filter at all pick different rows.
    stalled = [{"chunk_size": 2048, "long_ttft_s": 0.1, "itl_max_s": 9.0},
               {"chunk_size": 512, "long_ttft_s": 0.2, "itl_max_s": 0.05},
               {"chunk_size": 64, "long_ttft_s": 0.3, "itl_max_s": 0.001}]
    # A measured sweep that is not clean: the largest chunk meeting the SLO is not the one with the best TTFT.
    unclean = [{"chunk_size": 2048, "long_ttft_s": 0.9, "itl_max_s": 0.02},
               {"chunk_size": 256, "long_ttft_s": 0.4, "itl_max_s": 0.015}]
    fixed = [(stalled, 7.0), (unclean, 30.0), (tie, 20.0), (tie, 7.0), (tie, 1.0), ([], 50.0), (tie, 0.0)]
    for i in range(num_cases + len(fixed)):
        rows, slo_ms = fixed[i] if i < len(fixed) else (_random_rows(rng), None)
        if slo_ms is None:
            slo_ms = rng.choice([rng.uniform(1, 400), min(r["itl_max_s"] for r in rows) * 1e3])
        expected = _pick(rows, slo_ms)
        got = learner_call(choose_chunk_size, [dict(r) for r in rows], slo_ms, forbidden=_PICK, why=_WHY)
        if got != expected:
            table = "; ".join(f"{r['chunk_size']}: TTFT {r['long_ttft_s'] * 1e3:.0f} ms, worst gap "
                              f"{r['itl_max_s'] * 1e3:.1f} ms" for r in rows)
            meeting = [r for r in rows if r["itl_max_s"] * 1e3 <= slo_ms]
            hint = ""
            if isinstance(got, dict):
                hint = "Return the row's chunk_size, not the row. "
            elif meeting and got is None and all(r["itl_max_s"] * 1e3 >= slo_ms for r in meeting):
                hint = "A row whose worst gap equals the SLO meets it: at most the SLO (<=), not below it. "
            elif got == _pick(rows, slo_ms * 1e3) or (got is not None and got == _pick(rows, slo_ms * 1e-3)):
                hint = ("Seconds against milliseconds: itl_max_s is in seconds, itl_slo_ms in milliseconds; "
                        "compare the two in one unit. ")
            elif meeting and got == min(meeting, key=lambda r: r["itl_max_s"])["chunk_size"]:
                hint = "You pick the smallest gap; among the rows that meet the SLO, pick the lowest TTFT. "
            elif meeting and got in {r["chunk_size"] for r in meeting
                                     if r["long_ttft_s"] == min(m["long_ttft_s"] for m in meeting)}:
                hint = 'Right TTFT, wrong tie-break: the smaller chunk wins, and "off" counts as the largest. '
            elif meeting and got in {r["chunk_size"] for r in rows if r not in meeting
                                     and r["long_ttft_s"] == min(m["long_ttft_s"] for m in rows)}:
                hint = "Your choice has the lowest TTFT but its worst gap misses the SLO: filter first. "
            elif meeting and got == max((r["chunk_size"] for r in meeting),
                                        key=lambda c: math.inf if c == OFF else c):
                hint = ("You take the largest chunk that meets the SLO (chapter 7's rule on a clean sweep); this "
                        "sweep need not be clean: rank the rows that meet it by TTFT. ")
            _fail(f"{hint}For an ITL SLO of {slo_ms:.1f} ms and rows [{table}] you chose {got!r}, "
                  f"expected {expected!r} (lowest TTFT among rows meeting the SLO; ties: smaller chunk; "
                  f"None if no row meets it)")
    return passed(f"choose_chunk_size: {num_cases} random sweeps agree with the lab")


# ---------------------------------------------------------------------------
# 3. Goodput of a live server's snapshot: repair the chapter's function
# ---------------------------------------------------------------------------
def _unfinished(output):
    """The same request caught mid-stream: a first token (fast), a few more, no finish yet."""
    m = output.metrics
    kept = m.token_times[:max(1, len(m.token_times) // 2)]
    metrics = RequestMetrics(arrival_time=m.arrival_time, first_token_time=kept[0], token_times=list(kept),
                             finish_time=None)
    return replace(output, finished=False, finish_reason=None, metrics=metrics,
                   output_token_ids=output.output_token_ids[:len(kept)])


def _goodput_loads(rng: random.Random, num_cases: int):
    """Simulated loads with a few requests caught before they finished. The first request
    (arriving at 0.0) is left out, so a span that starts at 0 shows; in every other load the
    earliest arrival is one of the unfinished, so a span over all arrivals shows too."""
    for case in range(num_cases):
        load = poisson_mix(num_requests=rng.randint(8, 24), rate_per_s=rng.uniform(2, 20),
                           prompt_len=(16, 2048), output_len=(1, 3) if case % 2 else (1, 64),
                           seed=rng.randrange(10**6))
        sched = rng.choice([SchedulerConfig(policy="prefill_first"), SchedulerConfig(chunk_size=256)])
        outputs = simulate(load, sched).outputs[1:]
        caught = set(rng.sample(range(len(outputs)), k=min(3, len(outputs) - 2)))
        if case % 2 == 0:
            caught = {min(range(len(outputs)), key=lambda i: outputs[i].metrics.arrival_time)} | set(list(caught)[:2])
        for i in caught:
            outputs[i] = _unfinished(outputs[i])
        yield outputs, rng.uniform(0.05, 1.0), rng.uniform(0.01, 0.05)


def _goodput_mistake(got, expected, outputs, ttft_slo_s, tpot_slo_s) -> str:
    if not _number(got):
        return "Return requests per second, a number. "
    if units_hint(got, expected):
        return ("That is 1000 times off: goodput is requests per SECOND, and every time here (the metrics, the "
                "SLOs) is in seconds. ")
    finished = [o for o in outputs if o.finished]
    good = expected * (max(o.metrics.finish_time for o in finished) - min(o.metrics.arrival_time for o in finished))
    meets = lambda o: o.metrics.ttft <= ttft_slo_s and (o.metrics.tpot is None or o.metrics.tpot <= tpot_slo_s)
    last_finish = max(o.metrics.finish_time for o in finished)
    if _close(got, good / last_finish):
        return "Your time span starts at 0, not at the first arrival. "
    if _close(got, good / (last_finish - min(o.metrics.arrival_time for o in outputs))):
        return ("Your time span starts at the first arrival of ALL requests, unfinished ones included: the run "
                "you score is the finished requests', from the first of them to arrive to the last to finish. ")
    span = last_finish - min(o.metrics.arrival_time for o in outputs)
    for denominator in (last_finish - min(o.metrics.arrival_time for o in finished), span, last_finish):
        if got > expected and _close(got, sum(map(meets, outputs)) / denominator):
            return ("You count requests that have not finished (o.finished is False): they have a fast first "
                    "token but are not good yet. ")
    if any(o.metrics.tpot is None for o in finished):
        return "Check the 1-token requests: they have no TPOT and meet any TPOT SLO. "
    return ""


@checker
def check_goodput(goodput, seed: int | None = None, *, num_cases: int = 4):
    """goodput(outputs, ttft_slo_s, tpot_slo_s) -> requests per second meeting both SLOs, as
    metrics.summarize reports it. Every load holds requests that have not finished (finish_time
    None, a fast first token): they are not good yet, and they do not stretch the time span."""
    rng = random.Random(seed)
    for outputs, ttft_slo_s, tpot_slo_s in _goodput_loads(rng, num_cases):
        expected = summarize(outputs, ttft_slo_s, tpot_slo_s)["goodput_req_s"]
        finished = [o for o in outputs if o.finished]
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
            hint = _goodput_mistake(got, expected, outputs, ttft_slo_s, tpot_slo_s)
            _fail(f"{hint}{call} on {len(outputs)} requests ({len(finished)} finished) returned {got!r} req/s, "
                  f"metrics.summarize reports {expected:.4f}")
    return passed(f"goodput: {num_cases} snapshots, unfinished requests among them, agree with metrics.summarize")


# ---------------------------------------------------------------------------
# 4. The TTFT price of chunking: predict, then measure
# ---------------------------------------------------------------------------
def _interference(prompt_len, num_decoders, decoder_context):
    """num_decoders streams with decoder_context tokens cached when the prompt's first chunk runs
    (their prompts fit in one first step together)."""
    return long_prompt_interference(prompt_len=prompt_len, num_decoders=num_decoders, warmup_tokens=WARMUP_TOKENS,
                                    decoder_prompt_len=decoder_context - WARMUP_TOKENS + 1, long_output_len=1)


def _simulated_prefill(model, hardware, prompt_len, chunk_size, num_decoders, decoder_context):
    """The simulator's run: (the long prompt's TTFT, the steps it waited through, each as
    [(num_new, num_cached, samples)], read off the trace)."""
    res = simulate(_interference(prompt_len, num_decoders, decoder_context),
                   SchedulerConfig(policy="chunked", chunk_size=chunk_size), model=model, hardware=hardware)
    long = next(o for o in res.outputs if o.tag == "long")
    done, steps = {}, []
    for record in res.trace:
        if long.metrics.arrival_time <= record.start < long.metrics.first_token_time:
            steps.append([(n, done.get(rid, 0), rid != long.request_id or done.get(rid, 0) + n == prompt_len)
                          for rid, n in record.scheduled])
        for rid, n in record.scheduled:
            done[rid] = done.get(rid, 0) + n
    return long.metrics.ttft, steps


def _step_of(args, kwargs):
    step = args[1] if len(args) > 1 else kwargs.get("requests", kwargs.get("step", []))
    return [tuple(r) if len(r) == 3 else (*r, True) for r in step]


def _show_step(step) -> str:
    """A step as its prompt chunk first, then its decodes grouped: (512, 0, False) + 4 x (1, 72, True)."""
    counts = {}
    for request in sorted(step, key=lambda r: (-r[0], r[1], not r[2])):
        counts[request] = counts.get(request, 0) + 1
    return " + ".join(f"{n} x {r}" if n > 1 else str(r) for r, n in counts.items()) or "[]"


def _split_step(step, chunk):
    """(the entry taken for the prompt's chunk, the rest): the chunk itself if the step holds it, else the
    entry with the chunk's length and cache, else the one with the most new tokens."""
    if not step:
        return None, []
    pick = next((r for r in step if r == chunk), None) or next((r for r in step if r[:2] == chunk[:2]), None) \
        or max(step, key=lambda r: (r[0], r[1] != chunk[1]))
    rest = list(step)
    rest.remove(pick)
    return pick, rest


def _diagnose_steps(where, want, calls):
    """Name the first step the learner priced differently from the simulator's."""
    given = [_step_of(args, kwargs) for args, kwargs in calls]
    if not given:
        return
    if len(given) != len(want):
        _fail(f"{where}: you price {len(given)} steps, the prefill took {len(want)} (the chunks tile the "
              "prompt, one chunk per step)")
    for k, (mine, theirs) in enumerate(zip(given, want)):
        if sorted(mine) == sorted(theirs):
            continue
        chunk = theirs[-1]                       # the engine schedules the decodes first, then the chunk
        decodes = theirs[:-1]
        mine_chunk, mine_decodes = _split_step(mine, chunk)
        hint = ""
        if len(mine_decodes) < len(decodes):
            hint = "Every step of the prefill also carries one decode per stream. "
        elif mine_chunk[2] and not chunk[2]:
            hint = ("Only the chunk that completes the prompt computes logits (samples=True); an earlier chunk "
                    "only fills the KV cache, and its step runs no LM head for it. ")
        elif chunk[2] and not mine_chunk[2]:
            hint = ("The chunk that completes the prompt computes its logits (samples=True): that is where the "
                    "prompt's first token comes from. ")
        elif mine_chunk[1] != chunk[1]:
            hint = "A chunk attends over everything cached before it: the tokens of the chunks before. "
        elif mine_chunk[0] != chunk[0]:
            hint = "The chunks tile the prompt: each takes chunk_size tokens, the last what is left. "
        elif any(not r[2] for r in mine_decodes):
            hint = "A decode samples every step: its logits give the stream's next token (samples=True). "
        elif sorted(mine_decodes) != sorted(decodes):
            hint = "Each stream's cache grows by one token every step: at step k its decode sees context + k. "
        _fail(f"{hint}{where}: step {k} should hold {_show_step(theirs)}; you pass {_show_step(mine)}")


@checker
def check_expected_ttft(expected_ttft, seed: int | None = None, *, num_cases: int = 6):
    """expected_ttft(model, hardware, prompt_len, chunk_size, num_decoders, decoder_context) -> seconds,
    predicted with predict_step; measured by the simulator serving the same arrival."""
    rng = random.Random(seed)
    cases = [("llama-3-8b", "A100-80GB", 2048, 512, 4, 72), ("qwen3-0.6b", "H100-SXM", 1000, 256, 2, 40)]
    while len(cases) < num_cases:
        chunk, n = rng.choice([16, 64, 100, 256, 512, 1000, 2048]), rng.randint(0, 8)
        # the streams' prompts fit in one first step, so all streams are in step when the prompt arrives
        ctx = rng.randint(WARMUP_TOKENS, chunk // max(n, 1) + WARMUP_TOKENS - 1)
        cases.append((rng.choice(["llama-3-8b", "llama-2-7b", "qwen3-0.6b"]), rng.choice(sorted(PROFILES)),
                      rng.randint(100, 3000), chunk, n, ctx))
    for case in cases:
        expected, steps = _simulated_prefill(*case)
        with spy(expected_ttft, "minillm.sim.simulator.predict_step") as calls, \
                forbid(expected_ttft, *_SIMULATE, why="price the steps with predict_step; the checker simulates."):
            got = learner_call(expected_ttft, *case)
        if not _close(got, expected, 1e-9):
            model, hw, length, chunk, n, ctx = case
            where = f"{call_text(expected_ttft, *case)}"
            if units_hint(got, expected):
                _fail(f"{units_hint(got, expected)}{where}: you predict {got!r} s, the simulator measures "
                      f"{expected:.6f} s")
            if not calls:
                _fail(f"{where}: you never call predict_step. Price each step of the prefill with the cost model; "
                      "the checker measures them with the simulator")
            _diagnose_steps(where, steps, calls)
            _fail(f"{where}: you predict {got!r} s, the simulator measures {expected:.6f} s over "
                  f"{len(steps)} steps: the TTFT is the sum of the steps' times, predict_step(...).total each")
    return passed(f"expected_ttft: {len(cases)} prefills predicted, equal to the simulator's to 1e-9")


# ---------------------------------------------------------------------------
# 5. The largest chunk that meets a worst-gap target: predict, then measure
# ---------------------------------------------------------------------------
GAP_TOLERANCE = 0.02        # the predicted worst gap must be within 2% of the simulator's


def _simulated_worst_gap(model, hardware, prompt_len, chunk_size, num_decoders, decoder_context):
    """The worst gap (max ITL) the streams see while the simulator serves the long prompt."""
    res = simulate(_interference(prompt_len, num_decoders, decoder_context),
                   SchedulerConfig(policy="chunked", chunk_size=chunk_size), model=model, hardware=hardware)
    return res.summary()["decoder_itl_max_s"]


def _gap_cases(rng: random.Random):
    """(model, hardware, prompt_len, num_decoders, decoder_context, candidates, chosen index or None):
    the target is put between two candidates' measured gaps, so one chunk is the answer. The
    second case's prompt ends in a short chunk for every candidate: its slowest step is the one before."""
    candidates = [128, 256, 512, 1024, 2048]
    cases = [("llama-3-8b", "A100-80GB", 3000, 4, 32, candidates, 2),
             ("qwen3-0.6b", "H100-SXM", 16_400, 2, 40, candidates, 2),
             ("llama-3-8b", "H100-SXM", 4000, 8, 16, candidates, 3),
             ("qwen3-0.6b", "A100-40GB", 2500, 2, 40, candidates, None)]
    for _ in range(2):
        num_decoders = rng.randint(1, 8)
        context = rng.randint(WARMUP_TOKENS + 1, 128 // num_decoders + 3)
        cases.append((rng.choice(["llama-3-8b", "llama-2-7b"]), rng.choice(sorted(PROFILES)),
                      rng.randint(1500, 4000), num_decoders, context, rng.sample(candidates, 4), rng.randint(0, 3)))
    return cases


def _gap_variants(model, hw, prompt_len, chunk, n, ctx):
    """Wrong ways to price the worst step, to name a wrong gap: {why: seconds}."""
    from ..sim.simulator import predict_step
    steps, done, k = [], 0, 0
    while done < prompt_len:                      # the chunk steps as the learner should build them
        m = min(chunk, prompt_len - done)
        steps.append([(m, done, done + m == prompt_len)] + [(1, ctx + k, True)] * n)
        done, k = done + m, k + 1
    price = lambda step: predict_step(model, step, hw).total
    return {"That is the FIRST chunk's step: later chunks attend over more cached keys, so the slowest step "
            "comes later. ": price(steps[0]),
            "That is the LAST chunk's step, and here the last chunk is a short remainder "
            f"({prompt_len} = {len(steps) - 1} x {chunk} + {steps[-1][0][0]}): the full chunk before it does "
            "more work. The slowest step is not always the last one. ": price(steps[-1]),
            "Your steps leave out the decodes: every step of the prefill carries one token per stream. ":
                max(price(step[:1]) for step in steps),
            "Under chunked prefill a stream's decode rides in every chunk's step: its gap is ONE step, not a "
            "chunk's step plus a decode step. ": max(price(step) for step in steps) + price(steps[0][1:])}


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
        measured = {c: _simulated_worst_gap(model, hw, prompt_len, c, n, ctx) for c in candidates}
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
        if chunk in measured and units_hint(gap_s, measured[chunk]):
            _fail(f"{units_hint(gap_s, measured[chunk])}{call}: you predict a worst gap of {gap_s!r} s for chunk "
                  f"{chunk}; the simulator measures {measured[chunk]:.6f} s (and gap_slo_s is in seconds too)")
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
                variants = _gap_variants(model, hw, prompt_len, chunk, n, ctx) if _number(gap_s) else {}
                hint = next((why for why, s in variants.items() if math.isclose(gap_s, s, rel_tol=1e-6)), "") or (
                    f"Measured, chunk {chunk}'s worst gap is {measured[chunk] * 1e3:.2f} ms, over the target: is "
                    "the step you priced the slowest one the streams sit through? ")
            elif chunk in measured:
                hint = ("A larger candidate meets the target too: the largest chunk that meets it gives the long "
                        "prompt the fewest steps, so the best TTFT. ")
            _fail(f"{hint}{call} chose {chunk!r}; the simulator measures worst gaps {table} for a "
                  f"{slo_s * 1e3:.2f} ms target, so {expected_chunk}")
        truth = measured[expected_chunk]
        if not _number(gap_s) or abs(gap_s - truth) > GAP_TOLERANCE * truth:
            hint = ""
            if _number(gap_s):
                variants = _gap_variants(model, hw, prompt_len, chunk, n, ctx)
                hint = next((why for why, s in variants.items() if math.isclose(gap_s, s, rel_tol=1e-6)), "")
            _fail(f"{hint}{call}: right chunk ({chunk}), but you predict a worst gap of {gap_s!r} s and the "
                  f"simulator measures {truth:.6f} s (tolerance {GAP_TOLERANCE:.0%})")
    return passed(f"chunk_for_gap_slo: {len(cases)} targets, your chunks and worst gaps match the simulator's "
                  f"within {GAP_TOLERANCE:.0%}")
