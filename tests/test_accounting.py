"""accounting.py: FLOPs and bytes per op and per step."""
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils.flop_counter import FlopCounterMode

from minillm.sim import accounting
from minillm.sim.accounting import causal_pairs, prefill_cost, prefill_flops, step_cost
from minillm.config import ModelConfig

LLAMA3 = ModelConfig.preset("llama-3-8b")
TINY = ModelConfig.preset("tiny")


def test_kv_write_of_a_512_token_chunk_of_llama3_8b_is_the_articles_67108864_bytes():
    cost = step_cost(LLAMA3, [(512, 0, False)], dtype_bytes=2)
    assert cost.bytes_kv_write == 67_108_864 == 512 * 2 * 32 * 8 * 128 * 2
    assert accounting.kv_write_bytes(LLAMA3, 512, 2) == 67_108_864


def test_matmul_flops_are_2mnk_and_attention_counts_exact_causal_pairs():
    cfg = TINY
    cost = step_cost(cfg, [(10, 5)], dtype_bytes=2)
    d, L = cfg.hidden_size, cfg.num_layers
    assert cost.by_op["qkv_proj"][0] == L * 2 * 10 * d * (cfg.q_size + 2 * cfg.kv_size)
    assert cost.by_op["o_proj"][0] == L * 2 * 10 * cfg.q_size * d
    assert cost.by_op["mlp"][0] == L * 2 * 10 * 3 * d * cfg.intermediate_size
    assert cost.by_op["lm_head"][0] == 2 * 1 * d * cfg.vocab_size
    pairs = 10 * 5 + 10 * 11 // 2
    assert causal_pairs(10, 5) == pairs
    assert cost.by_op["attn_scores"][0] == L * 2 * pairs * cfg.head_dim * cfg.num_heads
    assert cost.flops == sum(f for f, _ in cost.by_op.values())
    assert cost.bytes_total == sum(b for _, b in cost.by_op.values())


def test_kv_read_is_each_requests_cached_prefix_once():
    cost = step_cost(LLAMA3, [(1, 1000), (1, 3000), (256, 0)], dtype_bytes=2)
    assert cost.bytes_kv_read == 4000 * LLAMA3.kv_bytes_per_token(2)
    assert cost.bytes_kv_write == 258 * LLAMA3.kv_bytes_per_token(2)


def test_an_intermediate_chunk_skips_the_lm_head():
    assert step_cost(LLAMA3, [(512, 0, False)]).by_op["lm_head"] == (0, 0)
    assert step_cost(LLAMA3, [(512, 0, True)]).by_op["lm_head"][0] == 2 * 4096 * 128256


def test_decode_is_memory_bound_and_a_prefill_chunk_is_not():
    decode = step_cost(LLAMA3, [(1, 1000)] * 8)
    chunk = step_cost(LLAMA3, [(512, 1024, False)])
    mixed = step_cost(LLAMA3, [(1, 1000)] * 8 + [(512, 1024, False)])
    assert decode.intensity < 20 < 300 < chunk.intensity
    assert decode.intensity < mixed.intensity < chunk.intensity


@settings(max_examples=40, deadline=None)
@given(num_tokens=st.integers(1, 3000), chunk_size=st.integers(1, 4000))
def test_prefill_flops_identical_for_every_chunk_size(num_tokens, chunk_size):
    assert prefill_flops(LLAMA3, num_tokens, chunk_size) == prefill_flops(LLAMA3, num_tokens)


@settings(max_examples=30, deadline=None)
@given(num_tokens=st.integers(2, 3000), chunk_size=st.integers(1, 1500))
def test_smaller_chunks_read_more_kv_but_write_the_same(num_tokens, chunk_size):
    full = prefill_cost(LLAMA3, num_tokens)
    chunked = prefill_cost(LLAMA3, num_tokens, chunk_size)
    assert chunked.bytes_kv_write == full.bytes_kv_write
    assert full.bytes_kv_read == 0
    assert (chunked.bytes_kv_read > 0) == (chunk_size < num_tokens)
    finer = prefill_cost(LLAMA3, num_tokens, max(1, chunk_size // 2))
    assert finer.bytes_kv_read >= chunked.bytes_kv_read


@pytest.mark.parametrize("bad, arg", [
    (dict(requests=[(-1, 0)]), "num_new_tokens"),
    (dict(requests=[(4, -3)]), "num_cached_tokens"),
    (dict(requests=[(0, 3)]), "num_new_tokens"),
    (dict(dtype_bytes=3), "dtype_bytes=3"),
    (dict(cfg="llama-9b"), "preset='llama-9b'"),
])
def test_bad_input_raises_value_error_naming_the_argument(bad, arg):
    kwargs = dict(cfg=TINY, requests=[(4, 0)], dtype_bytes=2) | bad
    with pytest.raises(ValueError, match=arg):
        step_cost(**kwargs)


def test_bad_chunk_size_is_named():
    with pytest.raises(ValueError, match="chunk_size=0"):
        prefill_flops(TINY, 100, chunk_size=0)


@pytest.fixture(scope="module")
def tiny_model():
    import minillm
    return minillm.build_model("tiny", seed=0, dtype=torch.float32, device="cpu")


@pytest.mark.parametrize("shape", [
    [(64, 0)],                                   # a prefill
    [(32, 96, False)],                           # a chunk over a cache, not sampling
    [(1, 50), (1, 20), (1, 70)],                 # a decode batch
    [(48, 100), (1, 30), (1, 70)],               # mixed: chunk + decodes
])
def test_linear_flops_match_flop_counter_mode(tiny_model, shape):
    from minillm.prefill import prepare_step
    step = prepare_step(tiny_model, shape, seed=0)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        step()
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    counted_linear = counts.get("aten.mm", 0) + counts.get("aten.addmm", 0)
    expected = step_cost(tiny_model.cfg, shape, dtype_bytes=4).linear_flops
    assert abs(counted_linear - expected) <= 0.01 * expected
