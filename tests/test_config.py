"""config.py: presets, Hugging Face configs, derived sizes and errors."""
import pytest

from minillm import ModelConfig
from minillm.config import PRESETS


def test_every_preset_is_a_valid_config_with_its_name():
    for name in PRESETS:
        cfg = ModelConfig.preset(name)
        assert cfg.name == name and cfg.num_heads % cfg.num_kv_heads == 0


def test_tiny_preset_is_the_built_in_model():
    cfg = ModelConfig.preset("tiny")
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == (512, 4, 8, 2, 512)
    assert cfg.head_dim == 64 and cfg.bos_token_id == 256 and cfg.eos_token_ids == (257,)


def test_llama3_8b_has_about_8_billion_parameters_and_128_kib_of_kv_per_token():
    cfg = ModelConfig.preset("llama-3-8b")
    assert 8.0e9 < cfg.num_parameters() < 8.1e9     # published: 8.03 B
    assert cfg.kv_bytes_per_token(2) == 131072       # 2 x 32 x 8 x 128 x 2 bytes


def test_unknown_preset_is_a_value_error_naming_it_and_the_choices():
    with pytest.raises(ValueError, match="preset='gpt-5'.*tiny"):
        ModelConfig.preset("gpt-5")


@pytest.mark.parametrize("arg,value", [("hidden_size", 0), ("num_layers", -1), ("vocab_size", 2.5)])
def test_non_positive_sizes_are_value_errors_naming_the_argument(arg, value):
    fields = dict(name="x", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                  num_heads=2, num_kv_heads=1)
    fields[arg] = value
    with pytest.raises(ValueError, match=f"{arg}="):
        ModelConfig(**fields)


def test_kv_heads_that_do_not_divide_the_heads_are_a_value_error():
    with pytest.raises(ValueError, match="num_kv_heads=3"):
        ModelConfig(name="x", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                    num_heads=4, num_kv_heads=3)


HF_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 100,
            "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 256, "eos_token_id": [5, 6], "bos_token_id": 1}


def test_from_hf_config_reads_shapes_and_special_tokens():
    cfg = ModelConfig.from_hf_config({**HF_LLAMA, "rope_theta": 500000.0})
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta) == (2, 16, 500000.0)
    assert cfg.eos_token_ids == (5, 6) and cfg.architecture == "llama"


def test_from_hf_config_reads_transformers_5_rope_parameters():
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    cfg = ModelConfig.from_hf_config({**HF_LLAMA, "rope_parameters": rope})
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling["factor"] == 8.0


def test_qwen2_has_biases_even_when_its_config_says_none():
    hf = {**HF_LLAMA, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_bias": None}
    assert ModelConfig.from_hf_config(hf).attention_bias


def test_qwen3_has_qk_norm():
    hf = {**HF_LLAMA, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 32}
    cfg = ModelConfig.from_hf_config(hf)
    assert cfg.qk_norm and cfg.head_dim == 32


def test_mistral_sliding_window_caps_the_accepted_length():
    hf = {**HF_LLAMA, "architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 128}
    assert ModelConfig.from_hf_config(hf).max_position == 128


def test_unsupported_architecture_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="architectures=.*GPT2"):
        ModelConfig.from_hf_config({**HF_LLAMA, "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})


def test_unsupported_rope_scaling_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="rope_scaling="):
        ModelConfig.from_hf_config({**HF_LLAMA, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})


def test_from_hf_config_wants_a_dict():
    with pytest.raises(TypeError, match="dict"):
        ModelConfig.from_hf_config("config.json")


def test_hf_config_without_the_shapes_is_a_value_error_naming_the_keys():
    hf = {k: v for k, v in HF_LLAMA.items() if k != "hidden_size"}
    with pytest.raises(ValueError, match="hidden_size"):
        ModelConfig.from_hf_config(hf)


@pytest.mark.parametrize("head_dim", [0, 7, -2])
def test_head_dim_must_be_positive_and_even_for_rope(head_dim):
    with pytest.raises(ValueError, match=f"head_dim={head_dim}"):
        ModelConfig(name="x", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=head_dim)
