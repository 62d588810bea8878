"""Checkers for exercises/10_serving_from_the_client: a client's arithmetic.

Each checker draws streams (the same ones every run: @checker fixes seed=None) from a
model of a server: it produces tokens at known times and sends them as SSE events,
a chunk holding one or several tokens, with blank separators, ping comments, a usage
chunk and `[DONE]`, from /v1/completions or /v1/chat/completions. The expected values
are that truth (which events carry tokens, when each token was produced) or the book's
client (minillm.serve.bench_client), whose own functions are switched off while the
learner's run. Nothing here imports the reference answers (minillm.grading._reference).
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field

from ..serve.bench_client import RequestRecord, group_metrics, meets_slo_ms
from ._common import call_text, checker, fail as _fail, learner_call, passed
from ._units import units_hint

__all__ = ["check_token_chunk_times", "check_client_metrics", "check_guidellm_names", "check_client_goodput",
           "check_itl_over_tpot"]

_CLIENT = ("minillm.serve.bench_client.group_metrics", "minillm.serve.bench_client.meets_slo_ms",
           "minillm.serve.bench_client.RequestRecord.tpot", "minillm.serve.bench_client.RequestRecord.itl",
           "minillm.serve.bench_client.stream_one", "minillm.metrics.summarize", "minillm.metrics.meets_slo")


def _close(a, b, rel=1e-9) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return (isinstance(a, (int, float)) and not isinstance(a, bool)
            and math.isclose(a, b, rel_tol=rel, abs_tol=1e-12))


@dataclass
class ServedStream:
    """What the server did (the truth) and what went over the wire."""
    start_s: float                                              # when the client sent the POST
    token_times: list[float]                                    # when each token was produced
    tokens_per_chunk: list[int]
    events: list[tuple[float, str]] = field(default_factory=list)
    chat: bool = False                                          # /v1/chat/completions (delta) or /v1/completions

    @property
    def chunk_times(self) -> list[float]:
        """A chunk leaves when its last token is produced."""
        ends = [sum(self.tokens_per_chunk[:i + 1]) - 1 for i in range(len(self.tokens_per_chunk))]
        return [self.token_times[e] for e in ends]


def served_stream(rng: random.Random, num_chunks: int | None = None, chat: bool | None = None) -> ServedStream:
    """A server's stream: the first chunk's tokens produced together, each later chunk's k tokens
    produced evenly over the gap before it; then the SSE events a client reads."""
    num_chunks = num_chunks or rng.randint(1, 12)
    chat = rng.random() < 0.4 if chat is None else chat
    start = rng.uniform(0.0, 0.5)
    tokens = [rng.choice([1, 1, 1, 2, 3, 5]) for _ in range(num_chunks)]
    t = start + rng.uniform(0.05, 0.5)
    times = [t] * tokens[0]
    for k in tokens[1:]:
        gap = rng.uniform(0.001, 0.3)
        times += [t + gap * (j + 1) / k for j in range(k)]
        t += gap
    stream = ServedStream(start, times, tokens, chat=chat)
    events = [(start + 0.01, ": ping")] if rng.random() < 0.5 else []
    for i, (at, k) in enumerate(zip(stream.chunk_times, tokens)):
        text = "" if rng.random() < 0.2 else "".join(rng.choice("abc ") for _ in range(k))
        finish = "length" if i == num_chunks - 1 else None
        if chat:
            chunk = {"id": "chatcmpl-x", "object": "chat.completion.chunk",
                     "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}
        else:
            chunk = {"id": "cmpl-x", "object": "text_completion",
                     "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
        events += [(at, "data: " + json.dumps(chunk)), (at, "")]
    t = stream.chunk_times[-1] + rng.uniform(0.0001, 0.01)
    usage = {"id": "cmpl-x", "choices": [], "usage": {"completion_tokens": sum(tokens)}}
    events += [(t, "data: " + json.dumps(usage)), (t, ""), (t + 1e-4, "data: [DONE]")]
    stream.events = events
    return stream


# ---------------------------------------------------------------------------
# 1. Which events carry a token: repair a colleague's parser
# ---------------------------------------------------------------------------
def _parser_crash(error):
    if isinstance(error, KeyError) and error.args and error.args[0] == "text":
        return ("a chat stream's chunk carries its token in choices[0]['delta'], not choices[0]['text']: "
                "what marks a chunk that carries a token, whatever the endpoint?")
    if isinstance(error, (json.JSONDecodeError, ValueError)):
        return ("not every line is JSON: blank lines separate events, a line starting with ':' is an SSE "
                "comment (a ping), and 'data: [DONE]' ends the stream")
    if isinstance(error, IndexError):
        return "the usage chunk's choices list is empty: there is no choices[0] to read"
    return None


def _missed_chunks(got: list, stream: ServedStream) -> str:
    """Name what the learner's times leave out or add, from what each chunk of the stream held."""
    expected = stream.chunk_times
    if len(got) == len(expected) + 1:
        return "; the usage chunk (choices: []) carries no token"
    missing = [i for i, t in enumerate(expected) if t not in got]
    if not missing or len(got) > len(expected):
        return ""
    texts = [json.loads(line[len("data: "):]) for _, line in stream.events
             if line.startswith("data: {") and json.loads(line[len("data: "):]).get("choices")]
    said = [(c["choices"][0].get("text") if "text" in c["choices"][0] else c["choices"][0]["delta"]["content"])
            for c in texts]
    last = len(expected) - 1
    if missing == [last] or (last in missing and all(said[i] for i in missing if i != last)):
        return ("; the last chunk, the one that carries finish_reason, still carries a token: finish_reason says "
                "why the stream ends, not that the chunk is empty")
    if all(said[i] == "" for i in missing):
        return "; a chunk whose text is empty still carries a token (vLLM counts it)"
    return ""


@checker
def check_token_chunk_times(token_chunk_times, seed: int | None = None, *, num_cases: int = 200):
    """token_chunk_times(events) -> the arrival times of the events that carry a token, as
    vllm bench serve counts them (a data event with a non-empty choices list)."""
    rng = random.Random(seed)
    for case in range(num_cases):
        stream = served_stream(rng, chat=(case % 3 == 1) if case < 6 else None)
        expected = stream.chunk_times
        got = learner_call(token_chunk_times, list(stream.events), explain=_parser_crash)
        if not isinstance(got, (list, tuple)):
            _fail(f"return a list of times; you returned {got!r}")
        if list(got) != expected:
            kind = "chat" if stream.chat else "completions"
            _fail(f"for a {kind} stream of {len(expected)} token chunks you returned {len(got)} "
                  f"times{_missed_chunks(list(got), stream)}")
    return passed(f"token_chunk_times: {num_cases} streams (completions and chat) read as vllm bench serve reads them")


# ---------------------------------------------------------------------------
# 2. TTFT, TPOT, ITL, and the per-token gaps a multi-token chunk hides
# ---------------------------------------------------------------------------
def _hand_picked_streams():
    """(start, token times, tokens per chunk): the edge cases first."""
    return [ServedStream(0.0, [0.5, 0.6, 0.7], [1, 1, 1]), ServedStream(0.2, [1.0, 1.1, 1.2, 1.3], [1, 3]),
            ServedStream(1.0, [2.0] * 4, [4]), ServedStream(0.1, [0.4], [1]),
            ServedStream(0.0, [0.5, 0.5, 0.55, 0.6], [2, 2])]


@checker
def check_client_metrics(client_metrics, seed: int | None = None, *, num_cases: int = 300):
    """client_metrics(start_s, chunk_times, tokens_per_chunk) -> dict ttft, tpot, itl (vLLM's, as
    the book's client computes them) and itl_per_token (the gaps between the tokens the server produced)."""
    rng = random.Random(seed)
    streams = _hand_picked_streams()
    streams += [served_stream(rng) for _ in range(num_cases - len(streams))]
    for stream in streams:
        start, times, tokens = stream.start_s, stream.chunk_times, stream.tokens_per_chunk
        record = RequestRecord("x", output_tokens=sum(tokens), ttft=times[0] - start, latency=times[-1] - start,
                               chunk_times=list(times))
        expected = {"ttft": record.ttft, "tpot": record.tpot, "itl": record.itl,
                    "itl_per_token": [b - a for a, b in zip(stream.token_times, stream.token_times[1:])]}
        got = learner_call(client_metrics, start, list(times), list(tokens), forbidden=_CLIENT,
                           why="compute it from the chunk times.")
        label = f"start {start:.4g}, chunks at {[round(t, 4) for t in times][:6]}, tokens per chunk {tokens[:6]}"
        if not isinstance(got, dict):
            _fail(f"{label}: return a dict with ttft, tpot, itl and itl_per_token; you returned {got!r}")
        for key in ("ttft", "tpot"):
            if not _close(got.get(key), expected[key]):
                hint = (" (TPOT divides by completion tokens - 1, not by chunks - 1; one token: None)"
                        if key == "tpot" else " (from the POST to the first chunk)")
                _fail(f"{units_hint(got.get(key), expected[key])}{label}: {key} = {got.get(key)}, expected "
                      f"{expected[key]}{hint}")
        itl = list(got.get("itl") or ())
        if len(itl) != len(expected["itl"]) or not all(map(_close, itl, expected["itl"])):
            units = units_hint(itl[0], expected["itl"][0]) if len(itl) == len(expected["itl"]) and itl else ""
            _fail(f"{units}{label}: itl = {got.get('itl')}, expected {expected['itl']} (one gap per pair of chunks, "
                  "as vLLM)")
        per_token = list(got.get("itl_per_token") or ())
        if len(per_token) != sum(tokens) - 1:
            _fail(f"{label}: itl_per_token has {len(per_token)} gaps, a request of {sum(tokens)} tokens has "
                  f"{sum(tokens) - 1} (the first chunk of k tokens holds k - 1 gaps, each later chunk of k "
                  "tokens k: the gap before it and k - 1 inside it)")
        if not all(map(_close, per_token, expected["itl_per_token"])):
            first = next(i for i, (a, b) in enumerate(zip(per_token, expected["itl_per_token"])) if not _close(a, b))
            units = units_hint(sum(per_token), sum(expected["itl_per_token"]))
            if units:
                _fail(f"{units}{label}: itl_per_token adds up to {sum(per_token)}, the server's gaps to "
                      f"{sum(expected['itl_per_token'])}")
            why = ("the first chunk's extra tokens were produced with the first one"
                   if first < tokens[0] - 1 else "a chunk's tokens were produced evenly over the gap before it")
            _fail(f"{label}: itl_per_token = {[round(g, 4) for g in per_token][:8]}, the server's gaps were "
                  f"{[round(g, 4) for g in expected['itl_per_token']][:8]}; gap {first} is off ({why})")
    return passed(f"client_metrics: {num_cases} streams with multi-token chunks measured as vLLM does, "
                  "and their per-token gaps recovered")


# ---------------------------------------------------------------------------
# 3. From guidellm's names back to vLLM's
# ---------------------------------------------------------------------------
def _guidellm_report(ttft_s, latency_s, num_tokens):
    """guidellm 0.8's per-request numbers (src/guidellm/schemas/request_stats.py), in ms."""
    itl = 1e3 * (latency_s - ttft_s) / (num_tokens - 1) if num_tokens > 1 else None
    return itl, 1e3 * latency_s / num_tokens


@checker
def check_guidellm_names(vllm_from_guidellm, seed: int | None = None, *, num_cases: int = 200):
    """vllm_from_guidellm(itl_ms, tpot_ms, num_tokens) -> {"ttft_ms", "tpot_ms", "e2el_ms"}: vLLM's
    numbers for the request guidellm reported."""
    rng = random.Random(seed)
    for case in range(num_cases):
        n = 1 if case == 0 else rng.choice([2, rng.randint(2, 300)])
        ttft = rng.uniform(0.01, 2.0)
        latency = ttft + (0.0 if n == 1 else rng.uniform(0.01, 10.0))
        itl_ms, tpot_ms = _guidellm_report(ttft, latency, n)
        expected = {"ttft_ms": 1e3 * ttft, "tpot_ms": None if n == 1 else 1e3 * (latency - ttft) / (n - 1),
                    "e2el_ms": 1e3 * latency}
        got = learner_call(vllm_from_guidellm, itl_ms, tpot_ms, n, forbidden=_CLIENT, why="use the definitions.")
        call = call_text(vllm_from_guidellm, itl_ms, tpot_ms, n)
        if not isinstance(got, dict):
            _fail(f"{call}: return a dict with ttft_ms, tpot_ms and e2el_ms; you returned {got!r}")
        for key, hint in (
                ("e2el_ms", "guidellm's TPOT is the whole latency over n tokens, the first included"),
                ("tpot_ms", "guidellm's ITL is vLLM's TPOT: the time after the first token over n - 1 gaps "
                            "(None for one token)"),
                ("ttft_ms", "the first token's wait is what the latency holds besides the n - 1 gaps after it")):
            if not _close(got.get(key), expected[key]):
                why = hint
                if key == "tpot_ms" and _close(got.get(key), tpot_ms):
                    why = "the names are swapped: " + hint
                elif key == "ttft_ms" and n > 1 and _close(got.get(key), expected["e2el_ms"] - n * itl_ms):
                    why = "one gap too many: n tokens have n - 1 gaps between them"
                elif units_hint(got.get(key), expected[key], asked="milliseconds"):
                    why = units_hint(got.get(key), expected[key], asked="milliseconds").rstrip(". ")
                _fail(f"{call}: {key} = {got.get(key)}, expected {expected[key]} ({why})")
    return passed(f"vllm_from_guidellm: {num_cases} guidellm reports turned back into vLLM's numbers")


# ---------------------------------------------------------------------------
# 4. Goodput from a client's records
# ---------------------------------------------------------------------------
def _goodput_records(rng: random.Random):
    records = []
    for _ in range(rng.randint(1, 12)):
        n = rng.choice([1, 2, rng.randint(3, 100)])
        ttft = rng.uniform(0.01, 1.0)
        latency = ttft + (0.0 if n == 1 else rng.uniform(0.01, 3.0))
        ok = rng.random() > 0.15
        records.append({"success": ok, "ttft": ttft if ok else None, "latency": latency if ok else None,
                        "output_tokens": n if ok else 0})
    slo_ms = {k: v for k, v in (("ttft", rng.choice([None, 200, 500, 900])), ("tpot", rng.choice([None, 20, 50])),
                                ("e2el", rng.choice([None, None, 1500]))) if v is not None} or {"ttft": 500}
    return records, rng.uniform(1, 20), slo_ms


def _good_count_in_wrong_units(records, slo_ms, scale):
    """Requests meeting every SLO when each value (seconds) is multiplied by `scale` before it is
    compared with the milliseconds: 1 and 1e-3 are the unit slips to name."""
    good = 0
    for r in records:
        if not r["success"]:
            continue
        n = r["output_tokens"]
        values = {"ttft": r["ttft"], "e2el": r["latency"],
                  "tpot": (r["latency"] - r["ttft"]) / (n - 1) if n > 1 else None}
        good += all(values[k] is None or scale * values[k] <= limit for k, limit in slo_ms.items())
    return good


@checker
def check_client_goodput(client_goodput, seed: int | None = None, *, num_cases: int = 200):
    """client_goodput(records, duration_s, slo_ms) -> requests/s that succeeded and met every SLO."""
    rng = random.Random(seed)
    for _ in range(num_cases):
        records, duration_s, slo_ms = _goodput_records(rng)
        objs = [RequestRecord(f"r{i}", output_tokens=r["output_tokens"], ttft=r["ttft"], latency=r["latency"],
                              success=r["success"]) for i, r in enumerate(records)]
        expected = group_metrics(objs, duration_s, slo_ms)["goodput"]
        got = learner_call(client_goodput, [dict(r) for r in records], duration_s, dict(slo_ms), forbidden=_CLIENT,
                           why="apply the SLOs yourself.")
        if not _close(got, expected):
            hint = ""
            if _number(got) and "tpot" in slo_ms and _close(
                    got, sum(o.output_tokens > 1 and o.success and meets_slo_ms(o, slo_ms) for o in objs) / duration_s):
                hint = "A one-token request has no TPOT and meets a TPOT SLO vacuously. "
            elif _number(got) and any(_close(got, _good_count_in_wrong_units(records, slo_ms, s) / duration_s)
                                      for s in (1, 1e-3)):
                hint = ("Seconds against milliseconds: the records' times are in seconds, slo_ms in milliseconds "
                        "(vllm bench serve's --goodput ttft:500 means 500 ms). ")
            _fail(f"{hint}{len(records)} records over {duration_s:.2f} s, SLOs {slo_ms} ms: you said {got}, expected "
                  f"{expected} (successful requests meeting EVERY SLO given, per second)")
    return passed(f"client_goodput: {num_cases} runs scored as vllm bench serve --goodput scores them")


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# ---------------------------------------------------------------------------
# 5. Why mean ITL reads above TPOT when chunks carry several tokens: predict, then measure
# ---------------------------------------------------------------------------
RATIO_TOLERANCE = 0.005


def _measured_ratio(num_tokens, tokens_per_chunk, first_s, token_gap_s):
    """A steady server (first token after first_s, then one every token_gap_s) that sends a chunk
    whenever it holds tokens_per_chunk tokens, and the rest at the end, measured by the book's client."""
    times = [first_s + i * token_gap_s for i in range(num_tokens)]
    ends = list(range(tokens_per_chunk - 1, num_tokens, tokens_per_chunk))
    if not ends or ends[-1] != num_tokens - 1:
        ends.append(num_tokens - 1)
    chunk_times = [times[e] for e in ends]
    record = RequestRecord("x", output_tokens=num_tokens, ttft=chunk_times[0], latency=chunk_times[-1],
                           chunk_times=chunk_times)
    if not record.itl or not record.tpot:
        return None
    return (sum(record.itl) / len(record.itl)) / record.tpot


@checker
def check_itl_over_tpot(fn, seed: int | None = None, *, num_cases: int = 60):
    """fn(num_tokens, tokens_per_chunk) -> the mean ITL over the TPOT that vllm bench serve reports for
    a steady server sending chunks of tokens_per_chunk tokens (None where it reports no ITL or no TPOT);
    measured by the book's client on such streams."""
    rng = random.Random(seed)
    cases = [(100, 1), (101, 4), (100, 4), (10, 3), (3, 5), (1, 1), (2, 1), (9, 8)]
    while len(cases) < num_cases:
        cases.append((rng.choice([rng.randint(1, 20), rng.randint(2, 2000)]), rng.choice([1, 2, 3, 4, 8, 16])))
    for n, k in cases:
        measured = [_measured_ratio(n, k, rng.uniform(0.05, 2.0), rng.uniform(0.002, 0.1)) for _ in range(2)]
        got = learner_call(fn, n, k, forbidden=_CLIENT, why="predict it from the definitions.")
        call = call_text(fn, n, k)
        if measured[0] is None:
            if got is not None:
                _fail(f"{call} returned {got!r}: {n} token(s) in chunks of {k} arrive in "
                      f"{-(-n // k)} chunk(s); vllm bench serve then reports "
                      f"{'no TPOT' if n == 1 else 'no ITL gap and a TPOT of 0'}: return None")
            continue
        if not _number(got) or abs(got - measured[0]) > RATIO_TOLERANCE * measured[0]:
            m = -(-n // k)
            hint = ""
            if _number(got) and math.isclose(got, n / m, rel_tol=RATIO_TOLERANCE) and n % k:
                hint = "Tokens per chunk on average is not it: ITL and TPOT are means over gaps, not over tokens. "
            elif _number(got) and math.isclose(got, k, rel_tol=RATIO_TOLERANCE):
                hint = ("k is how much longer a chunk's gap is than a token's, but that is not the ratio of the two "
                        "means: count the gaps each one divides by, and look at the first and the last chunk. ")
            _fail(f"{hint}{call} returned {got!r}; measured by the book's client on a steady server, mean ITL / TPOT "
                  f"= {measured[0]:.6g} (the pace of the server does not change it: {measured[1]:.6g} at another)")
    return passed(f"itl_over_tpot: {len(cases)} chunkings predicted within {RATIO_TOLERANCE:.1%} of what the client "
                  "measures")
