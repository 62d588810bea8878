"""Batch-invariant mode: a row's bits never depend on its neighbours (chapter 11).

In the default engine a token's logits can change in the last bits with
what shares its step: torch's float32 GEMM on this CPU computes a row one way
when the step has 1-3 rows and another way with more (and splits odd row
counts between threads differently), and the attention of a chunk merges its
cached prefix and itself at the chunk's boundary, so the order of the sum
over keys moves with the chunk size. A 1-ulp difference grows through the
layers and, in bfloat16, flips greedy tokens.

`batch_invariant=True` (LLMEngine, prefill_kv) computes every row so that
nothing about its step can reach it:

  linear layers   rows in tiles of a fixed number of rows (row_tile), the last
                  tile padded: every GEMM has the same shape, so the library
                  picks the same kernel for every row, whatever the batch.
  SiLU            x / (1 + exp(-x)): torch's fused float32 silu rounds the
                  elements of a vector's tail (and of each thread's share)
                  differently from the rest; exp, add and div do not.
  attention       every row alone, its keys from position 0 in one fixed order:
                  on the CPU the compiled paged kernel (kernels/) takes every
                  row of the step as a decode of its own length; without it,
                  key tiles of KEY_TILE positions aligned to ABSOLUTE positions
                  (not to the chunk), query tiles of QUERY_TILE positions, each
                  (query tile, key tile) product one fixed-shape GEMM, the
                  weights exp(score - row max) (a max is exact in any order)
                  summed per tile, then across tiles in one fixed binary tree
                  over the absolute tile index. Either way a row computed as a
                  decode, in a chunk of 3 or in a whole prompt gets the same bits.

What stays per row without help (chapter 11 measures it): the embedding
(a copy), RoPE, RMSNorm (a reduction along each row), the residual adds,
log_softmax and the sampler.

Where it holds: the "sdpa" and "reference" backends (both hand the step to
the attention above) and "triton" (its kernel already walks key tiles that
are cache blocks, in order, with fixed tile shapes: tested in triton's
interpreter, not yet on a GPU). "flash" is refused: flash-attn picks its split
of the keys from the batch's size, and another path when every query is a
decode (num_splits_heuristic, seqlenq_ngroups_swapped in its flash_api.cpp).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import kernels
from .validation import ArgumentTypeError

# Rows per GEMM of a linear layer, per dtype: the padding of a small step against the
# pace of many tiles. float32 runs the tiles as one batched GEMM, where 16 measured
# cheaper (`bench invariant`); bfloat16 one call per tile, where 32 did (chapter 11, section 4).
ROW_TILE = {torch.bfloat16: 32}
DEFAULT_ROW_TILE = 16
QUERY_TILE = 8       # query positions per attention tile (x the GQA group = the GEMM's rows)
KEY_TILE = 32        # keys per attention tile, tile j = positions [j * KEY_TILE, (j + 1) * KEY_TILE)

# Backends where the mode holds; flash-attn's varlen kernel chooses its tiles and
# split-KV count from the batch (see chapter 11), so it cannot.
INVARIANT_BACKENDS = ("reference", "sdpa", "triton")


def check_batch_invariant(batch_invariant, backend=None, arg: str = "batch_invariant") -> bool:
    """A bool; and, when True, a backend the mode holds on."""
    if not isinstance(batch_invariant, bool):
        raise ArgumentTypeError(f"{arg}={batch_invariant!r}: must be True or False")
    if batch_invariant and backend is not None and backend not in INVARIANT_BACKENDS:
        raise ValueError(f"{arg}=True with backend={backend!r}: the mode holds on {INVARIANT_BACKENDS} only "
                         "(flash-attn picks its tiles and its split of the keys from the batch's shape); "
                         "use backend='sdpa' or 'triton'")
    return batch_invariant


# ---------------------------------------------------------------------------
# Row-wise layers
# ---------------------------------------------------------------------------
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           tile_rows: int | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) over tiles of tile_rows rows: x [T, in] -> [T, out].

    Every tile is one GEMM of shape [tile_rows, in] x [in, out] (the last tile
    padded with zero rows), so every row goes through the kernel that shape
    picks, in whichever slot of its tile it lands. float32 and float64 run the
    tiles as the items of one batched GEMM (each item computed alone, whatever
    their number: measured in tests/test_batch_invariant.py); bfloat16, whose
    batched GEMM is slow on the CPU, one call per tile.
    """
    tile_rows = tile_rows or row_tile(x.dtype)
    num_rows, num_tiles = x.shape[0], -(-x.shape[0] // tile_rows)
    padded = x if num_rows == num_tiles * tile_rows else torch.cat(
        [x, x.new_zeros(num_tiles * tile_rows - num_rows, x.shape[1])])
    tiles = padded.contiguous().view(num_tiles, tile_rows, x.shape[1])        # [n, R, in]
    weight_t = weight.t().expand(num_tiles, *weight.t().shape)               # [n, in, out], no copy
    if x.dtype in (torch.float32, torch.float64):
        if bias is None:
            out = torch.bmm(tiles, weight_t)
        else:
            out = torch.baddbmm(bias.expand(num_tiles, tile_rows, -1), tiles, weight_t)
        return out.view(-1, weight.shape[0])[:num_rows]
    out = x.new_empty(num_tiles, tile_rows, weight.shape[0])
    for i in range(num_tiles):
        if bias is None:
            torch.mm(tiles[i], weight_t[i], out=out[i])
        else:
            torch.addmm(bias, tiles[i], weight_t[i], out=out[i])
    return out.view(-1, weight.shape[0])[:num_rows]


def row_tile(dtype) -> int:
    """Rows per GEMM tile of the linear layers for this dtype."""
    return ROW_TILE.get(dtype, DEFAULT_ROW_TILE)


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x) from operations whose vector and scalar code round alike,
    in float32 (float64 for float64) and rounded once to x's dtype."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = x.to(compute)
    return (h / (1 + torch.exp(-h))).to(x.dtype)


# ---------------------------------------------------------------------------
# Attention over absolute key tiles
# ---------------------------------------------------------------------------
def _step_plan(batch, num_kv_heads: int, device, query_tile: int, key_tile: int) -> dict:
    """Index tensors for every layer of the step: which rows form each query
    tile, which key tiles each query tile meets (its pairs, in (tile, j) order),
    the cache rows of those keys, the causal mask, and the tree that sums a
    query tile's pairs. Built once per step."""
    key = ("batch_invariant", num_kv_heads, query_tile, key_tile, str(device))
    if key in batch._plan:
        return batch._plan[key]
    tile_rows, tile_positions = [], []          # per query tile: step rows (-1: padding), positions
    pair_tile, pair_key_tile, pair_first_key = [], [], []
    key_slots, key_tiles_so_far = [], 0
    block_size = batch.block_size
    for b, (start, n, cached) in enumerate(zip(batch.row_starts(), batch.query_lens, batch.cached_lens)):
        if n == 0:
            continue
        seq_len = cached + n
        num_key_tiles = -(-seq_len // key_tile)
        positions = torch.arange(num_key_tiles * key_tile)
        table = torch.as_tensor(batch.block_tables[b][:-(-seq_len // block_size)], dtype=torch.long)
        slots = table[(positions // block_size).clamp(max=len(table) - 1)] * block_size + positions % block_size
        key_slots.append(torch.where(positions < seq_len, slots, 0))     # past the end: any slot, masked
        for first in range(0, n, query_tile):
            t = len(tile_rows)
            rows = [start + first + r if first + r < n else -1 for r in range(query_tile)]
            tile_rows.append(rows)
            tile_positions.append([cached + first + r if first + r < n else -1 for r in range(query_tile)])
            last_position = cached + min(first + query_tile, n) - 1
            for j in range(last_position // key_tile + 1):
                pair_tile.append(t)
                pair_key_tile.append(key_tiles_so_far + j)
                pair_first_key.append(j * key_tile)
        key_tiles_so_far += num_key_tiles
    rows = torch.tensor(tile_rows, dtype=torch.long)                       # [NQ, QT]
    pair_tile_t = torch.tensor(pair_tile, dtype=torch.long)               # [P]
    slots = torch.cat(key_slots).view(-1, key_tile)[torch.tensor(pair_key_tile)]   # [P, KT]
    heads = torch.arange(num_kv_heads)
    # The cache of one layer viewed as [slots * Hkv, D]: row slot * Hkv + head.
    cache_rows = (slots[:, None, :] * num_kv_heads + heads[None, :, None]).flatten()   # [P * Hkv * KT]
    key_positions = torch.tensor(pair_first_key)[:, None] + torch.arange(key_tile)     # [P, KT]
    query_positions = torch.tensor(tile_positions, dtype=torch.long)[pair_tile_t]       # [P, QT]
    hidden = key_positions[:, None, :] > query_positions[:, :, None]                    # [P, QT, KT]
    masked_pairs = hidden.flatten(1).any(1).nonzero().flatten()       # most pairs of a long prefix: none
    plan = {
        "num_tiles": len(tile_rows),
        "gather_rows": rows.clamp(min=0).flatten().to(device),       # padding rows read row 0, dropped later
        "valid": (rows >= 0).flatten().to(device),
        "out_rows": rows.flatten()[rows.flatten() >= 0].to(device),
        "pair_tile": pair_tile_t.to(device),
        "cache_rows": cache_rows.to(device),
        "masked_pairs": masked_pairs.to(device),
        "mask": hidden[masked_pairs][:, None, :, None, :].to(device),  # [P masked, 1, QT, 1, KT]
        "tree": [(left.to(device), right_parent.to(device), right.to(device))
                 for left, right_parent, right in _tree_levels(pair_tile)],
    }
    batch._plan[key] = plan
    return plan


def _tree_levels(pair_tile: list[int]):
    """The fixed binary tree that sums each query tile's pairs (in key-tile
    order j = 0, 1, ...): per level, (left child of each parent, parents that
    have a right child, those right children), indices into the level below.
    Node j's parent is j // 2, so the tree is set by the absolute tile index
    alone: a row that meets more tiles (all zeros for it) sums the same way."""
    counts = []                                   # pairs per query tile, in order
    for t in pair_tile:
        if counts and len(counts) - 1 == t:
            counts[-1] += 1
        else:
            counts.append(1)
    levels = []
    while max(counts) > 1:
        left, right_parent, right, offset, parent = [], [], [], 0, 0
        new_counts = []
        for count in counts:
            for j in range(0, count, 2):
                left.append(offset + j)
                if j + 1 < count:
                    right_parent.append(parent)
                    right.append(offset + j + 1)
                parent += 1
            offset += count
            new_counts.append(-(-count // 2))
        levels.append((torch.tensor(left), torch.tensor(right_parent, dtype=torch.long),
                       torch.tensor(right, dtype=torch.long)))
        counts = new_counts
    return levels


def _tree_reduce(values: torch.Tensor, tree, combine) -> torch.Tensor:
    """Combine each query tile's pairs (dim 0, in (tile, j) order) up the fixed tree:
    [P, ...] -> [NQ, ...]. combine: torch.add for the sums, torch.maximum for the max."""
    for left, right_parent, right in tree:
        parents = values.index_select(0, left)
        both = combine(parents.index_select(0, right_parent), values.index_select(0, right))
        values = parents.index_copy_(0, right_parent, both)
    return values


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch) -> torch.Tensor:
    """Every request's causal attention, each row's bits independent of the step.

    q: [T, Hq, D]; k_cache, v_cache: [num_blocks, block_size, Hkv, D], the
    step's own K and V already written -> out [T, Hq, D].
    Where the compiled CPU kernel runs (kernels/), every row goes through it as
    a decode of its own length: the kernel computes a row alone, its keys from
    position 0 in groups of 16, in one order that depends on the row's position
    only. bfloat16 runs it in float32 on the step's blocks, upcast (exactly) once
    per layer, and rounds the output once. Elsewhere the tiled version below.
    """
    if not uses_row_kernel(q, k_cache, v_cache):
        return tiled_attention(q, k_cache, v_cache, batch)
    tables, lengths = _row_tables(batch, q.device)
    scale = q.shape[-1] ** -0.5
    if q.dtype != torch.bfloat16:
        return kernels.paged_decode(q.contiguous(), k_cache, v_cache, tables, lengths, scale)
    blocks, compact_tables = _step_blocks(batch, tables)
    k, v = k_cache.index_select(0, blocks).float(), v_cache.index_select(0, blocks).float()
    return kernels.paged_decode(q.float(), k, v, compact_tables, lengths, scale).to(q.dtype)


def uses_row_kernel(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether the compiled paged kernel (float32, float64 or bfloat16 on the CPU, once built) takes the step."""
    return (q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64, torch.bfloat16)
            and k_cache.is_contiguous() and v_cache.is_contiguous() and kernels.paged_decode_available())


def _row_tables(batch, device):
    """Every row as a decode: its request's block table and its own length, position + 1."""
    if "batch_invariant_rows" not in batch._plan:
        width = max(len(t) for t in batch.block_tables)
        tables, lengths = [], []
        for table, n, cached in zip(batch.block_tables, batch.query_lens, batch.cached_lens):
            padded = list(table) + [0] * (width - len(table))
            tables += [padded] * n
            lengths += range(cached + 1, cached + n + 1)
        batch._plan["batch_invariant_rows"] = (torch.tensor(tables, dtype=torch.long, device=device),
                                               torch.tensor(lengths, dtype=torch.long, device=device))
    return batch._plan["batch_invariant_rows"]


def _step_blocks(batch, tables: torch.Tensor):
    """The blocks the step reads (sorted) and the row tables renumbered into them."""
    if "batch_invariant_blocks" not in batch._plan:
        blocks, compact = torch.unique(tables, return_inverse=True)
        batch._plan["batch_invariant_blocks"] = (blocks, compact)
    return batch._plan["batch_invariant_blocks"]


def tiled_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch,
                    query_tile: int | None = None, key_tile: int | None = None) -> torch.Tensor:
    """paged_attention in torch operations, for any dtype and device: key tiles
    at absolute positions, query tiles of QUERY_TILE positions, one fixed-shape
    GEMM per (query tile, key tile) pair, sums in a fixed tree. Computed in
    float32 (float64 for float64), rounded once to q's dtype."""
    query_tile, key_tile = query_tile or QUERY_TILE, key_tile or KEY_TILE
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    plan = _step_plan(batch, num_kv_heads, q.device, query_tile, key_tile)
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    num_tiles, rows, num_pairs = plan["num_tiles"], query_tile * group, plan["pair_tile"].shape[0]
    # Query tiles [NQ, Hkv, QT * G, D]: row r is position r // G, head r % G (as in the Triton kernel).
    tiles = q.index_select(0, plan["gather_rows"]).to(compute).mul_(1.0 / math.sqrt(head_dim))
    tiles = tiles.view(num_tiles, query_tile, num_kv_heads, group, head_dim).transpose(1, 2)
    tiles = tiles.reshape(num_tiles, num_kv_heads, rows, head_dim)
    # One (query tile, key tile) pair per GEMM of fixed shape [M, D] x [D, KT], M = QT * G.
    pairs_q = tiles.index_select(0, plan["pair_tile"]).view(-1, rows, head_dim)        # [P * Hkv, M, D]
    k = k_cache.reshape(-1, head_dim).index_select(0, plan["cache_rows"]).to(compute)  # [P * Hkv * KT, D]
    v = v_cache.reshape(-1, head_dim).index_select(0, plan["cache_rows"]).to(compute)
    k, v = k.view(-1, key_tile, head_dim), v.view(-1, key_tile, head_dim)             # [P * Hkv, KT, D]
    scores = torch.bmm(pairs_q, k.transpose(1, 2))                                     # [P * Hkv, M, KT]
    scores = scores.view(num_pairs, num_kv_heads, query_tile, group, key_tile)
    if len(plan["masked_pairs"]):           # pairs that hold keys after a row's position (or past the end)
        masked = scores.index_select(0, plan["masked_pairs"]).masked_fill_(plan["mask"], -math.inf)
        scores.index_copy_(0, plan["masked_pairs"], masked)
    # Each row's maximum over all its keys (a max is exact in any order), then
    # the weights exp(score - max): no rescaling between tiles is needed.
    row_max = _tree_reduce(scores.amax(-1), plan["tree"], torch.maximum)               # [NQ, Hkv, QT, G]
    row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)                      # padding rows
    weights = scores.sub_(row_max.index_select(0, plan["pair_tile"])[..., None]).exp_()
    sums = _tree_reduce(weights.sum(-1), plan["tree"], torch.add)                      # [NQ, Hkv, QT, G]
    values = torch.bmm(weights.view(-1, rows, key_tile), v).view(num_pairs, num_kv_heads, rows, head_dim)
    values = _tree_reduce(values, plan["tree"], torch.add)                             # [NQ, Hkv, M, D]
    out = values.view(num_tiles, num_kv_heads, query_tile, group, head_dim) / sums[..., None]
    out = out.transpose(1, 2).reshape(num_tiles * query_tile, num_heads, head_dim)[plan["valid"]]
    result = torch.empty_like(q)
    result[plan["out_rows"]] = out.to(q.dtype)
    return result
