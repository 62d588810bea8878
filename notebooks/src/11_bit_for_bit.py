# %% [markdown]
# # Chapter 11: Bit for bit
#
# **The question.** Chapter 4 proved that chunked and whole prefill give the same KV in
# exact arithmetic, and measured the float gaps: about $10^{-15}$ in float64, $10^{-7}$
# in float32. A reader who runs an engine meets the consequence of those gaps: at
# temperature 0, the same prompt can give *different text* depending on the chunk size and
# on what else shares its steps. Thinking Machines ("Defeating Nondeterminism in LLM
# Inference", Sep 2025) counted 80 distinct completions in 1,000 greedy runs of one prompt
# on Qwen3-235B, and one with batch-invariant kernels; the companion library's README
# (`thinking-machines-lab/batch_invariant_ops`, commit 2e914eb) reports 18 distinct
# completions in 1,000 of 100 tokens from vLLM, one after their change. Where exactly do
# the bits go, and how do we get every one of them back?
#
# **The answer**, measured here on this machine: (1) the default engine changes the bits
# of a prompt's KV and logits with the chunk size and the thread count, and a decode's bits
# with the neighbours in its step (on this CPU a whole prompt's bits survive its
# neighbours); in bfloat16 that changes most greedy texts; (2) the main sources can be shown
# one at a time: the GEMM's row count, the thread split, the log-sum-exp merge at a chunk's
# boundary, bfloat16 rounding of a partial result, the decode kernel, a vector's tail (one
# more, the prompt's total length, is measured but not yet isolated); RMSNorm and the
# sampler add nothing; (3) `batch_invariant=True` computes every row
# so that nothing about its step can reach it, and then every bit matches.
#
# By the end you will have
# - counted, for a real model, how many KV and logit elements a chunk size or a neighbour
#   changes and by how many ulps, and where greedy texts part;
# - isolated each source with a few lines of torch;
# - run the engine's batch-invariant mode and checked `torch.equal` on everything;
# - mapped it to vLLM's `VLLM_BATCH_INVARIANT=1` and SGLang's
#   `--enable-deterministic-inference`, and to what none of them promises.

# %% slideshow={"slide_type": "skip"}
import json
import statistics
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import minillm
from minillm import batch_invariant, prefill_kv
from minillm.attention import causal_block_attention, chunk_attention, merge_attention, unmasked_attention
from minillm.book import bench_invariant
from minillm.book.bits import bit_difference
from minillm.book.chats import long_document
from minillm.book.show import show_source

torch.manual_seed(0)
THREADS = torch.get_num_threads()
print(f"torch {torch.__version__}, {THREADS} threads")

# %% [markdown]
# ## 1. Measure first: what a chunk or a neighbour does to the bits
#
# One prompt through the default engine (`prefill_kv`, chapter 4's harness), whole and in
# chunks of 16, 64 and 256, alone and with **neighbours**: four other requests' decodes and
# another prompt's 64-token chunk packed into every one of its steps. For each
# configuration we count the KV and logit elements that differ from the whole prefill
# alone, and by how many **ulps** (units in the last place: 1 ulp is the gap to the next
# float of the dtype). `bit_difference` prints the count, the median ulps of the elements
# that differ, and the largest difference in ulps of the tensor's largest value (an
# element near zero has tiny ulps, so its own count can be huge for a small difference).

# %%
NEIGHBOURS = [(1, 300), (1, 120), (1, 40), (1, 700), (64, 0)]   # (new tokens, cached tokens)
CONFIGS = [("chunks of 16", 16, ()), ("chunks of 64", 64, ()), ("chunks of 256", 256, ()),
           ("whole, neighbours", None, NEIGHBOURS), ("chunks of 64, neighbours", 64, NEIGHBOURS)]

smollm2, tok = minillm.pretrained("smollm2-135m-instruct")
smollm2_bf16 = minillm.pretrained("smollm2-135m-instruct", dtype=torch.bfloat16)[0]
tiny = minillm.build_model("tiny", seed=0)
tiny_bf16 = minillm.build_model("tiny", seed=0, dtype=torch.bfloat16)
document = tok.encode(long_document())[:260]                 # the book's README: 260 real tokens
models = {("SmolLM2", "float32"): (smollm2, document), ("SmolLM2", "bfloat16"): (smollm2_bf16, document),
          ("tiny", "float32"): (tiny, document), ("tiny", "bfloat16"): (tiny_bf16, document)}
models = {key: (m, [t % m.cfg.vocab_size for t in ids]) for key, (m, ids) in models.items()}


def measure(model, ids, invariant=False, configs=CONFIGS):
    """{configuration: (KV difference, logits difference)} against the whole prefill alone."""
    kv, logits = prefill_kv(model, ids, batch_invariant=invariant)
    return {name: [bit_difference(*pair) for pair in
                   zip(prefill_kv(model, ids, chunk_size=c, neighbours=n, batch_invariant=invariant), (kv, logits))]
            for name, c, n in configs}


t0 = time.perf_counter()
default_bits = {key: measure(m, ids) for key, (m, ids) in models.items()}
for (name, dtype), rows in default_bits.items():
    print(f"{name} {dtype}:")
    for config, (kv, logits) in rows.items():
        print(f"  {config:26s} KV: {kv}\n  {'':26s} logits: {logits}")
print(f"({time.perf_counter() - t0:.0f} s)")

# %% [markdown]
# Every chunk size changes part of the KV and of the logits (the smaller the chunks, the
# larger the part), most elements by a few ulps: that is chapter 4's rounding, now counted.
# A whole prompt with neighbours, on this CPU and at this thread count, keeps its bits: its
# rows go through GEMMs of hundreds of rows either way (260 alone, 328 with the
# neighbours), which this CPU's library computes alike for the rows they share (small row
# counts are another matter: at 1 thread from 4 rows up they match, section 2.1; at 2
# threads an odd small count does not, section 2.2), and its attention is its own. The
# neighbours' own decodes are another story (section 2.5 and the study below).

# %% slideshow={"slide_type": "skip"}
for key, rows in default_bits.items():
    assert rows["chunks of 16"][0].num_differ > 0 and rows["chunks of 16"][1].num_differ > 0, key
    assert rows["chunks of 64"][1].median_ulps <= 64, key

# %% [markdown]
# ### Greedy text: how often and where it parts
#
# A few ulps in the logits matter only where two tokens nearly tie, but thirty layers
# amplify them and a conversation has many steps. The full study (32 SmolLM2 chats, 128
# greedy tokens each, every configuration, float32 and bfloat16, default engine and the
# mode of section 4) takes about an hour here, so it is a benchmark,
# `python -m minillm bench divergence`, whose results are committed as
# `data/ch11_divergence.json`. This chapter loads them, then re-runs a slice live.
# The reference configuration is "whole, batch of 32": every prompt prefilled whole and all
# 32 chats in every step; each other configuration changes one thing. Tokens after an
# end-of-turn are kept (`ignore_eos`), so every chat has 128 tokens in which to part.

# %%
study = json.loads(bench_invariant.DIVERGENCE_FILE.read_text())
print(f"{study['model']}, {study['num_chats']} chats x {study['max_tokens']} tokens, torch {study['torch']}, "
      f"{study['threads']} threads, {study['date']}")
for run in study["runs"]:
    print(f"{run['dtype']:>8}, batch_invariant={run['batch_invariant']}:")
    for name, c in run["configurations"].items():
        print(f"   {name:38s} texts differ: {c['texts_differ']:2d}/{c['num_texts']}; logprobs of equal "
              f"tokens differ: {c['logprobs_differ']}/{c['logprobs_compared']}")

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
runs = {(r["dtype"], r["batch_invariant"]): r["configurations"] for r in study["runs"]}
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
for ax, dtype in zip(axes, ("bfloat16", "float32")):
    for name, c in runs[dtype, False].items():
        splits = [s for s in c["first_difference"] if s is not None]
        if splits:
            ax.hist(splits, bins=range(0, study["max_tokens"] + 8, 8), histtype="step", linewidth=1.6,
                    label=f"{name} ({len(splits)}/{c['num_texts']})")
    if not ax.patches:
        ax.text(0.5, 0.5, f"no text parts in {study['max_tokens']} tokens", transform=ax.transAxes, ha="center")
    ax.set_title(f"{dtype}, default engine")
    ax.set_xlabel("first output token that differs from the reference")
axes[0].set_ylabel("chats")
axes[0].legend(fontsize=7)
differ16 = runs["bfloat16", False]["chunks of 16, batch of 32"]["texts_differ"]
fig.suptitle(f"bfloat16: chunks of 16 change {differ16} of 32 greedy texts; batch_invariant=True changes none")
plt.tight_layout()
plt.show()

# %% [markdown]
# In bfloat16 most texts part somewhere in their 128 tokens, at any point (the range is
# printed below), and every one of the 8 chats served alone parts from the same chat
# served among 31 others: neighbours change a decode's bits even where they leave a
# prompt's alone. In float32 no text parts here, but a large share of the logprobs of the
# very same tokens differ in their last bits (the table's second column; the range is
# printed below): the differences are there, only below float32's near-ties. With
# `batch_invariant=True` no text and no logprob changes, in either dtype.

# %% slideshow={"slide_type": "skip"}
for (dtype, invariant), configs in runs.items():
    for name, c in configs.items():
        if invariant:
            assert c["texts_differ"] == 0 and c["logprobs_differ"] == 0, (dtype, name)
assert runs["bfloat16", False]["chunks of 16, batch of 32"]["texts_differ"] >= 8
assert sum(c["texts_differ"] for c in runs["bfloat16", False].values()) > \
    sum(c["texts_differ"] for c in runs["float32", False].values())
assert all(c["logprobs_differ"] > 0 for c in runs["float32", False].values())
batch_configs = {name: c for name, c in runs["bfloat16", False].items() if name != bench_invariant.LONE}
texts_parted = [c["texts_differ"] for c in batch_configs.values()]
logprob_shares = [c["logprobs_differ"] / c["logprobs_compared"] for c in runs["float32", False].values()]
lone = runs["bfloat16", False][bench_invariant.LONE]
print(f"bfloat16, default: {min(texts_parted)} to {max(texts_parted)} of 32 texts part in the batch "
      f"configurations, {lone['texts_differ']} of {lone['num_texts']} served alone")
print(f"float32, default: {min(logprob_shares):.0%} to {max(logprob_shares):.0%} of the logprobs of equal tokens differ")
assert min(texts_parted) > 32 // 2 and lone["texts_differ"] == lone["num_texts"]

# %% [markdown]
# **A live slice.** Two chats (1 and 5: of the 8 chats the study served alone, the two that
# part earliest from the batch of 32) served *alone*, 8 tokens, in bfloat16, with the study's thread count: by the default engine with whole
# prefills, and by the mode, whole and in chunks of 16. Alone, a chat meets no neighbour,
# so on the machine that wrote the file the default's tokens must be the study's "whole,
# alone" tokens exactly, and part from the study's batch of 32 where the study says; the
# mode's tokens, whole and chunked, must be the mode's own in the study's batch of 32.
# (The mode's text need not be either of the default's: it computes every row its own
# fixed way, so it agrees with itself, not with them.) "The machine that wrote the file"
# means the same torch, the same CPU as far as the file records it (newer study files
# also record torch's vector level and a hash of the CPU's instruction flags: "AMD EPYC"
# alone names every generation), and the compiled paged kernel built, as it was for the
# study. On another machine the kernels round differently: then only the mode's promise
# is checked, the same tokens whole and chunked.

# %%
# NBVAL_IGNORE_OUTPUT
LIVE_CHATS, LIVE_TOKENS = (1, 5), 8
all_prompts = bench_invariant.chat_prompts(tok, study["num_chats"])
live_prompts = [all_prompts[i] for i in LIVE_CHATS]
live_params = minillm.SamplingParams(max_tokens=LIVE_TOKENS, ignore_eos=True, logprobs=0)
torch.set_num_threads(study["threads"])
t0 = time.perf_counter()
live = {(invariant, chunk): [tokens for tokens, _ in bench_invariant.serve(
            smollm2_bf16, live_prompts, live_params, chunk, 1, batch_invariant=invariant)[0]]
        for invariant, chunk in ((False, 8192), (True, 8192), (True, 16))}
torch.set_num_threads(THREADS)
by_run = {(r["dtype"], r["batch_invariant"]): r for r in study["runs"]}
batch_of_32 = [by_run["bfloat16", False]["reference_tokens"][i][:LIVE_TOKENS] for i in LIVE_CHATS]
mode_batch_of_32 = [by_run["bfloat16", True]["reference_tokens"][i][:LIVE_TOKENS] for i in LIVE_CHATS]
for k, i in enumerate(LIVE_CHATS):
    split = bench_invariant.first_difference(live[False, 8192][k], batch_of_32[k])
    print(f"chat {i}, default engine, alone:  {tok.decode(live[False, 8192][k])!r}\n"
          f"chat {i}, the study's batch of 32: {tok.decode(batch_of_32[k])!r} (they part at token {split})\n"
          f"chat {i}, batch_invariant, alone, whole and in chunks of 16: {tok.decode(live[True, 16][k])!r}\n"
          f"chat {i}, batch_invariant in the study's batch of 32: {tok.decode(mode_batch_of_32[k])!r}")
print(f"({time.perf_counter() - t0:.0f} s)")

# %%
here = {"torch": torch.__version__, **bench_invariant.cpu_identity()}
# Everything the study's file records of its machine: torch, the CPU's name, its vector
# level, a hash of its instruction flags, whether the compiled kernel was built.
recorded = {key: study[key] for key in here if key in study}
same_machine = all(here[key] == value for key, value in recorded.items())
print(f"compared with the study's machine: {', '.join(recorded)}; the same: {same_machine}")
lone_splits = runs["bfloat16", False][bench_invariant.LONE]["first_difference"]
assert sorted(range(len(lone_splits)), key=lambda i: lone_splits[i])[:2] == sorted(LIVE_CHATS)
assert live[True, 8192] == live[True, 16]
if same_machine:
    assert live[False, 8192] == [by_run["bfloat16", False]["lone_tokens"][i][:LIVE_TOKENS] for i in LIVE_CHATS]
    assert live[False, 8192] != batch_of_32
    assert live[True, 16] == mode_batch_of_32

# %% [markdown]
# ## 2. The sources, one at a time
#
# ### 2.1 The GEMM's row count
#
# A linear layer is a GEMM, `x @ W.T` with one row per token of the step. Libraries pick a
# kernel by the shape: the number of rows `M` included. Take SmolLM2's first MLP projection
# (576 -> 1536), and compute row 0 alone (`M = 1`), with a few neighbours, and inside a big
# batch:

# %%
torch.set_num_threads(1)
gate = smollm2.model.layers[0].mlp.gate_proj.weight.detach()                 # [1536, 576]
rows = torch.randn(64, 576)
in_batch = F.linear(rows, gate)                                               # M = 64
by_m = {m: bit_difference(F.linear(rows[:m], gate), in_batch[:m]) for m in (1, 2, 3, 4, 5, 8, 16, 32)}
for m, diff in by_m.items():
    print(f"M = {m:2d}: rows 0..{m - 1} against the same rows in M = 64: {diff}")

# %% [markdown]
# On this CPU, at 1 thread (torch's float32 GEMM is Intel MKL here), one, two or three rows
# go through a different code path than four and more: about 90% of the elements of those
# rows come out a few ulps apart. A decode alone in its step is `M = 1`; the same token
# among 31 other decodes is `M = 32`. Another BLAS (OpenBLAS, Apple's Accelerate) may draw
# its lines elsewhere, or nowhere for these shapes; nothing in the default path promises
# either. GPU libraries do the same with more variety: cuBLAS and Tensile (the GEMM kernel
# library under AMD's rocBLAS and hipBLASLt) pick tiles and split-K by shape (vLLM #34046
# measured 1-ulp differences from Tensile's choice on ROCm).

# %% slideshow={"slide_type": "skip"}
if torch.backends.mkl.is_available() and torch.backends.cpu.get_cpu_capability() != "DEFAULT":
    assert by_m[1].num_differ > 0 and by_m[3].num_differ > 0     # MKL's small-M path, as on this CPU

# %% [markdown]
# ### 2.2 The thread count
#
# The library also splits a GEMM's rows between threads. Five rows against the same rows
# inside `M = 64` (computed at 1 thread), at one thread and at two; then the five rows at
# one thread against the same at two, row by row:

# %%
five_rows = {}
for threads in (1, 2):
    torch.set_num_threads(threads)
    five_rows[threads] = F.linear(rows[:5], gate)
    print(f"{threads} thread(s): 5 rows against the same rows in M = 64: "
          f"{bit_difference(five_rows[threads], in_batch[:5])}")
torch.set_num_threads(1)
thread_rows = [bit_difference(five_rows[2][r], five_rows[1][r]).num_differ for r in range(5)]
print(f"5 rows, 1 thread vs 2 threads: {bit_difference(five_rows[2], five_rows[1])}; "
      f"elements that differ, row by row: {thread_rows}")

# %% [markdown]
# So the same chunk of 5 tokens gives other bits with 2 threads than with 1, on this
# machine (the row-by-row counts show which rows the split sends down another path);
# another CPU or library may split differently, which is the point: nothing in the
# default path promises anything. Section 3 shows the same on the whole model.
#
# ### 2.3 The attention merge at a chunk's boundary
#
# Chapter 1 split a chunk's attention in two: no mask over its cached prefix, causal over
# itself, merged by log-sum-exp. Where the boundary falls decides which keys are summed
# together before the merge, so the rows after it see another order of additions:

# %%
q, k, v = (torch.randn(300, 4, 64) for _ in range(3))
whole_attention = chunk_attention(q, k, v, k[:0], v[:0])
for c in (16, 100, 256):
    rows_after = slice(c, 300)
    split = chunk_attention(q[rows_after], k[rows_after], v[rows_after], k[:c], v[:c])
    print(f"boundary at {c:3d}: rows after it against the whole prefill's: "
          f"{bit_difference(split, whole_attention[rows_after])}")

# %% [markdown]
# ### 2.4 bfloat16: rounding a partial result
#
# In bfloat16 the engine's default chunk path (`chunk_attention`: torch's fused attention
# kernel for each part) returns each part of the split already rounded to bfloat16, and
# the merge rounds again. A whole prefill rounds once. Taking the same two
# float32 parts, merging them and rounding once, against rounding each part first:

# %%
rows_after = slice(100, 300)
out_p, lse_p = unmasked_attention(q[rows_after], k[:100], v[:100])
out_c, lse_c = causal_block_attention(q[rows_after], k[rows_after], v[rows_after], with_lse=True)
rounded_once = merge_attention(out_p, lse_p, out_c, lse_c)[0].bfloat16()
rounded_twice = merge_attention(out_p.bfloat16(), lse_p, out_c.bfloat16(), lse_c)[0].bfloat16()
double_rounding = bit_difference(rounded_twice, rounded_once)
merge_order = bit_difference(rounded_once, whole_attention[rows_after].bfloat16())
print(f"parts rounded first vs merged then rounded: {double_rounding}")
print(f"merged then rounded vs whole then rounded:  {merge_order}")

# %% [markdown]
# The float32 merge order (2.3) rarely survives rounding to bfloat16; the extra rounding of
# each part changes about a third of the elements by 1 ulp. Of these two, the extra
# rounding is by far the larger.

# %% slideshow={"slide_type": "skip"}
assert double_rounding.num_differ > 10 * max(1, merge_order.num_differ)

# %% [markdown]
# ### 2.5 A decode is computed by another kernel
#
# A token generated by a decode step goes through the decode path (here, the compiled
# paged kernel of `minillm/kernels/`; without it, torch's fused attention over the
# gathered keys); the same token's K and V computed again as part of a prefill (a
# prefix-cache hit computed by another request, or the recompute after preemption) go
# through the chunk path. First the kernel alone: section 2.3's q, k and v, the last
# position as a decode over a paged cache of 16-token blocks, against the last row of the
# whole prefill's attention:

# %%
BLOCK = 16
num_blocks = -(-300 // BLOCK)
k_cache, v_cache = (torch.zeros(num_blocks * BLOCK, 4, 64) for _ in range(2))
k_cache[:300], v_cache[:300] = k, v
k_cache, v_cache = (c.view(num_blocks, BLOCK, 4, 64) for c in (k_cache, v_cache))   # [blocks, 16, H, D]
if minillm.kernels.paged_decode_available():
    decode_row = minillm.kernels.paged_decode(q[-1:].contiguous(), k_cache, v_cache,
                                              torch.arange(num_blocks).view(1, -1), torch.tensor([300]), 64 ** -0.5)
else:
    heads_first = [t.transpose(0, 1) for t in (q[-1:], k, v)]                        # [H, T, D]
    decode_row = F.scaled_dot_product_attention(*heads_first).transpose(0, 1)
decode_kernel = bit_difference(decode_row, whole_attention[-1:])
print(f"attention of the last position, decode kernel vs the whole prefill's row: {decode_kernel}")

# %% [markdown]
# In a model the decode kernel is not the only change. Prefilling all but the last token
# and then decoding it also runs the last token's GEMMs with `M = 1` (section 2.1) and
# prefills a 259-token prompt instead of a 260-token one, which on this CPU changes bits by
# itself: the
# first 259 positions' KV, layer 0 and layer 1, of a whole 259-token prefill against the
# same positions of the whole 260-token prefill, then the last position's logits with all
# sources together:

# %%
kv_whole, logits_whole = prefill_kv(smollm2, document)
kv_shorter = prefill_kv(smollm2, document[:-1])[0]                         # [layers, 2, 259, Hkv, D]
for layer in (0, 1):
    print(f"layer {layer} KV, 259-token vs 260-token whole prefill: "
          f"{bit_difference(kv_shorter[layer], kv_whole[layer, :, :-1])}")
as_decode = prefill_kv(smollm2, document, chunk_size=len(document) - 1)[1][-1]   # all but one, then 1 alone
print(f"logits of the last position, decode vs prefill row, all sources together: "
      f"{bit_difference(as_decode, logits_whole[-1])}")

# %% [markdown]
# The prompt's length is a source this chapter has not yet isolated: here layer 0's KV is
# bit-identical, so it enters somewhere in layer 0 after K and V are written. The
# decode kernel alone moves most elements of its row by a few ulps; the last line is every
# source at once. (`bit_difference`'s median counts each element's own ulps, its maximum
# is in ulps of the tensor's largest value, so the median can exceed the maximum: an
# element near zero has tiny ulps.)

# %% [markdown]
# ### 2.6 A vector's tail
#
# Elementwise functions are vectorised (16 floats at a time with AVX-512, 8 with AVX2:
# torch's vector level is printed below); the last few elements of a tensor, and of each
# thread's share of a big one, go through a scalar loop. A strided view cannot be
# vectorised at all, so it shows what the scalar loop does to every element. Three torch
# functions and the mode's SiLU:

# %%
print("torch's vector level here:", torch.backends.cpu.get_cpu_capability())
x = torch.randn(100_000) * 4
spaced = torch.zeros(200_000)
spaced[::2] = x                                   # the same numbers, every other slot
scalar_loop = {name: bit_difference(f(spaced[::2]), f(x)) for name, f in
               (("silu", F.silu), ("sigmoid", torch.sigmoid), ("exp", torch.exp),
                ("x / (1 + exp(-x))", batch_invariant.silu))}
for name, diff in scalar_loop.items():
    print(f"{name:18s} scalar loop vs vectorised: {diff}")

# %% [markdown]
# On this CPU (AVX-512) SiLU and sigmoid round differently in the two loops; exp does not.
# Where torch takes no vector path (a vector level of `DEFAULT` above, as with
# `ATEN_CPU_CAPABILITY=default`) both loops are scalar, so the check below asks for a SiLU
# difference only where there is a vector path. An MLP's activations have `T x 1536` elements: which ones sit in a tail (or
# at the end of a thread's share) depends on the number of rows `T` in the step and on the
# thread count. `exp`, additions and divisions round alike in both loops here, which is
# how the mode writes SiLU (section 3); that `exp` agrees is checked here and in the
# mode's tests on the CPUs they run on, not promised for every vector library.

# %% slideshow={"slide_type": "skip"}
if torch.backends.cpu.get_cpu_capability() != "DEFAULT":
    assert scalar_loop["silu"].num_differ > 0          # torch's vector SiLU, as on this CPU
assert scalar_loop["exp"].num_differ == 0 and scalar_loop["x / (1 + exp(-x))"].num_differ == 0

# %% [markdown]
# ### 2.7 What adds nothing: RMSNorm and the sampler
#
# RMSNorm reduces along a row (the mean of its squares) and never across rows; the sampler
# takes one row of logits and, for temperature > 0, the request's own generator (chapter
# 6). Neither can see a neighbour. RMSNorm and log_softmax on a row alone and inside a
# batch; then 20 sampling steps of one request (row 3) alone, against the same request in
# a batch of 8, each with its own generator as the engine makes them, and against 8 rows
# that share one generator (what the engine avoids):

# %%
norm = smollm2.model.layers[0].input_layernorm
h = torch.randn(64, 576)
normed = norm(h)
assert all(torch.equal(norm(h[:m]), normed[:m]) for m in (1, 2, 3, 5, 17))
logits_rows = torch.randn(8, 49152)
assert torch.equal(torch.log_softmax(logits_rows[3:4], -1), torch.log_softmax(logits_rows, -1)[3:4])
sampling = [minillm.SamplingParams(temperature=0.8, seed=seed) for seed in range(8)]


def sampled_row_3(generators, steps=20):
    """Row 3's tokens over `steps` steps; every row in `generators` samples once per step, in order."""
    tokens = []
    for _ in range(steps):
        for r, gen in generators:
            token = minillm.sampler.sample_token(logits_rows[r], sampling[r], gen)
            tokens += [token] if r == 3 else []
    return tokens


alone = sampled_row_3([(3, minillm.sampler.make_generator(sampling[3], 3))])
in_batch = sampled_row_3([(r, minillm.sampler.make_generator(sampling[r], r)) for r in range(8)])
shared = torch.Generator().manual_seed(3)
one_generator = sampled_row_3([(r, shared) for r in range(8)])
print(f"row 3, 20 samples: alone and in a batch of 8 with per-request generators the same: {alone == in_batch}; "
      f"with one shared generator: {alone == one_generator}")
assert alone == in_batch and alone != one_generator
print("RMSNorm (for 1, 2, 3, 5 and 17 rows of 64), log_softmax (row 3 of 8) and the sampler: "
      "the same bits alone and in a batch")

# %% [markdown]
# ## 3. The batch-invariant mode
#
# The rule the sources share: **the order of every sum that produces a row must be a
# function of that row alone**: of its position and its own inputs, never of how many rows
# share the step, where its chunk starts, or how many threads run. `batch_invariant=True`
# (on `LLMEngine` and `prefill_kv`) applies it to each source:
#
# | source | the mode |
# |---|---|
# | GEMM row count, thread split | every linear layer and the LM head over tiles of a fixed row count (16 rows in float32, 32 in bfloat16): one GEMM shape, so one kernel for every row |
# | SiLU's tail | `x / (1 + exp(-x))`: operations whose vector and scalar code round alike |
# | chunk-boundary merge, bfloat16 partials, decode vs prefill | every row's attention computed alone, over its keys from position 0 in a fixed order, in float32, rounded once |
#
# The linear layers, rendered from the engine:

# %%
show_source(batch_invariant.linear)

# %% [markdown]
# Attention takes two forms. Where the compiled CPU kernel runs (`make` builds it), every
# row of the step goes through it as a *decode of its own length*: the kernel computes a
# row by itself, its keys from position 0 in groups of 16, whatever else is in the step
# (bfloat16 runs it in float32 and rounds the output once). The engine's decodes were
# already computed that way; the mode sends the chunk rows there too:

# %%
show_source(batch_invariant, "def paged_attention", "return tiled_attention")

# %% [markdown]
# Elsewhere (without a compiler, or on a GPU) it is chapter 9's tile walk in torch:
# key tiles at **absolute** positions `[j * 32, (j + 1) * 32)` (never at the chunk's
# boundary), query tiles of a fixed number of positions, each (query tile, key tile) one
# GEMM of a fixed shape, and the tiles' sums combined in a binary tree over the absolute
# tile index `j`, the same tree for a row whatever else its query tile holds. (This
# chapter runs it on the CPU only; on a GPU the tiled path is untested.) The idea in ten
# lines, on a plain sum over a row's keys (left to right over the tiles, for brevity,
# where the engine uses its fixed tree):

# %%
def row_sum_default(values, position, chunk_start):
    """The default engine's way: the cached prefix summed, the chunk's part summed, merged."""
    return values[:chunk_start].sum() + values[chunk_start:position + 1].sum()


def row_sum_invariant(values, position, tile=32):
    """Tiles at absolute positions, each summed alone, added left to right: no chunk_start."""
    total = torch.zeros((), dtype=values.dtype)
    for start in range(0, position + 1, tile):
        total = total + values[start:min(start + tile, position + 1)].sum()
    return total


terms = torch.randn(1000) * 1000                           # one row's terms, keys 0..999
chunk_starts = (0, 16, 100, 256, 999)                      # where the row's chunk began
default_sums = {c: row_sum_default(terms, 999, c).item() for c in chunk_starts}
print("default, by the chunk's first position:", default_sums)
print("absolute tiles:", row_sum_invariant(terms, 999).item())
assert len(set(default_sums.values())) > 1

# %% [markdown]
# A row in a chunk can read every key before it (they are in the cache), so nothing forces
# the sum to split where the chunk starts; the invariant version never asks. (Exercise 3
# asks for the harder case where the terms arrive in pieces.) The tiled torch attention:

# %%
show_source(batch_invariant, "def tiled_attention", "masked_fill_")

# %% [markdown]
# ### The proof: the same bits everywhere
#
# Section 1's table again, with `batch_invariant=True`: against the whole prefill alone,
# every configuration on the tiny model and the two hardest on SmolLM2 (the smallest
# chunks; chunks with neighbours), both dtypes.

# %%
t0 = time.perf_counter()
HARDEST = [config for config in CONFIGS if config[0] in ("chunks of 16", "chunks of 64, neighbours")]
invariant_bits = {key: measure(m, ids, invariant=True, configs=HARDEST if key[0] == "SmolLM2" else CONFIGS)
                  for key, (m, ids) in models.items()}
for (name, dtype), rows_ in invariant_bits.items():
    differing = sum(kv.num_differ + lg.num_differ for kv, lg in rows_.values())
    print(f"{name} {dtype}: {differing} elements differ in {len(rows_)} configurations")
print(f"({time.perf_counter() - t0:.0f} s)")
assert all(kv.num_differ == 0 and lg.num_differ == 0 for rows_ in invariant_bits.values() for kv, lg in rows_.values())

# %% [markdown]
# And the thread count: one thread against two, the whole prompt and chunks of 5 with
# neighbours, in both modes (section 2.2's odd row shows up in the default's chunks):

# %%
by_threads_mode = {}
for invariant in (False, True):
    runs_by_threads = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        runs_by_threads.append([prefill_kv(tiny, models["tiny", "float32"][1][:120], chunk_size=c,
                                           neighbours=NEIGHBOURS[:1],
                                           batch_invariant=invariant)[1] for c in (None, 5)])
    by_threads_mode[invariant] = [bit_difference(a, b) for a, b in zip(*runs_by_threads)]
    print(f"batch_invariant={invariant}: 1 vs 2 threads, whole: {by_threads_mode[invariant][0]}; "
          f"chunks of 5: {by_threads_mode[invariant][1]}")
torch.set_num_threads(THREADS)
assert all(d.num_differ == 0 for d in by_threads_mode[True])

# %% [markdown]
# The engine's own tests hold the rest: `tests/test_batch_invariant.py` checks `torch.equal`
# on KV and logits across chunk sizes 3, 16, 100 and whole and across neighbours, in
# float32 and bfloat16, on `tiny`, SmolLM2 and locally built Llama (GQA) and Qwen3 (q/k
# norms) checkpoints; greedy tokens and every logprob across chunk sizes, neighbours,
# prefix caching and preemption; the triton backend in its interpreter; and the refusals:
# `backend="flash"` (flash-attn chooses how many pieces to split the keys into from the
# batch's size, and a separate path when every query is a decode:
# `num_splits_heuristic` and `seqlenq_ngroups_swapped` in `csrc/flash_attn/flash_api.cpp`,
# commit 00979f5) and any `batch_invariant` that is not a bool.
#
# ## 4. What it costs
#
# Fixed tiles waste work: a step of 5 rows still runs 16-row GEMMs (32 in bfloat16), and a
# chunk's rows read their keys one row at a time instead of in one fused kernel.
# `python -m minillm bench invariant` measures useful output tokens per second of both
# modes on SmolLM2's 32 chats and on the interference workload (chapter 6) with the three
# bench model shapes, alternating the two in each round on one machine; its results are
# committed as
# `data/ch11_invariant_cost.json`:

# %%
cost = json.loads(bench_invariant.COST_FILE.read_text())
print(bench_invariant.report(cost))
print(f"({cost['threads']} threads, {cost['rounds']} rounds, {cost['date']}, torch {cost['torch']})")

# %% [markdown]
# For comparison, Thinking Machines' blog ("Defeating Nondeterminism in LLM Inference")
# reports their batch-invariant vLLM about 2.1x slower with their first kernels and 1.6x
# with their attention kernel (Qwen3-8B, 1,000 sequences); SGLang's blog (LMSYS,
# 2025-09-22) reports most slowdowns between 25% and 45% and an average overhead of 34.35%
# against Thinking Machines' 61.5% (Qwen3-8B, one H200). Here the price depends on the
# shape, and the SmolLM2 figure moves a lot between rounds on 2 shared cores (its range is
# printed above). `mha` pays the most, and a split of its step (docs/benchmarks.md,
# section 15) puts most of that outside attention, the largest single loss being its down
# projection's 16-row tiles, more than any layer of the other shapes loses. Which kernel a GEMM library picks for a shape is chapter 5's lesson
# again.
#
# ## 5. What vLLM and SGLang do, and what nobody promises
#
# **vLLM, `VLLM_BATCH_INVARIANT=1`** (`vllm/model_executor/layers/batch_invariant.py`,
# commit 3afe32a): replaces `aten::mm`, `addmm`, `matmul`, `bmm`, `linear`,
# `_log_softmax`, `softmax` and `mean.dim` on CUDA with Triton kernels whose tile sizes are
# fixed per dtype (a persistent matmul, 128 x 128 x 64 tiles in bfloat16, each output tile
# reducing over K in one loop, never split), one program per row for log_softmax and
# RMSNorm and one per output element for mean; it turns TF32 off, sets `CUBLAS_WORKSPACE_CONFIG` and, for tensor parallelism,
# NCCL to one channel and tree all-reduce. Attention: FLASH_ATTN first; with the other
# supported backends it warns that the result is "decode-invariant" and "will not be
# invariant between prefill and decode" (`override_envs_for_invariance`).
#
# **A proposed vLLM flag, `--deterministic-prefix-caching`** (open pull request #40179,
# not in a release): a cache miss computes a prompt's N tokens as one GEMM of N rows, a
# hit only the suffix, so the suffix's rows come out of GEMMs of different shapes. The
# proposed flag splits a miss at the last cached block boundary
# (`_prefix_cache_aligned_split` in `vllm/v1/core/sched/scheduler.py`), so the suffix always
# runs with the same row count. Read as vLLM pull request #40179 (after the closed #34046):
# open, not in vLLM's `scheduler.py` at commit b4622cf, which the same search read. Its own
# test says the guarantee is self-consistency, not equality with an unchunked run.
#
# **SGLang, `--enable-deterministic-inference`** (`docs/advanced_features/deterministic_inference.md`,
# commit f111248, and the LMSYS blog of 2025-09-22): Thinking Machines' batch-invariant
# matmul, log-softmax and mean kernels; attention with a fixed split-KV size (FlashInfer's
# `fixed_split_size`, FA3 with `num_splits=1`, Triton with a fixed decode split); chunked
# prefill truncated at multiples of the split size, so a prompt's pieces are the attention
# kernel's pieces; seeded Gumbel sampling for temperature > 0. Backends: FlashInfer, FA3,
# Triton; the docs' table lists radix cache as supported with FA3 and Triton, not with
# FlashInfer.
#
# **What these promise, and what not.** Each promises the same bits for the same request
# *on one configuration* (one GPU model, one software version, one parallel layout)
# whatever the batch, for its supported backends and features only: vLLM's prefill and
# decode agree with FLASH_ATTN alone (the warning above), and a vLLM maintainer wrote in
# issue #40896 that determinism with prefix caching is not yet fully supported; SGLang's
# radix cache is not supported with FlashInfer. None promises bits across GPU generations (other tensor-core
# instructions), across versions of the kernels or libraries (Thinking Machines' FAQ:
# "Bitwise results can vary across hardware/library versions"), or across tensor-parallel
# sizes (a layer split over more GPUs sums its partial products in another order; SGLang's
# blog: TP1 and TP2 deterministic, larger sizes need other reduce kernels). Nor does this
# chapter's mode: its bits hold on this CPU and this torch; another CPU runs other
# kernels, with other bits, and the mode's tests then check that they too do not move.
#
# ## Takeaways
#
# - The default engine's bits depend on the chunk size and the thread count, and a
#   decode's on its neighbours; in bfloat16 that changes most of 32 greedy SmolLM2 texts
#   within 128 tokens (section 1's study); in float32 no text here, but the last bits of
#   31% to 80% of the logprobs.
# - The main sources are separate and each is small: the GEMM's row count and thread
#   split, the merge at a chunk's boundary, bfloat16 rounding of partial results, the
#   decode kernel, a vector's scalar tail; the prompt's length is one more, not yet
#   isolated. RMSNorm and the sampler are per row and add nothing.
# - The cure is one rule: every sum that produces a row has an order fixed by that row
#   alone. Fixed GEMM tiles, key tiles at absolute positions summed in a fixed order, one
#   code path for decodes and chunks.
# - `batch_invariant=True` makes KV, logits, tokens and logprobs bit-identical across the
#   chunk sizes, neighbours, prefix caching, preemption and 1 vs 2 threads tested here, on
#   this CPU; on a GPU its tiled path is untested. It refuses `flash`.
# - vLLM and SGLang do the same on GPUs, for their supported backends and features, and
#   promise it for one machine and version only.
#
# **Exercises:** `exercises/11_bit_for_bit.ipynb`: predict which configurations change the
# bits, find the step that makes a pipeline batch-variant, write a streaming log-sum-exp
# whose bits do not depend on how its input is chunked, and measure distances in ulps.
