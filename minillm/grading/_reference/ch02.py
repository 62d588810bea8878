"""Chapter 2's reference answers (teacher only): RoPE in float64, grouped-query scores that
fold the query heads instead of copying K, cached keys moved by the difference of their
positions, and every module's parameter count."""
from __future__ import annotations

import math

import torch


def rope(x, positions, theta):
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])   # [D/2]
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]                # [T, D/2]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]                    # [T, 1, D/2]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def grouped_scores(q, k):
    n, num_heads, head_dim = q.shape
    m, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    q_rows = q.reshape(n, num_kv_heads, group, head_dim)                       # query head h = kv * group + j
    scores = torch.einsum("nkgd,mkd->kgnm", q_rows, k) / math.sqrt(head_dim)  # [Hkv, group, n, m]
    return scores.reshape(num_heads, n, m)


def move_rope(k_cached, old_positions, new_positions, theta):
    return rope(k_cached, new_positions - old_positions, theta)


def parameter_counts(cfg):
    d, layers, head_dim = cfg.hidden_size, cfg.num_layers, cfg.head_dim
    q, kv = cfg.num_heads * head_dim, cfg.num_kv_heads * head_dim
    bias = cfg.attention_bias
    counts = {
        "embed_tokens": cfg.vocab_size * d,
        "input_layernorm": layers * d, "post_attention_layernorm": layers * d,
        "q_proj": layers * (d * q + (q if bias else 0)),
        "k_proj": layers * (d * kv + (kv if bias else 0)),
        "v_proj": layers * (d * kv + (kv if bias else 0)),
        "o_proj": layers * q * d,
        "q_norm": layers * head_dim if cfg.qk_norm else 0,
        "k_norm": layers * head_dim if cfg.qk_norm else 0,
        "gate_proj": layers * d * cfg.intermediate_size, "up_proj": layers * d * cfg.intermediate_size,
        "down_proj": layers * cfg.intermediate_size * d,
        "norm": d,
        "lm_head": 0 if cfg.tie_word_embeddings else cfg.vocab_size * d,
    }
    return counts
