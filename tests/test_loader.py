"""loader.py: Hugging Face checkpoints load into minillm and match transformers."""
import json

import pytest
import torch

import minillm
from minillm import build_model, load_hf_model, prefill_kv
from conftest import HF_FAMILIES, make_hf_model, save_hf_model

FAMILIES = sorted(HF_FAMILIES)


def _prompt(vocab_size: int, length: int = 24, seed: int = 1) -> list[int]:
    return torch.randint(0, vocab_size, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def _hf_logits(hf_model, ids):
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_logits_match_transformers_within_1e_4(family, hf_checkpoint):
    hf_model, path = hf_checkpoint(family)
    ours = load_hf_model(path, device="cpu")
    ids = _prompt(ours.cfg.vocab_size)
    _, logits = prefill_kv(ours, ids)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, _hf_logits(hf_model, ids), atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_16_token_continuation_is_identical_to_transformers(family, hf_checkpoint):
    hf_model, path = hf_checkpoint(family)
    ours = load_hf_model(path, device="cpu")
    ids = _prompt(ours.cfg.vocab_size, length=12, seed=2)
    # No early stop at EOS on either side (min_new_tokens would instead ban EOS in
    # transformers only): exactly 16 argmax tokens each.
    hf_model.generation_config.eos_token_id = None
    with torch.no_grad():
        theirs = hf_model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False,
                                   pad_token_id=0)[0, len(ids):].tolist()
    assert len(theirs) == 16
    seq = list(ids)
    for _ in range(16):
        _, logits = prefill_kv(ours, seq)
        seq.append(int(logits[-1].argmax()))
    assert seq[len(ids):] == theirs


def test_sharded_checkpoint_loads_like_a_single_file(tmp_path):
    hf_model = make_hf_model("llama")
    sharded = save_hf_model(hf_model, tmp_path / "sharded", max_shard_size="60KB")
    assert (sharded / "model.safetensors.index.json").exists()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    single = save_hf_model(hf_model, tmp_path / "single")
    ids = _prompt(hf_model.config.vocab_size)
    a = prefill_kv(load_hf_model(sharded, device="cpu"), ids)[1]
    b = prefill_kv(load_hf_model(single, device="cpu"), ids)[1]
    assert torch.equal(a, b)
    torch.testing.assert_close(a, _hf_logits(hf_model, ids), atol=1e-4, rtol=0)


def test_tied_embeddings_share_one_matrix(hf_checkpoint):
    _, path = hf_checkpoint("qwen3")
    ours = load_hf_model(path, device="cpu")
    assert ours.cfg.tie_word_embeddings and ours.cfg.qk_norm
    assert not hasattr(ours, "lm_head")
    assert ours.lm_head_weight() is ours.model.embed_tokens.weight


def test_qwen2_loads_its_attention_biases(hf_checkpoint):
    hf_model, path = hf_checkpoint("qwen2")
    ours = load_hf_model(path, device="cpu")
    assert ours.cfg.attention_bias
    theirs = hf_model.model.layers[0].self_attn.q_proj.bias
    assert torch.equal(ours.model.layers[0].self_attn.q_proj.bias, theirs)


def test_rope_theta_is_read_from_the_checkpoint(hf_checkpoint):
    # transformers >= 5 writes it inside "rope_parameters"; a default of 10000
    # would still run but give wrong logits.
    _, path = hf_checkpoint("qwen3")
    assert load_hf_model(path, device="cpu").cfg.rope_theta == 1_000_000.0


def test_llama3_rope_scaling_matches_transformers(hf_checkpoint):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    hf_model, path = hf_checkpoint("llama", rope_scaling=scaling)
    ours = load_hf_model(path, device="cpu")
    assert ours.cfg.rope_scaling["rope_type"] == "llama3"
    ids = _prompt(ours.cfg.vocab_size, length=64)
    torch.testing.assert_close(prefill_kv(ours, ids)[1], _hf_logits(hf_model, ids), atol=1e-4, rtol=0)


def test_dtype_none_keeps_the_checkpoint_dtype_and_dtype_argument_converts(hf_checkpoint):
    _, path = hf_checkpoint("llama")
    assert load_hf_model(path, device="cpu").dtype == torch.float32
    assert load_hf_model(path, dtype=torch.float64, device="cpu").dtype == torch.float64


# ---- bad input --------------------------------------------------------------
def test_directory_without_config_json_is_a_value_error_naming_path(tmp_path):
    with pytest.raises(ValueError, match="path=.*config.json"):
        load_hf_model(tmp_path, device="cpu")


def test_missing_directory_is_a_value_error_naming_path(tmp_path):
    with pytest.raises(ValueError, match="path="):
        load_hf_model(tmp_path / "nope", device="cpu")


def test_unsupported_architecture_is_a_value_error_naming_it(hf_checkpoint):
    _, path = hf_checkpoint("llama")
    config = json.loads((path / "config.json").read_text())
    config["architectures"], config["model_type"] = ["GPT2LMHeadModel"], "gpt2"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="architectures=.*GPT2LMHeadModel"):
        load_hf_model(path, device="cpu")


def test_checkpoint_without_weights_is_a_value_error(hf_checkpoint):
    _, path = hf_checkpoint("llama")
    for f in path.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ValueError, match="safetensors"):
        load_hf_model(path, device="cpu")


def test_checkpoint_with_wrong_shapes_is_a_value_error_naming_the_mismatch(hf_checkpoint):
    _, path = hf_checkpoint("llama")
    config = json.loads((path / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="missing"):
        load_hf_model(path, device="cpu")


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, "float32"])
def test_non_float_dtype_is_a_value_error_naming_dtype(dtype):
    with pytest.raises(ValueError, match="dtype="):
        build_model("tiny", dtype=dtype)


@pytest.mark.parametrize("device", ["tpu", "not a device"])
def test_unknown_device_is_a_value_error_naming_device(device):
    with pytest.raises(ValueError, match="device="):
        build_model("tiny", device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_a_value_error_naming_device():
    with pytest.raises(ValueError, match="device='cuda'"):
        build_model("tiny", device="cuda")


def test_minillm_device_env_var_for_a_missing_backend_is_a_value_error(monkeypatch):
    monkeypatch.setenv("MINILLM_DEVICE", "tpu")
    with pytest.raises(ValueError, match="MINILLM_DEVICE"):
        minillm.default_device()
    if not torch.cuda.is_available():
        monkeypatch.setenv("MINILLM_DEVICE", "cuda")
        with pytest.raises(ValueError, match="MINILLM_DEVICE='cuda'"):
            minillm.default_device()
    monkeypatch.setenv("MINILLM_DEVICE", "cpu")
    assert minillm.default_device() == torch.device("cpu")


def test_build_model_with_the_same_seed_gives_the_same_weights():
    a, b = build_model("tiny", seed=3), build_model("tiny", seed=3)
    c = build_model("tiny", seed=4)
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_build_model_rejects_something_that_is_not_a_config():
    with pytest.raises(TypeError, match="cfg_or_name"):
        build_model(42)


def test_config_json_that_disagrees_with_the_weights_is_a_value_error(hf_checkpoint):
    _, path = hf_checkpoint("llama")
    config = json.loads((path / "config.json").read_text())
    config["intermediate_size"] = 128
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="path=.*size mismatch"):
        load_hf_model(path, device="cpu")


def test_config_json_that_is_not_json_is_a_value_error_naming_path(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="path=.*not valid JSON"):
        load_hf_model(tmp_path, device="cpu")
