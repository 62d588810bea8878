# %% [markdown]
# # Chapter 3: The paged KV cache
#
# **The question.** Every step of generation needs the keys and values of all earlier
# tokens. Should an engine recompute them, or keep them? If it keeps them, how much memory
# do they take, and how should that memory be laid out when hundreds of requests of unknown
# length come and go?
#
# By the end you will have
# - measured what recomputing costs against caching, on the built-in model;
# - computed the cache size of real models from their shapes (Llama-3-8B: per token, per
#   sequence, per GPU);
# - used the engine's `BlockManager` (block tables, slot mapping, free list) and its
#   `PagedKVCache`, and checked that a paged cache reads back exactly like a contiguous one;
# - simulated a mixed workload twice: with contiguous reservations and with paging, and
#   measured how much memory each wastes.

# %% slideshow={"slide_type": "skip"}
import random
import time
from collections import deque

import matplotlib.pyplot as plt
import torch
from IPython.display import display
from matplotlib.patches import Rectangle

import minillm
from minillm import kv_cache, prefill_kv
from minillm.config import PRESETS
from minillm.device import synchronize
from minillm.kv_cache import BlockManager, OutOfBlocksError, PagedKVCache, blocks_for
from minillm.model_runner import ModelRunner, StepChunk
from minillm.prefill import prepare_step
from minillm.book.show import show_source

torch.manual_seed(0)
device = minillm.default_device()
model = minillm.build_model("tiny", seed=0, dtype=torch.float32, device=device)
print("device:", device, "| model:", model.cfg.name, f"({model.cfg.num_parameters() / 1e6:.1f} M parameters)")

# %% [markdown]
# ## 1. Why cache: recomputing against caching
#
# To generate token $t+1$, attention needs $k_j, v_j$ for every $j \le t$ at every layer.
# Without a cache, each new token reruns the whole sequence so far: generating $N$ tokens
# after a prompt of $P$ processes $\sum_{t=P}^{P+N-1} t$ tokens, quadratic in $N$. With a
# cache, each step processes one new token and reads the stored K and V.
#
# We generate 32 tokens after a 48-token prompt both ways and time every step.

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
# NBVAL_IGNORE_OUTPUT
prompt = torch.randint(0, 256, (48,), generator=torch.Generator().manual_seed(0)).tolist()
num_new = 32

def timed(fn):
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, time.perf_counter() - start

# Without a cache: a full prefill of the whole sequence for every new token.
tokens, recompute_s, recompute_logits, tokens_processed_recompute = list(prompt), [], [], 0
for _ in range(num_new):
    (_, logits), seconds = timed(lambda: prefill_kv(model, tokens))
    recompute_s.append(seconds)
    recompute_logits.append(logits[-1])
    tokens_processed_recompute += len(tokens)
    tokens.append(int(logits[-1].argmax()))

# With the cache: the prompt once (its pass gives the first new token), then one token per
# step. The last new token comes out of the last pass and is never fed back: num_new passes.
blocks = BlockManager(num_blocks=blocks_for(len(prompt) + num_new - 1, 16), block_size=16)
runner = ModelRunner(model, blocks)
blocks.allocate("r", len(prompt) + num_new - 1)
cached_s, cached_logits, tokens_processed_cached = [], [], 0
step = StepChunk("r", prompt, 0)
for i in range(num_new):
    logits, seconds = timed(lambda: runner.execute([step]))
    cached_s.append(seconds)
    cached_logits.append(logits[0])
    tokens_processed_cached += len(step.token_ids)
    step = StepChunk("r", [tokens[len(prompt) + i]], len(prompt) + i)   # feed the token just chosen

print(f"recompute: {sum(recompute_s) * 1e3:.0f} ms, {tokens_processed_recompute} tokens through the model")
print(f"cached:    {sum(cached_s) * 1e3:.0f} ms, {tokens_processed_cached} tokens through the model "
      f"({tokens_processed_recompute / tokens_processed_cached:.0f}x fewer)")

# %% slideshow={"slide_type": "fragment"}
gap = max((a - b).abs().max().item() for a, b in zip(recompute_logits, cached_logits))
print(f"same next-token logits both ways: max difference {gap:.1e}")
assert gap < 1e-3
assert tokens_processed_recompute == sum(range(len(prompt), len(prompt) + num_new))
assert tokens_processed_cached == len(prompt) + num_new - 1          # the prompt, then 31 decodes
assert round(tokens_processed_recompute / tokens_processed_cached) == 26   # quoted below

# %% [markdown]
# With the cache, generating $N$ tokens takes $N$ passes and $P + N - 1$ tokens through
# the model: the prompt's pass already produces the first new token, each decode the next,
# and the last token is sampled from the last pass without ever being fed back (its K and
# V would only be needed for a token after it). Both loops above count the tokens they
# really pass to the model; the recompute loop feeds $P, P + 1, \dots, P + N - 1$ tokens,
# the last token again unused.
#
# Over those 32 tokens the recompute loop pushed 26 times as many tokens through the model
# (the counts above), yet at 48 to 80 tokens per step the time of a step says little
# about its tokens. On this CPU a step has a **fixed cost** (reading every weight once,
# Python, kernel dispatch, 4 layers of small ops) that does not depend on its tokens, and at a few dozen tokens that
# fixed cost dominates. To see how each approach grows with the
# sequence, time one step of each at lengths from 32 to 1024 tokens: a recompute step is
# a prefill of the whole sequence, a cached step is one new token over a cache of that
# length.

# %%
# NBVAL_IGNORE_OUTPUT
lengths = [32, 128, 256, 512, 1024]

def median_step_times_s(runs, rounds=3):
    """Each run's median over `rounds`, the runs timed in turns: a busy moment on the
    machine slows one round of every run, not all the repeats of one."""
    for run in runs:
        run()                                        # warm-up
    times = [[] for _ in runs]
    for _ in range(rounds):
        for run, ts in zip(runs, times):
            ts.append(timed(run)[1])
    return [sorted(ts)[rounds // 2] for ts in times]

step_s = median_step_times_s([prepare_step(model, [(n, 0)]) for n in lengths] +
                             [prepare_step(model, [(1, n)]) for n in lengths])
recompute_by_len_s, cached_by_len_s = step_s[:len(lengths)], step_s[len(lengths):]
# Cost per token: the slope of the recompute steps. Fixed cost: what a one-token step
# over a short cache costs, almost nothing but the step itself.
per_token_s = (recompute_by_len_s[-1] - recompute_by_len_s[0]) / (lengths[-1] - lengths[0])
fixed_s = cached_by_len_s[0]
for n, r, c in zip(lengths, recompute_by_len_s, cached_by_len_s):
    print(f"{n:5d} tokens: recompute step {r * 1e3:6.1f} ms, cached step {c * 1e3:5.1f} ms")
print(f"recompute step ~ {fixed_s * 1e3:.1f} ms fixed + {per_token_s * 1e6:.0f} us per token "
      f"(the fixed part equals {fixed_s / per_token_s:.0f} tokens of work)")

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(lengths, [s * 1e3 for s in recompute_by_len_s], "o-", label="recompute: prefill the whole sequence")
ax.plot(lengths, [s * 1e3 for s in cached_by_len_s], "s-", label="KV cache: one new token")
ax.axhline(fixed_s * 1e3, color="grey", ls=":", lw=1, label="fixed per-step cost (a one-token step)")
ax.set_xlabel("sequence length when the token is generated (tokens)")
ax.set_ylabel("time of one step (ms)")
ratio = recompute_by_len_s[-1] / cached_by_len_s[-1]
ax.set_title(f"Recomputing grows with the sequence; a cached step stays flat "
             f"({ratio:.0f}x cheaper at {lengths[-1]} tokens)")
ax.set_ylim(bottom=0)
ax.legend(fontsize=8)
plt.show()

# %%
recompute_growth_s = recompute_by_len_s[-1] - recompute_by_len_s[0]
cached_growth_s = cached_by_len_s[-1] - cached_by_len_s[0]
assert recompute_by_len_s[-1] > 2 * recompute_by_len_s[0]          # grows with the sequence
assert cached_growth_s < 0.25 * recompute_growth_s                  # the cached step barely does
assert recompute_by_len_s[-1] > 3 * cached_by_len_s[-1]

# %% [markdown]
# Past the fixed cost, the recompute step grows with the sequence and the cached one stays
# flat: over a generation, the cache turns quadratic token processing into linear (each
# step runs one token through the weights; its attention still reads the whole cache, a
# small cost here). The fixed
# per-step cost is a property of running a small model from Python on a CPU (a GPU engine
# pays a similar host overhead per step, which CUDA graphs shrink); it is why short
# sequences hide the difference. The price of caching is memory, which the rest of the
# chapter is about.
#
# ## 2. How big is the cache?
#
# Each token stores one key and one value vector per KV head, at every layer:
#
# $$\text{bytes per token} = 2 \times \text{layers} \times \text{KV heads} \times \text{head dim} \times \text{bytes per element}.$$
#
# Grouped-query attention (GQA) shrinks it: Llama-3-8B has 32 query heads but only 8 KV
# heads. The engine computes it from the config:

# %% slideshow={"slide_type": "subslide"}
show_source(minillm.ModelConfig.kv_bytes_per_token)

# %% slideshow={"slide_type": "fragment"}
cfg = PRESETS["llama-3-8b"]
per_token = kv_cache.kv_bytes_per_token(cfg, dtype_bytes=2)                  # bf16: 2 bytes
print(f"llama-3-8b: 2 x {cfg.num_layers} layers x {cfg.num_kv_heads} KV heads x {cfg.head_dim} "
      f"x 2 bytes = {per_token:,} bytes = {per_token / 1024:.0f} KiB per token")
print(f"one sequence of {cfg.max_position} tokens: {per_token * cfg.max_position / 2**30:.2f} GiB")
weights_bytes = cfg.num_parameters() * 2
hbm_bytes = 80e9   # an 80 GB A100 or H100 (NVIDIA datasheets)
kv_budget = hbm_bytes - weights_bytes
print(f"weights in bf16: {weights_bytes / 1e9:.1f} GB; on an 80 GB GPU that leaves room for at most "
      f"{kv_budget // per_token:,.0f} tokens of KV = {int(kv_budget // per_token // cfg.max_position)} "
      f"full-length sequences (activations and the framework's own memory not counted)")
assert per_token == 128 * 1024

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
names = ["llama-2-7b", "llama-3-8b", "mistral-7b", "qwen3-0.6b", "tiny"]
kib = [kv_cache.kv_bytes_per_token(PRESETS[n], 2) / 1024 for n in names]
fig, ax = plt.subplots(figsize=(7, 3.2))
bars = ax.bar(names, kib, color=["C3", "C0", "C0", "C0", "C7"])
ax.bar_label(bars, [f"{k:.0f}" for k in kib])
ax.set_ylabel("KV cache per token, bf16 (KiB)")
ax.set_title(f"GQA cuts Llama-2-7B's {kib[0]:.0f} KiB per token to Llama-3-8B's {kib[1]:.0f} KiB")
assert (kib[0], kib[1]) == (512, 128)     # so 1 GiB holds 2,048 and 8,192 tokens, quoted below
plt.show()

# %% [markdown]
# Llama-2-7B has as many KV heads as query heads (32), so each token costs 4x more than in
# Llama-3-8B: 1 GiB holds 2,048 tokens of Llama-2-7B and 8,192 of Llama-3-8B. Either way
# a server's few dozen requests of a few thousand tokens each fill tens of gigabytes: the
# cache, not the weights, limits how many requests a server can run at once. So it matters how well that memory
# is used.
#
# ## 3. Contiguous or paged?
#
# The simplest layout gives each request one contiguous region. But a request's final
# length is unknown when it starts (it stops at an end-of-sequence token), so the region
# must be reserved for the maximum length, and most of it stays empty. Paging, as an
# operating system does for virtual memory, cuts the cache into fixed-size **blocks** of
# `block_size` tokens, hands them out one at a time as a request grows, and keeps a
# **block table** per request that lists its blocks in order. Token $p$ of a request then
# lives in block `table[p // block_size]` at offset `p % block_size`.
#
# Here are three requests that grew in turns, so their blocks interleave in the pool:

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
block_size, lengths = 4, {"A": 10, "B": 5, "C": 7}
demo = BlockManager(num_blocks=12, block_size=block_size)
for grown in range(1, max(lengths.values()) + 1):           # every request grows one token at a time
    for rid, n in lengths.items():
        if grown <= n:
            demo.allocate(rid, grown)
print({rid: demo.block_tables[rid] for rid in lengths})
colors = {"A": "C0", "B": "C1", "C": "C2"}


def draw_layouts(lengths, demo, max_len=16):
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 4.6), gridspec_kw={"height_ratios": [3, 2]})
    for row, (rid, n) in enumerate(lengths.items()):          # contiguous: one reserved row each
        y = len(lengths) - 1 - row
        top.add_patch(Rectangle((0, y), max_len, 0.8, fill=False, hatch="//", ec="gray"))
        top.add_patch(Rectangle((0, y), n, 0.8, color=colors[rid]))
        top.text(-0.4, y + 0.4, rid, ha="right", va="center")
    top.set(xlim=(-1.5, max_len + 0.5), ylim=(-0.2, len(lengths)), yticks=[],
            xlabel="token slot (each request reserves max_len = 16)",
            title="Contiguous: every request reserves its maximum length (hatched: reserved, empty)")
    owner = {b: rid for rid, table in demo.block_tables.items() for b in table}
    for b in range(demo.num_blocks):                           # paged: one pool of blocks
        rid = owner.get(b)
        bottom.add_patch(Rectangle((b, 0), 0.95, 0.8, fill=False, ec="gray"))
        if rid is not None:
            index = demo.block_tables[rid].index(b)
            filled = min(block_size, lengths[rid] - index * block_size) / block_size
            bottom.add_patch(Rectangle((b, 0), 0.95 * filled, 0.8, color=colors[rid]))
            bottom.text(b + 0.47, 0.4, f"{rid}{index}", ha="center", va="center")
        bottom.text(b + 0.47, -0.25, str(b), ha="center", va="center", fontsize=8)
    tables = "   ".join(f"{rid}: {demo.block_tables[rid]}" for rid in lengths)
    bottom.set(xlim=(-0.2, demo.num_blocks), ylim=(-0.5, 1.3), yticks=[], xticks=[],
               title=f"Paged: blocks of {block_size} tokens handed out as requests grow. Block tables: {tables}")
    fig.tight_layout()
    return fig


draw_layouts(lengths, demo)
plt.show()
num_tokens, max_len = sum(lengths.values()), 16
paged_blocks = sum(len(t) for t in demo.block_tables.values())
print(f"contiguous: {num_tokens} tokens in {len(lengths) * max_len} reserved slots; "
      f"paged: {paged_blocks} blocks = {paged_blocks * block_size} slots")
assert paged_blocks == sum(blocks_for(n, block_size) for n in lengths.values())
assert all(b - a > 1 for a, b in zip(demo.block_tables["A"], demo.block_tables["A"][1:]))   # quoted below

# %% [markdown]
# Contiguous reserves three times the 16 slots; paged hands out only the blocks the tokens
# fill (printed under the picture): the only waste is the unfilled tail of each request's last block, at most
# `block_size - 1` tokens per request. No two of A's blocks are neighbours (its table
# reads 0, 3, 6: the requests grew in turns); the block table makes that invisible to the
# request.
#
# ## 4. The engine's block manager
#
# `BlockManager` is plain Python: a free list, a reference count per block and a table
# per request. Here every block has one owner, so every count is 1; the counts exist so
# that requests with a common prefix can share blocks (a shared block goes back to the
# free list only when its last user frees it), which is how chapter 8 builds prefix
# caching, as vLLM's prefix caching does. Allocation
# grows a table to hold a given number of tokens, or raises `OutOfBlocksError` without
# changing anything, so that the scheduler can preempt a request and try again:

# %% slideshow={"slide_type": "subslide"}
show_source(BlockManager.allocate)

# %% slideshow={"slide_type": "fragment"}
try:
    demo.allocate("D", 30)           # 8 blocks, with 5 free
except OutOfBlocksError as err:
    print(f"{type(err).__name__}: {err}")
    print("what the scheduler reads:", err.request_id, err.blocks_needed, err.blocks_free)
assert "D" not in demo.block_tables and demo.num_free_blocks == 5

# %% [markdown]
# The **slot mapping** turns positions into flat cache slots: it tells the forward pass
# where to write each new token's K and V.

# %% slideshow={"slide_type": "subslide"}
show_source(BlockManager.slot_mapping)

# %% slideshow={"slide_type": "fragment"}
print("A's block table:", demo.block_tables["A"])
print("slots of A's tokens 0..9:", demo.slot_mapping("A", 0, 10))
assert demo.slot_mapping("A", 0, 10) == [demo.block_tables["A"][p // 4] * 4 + p % 4 for p in range(10)]
for rid in lengths:
    demo.free(rid)
assert demo.num_free_blocks == demo.num_blocks and demo.num_leaked_blocks() == 0
print("after freeing every request:", demo.num_free_blocks, "free blocks, 0 leaked")

# %% [markdown]
# `PagedKVCache` holds the tensors: one `[num_blocks, block_size, KV heads, head dim]` array
# of keys and one of values per layer, filled through the slot mapping, read back through
# the block table. Does a paged cache hold the same numbers as a contiguous one? We prefill
# two prompts through one `ModelRunner` in alternating chunks, so their blocks interleave,
# then gather each request's KV through its block table and compare with a prefill of that
# prompt alone. `PagedKVCache.gather` reads every layer at once with `kv_cache.gather_kv`,
# which attention also uses to read a prefill chunk's cached prefix: a view when the
# blocks are consecutive in the pool, one copy when they are not. (Decodes read their
# blocks in place through chapter 1's paged kernel, or, where it is not built, gather
# them in buckets.)

# %% slideshow={"slide_type": "subslide"}
display(show_source(kv_cache.gather_kv))
display(show_source(kv_cache.view_kv))

# %% slideshow={"slide_type": "fragment"}
prompts = {"x": list(range(40, 90)), "y": list(range(100, 137))}
pool = BlockManager(num_blocks=8, block_size=16)
runner = ModelRunner(model, pool)
for start in range(0, 64, 16):                                   # alternate 16-token chunks
    for rid, p in prompts.items():
        if start < len(p):
            chunk = p[start:start + 16]
            pool.allocate(rid, start + len(chunk))
            runner.execute([StepChunk(rid, chunk, start)])
print("interleaved block tables:", pool.block_tables)
for rid, p in prompts.items():
    paged = runner.kv_cache.gather(pool.block_tables[rid], len(p))  # [layers, 2, T, Hkv, D]
    alone, _ = prefill_kv(model, p)
    print(f"{rid}: max |paged - alone| = {(paged - alone).abs().max().item():.1e}")
    assert (paged - alone).abs().max() <= 1e-5 * alone.abs().max()

# %% [markdown]
# The same K and V, up to float32 rounding (chapter 4 explains why chunking moves only the
# last bits).
#
# The loop above also shows when a paged engine takes blocks: as the tokens that fill
# them are computed, chunk by chunk. One source article lists among the ills of an
# unchunked prefill a memory peak that "explodes" because "all KV cache space is allocated
# at once". Count the blocks a 1024-token prompt holds, computed whole or in 256-token
# chunks:

# %% slideshow={"slide_type": "fragment"}
whole_pool, chunked_pool = BlockManager(num_blocks=64, block_size=16), BlockManager(num_blocks=64, block_size=16)
whole_pool.allocate("p", 1024)                                   # one step computes all 1024 tokens
held = []
for end in range(256, 1025, 256):                                # four steps of 256
    chunked_pool.allocate("p", end)
    held.append(len(chunked_pool.block_tables["p"]))
print(f"whole: {len(whole_pool.block_tables['p'])} blocks after its one step; "
      f"chunked: {held} blocks after each chunk")
assert held[-1] == len(whole_pool.block_tables["p"]) == 1024 // 16

# %% [markdown]
# The prompt ends with the same 64 blocks either way, and all of them are resident
# before its first token can be sampled: chunking does not change a prompt's KV
# footprint, it only spreads the allocation over the steps that compute the tokens,
# which a paged engine does whatever the chunk size. What a chunk does cap is the
# *activation* peak of a step (the scores, the MLP's intermediate values), which grows
# with the tokens in the step; chapter 5 measures it.
#
# ## 5. Fragmentation on a mixed workload
#
# Now the question that decides throughput: given a fixed amount of KV memory, how many
# requests can run at once? We simulate a workload of 300 requests, prompts of 16 to 1024
# tokens, each asking for up to `max_tokens = 512` new tokens but stopping after a random
# 16 to 512 (as an end-of-sequence token would). Every step, each running request generates
# one token; finished requests free their memory; waiting requests are admitted first come,
# first served while memory allows. Three allocators share 32,768 token slots:
#
# - **contiguous, max length**: each request reserves a fixed maximum length of 2048 tokens;
# - **contiguous, prompt + max_tokens**: each reserves exactly its own worst case, first
#   fit in a flat arena (so free space can also be cut into holes too small to use);
# - **paged**: the engine's `BlockManager` with 16-token blocks, growing as tokens arrive.
#   When a request cannot grow, the newest running request is preempted: its blocks are
#   freed and it goes back to the front of the queue, keeping the tokens it generated.
#   Readmitted, it prefills its prompt *and* those tokens again, then goes on decoding.
#   That is vLLM's recompute preemption (`Scheduler._preempt_request` in
#   `vllm/v1/core/sched/scheduler.py` sets `num_computed_tokens = 0` and keeps the
#   request's output tokens, which are recomputed as part of the prompt) and what the
#   engine's own `Scheduler._preempt` does in chapter 6.
#
# First, the contiguous allocator, sketched in a few lines:

# %% slideshow={"slide_type": "skip"}
class ContiguousAllocator:
    """First fit over a flat arena of token slots; a request gets one [start, start + size)."""

    def __init__(self, capacity_tokens):
        self.holes = [(0, capacity_tokens)]          # free (start, size), sorted by start
        self.regions = {}

    def allocate(self, request_id, size):
        for i, (start, free) in enumerate(self.holes):
            if free >= size:
                self.holes[i] = (start + size, free - size)
                self.regions[request_id] = (start, size)
                return True
        return False                                 # no hole is big enough, even if the total is

    def free(self, request_id):
        self.holes.append(self.regions.pop(request_id))
        self.holes.sort()
        merged = [self.holes[0]]
        for start, size in self.holes[1:]:           # coalesce neighbouring holes
            last_start, last_size = merged[-1]
            if last_start + last_size == start:
                merged[-1] = (last_start, last_size + size)
            else:
                merged.append((start, size))
        self.holes = [h for h in merged if h[1] > 0]

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
MAX_LEN, MAX_TOKENS, CAPACITY, BLOCK = 2048, 512, 32768, 16
rng = random.Random(0)
workload = [(rng.randint(16, 1024), rng.randint(16, MAX_TOKENS)) for _ in range(300)]


def simulate(kind, workload):
    """Returns per-step (tokens stored, running requests) and the number of preemptions."""
    waiting, running, trace, preemptions = deque(enumerate(workload)), {}, [], 0
    blocks, arena = BlockManager(CAPACITY // BLOCK, BLOCK), ContiguousAllocator(CAPACITY)
    while waiting or running:
        while waiting:                               # admit first come, first served
            rid, (prompt_len, output_len) = waiting[0]
            if kind == "paged":
                if not blocks.can_allocate(rid, prompt_len + 1):
                    break
                blocks.allocate(rid, prompt_len + 1)
            elif not arena.allocate(rid, MAX_LEN if kind == "contiguous, max length"
                                    else prompt_len + MAX_TOKENS):
                break
            waiting.popleft()
            running[rid] = [prompt_len, output_len, 1]   # prompt + its first output token
        for rid in list(running):                    # one decode step for everyone
            if rid not in running:
                continue
            prompt_len, output_len, generated = running[rid]
            if generated == output_len:
                del running[rid]
                blocks.free(rid) if kind == "paged" else arena.free(rid)
                continue
            while kind == "paged" and not blocks.can_allocate(rid, prompt_len + generated + 1):
                victim = max(running)                # the newest request makes room
                blocks.free(victim)
                v_prompt, v_output, v_generated = running.pop(victim)
                # Recompute, as vLLM: its outputs so far become part of the prompt to prefill.
                waiting.appendleft((victim, (v_prompt + v_generated - 1, v_output - v_generated + 1)))
                preemptions += 1
                if victim == rid:
                    break
            if rid in running:
                if kind == "paged":
                    blocks.allocate(rid, prompt_len + generated + 1)
                running[rid][2] += 1
        trace.append((sum(p + g for p, _, g in running.values()), len(running)))
    return trace, preemptions


results = {kind: simulate(kind, workload)
           for kind in ("contiguous, max length", "contiguous, prompt + max_tokens", "paged")}
summary = {}
for kind, (trace, preemptions) in results.items():
    used = sum(t for t, _ in trace) / len(trace) / CAPACITY
    batch = sum(r for _, r in trace) / len(trace)
    summary[kind] = used
    print(f"{kind:32s} memory holding tokens {used:5.1%}   mean running requests {batch:5.1f}   "
          f"steps to finish {len(trace):5d}   preemptions {preemptions}")

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
fig, ax = plt.subplots(figsize=(8, 3.8))
for kind, (trace, _) in results.items():
    ax.plot([100 * t / CAPACITY for t, _ in trace], label=f"{kind} (mean {summary[kind]:.0%})")
ax.set_xlabel("decode step")
ax.set_ylabel("KV memory holding real tokens (%)")
ax.set_ylim(0, 100)
ax.set_title(f"Paging keeps {summary['paged']:.0%} of the KV memory busy; "
             f"reserving max length, {summary['contiguous, max length']:.0%}")
ax.legend(fontsize=8)
plt.show()

# %% slideshow={"slide_type": "skip"}
assert summary["paged"] > summary["contiguous, prompt + max_tokens"] > summary["contiguous, max length"]
assert summary["paged"] > 2 * summary["contiguous, max length"]
assert len(results["paged"][0]) < len(results["contiguous, max length"][0])   # finishes sooner

# %% [markdown]
# Reserving the maximum length leaves most of the memory empty, and so runs few requests
# at once; reserving each request's own worst case helps, but the unused part of
# `max_tokens` and the holes between regions still waste a large share. Paging wastes at
# most one partly filled block per request, runs the most requests at once (the means
# printed above) and finishes the workload in the fewest steps, even though it sometimes
# has to preempt. The vLLM paper (Kwon et al., SOSP 2023) measured the same effect in
# earlier serving systems, where only 20.4% to 38.2% of the KV memory held tokens (its
# introduction and Figure 2). The cost is indirection: attention reads keys through a
# block table instead of from one contiguous array, and the engine must preempt when the
# pool runs dry.
#
# ## Takeaways
#
# - A KV cache turns the quadratic cost of regenerating the past into one new token per
#   step; the price is memory.
# - Bytes per token = 2 x layers x KV heads x head dim x bytes per element: 128 KiB for
#   Llama-3-8B in bf16, 1 GiB for one 8192-token sequence. GQA divides it by the group size.
# - A paged cache hands out fixed-size blocks on demand; a block table per request maps
#   positions to blocks, and the slot mapping says where each new token's K and V go.
# - Paging removes almost all fragmentation, so more requests share the same memory (in
#   the simulation above, more than twice the share of memory held tokens than with
#   max-length reservations: the percentages are printed in section 5); running out of
#   blocks is a normal event the scheduler handles by preemption.
#
# **Exercises:** `exercises/03_kv_cache.ipynb`: blocks needed, how many requests a KV budget
# really admits, copy-on-write for requests that share blocks after a fork, and the tokens
# the model processes with and without a cache when a request is preempted, predicted
# before the engine measures them.
#
# **Next:** the cache lets a prompt be prefilled in pieces; chapter 4 proves that doing so
# gives exactly the same keys and values as one pass.
