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
# paged KV cache through the block tables 16, 32 or 64 keys at a time whatever the block
# size, with grouped-query heads, an online softmax in float32, no mask on the tiles
# before the diagonal, a mask on the diagonal tiles, and no work at all past the
# diagonal. You run it here, on a laptop, in Triton's interpreter, and check it against
# the reference backend and the engine's greedy tokens. Then you price a program's
# on-chip memory for each tile size against an A100's and an H100's, count what a decode
# costs inside such a kernel (one query row in a tile built for many), and split a few
# long decodes across the GPU's multiprocessors (split-KV), merging the pieces by
# log-sum-exp.

# %% slideshow={"slide_type": "skip"}
# Import the kernel's module before anything else that might import triton: it turns on
# triton's interpreter (TRITON_INTERPRET=1) when there is no CUDA device, and that only
# works before triton is imported (section 5).
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
from minillm.sim.profiles import PROFILES

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
# tiles of 16 keys (where the keys' cache blocks lie does not matter yet: section 3):

# %% slideshow={"slide_type": "subslide"}
cached, n, rows_per_tile, tile_n = 40, 96, 32, 16
num_key_tiles = -(-(cached + n) // tile_n)
kinds = torch.zeros(-(-n // rows_per_tile), num_key_tiles)          # 0 skip, 1 masked, 2 unmasked
for t, first_row in enumerate(range(0, n, rows_per_tile)):
    unmasked, total = ta.key_tiles(cached, first_row, min(rows_per_tile, n - first_row), tile_n)
    kinds[t, :unmasked], kinds[t, unmasked:total] = 2, 1
fig, ax = plt.subplots(figsize=(7, 2.4))
ax.imshow(kinds, cmap="Blues", vmin=0, vmax=2.3, aspect="auto")
ax.axvline(cached / tile_n - 0.5, color="C3", label="end of the cached prefix")
for (t, j), kind in zip(((t, j) for t in range(kinds.shape[0]) for j in range(num_key_tiles)), kinds.flatten()):
    ax.text(j, t, ["skip", "mask", ""][int(kind)], ha="center", va="center", fontsize=7)
ax.set(xlabel=f"key tile ({tile_n} keys)", ylabel=f"query tile ({rows_per_tile} rows)",
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
def one_program(q_rows, query_pos, k, v, tile_n):
    """q_rows [R, D] at absolute positions query_pos [R]; k, v [L, D] -> out [R, D]."""
    m = torch.full((len(q_rows),), float("-inf"), dtype=q_rows.dtype)
    l = torch.zeros(len(q_rows), dtype=q_rows.dtype)
    acc = torch.zeros_like(q_rows)
    for start in range(0, int(query_pos.max()) + 1, tile_n):               # later tiles: skipped
        key_pos = torch.arange(start, min(start + tile_n, len(k)))
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
# * **Paging.** A key tile is `TILE_N` keys (16, 32 or 64), whatever the cache's block
#   size: the program looks up each key's block in the request's block table
#   (`tl.load(table + key_pos // BLOCK_SIZE)`) and its slot in that block
#   (`key_pos % BLOCK_SIZE`), exactly as chapter 3's `gather_kv` does, but without
#   copying anything. A tile may hold several small blocks, part of a big one, or
#   straddle two (blocks of 48 read 32 keys at a time); section 4 says why the tile must
#   not grow with the block.
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
# the interpreter (its programs one after another, in numpy). The same step runs three
# times: blocks of 16 read 32 keys a tile, blocks of 48 (not a power of two) read 32 keys
# a tile, and blocks of 256 (flash-attn's) read 16.

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


def reference_of(q, k_cache, v_cache, batch):
    """The reference backend on the same step (the step's own K and V are already in their slots)."""
    flat = lambda cache: cache.view(-1, *cache.shape[2:])[batch.slot_mapping]   # noqa: E731
    return paged_attention(q, flat(k_cache), flat(v_cache), k_cache.clone(), v_cache.clone(), batch,
                           backend="reference")


query_lens, cached_lens = [37, 1, 21, 5], [0, 47, 13, 32]
requests, first_rows = ta.plan_tiles(query_lens, group=4, block_m=ta.BLOCK_M_CPU)
print(f"one launch: grid = ({len(requests)} query tiles, 2 KV heads); tiles (request, first row):",
      list(zip(requests, first_rows)))
for block_size, tile_n in [(16, 32), (48, 32), (256, 16)]:
    q, k_cache, v_cache, batch = mixed_step(query_lens, cached_lens, block_size=block_size)
    expected = reference_of(q, k_cache, v_cache, batch)
    if RUN_KERNEL:
        out = ta.triton_paged_attention(q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), batch,
                                        tile_n=tile_n).cpu()
        error = (out - expected).abs().max().item()
        print(f"blocks of {block_size:3d}, key tiles of {tile_n}: triton vs reference backend, float32: "
              f"max |error| = {error:.1e}")
        assert error < 1e-5

# %% [markdown]
# The kernel agrees with the reference backend to rounding whatever the block size (the
# printed errors are ~1e-6: float32's unit roundoff, 6e-8, times the sums of 64 products
# and the exps of both computations, each rounded its own way; the tests hold it to 1e-5
# over GQA ratios 1 to 8, head_dim 24, 64 and 128, blocks of 8, 16, 48, 128 and 256,
# chunks starting mid-block and mid-tile, decode-only, prefill-only and mixed steps).
# Note the plan: the decode (request 1) is one tile of its own.
#
# ## 4. How big a key tile? A program's on-chip budget
#
# The first version of this kernel read one cache block per iteration: its key tile was
# the block size. At block size 256, which flash-attn's paged KV needs, that is a
# `[64, 256]` float32 score tile per program, and K and V tiles of 256 keys. Where does
# that leave a program on a real GPU? A model of what a Triton program holds (Triton
# places the tiles itself; this is the budget, not a measurement):
#
# * **shared memory**: the Q tile (`BLOCK_M x D`, loaded once), and the K and V tiles
#   (`TILE_N x D` each), of which Triton's software pipelining keeps `num_stages` in
#   flight: 3 by default on NVIDIA GPUs (Triton 3.9, `triton/backends/nvidia/compiler.py`,
#   `CUDAOptions.num_stages = 3`; `num_warps = 4`, i.e. 128 threads);
# * **registers**: the float32 accumulator (`BLOCK_M x D`) and score tile
#   (`BLOCK_M x TILE_N`), shared by the program's 128 threads.
#
# The limits, from NVIDIA's tuning guides: an A100 (compute capability 8.0) has 164 KB of
# shared memory per SM, at most 163 KB for one thread block ("Tuning CUDA Applications for
# NVIDIA Ampere GPU Architecture"); an H100 (9.0) 228 KB per SM, at most 227 KB per block
# ("... Hopper GPU Architecture"); both have 64K 32-bit registers per SM and at most 255
# registers per thread. For Llama-3-8B's heads (bf16, head_dim 128), `BLOCK_M = 64`:

# %% slideshow={"slide_type": "subslide"}
KIB = 1024
GPU_LIMITS = {"A100": dict(shared_per_sm=164 * KIB, shared_per_block=163 * KIB),
              "H100": dict(shared_per_sm=228 * KIB, shared_per_block=227 * KIB)}
REGISTERS_PER_SM, MAX_REGISTERS_PER_THREAD, THREADS = 65536, 255, 4 * 32   # num_warps = 4
NUM_STAGES = 3


def program_budget(block_m, tile_n, head_dim=128, element_bytes=2, num_stages=NUM_STAGES):
    """(shared memory bytes, float32 registers per thread) of one program, as modelled above."""
    shared = block_m * head_dim * element_bytes + num_stages * 2 * tile_n * head_dim * element_bytes
    registers = (block_m * head_dim + block_m * tile_n) // THREADS       # acc and scores, 4 bytes each
    return shared, registers


def programs_per_sm(block_m, tile_n, gpu):
    shared, registers = program_budget(block_m, tile_n)
    limits = GPU_LIMITS[gpu]
    if shared > limits["shared_per_block"] or registers > MAX_REGISTERS_PER_THREAD:
        return 0                                  # does not fit: no launch, or registers spill to memory
    return min(limits["shared_per_sm"] // shared, REGISTERS_PER_SM // (registers * THREADS))


print(f"{'TILE_N':>6} {'shared KiB':>10} {'regs/thread':>11} {'programs/SM A100':>17} {'H100':>5}")
budget = {}
for tile_n in (16, 32, 64, 128, 256):
    shared, registers = program_budget(64, tile_n)
    budget[tile_n] = (shared, registers, programs_per_sm(64, tile_n, "A100"), programs_per_sm(64, tile_n, "H100"))
    print(f"{tile_n:>6} {shared / KIB:>10.0f} {registers:>11} {budget[tile_n][2]:>17} {budget[tile_n][3]:>5}")
assert budget[256][0] > GPU_LIMITS["H100"]["shared_per_block"]          # tied to a 256-block: does not fit
assert budget[32][3] >= 3 and budget[16][3] >= 5

# %% [markdown]
# A key tile tied to a 256-slot block needs 400 KiB of shared memory: more than an H100
# gives one block (227 KB), and its accumulator and scores alone take 192 of a thread's
# 255 registers before any address or loop variable. At 16 or 32 keys the program needs
# 40-64 KiB and 72-80 registers a thread, so an H100 SM holds 3 to 5 programs at once: while
# one waits for its K and V tiles from HBM, another computes. Hence the engine's kernel
# keeps `TILE_N` (default 32) apart from the block size.
#
# What does a smaller tile cost? Each iteration rescales the accumulator once
# (`acc * alpha`, `BLOCK_M x D` multiplies) against `2 x BLOCK_M x TILE_N x D` multiply-adds
# for the two dots: 3% extra at 16 keys, 1.6% at 32. And it buys precision in skipping: a
# query tile's last key tile is loaded whole, so a finer tile wastes fewer keys past the
# diagonal and past the sequence's end.
#
# **vLLM picks 16 or 32.** Its unified kernel (`vllm/v1/attention/ops/triton_unified_attention.py`,
# `_get_tile_size`, vLLM main at commit 0013943, read in 2026) uses `TILE_SIZE = 32` for
# prefill (and for Gemma 3's shapes) and, for decode, 16 when a query element is 2 bytes
# or more and 32 when it is one byte (fp8); it looks up each key's block from the block
# table (`seq_offset // BLOCK_SIZE`) just as here, so the tile is free of the block size
# (its Triton backend takes any multiple of 16: `get_supported_kernel_block_sizes` in
# `vllm/v1/attention/backends/triton_attn.py`, commit 001ceb3). Its code does not say why
# 16 or 32; the budget above is one reason (its programs carry a 16-row Q tile,
# `BLOCK_M = 16` when `G <= 16`, and many of them must be resident to keep HBM busy).
#
# ## 5. Running a GPU kernel on a laptop, and its traps
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
# ## 6. The engine with `backend="triton"`
#
# `LLMEngine(model, sched, backend="triton")` sends every layer's attention through the
# kernel: one launch per layer per step (a test counts them). It is opt-in: the default
# on a GPU is flash-attn where it imports (16-bit dtypes, blocks of 256) and torch's sdpa
# otherwise, until `make gpu-check` has passed on a GPU (README, GPU notes). Greedy tokens on the `tiny`
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
# ## 7. A decode is one query row in a tile built for many
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
# The padding rows cost no memory traffic: the Q load is masked (`mask=row_valid`), so
# only the decode's `G` rows are read from HBM, and its K and V tiles are read once for
# all of them. What the padding wastes is arithmetic and on-chip space: `tl.dot` runs on
# all `BLOCK_M` rows, so a decode uses a sixteenth (or a quarter, at `BLOCK_M = 16`) of
# the multiply-adds the tensor cores run for it, and the accumulator holds `BLOCK_M x D`
# floats in registers for `G` useful rows. Worse, a decode's work is all memory traffic:
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
# ## 8. Too few programs: split-KV
#
# A step of a few long decodes has a different problem: not wasted rows, too few
# programs. Each decode is one query tile, so the grid is (decodes x KV heads): 4 decodes
# of Llama-3-8B (8 KV heads) make 32 programs, each walking 4096 keys alone, on an H100 of
# 132 SMs. **FlashDecoding** (Tri Dao, Daniel Haziza, Francisco Massa and Grigory Sizov,
# "Flash-Decoding for long-context inference", October 2023) splits each sequence's keys
# into chunks, attends to each chunk in parallel (writing one log-sum-exp per row and
# chunk besides the partial output), then reduces: chapter 1's merge, across programs.
#
# The engine does the same. The grid gains a third axis, the segment; a program walks
# only its segment's key tiles and writes its unnormalised `(m, l, acc)` to scratch; a
# second kernel merges each row's segments. The rule (`plan_segments`): split only a
# decode-only step whose programs are fewer than the GPU's SMs, into
# `ceil(SMs / programs)` segments, so the grid covers every SM once, but no more segments
# than the longest sequence has 256-key stretches (a judgement, not a measurement: a
# shorter segment would spend more on the merge than it saves; `make gpu-check` times
# split-KV on and off) and at most 64:

# %%
show_source(ta.plan_segments)

# %% slideshow={"slide_type": "subslide"}
num_sms = PROFILES["H100-SXM"].num_sms
llama_kv_heads = minillm.ModelConfig.preset("llama-3-8b").num_kv_heads


def programs(query_lens, cached_lens, block_m=ta.BLOCK_M_GPU, group=4, num_kv_heads=llama_kv_heads, **split):
    """(programs without a split, programs with the rule's split, segments) of one step on an H100."""
    query_tiles = len(ta.plan_tiles(query_lens, group, block_m)[0])
    before = query_tiles * num_kv_heads
    segments, _ = ta.plan_segments(query_lens, cached_lens, num_kv_heads, ta.TILE_N_DEFAULT,
                                   num_programs=before, num_sms=num_sms, **split)
    return before, before * segments, segments


steps = {"4 decodes over 4096": ([1] * 4, [4095] * 4), "8 decodes over 4096": ([1] * 8, [4095] * 8),
         "16 decodes over 1024": ([1] * 16, [1023] * 16), "64 decodes over 4096": ([1] * 64, [4095] * 64),
         "a 512-chunk + 32 decodes": ([512] + [1] * 32, [4096] + [2000] * 32)}
counts = {name: programs(*step) for name, step in steps.items()}
fig, ax = plt.subplots(figsize=(7, 2.8))
x = torch.arange(len(counts)).float()
ax.bar(x - 0.2, [c[0] for c in counts.values()], 0.4, label="one program per (query tile, KV head)")
ax.bar(x + 0.2, [c[1] for c in counts.values()], 0.4, label="with split-KV (the rule)")
ax.axhline(num_sms, color="k", ls="--", label=f"H100 SXM: {num_sms} SMs")
ax.set(xticks=x.tolist(), xticklabels=[n.replace(" over", "\nover").replace(" + ", "\n+ ") for n in counts],
       yscale="log", ylabel="programs in the grid", title="Split-KV fills the SMs a few long decodes leave idle")
ax.tick_params(axis="x", labelsize=7)
ax.legend(fontsize=7)
plt.show()
for name, (before, after, segments) in counts.items():
    print(f"{name:26s} {before:4d} programs ({before / num_sms:4.0%} of the SMs) -> {after:4d} "
          f"({segments} segment{'s' if segments > 1 else ''})")
merge_programs = 4 * minillm.ModelConfig.preset("llama-3-8b").num_heads          # 4 rows x 32 query heads
print(f"the merge of the 4 decodes' segments: a second launch of {merge_programs} programs")
assert counts["4 decodes over 4096"] == (32, 160, 5)
assert counts["64 decodes over 4096"][2] == 1 and counts["a 512-chunk + 32 decodes"][2] == 1

# %% [markdown]
# Four decodes fill a quarter of the H100's SMs; split into 5 segments they make 160
# programs, more than one per SM. (A grid a little over the SM count leaves a partial
# second wave; on a GPU, where several programs fit an SM at once (section 4), the 160
# programs are resident together.) The merge is a second launch of `rows x heads`
# programs (the 128 printed above), each reading its row's 5 partial states: cheap next to 4096 keys.
# Sixty-four decodes already give 512 programs, and a step with a chunk has its chunk's
# query tiles: neither splits. The merge, one program per (row, query head):

# %%
show_source(ta._merge_segments_program)

# %% [markdown]
# A segment that holds no key of its row (a short sequence's last segments; on a chunk's
# diagonal, rows before the segment's keys) keeps `m = -inf` and `l = 0`: its weight
# `exp(m - M)` is 0, and the tile loop guards `exp(-inf - (-inf))` by subtracting 0 for a
# row that has seen no key. Here are two decodes over 700 and 520 tokens (4 programs, as
# many KV heads; the rule picks 2 segments), and one with a segment size fixed at 64
# tokens, whose segments end mid-block (blocks of 48) and whose short sequence leaves
# segments empty:

# %%
for label, (cached, block_size, split) in {"the rule": ([699, 519], 16, {}),
                                          "kv_split_size=64": ([699, 30], 48, dict(kv_split_size=64))}.items():
    q, k_cache, v_cache, batch = mixed_step([1, 1], cached, block_size=block_size, num_heads=4)
    segments, per_segment = ta.plan_segments([1, 1], cached, 2, ta.TILE_N_DEFAULT, num_programs=4,
                                             num_sms=ta.INTERPRETER_NUM_SMS, **split)
    line = f"{label:17s}: {segments} segments of {per_segment} key tiles (of {ta.TILE_N_DEFAULT} keys) per request"
    if RUN_KERNEL:
        out = ta.triton_paged_attention(q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), batch, **split).cpu()
        error = (out - reference_of(q, k_cache, v_cache, batch)).abs().max().item()
        line += f"; split and merged vs reference backend: max |error| = {error:.1e}"
        assert error < 1e-5
    print(line)

# %% [markdown]
# `kv_split_size` is for a caller who needs a row's arithmetic to depend on nothing but
# the row: a segment count picked from the step changes with the step's other requests,
# a fixed size in tokens does not (chapter 11's batch invariance; vLLM instead turns its
# split off in batch-invariant mode: `is_batch_invariant` is one of the conditions in
# `unified_attention`'s `use_3d`).
#
# **vLLM's 3D grid.** The same file (commit 0013943) launches `kernel_unified_attention`
# with a 2D grid `(q blocks, KV heads)`, or, when `max_seqlen_q` is 1 and the batch has at
# most `seq_threshold_3D` sequences (and batch invariance is off), a 3D grid
# `(q blocks, KV heads, num_par_softmax_segments)`: each program walks
# `tiles_per_segment = cdiv(seq_len, NUM_SEGMENTS_PER_SEQ * TILE_SIZE)` tiles and stores
# its segment's output, max and sum of exponentials (`segm_output`, `segm_max`,
# `segm_expsum`); `reduce_segments` then rescales each segment by
# `exp(segm_max - overall_max)` and divides by the total, one program per (token, query
# head). The threshold and the segment count are parameters of `unified_attention`,
# chosen by its caller; the engine here picks them from the step and the SM count, by the
# rule above.
#
# ## 9. What the engines do about it
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
# * **FlashInfer** has separate decode and prefill wrappers,
#   `BatchDecodeWithPagedKVCacheWrapper` and `BatchPrefillWithPagedKVCacheWrapper` (its API
#   reference, docs.flashinfer.ai, `flashinfer.decode` and `flashinfer.prefill`, read in
#   2026), and vLLM's FlashInfer backend (`vllm/v1/attention/backends/flashinfer.py`,
#   commit 00a817a) puts decodes at the front of the batch and prefills at the back and
#   runs the prefill wrapper on one part and the decode wrapper on the other: two launches
#   per layer for a mixed step, each specialized for its shape. FlashInfer also ships
#   `PODWithPagedKVCacheWrapper` and `BatchPODWithPagedKVCacheWrapper` (`flashinfer.pod`:
#   "POD (Prefill-On-Decode) attention executes a single-request prefill kernel and a
#   batch-decode kernel concurrently in one launch", docs.flashinfer.ai/api/pod.html, read
#   in 2026; `flashinfer/pod.py` at commit 00216e8 cites POD-Attention, arXiv 2410.18038):
#   prefill and decode in one launch, each part with its own kernel.
# * **POD-Attention** (Kamath et al., ASPLOS'25) computes the prefill and the decode
#   attention of a hybrid batch in one kernel that places both kinds of work on the same
#   multiprocessors at once, so the memory-bound decodes and the compute-bound prefill use
#   bandwidth and tensor cores together: attention up to 59% faster (mean 28%) than
#   independently optimized prefill and decode kernels (the ASPLOS abstract; the first
#   arXiv version, 2410.18038v1, said up to 75%).
#
# The engine's kernel is the unified design, made readable; nothing in this chapter
# measures a GPU. `make gpu-check` times it on a CUDA machine against flash-attn's varlen
# kernel and the sdpa split path, per layer of Llama-3-8B, with each key tile (16, 32, 64)
# and with split-KV off, and writes the numbers to `gpu-results/triton-bench.txt`; its
# dry run (`bash tools/gpu_check.sh --dry-run DIR`) takes the same stages on a CPU and is
# part of the test suite.
#
# ## Takeaways
#
# * A GPU attention kernel is chapter 1's split at tile grain: key tiles before a query
#   tile's first row need no mask, tiles across the diagonal need `key <= query`, tiles
#   past it are never loaded.
# * The key tile is a budget choice, not the block size: 16 or 32 keys keep a program's
#   K, V and score tiles small enough for several programs per SM; each key's block comes
#   from the block table.
# * The online softmax (running max, sum and rescaled accumulator) is the log-sum-exp merge
#   applied tile by tile, in float32; split-KV applies the same merge across programs,
#   when a few long decodes would leave most SMs idle.
# * One launch serves a whole packed step: a decode is one query row (`G` rows with GQA) in
#   a tile of 16 to 64 (its padding costs multiply-adds and registers, not HBM reads), and
#   its attention is memory-bound (~4 FLOP/byte) while a long chunk's is compute-bound.
# * vLLM runs one unified kernel (3D for few decodes); FlashInfer specialized ones, and POD
#   wrappers that run a prefill and decodes in one launch, after POD-Attention.
# * Triton's interpreter runs the kernel on a laptop: set `TRITON_INTERPRET=1` before
#   importing triton, cast bfloat16 before `tl.dot`, mask every load.
#
# **Exercises:** `exercises/09_the_mixed_step_on_a_gpu.ipynb`: a tile's mask, a broken
# Triton kernel to repair, the tiles of a sliding-window step, the arithmetic intensity of
# a request's attention, a split-KV merge kernel to write, and a launch to predict before
# the interpreter counts it.
