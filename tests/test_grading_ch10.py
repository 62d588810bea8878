"""Chapter 10's checkers: a correct answer passes, each shortcut fails with "Not yet"."""
import json

import pytest

import minillm.grading as ex
from minillm.grading._common import ExerciseFailed
from minillm.grading._reference import ch10 as ref
from minillm.serve.bench_client import RequestRecord, group_metrics


def chunk_times_by_text(events):          # a chunk with empty text still carries a token
    out = []
    for t, line in events:
        if line.startswith("data: {"):
            choices = json.loads(line[6:]).get("choices")
            if choices and choices[0].get("text"):
                out.append(t)
    return out


def chunk_times_with_usage(events):       # the usage chunk carries no token
    return [t for t, line in events if line.startswith("data: {")]


def metrics_per_chunk(start_s, chunk_times, tokens_per_chunk):   # TPOT over chunks, not tokens
    m = ref.client_metrics(start_s, chunk_times, tokens_per_chunk)
    n = len(chunk_times)
    m["tpot"] = (chunk_times[-1] - chunk_times[0]) / (n - 1) if n > 1 else None
    return m


def metrics_without_first_zeros(start_s, chunk_times, tokens_per_chunk):
    m = ref.client_metrics(start_s, chunk_times, tokens_per_chunk)
    m["itl_per_token"] = [g for g in m["itl_per_token"]][tokens_per_chunk[0] - 1:]
    return m


def metrics_from_the_client(start_s, chunk_times, tokens_per_chunk):
    record = RequestRecord("x", output_tokens=sum(tokens_per_chunk), ttft=chunk_times[0] - start_s,
                           latency=chunk_times[-1] - start_s, chunk_times=list(chunk_times))
    return {"ttft": record.ttft, "tpot": record.tpot, "itl": record.itl,
            "itl_per_token": ref.client_metrics(start_s, chunk_times, tokens_per_chunk)["itl_per_token"]}


def guidellm_swapped(ttft, latency, n):
    right = ref.guidellm_metrics(ttft, latency, n)
    return {"itl": right["tpot"], "tpot": right["itl"]}


def goodput_strict_tpot(records, duration_s, slo_ms):   # a one-token request fails a TPOT SLO here
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


def goodput_ref(records, duration_s, slo_ms):
    objs = [RequestRecord("r", output_tokens=r["output_tokens"], ttft=r["ttft"], latency=r["latency"],
                          success=r["success"]) for r in records]
    good = 0
    for o in objs:
        values = {"ttft": o.ttft, "e2el": o.latency,
                  "tpot": (o.latency - o.ttft) / (o.output_tokens - 1) if o.success and o.output_tokens > 1 else None}
        good += o.success and all(values[k] is None and k == "tpot" or (values[k] is not None and 1e3 * values[k] <= v)
                                  for k, v in slo_ms.items())
    return good / duration_s


CORRECT = {"check_token_chunk_times": ref.token_chunk_times, "check_client_metrics": ref.client_metrics,
           "check_guidellm_names": ref.guidellm_metrics, "check_client_goodput": goodput_ref}
SHORTCUTS = [   # (checker, attempt, what the first line of the message must say)
    ("check_token_chunk_times", chunk_times_by_text, "empty still carries a token"),
    ("check_token_chunk_times", chunk_times_with_usage, "usage chunk"),
    ("check_client_metrics", metrics_per_chunk, "completion tokens - 1"),
    ("check_client_metrics", metrics_without_first_zeros, "itl_per_token has"),
    ("check_client_metrics", metrics_from_the_client, "the engine's own answer"),
    ("check_guidellm_names", guidellm_swapped, "guidellm's"),
    ("check_client_goodput", goodput_strict_tpot, "vacuously"),
    ("check_client_goodput", goodput_from_the_client, "the engine's own answer"),
]


@pytest.mark.parametrize("checker", sorted(CORRECT))
def test_a_correct_answer_passes(checker, capsys):
    assert getattr(ex, checker)(CORRECT[checker], seed=3) is None
    out = capsys.readouterr().out
    assert out.startswith("✓") and out.count("\n") == 1, out


@pytest.mark.parametrize("checker,fn,says", SHORTCUTS, ids=[f"{c}-{f.__name__}" for c, f, _ in SHORTCUTS])
def test_a_shortcut_fails_with_a_helpful_message(checker, fn, says):
    with pytest.raises(ExerciseFailed) as failure:
        getattr(ex, checker)(fn, seed=3)
    first_line = str(failure.value).splitlines()[0]
    assert says in first_line, first_line
    assert failure.value._render_traceback_()[0] == "Not yet: " + first_line
