"""Log-probabilities out of the engine (logprobs.py): output tokens and prompt tokens,
across chunks, neighbours, prefix caching and preemption, against a whole prefill's
logits and against transformers."""
from __future__ import annotations

import pytest
import torch

import minillm
from minillm import LLMEngine, SamplingParams, SchedulerConfig
from minillm.logprobs import MAX_LOGPROBS, logprob_dicts


@pytest.fixture(scope="module")
def model64():
    return minillm.build_model("tiny", seed=0, dtype=torch.float64)


PROMPT = [(7 * i + 3) % 200 + 1 for i in range(57)]


def reference_logprobs(model, ids):
    """log_softmax of a whole prefill's logits, float64: row p scores token p + 1."""
    _, logits = minillm.prefill_kv(model, ids, backend="reference")
    return torch.log_softmax(logits.double(), dim=-1)


def prompt_errors(out, ids, ref) -> float:
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    return max(abs(out.prompt_logprobs[p][ids[p]] - ref[p - 1, ids[p]].item()) for p in range(1, len(ids)))


@pytest.mark.parametrize("chunk_size", [3, 16, 100, 512])
def test_prompt_logprobs_equal_a_whole_prefill_whatever_the_chunk(model64, chunk_size):
    ref = reference_logprobs(model64, PROMPT)
    engine = LLMEngine(model64, SchedulerConfig(policy="chunked", chunk_size=chunk_size))
    # Neighbours share the steps: a decode and another prompt being chunked.
    outs = engine.generate([list(range(1, 30)), PROMPT, [9, 8, 7]],
                           [SamplingParams(max_tokens=6), SamplingParams(max_tokens=2, prompt_logprobs=3),
                            SamplingParams(max_tokens=9)])
    assert prompt_errors(outs[1], PROMPT, ref) < 1e-12
    entry = outs[1].prompt_logprobs[10]
    top3 = torch.topk(ref[9], 3).indices.tolist()
    assert list(entry)[0] == PROMPT[10]                    # the prompt's own token first
    assert set(entry) == {PROMPT[10], *top3} and len(entry) in (3, 4)
    # The neighbours asked for nothing and got nothing.
    assert outs[0].prompt_logprobs is None and outs[0].logprobs is None


def test_output_logprobs_hold_the_sampled_token_then_the_top_k(model64):
    engine = LLMEngine(model64, SchedulerConfig(chunk_size=16))
    out = engine.generate([PROMPT], SamplingParams(max_tokens=5, logprobs=4, ignore_eos=True))[0]
    assert len(out.logprobs) == len(out.output_token_ids) == 5
    ref = reference_logprobs(model64, PROMPT + out.output_token_ids)
    for i, (token, entry) in enumerate(zip(out.output_token_ids, out.logprobs)):
        row = ref[len(PROMPT) - 1 + i]
        assert list(entry)[0] == token and abs(entry[token] - row[token].item()) < 1e-12
        assert list(entry)[1:] == [t for t in torch.topk(row, 4).indices.tolist() if t != token][:len(entry) - 1]
        assert token == int(row.argmax())                   # greedy: the sampled token is the top one
        assert len(entry) == 4                              # ...so it is among the top 4: k entries


def test_logprobs_zero_gives_the_chosen_token_alone(model64):
    engine = LLMEngine(model64, SchedulerConfig())
    out = engine.generate([PROMPT[:9]], SamplingParams(max_tokens=2, logprobs=0, prompt_logprobs=0))[0]
    assert all(len(e) == 1 for e in out.logprobs) and all(len(e) == 1 for e in out.prompt_logprobs[1:])


def test_sampled_logprobs_are_the_raw_models_not_the_temperatures(model64):
    """vLLM's raw_logprobs: temperature and top-k shape the sampling, not the reported logprob."""
    engine = LLMEngine(model64, SchedulerConfig())
    out = engine.generate([PROMPT], SamplingParams(max_tokens=4, temperature=1.7, top_k=5, seed=3,
                                                   logprobs=1, ignore_eos=True))[0]
    ref = reference_logprobs(model64, PROMPT + out.output_token_ids)
    for i, (token, entry) in enumerate(zip(out.output_token_ids, out.logprobs)):
        assert abs(entry[token] - ref[len(PROMPT) - 1 + i, token].item()) < 1e-12


def test_a_stop_token_ends_the_logprobs_with_the_tokens(model64):
    engine = LLMEngine(model64, SchedulerConfig())
    free = engine.generate([PROMPT], SamplingParams(max_tokens=6, ignore_eos=True))[0].output_token_ids
    out = engine.generate([PROMPT], SamplingParams(max_tokens=6, stop_token_ids=[free[2]], logprobs=2,
                                                   ignore_eos=True))[0]
    assert out.finish_reason == "stop" and len(out.logprobs) == len(out.output_token_ids) <= 3


def test_prompt_logprobs_skip_the_prefix_cache_and_others_still_hit_it(model64):
    ref = reference_logprobs(model64, PROMPT)
    engine = LLMEngine(model64, SchedulerConfig(chunk_size=16), enable_prefix_caching=True)
    engine.generate([PROMPT], SamplingParams(max_tokens=2))             # fills the cache
    hits_before = engine.block_manager.num_hit_tokens
    out = engine.generate([PROMPT], SamplingParams(max_tokens=2, prompt_logprobs=1))[0]
    assert engine.block_manager.num_hit_tokens == hits_before          # no cached block: no logits there
    assert prompt_errors(out, PROMPT, ref) < 1e-12
    engine.generate([PROMPT], SamplingParams(max_tokens=2))
    assert engine.block_manager.num_hit_tokens > hits_before           # the cache itself still serves


def test_a_preempted_request_keeps_one_logprob_per_prompt_position(model64):
    ref = reference_logprobs(model64, PROMPT)
    # 6 blocks of 16 tokens for two requests that want 4 each: one is preempted and recomputed.
    engine = LLMEngine(model64, SchedulerConfig(chunk_size=16, max_num_seqs=2), num_blocks=6)
    outs = engine.generate([PROMPT, PROMPT[::-1]],
                           [SamplingParams(max_tokens=20, prompt_logprobs=2, logprobs=1, ignore_eos=True)] * 2)
    assert sum(engine.requests[o.request_id].num_preemptions for o in outs) > 0
    assert prompt_errors(outs[0], PROMPT, ref) < 1e-12
    assert prompt_errors(outs[1], PROMPT[::-1], reference_logprobs(model64, PROMPT[::-1])) < 1e-12
    assert all(len(o.logprobs) == len(o.output_token_ids) == 20 for o in outs)


def test_only_the_requests_that_ask_pay_for_the_lm_head(model64, monkeypatch):
    """Rows through the LM head per step: one per sampling request, plus the prompt rows
    of the request that asked for prompt logprobs, and nothing more."""
    engine = LLMEngine(model64, SchedulerConfig(chunk_size=20))
    rows = []
    forward = engine.executor.runner.model.forward

    def counting(token_ids, positions, batch, kv_cache, logits_indices=None, backend=None):
        rows.append(len(logits_indices))
        return forward(token_ids, positions, batch, kv_cache, logits_indices=logits_indices, backend=backend)

    monkeypatch.setattr(engine.executor.runner.model, "forward", counting)
    engine.generate([PROMPT, PROMPT[:40]], SamplingParams(max_tokens=3))
    plain = sum(rows)
    assert plain == 2 * 3                                   # one row per emitted token, no more
    rows.clear()
    engine.generate([PROMPT, PROMPT[:40]], [SamplingParams(max_tokens=3, prompt_logprobs=1), SamplingParams(max_tokens=3)])
    assert sum(rows) == plain + len(PROMPT) - 1             # + a row per scored prompt token


def test_prompt_logprobs_match_transformers_in_float32(hf_checkpoint):
    hf_model, path = hf_checkpoint("llama")
    model = minillm.load_hf_model(path, dtype=torch.float32)
    ids = [(5 * i + 2) % 96 for i in range(40)]
    with torch.no_grad():
        hf = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].double(), dim=-1)
    engine = LLMEngine(model, SchedulerConfig(chunk_size=16))
    out = engine.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=2))[0]
    assert prompt_errors(out, ids, hf) < 1e-4


def test_logprob_dicts_checks_its_rows():
    with pytest.raises(ValueError, match="chosen has 1 tokens for 2 rows"):
        logprob_dicts(torch.zeros(2, 5), [1], 2)
    assert logprob_dicts(torch.zeros(0, 5), [], 2) == []


@pytest.mark.parametrize("name", ["logprobs", "prompt_logprobs"])
@pytest.mark.parametrize("bad", [-1, MAX_LOGPROBS + 1, 1.5, True, "3"])
def test_bad_logprobs_counts_are_refused_by_name(name, bad):
    with pytest.raises(ValueError, match=f"{name}={bad!r}: must be an integer in \\[0, {MAX_LOGPROBS}\\]"):
        SamplingParams(**{name: bad})
