"""Causal attention for a packed step: one entry point, three backends.

A step packs the new tokens of several requests into one tensor of T rows.
Request b brings `query_lens[b]` new tokens at positions
[cached_lens[b], cached_lens[b] + query_lens[b]) and attends to every key
from 0 up to its own position: its cached prefix plus the new tokens. The
mask of such a chunk is a rectangle whose causal diagonal ends in the
bottom-right corner; see `causal_mask`.

Backends:
  "reference"  explicit softmax(QK^T)V, any dtype (float64 too): the yardstick
  "sdpa"       torch's fused kernels; a chunk split in two (no mask over its
               cached prefix, is_causal over itself, merged by log-sum-exp),
               decodes batched in padded buckets
  "flash"      flash-attn's varlen kernel reading the paged cache directly
               (CUDA only; needs `pip install flash-attn`, block_size % 256 == 0)
  "triton"     one Triton kernel launch per layer for the whole step, through the
               block tables (kernels/triton_attention.py): compiled on CUDA, run by
               triton's interpreter on CPU tensors; opt-in (never the default, see
               default_backend) until `make gpu-check` has passed on a GPU
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from . import batch_invariant as invariant
from . import kernels
from .kv_cache import blocks_for, gather_kv, view_kv

BACKENDS = ("reference", "sdpa", "flash", "triton")
FLASH_BLOCK_MULTIPLE = 256  # flash-attn's paged KV needs page sizes divisible by 256
DECODE_BUCKET = 8           # decodes per padded SDPA call at most (sorted by length)
# What one more SDPA call (and its gather) costs, in padded cached tokens of
# one sequence: on a 2-core CPU a call's fixed price (~50-80 us per layer) buys
# roughly a thousand tokens of K/V reads. Buckets split where padding costs more.
DECODE_CALL_COST_TOKENS = 1024


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


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """[n, H, D] -> [1, H, n, D]: the layout torch's fused kernels take (a view)."""
    return x.transpose(0, 1)[None]


def _fused_attention(q, k, v, is_causal: bool = False, attn_mask=None, with_lse: bool = False):
    """Every kernel call of the sdpa backend goes through here (tests record them).

    q: [1, Hq, n, D], k and v: [1, Hq or Hkv, m, D] -> out [1, Hq, n, D]
    (and the log-sum-exp of each row, [1, Hq, n], if with_lse). is_causal
    aligns top-left, so callers pass it for square blocks only.
    """
    if not with_lse:
        extra = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **extra)
    if q.device.type == "cpu":
        # The fused CPU kernel returns the log-sum-exp it computes anyway;
        # torch's public SDPA drops it, and the merge needs it.
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal)
    if q.device.type == "cuda" and q.dtype != torch.float64:
        try:
            out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0,
                                                                              is_causal)[:2]
            return out, lse[..., :q.shape[2]]   # the kernel pads the rows of its lse
        except RuntimeError:
            pass                                # a shape or GPU it does not take: the explicit path
    out, lse = reference_attention(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                                   causal=is_causal, align="top_left", return_lse=True)
    return _heads_first(out), lse.transpose(0, 1)[None]


def causal_block_attention(q, k, v, with_lse: bool = False):
    """Causal attention of a square block: queries and keys are the same n tokens.

    q: [n, Hq, D], k and v: [n, Hkv, D] -> [n, Hq, D] (and lse [n, Hq]).
    Square, so top-left and bottom-right coincide and is_causal is exact: the
    kernel builds no mask and skips the masked half of the scores.
    """
    n, num_heads, _ = q.shape
    if with_lse or not _SDPA_HAS_GQA:
        # The kernels that return an lse do not share KV heads: copy the
        # block's n keys per query head (cheap next to the n x n scores).
        k, v = _expand_kv_heads(k, num_heads), _expand_kv_heads(v, num_heads)
    result = _fused_attention(_heads_first(q), _heads_first(k), _heads_first(v), is_causal=True,
                              with_lse=with_lse)
    if not with_lse:
        return result[0].transpose(0, 1)
    out, lse = result
    return out[0].transpose(0, 1), lse[0].transpose(0, 1)


def unmasked_attention(q, k, v):
    """Every query attends to every key: no mask at all. Returns (out, lse).

    q: [n, Hq, D], k and v: [m, Hkv, D] -> out [n, Hq, D], lse [n, Hq].
    Without a mask the query heads that share a KV head can be folded into
    the query rows, so grouped-query attention copies no K or V.
    """
    n, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    q_rows = q.reshape(n, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)      # [Hkv, g, n, D]
    q_rows = q_rows.reshape(1, num_kv_heads, group * n, head_dim)
    out, lse = _fused_attention(q_rows, _heads_first(k), _heads_first(v), with_lse=True)
    out = out.reshape(num_kv_heads, group, n, head_dim).permute(2, 0, 1, 3)        # [n, Hkv, g, D]
    lse = lse.reshape(num_kv_heads, group, n).permute(2, 0, 1)                    # [n, Hkv, g]
    return out.reshape(n, num_heads, head_dim), lse.reshape(n, num_heads)


def chunk_attention(q, k_chunk, v_chunk, k_prefix, v_prefix):
    """A chunk's attention over its cached prefix and itself, split in two.

    q, k_chunk, v_chunk: the chunk's n tokens ([n, Hq, D], [n, Hkv, D]);
    k_prefix, v_prefix: the c cached tokens before it ([c, Hkv, D]).
    The bottom-right mask of the chunk over all c + n keys is two blocks: a
    c-wide rectangle of all ones (every query sees every cached key) and the
    n x n lower triangle of the chunk against itself. So: attention with no
    mask over the prefix, causal attention over the square, merged by
    log-sum-exp. No mask tensor is built at all.
    """
    if k_prefix.shape[0] == 0:
        return causal_block_attention(q, k_chunk, v_chunk)
    out_prefix, lse_prefix = unmasked_attention(q, k_prefix, v_prefix)
    out_chunk, lse_chunk = causal_block_attention(q, k_chunk, v_chunk, with_lse=True)
    return merge_attention(out_prefix, lse_prefix, out_chunk, lse_chunk)[0]


def sdpa_attention(q, k, v):
    """Bottom-right causal attention for one sequence with torch's fused kernels.

    q: [n, Hq, D], k and v: [m, Hkv, D], m >= n: the queries are the last n
    of the m positions -> [n, Hq, D].
    """
    cached = k.shape[0] - q.shape[0]
    return chunk_attention(q, k[cached:], v[cached:], k[:cached], v[:cached])


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
    # What every layer needs and no layer changes (row offsets, decode
    # buckets, their padding masks and gather buffers): built by the first layer of the step.
    _plan: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def seq_lens(self) -> list[int]:
        return [c + n for c, n in zip(self.cached_lens, self.query_lens)]

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    def row_starts(self) -> list[int]:
        """First row of each request in the packed step."""
        if "starts" not in self._plan:
            starts = [0]
            for n in self.query_lens[:-1]:
                starts.append(starts[-1] + n)
            self._plan["starts"] = starts
        return self._plan["starts"]


def write_kv(k_cache, v_cache, k_new, v_new, slot_mapping):
    """Store the step's new K and V in their slots.

    k_cache: [num_blocks, block_size, Hkv, D]; k_new: [T, Hkv, D]; slots: [T]
    """
    k_cache.view(-1, *k_cache.shape[2:])[slot_mapping] = k_new
    v_cache.view(-1, *v_cache.shape[2:])[slot_mapping] = v_new


def read_cached_prefixes(pool: torch.Tensor, batch: AttentionBatch) -> list:
    """Each prefill chunk's cached prefix for every layer at once, where that is free.

    pool: [num_layers, 2, num_blocks, block_size, Hkv, D] -> per request a
    [num_layers, 2, num_cached, Hkv, D] view of the pool when its blocks are
    consecutive: nothing copied, for any layer. None for decodes, for prompts
    with nothing cached, and for prefixes in scattered blocks: each layer
    gathers those itself, one copy of its K and one of its V, read while they
    are still in the CPU's cache. (One copy of every layer's prefix per step
    was no faster on the small models and ~5x slower on SmolLM2's 30 layers:
    tens of MB written out and read back; `bench chunk-cost` times both.)
    """
    return [view_kv(pool, table, c) if n > 1 and c > 0 else None
            for n, c, table in zip(batch.query_lens, batch.cached_lens, batch.block_tables)]


def default_backend(device, dtype: torch.dtype | None = None, block_size: int | None = None) -> str:
    """The backend a step uses when none is named: no code path that has never run on
    the device is the default.

    On CUDA: "flash" where flash-attn imports, the dtype is 16-bit (float16 or
    bfloat16) and the block size is one flash-attn's paged KV takes (a multiple of
    256); else "sdpa" (torch's own kernels). Everywhere else: "sdpa".
    "triton" is never picked here: it stays opt-in (backend="triton") until
    `make gpu-check` has passed on a GPU and its results are committed (README, GPU
    notes), and only that commit may make it a default.
    """
    if torch.device(device).type != "cuda":
        return "sdpa"
    sixteen_bit = dtype in (torch.float16, torch.bfloat16)
    flash_blocks = block_size is not None and block_size % FLASH_BLOCK_MULTIPLE == 0
    if sixteen_bit and flash_blocks and _flash_attn_imports():
        return "flash"
    return "sdpa"


@functools.lru_cache(maxsize=1)
def _flash_attn_imports() -> bool:
    """Whether `import flash_attn` succeeds (asked once per process: every layer asks)."""
    try:
        import flash_attn  # noqa: F401
    except Exception:      # noqa: BLE001 (not installed, or built for another torch: OSError, RuntimeError)
        return False
    return True


def paged_attention(q, k_new, v_new, k_cache, v_cache, batch: AttentionBatch,
                    backend: str | None = None, prefixes: list | None = None,
                    batch_invariant: bool = False):
    """Write the new K/V into the cache, then attend for every request.

    q: [T, Hq, D]; k_new, v_new: [T, Hkv, D] -> out [T, Hq, D]
    backend: one of BACKENDS, or None (the default) for
    default_backend(q.device, q.dtype, batch.block_size): "sdpa" on a CPU.
    prefixes: this layer's (k, v) cached prefix of each prefill chunk where the
    caller has it as a view for the whole step (read_cached_prefixes); None
    entries (or prefixes=None) are gathered here.
    batch_invariant: every row's bits independent of the step (batch_invariant.py): the
    reference and sdpa backends hand the step to its tiled attention; triton's kernel is
    invariant as it is; flash is refused.
    """
    if backend is None:     # the mode never lands on a backend it refuses (flash)
        backend = "sdpa" if batch_invariant else default_backend(q.device, q.dtype, batch.block_size)
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: must be one of {BACKENDS}")
    invariant.check_batch_invariant(batch_invariant, backend)
    write_kv(k_cache, v_cache, k_new, v_new, batch.slot_mapping)
    if batch_invariant and backend != "triton":
        return invariant.paged_attention(q, k_cache, v_cache, batch)
    if backend == "flash":
        return _flash_paged(q, k_cache, v_cache, batch)
    if backend == "triton":
        # Imported on first use: importing it picks triton's interpreter or compiler for the process.
        from .kernels.triton_attention import triton_paged_attention
        return triton_paged_attention(q, k_cache, v_cache, batch)
    out = torch.empty_like(q)
    starts = batch.row_starts()
    if backend == "reference":
        for b, (start, n, seq_len) in enumerate(zip(starts, batch.query_lens, batch.seq_lens)):
            k = gather_kv(k_cache, batch.block_tables[b], seq_len)    # [seq_len, Hkv, D]
            v = gather_kv(v_cache, batch.block_tables[b], seq_len)
            out[start:start + n] = reference_attention(q[start:start + n], k, v)
        return out
    if uses_paged_decode_kernel(q) and k_cache.is_contiguous() and v_cache.is_contiguous():
        # A paged kernel reads each decode's blocks where they lie: no gather.
        rows, tables, seq_lens = _decode_tables(batch)
        if len(rows):
            out[rows] = kernels.paged_decode(q[rows], k_cache, v_cache, tables, seq_lens, q.shape[-1] ** -0.5)
    else:
        for rows, blocks, max_len, bias, gathered in _decode_buckets(batch, q.device, q.dtype):
            out[rows] = _decode_bucket_attention(q[rows], k_cache, v_cache, blocks, max_len, bias, gathered)
    for b, (start, n, cached) in enumerate(zip(starts, batch.query_lens, batch.cached_lens)):
        if n == 1 or n == 0:
            continue                                   # decodes are done above
        rows = slice(start, start + n)
        if prefixes is not None and prefixes[b] is not None:
            k_prefix, v_prefix = prefixes[b]
        else:
            k_prefix = gather_kv(k_cache, batch.block_tables[b], cached)   # [cached, Hkv, D]
            v_prefix = gather_kv(v_cache, batch.block_tables[b], cached)
        # The chunk's own keys come straight from k_new: no need to read back
        # what was just written.
        out[rows] = chunk_attention(q[rows], k_new[rows], v_new[rows], k_prefix, v_prefix)
    return out


def uses_paged_decode_kernel(q: torch.Tensor) -> bool:
    """Whether this step's decodes go to the compiled CPU kernel (kernels/):
    float32 or float64 on the CPU, once `python -m minillm.kernels build` has
    run. Otherwise they are gathered and batched into torch's fused kernel."""
    return (q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64)
            and kernels.paged_decode_available())


def _decode_tables(batch: AttentionBatch):
    """(rows [n], block tables [n, width], seq_lens [n]) of the step's decodes,
    built once per step for the paged kernel (a CPU kernel: CPU tensors); no
    padding, no sorting."""
    if "decode_tables" not in batch._plan:
        decodes = [b for b, n in enumerate(batch.query_lens) if n == 1]
        width = max((len(batch.block_tables[b]) for b in decodes), default=0)
        tables = torch.zeros(len(decodes), width, dtype=torch.long)
        for j, b in enumerate(decodes):
            tables[j, :len(batch.block_tables[b])] = torch.as_tensor(batch.block_tables[b])
        starts, seq_lens = batch.row_starts(), batch.seq_lens
        batch._plan["decode_tables"] = (torch.as_tensor([starts[b] for b in decodes], dtype=torch.long), tables,
                                        torch.as_tensor([seq_lens[b] for b in decodes], dtype=torch.long))
    return batch._plan["decode_tables"]


def split_decodes(seq_lens: list[int], max_bucket: int = DECODE_BUCKET,
                  call_cost_tokens: int = DECODE_CALL_COST_TOKENS) -> list[tuple[int, int]]:
    """Cut decodes sorted by length into buckets: [(start, stop), ...].

    A bucket pads every request to its longest, so it costs about
    call_cost_tokens + size x longest. Four decodes over 200 tokens batched
    with one over 2,100 would read 5 x 2,100 keys; split, 4 x 200 + 2,100.
    The cheapest cut, found by dynamic programming over the sorted lengths
    (at most max_bucket per bucket, so ~max_bucket x n steps of work).
    """
    n = len(seq_lens)
    best = [0.0] + [math.inf] * n            # best[j]: cheapest cut of the first j
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(max(0, j - max_bucket), j):
            cost = best[i] + call_cost_tokens + (j - i) * seq_lens[j - 1]
            if cost < best[j]:
                best[j], cut[j] = cost, i
    spans, j = [], n
    while j > 0:
        spans.append((cut[j], j))
        j = cut[j]
    return spans[::-1]


def _decode_buckets(batch: AttentionBatch, device, dtype):
    """Decodes in padded buckets of similar length, planned once per step.

    Returns [(rows [B], blocks [B * max_blocks], L, bias [B, 1, 1, L] or None,
    gathered {})] with L the longest sequence of the bucket and gathered the
    place for the bucket's gather buffers, which every layer of the step reuses:
    one SDPA call per bucket instead of one per request. Sorting by length
    and cutting where padding would cost more than another call
    (split_decodes) keeps the padding small; a bucket whose requests all have
    the same length needs no mask, else it gets an additive one (0 or -inf),
    which the kernel takes as it is: a boolean mask is converted to that in
    every layer (~10% of a decode call on this CPU).
    """
    if "decodes" in batch._plan:
        return batch._plan["decodes"]
    starts = batch.row_starts()
    decodes = sorted((b for b, n in enumerate(batch.query_lens) if n == 1),
                     key=lambda b: batch.seq_lens[b])
    buckets = []
    for start, stop in split_decodes([batch.seq_lens[b] for b in decodes]):
        bucket = decodes[start:stop]
        seq_lens = [batch.seq_lens[b] for b in bucket]
        width = blocks_for(max(seq_lens), batch.block_size)
        tables = torch.zeros(len(bucket), width, dtype=torch.long)
        for j, b in enumerate(bucket):
            table = batch.block_tables[b][:width]
            tables[j, :len(table)] = torch.as_tensor(table)
        bias = None
        if min(seq_lens) != max(seq_lens):
            padding = torch.arange(max(seq_lens))[None, :] >= torch.as_tensor(seq_lens)[:, None]
            bias = torch.zeros(padding.shape, dtype=dtype).masked_fill_(padding, -math.inf)
            bias = bias[:, None, None, :].to(device)                              # [B, 1, 1, L]
        rows = torch.as_tensor([starts[b] for b in bucket], device=device)
        buckets.append((rows, tables.flatten().to(device), max(seq_lens), bias, {}))
    batch._plan["decodes"] = buckets
    return buckets


def _decode_bucket_attention(q, k_cache, v_cache, blocks, max_len: int, bias, gathered=None):
    """One SDPA call for a bucket of decodes over their padded caches.

    q: [B, Hq, D] -> [B, Hq, D]. The query heads sharing a KV head are folded
    into the query rows, so GQA copies no K or V. gathered: a dict to keep the
    gather's two buffers in, so the layers of a step reuse them.
    """
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    # index_select copies whole blocks at memory speed; the copy is the price
    # of paging without a paged kernel (flash-attn's block_table avoids it).
    # Into the same buffers for every layer: a fresh multi-megabyte tensor per
    # layer costs the allocator (and the OS's page faults) as much as the copy.
    gathered = {} if gathered is None else gathered
    if "k" not in gathered:
        gathered["k"] = k_cache.new_empty((len(blocks), *k_cache.shape[1:]))
        gathered["v"] = v_cache.new_empty((len(blocks), *v_cache.shape[1:]))
    shape = (num_seqs, -1, num_kv_heads, head_dim)
    k = torch.index_select(k_cache, 0, blocks, out=gathered["k"]).view(shape)[:, :max_len].transpose(1, 2)
    v = torch.index_select(v_cache, 0, blocks, out=gathered["v"]).view(shape)[:, :max_len].transpose(1, 2)
    q_grouped = q.reshape(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)  # [B, Hkv, g, D]
    out = _fused_attention(q_grouped, k, v, attn_mask=bias)
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
