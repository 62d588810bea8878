"""The server over HTTP, on the tiny model, bound to 127.0.0.1 on a free port.

One server process serves most tests (module fixture); the queue-bound and
SIGTERM tests start their own. Nothing here asserts a wall time: the machine
is shared. Assertions are on what load cannot change: token ids, counts,
status codes, error shapes, the order of events, inequalities that
causality fixes (a client's TTFT contains the engine's), and one same-run ratio:
the same requests timed by the client and by the engine (marked `timing`, so
tests/test_busy_machine.py runs it again beside a busy loop per core).
"""
import asyncio
import json
import random
import time

import httpx
import pytest

import minillm
from minillm.serve.bench_client import benchmark
from minillm.serve.launch import ServerProcess
from minillm.serve.metrics_export import parse_prometheus
from minillm.tokenizer import ByteTokenizer


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--model", "tiny", "--max-num-seqs", "64", "--chunk-size", "256"]) as s:
        print(f"\nserver start to first /health answer on tiny: {s.startup_s:.1f} s")
        yield s


@pytest.fixture(scope="module")
def offline_engine():
    model = minillm.build_model("tiny", seed=0)
    return minillm.LLMEngine(model, minillm.SchedulerConfig(max_num_seqs=64))


def greedy(engine, prompts, max_tokens):
    params = minillm.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [o.output_token_ids for o in engine.generate([ByteTokenizer().encode(p) for p in prompts], params)]


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process and its threads so far (Linux), else None."""
    import os
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")     # utime, stime


def metrics(url):
    return parse_prometheus(httpx.get(url + "/metrics").text)


def test_server_starts_and_answers_its_first_request(server):
    t = time.perf_counter()
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60)
    first_answer_s = time.perf_counter() - t
    cpu_s = process_cpu_s(server.process.pid)
    print(f"start to /health: {server.startup_s:.1f} s; first answer: {first_answer_s:.2f} s more; "
          f"server CPU time so far: {cpu_s} s")
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    # Under 10 s to a first answer (issue 29), judged on what load cannot stretch: the CPU
    # time the server spent starting and answering (imports, the model, the step), which
    # is its wall time on a quiet machine (3-5 s here). A busy machine stretches the wall
    # clock, not this.
    if cpu_s is not None:
        assert cpu_s < 10, f"the server used {cpu_s:.1f} s of CPU to start and answer"
    models = httpx.get(server.url + "/v1/models").json()["data"]
    assert models[0]["id"] == "tiny" and models[0]["root"] == "tiny"
    assert httpx.get(server.url + "/health").status_code == 200


def test_official_openai_client_streams_the_offline_greedy_tokens(server, offline_engine):
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    prompt = "The official client reads this stream"
    chunks = list(client.completions.create(
        model="tiny", prompt=prompt, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True, "return_token_ids": True}))
    token_chunks = [c for c in chunks if c.choices]
    assert [t for c in token_chunks for t in c.choices[0].token_ids] == greedy(offline_engine, [prompt], 12)[0]
    assert len(token_chunks) == 12, "one chunk per token, the first one carrying the first token"
    assert token_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 12 and chunks[-1].usage.prompt_tokens == len(prompt) + 1

    chat = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        max_completion_tokens=5, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True}))
    with_choices = [c for c in chat if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant", "the first chunk names the role..."
    assert len(with_choices) == 5, "...in the first token's chunk: no role-only chunk before it"
    assert chat[-1].usage.completion_tokens == 5


BAD_INPUTS = [
    ("/v1/completions", b'{"prompt": "x", "max_tokens": ', "body"),
    ("/v1/completions", b'["a list"]', "body"),
    ("/v1/completions", {"prompt": 42, "max_tokens": 4}, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, "max_tokens"),
    ("/v1/completions", {"prompt": "x" * 5000, "max_tokens": 4}, "prompt"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, "top_p"),
    ("/v1/completions", {"prompt": "x", "n": 2}, "n"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 5000}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "suffix": "!"}, "suffix"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, "stream"),
    ("/v1/chat/completions", {"messages": "hello"}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -3},
     "max_completion_tokens"),
]


@pytest.mark.parametrize("path,body,param", BAD_INPUTS, ids=[p for _, _, p in BAD_INPUTS])
def test_bad_input_gets_400_in_the_openai_error_shape_naming_the_field(server, path, body, param):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(server.url + path, timeout=30, **kwargs)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == 400, "vLLM's code: the HTTP status, an int"
    assert error["param"] == param and error["type"] in ("invalid_request_error", "context_length_exceeded")
    assert param.split("[")[0] in error["message"]


def test_unknown_fields_are_ignored_and_known_ones_honoured(server, offline_engine):
    body = {"prompt": "abc", "max_tokens": 6, "temperature": 0, "ignore_eos": True, "repetition_penalty": 1.0,
            "logprobs": None, "some_future_field": {"x": 1}, "return_token_ids": True}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == greedy(offline_engine, ["abc"], 6)[0]
    seeded = [httpx.post(server.url + "/v1/completions", timeout=30, json={
        "prompt": "abc", "max_tokens": 8, "temperature": 1.0, "seed": 7, "ignore_eos": True,
        "return_token_ids": True}).json()["choices"][0]["token_ids"] for _ in range(2)]
    assert seeded[0] == seeded[1], "the same seed samples the same tokens"


def engine_logprobs(engine, prompt_ids, k, max_tokens):
    """The engine's own prompt and output logprobs for a greedy request (the reference)."""
    params = minillm.SamplingParams(max_tokens=max_tokens, ignore_eos=True, logprobs=k, prompt_logprobs=k)
    return engine.generate([prompt_ids], params)[0]


def test_echo_logprobs_and_a_batch_of_prompts_match_the_engine(server, offline_engine):
    tok = ByteTokenizer()
    prompts = ["Score this prompt", tok.encode("and these ids")]
    body = {"prompt": prompts, "max_tokens": 3, "temperature": 0, "ignore_eos": True, "logprobs": 2, "echo": True,
            "return_token_ids": True}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    assert [c["index"] for c in r["choices"]] == [0, 1]
    for choice, prompt in zip(r["choices"], prompts):
        ids = tok.encode(prompt) if isinstance(prompt, str) else prompt
        ref = engine_logprobs(offline_engine, ids, 2, 3)
        lp = choice["logprobs"]
        assert choice["token_ids"] == ref.output_token_ids
        assert len(lp["tokens"]) == len(ids) + 3 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        expected = [e[t] for e, t in zip(ref.prompt_logprobs[1:] + ref.logprobs, ids[1:] + ref.output_token_ids)]
        assert lp["token_logprobs"][1:] == pytest.approx(expected, abs=1e-4)
        assert all(1 <= len(top) <= 3 for top in lp["top_logprobs"][1:])            # the token + the top 2
        assert choice["text"].startswith(tok.decode(ids, skip_special_tokens=False))   # echo: the prompt first
        assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    assert r["usage"]["prompt_tokens"] == sum(len(tok.encode(p)) if isinstance(p, str) else len(p) for p in prompts)
    assert r["usage"]["completion_tokens"] == 6

    # streamed: the same numbers, the prompt's in each choice's first chunk
    streamed = {0: [], 1: []}
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    streamed[c["index"]] += c["logprobs"]["token_logprobs"]
    for i, choice in enumerate(r["choices"]):
        assert streamed[i] == pytest.approx(choice["logprobs"]["token_logprobs"], abs=1e-4)


def test_echo_with_max_tokens_0_returns_the_prompt_alone(server, offline_engine):
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    prompt = "Only the prompt comes back"
    out = client.completions.create(model="tiny", prompt=prompt, logprobs=2, echo=True, max_tokens=0)
    ids = ByteTokenizer().encode(prompt)
    ref = engine_logprobs(offline_engine, ids, 2, 1)
    choice = out.choices[0]
    assert choice.text == ByteTokenizer().decode(ids, skip_special_tokens=False)
    assert len(choice.logprobs.tokens) == len(ids) and choice.logprobs.token_logprobs[0] is None
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(
        [e[t] for e, t in zip(ref.prompt_logprobs[1:], ids[1:])], abs=1e-4)
    # as vLLM: the one token the engine computed is counted in usage, and finishes as "length"
    assert out.usage.completion_tokens == 1 and choice.finish_reason == "length"


def test_chat_logprobs_streamed_and_final_agree_in_openais_shape(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0, "ignore_eos": True,
            "logprobs": True, "top_logprobs": 3}
    final = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    content = final["choices"][0]["logprobs"]["content"]
    assert len(content) == 5
    for item in content:
        assert set(item) == {"token", "logprob", "bytes", "top_logprobs"} and len(item["top_logprobs"]) == 3
        ranked = [t["logprob"] for t in item["top_logprobs"]]
        assert ranked == sorted(ranked, reverse=True)
        assert item["logprob"] == ranked[0]                     # greedy: the chosen one is the most likely
    streamed = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                streamed += [item for c in json.loads(line[6:])["choices"] for item in c["logprobs"]["content"]]
    assert [i["token"] for i in streamed] == [i["token"] for i in content]
    assert [i["logprob"] for i in streamed] == pytest.approx([i["logprob"] for i in content], abs=1e-5)
    no_logprobs = httpx.post(server.url + "/v1/chat/completions", json={**body, "logprobs": False, "top_logprobs": 0},
                             timeout=60).json()
    assert no_logprobs["choices"][0]["logprobs"] is None


def test_an_unknown_model_is_a_404_the_official_client_raises_on(server):
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4o", prompt="hi", max_tokens=1)
    assert e.value.status_code == 404
    assert e.value.body["type"] == "model_not_found" and e.value.body["code"] == 404
    assert e.value.body["param"] == "model"


def test_a_stop_string_finishes_as_stop_counted_in_e2e_with_the_model_label(server):
    # the tiny model's greedy tokens are mostly ids past the bytes (no text): a seeded sample has text
    body = {"prompt": "stop strings", "max_tokens": 24, "temperature": 1.0, "seed": 0, "ignore_eos": True}
    text = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    start = next(k for k in range(1, len(text) - 1) if text.find(text[k]) == k)   # a character's first place
    before = metrics(server.url)
    r = httpx.post(server.url + "/v1/completions", json={**body, "stop": [text[start]]}, timeout=60).json()
    assert r["choices"][0]["finish_reason"] == "stop" and r["choices"][0]["text"] == text[:start]
    label = 'model_name="tiny"'
    deadline = time.monotonic() + 30                    # the engine counts it at its next step boundary
    while (after := metrics(server.url)).get(f'minillm:request_success_total{{finished_reason="stop",{label}}}', 0) \
            == before.get(f'minillm:request_success_total{{finished_reason="stop",{label}}}', 0):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    delta = lambda key: after.get(key, 0) - before.get(key, 0)      # noqa: E731
    assert delta(f'minillm:request_success_total{{finished_reason="stop",{label}}}') == 1
    assert delta(f'minillm:request_success_total{{finished_reason="abort",{label}}}') == 0
    assert delta(f"minillm:e2e_request_latency_seconds_count{{{label}}}") == 1     # it used to be left out
    stamps = httpx.get(server.url + "/debug/requests").json()["requests"]
    assert stamps[-1]["id"] == r["id"] and stamps[-1]["finish_reason"] == "stop"


async def _stream(client, url, prompt, max_tokens, disconnect_after):
    """(token ids, finish_reason); closes the connection after disconnect_after chunks when not None."""
    ids, reason = [], None
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "return_token_ids": True}
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            ids += choice["token_ids"]
            reason = choice["finish_reason"]
            if disconnect_after is not None and len(ids) >= disconnect_after:
                return ids, "client left"
    return ids, reason


def test_64_streams_a_quarter_disconnected_the_rest_exact_no_block_leaked(server, offline_engine):
    rng = random.Random(0)
    num, max_tokens = 64, 10
    prompts = [f"stream {i}: " + "abcdefgh"[i % 8] * rng.randint(4, 30) for i in range(num)]
    leaving = set(rng.sample(range(num), num // 4))
    leave_after = {i: rng.randint(1, max_tokens - 3) for i in leaving}
    before = metrics(server.url)

    async def run():
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=None)) as client:
            return await asyncio.gather(*(_stream(client, server.url, p, max_tokens, leave_after.get(i))
                                          for i, p in enumerate(prompts)))
    results = asyncio.run(run())
    expected = greedy(offline_engine, prompts, max_tokens)
    for i, (ids, reason) in enumerate(results):
        if i in leaving:
            assert ids == expected[i][:len(ids)], f"stream {i}: its tokens before it left"
        else:
            assert reason == "length" and ids == expected[i], f"stream {i} differs from offline greedy"

    deadline = time.monotonic() + 30                 # aborts are handled at the next step boundary
    while (state := httpx.get(server.url + "/debug/engine").json())["has_unfinished_requests"]:
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    assert state["num_free_blocks"] == state["num_blocks"], "a request left KV blocks behind"

    after = metrics(server.url)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    assert delta['minillm:request_arrivals_total{model_name="tiny"}'] == num
    # a stream that leaves late may have been finished by the engine before its abort arrived
    finished = delta['minillm:request_success_total{finished_reason="length",model_name="tiny"}']
    aborted = delta.get('minillm:request_success_total{finished_reason="abort",model_name="tiny"}', 0)
    assert finished + aborted == num and num - len(leaving) <= finished
    generated = delta['minillm:generation_tokens_total{model_name="tiny"}']
    received = sum(len(ids) for ids, _ in results)
    assert received <= generated <= (num - len(leaving)) * max_tokens + len(leaving) * max_tokens
    assert delta['minillm:time_to_first_token_seconds_count{model_name="tiny"}'] == num
    assert delta['minillm:inter_token_latency_seconds_count{model_name="tiny"}'] == generated - num
    assert after['minillm:num_requests_running{model_name="tiny"}'] == 0
    assert after['minillm:num_requests_waiting{model_name="tiny"}'] == 0


@pytest.mark.timing
def test_bench_client_agrees_with_the_engine_stamps_of_the_same_requests(server):
    # 512-token prompts: a first token takes long enough (hundreds of ms on a quiet machine,
    # seconds on a busy one) that HTTP's few milliseconds are a small part of it
    result = benchmark(server.url, num_prompts=8, input_len=512, output_len=32, max_concurrency=8,
                       compare_engine=True, seed=1, goodput=["ttft:60000", "tpot:60000"])
    assert result["completed"] == 8 and result["failed"] == 0
    stamps = {s["id"]: s for s in httpx.get(server.url + "/debug/requests").json()["requests"]}
    for rec in result["requests"]:
        engine = stamps[rec["response_id"]]
        # one chunk per token, and the client counts what the engine made
        assert len(rec["chunk_times"]) == rec["output_tokens"] == engine["completion_tokens"] == 32
        # the client's interval contains the engine's: POST before arrival, first chunk after the token
        assert rec["ttft"] >= engine["ttft"] and rec["latency"] >= engine["token_times"][-1] - engine["arrival_time"]
    cmp = result["engine_comparison"]
    print(f"client/engine, same run: TTFT {cmp['ttft_ratio']:.3f}, TPOT {cmp['tpot_ratio']:.3f}, "
          f"ITL {cmp['itl_ratio']:.3f}")
    # the same requests seen from both ends agree within 10% (measured: TTFT x1.02, TPOT and
    # ITL x1.00, quiet and with two busy loops); the client's TTFT contains the engine's
    assert 1.0 <= cmp["ttft_ratio"] <= 1.10
    # 31 gaps: the client's TPOT and ITL move from the engine's only by the jitter of deliveries
    assert 0.90 <= cmp["tpot_ratio"] <= 1.10 and 0.90 <= cmp["itl_ratio"] <= 1.10
    assert result["goodput"] == pytest.approx(8 / result["duration_s"])


def test_full_waiting_queue_is_refused_at_once_and_sigterm_exits_0():
    s = ServerProcess(["--model", "tiny", "--max-num-seqs", "1", "--max-waiting", "1"]).start()
    try:
        async def run():
            async with httpx.AsyncClient(timeout=120) as client:
                # 4000 tokens: the first request still runs however slow or fast the machine is;
                # leaving its stream below disconnects it (aborted), which frees the slot
                body = {"prompt": "x", "max_tokens": 4000, "ignore_eos": True, "stream": True}
                async with client.stream("POST", s.url + "/v1/completions", json=body) as running:
                    # held in a name: a line iterator left for the garbage collector is closed
                    # by asyncio's finalizer, which closes the stream and aborts the request
                    lines = running.aiter_lines()
                    async for line in lines:                     # the first request is running...
                        if line.startswith("data: "):
                            break
                    waiting = asyncio.create_task(client.post(s.url + "/v1/completions", json={
                        "prompt": "y", "max_tokens": 2}))
                    while (await client.get(s.url + "/debug/engine")).json()["num_waiting"] < 1:
                        await asyncio.sleep(0.01)                  # ...and the second waits
                    refused = await client.post(s.url + "/v1/completions", json={"prompt": "z", "max_tokens": 2})
                    still_running = not waiting.done()
                    await lines.aclose()
                return refused, still_running, await waiting
        refused, still_running, waited = asyncio.run(run())
        assert refused.status_code == 429 and refused.json()["error"]["code"] == 429
        assert refused.headers["retry-after"] == "1"
        assert still_running, "the refusal came while the first request still ran: at once, not after a wait"
        assert waited.status_code == 200
    finally:
        exit_code = s.stop()
    assert exit_code == 0, "SIGTERM: stop accepting, finish or abort what runs, exit 0"


def test_side_by_side_runs_each_server_alone_on_the_same_prompts():
    from minillm.serve.side_by_side import run_side_by_side
    specs = ["minillm --model tiny --policy prefill_first", "minillm --model tiny --max-num-batched-tokens 64"]
    rows = run_side_by_side(specs, workload="interference", num_streams=2, input_len=16, output_len=12,
                            long_prompt_len=256, long_output_len=2, long_after_tokens=4, seed=0)
    assert [r["server"] for r in rows] == specs
    assert all(r["completed"] == 3 and r["failed"] == 0 for r in rows)
    # the same seed: the same prompts, token for token, sent to each server
    prompts = [{q["tag"]: q["prompt_tokens"] for q in r["result"]["requests"]} for r in rows]
    assert prompts[0] == prompts[1] and abs(prompts[0]["long"] - 256) <= 2     # fitted by /tokenize
    assert all(r["itl_max_ms"] >= r["itl_p99_ms"] >= r["itl_p50_ms"] > 0 for r in rows)


@pytest.mark.parametrize("spec, match", [("vllm serve x", "must start with one of"),
                                         ("llama.cpp --mlock", "not known here"),
                                         ("llama.cpp -b many", "llama.cpp flags")])
def test_side_by_side_refuses_a_bad_server_spec_naming_it(spec, match):
    from minillm.__main__ import main
    from minillm.serve.side_by_side import LlamaServer, parse_server_spec
    with pytest.raises(ValueError, match=match):
        kind, flags = parse_server_spec(spec)
        LlamaServer(flags)
    assert main(["bench", "serve", "--server", spec, "--num-prompts", "0"]) == 2
