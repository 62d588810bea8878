"""The loader refuses a bad checkpoint before it allocates: escaping paths,
huge configs, truncated and garbage files, symlinks. Each refusal is a
ValueError that names the file and the key, in well under a second."""
import json
import os
import time

import pytest
import torch
from safetensors.torch import save_file

import minillm
from minillm import load_hf_model

# Each refusal is timed (under 5 s against ~0.01 s measured): tests/test_busy_machine.py
# runs them again beside a busy loop per core.
pytestmark = pytest.mark.timing

HF_CONFIG = dict(architectures=["LlamaForCausalLM"], vocab_size=64, hidden_size=32, intermediate_size=48,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0, torch_dtype="float32",
                 tie_word_embeddings=False)


@pytest.fixture
def checkpoint(tmp_path):
    """A small real checkpoint written from a minillm model (no transformers needed)."""
    def make(name="ckpt", **config_changes):
        path = tmp_path / name
        path.mkdir()
        config = {**HF_CONFIG, **config_changes}
        cfg = minillm.ModelConfig.from_hf_config(HF_CONFIG)
        model = minillm.build_model(cfg, seed=0)
        state = {k: v.contiguous() for k, v in model.state_dict().items() if "rotary" not in k}
        save_file(state, str(path / "model.safetensors"))
        (path / "config.json").write_text(json.dumps(config))
        return path, model
    return make


def refused_quickly(path, match):
    start = time.perf_counter()
    with pytest.raises(ValueError, match=match):
        load_hf_model(path, device="cpu")
    assert time.perf_counter() - start < 5.0     # seconds; measured ~0.01 s (no model is built)


def test_the_checkpoint_the_other_tests_corrupt_loads(checkpoint):
    path, model = checkpoint()
    ids = [1, 2, 3, 4]
    torch.testing.assert_close(minillm.prefill_kv(load_hf_model(path, device="cpu"), ids)[1],
                               minillm.prefill_kv(model, ids)[1])


@pytest.mark.parametrize("target", ["../elsewhere.safetensors", "/etc/passwd", "sub/../../x.safetensors"])
def test_an_index_that_points_outside_the_checkpoint_is_refused(checkpoint, tmp_path, target):
    path, _ = checkpoint()
    (tmp_path / "elsewhere.safetensors").write_bytes((path / "model.safetensors").read_bytes())
    index = {"weight_map": {"model.embed_tokens.weight": target}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    refused_quickly(path, r"model\.safetensors\.index\.json weight_map value=.*(outside|relative path)")


def test_a_symlink_that_escapes_the_checkpoint_is_refused(checkpoint, tmp_path):
    path, _ = checkpoint()
    outside = tmp_path / "outside.safetensors"
    os.replace(path / "model.safetensors", outside)
    (path / "model.safetensors").symlink_to(outside)
    refused_quickly(path, "symlink escaping")


def test_a_symlink_inside_the_checkpoint_is_fine(checkpoint):
    path, _ = checkpoint()
    os.replace(path / "model.safetensors", path / "real.bin")
    (path / "model.safetensors").symlink_to(path / "real.bin")
    assert load_hf_model(path, device="cpu").cfg.num_layers == 2


@pytest.mark.parametrize("index_text, match", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"metadata": {}}', "weight_map"),
    ('{"weight_map": {"a": 5}}', "weight_map value=5"),
    ('{"weight_map": {"a": "missing.safetensors"}}', "no such file"),
])
def test_a_malformed_index_names_the_file_and_key(checkpoint, index_text, match):
    path, _ = checkpoint()
    (path / "model.safetensors.index.json").write_text(index_text)
    refused_quickly(path, match)


@pytest.mark.parametrize("corrupt, match", [
    (lambda data: data[:5], "truncated"),
    (lambda data: data[:len(data) // 2], "truncated or corrupt"),
    (lambda data: b"\x00" * 8 + data[8:], "not valid JSON"),
    (lambda data: (2**40).to_bytes(8, "little") + data[8:], "truncated or not a safetensors"),
    (lambda data: os.urandom(len(data)), "safetensors"),
])
def test_truncated_or_garbage_weights_name_the_file(checkpoint, corrupt, match):
    path, _ = checkpoint()
    file = path / "model.safetensors"
    file.write_bytes(corrupt(file.read_bytes()))
    refused_quickly(path, f"model.safetensors.*{match}|{match}.*model.safetensors")


@pytest.mark.parametrize("changes, match", [
    (dict(num_hidden_layers=10**7), "describes .* parameters"),
    (dict(hidden_size=10**9, num_attention_heads=2**20), "describes .* parameters|head_dim"),
    (dict(intermediate_size=10**12), "describes .* parameters"),
    (dict(num_attention_heads=0), "num_attention_heads=0"),
    (dict(hidden_size="32"), "hidden_size='32'"),
    (dict(num_hidden_layers=2.5), "num_hidden_layers=2.5"),
    (dict(vocab_size=True), "vocab_size=True"),
    (dict(rms_norm_eps=-1.0), "rms_norm_eps"),
    (dict(rope_scaling={"rope_type": "llama3"}), "needs 'factor'"),
    (dict(rope_scaling={"type": "linear", "factor": "x"}), "factor"),
    (dict(max_position_embeddings=0), "max_position_embeddings"),
])
def test_a_config_that_is_wrong_or_huge_is_refused_before_building(checkpoint, changes, match):
    path, _ = checkpoint(**changes)
    refused_quickly(path, f"config.json.*({match})")


def test_no_weights_is_refused_before_building(checkpoint):
    path, _ = checkpoint()
    (path / "model.safetensors").unlink()
    refused_quickly(path, "no \\*.safetensors")


def test_build_model_refuses_a_model_bigger_than_memory():
    huge = minillm.ModelConfig(name="huge", vocab_size=1000, hidden_size=64, intermediate_size=64,
                               num_layers=10**9, num_heads=4, num_kv_heads=4)
    start = time.perf_counter()
    with pytest.raises(ValueError, match="cfg_or_name='huge'.*GiB"):
        minillm.build_model(huge)
    assert time.perf_counter() - start < 5.0
