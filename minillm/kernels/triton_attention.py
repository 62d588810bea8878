"""The whole packed step's attention in ONE Triton kernel launch per layer.

Chapter 1 split a chunk's attention in two: an unmasked rectangle over its
cached prefix and a causal square over itself, merged by log-sum-exp. A GPU
kernel does the same split at a finer grain. Each *program* (one instance of
the kernel, scheduled on one streaming multiprocessor) owns a *tile* of one
request's query rows for one KV head, keeps it in on-chip memory (SRAM), and
walks that request's keys TILE_N at a time (16, 32 or 64 keys, whatever the
cache's block size), finding each key's cache block in the block table:

  * a key tile wholly at or before the tile's first query position is seen by
    every row: no mask (the cached prefix, and the chunk's own early keys);
  * a key tile that crosses the diagonal gets the causal mask key <= query;
  * a key tile wholly after the tile's last query position is never loaded.

Scores never leave SRAM: the softmax is computed online, tile by tile, in
float32 (a running max `m`, a running sum `l` and a rescaled accumulator),
and the output rows are written straight into their place in the step's
output. Prefill chunks, decodes (a one-row tile) and prefix-cached prompts
are all just (query rows, cached length) pairs, so one launch covers them.

Grouped-query attention: the query heads that share a KV head are folded
into the tile's rows (row r = query position r // G, head r % G), so a K/V
tile loaded once serves all G heads.

Split-KV (FlashDecoding). A step of a few long decodes has few programs
(requests x KV heads), too few to fill a GPU's multiprocessors. Then each
sequence's key tiles are cut into segments, one program per (query tile, KV
head, segment); each writes its unnormalised (m, l, acc), and a second kernel
merges a row's segments by log-sum-exp. `plan_segments` states when and how
many; a caller may instead fix the segment size in tokens (`kv_split_size`),
so that a row's segments depend on its own length only (a batch-invariant
mode needs that).

Running without a GPU. Triton's interpreter (TRITON_INTERPRET=1) runs the same
kernel on CPU tensors with numpy, one program after another. The variable must
be set before triton is imported: triton's own library functions (tl.zeros,
tl.max, tl.sum) are `@triton.jit` functions decorated when triton.language is
imported, for the interpreter or for the compiler, once per process. So this
module sets it itself, before importing triton, on a machine without a CUDA
device (unless the variable is already set, or triton already imported). One
process therefore runs the kernel either interpreted on CPU tensors or
compiled on CUDA ones; `why_unavailable` says which and why. Two traps of the
interpreter are handled here: `tl.dot` on bfloat16 operands multiplies their
raw bits (triton #11584), so operands are cast to float32 there; and it does
not check bounds, so every load is masked (a test poisons the memory past
each end).
On a GPU a float32 `tl.dot` rounds its operands to TF32 unless
input_precision="ieee"; this kernel asks for "ieee" so that float32 results
match the reference backend to ~1e-6 (TF32 keeps 10 mantissa bits: ~1e-3).
"""
from __future__ import annotations

import math
import os
import sys

import torch

if "triton" not in sys.modules and "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"      # no GPU: the interpreter, chosen before triton is imported
try:
    import triton
    import triton.language as tl
    TRITON_IMPORT_ERROR = None
except ImportError as e:       # not installed (non-Linux, non-x86_64, Python < 3.11: requirements.txt)
    triton = tl = None
    TRITON_IMPORT_ERROR = (f"triton is not importable here ({e}): requirements.txt installs it on Linux "
                           "x86_64 with Python >= 3.11")
# Whether this process's triton interprets (decided when triton.language was imported).
INTERPRETED = triton is not None and type(tl.zeros).__name__ == "InterpretedFunction"

# Query rows per program (G query heads x BLOCK_M // G positions). 16 is the
# smallest tile tl.dot takes on a GPU; 64 keeps a GPU's tensor cores busier on
# long chunks. The interpreter runs programs one by one, so bigger tiles (fewer
# programs) are faster there too.
BLOCK_M_GPU = 64
BLOCK_M_CPU = 64
# Keys per iteration, whatever the block size (chapter 9 prices each choice in
# shared memory and registers). A [64, TILE_N] float32 score tile and TILE_N-key K
# and V tiles stay far inside an SM's budget at 32; tying the tile to a 256-key
# block did not (K and V tiles of 64 KiB each in bf16 at head_dim 128).
TILE_N_CHOICES = (16, 32, 64)
TILE_N_DEFAULT = 32
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Split-KV. The interpreter plans as an H100 SXM (132 SMs) would, so a CPU run takes the GPU's path.
INTERPRETER_NUM_SMS = 132
MIN_SEGMENT_KEYS = 256       # a judgement, unmeasured: shorter segments spend too much on the merge
MAX_SEGMENTS = 64            # the merge kernel holds a row's segments in registers


def triton_available() -> bool:
    return triton is not None


def why_unavailable(device) -> str | None:
    """None if the triton backend can run on `device`, else the reason, in words."""
    if triton is None:
        return TRITON_IMPORT_ERROR
    kind = torch.device(device).type
    if kind == "cpu" and not INTERPRETED:
        return ("CPU tensors need triton's interpreter, and this process imported triton for a GPU: "
                "start Python with TRITON_INTERPRET=1 to run the kernel on the CPU")
    if kind == "cuda" and INTERPRETED:
        return ("this process runs triton's interpreter (TRITON_INTERPRET=1 was set before triton was "
                "imported): CUDA tensors need a process without it")
    if kind not in ("cpu", "cuda"):
        return f"device={kind!r}: the triton backend runs on CUDA GPUs, or on CPU tensors in the interpreter"
    return None


def _int64_offsets(index, stride):
    """index * stride in int64: a token index times a token stride passes 2^31 on long
    steps (256k tokens x 64 heads x 128 dims), and int32 products wrap silently."""
    return index.to(tl.int64) * stride


_offsets = triton.jit(_int64_offsets) if triton is not None else None


def _attention_tile_program(
        q_ptr, out_ptr, k_cache_ptr, v_cache_ptr,
        block_tables_ptr, tile_request_ptr, tile_first_row_ptr,
        row_starts_ptr, query_lens_ptr, cached_lens_ptr, segment_tiles_ptr,
        segment_acc_ptr, segment_max_ptr, segment_sum_ptr,
        scale, num_heads, num_segments,
        stride_q_token, stride_q_head, stride_o_token, stride_o_head,
        stride_k_block, stride_k_slot, stride_k_head,
        stride_v_block, stride_v_slot, stride_v_head,
        stride_table,
        GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
        HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, SPLIT: tl.constexpr,
        DOT_IN_FLOAT32: tl.constexpr, PRECISION: tl.constexpr):
    """One program: query rows [first_row, first_row + BLOCK_M // GROUP) of one
    request, for the GROUP query heads of KV head `kv_head`, over the key tiles of
    segment `segment` (all of them when not SPLIT)."""
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)
    request = tl.load(tile_request_ptr + tile)
    first_row = tl.load(tile_first_row_ptr + tile)          # within the request's new tokens
    row_start = tl.load(row_starts_ptr + request)           # its first row in the packed step
    query_len = tl.load(query_lens_ptr + request)
    cached_len = tl.load(cached_lens_ptr + request)
    seq_len = cached_len + query_len

    # The tile's rows: BLOCK_M // GROUP query positions x GROUP query heads.
    rows = tl.arange(0, BLOCK_M)
    row_in_request = first_row + rows // GROUP                # [BLOCK_M]
    head = kv_head * GROUP + rows % GROUP
    row_valid = (rows < (BLOCK_M // GROUP) * GROUP) & (row_in_request < query_len)
    query_pos = cached_len + row_in_request                   # absolute positions
    dims = tl.arange(0, HEAD_DIM_PADDED)
    dim_valid = dims < HEAD_DIM
    step_row = row_start + row_in_request                     # row in the packed step

    q_offsets = _offsets(step_row, stride_q_token)[:, None] + head[:, None] * stride_q_head + dims[None, :]
    # The Q load is masked: padding rows cost multiply-adds and registers, not HBM reads.
    q = tl.load(q_ptr + q_offsets, mask=row_valid[:, None] & dim_valid[None, :], other=0.0)
    if DOT_IN_FLOAT32:
        q = q.to(tl.float32)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)        # running max of each row's scores
    l = tl.full([BLOCK_M], 0.0, tl.float32)                   # running sum of exp(score - m)
    acc = tl.full([BLOCK_M, HEAD_DIM_PADDED], 0.0, tl.float32)  # running sum of exp(score - m) * v

    # Key tile j holds keys [j * TILE_N, (j + 1) * TILE_N), wherever their blocks lie.
    first_pos = cached_len + first_row                        # the tile's earliest query
    last_pos = tl.minimum(cached_len + first_row + BLOCK_M // GROUP, seq_len) - 1
    num_unmasked = (first_pos + 1) // TILE_N                 # tiles whose last key <= first_pos
    num_tiles = last_pos // TILE_N + 1                       # tiles whose first key <= last_pos: the rest are skipped
    lo = 0
    hi = num_tiles
    if SPLIT:                                                 # this program's segment of the tiles
        per_segment = tl.load(segment_tiles_ptr + request)
        lo = segment * per_segment
        hi = tl.minimum(lo + per_segment, num_tiles)          # lo >= hi: a segment with no key (stored empty)
    keys = tl.arange(0, TILE_N)
    table = block_tables_ptr + _offsets(request, stride_table)
    for j in range(lo, hi):
        key_pos = j * TILE_N + keys                           # [TILE_N]
        key_valid = key_pos < seq_len                         # every load masked: the interpreter checks no bounds
        kv_mask = key_valid[:, None] & dim_valid[None, :]
        # Each key's cache block from the block table: a tile may span blocks, or hold part of one.
        block = tl.load(table + key_pos // BLOCK_SIZE, mask=key_valid, other=0).to(tl.int64)
        slot = key_pos % BLOCK_SIZE
        k_offsets = block[:, None] * stride_k_block + slot[:, None] * stride_k_slot + kv_head * stride_k_head
        v_offsets = block[:, None] * stride_v_block + slot[:, None] * stride_v_slot + kv_head * stride_v_head
        k = tl.load(k_cache_ptr + k_offsets + dims[None, :], mask=kv_mask, other=0.0)    # [TILE_N, D]
        v = tl.load(v_cache_ptr + v_offsets + dims[None, :], mask=kv_mask, other=0.0)
        if DOT_IN_FLOAT32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale          # [BLOCK_M, TILE_N], float32
        if j >= num_unmasked:
            # The diagonal: this tile holds keys after some of the tile's queries (or past the end).
            visible = (key_pos[None, :] <= query_pos[:, None]) & key_valid[None, :]
            scores = tl.where(visible, scores, float("-inf"))
        # Online softmax: rescale what was summed under the old max. A row that has
        # seen no key yet (the diagonal of a later segment) keeps m = -inf: it
        # subtracts 0 instead, so exp(-inf - (-inf)) never makes a NaN.
        m_new = tl.maximum(m, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        p = tl.exp(scores - m_safe[:, None])
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new

    store_mask = row_valid[:, None] & dim_valid[None, :]
    if SPLIT:
        # The segment's unnormalised state; merge_segments_kernel combines a row's segments.
        state = (_offsets(step_row, num_heads) + head) * num_segments + segment      # [BLOCK_M], int64
        tl.store(segment_acc_ptr + state[:, None] * HEAD_DIM_PADDED + dims[None, :], acc, mask=store_mask)
        tl.store(segment_max_ptr + state, m, mask=row_valid)
        tl.store(segment_sum_ptr + state, l, mask=row_valid)
    else:
        out = acc / l[:, None]
        o_offsets = _offsets(step_row, stride_o_token)[:, None] + head[:, None] * stride_o_head + dims[None, :]
        tl.store(out_ptr + o_offsets, out.to(out_ptr.dtype.element_ty), mask=store_mask)


def _merge_segments_program(
        out_ptr, segment_acc_ptr, segment_max_ptr, segment_sum_ptr,
        num_heads, num_segments, stride_o_token, stride_o_head,
        HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, SEGMENTS_PADDED: tl.constexpr):
    """One program per (row, query head): the log-sum-exp merge of its segments.

    Segment s holds m_s (its max score), l_s = sum exp(score - m_s) and
    acc_s = sum exp(score - m_s) v. With M = max_s m_s, each is rescaled by
    exp(m_s - M); a segment with no key (m_s = -inf, l_s = 0) weighs 0."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    segments = tl.arange(0, SEGMENTS_PADDED)
    dims = tl.arange(0, HEAD_DIM_PADDED)
    dim_valid = dims < HEAD_DIM
    segment_valid = segments < num_segments
    state = (_offsets(row, num_heads) + head) * num_segments + segments             # [SEGMENTS_PADDED]
    m = tl.load(segment_max_ptr + state, mask=segment_valid, other=float("-inf"))
    l = tl.load(segment_sum_ptr + state, mask=segment_valid, other=0.0)
    m_max = tl.max(m, 0)
    weight = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_max))                  # 0 for an empty segment
    acc = tl.load(segment_acc_ptr + state[:, None] * HEAD_DIM_PADDED + dims[None, :],
                  mask=segment_valid[:, None] & dim_valid[None, :], other=0.0)
    total = tl.sum(weight * l, 0)
    out = tl.sum(tl.where(weight[:, None] > 0.0, acc * weight[:, None], 0.0), 0) / total
    o_offsets = _offsets(row, stride_o_token) + head * stride_o_head + dims
    tl.store(out_ptr + o_offsets, out.to(out_ptr.dtype.element_ty), mask=dim_valid)


attention_tile_kernel = triton.jit(_attention_tile_program) if triton is not None else None
merge_segments_kernel = triton.jit(_merge_segments_program) if triton is not None else None


def key_tiles(cached_len: int, first_row: int, num_rows: int, tile_n: int) -> tuple[int, int]:
    """The key tiles (of tile_n keys) a program visits, as the kernel computes them.

    The program holds query rows [first_row, first_row + num_rows) of a request
    with cached_len cached tokens. Returns (unmasked, total): tiles [0, unmasked)
    end at or before its first query, so every row sees every key (no mask);
    tiles [unmasked, total) cross the diagonal (masked); later tiles hold only
    future keys and are never loaded.
    """
    first_pos = cached_len + first_row
    last_pos = first_pos + num_rows - 1
    return (first_pos + 1) // tile_n, last_pos // tile_n + 1


def plan_tiles(query_lens: list[int], group: int, block_m: int) -> tuple[list[int], list[int]]:
    """The programs of a step: (request of each tile, its first query row).

    A request of n new tokens gets ceil(n / (block_m // group)) tiles; a decode
    gets one, whose single position fills `group` of its block_m rows.
    """
    rows_per_tile = max(1, block_m // group)
    requests, first_rows = [], []
    for b, n in enumerate(query_lens):
        for first in range(0, n, rows_per_tile):
            requests.append(b)
            first_rows.append(first)
    return requests, first_rows


def plan_segments(query_lens: list[int], cached_lens: list[int], num_kv_heads: int, tile_n: int, *,
                  num_programs: int, num_sms: int, num_kv_splits: int | None = None,
                  kv_split_size: int | None = None) -> tuple[int, list[int]]:
    """How a step's keys are split: (segments per sequence, key tiles per segment of each request).

    (1, ...) means no split. The rule, when the caller fixes neither:
      split only a decode-only step whose programs (query tiles x KV heads) are fewer
      than the GPU's SMs; into ceil(num_sms / programs) segments, so the grid covers
      every SM once, but no more than the longest sequence holds MIN_SEGMENT_KEYS-key
      segments (a judgement, not yet measured: a shorter segment would spend more on
      the merge's reads and launch than it saves; `make gpu-check` times split-KV on
      and off) and no more than MAX_SEGMENTS. Each request's tiles are shared evenly among the
      segments (ceil), so a short sequence may leave its last segments empty.
    num_kv_splits: that many segments per sequence instead (the same even sharing).
    kv_split_size: segments of exactly that many keys (a multiple of tile_n) for EVERY
      step, chunks included: a row's segment boundaries then depend on its own
      positions only, never on the step it shares (batch invariance needs a fixed
      split size, not a split count); as many segments as the longest sequence needs.
    """
    seq_lens = [c + n for c, n in zip(cached_lens, query_lens)]
    tiles = [-(-s // tile_n) for s in seq_lens]
    if kv_split_size is not None:
        per_segment = kv_split_size // tile_n
        return max(-(-t // per_segment) for t in tiles), [per_segment] * len(tiles)
    if num_kv_splits is None:
        decode_only = all(n == 1 for n in query_lens)
        if not decode_only or num_programs >= num_sms:
            return 1, tiles
        num_kv_splits = min(-(-num_sms // num_programs), max(1, max(seq_lens) // MIN_SEGMENT_KEYS), MAX_SEGMENTS)
    if num_kv_splits == 1:
        return 1, tiles
    return num_kv_splits, [-(-t // num_kv_splits) for t in tiles]


def _step_tensors(batch, group: int, block_m: int, device):
    """The step's int32 metadata, built once per step (every layer reuses it)."""
    key = ("triton", group, block_m, str(device))
    if key not in batch._plan:
        requests, first_rows = plan_tiles(batch.query_lens, group, block_m)
        width = max(1, max(len(t) for t in batch.block_tables))
        tables = torch.zeros(len(batch.block_tables), width, dtype=torch.int32)
        for b, table in enumerate(batch.block_tables):
            tables[b, :len(table)] = torch.as_tensor(table, dtype=torch.int32)
        as_int32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
        batch._plan[key] = (tables.to(device), as_int32(requests), as_int32(first_rows),
                            as_int32(batch.row_starts()), as_int32(batch.query_lens),
                            as_int32(batch.cached_lens))
    return batch._plan[key]


def _check_arguments(q, k_cache, v_cache, batch, block_m, tile_n, precision, num_kv_splits, kv_split_size):
    """Every argument the kernel cannot take, refused by name before anything is launched."""
    for name, tensor in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if tensor.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"backend='triton' with {name}.dtype={tensor.dtype}: the kernel computes in float32 "
                             "from float32, float16 or bfloat16 inputs; use backend='reference' for float64")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(f"backend='triton': q, k_cache and v_cache must share a dtype, got {q.dtype}, "
                         f"{k_cache.dtype} and {v_cache.dtype}")
    if precision not in ("ieee", "tf32"):
        raise ValueError(f"precision={precision!r}: must be 'ieee' or 'tf32'")
    if block_m is not None and (isinstance(block_m, bool) or not isinstance(block_m, int) or block_m < 16
                                or block_m & (block_m - 1)):
        raise ValueError(f"block_m={block_m!r}: must be a power of two >= 16 (tl.dot's smallest tile is 16 "
                         "rows): try 16, 32 or 64")
    if tile_n not in TILE_N_CHOICES:
        raise ValueError(f"tile_n={tile_n!r}: must be one of {TILE_N_CHOICES} keys per iteration")
    if num_kv_splits is not None and kv_split_size is not None:
        raise ValueError(f"num_kv_splits={num_kv_splits} and kv_split_size={kv_split_size}: give a count or a "
                         "size, not both")
    if num_kv_splits is not None and (isinstance(num_kv_splits, bool) or not isinstance(num_kv_splits, int)
                                      or not 1 <= num_kv_splits <= MAX_SEGMENTS):
        raise ValueError(f"num_kv_splits={num_kv_splits!r}: must be an integer in [1, {MAX_SEGMENTS}]")
    if kv_split_size is not None and (isinstance(kv_split_size, bool) or not isinstance(kv_split_size, int)
                                      or kv_split_size <= 0 or kv_split_size % tile_n):
        raise ValueError(f"kv_split_size={kv_split_size!r}: must be a positive multiple of tile_n={tile_n} "
                         "tokens (a segment is whole key tiles)")
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"q has {num_heads} heads, the cache {num_kv_heads}: GQA needs a multiple")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("backend='triton' needs q and the caches contiguous in head_dim")
    if k_cache.shape[1] != batch.block_size:
        raise ValueError(f"k_cache holds blocks of {k_cache.shape[1]} slots, batch.block_size="
                         f"{batch.block_size}: they must agree")


def triton_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch,
                           out: torch.Tensor | None = None, block_m: int | None = None,
                           precision: str = "ieee", tile_n: int = TILE_N_DEFAULT,
                           num_kv_splits: int | None = None, kv_split_size: int | None = None,
                           num_sms: int | None = None) -> torch.Tensor:
    """Attention of every request of a packed step over the paged cache, one launch.

    q: [T, Hq, D]; k_cache, v_cache: [num_blocks, block_size, Hkv, D] with the
    step's new K/V already written; batch: an AttentionBatch -> out [T, Hq, D]
    (written in place into `out` if given). CPU tensors run in the interpreter.
    precision: "ieee" (exact float32 products) or "tf32" (a GPU's faster,
    10-bit-mantissa float32 dot); the interpreter ignores it.
    block_m: query rows per program, a power of two >= 16 (default 64).
    tile_n: keys per iteration, 16, 32 or 64, whatever the block size.
    Split-KV (see plan_segments): by default a decode-only step with fewer programs
    than `num_sms` (the device's SM count; INTERPRETER_NUM_SMS on the CPU) splits;
    num_kv_splits fixes the count; kv_split_size fixes each segment at that many
    tokens (a multiple of tile_n) in every step. A split step launches a second,
    merging kernel and uses T x Hq x segments x head_dim float32 of scratch.
    """
    reason = why_unavailable(q.device)
    if reason:
        raise ValueError(f"backend='triton': {reason}")
    _check_arguments(q, k_cache, v_cache, batch, block_m, tile_n, precision, num_kv_splits, kv_split_size)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    interpret = q.device.type == "cpu"
    if block_m is None:
        block_m = BLOCK_M_CPU if interpret else BLOCK_M_GPU
    block_m = max(block_m, triton.next_power_of_2(group))     # a tile holds at least one position's heads
    out = torch.empty_like(q) if out is None else out
    if num_tokens == 0:
        return out
    tables, requests, first_rows, row_starts, query_lens, cached_lens = _step_tensors(
        batch, group, block_m, q.device)
    if num_sms is None:
        num_sms = INTERPRETER_NUM_SMS if interpret else torch.cuda.get_device_properties(q.device).multi_processor_count
    plan_key = ("segments", group, block_m, tile_n, num_sms, num_kv_splits, kv_split_size, num_kv_heads, str(q.device))
    if plan_key not in batch._plan:                          # once per step: every layer splits alike
        num_segments, segment_tiles = plan_segments(
            batch.query_lens, batch.cached_lens, num_kv_heads, tile_n, num_programs=requests.numel() * num_kv_heads,
            num_sms=num_sms, num_kv_splits=num_kv_splits, kv_split_size=kv_split_size)
        batch._plan[plan_key] = num_segments, torch.tensor(segment_tiles, dtype=torch.int32, device=q.device)
    num_segments, segment_tiles = batch._plan[plan_key]
    split = num_segments > 1
    head_dim_padded = max(16, triton.next_power_of_2(head_dim))
    if split:
        segment_acc = torch.empty(num_tokens * num_heads * num_segments * head_dim_padded,
                                  dtype=torch.float32, device=q.device)
        segment_max = torch.empty(num_tokens * num_heads * num_segments, dtype=torch.float32, device=q.device)
        segment_sum = torch.empty_like(segment_max)
    else:
        segment_acc = segment_max = segment_sum = out            # never touched: SPLIT is off
    dot_in_float32 = interpret and q.dtype != torch.float32
    grid = (requests.numel(), num_kv_heads, num_segments)   # one program per (query tile, KV head, segment)
    attention_tile_kernel[grid](
        q, out, k_cache, v_cache, tables, requests, first_rows, row_starts, query_lens, cached_lens, segment_tiles,
        segment_acc, segment_max, segment_sum,
        1.0 / math.sqrt(head_dim), num_heads, num_segments,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        tables.stride(0),
        GROUP=group, BLOCK_M=block_m, BLOCK_SIZE=batch.block_size, TILE_N=tile_n,
        HEAD_DIM=head_dim, HEAD_DIM_PADDED=head_dim_padded, SPLIT=split,
        # The interpreter's tl.dot is wrong on bfloat16 (triton #11584): float32 operands there.
        DOT_IN_FLOAT32=dot_in_float32,
        # input_precision matters for float32 operands only; 16-bit ones keep triton's default.
        PRECISION=precision if q.dtype == torch.float32 else "tf32")
    if split:
        merge_segments_kernel[(num_tokens, num_heads)](
            out, segment_acc, segment_max, segment_sum, num_heads, num_segments, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, HEAD_DIM_PADDED=head_dim_padded,
            SEGMENTS_PADDED=max(2, triton.next_power_of_2(num_segments)))
    return out
