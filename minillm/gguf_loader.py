"""Load a Llama-family GGUF file (llama.cpp's format) into a LlamaModel.

A GGUF file is a header of key/value metadata (the shapes, RoPE, the
tokenizer, the chat template) followed by tensors, many of them quantized in
blocks of 32 weights. The `gguf` library (llama.cpp's own Python package)
parses the file and dequantizes each tensor; this module maps llama.cpp's
names and layout back to ours (which are Hugging Face's).

One layout trap: llama.cpp's converter permutes the rows of the Q and K
projections, because its RoPE rotates adjacent pairs (x0, x1) while Hugging
Face's rotates halves (x0, x_{D/2}). We undo that permutation here.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .config import ModelConfig
from .device import resolve_device
from .loader import _check_dtype
from .model import LlamaModel

SUPPORTED_ARCHITECTURES = ("llama",)
SUPPORTED_QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")

# llama.cpp's per-layer tensor names -> ours (Hugging Face's).
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def _reader_class():
    import gguf

    class FastGGUFReader(gguf.GGUFReader):
        """gguf's reader over a plain ndarray view of the memory map: numpy's
        memmap subclass bookkeeping costs seconds over a 49k-word vocabulary."""

        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, value):
            self._data = value.view(np.ndarray)

    return FastGGUFReader


def read_gguf(path):
    """Parse a GGUF file's header (metadata and tensor index); the tensor
    data stay memory-mapped. Bad files raise ValueError naming the file."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ValueError(f"path={str(path)!r}: reading GGUF needs the `gguf` package "
                         "(pip install gguf)") from None
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path={str(path)!r}: no such file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"path={str(path)!r}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    try:
        reader = _reader_class()(path)
    except (ValueError, IndexError, KeyError, OverflowError, TypeError) as e:
        # A file cut inside its header runs the parser off the end of the map.
        raise ValueError(f"path={str(path)!r}: unreadable GGUF (truncated or corrupt: "
                         f"{type(e).__name__}: {e})") from None
    for t in reader.tensors:   # a file cut inside its tensors maps short arrays
        if t.data.nbytes != t.n_bytes:
            raise ValueError(f"path={str(path)!r}: truncated: tensor {t.name!r} has "
                             f"{t.data.nbytes} of its {t.n_bytes} bytes")
    return reader


def field(reader, key: str, default=None):
    """A metadata value as plain Python (str, int, float, list)."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def gguf_config(reader, path) -> ModelConfig:
    """The ModelConfig stated by a GGUF file's `llama.*` metadata."""
    arch = field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"path={str(path)!r}: general.architecture={arch!r} is not supported; "
                         f"minillm loads {list(SUPPORTED_ARCHITECTURES)} GGUF files")

    def need(key):
        value = field(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"path={str(path)!r}: metadata {arch}.{key} is missing")
        return value

    num_heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = field(reader, f"{arch}.vocab_size") or (len(tokens.data) if tokens else None)
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    return ModelConfig(
        name=str(field(reader, "general.name", path.stem)),
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(field(reader, f"{arch}.attention.head_count_kv", num_heads)),
        head_dim=int(field(reader, f"{arch}.rope.dimension_count", hidden // num_heads)),
        max_position=int(field(reader, f"{arch}.context_length", 4096)),
        rope_theta=float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        tie_word_embeddings=not has_output,
        bos_token_id=field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=field(reader, "tokenizer.ggml.eos_token_id"),
        architecture=arch,
    )


def hf_name(gguf_name: str) -> str | None:
    """llama.cpp's tensor name -> ours; None for tensors we do not use."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")        # blk.{i}.{kind}.weight
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row order. Its converter wrote, per head, the rows
    [0, D/2, 1, D/2+1, ...] (pairs interleaved); Hugging Face keeps the two
    halves apart. weight: [num_heads * D, in] -> the same, rows reordered."""
    rows, cols = weight.shape
    head_dim = rows // num_heads
    return (weight.reshape(num_heads, head_dim // 2, 2, cols)   # [H, D/2, 2, in]
            .transpose(1, 2)                                    # [H, 2, D/2, in]
            .reshape(rows, cols))


def _check_tensor_types(reader, path) -> None:
    """Refuse before dequantizing anything, so nothing is half-loaded."""
    for t in reader.tensors:
        if hf_name(t.name) is not None and t.tensor_type.name not in SUPPORTED_QUANT_TYPES:
            raise ValueError(f"path={str(path)!r}: tensor {t.name!r} has type {t.tensor_type.name}; "
                             f"minillm dequantizes {list(SUPPORTED_QUANT_TYPES)}")


def gguf_state_dict(reader, cfg: ModelConfig, path) -> dict[str, torch.Tensor]:
    """Dequantized float32 tensors under our names, Q and K rows unpermuted."""
    from gguf.quants import dequantize

    _check_tensor_types(reader, path)
    state = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            continue
        try:
            array = dequantize(t.data, t.tensor_type)           # [out, in] (GGUF lists [in, out])
        except (ValueError, IndexError) as e:
            raise ValueError(f"path={str(path)!r}: tensor {t.name!r} is unreadable ({e})") from None
        weight = torch.from_numpy(np.array(array, dtype=np.float32))   # a writable copy
        if name.endswith("q_proj.weight"):
            weight = unpermute_rope_rows(weight, cfg.num_heads)
        elif name.endswith("k_proj.weight"):
            weight = unpermute_rope_rows(weight, cfg.num_kv_heads)
        state[name] = weight
    return state


def load_gguf(path, dtype=None, device=None, backend: str | None = None) -> LlamaModel:
    """A LlamaModel with the weights of a Llama-family GGUF file.

    dtype=None: float32 (quantized weights are dequantized; float32 holds
    them exactly). device=None picks cuda -> mps -> cpu.
    Bad files (not GGUF, truncated, another architecture, an unsupported
    quantization type) raise ValueError naming the file and the problem.
    """
    path = Path(path)
    reader = read_gguf(path)
    cfg = gguf_config(reader, path)
    device = resolve_device(device)
    dtype = _check_dtype(torch.float32 if dtype is None else dtype, device)
    state = gguf_state_dict(reader, cfg, path)
    return model_from_state_dict(cfg, state, path, dtype, device, backend)


def model_from_state_dict(cfg: ModelConfig, state: dict, path, dtype, device, backend: str) -> LlamaModel:
    """Build the model only once every tensor is present and fits."""
    with torch.device("meta"):          # no random init of weights about to be replaced
        model = LlamaModel(cfg, backend=backend)
    expected = set(model.state_dict())
    if set(state) != expected:
        raise ValueError(f"path={str(path)!r}: tensors do not match a {cfg.architecture} model "
                         f"(missing {sorted(expected - set(state))[:4]}, "
                         f"unexpected {sorted(set(state) - expected)[:4]})")
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:
        first = next((line.strip() for line in str(e).splitlines() if "size mismatch" in line), str(e))
        raise ValueError(f"path={str(path)!r}: tensor shapes do not fit the metadata: {first}") from None
    return model.to(device=device, dtype=dtype).eval()
