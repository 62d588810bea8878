"""Chapters 6, 7, 8 and 10's checkers (issue 39): a correct answer passes; every shortcut, every
usual slip, the chapter's printed code and a transcription of the statement fail, each with a
message that names the mistake; at most 20% of a notebook's points can be earned by copying;
each notebook has a predict-then-measure task and a debug or design task; the public checkers
do not import the reference answers; the hidden cases pass the reference and fail the slips.

Cost: about 17 s of CPU on one core (the gap and TTFT checkers simulate; everything else is
arithmetic or the engine's scheduler with a model-free executor); the learner trial's findings
(notes/trial_6_10.md), tested at the end, add about 2 s of it.
"""
import ast
import hashlib
import importlib
import json
import math
import os
import random
import re
from pathlib import Path

import pytest

import minillm.grading as ex
from minillm import prefix_cache
from minillm.chunk_sizing import prefill_work
from minillm.grading import ch06, ch07, ch08, ch10
from minillm.grading._common import ExerciseFailed
from minillm.grading._reference import ch06 as ref06
from minillm.grading._reference import ch07 as ref07
from minillm.grading._reference import ch08 as ref08
from minillm.grading._reference import ch10 as ref10
from minillm.prefix_cache import ROOT_HASH, hash_block
from minillm.request import RequestMetrics
from minillm.serve.bench_client import RequestRecord, group_metrics
from minillm.sim.accounting import step_cost
from minillm.sim.simulator import predict_step

ROOT = Path(__file__).resolve().parents[1]
MODULES = {"06": ch06, "07": ch07, "08": ch08, "10": ch10}


# ---- what a learner could copy: the chapter's printed functions, the exercise's own cells ----
def _function_from(path: Path, name: str, namespace: dict):
    """A top-level function of a percent source, defined on its own, as a learner who copies it has it."""
    node = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = dict(namespace)
    exec(compile(ast.Module([node], []), f"<{path.name}:{name}>", "exec"), namespace)
    return namespace[name]


def printed(chapter: str, name: str, **namespace):
    """A function the chapter prints (notebooks/src/NN_*.py)."""
    return _function_from(next((ROOT / "notebooks" / "src").glob(f"{chapter}_*.py")), name, namespace)


def colleague(chapter: str, name: str):
    """The broken function a debug task hands the learner (not an answer: the learner copy shows it)."""
    return _function_from(next((ROOT / "exercises" / "solutions" / "src").glob(f"{chapter}_*.py")), name,
                          {"json": json})


def _message(checker: str, fn, seed=3, **kwargs) -> str:
    with pytest.raises(ExerciseFailed) as failure:
        getattr(ex, checker)(fn, seed=seed, **kwargs)
    return str(failure.value).splitlines()[0]


# ---- chapter 6: wrong variants --------------------------------------------------------------
def schedule_with(decoding, prefilling, chunk_size, token_budget, share_budget=True, fcfs=True, zeros=False,
                  per_request=False):
    plan = [(rid, 1) for rid in decoding]
    room = chunk_size if token_budget is None else min(chunk_size, token_budget - (len(decoding) if share_budget else 0))
    for rid, tokens_left in (prefilling if fcfs else sorted(prefilling, key=lambda p: p[1])):
        take = min(tokens_left, chunk_size if per_request else room)
        if take > 0 or zeros:
            plan.append((rid, take))
        room -= take
    return plan


def passes_with(policy, prompt_len, steps_left, chunk_size, token_budget, rounding=math.ceil, streams_finish=True,
                cpf_shares=False, leave_shift=0):
    if policy == "prefill_first":
        return 1
    if policy == "decode_first":
        return max(steps_left, default=0) + 1
    done, steps = 0, 0
    shares = []
    while done < prompt_len:
        steps += 1
        share = chunk_size if token_budget is None else token_budget
        if token_budget is not None and (policy == "chunked" or cpf_shares):
            share -= sum(1 for k in steps_left if k >= steps + leave_shift or not streams_finish)
        share = min(chunk_size, share)
        shares.append(share)
        done += share
    exact = steps - 1 + (prompt_len - (done - shares[-1])) / shares[-1]
    return rounding(exact)


def _chapter6_chunk_ranges():
    from minillm.kv_cache import BlockManager
    from minillm.request import Request, SamplingParams
    from minillm.scheduler import Scheduler, SchedulerConfig
    return printed("06", "chunk_ranges", Scheduler=Scheduler, SchedulerConfig=SchedulerConfig,
                   BlockManager=BlockManager, Request=Request, SamplingParams=SamplingParams)


def greedy_chunks(prompt_len, break_even, max_work, contexts, decodes=True, grow=True, decode_price=None):
    decode_price = decode_price or (lambda c, k, be: prefill_work(c + (k if grow else 0), 1, be))
    sizes, start = [], 0
    while start < prompt_len:
        k = len(sizes)
        room = max_work - (sum(decode_price(c, k, break_even) for c in contexts) if decodes else 0)
        n = 1
        while start + n < prompt_len and prefill_work(start, n + 1, break_even) <= room:
            n += 1
        sizes.append(n)
        start += n
    return sizes


def equal_chunks_for_the_last_step(prompt_len, break_even, max_work, contexts):
    """Equal-token chunks, as many as it takes for the slowest (the last) to fit."""
    for m in range(1, prompt_len + 1):
        size = -(-prompt_len // m)
        sizes = [size] * (prompt_len // size) + ([prompt_len % size] if prompt_len % size else [])
        start, ok = 0, True
        for k, n in enumerate(sizes):
            ok &= prefill_work(start, n, break_even) + sum(prefill_work(c + k, 1, break_even) for c in contexts) \
                <= max_work
            start += n
        if ok:
            return sizes
    return [1] * prompt_len


def chapter6_equal_work(prompt_len, break_even, max_work, contexts):
    """Section 7's idea, lifted: chunks of equal work, as few as the AVERAGE chunk allows."""
    from minillm.chunk_sizing import equal_work_chunks
    m = 1
    while prefill_work(0, prompt_len, break_even) / m + sum(prefill_work(c + m, 1, break_even) for c in contexts) \
            > max_work:
        m += 1
    return equal_work_chunks(prompt_len, -(-prompt_len // m), break_even)


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


def _engine_metrics(arrival, times):
    m = RequestMetrics(arrival_time=arrival, first_token_time=times[0], token_times=list(times), finish_time=times[-1])
    return {"ttft": m.ttft, "tpot": m.tpot, "itl": m.itl}


# ---- chapter 7: wrong variants --------------------------------------------------------------
def floor_from(weights_fn):
    return lambda cfg, hw, d=2: weights_fn(cfg) * d / hw.mem_bandwidth_bytes_s


def _steps(prompt_len, chunk, n, ctx, decodes=True, grow=True, all_sample=False, cached=True, decodes_sample=True,
           prompt_samples=True):
    done, k = 0, 0
    while done < prompt_len:
        m = min(chunk, prompt_len - done)
        yield ([(m, done if cached else 0, all_sample or (prompt_samples and done + m == prompt_len))]
               + ([(1, ctx + (k if grow else 0), decodes_sample)] * n if decodes else []))
        done, k = done + m, k + 1


def ttft_with(model, hw, prompt_len, chunk, n, ctx, **kwargs):
    return sum(predict_step(model, s, hw).total for s in _steps(prompt_len, chunk, n, ctx, **kwargs))


def gap_chunk(model, hw, prompt_len, n, ctx, slo_s, candidates, decodes=True, last_only=False, first_only=False,
              plus_decode_step=False):
    for chunk in sorted(candidates, reverse=True):
        times = [predict_step(model, s, hw).total for s in _steps(prompt_len, chunk, n, ctx, decodes)]
        worst = times[-1] if last_only else times[0] if first_only else max(times)
        if plus_decode_step:
            worst += predict_step(model, [(1, ctx, True)] * n, hw).total
        if worst <= slo_s:
            return chunk, worst
    return None, None


def goodput_with(outputs, ttft_slo_s, tpot_slo_s, finished_only=True, span_over_all=False):
    done = [o for o in outputs if o.finished or not finished_only]
    spanned = outputs if span_over_all else [o for o in outputs if o.finished]
    span = max(o.metrics.finish_time for o in outputs if o.finished) - min(o.metrics.arrival_time for o in spanned)
    good = [o for o in done if o.metrics.ttft <= ttft_slo_s and (o.metrics.tpot is None or o.metrics.tpot <= tpot_slo_s)]
    return len(good) / span


def _finished_span(outputs):
    done = [o for o in outputs if o.finished]
    return max(o.metrics.finish_time for o in done) - min(o.metrics.arrival_time for o in done)


def _chapter7_goodput(outputs, ttft_slo_s, tpot_slo_s):
    """Chapter 7's printed goodput (section 6) on a list of outputs: it filters the finished requests
    but divides by the whole run's duration, from 0."""
    outs = [o for o in outputs if o.finished]
    ok = [o for o in outs if o.metrics.ttft <= ttft_slo_s and (o.metrics.tpot or 0) <= tpot_slo_s]
    return len(ok) / max(o.metrics.finish_time for o in outs)


def _ttft_then_size(row):
    return row["long_ttft_s"], math.inf if row["chunk_size"] == "off" else row["chunk_size"]


# ---- chapter 8: wrong variants --------------------------------------------------------------
def salted_with(where):
    """Salt the chain in another place: 'root' (right), 'every' (also right), 'last' block, the 'prompt'
    itself (a per-prompt salt), or 'random' (not reproducible)."""
    def salted(tokens, block_size, salt=None):
        root = ROOT_HASH
        if salt is not None and where == "root":
            root = hashlib.sha256(ROOT_HASH + salt.encode()).digest()
        if salt is not None and where == "prompt":
            root = hashlib.sha256(ROOT_HASH + salt.encode() + repr(tokens).encode()).digest()
        if salt is not None and where == "random":
            root = os.urandom(32)
        if salt is not None and where == "concatenated":         # the trial's 08.1: b"" leaves ROOT_HASH as it is
            root = ROOT_HASH + salt.encode()
        hashes, parent = [], root
        full = len(tokens) // block_size
        for i in range(full):
            block = tokens[i * block_size:(i + 1) * block_size]
            extra = salt is not None and (where == "every" or (where == "last" and i == full - 1))
            salt_digest = hashlib.sha256(b"salt:" + salt.encode()).digest() if extra else b""
            parent = hash_block(parent + salt_digest, block)
            hashes.append(parent)
        return hashes
    return salted


def steps_with(prompt_lens, chunk_size, threshold, cap="per_prompt", base=1):
    left, steps, step = list(prompt_lens), [0] * len(prompt_lens), 0
    while any(left):
        step += 1
        room = min(chunk_size, threshold) if cap == "per_step" and threshold > 0 else chunk_size
        pending = [i for i, n in enumerate(left) if n]
        for i in pending:
            capped = threshold > 0 and cap in ("per_prompt", "while_waiting") and not (
                cap == "while_waiting" and len(pending) == 1)
            take = min(left[i], room, threshold if capped else room)
            left[i] -= take
            room -= take
            if not left[i]:
                steps[i] = step - 1 + base
    return steps


def threshold_with(long_len, shorts, chunk_size, max_steps, order="largest"):
    fits = lambda t: max(ref08.first_token_steps([long_len, *shorts], chunk_size, t)[1:]) <= max_steps
    if order == "fcfs_only":
        return 0
    if fits(0):
        return 0
    candidates = range(chunk_size - 1, 0, -1) if order == "largest" else range(1, chunk_size)
    return next((t for t in candidates if fits(t)), None)


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


def saved(system_len, user_lens, block_size, rule=ref08.tokens_to_compute, first_pays=True):
    return [rule(system_len + u, 0 if (i == 0 and first_pays) else system_len // block_size, block_size)
            for i, u in enumerate(user_lens)]


def _chapter8_hashes_for_saving(system_len, user_lens, block_size):
    """Chapter 8's chained_hashes, copied: every chat after the first matched against the first
    chat's chain, token for token, with no cap at the last prompt token."""
    chained = printed("08", "chained_hashes", hashlib=hashlib, array=__import__("array").array)
    rng = random.Random(0)
    system = [rng.randrange(1000) for _ in range(system_len)]
    first = chained(system + [1000 + rng.randrange(1000) for _ in range(user_lens[0])], block_size)
    counts = [system_len + user_lens[0]]
    for u in user_lens[1:]:
        prompt = system + [1000 + rng.randrange(1000) for _ in range(u)]
        hit = sum(1 for a, b in zip(chained(prompt, block_size), first) if a == b) * block_size
        counts.append(len(prompt) - hit)
    return counts


def _chapter8_chained_with_salt(tokens, block_size, salt=None):
    """Chapter 8's chained_hashes pasted, the salt ignored."""
    return printed("08", "chained_hashes", hashlib=hashlib, array=__import__("array").array)(tokens, block_size)


# ---- chapter 10: wrong variants -------------------------------------------------------------
def chunk_times_by_text(events):
    out = []
    for t, line in events:
        if line.startswith("data: {"):
            choice = (json.loads(line[6:]).get("choices") or [{}])[0]
            if choice.get("text") or (choice.get("delta") or {}).get("content"):
                out.append(t)
    return out


def chunk_times_without_the_finish(events):
    """The trial's 10.1: a chunk that carries finish_reason is taken for the end of the stream."""
    out = []
    for t, line in events:
        if line.startswith("data: {"):
            choices = json.loads(line[6:]).get("choices") or []
            if choices and choices[0].get("finish_reason") is None:
                out.append(t)
    return out


def chunk_times_with_usage(events):
    return [t for t, line in events if line.startswith("data: {")]


def chapter10_cell(events):
    """Chapter 10's section 2 cell, adapted to (time, line) pairs: it read a stream with no blank
    lines and no comments (it dropped them itself)."""
    chunks = [(t, json.loads(e[6:])) for t, e in events if e != "data: [DONE]"]
    return [t for t, c in chunks if c["choices"]]


def chunk_times_text_field(events):
    """Reads choices[0]['text']: right for /v1/completions, a crash on chat streams."""
    out = []
    for t, line in events:
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            if chunk["choices"]:
                _ = chunk["choices"][0]["text"]
                out.append(t)
    return out


def metrics_with(per_chunk_tpot=False, first_zeros=True, even=True):
    def metrics(start_s, chunk_times, tokens_per_chunk):
        m = ref10.client_metrics(start_s, chunk_times, tokens_per_chunk)
        n = len(chunk_times)
        if per_chunk_tpot:
            m["tpot"] = (chunk_times[-1] - chunk_times[0]) / (n - 1) if n > 1 else None
        if not first_zeros:
            m["itl_per_token"] = m["itl_per_token"][tokens_per_chunk[0] - 1:]
        if not even:
            per_token = [0.0] * (tokens_per_chunk[0] - 1)
            for gap, k in zip(m["itl"], tokens_per_chunk[1:]):
                per_token += [0.0] * (k - 1) + [gap]
            m["itl_per_token"] = per_token
        return m
    return metrics


def metrics_from_the_client(start_s, chunk_times, tokens_per_chunk):
    record = RequestRecord("x", output_tokens=sum(tokens_per_chunk), ttft=chunk_times[0] - start_s,
                           latency=chunk_times[-1] - start_s, chunk_times=list(chunk_times))
    return {"ttft": record.ttft, "tpot": record.tpot, "itl": record.itl,
            "itl_per_token": ref10.client_metrics(start_s, chunk_times, tokens_per_chunk)["itl_per_token"]}


def guidellm_with(swapped=False, extra_gap=False, seconds=False):
    def convert(itl_ms, tpot_ms, n):
        right = ref10.vllm_from_guidellm(itl_ms, tpot_ms, n)
        if swapped:
            right["tpot_ms"] = tpot_ms
        if extra_gap and n > 1:
            right["ttft_ms"] = right["e2el_ms"] - n * itl_ms
        if seconds:
            right["ttft_ms"] /= 1e3
        return right
    return convert


def goodput_in_units(scale):
    def goodput(records, duration_s, slo_ms):
        good = 0
        for r in records:
            if r["success"]:
                n = r["output_tokens"]
                values = {"ttft": r["ttft"], "e2el": r["latency"],
                          "tpot": (r["latency"] - r["ttft"]) / (n - 1) if n > 1 else None}
                good += all(values[k] is None or scale * values[k] <= v for k, v in slo_ms.items())
        return good / duration_s
    return goodput


def goodput_strict_tpot(records, duration_s, slo_ms):
    good = 0
    for r in records:
        n = r["output_tokens"]
        if not r["success"] or ("tpot" in slo_ms and n < 2):
            continue
        values = {"ttft": r["ttft"], "e2el": r["latency"], "tpot": (r["latency"] - r["ttft"]) / max(n - 1, 1)}
        good += all(1e3 * values[k] <= v for k, v in slo_ms.items())
    return good / duration_s


def goodput_from_the_client(records, duration_s, slo_ms):
    objs = [RequestRecord("r", output_tokens=r["output_tokens"], ttft=r["ttft"], latency=r["latency"],
                          success=r["success"]) for r in records]
    return group_metrics(objs, duration_s, slo_ms)["goodput"]


def ratio_from_the_client(n, k):
    record = RequestRecord("x", output_tokens=n, ttft=0.1, latency=0.1 + (n - 1) * 0.01,
                           chunk_times=[0.1 + i * 0.01 for i in range(k - 1, n, k)])
    return sum(record.itl) / len(record.itl) / record.tpot


# ---- the table: checker -> (correct answer, [(name, attempt, what the first line says)]) ------
CASES = {
    # chapter 6
    "check_schedule_chunked": (ref06.schedule_chunked, [
        ("engine", lambda *a: list(ch06._engine_schedule_chunked(*a).items()), "engine's own answer"),
        ("colleague", colleague("06", "colleague_schedule_chunked"), "leave out requests that get nothing"),
        ("budget_not_shared", lambda *a: schedule_with(*a, share_budget=False), "take their"),
        ("shortest_first", lambda *a: schedule_with(*a, fcfs=False), "first come, first served"),
        ("zero_entries", lambda *a: schedule_with(*a, zeros=True), "leave out requests that get nothing"),
        ("chunk_per_request", lambda *a: schedule_with(*a, per_request=True), "all prompts together"),
        ("prefill_before_decodes", lambda d, p, c, b: schedule_with([], p, c if b is None else min(c, b - len(d)), None)
         + [(r, 1) for r in d], "before any prompt"),
    ]),
    "check_stream_metrics": (ref06.stream_metrics, [
        ("engine", _engine_metrics, "engine's own answer"),
        ("tpot_over_all", lambda a, t: {**ref06.stream_metrics(a, t), "tpot": (t[-1] - a) / len(t) if len(t) > 1
                                        else None}, "whole E2E latency by the n tokens"),
        ("tpot_e2e_over_all_one_token_too", lambda a, t: {**ref06.stream_metrics(a, t), "tpot": (t[-1] - a) / len(t)},
         "whole E2E latency by the n tokens"),             # the trial's 06.2: not hidden behind "must be None"
        ("tpot_e2e_over_gaps", lambda a, t: {**ref06.stream_metrics(a, t), "tpot": (t[-1] - a) / (len(t) - 1)
                                             if len(t) > 1 else None}, "TTFT) is not a gap"),
        ("milliseconds", lambda a, t: {k: (None if v is None else [1e3 * x for x in v] if isinstance(v, list)
                                           else 1e3 * v) for k, v in ref06.stream_metrics(a, t).items()},
         "That is milliseconds"),
        ("itl_with_ttft", lambda a, t: {**ref06.stream_metrics(a, t), "itl": [t[0] - a] + ref06.stream_metrics(a, t)["itl"]},
         "TTFT, not an ITL"),
        ("tpot_zero_for_one_token", lambda a, t: {**ref06.stream_metrics(a, t),
                                                  "tpot": ref06.stream_metrics(a, t)["tpot"] or 0.0}, "tpot must be None"),
        ("ttft_from_zero", lambda a, t: {**ref06.stream_metrics(a, t), "ttft": t[0]}, "first token - arrival"),
    ]),
    "check_passes_to_first_token": (ref06.passes_to_first_token, [
        ("engine", lambda *a: ch06._engine_passes_to_first_token(*a), "engine's own answer"),
        ("statement_formula", lambda p, P, ks, C, B: math.ceil(P / C), "token_budget bounds the whole step"),
        ("floor", lambda *a: passes_with(*a, rounding=math.floor), "One step short"),
        ("plus_one", lambda *a: passes_with(*a, rounding=lambda x: int(x) + 1), "One step too many"),
        ("nearest", lambda *a: passes_with(*a, rounding=round), "nearest"),
        ("streams_never_finish", lambda *a: passes_with(*a, streams_finish=False), "finish while the prompt"),
        ("decode_first_waits_for_the_first", lambda p, P, ks, C, B: min(ks) + 1 if p == "decode_first"
         else ref06.passes_to_first_token(p, P, ks, C, B), "most steps left"),
        ("decode_first_no_own_step", lambda p, P, ks, C, B: max(ks, default=0) if p == "decode_first"
         else ref06.passes_to_first_token(p, P, ks, C, B), "step of its own"),
        ("cpf_shares_with_decodes", lambda *a: passes_with(*a, cpf_shares=True), "carry no decodes"),
        ("cpf_ignores_the_budget", lambda p, P, ks, C, B: math.ceil(P / C) if p == "chunked_prefill_first"
         else ref06.passes_to_first_token(p, P, ks, C, B), "bounds a prompt step too"),
        ("streams_leave_a_step_early", lambda *a: passes_with(*a, leave_shift=1), "Off by one on when a stream leaves"),
        ("streams_leave_a_step_late", lambda *a: passes_with(*a, leave_shift=-1), "Off by one on when a stream leaves"),
        ("prefill_first_in_chunks", lambda p, P, ks, C, B: math.ceil(P / C) if p == "prefill_first"
         else ref06.passes_to_first_token(p, P, ks, C, B), "runs whole"),
        ("chapter_chunk_ranges", lambda p, P, ks, C, B: len(_chapter6_chunk_ranges()(P, C)), "engine's own answer"),
        ("hard_coded", lambda *a: 4, "the engine took"),
    ]),
    "check_chunks_for_work_budget": (ref06.chunks_for_work_budget, [
        ("engine", lambda *a: ch06._fewest_steps_within(*a), "engine's own answer"),
        ("no_decodes", lambda *a: greedy_chunks(*a, decodes=False), "decodes"),
        ("decodes_do_not_grow", lambda *a: greedy_chunks(*a, grow=False), "grows by one token per step"),
        ("decode_forgets_its_own_key", lambda *a: greedy_chunks(*a, decode_price=lambda c, k, be: be + c + k),
         "sees its own key too"),                          # the trial's 06.4: was blamed on growth
        ("decode_matmul_only", lambda *a: greedy_chunks(*a, decode_price=lambda c, k, be: be), "A decode attends"),
        ("equal_chunks", equal_chunks_for_the_last_step, "Equal chunks sized"),
        ("chapter_equal_work", chapter6_equal_work, "engine's own answer"),
        ("one_chunk", lambda L, *a: [L], "units of work"),
        ("hard_coded", lambda *a: [256] * 8, "units of work"),
    ]),
    "check_schedule_decode_first": (ref06.schedule_decode_first, [
        ("engine", lambda *a: list(ch06._engine_schedule_decode_first(*a).items()), "engine's own answer"),
        ("chunked_policy", lambda d, w, b, m: ref06.schedule_chunked(d, w, 512, b), "NOTHING is decoding"),
        ("chunks_prompts", lambda d, w, b, m: decode_first(d, w, b, m) if d or b is None else
         ref06.schedule_chunked([], w, b, None), "does not chunk"),
        ("no_first_prompt", lambda *a: decode_first(*a, at_least_one=False), "at least one prompt"),
        ("skips_big_prompt", lambda *a: decode_first(*a, fcfs=False), "First come, first served"),
        ("decodes_uncapped", lambda *a: decode_first(*a, cap_decodes=False), "token_budget"),
        ("no_seq_limit", lambda d, w, b, m: decode_first(d, w, b, 10**6), "max_num_seqs"),
    ]),
    "check_predicted_stall": (ref06.predicted_stall, [
        ("simulator", lambda *a: ch06._simulated_stall(*a), "engine's own answer"),
        ("prompt_step_only", lambda m, h, p, n, c: predict_step(m, [(p, 0)], h).total, "NEXT step"),
        ("decodes_ride_along", lambda m, h, p, n, c: predict_step(m, [(p, 0)] + [(1, c)] * n, h).total, "ALONE"),
        ("newcomer_does_not_decode", lambda m, h, p, n, c: predict_step(m, [(p, 0)], h).total
         + predict_step(m, [(1, c)] * n, h).total, "the newcomer decodes too"),      # the trial's 06.6
        ("milliseconds", lambda *a: 1e3 * ref06.predicted_stall(*a), "That is milliseconds"),
        ("hard_coded", lambda *a: 0.2, "never call predict_step"),
    ]),
    # chapter 7
    "check_decode_floor": (ref07.decode_floor_s, [
        ("num_parameters", floor_from(lambda cfg: cfg.num_parameters()), "input embedding"),
        ("engine", lambda cfg, hw, d=2: step_cost(cfg, [(1, 0)], d).bytes_weights / hw.mem_bandwidth_bytes_s,
         "engine's own answer"),
        ("no_lm_head", floor_from(lambda cfg: cfg.num_layers * cfg.matmul_weights_per_layer), "LM head"),
        ("milliseconds", lambda cfg, hw, d=2: 1e3 * ref07.decode_floor_s(cfg, hw, d), "milliseconds"),
        ("bf16_always", lambda cfg, hw, d=2: ref07.decode_floor_s(cfg, hw, 2), "byte(s) each"),
        ("no_gqa", floor_from(lambda cfg: cfg.num_layers * (4 * cfg.hidden_size * cfg.q_size
                                                           + 3 * cfg.hidden_size * cfg.intermediate_size)
                              + cfg.vocab_size * cfg.hidden_size), "grouped-query"),
        ("embedding_and_head", floor_from(lambda cfg: cfg.num_layers * cfg.matmul_weights_per_layer
                                          + 2 * cfg.vocab_size * cfg.hidden_size), "embedding"),
        ("kv_of_512_tokens", lambda cfg, hw, d=2: ref07.decode_floor_s(cfg, hw, d) + 512 * cfg.kv_bytes_per_token(d)
         / hw.mem_bandwidth_bytes_s, "You add a KV cache"),   # the trial's 07.1: was called the input embedding
        ("achieved_bandwidth", lambda cfg, hw, d=2: ref07.decode_floor_s(cfg, hw, d) / hw.bandwidth_efficiency,
         "bandwidth_efficiency"),
        ("tied_head_left_out", floor_from(lambda cfg: cfg.num_layers * cfg.matmul_weights_per_layer
                                          + (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)),
         "still read every decode, as the LM head"),
    ]),
    "check_choose_chunk_size": (ref07.choose_chunk_size, [
        ("lab", lambda rows, slo: __import__("minillm.book.figures", fromlist=["x"]).pick_chunk_size(rows, max(slo, 1e-9)),
         "engine's own answer"),
        ("smallest_gap", lambda rows, slo: min(rows, key=lambda r: r["itl_max_s"])["chunk_size"] if
         any(r["itl_max_s"] * 1e3 <= slo for r in rows) else None, "smallest gap"),
        ("no_filter", lambda rows, slo: min(rows, key=_ttft_then_size)["chunk_size"] if rows else None,
         "filter first"),
        ("no_tie_break", lambda rows, slo: min((r for r in rows if r["itl_max_s"] * 1e3 <= slo),
                                              key=lambda r: r["long_ttft_s"], default={"chunk_size": None})
         ["chunk_size"], "tie-break"),
        ("seconds_against_ms", lambda rows, slo: ref07.choose_chunk_size(
            [{**r, "itl_max_s": r["itl_max_s"] / 1e3} for r in rows], slo), "Seconds against milliseconds"),
        ("below_the_slo", lambda rows, slo: ref07.choose_chunk_size(rows, math.nextafter(slo, 0)),
         "at most the SLO"),
        ("largest_chunk_that_meets", lambda rows, slo: max((r["chunk_size"] for r in rows if r["itl_max_s"] * 1e3
                                                            <= slo), key=lambda c: math.inf if c == "off" else c,
                                                           default=None), "largest chunk that meets"),
    ]),
    "check_goodput": (ref07.goodput, [
        ("summarize", lambda o, a, b: __import__("minillm").metrics.summarize(o, a, b)["goodput_req_s"],
         "engine's own answer"),
        ("colleague", colleague("07", "colleague_goodput"), "not finished"),
        ("throughput", lambda o, a, b: goodput_with(o, math.inf, math.inf), "summarize reports"),
        ("span_from_zero", lambda o, a, b: goodput_with(o, a, b) * _finished_span(o)
         / max(x.metrics.finish_time for x in o if x.finished), "starts at 0"),
        ("span_over_all_arrivals", lambda o, a, b: goodput_with(o, a, b, span_over_all=True), "ALL requests"),
        ("one_token_fails", lambda o, a, b: sum(x.finished and x.metrics.ttft <= a and x.metrics.tpot is not None
                                                 and x.metrics.tpot <= b for x in o) / _finished_span(o), "1-token"),
        ("counts_unfinished", lambda o, a, b: goodput_with(o, a, b, finished_only=False), "not finished"),
        ("counts_unfinished_crashes", lambda o, a, b: len(o) / (max(x.metrics.finish_time for x in o)
                                                              - min(x.metrics.arrival_time for x in o)), "not finished"),
        ("per_millisecond", lambda o, a, b: ref07.goodput(o, a, b) / 1e3, "requests per SECOND"),
    ]),
    "check_expected_ttft": (ref07.expected_ttft, [
        ("simulator", lambda *a: ch07._simulated_prefill(*a)[0], "engine's own answer"),
        ("no_decodes", lambda *a: ttft_with(*a, decodes=False), "one decode per stream"),
        ("one_step", lambda m, h, p, c, n, ctx: ttft_with(m, h, p, p, n, ctx), "steps, the prefill took"),
        ("contexts_do_not_grow", lambda *a: ttft_with(*a, grow=False), "grows by one token"),
        ("every_chunk_samples", lambda *a: ttft_with(*a, all_sample=True), "completes the prompt"),
        ("chunks_see_no_cache", lambda *a: ttft_with(*a, cached=False), "cached before it"),
        ("hard_coded", lambda *a: 0.25, "never call predict_step"),
        ("decodes_do_not_sample", lambda *a: ttft_with(*a, decodes_sample=False), "A decode samples every step"),
        ("prompt_never_samples", lambda *a: ttft_with(*a, prompt_samples=False), "first token comes from"),
        ("milliseconds", lambda *a: 1e3 * ref07.expected_ttft(*a), "That is milliseconds"),
    ]),
    "check_chunk_for_gap_slo": (ref07.chunk_for_gap_slo, [
        ("simulator", lambda m, h, p, n, c, s, cands: (max(cands), ch07._simulated_worst_gap(m, h, p, max(cands), n, c)),
         "engine's own answer"),
        ("no_decodes", lambda *a: gap_chunk(*a, decodes=False), "leave out the decodes"),
        ("first_chunk", lambda *a: gap_chunk(*a, first_only=True), "FIRST chunk"),
        ("last_chunk", lambda *a: gap_chunk(*a, last_only=True), "LAST chunk"),
        ("smallest_chunk", lambda m, h, p, n, c, s, cands: (min(cands), gap_chunk(m, h, p, n, c, 1e9, [min(cands)])[1]),
         "largest chunk that meets it"),
        ("hard_coded", lambda *a: (512, 0.02), "never call predict_step"),
        ("gap_off", lambda *a: (lambda r: (r[0], r[1] * 1.1 if r[1] else r[1]))(gap_chunk(*a)), "2%"),
        ("gap_in_milliseconds", lambda *a: (lambda r: (r[0], 1e3 * r[1] if r[1] else r[1]))(ref07.chunk_for_gap_slo(*a)),
         "That is milliseconds"),
        ("chunk_step_plus_a_decode_step", lambda *a: gap_chunk(*a, plus_decode_step=True), "ONE step"),
    ]),
    # chapter 8
    "check_salted_hashes": (ref08.salted_hashes, [
        ("engine", lambda t, bs, s=None: prefix_cache.block_hashes(t, bs), "engine's own answer"),
        ("chapter_code", _chapter8_chained_with_salt, "without a salt"),
        ("salt_on_the_last_block", salted_with("last"), "without a salt"),
        ("salt_per_prompt", salted_with("prompt"), "shares its first"),
        ("random_root", salted_with("random"), "second call"),
        ("unchained", lambda t, bs, s=None: [hash_block(ROOT_HASH, t[i:i + bs]) for i in range(0, len(t) // bs * bs, bs)],
         "the first wrong one"),
        ("partial_block_named", lambda t, bs, s=None: ref08.salted_hashes(t + [0] * (-len(t) % bs), bs, s),
         "partial last block"),
        ("empty_salt_is_no_salt", lambda t, bs, s=None: ref08.salted_hashes(t, bs, s or None), "An empty salt"),
        ("salt_appended_to_the_root", lambda t, bs, s=None: salted_with("concatenated")(t, bs, s), "An empty salt"),
    ]),
    "check_tokens_to_compute": (ref08.tokens_to_compute, [
        ("engine", lambda p, c, bs: p - min(c * bs, prefix_cache.max_cached_tokens(p, bs)), "engine's own answer"),
        ("forgets_last_token", lambda p, c, bs: p - c * bs, "never the prompt's last token"),
    ]),
    "check_first_token_steps": (ref08.first_token_steps, [
        ("engine", lambda *a: ch08._engine_first_token_steps(*a), "engine's own answer"),
        ("no_cap", lambda lens, c, t: steps_with(lens, c, 0), "caps every prompt's tokens"),
        ("cap_per_step", lambda *a: steps_with(*a, cap="per_step"), "not the step"),
        ("cap_while_others_wait", lambda *a: steps_with(*a, cap="while_waiting"), "once the prompts behind"),
        ("from_zero", lambda *a: steps_with(*a, base=0), "count from 1"),
    ]),
    "check_threshold_for_short_ttft": (ref08.threshold_for_short_ttft, [
        ("engine", lambda L, s, c, m: next(t for t in range(c - 1, 0, -1) if ch08._shorts_within(L, s, c, t, m)),
         "engine's own answer"),
        ("smallest_that_works", lambda *a: threshold_with(*a, order="smallest"), "so does"),
        ("never_cap", lambda *a: threshold_with(*a, order="fcfs_only"), "no cap misses"),
        ("half_a_chunk", lambda L, s, c, m: c // 2, "so does"),
        ("too_small", lambda L, s, c, m: 1, "also caps the short prompts"),
        ("chunk_size", lambda L, s, c, m: c, "caps nothing"),
    ]),
    "check_eviction_order": (ref08.eviction_order, [
        ("engine", lambda *a: ch08._engine_eviction_order(*a), "engine's own answer"),
        ("head_first", lambda *a: evictions(*a, tail_first=False), "tail first"),
        ("no_ref_counts", lambda *a: evictions(*a, ref_counts=False), "LAST holder"),
        ("evicts_before_clean", lambda *a: evictions(*a, clean_first=False), "Clean blocks are taken"),
    ]),
    "check_prefill_tokens_saved": (ref08.prefill_tokens_saved, [
        ("engine", lambda *a: ch08._engine_prefill_tokens(*a), "engine's own answer"),
        ("partial_block_shared", lambda s, u, bs: [s + x if i == 0 else x for i, x in enumerate(u)], "whole blocks"),
        ("no_last_token_rule", lambda s, u, bs: saved(s, u, bs, rule=lambda p, c, b: p - c * b), "last prompt token"),
        ("no_cache", lambda s, u, bs: [s + x for x in u], "reuse the system prompt"),
        ("first_also_hits", lambda s, u, bs: saved(s, u, bs, first_pays=False), "first chat finds nothing"),
        ("chapter_code", _chapter8_hashes_for_saving, "last prompt token"),
    ]),
    # chapter 10
    "check_token_chunk_times": (ref10.token_chunk_times, [
        ("colleague", colleague("10", "colleague_token_chunk_times"), "usage chunk"),
        ("by_text", chunk_times_by_text, "empty still carries a token"),
        ("with_usage", chunk_times_with_usage, "usage chunk"),
        ("text_field", chunk_times_text_field, "delta"),
        ("chapter_cell", chapter10_cell, "not every line is JSON"),
        ("skips_the_finish_chunk", chunk_times_without_the_finish, "finish_reason, still carries a token"),
    ]),
    "check_client_metrics": (ref10.client_metrics, [
        ("per_chunk_tpot", metrics_with(per_chunk_tpot=True), "completion tokens - 1"),
        ("no_first_zeros", metrics_with(first_zeros=False), "itl_per_token has"),
        ("gap_on_the_last_token", metrics_with(even=False), "evenly"),
        ("client", metrics_from_the_client, "engine's own answer"),
        ("milliseconds", lambda *a: {k: (None if v is None else [1e3 * x for x in v] if isinstance(v, list)
                                         else 1e3 * v) for k, v in ref10.client_metrics(*a).items()},
         "That is milliseconds"),
    ]),
    "check_guidellm_names": (ref10.vllm_from_guidellm, [
        ("swapped", guidellm_with(swapped=True), "swapped"),
        ("one_gap_too_many", guidellm_with(extra_gap=True), "one gap too many"),
        ("seconds", guidellm_with(seconds=True), "seconds"),
        ("forward", lambda itl, tpot, n: {"ttft_ms": None, "tpot_ms": tpot, "e2el_ms": itl}, "latency over n"),
    ]),
    "check_client_goodput": (ref10.client_goodput, [
        ("strict_tpot", goodput_strict_tpot, "vacuously"),
        ("client", goodput_from_the_client, "engine's own answer"),
        ("seconds_against_ms", goodput_in_units(1), "Seconds against milliseconds"),
        ("ms_the_wrong_way", goodput_in_units(1e-3), "Seconds against milliseconds"),
    ]),
    "check_itl_over_tpot": (ref10.itl_over_tpot, [
        ("tokens_per_chunk", lambda n, k: float(k) if n > k else None, "k is how much"),
        ("average_chunk", lambda n, k: n / -(-n // k) if n > k else None, "Tokens per chunk on average"),
        ("client", ratio_from_the_client, "engine's own answer"),
        ("never_none", lambda n, k: ref10.itl_over_tpot(n, k) or 1.0, "return None"),
    ]),
}

# The chapters' printed code, or the statement read literally, on the tasks that are not recipes.
NAIVE = [
    ("check_passes_to_first_token", lambda p, P, ks, C, B: math.ceil(P / C)),          # section 6's count, copied
    ("check_passes_to_first_token", lambda p, P, ks, C, B: len(_chapter6_chunk_ranges()(P, C))),
    ("check_chunks_for_work_budget", chapter6_equal_work),                            # section 7's sizing, lifted
    ("check_schedule_chunked", colleague("06", "colleague_schedule_chunked")),        # the code the task hands out
    ("check_schedule_decode_first", lambda d, w, b, m: [] if d else ref06.schedule_chunked(d, w, 10**9, b)),
    ("check_predicted_stall", lambda m, h, p, n, c: predict_step(m, [(p, 0)], h).total),   # "one whole prefill"
    ("check_decode_floor", floor_from(lambda cfg: cfg.num_parameters())),            # the old statement's floor
    ("check_goodput", _chapter7_goodput),                                             # section 6's goodput
    ("check_goodput", colleague("07", "colleague_goodput")),
    ("check_expected_ttft", lambda *a: ttft_with(*a, decodes=False)),               # chunking_price_ms's steps
    ("check_chunk_for_gap_slo", lambda *a: gap_chunk(*a, decodes=False)),           # chapter 7 prices chunks alone
    ("check_salted_hashes", _chapter8_chained_with_salt),
    ("check_first_token_steps", lambda lens, c, t: steps_with(lens, c, 0)),          # chapter 6's FCFS
    ("check_threshold_for_short_ttft", lambda L, s, c, m: c // 2),                    # "the cap at half a chunk"
    ("check_prefill_tokens_saved", _chapter8_hashes_for_saving),
    ("check_eviction_order", lambda *a: evictions(*a, tail_first=False, ref_counts=False)),   # a plain LRU
    ("check_token_chunk_times", chapter10_cell),
    ("check_token_chunk_times", colleague("10", "colleague_token_chunk_times")),
    ("check_itl_over_tpot", lambda n, k: float(k) if n > k else None),               # "one gap per chunk of k"
]

# Each task's kind (issue 39): predict (a number the engine then measures), debug, design, transfer
# (the chapter's idea where it did not go), or copyable (earnable by transcribing the statement or
# the chapter's definitions).
KINDS = {
    "06": {"check_schedule_chunked": "debug", "check_stream_metrics": "copyable",
           "check_passes_to_first_token": "transfer", "check_chunks_for_work_budget": "design",
           "check_schedule_decode_first": "transfer", "check_predicted_stall": "predict"},
    "07": {"check_decode_floor": "transfer", "check_choose_chunk_size": "copyable", "check_goodput": "debug",
           "check_expected_ttft": "predict", "check_chunk_for_gap_slo": "predict"},
    "08": {"check_salted_hashes": "transfer", "check_tokens_to_compute": "copyable",
           "check_first_token_steps": "transfer", "check_threshold_for_short_ttft": "design",
           "check_eviction_order": "transfer", "check_prefill_tokens_saved": "predict"},
    "10": {"check_token_chunk_times": "debug", "check_client_metrics": "transfer",
           "check_guidellm_names": "transfer", "check_client_goodput": "copyable", "check_itl_over_tpot": "predict"},
}


def _points(chapter: str) -> dict:
    source = next((ROOT / "exercises" / "solutions" / "src").glob(f"{chapter}_*.py")).read_text()
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"ex\.(check_\w+)\(.*#\s*points:\s*(\d+)", source)}


def test_every_checker_of_these_chapters_is_tested_here():
    exported = {name for module in MODULES.values() for name in module.__all__}
    assert set(CASES) == exported
    assert {name for kinds in KINDS.values() for name in kinds} == exported


@pytest.mark.parametrize("checker", sorted(CASES))
def test_a_correct_answer_passes(checker, capsys):
    assert getattr(ex, checker)(CASES[checker][0], seed=3) is None
    out = capsys.readouterr().out
    assert out.startswith("✓") and out.count("\n") == 1, out


SHORTCUTS = [(checker, name, fn, says) for checker, (_, attempts) in sorted(CASES.items())
             for name, fn, says in attempts]


@pytest.mark.parametrize("checker, name, fn, says", SHORTCUTS, ids=[f"{c}-{n}" for c, n, _, _ in SHORTCUTS])
def test_a_shortcut_fails_with_a_message_that_names_it(checker, name, fn, says, capsys):
    with pytest.raises(ExerciseFailed) as failure:
        getattr(ex, checker)(fn, seed=3)
    first_line = str(failure.value).splitlines()[0]
    assert says in first_line, f"{checker} on {name!r}: the message does not point at the mistake: {first_line}"
    assert failure.value._render_traceback_()[0] == "Not yet: " + first_line
    assert "Not yet" not in capsys.readouterr().out


@pytest.mark.parametrize("checker, fn", NAIVE, ids=[f"{c}-{i}" for i, (c, _) in enumerate(NAIVE)])
def test_the_chapters_printed_code_and_the_statement_read_literally_fail(checker, fn):
    for seed in (None, 11):
        with pytest.raises(ExerciseFailed):
            getattr(ex, checker)(fn, seed=seed)


@pytest.mark.parametrize("chapter", sorted(KINDS))
def test_copying_earns_at_most_a_fifth_of_the_points(chapter):
    points = _points(chapter)
    assert set(points) == set(MODULES[chapter].__all__) == set(KINDS[chapter]), "every checker is a graded task"
    copyable = sum(points[c] for c, kind in KINDS[chapter].items() if kind == "copyable")
    assert copyable * 5 <= sum(points.values()), f"{copyable} of {sum(points.values())} points are copyable"
    # every task that is not a copy has a naive attempt or a shortcut list that fails it
    for checker, kind in KINDS[chapter].items():
        if kind != "copyable":
            assert checker in {c for c, _ in NAIVE} or len(CASES[checker][1]) >= 3, checker


@pytest.mark.parametrize("chapter", sorted(KINDS))
def test_each_notebook_has_a_predict_task_and_a_debug_or_design_task(chapter):
    kinds = set(KINDS[chapter].values())
    assert "predict" in kinds and kinds & {"debug", "design"}, kinds


@pytest.mark.parametrize("chapter", sorted(MODULES))
def test_the_public_checkers_do_not_import_the_answers(chapter):
    """A student release strips _reference and _hidden: the checkers must run without them."""
    tree = ast.parse(Path(MODULES[chapter].__file__).read_text())
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names]
    assert not [name for name in imported if "_reference" in name or "_hidden" in name], imported


@pytest.mark.parametrize("chapter", sorted(KINDS))
def test_the_hidden_cases_pass_the_reference_and_name_every_checker(chapter):
    hidden = importlib.import_module(f"minillm.grading._hidden.ch{chapter}")
    reference = importlib.import_module(f"minillm.grading._reference.ch{chapter}")
    assert set(hidden.HIDDEN) == set(MODULES[chapter].__all__)
    answers = {checker: CASES[checker][0] for checker in hidden.HIDDEN}
    assert all(answers[c].__module__ == reference.__name__ for c in answers)
    for checker, runs in hidden.HIDDEN.items():
        for kwargs in runs:
            getattr(ex, checker)(answers[checker], **kwargs)
        extra = getattr(hidden, "hidden_" + checker, None)
        if extra is not None:
            extra(answers[checker])


def test_the_hidden_checks_reach_what_the_public_ones_do_not():
    from minillm.grading._hidden import ch06 as hidden06, ch07 as hidden07, ch08 as hidden08
    with pytest.raises(ExerciseFailed, match="hidden case"):      # correct on the presets only
        hidden07.hidden_check_decode_floor(lambda cfg, hw, d=2: ref07.decode_floor_s(cfg, hw, d)
                                           if not cfg.tie_word_embeddings else 0.0)
    with pytest.raises(ExerciseFailed, match="hidden case"):
        hidden06.hidden_check_passes_to_first_token(lambda *a: passes_with(*a, streams_finish=False))
    with pytest.raises(ExerciseFailed, match="hidden case"):
        hidden08.hidden_check_first_token_steps(lambda lens, c, t: steps_with(lens, c, 0))


# ---- the named diagnoses issue 39 asked for, one by one ----------------------------------------
def test_06_3_each_rounding_slip_has_its_own_message():
    floor = _message("check_passes_to_first_token", lambda *a: passes_with(*a, rounding=math.floor))
    plus_one = _message("check_passes_to_first_token", lambda *a: passes_with(*a, rounding=lambda x: int(x) + 1))
    nearest = _message("check_passes_to_first_token", lambda *a: passes_with(*a, rounding=round))
    assert "round down" in floor and "nearest" not in floor and "too many" not in floor, floor
    assert "One step too many" in plus_one and "short" not in plus_one, plus_one
    assert "nearest" in nearest and "too many" not in nearest, nearest
    assert len({floor, plus_one, nearest}) == 3


def test_06_3_no_check_cell_hands_over_the_count():
    source = (ROOT / "exercises" / "solutions" / "src" / "06_the_scheduler.py").read_text()
    assert "448" not in source and "19 steps" not in source


def test_07_1_the_exercise_floor_is_the_chapters_decode_floor():
    """Chapter 7 (section 7) counts what a decode reads with step_cost(...).bytes_weights (no input
    embedding): 13.2 GB for Llama-2-7B in bf16, 6.5 ms on an A100-80GB. The checker and the
    reference answer use that count, and num_parameters() (the embedding too) is named as a slip."""
    from minillm.config import ModelConfig
    from minillm.sim.hardware import get_hardware
    cfg, hw = ModelConfig.preset("llama-2-7b"), get_hardware("A100-80GB")
    assert round(step_cost(cfg, [(1, 0)], 2).bytes_weights / 1e9, 1) == 13.2
    assert round(ref07.decode_floor_s(cfg, hw) * 1e3, 1) == 6.5
    chapter = (ROOT / "notebooks" / "src" / "07_the_lab.py").read_text()
    assert "step_cost(l2, [(1, 0)], dtype_bytes=2).bytes_weights" in chapter
    assert "input embedding" in _message("check_decode_floor", floor_from(lambda c: c.num_parameters()))


def test_07_3_a_span_over_every_arrival_fails_on_every_seed():
    """Issue 39: taking the time span from the first arrival of ALL requests (unfinished ones
    included) passed 5 runs of 5; now every load that could hide it holds the case."""
    for seed in (None, 1, 2, 3, 4):
        assert "ALL requests" in _message("check_goodput", lambda o, a, b: goodput_with(o, a, b, span_over_all=True),
                                          seed=seed)


def test_07_3_unfinished_requests_that_would_look_good_are_in_the_loads():
    assert "not finished" in _message("check_goodput", lambda o, a, b: goodput_with(o, a, b, finished_only=False))


def test_07_5_pricing_the_partial_last_chunk_is_named_and_not_called_a_whole_step():
    first = _message("check_chunk_for_gap_slo", lambda *a: gap_chunk(*a, last_only=True))
    assert "LAST chunk" in first and "short remainder" in first and "one whole step" not in first


def test_07_5_the_statement_and_hint_do_not_hand_over_the_method():
    source = (ROOT / "exercises" / "solutions" / "src" / "07_the_lab.py").read_text()
    assert "gap between two tokens is one whole step" not in source and "price them all" not in source


def test_10_4_seconds_for_milliseconds_has_its_own_message():
    for scale in (1, 1e-3):
        assert _message("check_client_goodput", goodput_in_units(scale)).startswith("Seconds against milliseconds")


def test_each_planted_bug_of_a_debug_task_is_named_on_its_own():
    """The colleague's scheduler has three bugs; fixing them one at a time, each remaining one is named."""
    assert "leave out" in _message("check_schedule_chunked", lambda *a: schedule_with(*a, zeros=True, fcfs=False,
                                                                                       share_budget=False))
    assert "take their" in _message("check_schedule_chunked", lambda *a: schedule_with(*a, fcfs=False,
                                                                                       share_budget=False))
    assert "first come" in _message("check_schedule_chunked", lambda *a: schedule_with(*a, fcfs=False))
    # the colleague's goodput: two bugs, each named once the other is fixed
    assert "not finished" in _message("check_goodput", lambda o, a, b: goodput_with(o, a, b, finished_only=False))
    assert "ALL requests" in _message("check_goodput", lambda o, a, b: goodput_with(o, a, b, span_over_all=True))
    # the colleague's parser: three bugs
    assert "usage chunk" in _message("check_token_chunk_times", chunk_times_with_usage)
    assert "empty still carries" in _message("check_token_chunk_times", chunk_times_by_text)
    assert "delta" in _message("check_token_chunk_times", chunk_times_text_field)


def test_salting_every_block_is_right_too():
    """vLLM salts the first block only and lets the chain carry it; salting every block also keeps
    tenants apart and prefixes shared, and the checker accepts it."""
    assert ex.check_salted_hashes(salted_with("every"), seed=5) is None
    assert ex.check_salted_hashes(salted_with("root"), seed=5) is None


def test_a_stub_left_as_is_counts_as_not_attempted():
    def stub(*args, **kwargs):
        raise NotImplementedError
    for checker in CASES:
        with pytest.raises(NotImplementedError):
            getattr(ex, checker)(stub)


# ---- the engine facts the checkers and the reference answers rest on ----------------------------
def test_the_engines_plans_meet_the_rules_the_checker_states():
    rng = random.Random(0)
    for _ in range(200):
        state = ch06._random_state(rng)
        plan = list(ch06._engine_schedule_chunked(*state, rng=rng).items())
        assert ch06._check_plan_invariants(plan, *state) is None


def test_the_reference_step_counts_are_the_engines():
    rng = random.Random(5)
    for _ in range(150):
        n = rng.randint(0, 12)
        args = (rng.choice(ch06.POLICIES), rng.randint(1, 4000), [rng.randint(1, 60) for _ in range(n)],
                rng.choice([16, 64, 256, rng.randint(n + 1, 700)]), rng.choice([None, n + 1 + rng.randint(0, 300)]))
        assert ref06.passes_to_first_token(*args) == ch06._engine_passes_to_first_token(*args), args
    for _ in range(150):
        chunk_size = rng.choice([16, 64, 512])
        lens = [rng.choice([rng.randint(1, 40), rng.randint(100, 3000)]) for _ in range(rng.randint(1, 6))]
        threshold = rng.choice([0, rng.randint(1, 2 * chunk_size)])
        assert ref08.first_token_steps(lens, chunk_size, threshold) == \
            ch08._engine_first_token_steps(lens, chunk_size, threshold)


def test_the_fewest_steps_under_a_work_budget_are_what_the_reference_finds():
    for case in ch06._work_cases(random.Random(2), 15):
        assert ref06.chunks_for_work_budget(*case) == ch06._fewest_steps_within(*case)


def test_the_simulated_stall_is_the_prompt_step_plus_the_next_decode_step():
    measured = ch06._simulated_stall("llama-3-8b", "A100-80GB", 2048, 4, 72)
    assert math.isclose(measured, ref06.predicted_stall("llama-3-8b", "A100-80GB", 2048, 4, 72), rel_tol=1e-6)


def test_the_trace_gives_the_steps_the_reference_builds():
    ttft, steps = ch07._simulated_prefill("llama-3-8b", "A100-80GB", 2000, 512, 4, 72)
    assert [sorted(s) for s in steps] == [sorted(s) for s in ref07.prefill_steps(2000, 512, 4, 72)]
    assert math.isclose(ttft, ref07.expected_ttft("llama-3-8b", "A100-80GB", 2000, 512, 4, 72), rel_tol=1e-9)


def test_the_feasible_thresholds_form_a_band_a_cap_too_small_throttles_the_short_prompts():
    """Why task 8.4 is a design question: below some threshold the short prompts are capped too."""
    within = [t for t in range(1, 128) if ch08._shorts_within(2000, [40, 40], 128, t, 3)]
    assert within and within[0] > 1 and within[-1] < 127 and within == list(range(within[0], within[-1] + 1))


def test_the_eviction_and_prefill_references_follow_the_engine():
    assert ch08._engine_eviction_order({"a": [0, 1, 2], "b": [0, 1, 3], "c": [4]}, ["a", "c", "b"], 2, 5) == [2, 4, 3]
    assert ch08._engine_prefill_tokens(40, [3, 0, 10, 5], 16) == [43, 8, 18, 13] == \
        ref08.prefill_tokens_saved(40, [3, 0, 10, 5], 16)


def test_the_served_streams_truth_is_what_the_books_client_reads():
    rng = random.Random(4)
    for _ in range(50):
        stream = ch10.served_stream(rng)
        assert ref10.token_chunk_times(stream.events) == stream.chunk_times
        got = ref10.client_metrics(stream.start_s, stream.chunk_times, stream.tokens_per_chunk)["itl_per_token"]
        truth = [b - a for a, b in zip(stream.token_times, stream.token_times[1:])]
        assert all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) for a, b in zip(got, truth))


def test_the_chapters_printed_code_is_still_what_these_tests_copy():
    # if a chapter renames or drops what it prints, the copies above must follow it
    chained = printed("08", "chained_hashes", hashlib=hashlib, array=__import__("array").array)
    assert chained(list(range(40)), 16) == prefix_cache.block_hashes(list(range(40)), 16)
    assert _chapter6_chunk_ranges()(2048, 512) == [(0, 511), (512, 1023), (1024, 1535), (1536, 2047)]


def test_engine_functions_imported_by_name_are_refused_too():
    """The chapters import these by name; a learner who does the same still calls the engine."""
    from minillm.prefix_cache import block_hashes, max_cached_tokens
    from minillm.sim.accounting import step_cost as imported_step_cost
    assert "engine's own answer" in _message("check_salted_hashes", lambda t, bs, s=None: block_hashes(t, bs))
    assert "engine's own answer" in _message("check_tokens_to_compute",
                                             lambda p, c, bs: p - min(c * bs, max_cached_tokens(p, bs)))
    assert "engine's own answer" in _message(
        "check_decode_floor", lambda cfg, hw, d=2: imported_step_cost(cfg, [(1, 0)], d).bytes_weights
        / hw.mem_bandwidth_bytes_s)


# ---- the learner trial of exercises 6-10 (notes/trial_6_10.md): each finding, fixed at its source -------
SOURCES = ROOT / "exercises" / "solutions" / "src"


def _task_markdown(chapter: str, number: int) -> str:
    """Task `number`'s statement and hint, as the learner reads them."""
    text = next(SOURCES.glob(f"{chapter}_*.py")).read_text()
    start = text.index(f"# ## {number}. ")
    return text[start:text.index("\n# %%\n", start)]


def test_06_3_the_statement_lifts_the_running_request_limit_the_checker_lifts():
    """The trial: with vLLM's default max_num_seqs of 64 the cell's own example (64 streams and a prompt)
    takes 20 / 515 passes, not 17 / 19. The statement says there is no such limit, and the checker's
    engine runs with room for every stream and the prompt, so the example's counts are the engine's."""
    statement = _task_markdown("06", 3)
    assert "max_num_seqs" in statement and "len(steps_left) + 1" in statement
    for left in (5, 500):
        args = ("chunked", 8192, [left] * 64, 512, 512)
        assert ref06.passes_to_first_token(*args) == ch06._engine_passes_to_first_token(*args)
    # what the limit would have changed: the engine with room for 64 requests only
    from minillm.grading._engine_runs import first_token_step, model_free_core, one_token, roomy_blocks
    from minillm.request import SamplingParams
    from minillm.scheduler import SchedulerConfig
    core = model_free_core(SchedulerConfig(policy="chunked", chunk_size=512, token_budget=512, max_num_seqs=64),
                           roomy_blocks(8192 + 64 * 600))
    streams = [core.add_request(None, SamplingParams(max_tokens=501, ignore_eos=True), prompt_len=1)
               for _ in range(64)]
    first_token_step(core, streams)
    rid = core.add_request(None, one_token(), prompt_len=8192)
    waited = first_token_step(core, [rid])[rid]      # the prompt waits for a stream to leave
    assert waited > 500 and waited != ref06.passes_to_first_token("chunked", 8192, [500] * 64, 512, 512) == 19


def test_06_4_the_examples_budget_prices_the_last_steps_decodes_at_their_context():
    """The trial: the example priced the eighth step's decodes with prefill_work(108, 1, ...) where each
    stream then has 107 tokens cached (100, plus one per step before)."""
    source = next(SOURCES.glob("06_*.py")).read_text()
    assert "prefill_work(108, 1, 2944)" not in source and "4 * prefill_work(107, 1, 2944)" in source
    assert ch06._decode_work([100] * 4, 7, 2944) == 4 * prefill_work(107, 1, 2944)


def test_06_6_is_exact_and_the_newcomers_decode_decides_it():
    """The trial: with and without the prompt's own decode both passed at 2% (0.96% and 0.00%). The
    newcomer now keeps generating, the tolerance is 0.1% (the simulator prices with the same cost model),
    and the points moved to 06.3 (4 and 4, was 3 and 5)."""
    assert ch06.STALL_TOLERANCE <= 0.001 and "0.1%" in _task_markdown("06", 6)
    measured = ch06._simulated_stall("qwen3-0.6b", "H100-SXM", 2000, 2, 200)
    assert measured == ref06.predicted_stall("qwen3-0.6b", "H100-SXM", 2000, 2, 200)
    without = predict_step("qwen3-0.6b", [(2000, 0)], "H100-SXM").total + predict_step(
        "qwen3-0.6b", [(1, 200)] * 2, "H100-SXM").total
    assert abs(without - measured) / measured > 5 * ch06.STALL_TOLERANCE
    points = _points("06")
    assert points["check_passes_to_first_token"] == points["check_predicted_stall"] == 4
    assert sum(points.values()) == 16


def test_07_4_a_wrong_step_is_shown_chunk_first_with_every_request():
    """The trial: the message listed the decodes first and cut the list exactly where it differed."""
    first = _message("check_expected_ttft", lambda *a: ttft_with(*a, decodes_sample=False))
    assert "should hold (512, 0, False) + 4 x (1, 72, True); you pass (512, 0, False) + 4 x (1, 72, False)" in first
    assert "..." not in first


def test_07_1_the_kv_slip_and_the_embedding_slip_are_told_apart_though_one_model_cannot():
    """On Llama-2-7B the input embedding is exactly 500 tokens of KV cache: the checker looks at every
    shape before it names one."""
    from minillm.config import ModelConfig
    cfg = ModelConfig.preset("llama-2-7b")
    assert cfg.vocab_size * cfg.hidden_size == 500 * cfg.kv_bytes_per_token(1)
    kv = _message("check_decode_floor", lambda c, hw, d=2: ref07.decode_floor_s(c, hw, d)
                  + 500 * c.kv_bytes_per_token(d) / hw.mem_bandwidth_bytes_s)
    embedding = _message("check_decode_floor", floor_from(lambda c: c.num_parameters()))
    assert "KV cache" in kv and "embedding" not in kv
    assert "input embedding" in embedding and "KV" not in embedding


def test_08_1_an_empty_salt_is_checked_against_no_salt():
    """The trial: salt='' hashed as no salt passed, though the statement says any salt must differ."""
    assert "An empty salt" in _message("check_salted_hashes", lambda t, bs, s=None: ref08.salted_hashes(t, bs, s or None))
    assert ex.check_salted_hashes(salted_with("root"), seed=11) is None


def test_08_5_the_statement_poses_the_eviction_rules_instead_of_listing_them():
    """The trial: the statement spelled out every rule (reference counts, the end of the LRU list, tail
    first), so the chapter's _take_free_block plus the statement was the answer."""
    statement = _task_markdown("08", 5)
    for rule in ("tail first", "reference count falls to 0", "joins the end of the LRU list", "The engine's rules"):
        assert rule not in statement, rule
    # the rules are still what the checker holds an answer to, each named when broken
    assert "tail first" in _message("check_eviction_order", lambda *a: evictions(*a, tail_first=False))


def test_10_1_skipping_the_finish_reason_chunk_is_named_not_called_empty_text():
    first = _message("check_token_chunk_times", chunk_times_without_the_finish)
    assert "finish_reason" in first and "empty" not in first.split(";", 1)[1].split(":")[0]


def test_10_2_the_gap_count_message_counts_the_first_chunk_right():
    """The trial: "a chunk of k tokens hides k gaps" is one too many for the first chunk."""
    first = _message("check_client_metrics", metrics_with(first_zeros=False))
    assert "first chunk of k tokens holds k - 1 gaps" in first and "hides k gaps" not in first


@pytest.mark.parametrize("checker, fn", [
    ("check_stream_metrics", lambda a, t: {k: (None if v is None else [1e3 * x for x in v] if isinstance(v, list)
                                               else 1e3 * v) for k, v in ref06.stream_metrics(a, t).items()}),
    ("check_predicted_stall", lambda *a: 1e3 * ref06.predicted_stall(*a)),
    ("check_decode_floor", lambda cfg, hw, d=2: 1e3 * ref07.decode_floor_s(cfg, hw, d)),
    ("check_expected_ttft", lambda *a: 1e3 * ref07.expected_ttft(*a)),
    ("check_chunk_for_gap_slo", lambda *a: (lambda r: (r[0], 1e3 * r[1] if r[1] else r[1]))(ref07.chunk_for_gap_slo(*a))),
    ("check_client_metrics", lambda *a: {k: (None if v is None else [1e3 * x for x in v] if isinstance(v, list)
                                             else 1e3 * v) for k, v in ref10.client_metrics(*a).items()}),
], ids=lambda x: x if isinstance(x, str) else "")
def test_a_thousandfold_error_gets_a_units_message_first(checker, fn):
    """The trial: 6.6's and 7.2's millisecond answers were told about gaps and filters (a 1e5% error)."""
    assert _message(checker, fn).startswith("That is milliseconds")
