"""Chapters 6-8's checkers (chapter 5's: tests/test_grading_ch01_05.py): a correct answer passes, every shortcut fails with a message that
names the mistake, and the chapter's own printed code does not pass the transfer tasks.

For each checker, a correct function and shortcut attempts: the engine's own function,
skipping the method, a hard-coded value, wrong-but-close variants, and (for the tasks
that go past the chapter) the code the chapter prints, adapted to the task's signature.
A last test holds that a learner who copies the chapter's printed code can earn at most
half of each chapter's points.
"""
import ast
import math
import random
import re
from pathlib import Path

import pytest

import minillm
import minillm.grading as ex
from minillm import prefix_cache
from minillm.grading import ch06, ch07, ch08
from minillm.grading._reference import ch06 as ref06
from minillm.grading._reference import ch07 as ref07
from minillm.grading._reference import ch08 as ref08
from minillm.prefix_cache import ROOT_HASH, hash_block
from minillm.request import RequestMetrics
from minillm.sim.simulator import predict_step

ROOT = Path(__file__).resolve().parents[1]


def printed(chapter: str, name: str):
    """A function the chapter prints, taken from its source (notebooks/src/NN_*.py) and
    defined here on its own, as a learner who copies it would have it."""
    source = next((ROOT / "notebooks" / "src").glob(f"{chapter}_*.py")).read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = {}
    module = ast.fix_missing_locations(ast.Module(
        [ast.Import([ast.alias("hashlib")]), ast.ImportFrom("array", [ast.alias("array")], 0), node], []))
    exec(compile(module, f"<chapter {chapter}>", "exec"), namespace)
    return namespace[name]


# ---- correct answers (the tests' own; the notebooks have theirs) --------------------------
def schedule(decoding, prefilling, chunk_size, token_budget):
    plan = [(rid, 1) for rid in decoding]
    left = chunk_size if token_budget is None else min(chunk_size, token_budget - len(decoding))
    for rid, tokens_left in prefilling:
        if left <= 0:
            break
        plan.append((rid, min(tokens_left, left)))
        left -= min(tokens_left, left)
    return plan


def stream_metrics(arrival, times):
    itl = [b - a for a, b in zip(times, times[1:])]
    return {"ttft": times[0] - arrival, "tpot": sum(itl) / len(itl) if itl else None, "itl": itl}


def prefill_steps(prompt_len, chunk_size, num_decoding, token_budget):
    per_step = chunk_size if token_budget is None else min(chunk_size, token_budget - num_decoding)
    return math.ceil(prompt_len / per_step)


def equal_work(prompt_len, chunk_size, break_even):
    return _equal_work_with(prompt_len, chunk_size, lambda m: m * break_even + m * (m + 1) // 2)


def _equal_work_with(prompt_len, chunk_size, work):
    num_chunks, total = math.ceil(prompt_len / chunk_size), work(prompt_len)
    ends = []
    for k in range(1, num_chunks):
        m = ends[-1] if ends else 0
        while work(m) * num_chunks < k * total:
            m += 1
        ends.append(m)
    return [b - a for a, b in zip([0] + ends, ends + [prompt_len])]


def _rounded_down(prompt_len, chunk_size, break_even):
    # boundary = the LAST m whose work stays below the share: one token short
    sizes = equal_work(prompt_len, chunk_size, break_even)
    ends = [sum(sizes[:i + 1]) for i in range(len(sizes))]
    ends = [e - 1 if 0 < i < len(ends) - 1 or (i == 0 and len(ends) > 1) else e for i, e in enumerate(ends)]
    return [b - a for a, b in zip([0] + ends, ends)]


def decode_first(decoding, waiting, token_budget, max_num_seqs, at_least_one=True, fcfs=True, cap_decodes=True):
    if decoding:
        allowed = len(decoding) if token_budget is None or not cap_decodes else min(len(decoding), token_budget)
        return [(rid, 1) for rid in decoding[:allowed]]
    plan, used = [], 0
    for rid, prompt_len in waiting:
        if len(plan) >= max_num_seqs:
            break
        if (plan or not at_least_one) and token_budget is not None and used + prompt_len > token_budget:
            if fcfs:
                break
            continue
        plan.append((rid, prompt_len))
        used += prompt_len
    return plan


def stall(model, hw, prompt_len, n, ctx):
    return predict_step(model, [(prompt_len, 0)], hw).total + predict_step(model, [(1, ctx)] * n, hw).total


def choose(rows, slo_ms):
    ok = [r for r in rows if r["itl_max_s"] * 1e3 <= slo_ms]
    size = lambda r: math.inf if r["chunk_size"] == "off" else r["chunk_size"]
    return min(ok, key=lambda r: (r["long_ttft_s"], size(r)))["chunk_size"] if ok else None


def _steps(prompt_len, chunk_size, num_decoders, ctx, decodes=True):
    done, k = 0, 0
    while done < prompt_len:
        n = min(chunk_size, prompt_len - done)
        yield [(n, done, done + n == prompt_len)] + ([(1, ctx + k, True)] * num_decoders if decodes else [])
        done, k = done + n, k + 1


def expected_ttft(model, hardware, prompt_len, chunk_size, num_decoders, ctx):
    return sum(predict_step(model, s, hardware).total for s in _steps(prompt_len, chunk_size, num_decoders, ctx))


def goodput(outputs, ttft_slo_s, tpot_slo_s, finished_only=True):
    done = [o for o in outputs if o.finished or not finished_only]
    span = max(o.metrics.finish_time or 0.0 for o in done) - min(o.metrics.arrival_time for o in done)
    good = [o for o in done if o.metrics.ttft <= ttft_slo_s
            and (o.metrics.tpot is None or o.metrics.tpot <= tpot_slo_s)]
    return len(good) / span


def _ttft_then_size(row):
    return row["long_ttft_s"], math.inf if row["chunk_size"] == "off" else row["chunk_size"]


def _finished_span(outputs):
    done = [o for o in outputs if o.finished]
    return max(o.metrics.finish_time for o in done) - min(o.metrics.arrival_time for o in done)


def decode_floor(cfg, hw, dtype_bytes=2):
    return cfg.num_parameters() * dtype_bytes / hw.mem_bandwidth_bytes_s


def gap_chunk(model, hw, prompt_len, n, ctx, slo_s, candidates, decodes=True, last_only=False, first_only=False):
    for chunk in sorted(candidates, reverse=True):
        times = [predict_step(model, s, hw).total for s in _steps(prompt_len, chunk, n, ctx, decodes)]
        worst = times[-1] if last_only else times[0] if first_only else max(times)
        if worst <= slo_s:
            return chunk, worst
    return None, None


def chain(tokens, block_size):
    hashes, parent = [], ROOT_HASH
    for start in range(0, len(tokens) // block_size * block_size, block_size):
        parent = hash_block(parent, tokens[start:start + block_size])
        hashes.append(parent)
    return hashes


def to_compute(prompt_len, cached_blocks, block_size):
    return prompt_len - min(cached_blocks * block_size, (prompt_len - 1) // block_size * block_size)


def plan_step(prompt_lens, chunk_size, threshold):
    left, plan = chunk_size, []
    for n in prompt_lens:
        take = min(n, left, threshold) if threshold > 0 else min(n, left)
        plan.append(take)
        left -= take
    return plan


def rate(attainment, target):
    best = 0.0
    for r in sorted(attainment):
        if attainment[r] < target:
            break
        best = r
    return best


def evictions(tables, finish_order, num_clean, num_needed, tail_first=True, ref_counts=True, clean_first=True):
    holders = {}
    for table in tables.values():
        for block in table:
            holders[block] = holders.get(block, 0) + 1
    lru = []
    for rid in finish_order:
        for block in (reversed(tables[rid]) if tail_first else tables[rid]):
            holders[block] -= 1
            if (holders[block] == 0 or not ref_counts) and block not in lru:
                lru.append(block)
    return lru[:max(0, num_needed - num_clean)] if clean_first else lru[:num_needed]


def saved(system_len, user_lens, block_size, rule=to_compute, first_pays=True):
    return [rule(system_len + u, 0 if (i == 0 and first_pays) else system_len // block_size, block_size)
            for i, u in enumerate(user_lens)]


def _engine_metrics(arrival, times):
    m = RequestMetrics(arrival_time=arrival, first_token_time=times[0], token_times=list(times), finish_time=times[-1])
    return {"ttft": m.ttft, "tpot": m.tpot, "itl": m.itl}


def _skips_big_prompt(decoding, prefilling, chunk_size, token_budget):
    """Packs whichever prompts fit whole: not first come, first served."""
    plan, left = [(rid, 1) for rid in decoding], chunk_size
    if token_budget is not None:
        left = min(left, token_budget - len(decoding))
    for rid, tokens_left in prefilling:
        if tokens_left <= left:
            plan.append((rid, tokens_left))
            left -= tokens_left
    return plan


def _chapter7_goodput(outputs, ttft_slo_s, tpot_slo_s):
    """Chapter 7's printed goodput (cell 'def goodput(result, ...)') on a list of outputs:
    it filters the finished requests but divides by the whole run's duration."""
    outs = [o for o in outputs if o.finished]
    ok = [o for o in outs if o.metrics.ttft <= ttft_slo_s and (o.metrics.tpot or 0) <= tpot_slo_s]
    return len(ok) / max(o.metrics.finish_time for o in outs)


def _chapter8_hashes_for_saving(system_len, user_lens, block_size):
    """Chapter 8's chained_hashes and max_cached_tokens, copied: every chat after the first
    matched against the first chat's chain of hashes, token for token."""
    chained = printed("08", "chained_hashes")
    rng = random.Random(0)
    system = [rng.randrange(1000) for _ in range(system_len)]
    first = chained(system + [1000 + rng.randrange(1000) for _ in range(user_lens[0])], block_size)
    counts = [system_len + user_lens[0]]
    for u in user_lens[1:]:
        prompt = system + [1000 + rng.randrange(1000) for _ in range(u)]
        mine = chained(prompt, block_size)
        hit = sum(1 for a, b in zip(mine, first) if a == b) * block_size
        counts.append(len(prompt) - hit)                # no cap at the last prompt token
    return counts


# ---- the table: checker, correct answer, shortcuts (name, function, what the message says) --
CASES = {
    "check_schedule_chunked": (schedule, [
        ("engine", lambda *a: ref06.engine_schedule_chunked(*a), "engine's own answer"),
        ("chunk_per_request", lambda d, p, c, b: [(r, 1) for r in d] + [(r, min(n, c)) for r, n in p], "chunk_size"),
        ("ignores_budget", lambda d, p, c, b: schedule(d, p, c, None), "token_budget"),
        ("prefill_before_decodes", lambda d, p, c, b: schedule([], p, c if b is None else min(c, b), None)
         + [(r, 1) for r in d], "before any prompt"),
        ("overgrants", lambda d, p, c, b: [(r, 1) for r in d] + ([(p[0][0], c)] if p else []), "over token_budget"),
        ("skips_big_prompt", _skips_big_prompt, "as many tokens as the step has left"),
        ("zero_entries", lambda d, p, c, b: schedule(d, p, c, b) + [(r, 0) for r, _ in p
                                                                  if r not in dict(schedule(d, p, c, b))],
         "leave out requests that get nothing"),
    ]),
    "check_stream_metrics": (stream_metrics, [
        ("engine", _engine_metrics, "engine's own answer"),
        ("tpot_over_all", lambda a, t: {**stream_metrics(a, t), "tpot": (t[-1] - a) / len(t) if len(t) > 1 else None},
         "AFTER the first"),
        ("itl_with_ttft", lambda a, t: {**stream_metrics(a, t), "itl": [t[0] - a] + stream_metrics(a, t)["itl"]},
         "TTFT, not an ITL"),
        ("tpot_zero_for_one_token", lambda a, t: {**stream_metrics(a, t), "tpot": stream_metrics(a, t)["tpot"] or 0.0},
         "tpot must be None"),
        ("ttft_from_zero", lambda a, t: {**stream_metrics(a, t), "ttft": t[0]}, "first token - arrival"),
    ]),
    "check_num_prefill_steps": (prefill_steps, [
        ("engine", lambda *a: ref06.engine_num_prefill_steps(*a), "engine's own answer"),
        ("ignores_decodes", lambda p, c, n, b: math.ceil(p / c), "decodes take their tokens first"),
        ("hard_coded", lambda p, c, n, b: 4, "decodes take their tokens first"),
        ("floor_division", lambda p, c, n, b: p // (c if b is None else min(c, b - n)), "round up"),
        ("budget_for_prefill_alone", lambda p, c, n, b: math.ceil(p / (c if b is None else min(c, b))),
         "token_budget - num_decoding"),
    ]),
    "check_equal_work_chunks": (equal_work, [
        ("engine", lambda *a: minillm.chunk_sizing.equal_work_chunks(*a), "engine's own answer"),
        ("fixed_tokens", lambda p, c, k: [c] * (p // c) + ([p % c] if p % c else []), "equal tokens is the fixed"),
        ("no_chunking", lambda p, c, k: [p], "as many chunks as"),
        ("too_many_chunks", lambda p, c, k: equal_work(p, c, k) + [0], "as many chunks as"),
        ("last_chunk_dropped", lambda p, c, k: equal_work(p, c, k)[:-1], "the chunks tile the prompt"),
        ("one_chunk_more", lambda p, c, k: equal_work(p, max(1, c - 1), k), "as many chunks as"),
        ("rounded_down", _rounded_down, "round up, not down"),
        ("no_own_key", lambda p, c, k: _equal_work_with(p, c, lambda m: m * k + m * (m - 1) // 2), "own key"),
        ("hard_coded", lambda p, c, k: [327, 297, 275, 255, 241, 228, 218, 207], "add up to"),
    ]),
    "check_schedule_decode_first": (decode_first, [
        ("engine", lambda *a: list(ref06.engine_schedule_decode_first(*a).items()), "engine's own answer"),
        ("chunked_policy", lambda d, w, b, m: schedule(d, w, 512, b), "NOTHING is decoding"),
        ("chunks_prompts", lambda d, w, b, m: decode_first(d, w, b, m) if d or b is None else
         schedule([], w, b, None), "does not chunk"),
        ("no_first_prompt", lambda *a: decode_first(*a, at_least_one=False), "at least one prompt"),
        ("skips_big_prompt", lambda *a: decode_first(*a, fcfs=False), "First come, first served"),
        ("decodes_uncapped", lambda *a: decode_first(*a, cap_decodes=False), "token_budget"),
        ("no_seq_limit", lambda d, w, b, m: decode_first(d, w, b, 10**6), "max_num_seqs"),
    ]),
    "check_predicted_stall": (stall, [
        ("simulator", lambda *a: ref06.simulated_stall(*a), "engine's own answer"),
        ("prompt_step_only", lambda m, h, p, n, c: predict_step(m, [(p, 0)], h).total, "NEXT step"),
        ("decodes_ride_along", lambda m, h, p, n, c: predict_step(m, [(p, 0)] + [(1, c)] * n, h).total, "ALONE"),
        ("hard_coded", lambda *a: 0.2, "never call predict_step"),
    ]),
    "check_choose_chunk_size": (choose, [
        ("lab", lambda rows, slo: ref07.pick_chunk_size(rows, slo), "engine's own answer"),
        ("smallest_gap", lambda rows, slo: min(rows, key=lambda r: r["itl_max_s"])["chunk_size"] if
         any(r["itl_max_s"] * 1e3 <= slo for r in rows) else None, "smallest gap"),
        ("no_filter", lambda rows, slo: min(rows, key=_ttft_then_size)["chunk_size"] if rows else None,
         "filter first"),
        ("no_tie_break", lambda rows, slo: min((r for r in rows if r["itl_max_s"] * 1e3 <= slo),
                                              key=lambda r: r["long_ttft_s"], default={"chunk_size": None})
         ["chunk_size"], "tie-break"),
    ]),
    "check_expected_ttft": (expected_ttft, [
        ("simulator", lambda *a: ref07.engine_long_ttft(*a), "engine's own answer"),
        ("no_decodes", lambda m, h, p, c, n, ctx: expected_ttft(m, h, p, c, 0, ctx), "should be"),
        ("one_step", lambda m, h, p, c, n, ctx: expected_ttft(m, h, p, p, n, ctx), "steps, one call each"),
        ("contexts_one_ahead", lambda m, h, p, c, n, ctx: expected_ttft(m, h, p, c, n, ctx + 1), "should be"),
        ("hard_coded", lambda *a: 0.25, "sum predict_step"),
    ]),
    "check_goodput": (goodput, [
        ("summarize", lambda o, a, b: minillm.metrics.summarize(o, a, b)["goodput_req_s"], "engine's own answer"),
        ("throughput", lambda o, a, b: goodput(o, math.inf, math.inf), "meeting both SLOs"),
        ("span_from_zero", lambda o, a, b: goodput(o, a, b) * _finished_span(o)
         / max(x.metrics.finish_time for x in o if x.finished), "starts at 0"),
        ("one_token_fails", lambda o, a, b: sum(x.finished and x.metrics.ttft <= a and x.metrics.tpot is not None
                                                 and x.metrics.tpot <= b for x in o) / _finished_span(o), "1-token"),
        ("ignores_finished", lambda o, a, b: goodput(o, a, b, finished_only=False), "not finished"),
        ("ignores_finished_crashes", lambda o, a, b: sum(1 for x in o) / (max(x.metrics.finish_time for x in o)
                                                                          - min(x.metrics.arrival_time for x in o)),
         "not finished"),
    ]),
    "check_decode_floor": (decode_floor, [
        ("bf16_always", lambda cfg, hw, d=2: decode_floor(cfg, hw, 2), "bytes"),
    ]),
    "check_chunk_for_gap_slo": (gap_chunk, [
        ("simulator", lambda *a: ref07.chunk_for_gap_slo(*a), "engine's own answer"),
        ("no_decodes", lambda *a: gap_chunk(*a, decodes=False), "leave out the decodes"),
        ("first_chunk", lambda *a: gap_chunk(*a, first_only=True), "slowest step"),
        ("smallest_chunk", lambda m, h, p, n, c, s, cands: (min(cands), gap_chunk(m, h, p, n, c, 1e9, [min(cands)])[1]),
         "largest chunk that meets it"),
        ("hard_coded", lambda *a: (512, 0.02), "never call predict_step"),
        ("gap_off", lambda *a: (lambda r: (r[0], r[1] * 1.1 if r[1] else r[1]))(gap_chunk(*a)), "2%"),
    ]),
    "check_chain_hashes": (chain, [
        ("engine", lambda t, bs: prefix_cache.block_hashes(t, bs), "engine's own answer"),
        ("unchained", lambda t, bs: [hash_block(ROOT_HASH, t[i:i + bs]) for i in range(0, len(t) // bs * bs, bs)],
         "the first wrong one"),
    ]),
    "check_tokens_to_compute": (to_compute, [
        ("engine", lambda p, c, bs: p - min(c * bs, prefix_cache.max_cached_tokens(p, bs)), "engine's own answer"),
        ("forgets_last_token", lambda p, c, bs: p - c * bs, "never the prompt's last token"),
    ]),
    "check_plan_prefill_step": (plan_step, [
        ("no_cap", lambda lens, c, t: plan_step(lens, c, 0), "no prompt above the threshold"),
    ]),
    "check_goodput_rate": (rate, [
        ("best_anywhere", lambda d, t: max([r for r, a in d.items() if a >= t], default=0.0), "stop at the first"),
    ]),
    "check_eviction_order": (evictions, [
        ("engine", lambda *a: ref08.engine_eviction_order(*a), "engine's own answer"),
        ("head_first", lambda *a: evictions(*a, tail_first=False), "tail first"),
        ("no_ref_counts", lambda *a: evictions(*a, ref_counts=False), "LAST holder"),
        ("evicts_before_clean", lambda *a: evictions(*a, clean_first=False), "Clean blocks are taken"),
    ]),
    "check_prefill_tokens_saved": (saved, [
        ("engine", lambda *a: ref08.engine_prefill_tokens(*a), "engine's own answer"),
        ("partial_block_shared", lambda s, u, bs: [s + x if i == 0 else x for i, x in enumerate(u)], "whole blocks"),
        ("no_last_token_rule", lambda s, u, bs: saved(s, u, bs, rule=lambda p, c, b: p - c * b), "last prompt token"),
        ("no_cache", lambda s, u, bs: [s + x for x in u], "reuse the system prompt"),
        ("first_also_hits", lambda s, u, bs: saved(s, u, bs, first_pays=False), "first chat finds nothing"),
        ("chapter_code", _chapter8_hashes_for_saving, "last prompt token"),
    ]),
}

# The chapters' printed code, adapted to a task's signature, on the tasks that go past the chapter.
PRINTED_ON_TRANSFER = [
    ("check_predicted_stall", lambda m, h, p, n, c: predict_step(m, [(p, 0)], h).total),   # "one whole prefill"
    ("check_schedule_decode_first", lambda d, w, b, m: schedule(d, w, 512, b)),   # the chunked policy, unchanged
    ("check_chunk_for_gap_slo", lambda *a: gap_chunk(*a, decodes=False)),    # chapter 7 prices chunks alone
    ("check_prefill_tokens_saved", _chapter8_hashes_for_saving),
    ("check_eviction_order", lambda *a: evictions(*a, tail_first=False, ref_counts=False)),   # a plain LRU
]

# Per chapter, the tasks a learner can finish by copying what the chapter prints (its
# sketches, the engine code it renders, its formulas in prose): at most half the points.
COPYABLE = {
    "06": {"check_schedule_chunked", "check_stream_metrics", "check_num_prefill_steps", "check_equal_work_chunks"},
    "07": {"check_decode_floor", "check_choose_chunk_size", "check_goodput", "check_expected_ttft"},
    "08": {"check_chain_hashes", "check_tokens_to_compute", "check_plan_prefill_step", "check_goodput_rate"},
}
MODULES = {"06": ch06, "07": ch07, "08": ch08}   # chapter 5: tests/test_grading_ch01_05.py


def test_every_chapter_5_to_8_checker_is_tested_here():
    for module in MODULES.values():
        assert set(module.__all__) <= set(CASES), f"{module.__name__}: a checker without a case here"
    assert set(CASES) == {name for module in MODULES.values() for name in module.__all__}


@pytest.mark.parametrize("checker", sorted(CASES))
def test_a_correct_answer_passes(checker, capsys):
    assert getattr(ex, checker)(CASES[checker][0], seed=3) is None
    out = capsys.readouterr().out
    assert out.startswith("✓") and out.count("\n") == 1, out


SHORTCUTS = [(checker, name, fn, says) for checker, (_, attempts) in sorted(CASES.items())
             for name, fn, says in attempts]


@pytest.mark.parametrize("checker, name, fn, says", SHORTCUTS, ids=[f"{c}-{n}" for c, n, _, _ in SHORTCUTS])
def test_a_shortcut_fails_with_a_helpful_message(checker, name, fn, says, capsys):
    with pytest.raises(AssertionError) as failure:
        getattr(ex, checker)(fn, seed=3)
    first_line = str(failure.value).splitlines()[0]
    assert says in first_line, f"{checker} on {name!r}: the message does not point at the mistake: {first_line}"
    assert failure.value._render_traceback_()[0] == "Not yet: " + first_line
    assert "Not yet" not in capsys.readouterr().out


@pytest.mark.parametrize("checker, fn", PRINTED_ON_TRANSFER, ids=[c for c, _ in PRINTED_ON_TRANSFER])
def test_the_chapters_printed_code_does_not_pass_the_transfer_tasks(checker, fn):
    with pytest.raises(AssertionError):
        getattr(ex, checker)(fn)
    with pytest.raises(AssertionError):
        getattr(ex, checker)(fn, seed=11)


def test_the_chapters_sketches_still_are_what_the_transfer_tests_copy():
    # if a chapter renames or drops what it prints, the copies above must follow it
    assert printed("08", "chained_hashes")(list(range(40)), 16) == chain(list(range(40)), 16)


def _points(chapter: str) -> dict:
    source = next((ROOT / "exercises" / "solutions" / "src").glob(f"{chapter}_*.py")).read_text()
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"ex\.(check_\w+)\(.*#\s*points:\s*(\d+)", source)}


@pytest.mark.parametrize("chapter", sorted(COPYABLE))
def test_copying_the_chapter_earns_at_most_half_the_points(chapter):
    points = _points(chapter)
    assert set(points) == set(MODULES[chapter].__all__), "every checker is a graded task of its notebook"
    transfer = set(points) - COPYABLE[chapter]
    assert transfer & {c for c, _ in PRINTED_ON_TRANSFER}, "a transfer task the printed code is tried on"
    assert sum(points[c] for c in COPYABLE[chapter]) * 2 <= sum(points.values())


@pytest.mark.parametrize("chapter", sorted(COPYABLE))
def test_each_chapter_has_a_predict_then_measure_task(chapter):
    measured = {"06": "check_predicted_stall",
                "07": "check_chunk_for_gap_slo", "08": "check_prefill_tokens_saved"}[chapter]
    assert measured in _points(chapter) and measured not in COPYABLE[chapter]


# ---- the references and the measurements the checkers rest on --------------------------------
def test_the_engines_plans_meet_the_invariants_the_checker_states():
    rng = random.Random(0)
    for _ in range(200):
        state = ch06._random_state(rng)
        plan = list(ref06.engine_schedule_chunked(*state, rng=rng).items())
        assert ch06._check_plan_invariants(plan, *state) is None


def test_the_engines_step_count_matches_the_articles_example():
    # A 2048-token prompt in 512-token chunks needs 4 steps, decodes riding along.
    assert ref06.engine_num_prefill_steps(2048, 512, 4, None) == 4
    # With a budget of 516 and 8 streams, each step has 508 prefill tokens left.
    assert ref06.engine_num_prefill_steps(2048, 512, 8, 516) == math.ceil(2048 / 508)


def test_the_simulated_stall_is_the_prompt_step_plus_the_next_decode_step():
    measured = ref06.simulated_stall("llama-3-8b", "A100-80GB", 2048, 4, 72)
    assert math.isclose(measured, stall("llama-3-8b", "A100-80GB", 2048, 4, 72), rel_tol=1e-6)


def test_the_eviction_reference_follows_the_block_managers_rules():
    # shared head [0, 1] leaves with its last holder; a request's tail goes first; clean blocks first
    assert ref08.engine_eviction_order({"a": [0, 1, 2], "b": [0, 1, 3], "c": [4]}, ["a", "c", "b"], 2, 5) == [2, 4, 3]
    assert ref08.engine_eviction_order({"a": [0, 1], "b": [0, 1, 2]}, ["a"], 0, 0) == []


def test_the_prefill_reference_counts_whole_blocks_and_the_last_token():
    # 40-token system prompt, blocks of 16: two shared blocks; a chat that is the system
    # prompt alone recomputes its last block (8 tokens)
    assert ref08.engine_prefill_tokens(40, [3, 0, 10, 5], 16) == [43, 8, 18, 13]


def test_goodput_loads_hold_unfinished_requests_that_would_look_good():
    # without them, a goodput that ignores o.finished passed (issue 30)
    with pytest.raises(AssertionError, match="not finished"):
        ex.check_goodput(lambda o, a, b: goodput(o, a, b, finished_only=False))
