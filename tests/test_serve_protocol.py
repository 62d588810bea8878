"""The server's pure parts: request parsing, stop strings, /metrics, the client's arithmetic."""
import json
import random

import pytest

from minillm.serve.answers import _StopMatcher
from minillm.serve.bench_client import RequestRecord, arrival_gaps_s, group_metrics, meets_slo_ms, parse_goodput
from minillm.serve.metrics_export import Histogram, parse_prometheus
from minillm.serve.openai_logprobs import MIN_LOGPROB, chat_logprobs, completion_logprobs
from minillm.serve.protocol import APIError, check_model, parse_chat, parse_completion
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
    assert e.value.status == 400 and e.value.type == "context_length_exceeded" and "at most 9" in e.value.message
    assert e.value.body()["error"]["code"] == 400                  # vLLM's: the status, an int


def refused(parse, body, max_model_len=4096) -> APIError:
    with pytest.raises(APIError) as e:
        parse(body, TOK, max_model_len)
    return e.value


def test_a_max_tokens_past_the_context_is_refused_naming_the_numbers():
    # OpenAI and vLLM refuse it; it used to be cut silently to what fits
    e = refused(parse_completion, {"prompt": "x" * 5, "max_tokens": 5}, max_model_len=10)   # 6 prompt tokens
    assert e.status == 400 and e.param == "max_tokens"
    assert all(str(n) in e.message for n in (6, 5, 10, 4)), e.message        # prompt, asked, context, room
    assert parse_completion({"prompt": "x" * 5, "max_tokens": 4}, TOK, 10).params.max_tokens == 4
    e = refused(parse_chat, {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 10**6})
    assert e.param == "max_completion_tokens"


def test_stream_options_without_stream_is_refused_as_vllm_does():
    e = refused(parse_completion, {"prompt": "x", "stream_options": {"include_usage": True}})
    assert e.status == 400 and e.param == "stream_options"
    assert parse_completion({"prompt": "x", "stream": True, "stream_options": {"include_usage": True}},
                            TOK, 4096).include_usage


def test_an_unknown_model_is_a_404_and_no_model_is_fine():
    check_model({}, "tiny")
    check_model({"model": "tiny"}, "tiny")
    with pytest.raises(APIError) as e:
        check_model({"model": "gpt-4"}, "tiny")
    assert e.value.status == 404 and e.value.type == "model_not_found" and e.value.param == "model"
    assert e.value.body()["error"]["code"] == 404 and "gpt-4" in e.value.message


def test_n_above_1_stays_refused_by_name():
    e = refused(parse_completion, {"prompt": "x", "n": 3})
    assert e.param == "n" and "n: must be 1" in e.message


def test_a_prompt_may_be_text_ids_or_a_batch_of_either():
    one = parse_completion({"prompt": "ab"}, TOK, 4096)
    assert one.prompts == [TOK.encode("ab")] and one.prompt_texts == ["ab"]
    ids = parse_completion({"prompt": [5, 6, 7]}, TOK, 4096)
    assert ids.prompts == [[5, 6, 7]] and ids.prompt_texts == [TOK.decode([5, 6, 7], skip_special_tokens=False)]
    batch = parse_completion({"prompt": ["ab", [5, 6], "cde"]}, TOK, 4096)
    assert batch.prompts == [TOK.encode("ab"), [5, 6], TOK.encode("cde")]
    for bad in ([], [[]], ["ok", 3], [[1, "2"]]):
        assert refused(parse_completion, {"prompt": bad}).param == "prompt"
    e = refused(parse_completion, {"prompt": ["fine", "x" * 5000]})
    assert e.type == "context_length_exceeded" and "prompt[1]" in e.message


def test_echo_with_max_tokens_0_runs_one_token_and_asks_for_the_prompts_logprobs():
    req = parse_completion({"prompt": "ab", "echo": True, "max_tokens": 0, "logprobs": 1}, TOK, 4096)
    # vLLM's way: the engine runs max_tokens=1 and the answer drops that token
    assert req.echo_only and req.params.max_tokens == 1
    assert req.params.prompt_logprobs == 1 and req.params.logprobs == 1 and req.top_logprobs == 1
    no_echo = parse_completion({"prompt": "ab", "logprobs": 0}, TOK, 4096)
    assert no_echo.params.prompt_logprobs is None and no_echo.params.logprobs == 0
    e = refused(parse_completion, {"prompt": "ab", "max_tokens": 0})
    assert e.param == "max_tokens" and "echo" in e.message
    for bad in (21, -1, True, "2"):
        assert refused(parse_completion, {"prompt": "ab", "logprobs": bad}).param == "logprobs"


def test_chat_logprobs_and_top_logprobs_follow_openai_and_vllm():
    msgs = [{"role": "user", "content": "hi"}]
    assert parse_chat({"messages": msgs}, TOK, 4096).params.logprobs is None
    assert parse_chat({"messages": msgs, "logprobs": True}, TOK, 4096).params.logprobs == 0
    assert parse_chat({"messages": msgs, "logprobs": True, "top_logprobs": 5}, TOK, 4096).params.logprobs == 5
    assert refused(parse_chat, {"messages": msgs, "top_logprobs": 2}).param == "top_logprobs"   # needs logprobs
    assert refused(parse_chat, {"messages": msgs, "logprobs": True, "top_logprobs": 21}).param == "top_logprobs"


def test_legacy_logprobs_shape_offsets_and_clamping():
    ids = TOK.encode("hey", add_bos=False)
    entries = [None, {ids[1]: -1.0, 7: -0.5}, {ids[2]: float("-inf")}]
    out = completion_logprobs(ids, entries, TOK, first_offset=10)
    assert out["tokens"] == ["h", "e", "y"] and out["text_offset"] == [10, 11, 12]
    assert out["token_logprobs"] == [None, -1.0, MIN_LOGPROB]          # -inf is not JSON
    assert out["top_logprobs"][0] is None
    assert list(out["top_logprobs"][1]) == ["e", TOK.decode([7], skip_special_tokens=False)]   # chosen first
    json.dumps(out, allow_nan=False)


def test_chat_top_logprobs_are_the_k_most_likely_in_order():
    ids = TOK.encode("ab", add_bos=False)
    # the sampled token (a) is not the most likely: OpenAI's top_logprobs rank the alternatives
    entries = [{ids[0]: -3.0, 70: -0.1, 71: -0.7, 72: -2.0}, {ids[1]: -0.2, 70: -0.9}]
    content = chat_logprobs(ids, entries, 2, TOK)
    assert [c["token"] for c in content] == ["a", "b"] and content[0]["logprob"] == -3.0
    assert [t["logprob"] for t in content[0]["top_logprobs"]] == [-0.1, -0.7]
    assert [t["logprob"] for t in content[1]["top_logprobs"]] == [-0.2, -0.9]
    assert content[1]["bytes"] == list(b"b")


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


VLLM_STREAM = _sse({"id": "a", "choices": [{"text": "x"}]}, {"id": "a", "choices": [{"text": "y", "finish_reason": "length"}]},
                   {"id": "a", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
# llama.cpp: a closing chunk with no token, its usage inside it
LLAMA_CPP_STREAM = _sse({"id": "b", "choices": [{"text": "x"}]}, {"id": "b", "choices": [{"text": "y"}]},
                        {"id": "b", "choices": [{"text": "", "finish_reason": "length"}],
                         "usage": {"prompt_tokens": 5, "completion_tokens": 2}})


def _read(body, drop_closing_chunk=False):
    import asyncio

    import httpx

    from minillm.serve.bench_client import stream_one
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))

    async def run():
        async with httpx.AsyncClient(transport=transport) as client:
            return await stream_one(client, "http://server/v1/completions", {}, RequestRecord("req-0"),
                                    drop_closing_chunk=drop_closing_chunk)
    return asyncio.run(run())


@pytest.mark.parametrize("server, body, text, chunks", [
    # vLLM and minillm: the last token's chunk carries the finish_reason; usage comes alone
    ("vllm", VLLM_STREAM, "xy", 2),
    # ...and a last token whose text is still held back (half a UTF-8 character) is a token
    ("minillm", _sse({"id": "a", "choices": [{"text": "x"}]}, {"id": "a", "choices": [{"text": "", "finish_reason": "length"}]},
                     {"id": "a", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}), "x", 2),
    # llama.cpp's closing chunk is a chunk with choices: vllm bench serve counts it, so do we
    ("llama.cpp", LLAMA_CPP_STREAM, "xy", 3),
])
def test_the_client_counts_chunks_as_vllm_bench_serve_and_tokens_from_usage(server, body, text, chunks):
    record = _read(body)
    assert record.success and record.text == text and len(record.chunk_times) == chunks
    assert record.closing_chunk == (server == "llama.cpp")
    assert (record.prompt_tokens, record.output_tokens) == (5, 2)
    assert record.latency == pytest.approx(record.chunk_times[-1] - record.start_time)


def test_llama_cpp_closing_chunk_counted_or_dropped():
    counted, dropped = _read(LLAMA_CPP_STREAM), _read(LLAMA_CPP_STREAM, drop_closing_chunk=True)
    # counted (vLLM's way): 2 gaps for 2 tokens, the last one the closing chunk's; the
    # TPOT's latency ends at that chunk. Dropped: 1 gap, latency ends at the last token
    assert len(counted.itl) == 2 and len(dropped.itl) == 1
    assert counted.closing_chunk and dropped.closing_chunk
    assert dropped.latency == pytest.approx(dropped.chunk_times[-1] - dropped.start_time)
    # the same stream in numbers: tokens 50 ms apart, the closing chunk 1 ms after the last
    rec = RequestRecord("r", output_tokens=2, start_time=0.0, ttft=0.1, latency=0.151,
                        chunk_times=[0.1, 0.15, 0.151], success=True)
    assert rec.itl == pytest.approx([0.05, 0.001])          # vLLM's ITL: mean 25.5 ms, not 50
    assert rec.tpot == pytest.approx(0.051)                # and TPOT 51 ms, not 50


def test_tokens_of_one_step_are_one_gap_on_metrics_as_in_the_engines_itl():
    """Speculative decoding emits several tokens in a step: they share a timestamp, and
    /metrics counts the step's gap once, as RequestMetrics.itl and a streaming client do."""
    from types import SimpleNamespace

    from minillm.request import RequestMetrics
    from minillm.serve.metrics_export import ServerMetrics
    metrics = RequestMetrics(arrival_time=0.0, first_token_time=0.1, token_times=[0.1, 0.3, 0.3, 0.3, 0.6])
    server = ServerMetrics()
    for seen in (1, 4, 5):           # the engine reports after each step: 1, then 3, then 1 more token
        partial = RequestMetrics(arrival_time=0.0, first_token_time=0.1, token_times=metrics.token_times[:seen])
        server.on_token(SimpleNamespace(request_id=0, prompt_len=3, metrics=partial))
    assert server.itl.count == len(metrics.itl) == 2
    assert abs(server.itl.sum - sum(metrics.itl)) < 1e-12
