# %% [markdown] slideshow={"slide_type": "slide"}
# # Chapter 9: The mixed step on a GPU
#
# **The question.** Every step of a chunked-prefill server packs prefill chunks and
# decodes together (chapters 4 and 6). On a CPU the engine splits a chunk's attention in
# two (chapter 1: an unmasked rectangle over the cached prefix, a causal square over the
# chunk, merged by log-sum-exp) and sends decodes to a paged kernel. How does a GPU run
# the whole mixed step, and why do vLLM, FlashInfer and POD-Attention each do it
# differently?
#
# **What you build.** The engine's `backend="triton"`: ONE Triton kernel launch per layer
# for a whole packed step (prefill chunks, decodes, prefix-cached prompts), reading the
# paged KV cache through the block tables, with grouped-query heads, an online softmax in
# float32, no mask on the tiles before the diagonal, a mask on the diagonal tiles, and no
# work at all past the diagonal. You run it here, on a laptop, in Triton's interpreter,
# and check it against the reference backend and the engine's greedy tokens. Then you
# count what a decode costs inside such a kernel: one query row in a tile built for many.

# %% slideshow={"slide_type": "skip"}
# Import the kernel's module before anything else that might import triton: it turns on
# triton's interpreter (TRITON_INTERPRET=1) when there is no CUDA device, and that only
# works before triton is imported (section 4).
from minillm.kernels import triton_attention as ta

import matplotlib.pyplot as plt
import torch

import minillm
from minillm import LLMEngine, SamplingParams, SchedulerConfig
from minillm.attention import (AttentionBatch, causal_mask, chunk_attention, paged_attention,
                               reference_attention, write_kv)
from minillm.book.show import show_source
from minillm.kv_cache import BlockManager
from minillm.sim.accounting import step_cost
from minillm.sim.hardware import get_hardware

torch.manual_seed(0)
RUN_KERNEL = ta.triton_available()
if RUN_KERNEL:
    print("triton", ta.triton.__version__, "-", "interpreted on CPU tensors" if ta.INTERPRETED else "compiled for CUDA")
else:
    print("The kernel's cells are skipped here:", ta.TRITON_IMPORT_ERROR)
DEVICE = "cpu" if ta.INTERPRETED or not RUN_KERNEL else "cuda"

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. From chapter 1's split to the GPU's tiles
#
# A GPU kernel is launched as a **grid of programs** (Triton's word; CUDA says thread
# blocks). Each program runs on one streaming multiprocessor, whose on-chip memory
# (registers and shared memory, together called SRAM here) is tiny next to the GPU's main
# memory (HBM) but far faster. A flash-attention kernel therefore gives each program a
# **tile**: a block of query rows that it loads once into SRAM, then streams the keys and
# values past it, one **key tile** at a time, never writing the scores out to HBM.
#
# Chapter 1's split is the coarse version of this. Cut the keys of a chunk into tiles and
# each tile is one of three kinds, seen from a tile of query rows at positions
# $[p_0, p_1]$:
#
# * the tile ends at or before $p_0$: every row sees every key, **no mask** (the cached
#   prefix, and the chunk's own early keys for its later rows);
# * the tile starts after $p_1$: no row sees any key, **skip it** (never loaded);
# * otherwise it **crosses the diagonal**: mask `key <= query`.
#
# Here is a chunk of 96 tokens over 40 cached ones, with query tiles of 32 rows and key
# tiles of 16 (one cache block each):

# %% slideshow={"slide_type": "subslide"}
cached, n, rows_per_tile, block_size = 40, 96, 32, 16
num_key_tiles = -(-(cached + n) // block_size)
kinds = torch.zeros(-(-n // rows_per_tile), num_key_tiles)          # 0 skip, 1 masked, 2 unmasked
for t, first_row in enumerate(range(0, n, rows_per_tile)):
    unmasked, total = ta.key_tiles(cached, first_row, min(rows_per_tile, n - first_row), block_size)
    kinds[t, :unmasked], kinds[t, unmasked:total] = 2, 1
fig, ax = plt.subplots(figsize=(7, 2.4))
ax.imshow(kinds, cmap="Blues", vmin=0, vmax=2.3, aspect="auto")
ax.axvline(cached / block_size - 0.5, color="C3", label="end of the cached prefix")
for (t, j), kind in zip(((t, j) for t in range(kinds.shape[0]) for j in range(num_key_tiles)), kinds.flatten()):
    ax.text(j, t, ["skip", "mask", ""][int(kind)], ha="center", va="center", fontsize=7)
ax.set(xlabel=f"key tile ({block_size} keys = one cache block)", ylabel=f"query tile ({rows_per_tile} rows)",
       title="Only tiles on the diagonal need a mask; tiles past it are never loaded",
       xticks=range(num_key_tiles), yticks=range(kinds.shape[0]))
ax.legend(loc="lower left", fontsize=7)
plt.show()
counts = {name: int((kinds == k).sum()) for k, name in [(2, "unmasked"), (1, "masked"), (0, "skipped")]}
print(counts)
assert counts == {"unmasked": 12, "masked": 9, "skipped": 6}

# %% [markdown]
# Of the 27 (query tile, key tile) pairs, 12 need no mask, 9 cross the diagonal and 6 are
# skipped. Chapter 1's split drew one line, at the end of the cached prefix; tiles draw a
# staircase along the diagonal, so the chunk's early keys need no mask either for its
# later query tiles. Only the staircase (a query tile's rows span 32 positions: three key
# tiles of 16) pays for a mask.
#
# ## 2. Online softmax, tile by tile
#
# A program cannot see a row's scores all at once, so it keeps three running values per
# row: the largest score so far `m`, the sum `l` of `exp(score - m)`, and the weighted sum
# `acc` of values. When a tile raises the maximum, what was summed under the old maximum is
# rescaled by `alpha = exp(m_old - m_new)`. That is chapter 1's `merge_attention`, applied
# to one key tile at a time. Ten lines of torch for one program:

# %%
def one_program(q_rows, query_pos, k, v, block_size):
    """q_rows [R, D] at absolute positions query_pos [R]; k, v [L, D] -> out [R, D]."""
    m = torch.full((len(q_rows),), float("-inf"), dtype=q_rows.dtype)
    l = torch.zeros(len(q_rows), dtype=q_rows.dtype)
    acc = torch.zeros_like(q_rows)
    for start in range(0, int(query_pos.max()) + 1, block_size):           # later tiles: skipped
        key_pos = torch.arange(start, min(start + block_size, len(k)))
        scores = q_rows @ k[key_pos].T / q_rows.shape[-1] ** 0.5
        if key_pos[-1] > query_pos.min():                                    # the diagonal
            scores = scores.masked_fill(key_pos[None, :] > query_pos[:, None], float("-inf"))
        m_new = torch.maximum(m, scores.max(dim=1).values)
        alpha, p = torch.exp(m - m_new), torch.exp(scores - m_new[:, None])
        l, acc, m = l * alpha + p.sum(dim=1), acc * alpha[:, None] + p @ v[key_pos], m_new
    return acc / l[:, None]


q, k, v = torch.randn(96, 64, dtype=torch.float64), torch.randn(136, 64, dtype=torch.float64), torch.randn(136, 64, dtype=torch.float64)
tiled = torch.cat([one_program(q[r:r + 32], torch.arange(40 + r, 40 + min(r + 32, 96)), k, v, 16)
                   for r in range(0, 96, 32)])
exact = reference_attention(q[:, None], k[:, None], v[:, None])[:, 0]
print(f"tiled online softmax vs one softmax, float64: max error {(tiled - exact).abs().max():.1e}")
assert torch.allclose(tiled, exact, atol=1e-12, rtol=0)

# %% [markdown]
# The tiles are visited in order, starting from tile 0, which holds key 0: every row sees
# it, so `m` is finite after the first tile and no `exp(-inf - (-inf))` (a NaN) can occur.
#
# ## 3. The engine's kernel
#
# The engine's kernel is this loop in Triton, with the three things a real step adds:
#
# * **Paging.** A key tile is one cache block: the program reads the request's block
#   table to find it (`tl.load(table + j)`), exactly as chapter 3's `gather_kv` does, but
#   without copying anything.
# * **Grouped-query attention.** The `G` query heads that share a KV head are folded into
#   the tile's rows: row `r` is query position `r // G` of head `r % G`. One K/V tile
#   loaded from memory serves all `G` heads. The grid is (query tiles, KV heads).
# * **A whole step in one launch.** Host code lists the step's query tiles (request,
#   first row); a decode is a request with one row, so it gets one tile like any chunk.

# %% slideshow={"slide_type": "subslide"}
show_source(ta._attention_tile_program)

# %% [markdown]
# The tile arithmetic (which tiles are unmasked, which are skipped) is two integer
# divisions; `key_tiles` is the same arithmetic in Python, and a test checks it against the
# mask itself:

# %%
show_source(ta.key_tiles)

# %% [markdown]
# Let us run it on a hand-built mixed step: a prefill of 37 tokens, a decode over 47 cached
# tokens, a chunk of 21 tokens that starts mid-block (13 cached), and a prompt whose first
# two blocks come from the prefix cache; 8 query heads share 2 KV heads, head_dim 64, and
# the requests' blocks are scattered through the pool. On this machine the launch runs in
# the interpreter (its programs one after another, in numpy).

# %%
def mixed_step(query_lens, cached_lens, block_size=16, num_heads=8, num_kv_heads=2, head_dim=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in zip(cached_lens, query_lens)]
    manager = BlockManager(sum(-(-s // block_size) for s in seq_lens) + 1, block_size)
    for size in range(block_size, max(seq_lens) + block_size, block_size):      # round-robin: scattered blocks
        for b, seq_len in enumerate(seq_lens):
            manager.allocate(b, min(size, seq_len))
    shape = (manager.num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    q = torch.randn(sum(query_lens), num_heads, head_dim, generator=g)
    slots = [s for b, (n, c) in enumerate(zip(query_lens, cached_lens)) for s in manager.slot_mapping(b, c, c + n)]
    batch = AttentionBatch(query_lens, cached_lens, [manager.block_tables[b] for b in range(len(seq_lens))],
                           block_size, torch.tensor(slots))
    return q, k_cache, v_cache, batch


query_lens, cached_lens = [37, 1, 21, 5], [0, 47, 13, 32]
q, k_cache, v_cache, batch = mixed_step(query_lens, cached_lens)
k_new = k_cache.view(-1, 2, 64)[batch.slot_mapping]          # the step's own K and V, already in their slots
v_new = v_cache.view(-1, 2, 64)[batch.slot_mapping]
expected = paged_attention(q, k_new, v_new, k_cache.clone(), v_cache.clone(), batch, backend="reference")
requests, first_rows = ta.plan_tiles(query_lens, group=4, block_m=ta.BLOCK_M_CPU)
print(f"one launch: grid = ({len(requests)} query tiles, 2 KV heads); tiles (request, first row):",
      list(zip(requests, first_rows)))
if RUN_KERNEL:
    out = ta.triton_paged_attention(q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), batch).cpu()
    error = (out - expected).abs().max().item()
    print(f"triton kernel vs reference backend, float32: max |error| = {error:.1e}")
    assert error < 1e-5

# %% [markdown]
# The kernel agrees with the reference backend to rounding (the printed error is ~1e-6:
# float32's unit roundoff, 6e-8, times the sums of 64 products and the exps of both
# computations, each rounded its own way; the tests hold it to 1e-5 over GQA ratios
# 1 to 8, head_dim 32 to 128, blocks of 16 and 32, decode-only, prefill-only and mixed
# steps). Note the plan: the decode (request 1) is one tile of its own.
#
# ## 4. Running a GPU kernel on a laptop, and its traps
#
# Triton's interpreter runs a kernel on CPU tensors with numpy, program by program. Three
# traps, each handled in `kernels/triton_attention.py` and tested:
#
# 1. **`TRITON_INTERPRET=1` must be set before triton is imported.** Triton's own helpers
#    (`tl.zeros`, `tl.max`, `tl.sum`) are `@triton.jit` functions, decorated once when
#    `triton.language` is imported, for the interpreter or for the compiler. Set the
#    variable later and the interpreted kernel dies at its first call of one of them with
#    "Cannot call @triton.jit'd outside of the scope of a kernel". So the engine's module sets it itself, before its
#    `import triton`, on a machine without a CUDA device; the chapter's first cell imports
#    that module first. One process runs the kernel either interpreted or compiled.

# %%
if RUN_KERNEL:
    print("tl.max is a", type(ta.tl.max).__name__, "in this process")
    assert (type(ta.tl.max).__name__ == "InterpretedFunction") == ta.INTERPRETED

# %% [markdown]
# 2. **`tl.dot` on bfloat16 is wrong in the interpreter** (triton issue #11584: it stores
#    bfloat16 as 16-bit integers and multiplies those bits: results near 1e10 for inputs
#    near 1). The kernel casts its operands to float32 in the interpreter
#    (`DOT_IN_FLOAT32`); on a GPU, 16-bit operands go to the tensor cores as they are,
#    with a float32 accumulator. A small kernel shows the bug:

# %%
if RUN_KERNEL and ta.INTERPRETED:
    @ta.triton.jit
    def dot_16x16(a_ptr, b_ptr, c_ptr, CAST: ta.tl.constexpr):
        idx = ta.tl.arange(0, 16)
        a = ta.tl.load(a_ptr + idx[:, None] * 16 + idx[None, :])
        b = ta.tl.load(b_ptr + idx[:, None] * 16 + idx[None, :])
        if CAST:
            a, b = a.to(ta.tl.float32), b.to(ta.tl.float32)
        ta.tl.store(c_ptr + idx[:, None] * 16 + idx[None, :], ta.tl.dot(a, b))

    a, b = torch.randn(16, 16).bfloat16(), torch.randn(16, 16).bfloat16()
    for cast in (False, True):
        c = torch.zeros(16, 16)
        dot_16x16[(1,)](a, b, c, CAST=cast)
        print(f"bfloat16 tl.dot, operands cast to float32: {cast!s:5}  max |error| = "
              f"{(c - a.float() @ b.float()).abs().max():.3g}")
    assert (c - a.float() @ b.float()).abs().max() < 1e-4

# %% [markdown]
# 3. **The interpreter does not check bounds.** A load past the end of a tensor reads
#    whatever lies there, with no error. So every load in the kernel is masked (`mask=`,
#    `other=0`), and a test fills every byte the kernel must not read with NaN (unused
#    blocks, slots past each request's end, rows past the step) to make a missing mask
#    show up; a second test removes one mask from a copy of the kernel and checks that the
#    first test would catch it. Here is the trap itself: a tensor of 10 numbers, a view of
#    a bigger buffer filled with NaN past them, read 16 at a time:

# %%
if RUN_KERNEL and ta.INTERPRETED:
    @ta.triton.jit
    def copy_16(src_ptr, dst_ptr, n, MASKED: ta.tl.constexpr):
        idx = ta.tl.arange(0, 16)
        if MASKED:
            x = ta.tl.load(src_ptr + idx, mask=idx < n, other=0.0)
        else:
            x = ta.tl.load(src_ptr + idx)
        ta.tl.store(dst_ptr + idx, x)

    buffer = torch.full((32,), float("nan"))
    buffer[:10] = torch.arange(10.0)
    for masked in (False, True):
        dst = torch.zeros(16)
        copy_16[(1,)](buffer[:10], dst, 10, MASKED=masked)
        print(f"masked={masked!s:5}: {dst.tolist()[8:]}  (elements 8-15)")
    assert not dst.isnan().any()

# %% [markdown]
# Unmasked, elements 10-15 came from past the end (NaN here; on another day, anything),
# and no error was raised. On a GPU such a load may fault, or may not.
#
# A fourth point is about GPUs only: a float32 `tl.dot` on an NVIDIA GPU rounds its
# operands to **TF32** (10 mantissa bits, ~1e-3 relative) unless asked for
# `input_precision="ieee"`. The engine's kernel asks for "ieee" with float32 operands, so
# the same 1e-5 tolerance holds in the interpreter and on a GPU (`make gpu-check` runs the
# tests there); a float32 model that wants speed over exactness would pass "tf32".
#
# ## 5. The engine with `backend="triton"`
#
# `LLMEngine(model, sched, backend="triton")` sends every layer's attention through the
# kernel: one launch per layer per step (a test counts them). Greedy tokens on the `tiny`
# model equal the reference backend's, with chunks that start mid-block, decodes running
# alongside a chunk, and a shared prefix served from the prefix cache (the tests also
# check SmolLM2-135M):

# %%
model = minillm.build_model("tiny", seed=0, dtype=torch.float32, device=DEVICE)
system = torch.randint(0, 512, (35,), generator=torch.Generator().manual_seed(1)).tolist()
prompts = [system + [7, 8, 9], [5, 6, 7, 8, 9], system + [1, 2]]


def greedy(backend):
    engine = LLMEngine(model, SchedulerConfig(policy="chunked", chunk_size=24, max_num_seqs=4), block_size=16,
                       num_blocks=16, backend=backend, enable_prefix_caching=True)
    outs = engine.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    return [o.output_token_ids for o in outs], engine


reference_tokens, engine = greedy("reference")
print("steps (request, new tokens):", [step.scheduled for step in engine.trace][:4], "...")
if RUN_KERNEL:
    triton_tokens, _ = greedy("triton")
    print("reference:", reference_tokens)
    print("triton:   ", triton_tokens)
    assert triton_tokens == reference_tokens

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6. A decode is one query row in a tile built for many
#
# The plan of section 3 gave the decode a tile of its own. How full is it? With `G` query
# heads per KV head a decode fills `G` rows; the tile has `BLOCK_M`. The engine uses 64 rows
# on a GPU; vLLM's unified kernel uses `BLOCK_M = 16` when `G <= 16`
# (`vllm/v1/attention/ops/triton_unified_attention.py`, `unified_attention`, vLLM main at
# commit 0013943, read in 2026). For Llama-3-8B (32 query heads, 8 KV heads: `G = 4`):

# %%
cfg = minillm.ModelConfig.preset("llama-3-8b")
group = cfg.num_heads // cfg.num_kv_heads
for block_m in (16, 64):
    print(f"BLOCK_M = {block_m:2d}: a decode fills {group} of {block_m} rows ({group / block_m:.0%});"
          f" a chunk of 512 tokens fills {512 * group} of {-(-512 * group // block_m) * block_m}")
assert group == 4

# %% [markdown]
# The tile is loaded from HBM whole; a decode uses a sixteenth or a quarter of the
# multiply-adds the tensor cores run on it. Worse, a decode's work is all memory traffic:
# its one row reads the request's whole cached K and V and does little with each byte.
# Chapter 5's accounting gives the FLOPs and bytes of attention (scores and values) for
# one request; their ratio is the **arithmetic intensity** (FLOPs per byte), and a GPU is
# memory-bound below its ridge point, peak FLOP/s over bandwidth:

# %% slideshow={"slide_type": "subslide"}
h100 = get_hardware("H100-SXM")
ridge = h100.peak_flops_s / h100.mem_bandwidth_bytes_s


def attention_intensity(num_new, num_cached):
    by_op = step_cost(cfg, [(num_new, num_cached)], dtype_bytes=2).by_op
    flops = by_op["attn_scores"][0] + by_op["attn_values"][0]
    return flops / (by_op["attn_scores"][1] + by_op["attn_values"][1])


shapes = {"decode (1 over 4096)": (1, 4096), "chunk of 64 over 4096": (64, 4096),
          "chunk of 512 over 4096": (512, 4096), "chunk of 2048 over 0": (2048, 0)}
intensity = {name: attention_intensity(*shape) for name, shape in shapes.items()}
decode_intensity = intensity["decode (1 over 4096)"]
fig, ax = plt.subplots(figsize=(6.5, 3))
ax.bar([name.replace(" over", "\nover") for name in intensity], list(intensity.values()),
       color=["C3", "C1", "C0", "C0"])
ax.axhline(ridge, color="k", ls="--", label=f"H100 ridge point: {ridge:.0f} FLOP/byte")
ax.set(yscale="log", ylabel="attention FLOPs per byte (bf16)",
       title="A decode's attention is memory-bound; a long chunk's is compute-bound")
ax.legend(fontsize=8)
plt.show()
print(f"H100-SXM ridge point: {ridge:.0f} FLOP/byte; the decode is x{ridge / decode_intensity:.0f} below it")
for name, value in intensity.items():
    print(f"{name:24s} {value:7.1f} FLOP/byte")
assert decode_intensity < 10 < ridge < intensity["chunk of 512 over 4096"]

# %% [markdown]
# A decode's attention does about 4 FLOPs per byte (`2 x G / bytes per element`: each K
# and V element read serves `G` heads), some 75 times below the H100's ridge point
# (`H100-SXM` profile: 989 TFLOP/s bf16, 3.35 TB/s, from NVIDIA's datasheet). A 64-token
# chunk over the same 4096 cached tokens is already near the ridge, and a 512-token chunk
# well above it: each K and V element read serves 512 rows. In a mixed step the
# decodes' attention waits on memory while the chunks' attention waits on the tensor
# cores, in the same launch.
#
# ## 7. What the engines do about it
#
# * **vLLM, one unified Triton kernel** (`vllm/v1/attention/ops/triton_unified_attention.py`,
#   commit 0013943): one launch for the whole mixed batch, grid (query tiles, KV heads),
#   GQA heads folded into the tile's rows as here. Each program finds its sequence by a
#   binary search over the cumulative query lengths (`find_seq_idx`) instead of a host-made
#   list (no host work per step, which CUDA graphs want), applies one mask
#   `key_pos <= context_len + query_pos` to every tile and stops its loop at the last
#   tile a row can see (`compute_tile_loop_bounds`). When every request of the batch is a
#   decode (and there are few), it switches to a "3D" grid that also splits each sequence's
#   keys into segments, merged by a second kernel (`reduce_segments`): more programs for a
#   batch too small to fill the GPU.
# * **vLLM with flash-attn** (`vllm/v1/attention/backends/flash_attn.py`, commit 0084b78):
#   its default CUDA backend also makes one call per layer for the whole mixed batch, a
#   `flash_attn_varlen_func` with the cumulative query lengths (`cu_seqlens_q`), each
#   sequence's length (`seqused_k`), the block table and `causal=True`, writing into the
#   layer's output in place (`out=`); `num_splits` lets flash-attn split long keys across
#   programs, as the unified kernel's 3D grid does. `make gpu-check` times the engine's
#   `flash` backend, the same varlen call, against this chapter's kernel.
# * **vLLM's older `prefix_prefill.py`** (`vllm/v1/attention/ops/prefix_prefill.py`, commit
#   0420dfc, adapted from LightLLM): two loops per program, the cached context through the
#   block table with no causal mask, then the new tokens against themselves with it; with
#   `SKIP_DECODE` a program whose request brings a single token returns at once, leaving
#   decodes to another kernel.
# * **FlashInfer** keeps decode and prefill apart: `BatchDecodeWithPagedKVCacheWrapper`
#   and `BatchPrefillWithPagedKVCacheWrapper` (its API reference, docs.flashinfer.ai,
#   `flashinfer.decode` and `flashinfer.prefill`, read in 2026).
#   vLLM's FlashInfer backend (`vllm/v1/attention/backends/flashinfer.py`, commit 00a817a)
#   puts decodes at the front of the batch and prefills at the back and runs the prefill
#   wrapper on one part and the decode wrapper on the other: two launches per layer for a
#   mixed step, each specialized for its shape.
# * **POD-Attention** (Kamath et al., ASPLOS'25) computes the prefill and the decode
#   attention of a hybrid batch in one kernel that places both kinds of work on the same
#   multiprocessors at once, so the memory-bound decodes and the compute-bound prefill use
#   bandwidth and tensor cores together: attention up to 59% faster (mean 28%) than
#   independently optimized prefill and decode kernels (the ASPLOS abstract; the first
#   arXiv version, 2410.18038v1, said up to 75%).
#
# The engine's kernel is the unified design, made readable; nothing in this chapter
# measures a GPU. `make gpu-check` times it on a CUDA machine against flash-attn's varlen
# kernel and the sdpa split path, per layer of Llama-3-8B, and writes the numbers to
# `gpu-results/triton-bench.txt`.
#
# ## Takeaways
#
# * A GPU attention kernel is chapter 1's split at tile grain: key tiles before a query
#   tile's first row need no mask, tiles across the diagonal need `key <= query`, tiles
#   past it are never loaded.
# * The online softmax (running max, sum and rescaled accumulator) is the log-sum-exp merge
#   applied tile by tile, in float32.
# * One launch serves a whole packed step: a decode is one query row (`G` rows with GQA) in
#   a tile of 16 to 64, and its attention is memory-bound (~4 FLOP/byte) while a long
#   chunk's is compute-bound.
# * vLLM runs one unified kernel; FlashInfer two specialized ones; POD-Attention runs both
#   kinds side by side on the same multiprocessors.
# * Triton's interpreter runs the kernel on a laptop: set `TRITON_INTERPRET=1` before
#   importing triton, cast bfloat16 before `tl.dot`, mask every load.
#
# **Exercises:** `exercises/09_the_mixed_step_on_a_gpu.ipynb`: the online-softmax update of
# one tile, the tiles a whole step visits, and the arithmetic intensity of a request's
# attention.
