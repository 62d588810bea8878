"""The server's pure parts: request parsing, stop strings, /metrics, the client's arithmetic."""
import json
import random

import pytest

from minillm.serve.app import _StopMatcher
from minillm.serve.bench_client import RequestRecord, arrival_gaps_s, group_metrics, meets_slo_ms, parse_goodput
from minillm.serve.metrics_export import Histogram, parse_prometheus
from minillm.serve.protocol import APIError, parse_chat, parse_completion
from minillm.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def test_max_completion_tokens_wins_and_defaults_fit_the_context():
    req = parse_completion({"prompt": "abc", "max_tokens": 5, "max_completion_tokens": 7}, TOK, 4096)
    assert req.params.max_tokens == 7
    assert parse_completion({"prompt": "abc"}, TOK, 10, default_max_tokens=256).params.max_tokens == 6
    assert parse_completion({"prompt": [1, 2, 3], "top_k": -1}, TOK, 4096).params.top_k is None


def test_a_prompt_the_context_cannot_hold_names_the_limit():
    with pytest.raises(APIError) as e:
        parse_completion({"prompt": "x" * 9}, TOK, 10)
    assert e.value.status == 400 and e.value.code == "context_length_exceeded" and "at most 9" in e.value.message


def test_chat_content_parts_join_like_a_string():
    as_parts = parse_chat({"messages": [{"role": "user", "content": [{"type": "text", "text": "he"},
                                                                     {"type": "text", "text": "llo"}]}]}, TOK, 4096)
    as_text = parse_chat({"messages": [{"role": "user", "content": "hello"}]}, TOK, 4096)
    assert as_parts.prompt_token_ids == as_text.prompt_token_ids


@pytest.mark.parametrize("pieces,stop,expected", [
    (["Hel", "lo wor", "ld"], ["o w"], "Hell"),
    (["ab", "c"], ["abd"], "abc"),               # held back, then released when it cannot match
    (["x", "ST", "OP", "y"], ["STOP"], "x"),
])
def test_stop_strings_cut_the_text_before_the_match(pieces, stop, expected):
    m, out, stopped = _StopMatcher(stop), "", False
    for piece in pieces:
        text, stopped = m.push(piece)
        out += text
        if stopped:
            break
    if not stopped:
        out += m.flush()
    assert out == expected


def test_histogram_buckets_are_cumulative_and_parse_back():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.5, 0.5, 3.0):
        h.observe(v)
    values = parse_prometheus("\n".join(h.lines("x")))
    assert values['x_bucket{le="0.1"}'] == 1 and values['x_bucket{le="1.0"}'] == 3
    assert values['x_bucket{le="+Inf"}'] == values["x_count"] == 4 and values["x_sum"] == pytest.approx(4.05)


def test_gamma_arrivals_keep_the_mean_rate_and_burstiness_spreads_them():
    rng = random.Random(0)
    poisson = arrival_gaps_s(rng, 20000, 4.0, 1.0)
    bursty = arrival_gaps_s(rng, 20000, 4.0, 0.25)
    assert sum(poisson) / len(poisson) == pytest.approx(0.25, rel=0.05)
    assert sum(bursty) / len(bursty) == pytest.approx(0.25, rel=0.1)
    var = lambda xs: sum((x - 0.25) ** 2 for x in xs) / len(xs)      # noqa: E731
    assert var(bursty) > 3 * var(poisson)      # gamma(k): variance 1/(k rate^2)


def test_client_metrics_follow_vllm_bench_serve():
    # 5 tokens in 3 chunks (a chunk carried 3): TPOT counts tokens, ITL counts chunks
    rec = RequestRecord("req-0", prompt_tokens=10, output_tokens=5, start_time=0.0, ttft=0.1, latency=0.5,
                        chunk_times=[0.1, 0.2, 0.5], success=True)
    assert rec.tpot == pytest.approx(0.1) and rec.itl == pytest.approx([0.1, 0.3])
    m = group_metrics([rec], duration_s=1.0, slo_ms={"ttft": 200, "tpot": 50})
    assert m["itl_ms"]["mean"] == pytest.approx(200) and m["tpot_ms"]["mean"] == pytest.approx(100)
    assert m["goodput"] == 0 and m["slo_attainment"] == 0
    assert meets_slo_ms(rec, {"ttft": 200, "tpot": 100.001})


def test_goodput_flags_are_checked():
    assert parse_goodput(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    for bad in (["itl:5"], ["ttft:fast"], ["tpot:-1"]):
        with pytest.raises(ValueError, match="--goodput"):
            parse_goodput(bad)


def test_llama_server_command_carries_the_chunking_flags(monkeypatch, tmp_path):
    from minillm.serve import peer
    monkeypatch.setattr(peer, "llama_server_path", lambda: None)
    with pytest.raises(FileNotFoundError, match="make peer"):
        peer.llama_server_command(8001)
    binary = tmp_path / "llama-server"
    binary.write_text("")
    monkeypatch.setattr(peer, "llama_server_path", lambda: binary)
    for amx in (False, True):
        monkeypatch.setattr(peer, "cpu_has_amx", lambda amx=amx: amx)
        cmd = peer.llama_server_command(8001, batch_size=256, parallel=9, gguf="m.gguf")
        assert cmd[cmd.index("-b") + 1] == "256" and cmd[cmd.index("-ub") + 1] == "256"
        assert cmd[cmd.index("-c") + 1] == str(9 * 4096) and cmd[cmd.index("--host") + 1] == "127.0.0.1"
        assert ("--no-repack" in cmd) == amx      # ggml's AMX path dies with SIGILL otherwise (llama.cpp #26954)


def _sse(*chunks) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("server, body, text", [
    # vLLM and minillm: the last token's chunk carries the finish_reason; usage comes alone
    ("vllm", _sse({"id": "a", "choices": [{"text": "x"}]}, {"id": "a", "choices": [{"text": "y", "finish_reason": "length"}]},
                  {"id": "a", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}), "xy"),
    # ...and a last token whose text is still held back (half a UTF-8 character) is a token
    ("minillm", _sse({"id": "a", "choices": [{"text": "x"}]}, {"id": "a", "choices": [{"text": "", "finish_reason": "length"}]},
                     {"id": "a", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}), "x"),
    # llama.cpp: a closing chunk with no token, its usage inside it
    ("llama.cpp", _sse({"id": "b", "choices": [{"text": "x"}]}, {"id": "b", "choices": [{"text": "y"}]},
                       {"id": "b", "choices": [{"text": "", "finish_reason": "length"}],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 2}}), "xy"),
])
def test_the_client_counts_tokens_not_chunks_from_either_servers_stream(server, body, text):
    import asyncio

    import httpx

    from minillm.serve.bench_client import stream_one
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))

    async def run():
        async with httpx.AsyncClient(transport=transport) as client:
            return await stream_one(client, "http://server/v1/completions", {}, RequestRecord("req-0"))
    record = asyncio.run(run())
    assert record.success and record.text == text and len(record.chunk_times) == 2
    assert (record.prompt_tokens, record.output_tokens) == (5, 2)
    assert record.latency == pytest.approx(record.chunk_times[-1] - record.start_time)
