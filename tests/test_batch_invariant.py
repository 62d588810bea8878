"""Batch-invariant mode (batch_invariant.py, chapter 11): a prompt's KV and logits, and the
engine's tokens and logprobs, are the same bits whatever the chunk size, the neighbours
in its steps, prefix caching, preemption and the torch thread count.

Costs (measured here on one thread, machine shared): see the module's last line.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import minillm
from minillm import LLMEngine, SamplingParams, SchedulerConfig, batch_invariant
from minillm.prefill import prefill_kv
from minillm.validation import ArgumentTypeError

CHUNK_SIZES = (3, 16, 100)
# Beside the prompt's chunk in every step: two decodes and another prompt's chunk.
NEIGHBOURS = [(1, 37), (1, 200), (9, 20)]


def prompt_ids(model, length: int, seed: int = 0) -> list[int]:
    return torch.randint(0, model.cfg.vocab_size, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def assert_same_bits_in_every_configuration(model, ids, chunk_sizes=CHUNK_SIZES, **kwargs):
    kv, logits = prefill_kv(model, ids, batch_invariant=True, **kwargs)
    for chunk_size in chunk_sizes:
        for neighbours in ((), NEIGHBOURS):
            kv_c, logits_c = prefill_kv(model, ids, chunk_size=chunk_size, neighbours=neighbours,
                                        batch_invariant=True, **kwargs)
            where = f"chunk_size={chunk_size}, neighbours={neighbours}"
            assert torch.equal(kv_c, kv), f"KV bits differ with {where}"
            assert torch.equal(logits_c, logits), f"logits bits differ with {where}"
    return kv, logits


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def tiny(request):
    return minillm.build_model("tiny", seed=0, dtype=request.param)


def test_tiny_prefill_bits_equal_across_chunks_and_neighbours(tiny):
    ids = prompt_ids(tiny, 104)
    kv, logits = assert_same_bits_in_every_configuration(tiny, ids)
    # The default engine does differ (so the check above can fail), and the mode stays exact.
    _, default_chunked = prefill_kv(tiny, ids, chunk_size=3, neighbours=NEIGHBOURS)
    _, default_whole = prefill_kv(tiny, ids)
    assert not torch.equal(default_chunked, default_whole)
    _, reference = prefill_kv(tiny, ids, backend="reference")
    tolerance = 1e-4 if tiny.dtype == torch.float32 else 0.1
    assert (logits.float() - reference.float()).abs().max() < tolerance


def test_bits_do_not_depend_on_the_thread_count(tiny):
    ids = prompt_ids(tiny, 90, seed=1)
    threads = torch.get_num_threads()
    try:
        results = []
        for num_threads in (1, 2):
            torch.set_num_threads(num_threads)
            results.append([prefill_kv(tiny, ids, chunk_size=c, neighbours=NEIGHBOURS[:1], batch_invariant=True)
                            for c in (None, 7)])
    finally:
        torch.set_num_threads(threads)
    (kv1, lg1), (kv1c, lg1c) = results[0]
    for kv, lg in results[0][1:] + results[1]:
        assert torch.equal(kv, kv1) and torch.equal(lg, lg1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_the_tiled_attention_holds_where_the_compiled_kernel_does_not_run(monkeypatch, dtype):
    """The compiled kernel takes every row when it is built; without it the torch tiles do:
    they too give the same bits, and the right attention."""
    model = minillm.build_model("tiny", seed=1, dtype=dtype)
    monkeypatch.setattr(batch_invariant, "uses_row_kernel", lambda *args: False)
    ids = prompt_ids(model, 100, seed=2)
    _, logits = assert_same_bits_in_every_configuration(model, ids, chunk_sizes=(5, 64))
    _, reference = prefill_kv(model, ids, backend="reference")
    assert (logits.float() - reference.float()).abs().max() < (1e-4 if dtype == torch.float32 else 0.1)


def test_tiled_attention_is_attention_in_float64():
    """Against explicit softmax(QK^T)V in float64, for a packed step of a chunk and decodes,
    with GQA, across query tiles that cross the diagonal and key tiles past the end."""
    model = minillm.build_model("tiny", seed=2, dtype=torch.float64)
    ids = prompt_ids(model, 70, seed=3)
    for use_kernel in (True, False):
        batch_invariant_logits = []
        with pytest.MonkeyPatch.context() as mp:
            if not use_kernel:
                mp.setattr(batch_invariant, "uses_row_kernel", lambda *args: False)
            batch_invariant_logits = prefill_kv(model, ids, chunk_size=29, neighbours=NEIGHBOURS,
                                                batch_invariant=True)[1]
        reference = prefill_kv(model, ids, backend="reference")[1]
        assert (batch_invariant_logits - reference).abs().max() < 1e-10


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_local_checkpoints_gqa_and_qk_norm(hf_checkpoint, family, dtype):
    _, path = hf_checkpoint(family)
    model = minillm.load_hf_model(path, dtype=dtype, device="cpu")
    assert_same_bits_in_every_configuration(model, prompt_ids(model, 110, seed=4))


def test_triton_backend_is_invariant_as_it_is():
    """Its kernel walks key tiles that are cache blocks, in order, with fixed tile shapes
    (run here in triton's interpreter); the model's linear tiles do the rest."""
    pytest.importorskip("triton")
    from minillm.kernels.triton_attention import why_unavailable
    if why_unavailable("cpu"):
        pytest.skip(why_unavailable("cpu"))
    cfg = minillm.ModelConfig(name="small", vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=2,
                              num_heads=4, num_kv_heads=2, head_dim=16, max_position=256)
    model = minillm.build_model(cfg, seed=0, dtype=torch.float32)
    ids = prompt_ids(model, 24, seed=5)
    kv, logits = prefill_kv(model, ids, backend="triton", batch_invariant=True)
    for chunk_size in (5,):
        kv_c, logits_c = prefill_kv(model, ids, chunk_size=chunk_size, neighbours=NEIGHBOURS[:2],
                                    backend="triton", batch_invariant=True)
        assert torch.equal(kv_c, kv) and torch.equal(logits_c, logits)


@pytest.mark.parametrize("bad", [1, 0, "yes", None, torch.tensor(True)])
def test_batch_invariant_must_be_a_bool(bad):
    model = minillm.build_model("tiny", seed=0)
    with pytest.raises(ArgumentTypeError, match="batch_invariant="):
        prefill_kv(model, [1, 2, 3], batch_invariant=bad)
    with pytest.raises(ArgumentTypeError, match="batch_invariant="):
        LLMEngine(model, batch_invariant=bad)


def test_flash_is_refused_by_name():
    model = minillm.build_model("tiny", seed=0)
    for call in (lambda: prefill_kv(model, [1, 2, 3], backend="flash", batch_invariant=True),
                 lambda: LLMEngine(model, backend="flash", batch_invariant=True)):
        with pytest.raises(ValueError, match=r"batch_invariant=True with backend='flash'"):
            call()


def test_bad_neighbours_are_refused_by_name():
    model = minillm.build_model("tiny", seed=0)
    with pytest.raises(ValueError, match=r"neighbours\[1\]"):
        prefill_kv(model, [1, 2, 3], neighbours=[(1, 5), (0, 3)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_linear_tiles_give_a_row_the_same_bits_in_any_slot_and_any_batch(dtype):
    """Any number of tiles, any slot in a tile, with and without a bias, 1 and 2 threads."""
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(96, 64, generator=gen).to(dtype), torch.randn(96, generator=gen).to(dtype)
    x = torch.randn(70, 64, generator=gen).to(dtype)
    threads = torch.get_num_threads()
    try:
        for num_threads in (1, 2):
            torch.set_num_threads(num_threads)
            for b in (None, bias):
                whole = batch_invariant.linear(x, weight, b)
                for rows in (1, 2, 3, 5, 33):
                    for start in (0, 7, 40):
                        part = batch_invariant.linear(x[start:start + rows], weight, b)
                        assert torch.equal(part, whole[start:start + rows]), (num_threads, rows, start)
                torch.testing.assert_close(whole, F.linear(x, weight, b), rtol=0.02 if dtype != torch.float32 else 1e-5,
                                           atol=0.05 if dtype != torch.float32 else 1e-5)
    finally:
        torch.set_num_threads(threads)


def test_silu_is_silu_and_rounds_every_element_alike():
    x = torch.linspace(-30, 30, 10_001)
    torch.testing.assert_close(batch_invariant.silu(x), F.silu(x))
    for start, length in ((0, 7), (13, 33), (5000, 100)):
        assert torch.equal(batch_invariant.silu(x[start:start + length]), batch_invariant.silu(x)[start:start + length])


# ---------------------------------------------------------------------------
# The engine: tokens and logprobs
# ---------------------------------------------------------------------------
def engine_outputs(model, prompts, params, chunk_size, max_num_seqs, prefix_caching=False, num_blocks=None,
                   warm=False):
    engine = LLMEngine(model, SchedulerConfig(policy="chunked", chunk_size=chunk_size, max_num_seqs=max_num_seqs),
                       enable_prefix_caching=prefix_caching, num_blocks=num_blocks, batch_invariant=True)
    if warm:                                       # a first pass fills the prefix cache
        engine.generate(prompts, params)
    outs = engine.generate(prompts, params)
    return engine, [(o.output_token_ids, o.logprobs) for o in outs]


def test_engine_tokens_and_logprobs_across_chunks_neighbours_caching_and_preemption(tiny):
    shared = prompt_ids(tiny, 40, seed=6)          # a common prefix, as a system prompt
    prompts = [shared + prompt_ids(tiny, 5 + 13 * i, seed=10 + i) for i in range(4)]
    params = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=2)
    _, expected = engine_outputs(tiny, prompts, params, chunk_size=4096, max_num_seqs=1)
    for chunk_size, max_num_seqs, caching in ((3, 4, True), (100, 2, False)):
        engine, got = engine_outputs(tiny, prompts, params, chunk_size, max_num_seqs, caching, warm=caching)
        assert got == expected, f"chunk_size={chunk_size}, max_num_seqs={max_num_seqs}, prefix caching={caching}"
        if caching:
            assert engine.block_manager.num_hit_tokens > 0
    # A pool too small for all four at once: requests are preempted and recomputed.
    engine, got = engine_outputs(tiny, prompts, params, chunk_size=16, max_num_seqs=4, num_blocks=7)
    assert sum(r.num_preemptions for r in engine.requests.values()) > 0
    assert got == expected


def test_smollm2_prefill_bits_equal_across_chunks_and_neighbours():
    """A 104-token chat prompt in chunks of 16 and 100 with neighbours, and its first 30 tokens
    in chunks of 3 (a chunk of 3 pads every linear layer's GEMM to 32 rows: 10 steps, not 35)."""
    from minillm.book.chats import chat_requests
    for dtype in (torch.float32, torch.bfloat16):
        model, tok = minillm.pretrained("smollm2-135m-instruct", dtype=dtype)
        ids = tok.apply_chat_template([{"role": "user", "content": chat_requests(3)[2]}])[:104]
        for prompt, configurations in ((ids, ((16, NEIGHBOURS), (100, NEIGHBOURS[:1]))), (ids[:30], ((3, ()),))):
            kv, logits = prefill_kv(model, prompt, batch_invariant=True)
            for chunk_size, neighbours in configurations:
                kv_c, logits_c = prefill_kv(model, prompt, chunk_size=chunk_size, neighbours=neighbours,
                                            batch_invariant=True)
                assert torch.equal(kv_c, kv) and torch.equal(logits_c, logits), (dtype, chunk_size, neighbours)


def test_smollm2_32_chats_same_tokens_and_logprobs_chunked_alone_and_cached():
    """All 32 chats, 4 greedy tokens each, logprobs compared bit for bit. The prompts are what
    costs (~4,000 tokens a configuration), so two configurations that differ in every factor
    at once: whole prompts with all 32 chats in every step and no prefix caching, against
    chunks of 64, one chat at a time (no neighbours), prefix caching on (each chat finds the
    template's system prompt cached). bfloat16, the dtype GPU engines serve in, where the
    default engine's texts do change (chapter 11's study)."""
    from minillm.book.chats import chat_requests
    model, tok = minillm.pretrained("smollm2-135m-instruct", dtype=torch.bfloat16)
    prompts = [tok.apply_chat_template([{"role": "user", "content": m}]) for m in chat_requests(32)]
    params = SamplingParams(max_tokens=4, ignore_eos=True, logprobs=1)
    _, expected = engine_outputs(model, prompts, params, chunk_size=8192, max_num_seqs=32)
    engine, got = engine_outputs(model, prompts, params, chunk_size=64, max_num_seqs=1, prefix_caching=True)
    assert engine.block_manager.num_hit_tokens > 0
    same = sum(g == e for g, e in zip(got, expected))
    assert same == 32, f"{same}/32 chats have the same tokens and logprobs"
