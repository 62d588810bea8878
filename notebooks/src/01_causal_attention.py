# %% [markdown]
# # Chapter 1: Causal attention, from scratch to the engine
#
# **The question.** When a chunk of a prompt arrives and the tokens before it are
# already in the cache, exactly which keys does each of its queries attend to, and
# how can attention be computed in pieces without changing the result?
#
# By the end you will have
# - written causal attention in a few lines and checked it against the engine's
#   float64 reference;
# - drawn the mask of a chunk over a cache, and met the trap that hides in PyTorch's
#   `is_causal=True` (and its fix);
# - merged two partial attentions with their log-sum-exp, the trick behind
#   FlashAttention and split-KV decoding;
# - seen why the engine's `sdpa` backend never builds a chunk's mask at all: the rectangle splits into
#   a block with no mask and a square where `is_causal` is exact, merged by log-sum-exp;
# - run the engine's packed, paged attention with two backends and seen them agree.

# %% slideshow={"slide_type": "skip"}
import math
import statistics
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import minillm
from minillm.attention import (AttentionBatch, causal_block_attention, causal_mask, chunk_attention,
                               merge_attention, paged_attention, reference_attention, sdpa_attention,
                               split_decodes, write_kv)
from minillm.kv_cache import BlockManager
from minillm.book.show import show_source

torch.manual_seed(0)
device = minillm.default_device()
print("device for the built-in model:", device, "| float64 experiments: cpu")


def random_qkv(n, m, num_heads=4, num_kv_heads=4, head_dim=16, dtype=torch.float64, seed=0):
    """q [n, Hq, D], k and v [m, Hkv, D]: the engine's layout, tokens first."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, num_heads, head_dim, generator=g, dtype=dtype),
            torch.randn(m, num_kv_heads, head_dim, generator=g, dtype=dtype),
            torch.randn(m, num_kv_heads, head_dim, generator=g, dtype=dtype))

# %% [markdown]
# ## 1. Attention in ten lines
#
# Token $i$ has a query $q_i$, a key $k_i$ and a value $v_i$ (one vector per head). Its
# output is a weighted average of the values of the tokens it may see, the weights a
# softmax of scaled dot products ($D$ is the head dimension):
# $$o_i = \sum_{j \le i} \frac{e^{s_{ij}}}{\sum_{j' \le i} e^{s_{ij'}}}\, v_j, \qquad s_{ij} = \frac{q_i \cdot k_j}{\sqrt{D}}.$$
# *Causal* means $j \le i$: a token never sees the future. Here it is for one head,
# straight from the formula:

# %% slideshow={"slide_type": "subslide"}
def attention_one_head(q, k, v):
    """q, k, v: [T, D] for one head of one sequence -> [T, D]."""
    T, D = q.shape
    scores = q @ k.T / math.sqrt(D)                          # [T, T]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)      # j > i
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v                 # [T, D]


q, k, v = random_qkv(6, 6)
mine = torch.stack([attention_one_head(q[:, h], k[:, h], v[:, h]) for h in range(4)], dim=1)
engine = reference_attention(q, k, v)
print("max |mine - engine| =", (mine - engine).abs().max().item())
assert torch.allclose(mine, engine, atol=1e-13, rtol=0)

# %% [markdown]
# The engine's yardstick, `reference_attention`, is the same computation for all heads
# at once. It works in any dtype (float64 included), handles grouped-query attention
# (next chapter) and can also return each row's log-sum-exp, which section 4 needs:

# %% slideshow={"slide_type": "subslide"}
show_source(reference_attention)

# %% [markdown]
# ## 2. The mask of a chunk over a cache
#
# In a full prefill, the queries and keys are the same $T$ tokens and the mask is the
# familiar lower triangle. In a *chunk*, the queries are only the new tokens, at
# positions $[s, s + n)$, while the keys are all $s + n$ tokens: the cached prefix plus
# the chunk. Query $i$ of the chunk sits at position $s + i$ and must see keys
# $0 \dots s + i$. The mask is a rectangle whose diagonal ends in the **bottom-right**
# corner:

# %% slideshow={"slide_type": "subslide"}
show_source(causal_mask)

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
fig, axes = plt.subplots(1, 3, figsize=(10, 2.8))
panels = [(causal_mask(8, 8), "full prefill: 8 queries, 8 keys"),
          (causal_mask(3, 8), "chunk of 3 over 5 cached: bottom-right"),
          (causal_mask(3, 8, align="top_left"), "same chunk, top-left: WRONG")]
for ax, (mask, title) in zip(axes, panels):
    ax.imshow(mask, cmap="Blues", vmin=0, vmax=1.4)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("key position")
    ax.set_ylabel("query row")
fig.suptitle("A chunk's queries see their whole cached prefix only if the mask is aligned bottom-right")
plt.tight_layout()
plt.show()

# %% [markdown]
# A top-left mask would let the first query of the chunk see only key 0, as if the
# chunk were the start of the prompt. For a square mask (a full prefill) both
# alignments coincide, which is why the mistake goes unnoticed until chunking starts.
#
# ## 3. The trap: `is_causal=True` aligns top-left
#
# PyTorch's fused `F.scaled_dot_product_attention(q, k, v, is_causal=True)` builds its
# causal mask **top-left** when the number of queries differs from the number of keys
# (its documentation shows the mask as `torch.ones(L, S).tril(diagonal=0)`).
# FlashAttention 2.1 and later align bottom-right instead (flash-attn's README, changelog
# entry "2.1: Change behavior of causal flag"). Let us take a 12-token sequence, run a
# full causal attention as ground truth, and compute the last 4 rows as
# a chunk over the 8 cached keys:

# %% slideshow={"slide_type": "subslide"}
T, start = 12, 8
q, k, v = random_qkv(T, T, seed=1)
truth = reference_attention(q, k, v)[start:]             # rows of the full prefill
to_heads = lambda x: x.transpose(0, 1)[None]             # [T, H, D] -> [1, H, T, D]
from_heads = lambda x: x[0].transpose(0, 1)              # and back

wrong = from_heads(F.scaled_dot_product_attention(to_heads(q[start:]), to_heads(k), to_heads(v),
                                                  is_causal=True))
print("is_causal=True on a chunk: max error", (wrong - truth).abs().max().item())
assert not torch.allclose(wrong, truth, atol=1e-3)       # the trap is real

# %% [markdown]
# Badly wrong, and silently so: no error, the shapes are right. One of the source
# articles sums chunked prefill up as "the attention kernel need not be rewritten"; this
# cell is why that is only half true. The math does not change, but the attention call
# must be told where a chunk sits: a kernel or a call that assumes a square causal mask
# (top-left, or no cached prefix at all) computes the wrong rows as soon as queries and
# keys differ in number. Engines handle it in the kernel's interface: FlashAttention's
# varlen kernels take each request's query and key lengths (`cu_seqlens_q`,
# `cu_seqlens_k`, chapter 6) and align the mask bottom-right; this book's backends split
# the chunk's keys (section 5) or pass a bottom-right mask. The fix with PyTorch's fused
# kernel is to pass a bottom-right mask, either explicitly or with
# `torch.nn.attention.bias.causal_lower_right`:

# %% slideshow={"slide_type": "fragment"}
from torch.nn.attention.bias import causal_lower_right

fixed = from_heads(F.scaled_dot_product_attention(
    to_heads(q[start:]), to_heads(k), to_heads(v), attn_mask=causal_lower_right(T - start, T)))
explicit = from_heads(F.scaled_dot_product_attention(
    to_heads(q[start:]), to_heads(k), to_heads(v), attn_mask=causal_mask(T - start, T)))
print("causal_lower_right: max error", (fixed - truth).abs().max().item())
print("explicit mask:      max error", (explicit - truth).abs().max().item())
assert torch.allclose(fixed, truth, atol=1e-12) and torch.allclose(explicit, truth, atol=1e-12)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The experiment above already shows the property chunked prefill rests on: the chunk's
# attention, computed from its own queries and the cached keys, is the corresponding
# rows of the full prefill's attention: equal in exact arithmetic, and here to float64
# rounding (printed above). Chapter 4 builds the whole proof on this.
#
# ## 4. Attention in pieces: the log-sum-exp merge
#
# A chunk attends to two sets of keys: the cached prefix (all visible, no mask) and
# itself (causal). Could we attend to each set separately and combine? The softmax over
# the union is not the average of the two softmaxes, but it is a weighted average with
# known weights. If part A's row has log-sum-exp $\ell_A = \log \sum_{j \in A} e^{s_j}$
# and output $o_A$ (normalised over A), and likewise for B, then
# $$\ell = \log(e^{\ell_A} + e^{\ell_B}), \qquad o = e^{\ell_A - \ell}\, o_A + e^{\ell_B - \ell}\, o_B.$$
# This is the *online softmax* step that lets FlashAttention stream over blocks of keys
# and lets split-KV decoding spread one long cache over many GPU cores.

# %% slideshow={"slide_type": "subslide"}
show_source(merge_attention)

# %% slideshow={"slide_type": "subslide"}
cached = start                                            # keys [0, 8) are the cache
out_cache, lse_cache = reference_attention(q[start:], k[:cached], v[:cached], causal=False, return_lse=True)
out_chunk, lse_chunk = reference_attention(q[start:], k[cached:], v[cached:], causal=True, return_lse=True)
merged, _ = merge_attention(out_cache, lse_cache, out_chunk, lse_chunk)
print("merge(cache part, chunk part) vs full prefill rows: max error", (merged - truth).abs().max().item())
assert torch.allclose(merged, truth, atol=1e-12, rtol=0)

# %% [markdown]
# Merging is associative, so the keys can be cut into any number of pieces. Could the
# error pile up as the pieces get smaller and the merges more numerous? The experiment
# below merges 512 keys in 1 to 512 blocks. Each merge adds one rounding, so the error
# may creep up slowly; the question is whether it ever leaves the rounding level of
# its dtype (unit roundoff: about 1e-16 in float64, 6e-8 in float32).

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
q_long, k_long, v_long = random_qkv(4, 512, seed=2)
whole = reference_attention(q_long, k_long, v_long, causal=False)


def merged_in_pieces(num_pieces, dtype):
    out = lse = None
    for keys in torch.arange(512).chunk(num_pieces):
        o, l = reference_attention(q_long.to(dtype), k_long[keys].to(dtype), v_long[keys].to(dtype),
                                   causal=False, return_lse=True)
        out, lse = (o, l) if out is None else merge_attention(out, lse, o, l)
    return (out.double() - whole).abs().max().item()


pieces = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
errors = {dtype: [merged_in_pieces(p, dtype) for p in pieces] for dtype in (torch.float64, torch.float32)}
fig, ax = plt.subplots(figsize=(6, 3.2))
for dtype, errs in errors.items():
    ax.loglog(pieces, [max(e, 1e-17) for e in errs], "o-", label=str(dtype).replace("torch.", ""))
ax.set_xlabel("number of key blocks merged (512 keys in all)")
ax.set_ylabel("max |error| vs one softmax")
ax.set_title("Merging partial attentions is exact up to rounding, for any number of blocks")
ax.legend()
plt.show()
for dtype, errs in errors.items():
    print(f"{str(dtype).replace('torch.', ''):8s} max error over all block counts: {max(errs):.1e}")
assert max(errors[torch.float64]) < 1e-13 and max(errors[torch.float32]) < 1e-5

# %% [markdown]
# Even after 511 merges both errors stay at the rounding level of their dtype, a small
# multiple of its unit roundoff (the maxima are printed under the figure), many orders of
# magnitude below the error of a real bug such as the top-left mask of section 3.
#
# ## 5. The split: why the engine never builds a chunk's mask
#
# Look again at the bottom-right mask of a chunk of $n$ tokens over $c$ cached ones
# (section 2). It is two blocks: a $c$-wide rectangle of all ones (every query of the
# chunk sees every cached key) and an $n \times n$ lower triangle (the chunk against
# itself). The first block needs no mask at all. The second is **square**, and on a
# square `is_causal=True` is exact, since top-left and bottom-right coincide. Section 4's
# merge glues the two together. Serving engines do the same: vLLM's `merge_attn_states`
# (`vllm/v1/attention/ops/merge_attn_states.py`) merges "partial attention outputs from
# prefix (KV cache) and suffix (new tokens)" by their log-sum-exp, and FlashInfer's
# `flashinfer.cascade.merge_state` merges two KV segments the same way. It is what the
# engine's `sdpa` backend does:

# %%
fig, ax = plt.subplots(figsize=(5, 2.4))
n_chunk, n_cached = 4, 8
blocks_split = torch.zeros(n_chunk, n_cached + n_chunk)
blocks_split[:, :n_cached] = 1                                   # prefix: all ones
blocks_split[:, n_cached:] = 2 * causal_mask(n_chunk, n_chunk)   # the chunk: a triangle
ax.imshow(blocks_split, cmap="Blues", vmin=0, vmax=2.4)
ax.axvline(n_cached - 0.5, color="C3")
ax.set(xlabel="key position", ylabel="query row",
       title="A chunk's mask = a block with no mask + a square causal block")
plt.show()
assert torch.equal(blocks_split > 0, causal_mask(n_chunk, n_cached + n_chunk))

# %%
show_source(chunk_attention)

# %% [markdown]
# `unmasked_attention` folds the query heads that share a KV head into the query rows
# (without a mask, which row is which does not matter), so grouped-query attention
# copies no keys. `causal_block_attention` calls the kernel with `is_causal=True`, with
# grouped-query heads too: torch >= 2.5 shares KV heads itself (`enable_gqa`), and where
# the kernel must also return the log-sum-exp the block's $n$ keys are copied per query
# head. A test (`tests/test_attention.py`) records every kernel call of the backend to
# check that `is_causal` only ever meets a square block and that no prefill chunk gets a
# mask. The split agrees with the reference in float64:

# %%
show_source(causal_block_attention)

# %%
q, k, v = random_qkv(5, 13, num_heads=8, num_kv_heads=2, seed=4)
split = chunk_attention(q, k[8:], v[8:], k[:8], v[:8])
print("split vs reference, float64: max error", (split - reference_attention(q, k, v)).abs().max().item())
assert torch.allclose(split, reference_attention(q, k, v), atol=1e-12, rtol=0)
assert torch.equal(split, sdpa_attention(q, k, v))       # sdpa_attention is this split

# %% [markdown]
# Is it worth it? A mask tensor has to be built and then read for every score, and a
# kernel given a mask cannot skip the masked scores (here the 256 x 255 / 2 above the
# chunk's diagonal, 6% of all). Here is one chunk
# of 256 tokens over 1792 cached ones (8 query heads sharing 2 KV heads, float32),
# computed the plain way (one call with an explicit bottom-right mask) and split:

# %%
# NBVAL_IGNORE_OUTPUT
q, k, v = random_qkv(256, 2048, num_heads=8, num_kv_heads=2, head_dim=64, dtype=torch.float32, seed=5)
mask = causal_mask(256, 2048)


def explicit_mask():
    return F.scaled_dot_product_attention(to_heads(q), to_heads(k), to_heads(v), attn_mask=mask,
                                          enable_gqa=True)


def split_in_two():
    return chunk_attention(q, k[1792:], v[1792:], k[:1792], v[:1792])


def median_ms(fns, repeats=7):
    """Median time of each function, timed in turns so that load hits all alike."""
    times = [[] for _ in fns]
    for _ in range(repeats + 1):
        for fn, fn_times in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            fn_times.append(time.perf_counter() - t0)
    return [1e3 * statistics.median(t[1:]) for t in times]       # the first turn warms up


explicit_ms, split_ms = median_ms([explicit_mask, split_in_two])
print(f"explicit mask: {explicit_ms:.1f} ms   split (no mask + is_causal + merge): {split_ms:.1f} ms"
      f"   -> the split takes x{split_ms / explicit_ms:.2f} the time")
assert torch.allclose(from_heads(explicit_mask()), split_in_two(), atol=1e-5)

# %% [markdown]
# Same result. On one call the kernel does about the same arithmetic either way, so
# which of the two wins, and by how much, depends on the machine and its load: read
# the ratio printed above, and rerun the cell to see it move. What the split removes is
# everything around the kernel: no `[n, c + n]` mask to build per layer and request, no
# copy of the cache to line the keys up with it (section 6), and `is_causal` skips the
# masked half of the small square. In a chunked prefill the last chunks attend over the
# longest caches, where those costs used to grow; `python -m minillm bench chunk-cost`
# measures whole chunked prefills against one full prefill.
#
# ## 6. The engine's attention: packed and paged
#
# In the engine, one step packs the new tokens of many requests into one tensor: a
# prefill of 6 tokens, a chunk of 3 tokens over 5 cached ones, and two decodes of one
# token each. Their keys and values live in a paged cache (chapter 3): fixed-size
# blocks, found through each request's block table. `paged_attention` writes the new K
# and V into their slots, then attends for every request to its own prefix plus its
# new tokens:

# %% slideshow={"slide_type": "subslide"}
show_source(paged_attention)

# %% [markdown]
# Let us build such a step by hand, in float64 on the CPU, with grouped-query heads
# (8 query heads sharing 2 KV heads), and compare each backend with
# `reference_attention` on each request's contiguous keys. (`allocate` reserves a
# request's blocks, `slot_mapping` lists the pool row of each of its tokens, and
# `write_kv` stores K and V there; chapter 3 builds all three.)

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
query_lens, cached_lens = [6, 3, 1, 1], [0, 5, 9, 14]
block_size, num_heads, num_kv_heads, head_dim = 4, 8, 2, 16
blocks = BlockManager(num_blocks=16, block_size=block_size)
shape = (blocks.num_blocks, block_size, num_kv_heads, head_dim)

g = torch.Generator().manual_seed(3)
sequences, q_new, k_new, v_new, slots = [], [], [], [], []
k_cache, v_cache = torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64)
for r, (n, c) in enumerate(zip(query_lens, cached_lens)):
    blocks.allocate(r, c + n)
    q_r, k_r, v_r = random_qkv(n, c + n, num_heads, num_kv_heads, head_dim, seed=10 + r)
    write_kv(k_cache, v_cache, k_r[:c], v_r[:c], torch.tensor(blocks.slot_mapping(r, 0, c), dtype=torch.long))
    sequences.append((q_r, k_r, v_r))
    q_new.append(q_r), k_new.append(k_r[c:]), v_new.append(v_r[c:])
    slots += blocks.slot_mapping(r, c, c + n)

batch = AttentionBatch(query_lens=query_lens, cached_lens=cached_lens,
                       block_tables=[blocks.block_tables[r] for r in range(4)],
                       block_size=block_size, slot_mapping=torch.tensor(slots))
expected = torch.cat([reference_attention(*s) for s in sequences])      # [T, Hq, D]
for backend in ["reference", "sdpa"]:
    out = paged_attention(torch.cat(q_new), torch.cat(k_new), torch.cat(v_new),
                          k_cache.clone(), v_cache.clone(), batch, backend=backend)
    err = (out - expected).abs().max().item()
    print(f"{backend:>9}: packed step of {batch.num_tokens} tokens, max error {err:.1e}")
    assert err < 1e-12

# %% [markdown]
# Both backends agree with the reference to float64 rounding. In the `sdpa` backend a
# prefill chunk takes its own keys straight from the step and reads its cached prefix
# from the pool without a copy when its blocks are consecutive (one view of the pool,
# taken once per step for all layers); a prefix scattered over many blocks is gathered
# into one tensor, once per layer.
#
# Decodes take one of two paths. Torch's fused kernels want a request's keys in one
# tensor, so without help a decode's blocks are first gathered (copied) out of the pool,
# every layer of every step. A **paged kernel** skips the copy: it reads each block
# where it lies, through the block table, as vLLM's kernels do (its CPU backend has
# one: `cpu_attention_with_kv_cache` in `csrc/cpu/cpu_attn.cpp` since vLLM's PR #27954,
# `paged_attention_v1_impl` in `csrc/cpu/attention.cpp` before) and flash-attn's
# `block_table` does. The engine ships a small one for the CPU,
# `minillm/kernels/paged_decode.cpp`, compiled once by `make` (`python -m minillm.kernels
# build`, a C++ compiler needed); where it is built, CPU decodes in float32 or float64
# go to it, and the step above used it if this machine has it:

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
from minillm import kernels
from minillm.attention import uses_paged_decode_kernel

print("decodes on this machine:", "the paged kernel" if uses_paged_decode_kernel(torch.cat(q_new))
      else "gathered, then torch's fused kernel")

# %% [markdown]
# Its heart is two passes over the request's blocks, front to back: every score, a
# softmax per head, then the probability-weighted sum of the values. One token's keys
# for all KV heads are one contiguous row of the pool, so each byte is read once and
# nothing is copied. The passes take 16 tokens (or one block) at a time; the helpers
# they call, higher up in the file, hold that group's running sums in registers, which
# took the kernel from 17-23 to 24-48 GB/s of cache read on the reference machine
# (`docs/chunk-cost.md`):

# %% slideshow={"slide_type": "subslide"}
source = kernels.SOURCE.read_text()
print(source[source.index("      // Pass 1"):source.index("      T* ob = out")])

# %% [markdown]
# Without the kernel (no compiler, a bf16 model, or a GPU, where flash-attn's paged mode
# is the equivalent), decodes go in buckets of up to 8 of similar length, one call per
# bucket, their caches gathered and padded to the longest. Where padding would read
# more keys than another call costs, the bucket is cut (`split_decodes`: one decode over
# 2,100 tokens does not drag four over 200 up to its length). The padding mask of each
# bucket is planned once per step, and a bucket whose requests have one length needs
# none. The cut, for four short decodes and one long one:

# %% slideshow={"slide_type": "fragment"}
lengths = [200, 200, 200, 200, 2100]
for name, spans in [("one bucket", [(0, len(lengths))]), ("split_decodes", split_decodes(lengths))]:
    keys_read = sum((stop - start) * max(lengths[start:stop]) for start, stop in spans)
    print(f"{name:>13}: buckets {spans}, keys read per layer {keys_read:,}")
assert split_decodes(lengths) == [(0, 4), (4, 5)]

# %% [markdown]
# A third backend, `flash`, calls flash-attn's varlen kernel
# straight on the paged cache. It exists only on CUDA machines with the `flash-attn`
# package, computes in float16 or bfloat16 only, and its paged mode needs blocks of a
# multiple of 256 tokens. Our step breaks all three rules (CPU, float64, 4-token blocks),
# so the engine refuses it with a clear error rather than computing garbage:

# %% slideshow={"slide_type": "skip"}
try:
    paged_attention(torch.cat(q_new), torch.cat(k_new), torch.cat(v_new),
                    k_cache.clone(), v_cache.clone(), batch, backend="flash")
except ValueError as e:
    print("ValueError:", e)
else:
    raise AssertionError("backend='flash' should have been refused here")

# %% [markdown]
# ## Takeaways
#
# - Causal attention is a softmax over the keys at or before each query's **absolute
#   position**; a chunk over a cache therefore needs a rectangular mask aligned
#   **bottom-right**.
# - `F.scaled_dot_product_attention(is_causal=True)` aligns top-left when the query and
#   key lengths differ: silently wrong for a chunk. Use an explicit mask or
#   `torch.nn.attention.bias.causal_lower_right`.
# - Attention over a union of key sets is a log-sum-exp-weighted merge of the parts:
#   exact, in any number of pieces.
# - So a chunk needs no mask tensor: no mask over its cached prefix, `is_causal` over the
#   square of the chunk against itself (where it is exact), and one merge.
# - The engine's `reference` and `sdpa` backends agree on packed, paged steps mixing
#   prefills, chunks and decodes.
#
# **Exercises:** `exercises/01_causal_attention.ipynb`: the bottom-right mask and
# grouped-query attention from memory; then a sliding window's mask (the engine has none),
# a repair of this chapter's merge for rows that see nothing of a part (a window or a
# split-KV cut makes them), a merge of any number of parts, and the share of scores an
# explicit mask throws away over a chunked prefill, predicted before the engine counts it.
#
# **Next:** chapter 2 puts this attention inside a Llama-style model, with RoPE and
# grouped-query heads, and matches a real checkpoint against `transformers`.
