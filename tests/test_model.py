"""model.py: RoPE, GQA, the packed forward pass and its argument checks."""
import pytest
import torch

from minillm import ModelConfig, build_model, prefill_kv
from minillm.kv_cache import PagedKVCache
from minillm.model import apply_rope, rope_cos_sin, rope_inverse_frequencies
from minillm.model_runner import ModelRunner, StepChunk
from minillm.prefill import prepare_step
from minillm.kv_cache import BlockManager

SMALL = ModelConfig(name="small", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                    num_heads=4, num_kv_heads=2, max_position=64, bos_token_id=0, eos_token_id=1)


def _ids(n, vocab=64, seed=0):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_rope_preserves_vector_lengths():
    cos, sin = rope_cos_sin(SMALL, torch.arange(10), torch.float64)
    x = torch.randn(10, 3, SMALL.head_dim, dtype=torch.float64)
    torch.testing.assert_close(apply_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1))


def test_rope_scores_depend_only_on_the_distance_between_positions():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, SMALL.head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, SMALL.head_dim, generator=g, dtype=torch.float64)

    def score(pos_q, pos_k):
        cq, sq = rope_cos_sin(SMALL, torch.tensor([pos_q]), torch.float64)
        ck, sk = rope_cos_sin(SMALL, torch.tensor([pos_k]), torch.float64)
        return float((apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum())

    assert score(7, 3) == pytest.approx(score(40, 36), abs=1e-12)
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-6)


def test_rope_at_position_zero_is_the_identity():
    cos, sin = rope_cos_sin(SMALL, torch.zeros(1, dtype=torch.long), torch.float32)
    x = torch.randn(1, 2, SMALL.head_dim)
    assert torch.equal(apply_rope(x, cos, sin), x)


def test_linear_rope_scaling_divides_every_frequency_by_the_factor():
    scaled = SMALL.replace(rope_scaling={"rope_type": "linear", "factor": 4.0})
    torch.testing.assert_close(rope_inverse_frequencies(scaled), rope_inverse_frequencies(SMALL) / 4)


def test_gqa_model_has_smaller_k_and_v_projections():
    model = build_model(SMALL)
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.weight.shape == (SMALL.num_heads * SMALL.head_dim, SMALL.hidden_size)
    assert attn.k_proj.weight.shape == (SMALL.num_kv_heads * SMALL.head_dim, SMALL.hidden_size)


def test_gqa_equals_multi_head_attention_with_repeated_kv_heads():
    gqa = build_model(SMALL, dtype=torch.float64)
    mha = build_model(SMALL.replace(num_kv_heads=SMALL.num_heads), dtype=torch.float64)
    group, d = SMALL.num_heads // SMALL.num_kv_heads, SMALL.head_dim
    state = gqa.state_dict()
    for name, w in state.items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            # kv head j serves query heads j*group .. j*group+group-1
            state[name] = w.view(SMALL.num_kv_heads, d, -1).repeat_interleave(group, 0).reshape(-1, w.shape[1])
    mha.load_state_dict(state)
    ids = _ids(12)
    torch.testing.assert_close(prefill_kv(gqa, ids)[1], prefill_kv(mha, ids)[1], atol=1e-12, rtol=0)


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_chunked_prefill_gives_the_full_prefill_logits_in_float64(backend):
    model = build_model(SMALL, dtype=torch.float64)
    ids = _ids(37)
    kv_full, logits_full = prefill_kv(model, ids, backend=backend)
    kv_chunk, logits_chunk = prefill_kv(model, ids, chunk_size=8, backend=backend)
    torch.testing.assert_close(kv_chunk, kv_full, atol=1e-12, rtol=0)
    torch.testing.assert_close(logits_chunk, logits_full, atol=1e-12, rtol=0)


def test_backends_give_the_same_logits():
    model = build_model(SMALL, dtype=torch.float64)
    ids = _ids(20)
    torch.testing.assert_close(prefill_kv(model, ids, backend="reference")[1],
                               prefill_kv(model, ids, backend="sdpa")[1], atol=1e-12, rtol=0)


def test_a_packed_step_gives_each_request_its_own_logits():
    model = build_model(SMALL, dtype=torch.float64)
    a, b = _ids(9, seed=1), _ids(5, seed=2)
    alone_a, alone_b = prefill_kv(model, a)[1][-1], prefill_kv(model, b)[1][-1]
    blocks = BlockManager(8, 4)
    blocks.allocate("a", 9), blocks.allocate("b", 5)
    runner = ModelRunner(model, blocks)
    logits = runner.execute([StepChunk("a", a, 0), StepChunk("b", b, 0)])
    torch.testing.assert_close(logits[0], alone_a, atol=1e-12, rtol=0)
    torch.testing.assert_close(logits[1], alone_b, atol=1e-12, rtol=0)


def test_tied_model_has_no_separate_lm_head():
    tied = build_model(SMALL.replace(tie_word_embeddings=True))
    assert tied.lm_head_weight() is tied.model.embed_tokens.weight
    assert sum(p.numel() for p in tied.parameters()) == tied.cfg.num_parameters()


@pytest.mark.parametrize("preset", ["tiny"])
def test_parameter_count_matches_the_config(preset):
    model = build_model(preset)
    assert sum(p.numel() for p in model.parameters()) == model.cfg.num_parameters()


def test_prepare_step_runs_one_step_of_the_given_shape():
    model = build_model(SMALL)
    run = prepare_step(model, [(4, 0), (1, 6), (1, 3)])
    assert run().shape == (3, SMALL.vocab_size)


# ---- bad input ---------------------------------------------------------------
def test_token_ids_out_of_the_vocabulary_are_value_errors_naming_the_argument():
    model = build_model(SMALL)
    with pytest.raises(ValueError, match="token_ids contains 64"):
        prefill_kv(model, [1, 2, 64])
    with pytest.raises(ValueError, match="token_ids contains -1"):
        prefill_kv(model, [-1, 2])


def test_empty_input_is_a_value_error_naming_the_argument():
    model = build_model(SMALL)
    with pytest.raises(ValueError, match="token_ids"):
        prefill_kv(model, [])
    with pytest.raises(ValueError, match="token_ids is empty"):
        model.check_token_ids(torch.tensor([], dtype=torch.long))


def test_prompt_longer_than_the_model_is_a_value_error():
    with pytest.raises(ValueError, match="token_ids has 65 tokens"):
        prefill_kv(build_model(SMALL), [1] * 65)


@pytest.mark.parametrize("chunk_size", [0, -3, 2.5, True])
def test_bad_chunk_size_is_a_value_error_naming_it(chunk_size):
    with pytest.raises(ValueError, match="chunk_size="):
        prefill_kv(build_model(SMALL), [1, 2, 3], chunk_size=chunk_size)


def test_kv_cache_with_another_dtype_is_a_value_error():
    model = build_model(SMALL)
    blocks = BlockManager(2, 4)
    blocks.allocate("r", 3)
    runner = ModelRunner(model, blocks)
    runner.kv_cache = PagedKVCache.for_model(SMALL, 2, 4, torch.float64, "cpu")
    with pytest.raises(ValueError, match="kv_cache dtype"):
        runner.execute([StepChunk("r", [1, 2, 3], 0)])


def test_bad_step_shape_is_a_value_error_naming_it():
    model = build_model(SMALL)
    with pytest.raises(ValueError, match="shape"):
        prepare_step(model, [])
    with pytest.raises(ValueError, match=r"shape\[0\]"):
        prepare_step(model, [(0, 3)])


