"""A Llama-style decoder that runs one packed step of many requests.

    token_ids [T] -> embed -> num_layers x (RMSNorm -> attention -> +,
                                            RMSNorm -> SwiGLU MLP -> +)
                  -> RMSNorm -> LM head (only at the rows that are sampled)

T is the total number of new tokens in the step, from every request: a
prefill chunk contributes many rows, a decode one. Only attention needs to
know where one request ends and the next begins (AttentionBatch); every
other layer works row by row, which is why prefill chunks and decodes can
share one forward pass.

Parameter names follow Hugging Face's Llama/Qwen checkpoints, so loading is a
plain state_dict copy (loader.py).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from . import batch_invariant as invariant
from .attention import AttentionBatch, paged_attention, read_cached_prefixes
from .config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # Normalise in at least float32 (bf16 loses too much), as HF does.
        compute_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        h = x.to(compute_dtype)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_inverse_frequencies(cfg: ModelConfig, dtype=torch.float32) -> torch.Tensor:
    """theta^(-2i/d) for each pair of dimensions, with Llama-3 / linear scaling."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).to(dtype) / d))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        # Long wavelengths are slowed by `factor`, short ones kept, the band
        # between interpolated (Llama 3.1's published recipe).
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        interpolated = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = torch.where(wavelen > old_len / low, inv_freq / factor,
                               torch.where(wavelen < old_len / high, inv_freq, interpolated))
    return inv_freq


def rope_cos_sin(cfg: ModelConfig, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each position's rotation angles, [T, head_dim].

    Angles are computed in float32 (float64 for float64 models), as HF does:
    position * frequency must not be rounded to bf16.
    """
    compute_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = rope_inverse_frequencies(cfg, compute_dtype).to(positions.device)
    angles = positions.to(compute_dtype)[:, None] * inv_freq[None, :]     # [T, D/2]
    angles = torch.cat([angles, angles], dim=-1)                            # [T, D]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (i, i + D/2) pair of x [T, H, D] by its position's angle.

    Only the position matters, not where the token sits in the step: a chunk
    must pass absolute positions, or its keys would differ from a full prefill's.
    """
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def project(layer: nn.Linear, x: torch.Tensor, batch_invariant: bool = False) -> torch.Tensor:
    """layer(x), or over fixed row tiles in batch-invariant mode (batch_invariant.py)."""
    return invariant.linear(x, layer.weight, layer.bias) if batch_invariant else layer(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(d, cfg.q_size, bias=bias)
        self.k_proj = nn.Linear(d, cfg.kv_size, bias=bias)
        self.v_proj = nn.Linear(d, cfg.kv_size, bias=bias)
        self.o_proj = nn.Linear(cfg.q_size, d, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, batch: AttentionBatch, k_cache, v_cache, backend: str,
                prefixes=None, batch_invariant: bool = False):
        T = x.shape[0]
        cfg = self.cfg
        q = project(self.q_proj, x, batch_invariant).view(T, cfg.num_heads, cfg.head_dim)      # [T, Hq, D]
        k = project(self.k_proj, x, batch_invariant).view(T, cfg.num_kv_heads, cfg.head_dim)   # [T, Hkv, D]
        v = project(self.v_proj, x, batch_invariant).view(T, cfg.num_kv_heads, cfg.head_dim)   # [T, Hkv, D]
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = paged_attention(q, k, v, k_cache, v_cache, batch, backend, prefixes,
                              batch_invariant=batch_invariant)                  # [T, Hq, D]
        return project(self.o_proj, out.reshape(T, cfg.q_size), batch_invariant)  # [T, hidden]


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x, batch_invariant: bool = False):
        silu = invariant.silu if batch_invariant else nn.functional.silu
        gate = silu(project(self.gate_proj, x, batch_invariant))
        return project(self.down_proj, gate * project(self.up_proj, x, batch_invariant), batch_invariant)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, batch, k_cache, v_cache, backend, prefixes=None, batch_invariant=False):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, batch, k_cache, v_cache, backend,
                               prefixes, batch_invariant)
        return x + self.mlp(self.post_attention_layernorm(x), batch_invariant)


class Decoder(nn.Module):
    """Embeddings and layers; named `model` inside LlamaModel like HF's."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: str | None = None):
        super().__init__()
        self.cfg = cfg
        # None: attention.default_backend at each step: on CUDA "flash" where flash-attn
        # imports, the dtype is 16-bit and blocks are multiples of 256, else "sdpa"; on a
        # CPU "sdpa". "triton" is opt-in until `make gpu-check` has passed on a GPU.
        self.backend = backend
        self.model = Decoder(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @property
    def dtype(self):
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self):
        return self.model.embed_tokens.weight.device

    def lm_head_weight(self):
        return self.model.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    def check_token_ids(self, token_ids: torch.Tensor, arg: str = "token_ids") -> None:
        if token_ids.numel() == 0:
            raise ValueError(f"{arg} is empty: a step needs at least one token")
        low, high = int(token_ids.min()), int(token_ids.max())
        if low < 0 or high >= self.cfg.vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"{arg} contains {bad}: token ids must be in [0, {self.cfg.vocab_size})")

    @torch.inference_mode()
    def forward(self, token_ids, positions, batch: AttentionBatch, kv_cache,
                logits_indices=None, backend: str | None = None, batch_invariant: bool = False):
        """One packed step.

        token_ids, positions: [T] (absolute positions within each request)
        kv_cache: a PagedKVCache; the step's K and V are written into it
        logits_indices: rows whose logits are wanted (None: all T rows)
        batch_invariant: each row's bits independent of the step's other rows (batch_invariant.py)
        returns logits [len(logits_indices) or T, vocab]
        """
        self.check_token_ids(token_ids)
        if kv_cache.data.dtype != self.dtype or kv_cache.data.device != self.device:
            raise ValueError(f"kv_cache dtype/device={kv_cache.data.dtype}/{kv_cache.data.device} must "
                             f"match the model's {self.dtype}/{self.device}")
        backend = backend or self.backend
        x = self.model.embed_tokens(token_ids)                       # [T, hidden]
        cos, sin = rope_cos_sin(self.cfg, positions, x.dtype)      # [T, D]
        # Each prefill chunk's cached prefix as one view of the pool for every
        # layer where its blocks are consecutive; scattered ones each layer gathers.
        prefixes = read_cached_prefixes(kv_cache.data, batch)      # [L, 2, cached, Hkv, D] or None
        for i, layer in enumerate(self.model.layers):
            k_cache, v_cache = kv_cache.layer(i)
            layer_prefixes = [None if p is None else (p[i, 0], p[i, 1]) for p in prefixes]
            x = layer(x, cos, sin, batch, k_cache, v_cache, backend, layer_prefixes, batch_invariant)
        if logits_indices is not None:
            x = x[logits_indices]                                    # [S, hidden]
        x = self.model.norm(x)
        if batch_invariant:
            return invariant.linear(x, self.lm_head_weight())        # [S, vocab]
        return x @ self.lm_head_weight().T                           # [S, vocab]


def init_weights(model: LlamaModel, seed: int, std: float = 0.02) -> None:
    """Seeded random init: normal(0, std) for matrices, ones for norms, zero biases."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * std)
