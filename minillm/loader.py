"""Where a model comes from: seeded random weights, or a local HF checkpoint.

Our parameter names are Hugging Face's, so a checkpoint loads by copying
tensors: config.json -> ModelConfig, *.safetensors (sharded or not) -> weights.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .config import ModelConfig
from .device import resolve_device
from .model import LlamaModel, init_weights

FLOAT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _check_dtype(dtype, device: torch.device):
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype={dtype!r}: must be one of {FLOAT_DTYPES}")
    if dtype == torch.float64 and device.type == "mps":
        raise ValueError("dtype=torch.float64 is not supported on device 'mps'; use device='cpu'")
    return dtype


def build_model(cfg_or_name, seed: int = 0, dtype=torch.float32, device="cpu",
                backend: str = "sdpa") -> LlamaModel:
    """A model with seeded random weights (the same seed gives the same model)."""
    if isinstance(cfg_or_name, str):
        cfg = ModelConfig.preset(cfg_or_name)
    elif isinstance(cfg_or_name, ModelConfig):
        cfg = cfg_or_name
    else:
        raise TypeError(f"cfg_or_name must be a preset name or a ModelConfig, got {type(cfg_or_name).__name__}")
    device = resolve_device(device)
    _check_dtype(dtype, device)
    model = LlamaModel(cfg, backend=backend)
    init_weights(model, seed)
    return model.to(device=device, dtype=dtype).eval()


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"path={str(path)!r}: no *.safetensors weights found")
    state = {}
    for name in files:
        state.update(load_file(str(path / name)))
    return state


def load_hf_model(path, dtype=None, device=None, backend: str = "sdpa") -> LlamaModel:
    """Load a local Llama / Mistral / Qwen2 / Qwen3 checkpoint directory.

    dtype=None keeps the checkpoint's torch_dtype (float32 if unstated);
    device=None picks cuda -> mps -> cpu (MINILLM_DEVICE forces one).
    """
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"path={str(path)!r}: not a directory")
    config_file = path / "config.json"
    if not config_file.exists():
        raise ValueError(f"path={str(path)!r}: no config.json; expected a Hugging Face checkpoint directory")
    try:
        hf = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"path={str(path)!r}: config.json is not valid JSON ({e})") from None
    cfg = ModelConfig.from_hf_config(hf)
    device = resolve_device(device)
    if dtype is None:
        dtype = getattr(torch, str(hf.get("torch_dtype") or hf.get("dtype") or "float32"), torch.float32)
    _check_dtype(dtype, device)
    model = LlamaModel(cfg, backend=backend)
    state = _read_safetensors(path)
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    # Rotary tables are recomputed, never loaded.
    state = {k: v for k, v in state.items() if "rotary_emb" not in k}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:   # a tensor of the wrong shape: config.json and weights disagree
        first = next((line.strip() for line in str(e).splitlines() if "size mismatch" in line), str(e))
        raise ValueError(f"path={str(path)!r}: weights do not fit config.json: {first}") from None
    if missing or unexpected:
        raise ValueError(f"path={str(path)!r}: checkpoint does not match a {cfg.architecture} model "
                         f"(missing {missing[:4]}, unexpected {unexpected[:4]})")
    return model.to(device=device, dtype=dtype).eval()
