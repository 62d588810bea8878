"""The whole packed step's attention in ONE Triton kernel launch per layer.

Chapter 1 split a chunk's attention in two: an unmasked rectangle over its
cached prefix and a causal square over itself, merged by log-sum-exp. A GPU
kernel does the same split at a finer grain. Each *program* (one instance of
the kernel, scheduled on one streaming multiprocessor) owns a *tile* of one
request's query rows for one KV head, keeps it in on-chip memory (SRAM), and
walks that request's keys through its block table, one tile of keys (one
cache block) at a time:

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


def _attention_tile_program(
        q_ptr, out_ptr, k_cache_ptr, v_cache_ptr,
        block_tables_ptr, tile_request_ptr, tile_first_row_ptr,
        row_starts_ptr, query_lens_ptr, cached_lens_ptr,
        scale,
        stride_q_token, stride_q_head, stride_o_token, stride_o_head,
        stride_k_block, stride_k_slot, stride_k_head,
        stride_v_block, stride_v_slot, stride_v_head,
        stride_table,
        GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_SIZE: tl.constexpr, KEY_TILE: tl.constexpr,
        HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr,
        DOT_IN_FLOAT32: tl.constexpr, PRECISION: tl.constexpr):
    """One program: query rows [first_row, first_row + BLOCK_M // GROUP) of one
    request, for the GROUP query heads of KV head `kv_head`."""
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
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

    q_offsets = (row_start + row_in_request)[:, None] * stride_q_token + head[:, None] * stride_q_head
    q = tl.load(q_ptr + q_offsets + dims[None, :], mask=row_valid[:, None] & dim_valid[None, :], other=0.0)
    if DOT_IN_FLOAT32:
        q = q.to(tl.float32)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)        # running max of each row's scores
    l = tl.full([BLOCK_M], 0.0, tl.float32)                   # running sum of exp(score - m)
    acc = tl.full([BLOCK_M, HEAD_DIM_PADDED], 0.0, tl.float32)  # running sum of exp(score - m) * v

    # Key tiles are cache blocks. Tile j holds keys [j * BLOCK_SIZE, (j + 1) * BLOCK_SIZE).
    first_pos = cached_len + first_row                        # the tile's earliest query
    last_pos = tl.minimum(cached_len + first_row + BLOCK_M // GROUP, seq_len) - 1
    num_unmasked = (first_pos + 1) // BLOCK_SIZE             # tiles whose last key <= first_pos
    num_tiles = last_pos // BLOCK_SIZE + 1                   # tiles whose first key <= last_pos: the rest are skipped
    keys = tl.arange(0, KEY_TILE)                             # KEY_TILE >= BLOCK_SIZE: a power of two, >= 16
    in_block = keys < BLOCK_SIZE
    # Where a key's K (and V) sits within its cache block, for this KV head: [KEY_TILE, D].
    k_offsets = keys[:, None] * stride_k_slot + kv_head * stride_k_head + dims[None, :]
    v_offsets = keys[:, None] * stride_v_slot + kv_head * stride_v_head + dims[None, :]
    table = block_tables_ptr + request * stride_table
    for j in range(0, num_tiles):
        key_pos = j * BLOCK_SIZE + keys                       # [KEY_TILE]
        key_valid = in_block & (key_pos < seq_len)            # every load masked: the interpreter checks no bounds
        kv_mask = key_valid[:, None] & dim_valid[None, :]
        block = tl.load(table + j, mask=j * BLOCK_SIZE < seq_len, other=0).to(tl.int64)   # the block table
        k = tl.load(k_cache_ptr + block * stride_k_block + k_offsets, mask=kv_mask, other=0.0)   # [KEY_TILE, D]
        v = tl.load(v_cache_ptr + block * stride_v_block + v_offsets, mask=kv_mask, other=0.0)
        if DOT_IN_FLOAT32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale          # [BLOCK_M, KEY_TILE], float32
        if j >= num_unmasked:
            # The diagonal: this tile holds keys after some of the tile's queries.
            visible = (key_pos[None, :] <= query_pos[:, None]) & key_valid[None, :]
            scores = tl.where(visible, scores, float("-inf"))
        elif KEY_TILE > BLOCK_SIZE:
            scores = tl.where(in_block[None, :], scores, float("-inf"))              # the tile's padding only
        # Online softmax: rescale what was summed under the old max. Tile 0 holds
        # key 0, which every row sees, so m is finite from the first tile on.
        m_new = tl.maximum(m, tl.max(scores, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new

    out = acc / l[:, None]
    o_offsets = (row_start + row_in_request)[:, None] * stride_o_token + head[:, None] * stride_o_head
    tl.store(out_ptr + o_offsets + dims[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_valid[:, None] & dim_valid[None, :])


attention_tile_kernel = triton.jit(_attention_tile_program) if triton is not None else None


def key_tiles(cached_len: int, first_row: int, num_rows: int, block_size: int) -> tuple[int, int]:
    """The key tiles (cache blocks) a program visits, as the kernel computes them.

    The program holds query rows [first_row, first_row + num_rows) of a request
    with cached_len cached tokens. Returns (unmasked, total): tiles [0, unmasked)
    end at or before its first query, so every row sees every key (no mask);
    tiles [unmasked, total) cross the diagonal (masked); later tiles hold only
    future keys and are never loaded.
    """
    first_pos = cached_len + first_row
    last_pos = first_pos + num_rows - 1
    return (first_pos + 1) // block_size, last_pos // block_size + 1


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


def triton_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch,
                           out: torch.Tensor | None = None, block_m: int | None = None,
                           precision: str = "ieee") -> torch.Tensor:
    """Attention of every request of a packed step over the paged cache, one launch.

    q: [T, Hq, D]; k_cache, v_cache: [num_blocks, block_size, Hkv, D] with the
    step's new K/V already written; batch: an AttentionBatch -> out [T, Hq, D]
    (written in place into `out` if given). CPU tensors run in the interpreter.
    precision: "ieee" (exact float32 products) or "tf32" (a GPU's faster,
    10-bit-mantissa float32 dot); the interpreter ignores it.
    """
    reason = why_unavailable(q.device)
    if reason:
        raise ValueError(f"backend='triton': {reason}")
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"backend='triton' with dtype={q.dtype}: the kernel computes in float32 from "
                         "float32, float16 or bfloat16 inputs; use backend='reference' for float64")
    if precision not in ("ieee", "tf32"):
        raise ValueError(f"precision={precision!r}: must be 'ieee' or 'tf32'")
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"q has {num_heads} heads, the cache {num_kv_heads}: GQA needs a multiple")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("backend='triton' needs q and the caches contiguous in head_dim")
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
    dot_in_float32 = interpret and q.dtype != torch.float32
    grid = (requests.numel(), num_kv_heads)                 # one program per (query tile, KV head)
    attention_tile_kernel[grid](
        q, out, k_cache, v_cache, tables, requests, first_rows, row_starts, query_lens, cached_lens,
        1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        tables.stride(0),
        GROUP=group, BLOCK_M=block_m, BLOCK_SIZE=batch.block_size,
        KEY_TILE=max(16, triton.next_power_of_2(batch.block_size)),
        HEAD_DIM=head_dim, HEAD_DIM_PADDED=max(16, triton.next_power_of_2(head_dim)),
        # The interpreter's tl.dot is wrong on bfloat16 (triton #11584): float32 operands there.
        DOT_IN_FLOAT32=dot_in_float32,
        # input_precision matters for float32 operands only; 16-bit ones keep triton's default.
        PRECISION=precision if q.dtype == torch.float32 else "tf32")
    return out
