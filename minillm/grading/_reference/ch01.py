"""Chapter 1's reference answers (teacher only): the masks, GQA attention, the merges
that give a part a row cannot see no weight, and the masked fraction of a chunked prefill."""
from __future__ import annotations

import math

import torch


def causal_mask(q_len, k_len):
    query_pos = torch.arange(q_len)[:, None] + (k_len - q_len)
    return torch.arange(k_len)[None, :] <= query_pos


def window_mask(q_len, k_len, window):
    query_pos = torch.arange(q_len)[:, None] + (k_len - q_len)
    key_pos = torch.arange(k_len)[None, :]
    return (key_pos <= query_pos) & (key_pos > query_pos - window)


def attention(q, k, v):
    n, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    visible = causal_mask(n, k.shape[0])
    scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(head_dim)
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hnm,mhd->nhd", scores.softmax(-1), v)


def merge_parts(parts):
    lse = torch.logsumexp(torch.stack([lse for _, lse in parts]), dim=0)
    out = torch.zeros_like(parts[0][0])
    for part_out, part_lse in parts:
        weight = torch.exp(part_lse - lse)[..., None]
        out = out + torch.where(weight > 0, part_out * weight, torch.zeros_like(part_out))
    return out, lse


def merge(out_a, lse_a, out_b, lse_b):
    return merge_parts([(out_a, lse_a), (out_b, lse_b)])


def masked_fraction(num_tokens, chunk_size):
    masked = computed = 0
    for start in range(0, num_tokens, chunk_size):
        n = min(chunk_size, num_tokens - start)
        masked += n * (n - 1) // 2
        computed += n * (start + n)
    return masked / computed
