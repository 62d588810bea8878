"""Causal attention for a packed step: one entry point, three backends.

A step packs the new tokens of several requests into one tensor of T rows.
Request b brings `query_lens[b]` new tokens at positions
[cached_lens[b], cached_lens[b] + query_lens[b]) and attends to every key
from 0 up to its own position: its cached prefix plus the new tokens. The
mask of such a chunk is a rectangle whose causal diagonal ends in the
bottom-right corner; see `causal_mask`.

Backends:
  "reference"  explicit softmax(QK^T)V, any dtype (float64 too): the yardstick
  "sdpa"       torch.nn.functional.scaled_dot_product_attention, decodes batched
  "flash"      flash-attn's varlen kernel reading the paged cache directly
               (CUDA only; needs `pip install flash-attn`, block_size % 256 == 0)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

BACKENDS = ("reference", "sdpa", "flash")
FLASH_BLOCK_MULTIPLE = 256  # flash-attn's paged KV needs page sizes divisible by 256
DECODE_BUCKET = 8           # decodes per padded SDPA call (sorted by length)


# ---------------------------------------------------------------------------
# Masks and single-sequence attention (what chapter 1 builds from scratch)
# ---------------------------------------------------------------------------
def causal_mask(q_len: int, k_len: int, align: str = "bottom_right", device=None) -> torch.Tensor:
    """Boolean [q_len, k_len] mask, True where query i may attend to key j.

    bottom_right: the queries are the LAST q_len positions of the k_len keys
    (a chunk over a cache): query i sits at position k_len - q_len + i.
    top_left: query i sits at position i. That is what
    scaled_dot_product_attention(is_causal=True) assumes, and it is wrong for
    a chunk over a cache: the chunk would not see most of its prefix.
    """
    if align not in ("bottom_right", "top_left"):
        raise ValueError(f"align={align!r}: must be 'bottom_right' or 'top_left'")
    if q_len < 0 or k_len < 0:
        raise ValueError(f"q_len={q_len}, k_len={k_len}: lengths must be >= 0")
    offset = k_len - q_len if align == "bottom_right" else 0
    query_pos = torch.arange(q_len, device=device)[:, None] + offset
    key_pos = torch.arange(k_len, device=device)[None, :]
    return key_pos <= query_pos


def _expand_kv_heads(x: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    """GQA: each KV head serves num_q_heads / num_kv_heads query heads."""
    group = num_q_heads // x.shape[1]
    return x if group == 1 else x.repeat_interleave(group, dim=1)


def reference_attention(q, k, v, causal: bool = True, align: str = "bottom_right",
                        return_lse: bool = False):
    """Explicit attention for one sequence, in q's dtype (float64 works).

    q: [n, Hq, D], k and v: [m, Hkv, D] -> out [n, Hq, D]
    (and the log-sum-exp of each row's scores, [n, Hq], if return_lse).
    """
    n, num_heads, head_dim = q.shape
    k = _expand_kv_heads(k, num_heads)                        # [m, Hq, D]
    v = _expand_kv_heads(v, num_heads)
    scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(head_dim)  # [Hq, n, m]
    if causal:
        allowed = causal_mask(n, k.shape[0], align=align, device=q.device)
        scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                      # [Hq, n]
    probs = torch.exp(scores - lse[..., None])
    out = torch.einsum("hnm,mhd->nhd", probs, v)              # [n, Hq, D]
    return (out, lse.transpose(0, 1)) if return_lse else out


def merge_attention(out_a, lse_a, out_b, lse_b):
    """Combine attention over two disjoint key sets into attention over both.

    Each part is softmax-normalised over its own keys; re-weighting by
    exp(lse_part - lse_total) restores the softmax over the union. This is
    the online-softmax step FlashAttention and split-KV decoding rely on.
    out_*: [n, H, D], lse_*: [n, H].
    """
    lse = torch.logaddexp(lse_a, lse_b)
    weight_a = torch.exp(lse_a - lse)[..., None]
    weight_b = torch.exp(lse_b - lse)[..., None]
    return out_a * weight_a + out_b * weight_b, lse


# torch >= 2.5 lets SDPA share KV heads itself (enable_gqa).
_SDPA_HAS_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)


def sdpa_attention(q, k, v):
    """Bottom-right causal attention for one sequence with torch's SDPA.

    q: [n, Hq, D], k and v: [m, Hkv, D], m >= n -> [n, Hq, D].
    """
    n, num_heads, head_dim = q.shape
    m, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    # 4-D [batch=1, heads, rows, D]: the layout torch's fused CPU/GPU kernels take.
    k_heads, v_heads = k.transpose(0, 1)[None], v.transpose(0, 1)[None]          # [1, Hkv, m, D]
    if n == m and (group == 1 or _SDPA_HAS_GQA):
        # Square: top-left and bottom-right coincide, and is_causal lets the
        # kernel skip the masked half (twice as fast as an explicit mask).
        extra = {"enable_gqa": True} if group > 1 else {}
        out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k_heads, v_heads,
                                             is_causal=True, **extra)             # [1, Hq, n, D]
        return out[0].transpose(0, 1)
    # A chunk over a cache: an explicit bottom-right mask. The query heads that
    # share a KV head are folded into the query rows, so GQA copies no K or V.
    q_grouped = q.reshape(n, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)  # [Hkv, g, n, D]
    q_grouped = q_grouped.reshape(1, num_kv_heads, group * n, head_dim)
    allowed = causal_mask(n, m, device=q.device).repeat(group, 1)               # [g*n, m]
    out = F.scaled_dot_product_attention(q_grouped, k_heads, v_heads, attn_mask=allowed)
    out = out.reshape(num_kv_heads, group, n, head_dim).permute(2, 0, 1, 3)       # [n, Hkv, g, D]
    return out.reshape(n, num_heads, head_dim)


def flash_available() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


# ---------------------------------------------------------------------------
# Paged attention over a packed step
# ---------------------------------------------------------------------------
@dataclass
class AttentionBatch:
    """Where each request's tokens are in the packed step and in the cache.

    Built by the model runner for every step and passed down as an argument
    (no global state), so a chapter can build one by hand.
    """
    query_lens: list[int]          # new tokens of each request in this step
    cached_lens: list[int]         # tokens already in the cache before the step
    block_tables: list[list[int]]  # cache blocks of each request, in order
    block_size: int
    slot_mapping: torch.Tensor     # [T] flat cache slot of every new token

    @property
    def seq_lens(self) -> list[int]:
        return [c + n for c, n in zip(self.cached_lens, self.query_lens)]

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


def write_kv(k_cache, v_cache, k_new, v_new, slot_mapping):
    """Store the step's new K and V in their slots.

    k_cache: [num_blocks, block_size, Hkv, D]; k_new: [T, Hkv, D]; slots: [T]
    """
    k_cache.view(-1, *k_cache.shape[2:])[slot_mapping] = k_new
    v_cache.view(-1, *v_cache.shape[2:])[slot_mapping] = v_new


def gather_kv(cache, block_table: list[int], num_tokens: int):
    """Read one request's first num_tokens keys (or values) from its blocks.

    cache: [num_blocks, block_size, Hkv, D] -> [num_tokens, Hkv, D]
    """
    block_size = cache.shape[1]
    num_blocks = -(-num_tokens // block_size)
    blocks = torch.as_tensor(block_table[:num_blocks], device=cache.device)
    return cache.index_select(0, blocks).flatten(0, 1)[:num_tokens]


def paged_attention(q, k_new, v_new, k_cache, v_cache, batch: AttentionBatch,
                    backend: str = "sdpa"):
    """Write the new K/V into the cache, then attend for every request.

    q: [T, Hq, D]; k_new, v_new: [T, Hkv, D] -> out [T, Hq, D]
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: must be one of {BACKENDS}")
    write_kv(k_cache, v_cache, k_new, v_new, batch.slot_mapping)
    if backend == "flash":
        return _flash_paged(q, k_cache, v_cache, batch)
    out = torch.empty_like(q)
    starts = [0]
    for n in batch.query_lens:
        starts.append(starts[-1] + n)
    done = set()
    if backend == "sdpa":
        # Decodes go in padded batches of similar length: one SDPA call per
        # bucket instead of one per request, with little padding.
        decode_rows = sorted((b for b, n in enumerate(batch.query_lens) if n == 1),
                             key=lambda b: batch.seq_lens[b])
        for i in range(0, len(decode_rows) if len(decode_rows) > 1 else 0, DECODE_BUCKET):
            bucket = decode_rows[i:i + DECODE_BUCKET]
            rows = torch.as_tensor([starts[b] for b in bucket], device=q.device)
            out[rows] = _sdpa_decode_batch(q[rows], k_cache, v_cache, batch, bucket)
            done.update(bucket)
    for b, (n, seq_len) in enumerate(zip(batch.query_lens, batch.seq_lens)):
        if b in done or n == 0:
            continue
        k = gather_kv(k_cache, batch.block_tables[b], seq_len)    # [seq_len, Hkv, D]
        v = gather_kv(v_cache, batch.block_tables[b], seq_len)
        q_b = q[starts[b]:starts[b] + n]
        attend = reference_attention if backend == "reference" else sdpa_attention
        out[starts[b]:starts[b] + n] = attend(q_b, k, v)
    return out


def _sdpa_decode_batch(q, k_cache, v_cache, batch: AttentionBatch, rows: list[int]):
    """All one-token (decode) requests in one SDPA call, padded to the longest.

    q: [B, Hq, D] -> [B, Hq, D]. Padding keys are masked out.
    """
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    seq_lens = [batch.seq_lens[b] for b in rows]
    max_blocks = -(-max(seq_lens) // batch.block_size)
    tables = torch.zeros(num_seqs, max_blocks, dtype=torch.long)
    for i, b in enumerate(rows):
        table = batch.block_tables[b][:max_blocks]
        tables[i, :len(table)] = torch.as_tensor(table)
    flat_blocks = tables.flatten().to(q.device)
    max_len = max_blocks * batch.block_size
    # index_select copies whole blocks at memory speed (2x faster than
    # advanced indexing here); the copy is the price of paging without a
    # paged kernel, which flash-attn's block_table avoids on a GPU.
    k = k_cache.index_select(0, flat_blocks).view(num_seqs, max_len, num_kv_heads, head_dim).transpose(1, 2)
    v = v_cache.index_select(0, flat_blocks).view(num_seqs, max_len, num_kv_heads, head_dim).transpose(1, 2)
    lengths = torch.as_tensor(seq_lens, device=q.device)
    allowed = torch.arange(max_len, device=q.device)[None, :] < lengths[:, None]   # [B, L]
    q_grouped = q.reshape(num_seqs, num_kv_heads, group, head_dim)                   # [B, Hkv, g, D]
    out = F.scaled_dot_product_attention(q_grouped, k, v, attn_mask=allowed[:, None, None, :])
    return out.reshape(num_seqs, num_heads, head_dim)


def _flash_paged(q, k_cache, v_cache, batch: AttentionBatch):
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError as e:
        raise ValueError("backend='flash' needs the flash-attn package on a CUDA GPU "
                         "(pip install -r requirements-cuda.txt); use 'sdpa' instead") from e
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"backend='flash' with dtype={q.dtype}: flash-attn computes in float16 or "
                         "bfloat16 only; load the model in one of those or use 'sdpa'")
    if batch.block_size % FLASH_BLOCK_MULTIPLE:
        raise ValueError(f"block_size={batch.block_size}: flash-attn's paged KV needs a multiple "
                         f"of {FLASH_BLOCK_MULTIPLE}; build the engine with block_size=256")
    device = q.device
    cu_q = torch.tensor([0] + batch.query_lens, device=device).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + batch.seq_lens, device=device).cumsum(0).to(torch.int32)
    width = max(len(t) for t in batch.block_tables)
    tables = torch.zeros(len(batch.block_tables), width, dtype=torch.int32, device=device)
    for i, table in enumerate(batch.block_tables):
        tables[i, :len(table)] = torch.as_tensor(table, dtype=torch.int32)
    # flash-attn >= 2.1 aligns the causal mask bottom-right, as a chunk needs.
    return flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, max(batch.query_lens),
                                  max(batch.seq_lens), causal=True, block_table=tables)
