"""The server as evaluation tools use it, on SmolLM2-135M-Instruct, against transformers
loading the same GGUF file in float32 (its own dequantization and unpermutation).

- The official openai client's completions.create(..., logprobs=2, echo=True,
  max_tokens=0) gives the prompt's log-probabilities (and the top 2) within 1e-4 of
  transformers', on the default server and on one that splits the prompt into chunks
  of 16 with prefix caching on (a request that asks for prompt log-probabilities
  skips the cache, as vLLM V1 does; the blocks cached by an earlier request are there).
- lm-evaluation-harness (`lm_eval --model local-completions`) runs the tasks shipped
  in data/lm_eval/ offline against `python -m minillm serve --model
  smollm2-135m-instruct`: every log-likelihood it logged equals transformers' on the
  same token ids within 1e-4, its is_greedy flags agree, and every greedy generation
  is transformers' greedy text cut at the task's stop strings.
- An EOS finish is "stop" on /metrics and in the e2e histogram.

Cost: two server starts and transformers' GGUF load, side by side (15-60 s), and
the harness (40-100 s, its imports most of it): 1.5 to 4.5 minutes on 2 cores, the
longer on a machine busy with other work.
"""
import json

import httpx
import pytest
import torch

from minillm.serve import eval_harness
from minillm.serve.launch import ServerProcess
from minillm.serve.metrics_export import parse_prometheus

transformers = pytest.importorskip("transformers")
pytest.importorskip("lm_eval")

MODEL = eval_harness.MODEL
TEXT = ("The quick brown fox jumps over the lazy dog. In 1969, Apollo 11 landed on the Moon; "
        "Neil Armstrong said: \"That's one small step for man, one giant leap for mankind.\" "
        "Caf\u00e9s in Paris serve cr\u00e8me br\u00fbl\u00e9e; a chunked prefill reads the prompt "
        "sixteen tokens at a time, and each chunk's logits score the next tokens.")


@pytest.fixture(scope="module")
def servers(hf_model_loader):
    """The default server and one with chunks of 16 and prefix caching, started side by
    side while transformers loads the same file (three slow starts overlapped)."""
    both = {"default": ServerProcess(["--model", MODEL], startup_timeout_s=300),
            "chunked": ServerProcess(["--model", MODEL, "--chunk-size", "16", "--enable-prefix-caching"],
                                     startup_timeout_s=300)}
    for s in both.values():
        s.launch()
    try:
        hf_model_loader()
        for s in both.values():
            s.wait_ready()
        yield both
    finally:
        for s in both.values():                  # SIGTERM to both, then wait: stopped side by side too
            if s.process.poll() is None:
                s.process.terminate()
        for s in both.values():
            s.stop()


@pytest.fixture(scope="module")
def server(servers):
    return servers["default"]


@pytest.fixture(scope="module")
def chunked_server(servers):
    return servers["chunked"]


@pytest.fixture(scope="module")
def tokenizer_dir(server, tmp_path_factory):
    return eval_harness.write_hf_tokenizer(eval_harness.book_tokenizer(), tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def hf_tok(tokenizer_dir):
    return transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))


@pytest.fixture(scope="module")
def hf_model_loader():
    """transformers' own GGUF loading, float32 (its parser swapped for one without memmap
    overhead, as tests/test_real_model.py does), once."""
    box = {}

    def load():
        if "model" not in box:
            import gguf

            from minillm.gguf_loader import _reader_class
            from minillm.pretrained_models import gguf_path
            path = gguf_path(MODEL)
            mp = pytest.MonkeyPatch()
            mp.setattr(gguf, "GGUFReader", _reader_class())
            try:
                box["model"] = transformers.AutoModelForCausalLM.from_pretrained(
                    str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
            finally:
                mp.undo()
        return box["model"]
    return load


@pytest.fixture(scope="module")
def hf_model(servers, hf_model_loader):
    return hf_model_loader()


def reference_logprobs(hf_model, ids) -> torch.Tensor:
    """[len(ids), vocab] log-probabilities; row p predicts token p + 1."""
    with torch.inference_mode():
        return torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_the_hf_tokenizer_written_from_the_gguf_encodes_as_minillm(hf_tok):
    ours = eval_harness.book_tokenizer()
    for text in (TEXT, "Question: What is the capital of France?\nAnswer: Paris", "caf\u00e9 <|im_end|> 1234"):
        assert hf_tok(text, add_special_tokens=False).input_ids == ours.encode(text)
    assert hf_tok.eos_token == "<|im_end|>" and hf_tok.eos_token_id in ours.eos_token_ids


@pytest.mark.parametrize("which", ["default", "chunks of 16, prefix caching"])
def test_openai_client_echo_logprobs_equal_transformers(which, request, hf_model, hf_tok):
    import openai
    s = request.getfixturevalue("server" if which == "default" else "chunked_server")
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
    ids = hf_tok(TEXT, add_special_tokens=False).input_ids
    assert len(ids) > 3 * 16                                     # several chunks on the chunked server
    if which != "default":                                      # its blocks are in the prefix cache...
        before = parse_prometheus(httpx.get(s.url + "/metrics").text)
        for _ in range(2):
            client.completions.create(model=MODEL, prompt=TEXT, max_tokens=1)
        after = parse_prometheus(httpx.get(s.url + "/metrics").text)
        key = f'minillm:prefix_cache_hits_total{{model_name="{MODEL}"}}'
        assert after[key] - before.get(key, 0) >= 16, "the second request should have hit the cache"
    out = client.completions.create(model=MODEL, prompt=TEXT, logprobs=2, echo=True, max_tokens=0)
    if which != "default":                                      # ...and this prompt went in chunks of 16
        rid = httpx.get(s.url + "/debug/requests").json()["requests"][-1]["engine_request_id"]
        chunks = [n for step in httpx.get(s.url + "/debug/steps").json()["steps"]
                  for r, n in step["scheduled"] if r == rid]
        assert sum(chunks) == len(ids) and max(chunks) == 16 and len(chunks) == -(-len(ids) // 16)
    lp = out.choices[0].logprobs
    assert out.choices[0].text == TEXT and len(lp.tokens) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    ref = reference_logprobs(hf_model, ids)
    expected = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    ours = torch.tensor(lp.token_logprobs[1:], dtype=torch.float32)
    worst = (ours - expected).abs().max().item()
    print(f"\n{which}: {len(ids)} prompt tokens, worst |logprob - transformers| = {worst:.2e}")
    assert worst < 1e-4
    for position, top in enumerate(lp.top_logprobs[1:]):
        best2 = torch.topk(ref[position], 2).values
        assert sorted(top.values(), reverse=True)[:2] == pytest.approx(best2.tolist(), abs=1e-4)
    assert sum(lp.token_logprobs[1:]) == pytest.approx(expected.sum().item(), abs=1e-3)


def encode_pair(hf_tok, context: str, continuation: str):
    """lm-eval 0.4.13's TemplateLM._encode_pair for a causal model: trailing spaces of
    the context move to the continuation; the whole is encoded, then split."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = hf_tok(context + continuation, add_special_tokens=False).input_ids
    context_ids = hf_tok(context, add_special_tokens=False).input_ids
    return context_ids, whole[len(context_ids):]


def greedy_text(hf_model, hf_tok, prompt: str, max_new_tokens: int, stops) -> str:
    ids = hf_tok(prompt, add_special_tokens=False).input_ids
    with torch.inference_mode():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                eos_token_id=hf_tok.eos_token_id, pad_token_id=hf_tok.eos_token_id)
    text = hf_tok.decode(out[0, len(ids):], skip_special_tokens=True)
    cut = min([text.find(s) for s in stops if s in text], default=len(text))
    return text[:cut]


def test_lm_evaluation_harness_scores_equal_transformers(server, tokenizer_dir, hf_model, hf_tok, tmp_path):
    table = eval_harness.run_lm_eval(server.url, tokenizer_dir, output_path=tmp_path)
    print("\n" + table)
    assert "|minillm_capitals" in table and "|minillm_completions" in table   # the harness's own table
    samples = eval_harness.read_samples(tmp_path)
    assert set(samples) == set(eval_harness.TASKS)

    worst = 0.0
    for sample in samples["minillm_capitals"]:
        for args, resp in zip(sample["arguments"].values(), sample["resps"]):
            context_ids, continuation_ids = encode_pair(hf_tok, args["arg_0"], args["arg_1"])
            ids = context_ids + continuation_ids
            ref = reference_logprobs(hf_model, ids)
            rows = torch.arange(len(context_ids) - 1, len(ids) - 1)
            expected = ref[rows, torch.tensor(continuation_ids)]
            logprob, is_greedy = float(resp[0][0]), resp[0][1] in (True, "True")
            worst = max(worst, abs(logprob - expected.sum().item()))
            assert logprob == pytest.approx(expected.sum().item(), abs=1e-4), args
            assert is_greedy == bool((ref[rows].argmax(-1) == torch.tensor(continuation_ids)).all())
    print(f"{sum(len(s['resps']) for s in samples['minillm_capitals'])} log-likelihoods, "
          f"worst |harness - transformers| = {worst:.2e}")

    for sample in samples["minillm_completions"]:
        args = sample["arguments"]["gen_args_0"]
        kwargs = args["arg_1"]
        expected = greedy_text(hf_model, hf_tok, args["arg_0"], kwargs["max_gen_toks"],
                               kwargs["until"] + [hf_tok.eos_token])
        assert sample["resps"][0][0] == expected, args["arg_0"]


def test_an_eos_finish_is_stop_on_metrics_and_in_the_e2e_histogram(server):
    label = f'model_name="{MODEL}"'
    before = parse_prometheus(httpx.get(server.url + "/metrics").text)
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 32, "temperature": 0}).json()
    assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] < 32   # its EOS
    text = httpx.get(server.url + "/metrics").text
    after = parse_prometheus(text)
    delta = lambda key: after.get(key, 0) - before.get(key, 0)      # noqa: E731
    assert delta(f'minillm:request_success_total{{finished_reason="stop",{label}}}') == 1
    assert delta(f"minillm:e2e_request_latency_seconds_count{{{label}}}") == 1
    assert '"eos"' not in text
    assert json.loads(httpx.get(server.url + "/v1/models").text)["data"][0]["id"] == MODEL
