"""Shared fixtures: tiny random Hugging Face checkpoints saved to a temp dir."""
from __future__ import annotations

import os
import sys
from pathlib import Path

# minillm before torch: it picks OpenMP's wait policy for a busy or a quiet machine,
# which torch reads once when it loads (minillm/__init__.py says why).
import minillm  # noqa: E402,F401
import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:          # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

# One process runs triton either interpreted or compiled, chosen when triton is first
# imported; torch.compile (the compile-probe bench's test) imports it too. Importing the
# kernel module first makes the choice the kernel's (the interpreter where there is no
# GPU), whatever order the tests run in.
import minillm.kernels.triton_attention  # noqa: E402,F401

# Small shapes with grouped-query attention (4 query heads share 2 KV heads).
TINY_HF_SHAPE = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                     rms_norm_eps=1e-6, initializer_range=0.3)   # lively logits: greedy varies

HF_FAMILIES = {
    # name: (config class, model class, extra config)
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"rope_theta": 500000.0}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4096}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"rope_theta": 1000000.0}),          # q/k/v bias
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32, "rope_theta": 1000000.0,
                                                   "tie_word_embeddings": True}),        # qk-norm, tied
}


def make_hf_model(family: str, seed: int = 0, **overrides):
    """A seeded random HF model; norms and biases perturbed so that they matter."""
    import transformers

    config_name, model_name, extra = HF_FAMILIES[family]
    config = getattr(transformers, config_name)(**{**TINY_HF_SHAPE, **extra, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def save_hf_model(model, path: Path, max_shard_size=None) -> Path:
    kwargs = {"safe_serialization": True}
    if max_shard_size is not None:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(str(path), **kwargs)
    return path


@pytest.fixture
def hf_checkpoint(tmp_path):
    """factory(family, sharded=False) -> (hf_model, checkpoint_dir)."""
    def factory(family: str, sharded: bool = False, **overrides):
        model = make_hf_model(family, **overrides)
        path = save_hf_model(model, tmp_path / family, max_shard_size="60KB" if sharded else None)
        return model, path
    return factory
