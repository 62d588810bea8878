"""prefill.py: chunked prefill writes the same KV and logits as a full prefill;
prepare_step builds a step of any shape; the entry points' argument checks."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import minillm
from minillm import prefill_kv
from minillm.config import ModelConfig
from minillm.prefill import check_chunk_size, check_prompt, prepare_step


@st.composite
def small_configs(draw):
    num_kv_heads = draw(st.sampled_from([1, 2, 4]))
    group = draw(st.sampled_from([1, 2, 4]))            # group > 1: GQA (or MQA)
    num_heads = num_kv_heads * group
    head_dim = draw(st.sampled_from([8, 16]))
    hidden = draw(st.sampled_from([32, 48, 64]))
    return ModelConfig(
        name="hyp", vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden,
        num_layers=draw(st.integers(1, 2)), num_heads=num_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, max_position=128, rope_theta=draw(st.sampled_from([100.0, 10000.0])),
        qk_norm=draw(st.booleans()), attention_bias=draw(st.booleans()))


def _model(cfg, seed, dtype):
    model = minillm.build_model(cfg, seed=seed, dtype=dtype)
    # A larger init than the default 0.02 makes attention far from uniform,
    # so a wrong mask or position would show.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.mul_(10)
    return model


SMALL = ModelConfig(name="small", vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2,
                    num_heads=4, num_kv_heads=2, max_position=256)


@pytest.fixture(scope="module")
def small_model():
    return _model(SMALL, 0, torch.float32)


@settings(max_examples=25, deadline=None)
@given(cfg=small_configs(), seed=st.integers(0, 2**16), data=st.data())
def test_chunked_prefill_equals_full_prefill_for_any_config_prompt_and_chunk_size(cfg, seed, data):
    num_tokens = data.draw(st.integers(1, 32), label="num_tokens")
    chunk_size = data.draw(st.integers(1, 2 * num_tokens), label="chunk_size")
    block_size = data.draw(st.sampled_from([1, 4, 16]), label="block_size")
    backend = data.draw(st.sampled_from(["reference", "sdpa"]), label="backend")
    tokens = torch.randint(0, cfg.vocab_size, (num_tokens,),
                           generator=torch.Generator().manual_seed(seed)).tolist()

    model = _model(cfg, seed, torch.float64)
    kv_full, logits_full = prefill_kv(model, tokens, backend=backend, block_size=block_size)
    kv_chunk, logits_chunk = prefill_kv(model, tokens, chunk_size, backend=backend,
                                        block_size=block_size)
    assert kv_full.shape == (cfg.num_layers, 2, num_tokens, cfg.num_kv_heads, cfg.head_dim)
    assert logits_full.shape == (num_tokens, cfg.vocab_size)
    assert (kv_chunk - kv_full).abs().max() <= 1e-10
    assert (logits_chunk - logits_full).abs().max() <= 1e-10

    model = model.to(torch.float32)
    kv_full, logits_full = prefill_kv(model, tokens, backend=backend, block_size=block_size)
    kv_chunk, logits_chunk = prefill_kv(model, tokens, chunk_size, backend=backend,
                                        block_size=block_size)
    assert (kv_chunk - kv_full).abs().max() <= 1e-5 * kv_full.abs().max()
    assert (logits_chunk - logits_full).abs().max() <= 1e-5 * logits_full.abs().max()


def test_full_prefill_matches_a_plain_causal_transformer_written_out():
    """The cache path against the textbook formula: no cache, one square mask."""
    cfg = ModelConfig(name="t", vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, max_position=64)
    model = _model(cfg, 0, torch.float64)
    tokens = torch.randint(0, 32, (20,), generator=torch.Generator().manual_seed(1))
    kv, logits = prefill_kv(model, tokens)

    from minillm.attention import reference_attention
    from minillm.model import apply_rope, rope_cos_sin
    x = model.model.embed_tokens(tokens)
    cos, sin = rope_cos_sin(cfg, torch.arange(20), torch.float64)
    for i, layer in enumerate(model.model.layers):
        attn, h = layer.self_attn, layer.input_layernorm(x)
        q = apply_rope(attn.q_proj(h).view(20, 4, 8), cos, sin)
        k = apply_rope(attn.k_proj(h).view(20, 2, 8), cos, sin)
        v = attn.v_proj(h).view(20, 2, 8)
        assert torch.allclose(kv[i, 0], k, atol=1e-12) and torch.allclose(kv[i, 1], v, atol=1e-12)
        x = x + attn.o_proj(reference_attention(q, k, v).reshape(20, 32))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    expected = model.model.norm(x) @ model.lm_head_weight().T
    assert torch.allclose(logits, expected, atol=1e-12)


def test_chunking_with_a_chunk_of_the_whole_prompt_or_more_is_bit_identical(small_model):
    model = small_model
    tokens = list(range(40))
    kv, logits = prefill_kv(model, tokens)
    for chunk_size in (40, 41, 1000):
        kv2, logits2 = prefill_kv(model, tokens, chunk_size)
        assert torch.equal(kv, kv2) and torch.equal(logits, logits2)


def test_greedy_next_tokens_agree_between_chunked_and_full_prefill(small_model):
    model = small_model
    tokens = torch.randint(0, 64, (48,), generator=torch.Generator().manual_seed(3)).tolist()
    _, logits = prefill_kv(model, tokens)
    for chunk_size in (1, 7, 47):
        _, logits_chunk = prefill_kv(model, tokens, chunk_size)
        assert torch.equal(logits.argmax(-1), logits_chunk.argmax(-1))


@pytest.mark.parametrize("chunk_size", [0, -3])
def test_non_positive_chunk_size_is_refused_by_name(chunk_size, small_model):
    model = small_model
    with pytest.raises(ValueError, match=f"chunk_size={chunk_size}"):
        prefill_kv(model, [1, 2, 3], chunk_size=chunk_size)


@pytest.mark.parametrize("chunk_size", [2.5, 4.0, "8", True])
def test_non_integer_chunk_size_is_refused_by_name(chunk_size, small_model):
    model = small_model
    with pytest.raises(ValueError, match="chunk_size"):
        prefill_kv(model, [1, 2, 3], chunk_size=chunk_size)


def test_empty_prompt_is_refused_by_name(small_model):
    model = small_model
    for empty in ([], torch.tensor([], dtype=torch.long)):
        with pytest.raises(ValueError, match="token_ids"):
            prefill_kv(model, empty)


def test_prompt_longer_than_the_maximum_position_is_refused_by_name():
    cfg = ModelConfig(name="t", vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1,
                      num_heads=2, num_kv_heads=1, max_position=16)
    model = minillm.build_model(cfg, seed=0)
    prefill_kv(model, [1] * 16)                      # exactly the maximum is fine
    with pytest.raises(ValueError, match="token_ids has 17 tokens.*maximum position 16"):
        prefill_kv(model, [1] * 17)


def test_out_of_vocabulary_token_is_refused_by_name(small_model):
    with pytest.raises(ValueError, match="token_ids contains 64"):
        prefill_kv(small_model, [1, 64])


# ---- prepare_step and the argument checks ---------------------------------------
@pytest.fixture(scope="module")
def model64():
    cfg = ModelConfig(name="small", vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2,
                      num_heads=4, num_kv_heads=2, max_position=256)
    return minillm.build_model(cfg, seed=0, dtype=torch.float64)


def test_prepare_step_runs_one_step_of_the_requested_shape(model64):
    run = prepare_step(model64, [(8, 0), (1, 12), (3, 5, False)])
    assert run().shape == (2, 64)


@pytest.mark.parametrize("shape", [[], [(0, 4)], [(2, -1)]])
def test_prepare_step_refuses_empty_or_negative_shapes(model64, shape):
    with pytest.raises(ValueError, match="shape"):
        prepare_step(model64, shape)


def test_check_prompt_accepts_lists_and_tensors_and_names_bad_ones(model64):
    assert check_prompt(model64, torch.tensor([[1, 2, 3]])) == [1, 2, 3]
    with pytest.raises(ValueError, match="prompt=\\[\\]"):
        check_prompt(model64, [], arg="prompt")
    with pytest.raises(TypeError, match="token_ids"):
        check_prompt(model64, [1.5])
    with pytest.raises(TypeError, match="token_ids"):
        check_prompt(model64, 7)
    with pytest.raises(ValueError, match="-1"):
        check_prompt(model64, [-1])
    with pytest.raises(ValueError, match="257 tokens"):
        check_prompt(model64, [0] * 257)


def test_check_chunk_size_passes_none_and_positive_integers_only():
    assert check_chunk_size(None) is None and check_chunk_size(512) == 512
    for bad in (0, -1, 1.5, "64", True, None.__class__):
        with pytest.raises(ValueError, match="chunk_size"):
            check_chunk_size(bad)
