"""Where a model comes from: seeded random weights, or a local HF checkpoint.

Our parameter names are Hugging Face's, so a checkpoint loads by copying
tensors: config.json -> ModelConfig, *.safetensors (sharded or not) -> weights.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from .config import ModelConfig
from .device import free_memory_bytes, resolve_device
from .model import LlamaModel, init_weights

FLOAT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _check_dtype(dtype, device: torch.device):
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype={dtype!r}: must be one of {FLOAT_DTYPES}")
    if dtype == torch.float64 and device.type == "mps":
        raise ValueError("dtype=torch.float64 is not supported on device 'mps'; use device='cpu'")
    return dtype


def build_model(cfg_or_name, seed: int = 0, dtype=torch.float32, device="cpu",
                backend: str | None = None) -> LlamaModel:
    """A model with seeded random weights (the same seed gives the same model)."""
    if isinstance(cfg_or_name, str):
        cfg = ModelConfig.preset(cfg_or_name)
    elif isinstance(cfg_or_name, ModelConfig):
        cfg = cfg_or_name
    else:
        raise TypeError(f"cfg_or_name must be a preset name or a ModelConfig, got {type(cfg_or_name).__name__}")
    device = resolve_device(device)
    _check_dtype(dtype, device)
    check_fits_in_memory(cfg, dtype, device, f"cfg_or_name={cfg.name!r}")
    model = LlamaModel(cfg, backend=backend)
    init_weights(model, seed)
    return model.to(device=device, dtype=dtype).eval()


# ---------------------------------------------------------------------------
# Checks that run before anything big is allocated
# ---------------------------------------------------------------------------
# safetensors' element types and their sizes in bytes (the format's spec).
SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
                           "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
MAX_HEADER_BYTES = 100 * 2**20        # the format's own limit on the JSON header


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"path={str(path.parent)!r}: {path.name} is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"path={str(path.parent)!r}: {path.name} must hold a JSON object, "
                         f"got {type(value).__name__}")
    return value


def _inside(root: Path, name, where: str) -> Path:
    """root/name, refused if name is absolute, climbs out with '..', or is a
    symlink that resolves outside root: an index must not load other files."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}={name!r}: must be a file name inside the checkpoint directory")
    if Path(name).is_absolute() or ".." in Path(name).parts:
        raise ValueError(f"{where}={name!r}: must be a relative path inside {str(root)!r} (no '..', no absolute path)")
    file = root / name
    if not file.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"{where}={name!r}: resolves to {str(file.resolve())!r}, outside {str(root)!r} "
                         "(a symlink escaping the checkpoint)")
    if not file.is_file():
        raise ValueError(f"{where}={name!r}: no such file in {str(root)!r}")
    return file


def weight_files(path: Path) -> list[Path]:
    """The checkpoint's *.safetensors files: those the index names, or every one."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index.name}: key 'weight_map' must map tensor names to files, got {weight_map!r}")
        names = sorted(set(weight_map.values()), key=str)
        return [_inside(path, name, f"{index.name} weight_map value") for name in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"path={str(path)!r}: no *.safetensors weights found")
    return [_inside(path, f.name, "weights file") for f in files]


def read_safetensors_header(file: Path) -> dict[str, tuple[str, list[int]]]:
    """{tensor name: (dtype, shape)} from the file's header alone, after
    checking that every tensor's bytes are inside the file (no data is read)."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{file.name}: truncated ({size} bytes): not a safetensors file")
        header_len = int.from_bytes(head, "little")
        if header_len > min(MAX_HEADER_BYTES, size - 8):
            raise ValueError(f"{file.name}: header of {header_len} bytes in a {size}-byte file: "
                             "truncated or not a safetensors file")
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{file.name}: header is not valid JSON ({e}): not a safetensors file") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file.name}: header must be a JSON object")
    data_bytes = size - 8 - header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], list(info["shape"]), info["data_offsets"]
            expected = SAFETENSORS_DTYPE_BYTES[dtype] * math.prod(shape)
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{file.name}: tensor {name!r} has a malformed header entry {info!r}") from None
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= data_bytes
                and end - begin == expected):
            raise ValueError(f"{file.name}: tensor {name!r} at bytes [{begin}, {end}) of {data_bytes}: "
                             "truncated or corrupt file")
        tensors[name] = (dtype, shape)
    return tensors


def _available_memory_bytes(device: torch.device) -> int:
    free = free_memory_bytes(device)
    return 2**63 if free is None else free     # unknown: do not refuse


def check_fits_in_memory(cfg: ModelConfig, dtype: torch.dtype, device: torch.device, what: str) -> int:
    """The model's weights in bytes, from the config alone; ValueError if they
    cannot fit in the memory available on device."""
    num_bytes = cfg.num_parameters() * dtype.itemsize
    available = _available_memory_bytes(device)
    if num_bytes > available:
        raise ValueError(f"{what}: a model of {cfg.num_parameters():,} parameters needs "
                         f"{num_bytes / 2**30:.1f} GiB in {dtype}, but {device} has "
                         f"{available / 2**30:.1f} GiB available")
    return num_bytes


def _check_weights_match_config(cfg: ModelConfig, headers: dict[str, dict]) -> None:
    """The config's parameter count must be near what the files hold, before
    any tensor is built: a config that says 10**7 layers is caught here. (A
    small disagreement goes on to load_state_dict, which names the tensors.)"""
    held = sum(math.prod(shape) for tensors in headers.values()
               for name, (_, shape) in tensors.items() if "rotary_emb" not in name)
    if cfg.tie_word_embeddings:   # a tied checkpoint may still store lm_head
        held -= sum(math.prod(shape) for tensors in headers.values()
                    for name, (_, shape) in tensors.items() if name == "lm_head.weight")
    expected = cfg.num_parameters()
    if expected > 2 * held:
        files = ", ".join(sorted(headers))
        raise ValueError(f"config.json describes {expected:,} parameters (num_hidden_layers={cfg.num_layers}, "
                         f"hidden_size={cfg.hidden_size}, intermediate_size={cfg.intermediate_size}, "
                         f"vocab_size={cfg.vocab_size}) but the weights ({files}) hold {held:,}")


def _load_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = {}
    for file in files:
        try:
            state.update(load_file(str(file)))
        except Exception as e:     # noqa: BLE001 -- SafetensorError and friends: name the file
            raise ValueError(f"{file.name}: cannot be read as safetensors ({type(e).__name__}: {e})") from None
    return state


def load_hf_model(path, dtype=None, device=None, backend: str | None = None) -> LlamaModel:
    """Load a local Llama / Mistral / Qwen2 / Qwen3 checkpoint directory.

    dtype=None keeps the checkpoint's torch_dtype (float32 if unstated);
    device=None picks cuda -> mps -> cpu (MINILLM_DEVICE forces one).
    Everything is checked from config.json and the files' headers before the
    model is built: a bad checkpoint is refused in well under a second.
    """
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path={path!r}: must be a directory path (str or Path)")
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"path={str(path)!r}: not a directory")
    config_file = path / "config.json"
    if not config_file.exists():
        raise ValueError(f"path={str(path)!r}: no config.json; expected a Hugging Face checkpoint directory")
    hf = _read_json(config_file)
    try:
        cfg = ModelConfig.from_hf_config(hf)
    except (ValueError, TypeError) as e:
        raise ValueError(f"config.json: {e}") from None
    device = resolve_device(device)
    if dtype is None:
        dtype = getattr(torch, str(hf.get("torch_dtype") or hf.get("dtype") or "float32"), torch.float32)
    _check_dtype(dtype, device)
    headers = {file.name: read_safetensors_header(file) for file in weight_files(path)}
    _check_weights_match_config(cfg, headers)
    check_fits_in_memory(cfg, dtype, device, f"path={str(path)!r}")
    model = LlamaModel(cfg, backend=backend)
    state = _load_tensors([path / name for name in headers])
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
