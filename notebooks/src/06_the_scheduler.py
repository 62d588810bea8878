# %% [markdown]
# # Chapter 6: The scheduler
#
# **The question.** A server holds many requests at once: some are still reading their
# prompt, others are streaming tokens. Each step of the engine is one forward pass. Who
# gets how many tokens in that pass, and what does the choice do to the two numbers users
# feel, the wait for the first token (TTFT) and the rhythm of the tokens after it?
#
# **What you build.** You will run the engine proper: `minillm.LLMEngine`, which every
# step asks its `Scheduler` for a plan, packs the plan's prefill chunks and decodes into
# ONE forward pass, samples, and timestamps every token. You will read the three policies
# in the scheduler's real code, draw the trace of a run as a timeline, measure TTFT, TPOT
# and inter-token latency (ITL) per policy and chunk size on the long-prompt interference
# scenario, size chunks by their work instead of their tokens so that the last chunk stops
# being the streams' worst gap, watch a request get preempted and recomputed with its
# output unchanged, and map the knobs onto vLLM, SGLang, TensorRT-LLM and Sarathi-Serve. Along the way three
# claims of the source articles get checked against measurements.

# %% slideshow={"slide_type": "skip"}
import math
import statistics
import time

import matplotlib.pyplot as plt
import torch

import minillm
from minillm import metrics
from minillm.sim import workloads
from minillm.engine import EngineCore
from minillm.kv_cache import BlockManager
from minillm.model_runner import ModelRunner, StepChunk
from minillm.book.figures import plot_step_timeline, plot_token_gaps
from minillm.request import Request, SamplingParams
from minillm.scheduler import Scheduler, SchedulerConfig
from minillm.book.show import show_source
from minillm.chunk_sizing import equal_work_chunks, prefill_work
from minillm.config import ModelConfig

torch.manual_seed(0)
# One thread: this chapter times policies, not peak speed, and on a shared machine two
# threads of one process wait for each other at every operator while other processes
# hold the cores (each step then takes 10-100x longer); one thread only waits its turn.
torch.set_num_threads(1)
device = minillm.default_device()
model = minillm.build_model("tiny", seed=0, device=device)
print(f"model: {model.cfg.name}, {model.cfg.num_layers} layers, hidden {model.cfg.hidden_size}, on {device}")

# %% [markdown]
# ## 1. Continuous batching: schedule per step, not per request
#
# The oldest way to batch is per request: take a few requests, run them until the last
# one finishes, then take the next few. A request that wants 3 tokens waits for its
# neighbour that wants 30, and a newcomer waits for the whole batch. Continuous batching
# (Orca's *iteration-level scheduling*, OSDI 2022) decides again at every step: a request
# that finishes leaves at once and a waiting one takes its seat. Ten lines show the
# difference, counting steps only (every request decodes one token per step, batch of 2):

# %% slideshow={"slide_type": "subslide"}
def finish_steps(output_lens, batch_size, per_iteration):
    """Step at which each request finishes, batching per request or per iteration."""
    waiting, running, done, step = list(enumerate(output_lens)), [], {}, 0
    while waiting or running:
        if per_iteration or not running:                # request-level: refill only when empty
            while waiting and len(running) < batch_size:
                i, n = waiting.pop(0)
                running.append([i, n])
        step += 1
        for r in running:
            r[1] -= 1
        done.update({i: step for i, n in running if n == 0})
        running = [r for r in running if r[1] > 0]
    return [done[i] for i in range(len(output_lens))]

output_lens = [3, 30, 4, 5, 28, 2]
request_level = finish_steps(output_lens, batch_size=2, per_iteration=False)
iteration_level = finish_steps(output_lens, batch_size=2, per_iteration=True)
print("request-level:  ", request_level, "mean", sum(request_level) / len(request_level))
print("iteration-level:", iteration_level, "mean", sum(iteration_level) / len(iteration_level))
assert sum(iteration_level) < sum(request_level) and max(iteration_level) <= max(request_level)

# %% [markdown]
# The short requests stuck behind a 30-token neighbour finish far later under
# request-level batching. The engine's loop is iteration-level by construction: `step()`
# asks the scheduler for a fresh plan every time, runs it, appends one token to each
# request that completed its tokens, and retires the finished ones. Here is the real
# code (`EngineCore` is shared by the real engine and the simulator; only `executor`
# and `clock` differ):

# %% slideshow={"slide_type": "subslide"}
show_source(EngineCore.step)

# %% [markdown]
# Three details to notice. A step is a list of `(request, num_new_tokens)`: a decode is a
# request with one new token, a prefill chunk one with many, and both go through the same
# `executor.execute` call, one forward pass over the packed tokens. A request is sampled
# only when the step computes its last missing token (`emits_token`), so a prompt split into
# chunks gets its first token from its last chunk. And every token is stamped with the
# step's `end` time: that is all TTFT, TPOT and ITL need.
#
# **The packed step, drawn.** What does "one forward pass over the packed tokens" hold?
# Take one mixed step: request A brings a 6-token prefill chunk over 10 tokens it
# already cached, B and C bring one decode token each (7 and 3 cached). The model runner
# concatenates their new tokens into one row and builds, per token, its **position**
# (where it sits in its own sequence, for RoPE) and its **slot** (where its K and V go
# in the paged cache: block `table[pos // block_size]`, offset `pos % block_size`), and
# per request its cached and new lengths and block table. Varlen attention kernels take
# the boundaries as cumulative sums, `cu_seqlens_q` over the new tokens and
# `cu_seqlens_k` over the whole sequences (nano-vllm's `prepare_prefill` builds the
# same arrays). The engine's packing code:

# %%
show_source(ModelRunner.prepare)

# %%
blocks_demo = BlockManager(num_blocks=12, block_size=4)
for rid, num_tokens in [("A", 8), ("B", 8), ("C", 4), ("A", 16)]:   # A grows after B and C took blocks
    blocks_demo.allocate(rid, num_tokens)
runner_demo = ModelRunner(model, blocks_demo)
step_demo = [StepChunk("A", [65, 66, 67, 68, 69, 70], 10),
             StepChunk("B", [98], 7), StepChunk("C", [99], 3)]
token_ids, positions, batch, logits_rows = runner_demo.prepare(step_demo)
cu_seqlens_q = [0]
cu_seqlens_k = [0]
for q_len, seq_len in zip(batch.query_lens, batch.seq_lens):
    cu_seqlens_q.append(cu_seqlens_q[-1] + q_len)
    cu_seqlens_k.append(cu_seqlens_k[-1] + seq_len)
owners = [c.request_id for c in step_demo for _ in c.token_ids]
rows = {"request": owners, "token id": token_ids.tolist(), "position": positions.tolist(),
        "slot": batch.slot_mapping.tolist()}

fig, (ax_tok, ax_req) = plt.subplots(1, 2, figsize=(12, 2.6), width_ratios=[3, 2], layout="constrained")
colors = {"A": "#fdd0a2", "B": "#c6dbef", "C": "#c7e9c0"}
for i, (name, values) in enumerate(rows.items()):
    for j, value in enumerate(values):
        ax_tok.add_patch(plt.Rectangle((j, -i), 1, 1, facecolor=colors[owners[j]], edgecolor="white"))
        ax_tok.text(j + 0.5, -i + 0.5, str(value), ha="center", va="center", fontsize=9)
    ax_tok.text(-0.2, -i + 0.5, name, ha="right", va="center", fontsize=9)
ax_tok.set_xlim(-2.2, len(owners)); ax_tok.set_ylim(-3, 1); ax_tok.axis("off")
ax_tok.set_title(f"per token (T = {len(owners)}): the packed row the model sees", fontsize=10)
ax_req.axis("off")
table = ax_req.table(
    cellText=[[rid, n, c, c + n, str(t)] for rid, n, c, t in
              zip("ABC", batch.query_lens, batch.cached_lens, batch.block_tables)]
             + [["cu_seqlens_q", str(cu_seqlens_q), "", "cu_seqlens_k", str(cu_seqlens_k)]],
    colLabels=["request", "new", "cached", "seq len", "block table"], loc="center", cellLoc="center")
table.auto_set_font_size(False); table.set_fontsize(9)
ax_req.set_title("per request: lengths and block tables (block size 4)", fontsize=10)
fig.suptitle("One mixed step: a 6-token chunk over 10 cached tokens and two decodes, packed in one row")
plt.show()

# %%
for token, (rid, pos, slot) in enumerate(zip(owners, rows["position"], rows["slot"])):
    table_ = blocks_demo.block_tables[rid]
    assert slot == table_[pos // 4] * 4 + pos % 4            # block, then offset in the block
assert rows["position"] == list(range(10, 16)) + [7, 3]
assert cu_seqlens_q == [0, 6, 7, 8] and cu_seqlens_k == [0, 16, 24, 28]
assert logits_rows.tolist() == [5, 6, 7]                     # the last new token of each request

# %% [markdown]
# Read one column: token 68 is A's position 13, so it lands in A's block
# `table[13 // 4] = table[3]` at offset 1. A's blocks are not contiguous (B and C took
# blocks while A was growing), and nothing needs them to be: the slot mapping and the
# block table carry the indirection. The logits are taken only at each request's last
# new token (rows 5, 6 and 7), where the next token is sampled.
#
# ## 2. Three policies, one function each
#
# The scheduler is pure Python (no torch, no clock: a test asserts it), so the same code
# drives the real engine here and the simulator in chapter 7. `schedule()` dispatches on
# the policy:

# %% slideshow={"slide_type": "subslide"}
show_source(Scheduler.schedule)

# %% [markdown] slideshow={"slide_type": "subslide"}
# * **`prefill_first`**: when prompts wait, the step runs them whole (as many as the token
#   budget allows, at least one) and the running decodes wait. Best TTFT for the newcomer;
#   every stream stalls for the whole prefill.
# * **`decode_first`**: a prompt is admitted only when nothing is decoding. Streams never
#   stall, but a newcomer waits for every stream to finish: request-level batching again.
# * **`chunked`**: *stall-free batching* (Sarathi-Serve, OSDI 2024; its history in
#   section 10). Every running decode
#   gets its one token first; then prompts, first come first served, get prefill tokens
#   until the step holds `chunk_size` of them or reaches `token_budget`. A prompt that
#   does not fit is split and continues next step. A step is therefore
#   `C_prefill + N_decode` tokens with `C_prefill <= chunk_size`: the articles' `T = C + N`.
# * **`chunked_prefill_first`**: prompts chunked as under `chunked`, but a step with prompt
#   tokens carries no decodes (SGLang's default; chapter 7, section 3.2 measures it).

# %% slideshow={"slide_type": "subslide"}
show_source(Scheduler._schedule_chunked)

# %% [markdown]
# The KV cache enters through `_tokens_that_fit` and `_make_room`: a chunk is cut short
# when the free blocks cannot hold it, and a request is preempted when even one token
# does not fit (section 9). Without memory pressure the policy is a few lines of
# arithmetic; exercise 1 asks you to write it as a pure function.
#
# Watch the scheduler alone split the articles' example, a 2048-token prompt in
# 512-token chunks. We call `schedule()` and advance the request's counter by hand, as
# the engine would after the forward pass:

# %% slideshow={"slide_type": "subslide"}
def chunk_ranges(prompt_len, chunk_size):
    scheduler = Scheduler(SchedulerConfig(policy="chunked", chunk_size=chunk_size),
                          BlockManager(num_blocks=prompt_len // 16 + 1, block_size=16))
    request = Request(0, None, SamplingParams(), arrival_time=0.0, prompt_len=prompt_len)
    scheduler.add(request)
    ranges = []
    while request.num_computed_tokens < prompt_len:
        (scheduled, n), = scheduler.schedule().scheduled
        ranges.append((request.num_computed_tokens, request.num_computed_tokens + n - 1))
        request.num_computed_tokens += n
    return ranges

ranges = chunk_ranges(2048, 512)
for step, (first, last) in enumerate(ranges, 1):
    print(f"step {step}: tokens {first}-{last}")
assert ranges == [(0, 511), (512, 1023), (1024, 1535), (1536, 2047)]

# %% [markdown]
# One of the articles' iteration diagrams labels the third chunk "tokens 1023-1535";
# that would compute token 1023 twice and make the chunk 513 tokens long. The chunks
# tile the prompt: the third is **1024-1535**.
#
# ## 3. The interference scenario on the real engine
#
# Four streams are decoding when a 1024-token prompt arrives
# (`workloads.long_prompt_interference`; the decoders are tagged `"decoder"`, the prompt
# `"long"`). The streams keep decoding well past the prompt's first token, so their
# token gaps show whatever stall it causes. We run it under every policy, and under
# `chunked` with four chunk sizes. All runs are greedy, so they must also produce the
# same tokens (section 8).

# %% slideshow={"slide_type": "subslide"}
workload = workloads.long_prompt_interference(prompt_len=1024, num_decoders=4, decoder_output_len=40,
                                              long_output_len=8)
print(workload.description, workload.params)
CHUNK_SIZES = (64, 128, 256, 512)
CONFIGS = [("prefill_first", None), ("decode_first", None)] + [("chunked", c) for c in CHUNK_SIZES]

def label(policy, chunk_size):
    return policy if chunk_size is None else f"chunked C={chunk_size}"

def serve(policy, chunk_size=None, num_blocks=128, chunk_sizing="fixed"):
    sched = SchedulerConfig(policy=policy, chunk_size=chunk_size or 512, max_num_seqs=8,
                            chunk_sizing=chunk_sizing)
    engine = minillm.LLMEngine(model, sched, block_size=16, num_blocks=num_blocks)
    return engine, engine.run_workload(workload)

# Warm-up: the first forward passes pay one-off allocation costs; keep them out of the timings.
_ = minillm.LLMEngine(model, SchedulerConfig(max_num_seqs=2), num_blocks=16).generate(
    [[1] * 100, [2] * 8], SamplingParams(max_tokens=4, ignore_eos=True))

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
runs = {}
for policy, chunk_size in CONFIGS:
    t0 = time.perf_counter()
    runs[label(policy, chunk_size)] = serve(policy, chunk_size)
    engine, _ = runs[label(policy, chunk_size)]
    print(f"{label(policy, chunk_size):16s} {len(engine.trace):3d} steps, {time.perf_counter() - t0:.1f} s")

# %% [markdown]
# **The trace.** `engine.trace` records every step: when it started and ended and which
# request got how many tokens. The steps right after the long prompt arrives, under
# `prefill_first` and under `chunked` with C = 128 (request 4 is the long prompt):

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
def long_request(outputs):
    return next(o for o in outputs if o.tag == "long")

def steps_around_arrival(label_, count):
    engine, outputs = runs[label_]
    arrival = long_request(outputs).metrics.arrival_time
    first = next(i for i, r in enumerate(engine.trace) if r.start >= arrival)
    return engine.trace[first - 1:first - 1 + count]

for name in ("prefill_first", "chunked C=128"):
    print(name)
    for record in steps_around_arrival(name, 5 if name == "prefill_first" else 10):
        print(f"   prefill {record.num_prefill_tokens:4d} + decode {record.num_decode_tokens}   "
              f"scheduled {record.scheduled}")

pf_trace = runs["prefill_first"][0].trace
stall = next(r for r in pf_trace if r.num_prefill_tokens == 1024)
assert stall.num_decode_tokens == 0 and stall.scheduled == [(4, 1024)]
for c in CHUNK_SIZES:
    trace = runs[f"chunked C={c}"][0].trace
    assert max(r.num_prefill_tokens for r in trace) <= c
    long_steps = [r for r in trace if any(rid == 4 and n > 1 for rid, n in r.scheduled)]
    assert len(long_steps) == math.ceil(1024 / c) and all(r.num_decode_tokens == 4 for r in long_steps)

# %% [markdown]
# Under `prefill_first` the prompt's step holds 1024 prefill tokens and no decode: all
# four streams sit out. Under `chunked` the prompt goes in `1024 / 128 = 8` chunks and
# every one of those steps also carries the four decodes. Drawn against time, with each
# bar as wide as its step lasted (`minillm.figures.plot_step_timeline`), on an axis that
# is linear up to 8 tokens and logarithmic above, so that the four decode tokens (blue)
# show next to a thousand prefill tokens (red): under `prefill_first` the blue band has
# a hole exactly where the wide red step is.

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
# NBVAL_IGNORE_OUTPUT
fig, axes = plt.subplots(1, 2, figsize=(12, 3.4), layout="constrained", sharey=True)
for ax, name in zip(axes, ("prefill_first", "chunked C=128")):
    engine, outputs = runs[name]
    trace = engine.trace
    widest = max(trace, key=lambda r: r.duration)
    plot_step_timeline(trace, ax=ax, x="time",
                       title=f"{name}: longest step {widest.duration * 1e3:.0f} ms "
                             f"({widest.num_prefill_tokens} prefill + {widest.num_decode_tokens} decode)")
    # 4 decode tokens next to 1024 prefill tokens: linear up to 8 tokens, logarithmic above,
    # so the blue decode band stays visible under every chunk.
    ax.set_yscale("symlog", linthresh=8)
    ax.set_ylabel("tokens in the step (symlog)")
fig.suptitle("One 1024-token step stalls every stream; 128-token chunks keep steps short")
plt.show()

# %% [markdown]
# ## 4. TTFT, TPOT and ITL per policy and chunk size
#
# From the token timestamps (the benchmarks' conventions, `minillm.metrics`):
# **TTFT** = first token - arrival; **TPOT** = (E2E - TTFT) / (output tokens - 1), one
# *mean* gap per request; **ITL** = every gap between consecutive tokens. For the long
# prompt TTFT is what matters; for the streams, the gaps.
#
# One run on a shared machine is one sample: another process can take the CPU in the
# middle of any step. So every configuration runs three times (the runs above are the
# first round), in a rotating order within each round so that a burst of load hits
# every configuration alike, and the table prints each quantity's **median over the
# rounds with its spread** [min-max]. Two columns are counts, not times, and come out
# the same in every round: the forward passes from the long prompt's arrival to its
# first token, and the largest step a stream waits through (its tokens).

# %% tags=["slides-hide-input"]
# NBVAL_IGNORE_OUTPUT
ROUNDS = 3

def run_measures(engine, outputs):
    """One run's times (seconds) and counts (exact)."""
    decoders = [o for o in outputs if o.tag == "decoder"]
    long_m = long_request(outputs).metrics
    streams_done = max(o.metrics.finish_time for o in decoders)
    waited = [r for r in engine.trace if r.start >= long_m.arrival_time and r.end <= long_m.first_token_time]
    return dict(ttft_long=long_m.ttft, tpot=statistics.mean(o.metrics.tpot for o in decoders),
                itl_max=max(g for o in decoders for g in o.metrics.itl),
                itl_median=statistics.median(g for o in decoders for g in o.metrics.itl),
                passes=len(waited),
                largest_step=max(r.num_prefill_tokens + r.num_decode_tokens for r in engine.trace
                                 if long_m.arrival_time <= r.start and r.end <= streams_done))

rounds = {name: [run_measures(*run)] for name, run in runs.items()}
for r in range(1, ROUNDS):
    for policy, chunk_size in CONFIGS[r:] + CONFIGS[:r]:                # rotate the order
        rounds[label(policy, chunk_size)].append(run_measures(*serve(policy, chunk_size)))

def median_spread(name, key, scale=1e3):
    values = [m[key] * scale for m in rounds[name]]
    return statistics.median(values), min(values), max(values)

results = {name: {key: median_spread(name, key)[0] / 1e3 for key in ("ttft_long", "tpot", "itl_max", "itl_median")}
           for name in rounds}
print(f"medians of {ROUNDS} rounds [min-max], ms   passes  largest step  "
      f"{'long TTFT':>15s}  {'streams mean TPOT':>17s}  {'streams max ITL':>15s}")
for name, ms in rounds.items():
    cells = ["{:5.0f} [{:.0f}-{:.0f}]".format(*median_spread(name, "ttft_long")),
             "{:5.1f} [{:.1f}-{:.1f}]".format(*median_spread(name, "tpot")),
             "{:5.0f} [{:.0f}-{:.0f}]".format(*median_spread(name, "itl_max"))]
    print(f"{name:36s} {ms[0]['passes']:6d} {ms[0]['largest_step']:13d}  "
          f"{cells[0]:>15s}  {cells[1]:>17s}  {cells[2]:>15s}")

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
# NBVAL_IGNORE_OUTPUT
names = list(rounds)

def bars(ax, offsets, key, **style):
    med = [median_spread(n, key) for n in names]
    ax.bar(offsets, [m for m, _, _ in med], yerr=[[m - lo for m, lo, _ in med], [hi - m for m, _, hi in med]],
           capsize=3, **style)

x = range(len(names))
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 3.6), layout="constrained")
bars(ax1, list(x), "ttft_long", color="#d62728")
ax1.set_ylabel("TTFT of the 1024-token prompt (ms)")
ax1.set_title(f"Long prompt's TTFT: {rounds['prefill_first'][0]['passes']} pass under prefill_first, "
              f"{rounds['chunked C=64'][0]['passes']} at C=64", fontsize="medium")
bars(ax2, [i - 0.2 for i in x], "tpot", width=0.4, label="mean TPOT")
bars(ax2, [i + 0.2 for i in x], "itl_max", width=0.4, label="max ITL")
ax2.set_yscale("log")
ax2.set_ylabel("streams' token gap (ms, log)")
ax2.set_title("The worst gap follows the largest step; mean TPOT barely moves")
ax2.legend()
for ax in (ax1, ax2):
    ax.set_xticks(list(x), names, rotation=30, ha="right")
fig.suptitle(f"Medians of {ROUNDS} rounds, bars from the fastest to the slowest round")
plt.show()

# %% [markdown]
# Read the table by what holds in every round, strongest first.
#
# * **The worst gap follows the largest step.** A stream's longest gap is the longest
#   step it waits through: the whole 1024-token prefill under `prefill_first`, one chunk
#   plus the four decodes under `chunked` (the `largest step` column, exact), a decode
#   step under `decode_first`. The max ITL falls with the chunk size by the same
#   factors, several-fold from `prefill_first` to C=64, far more than any round's
#   spread: smaller chunks, smaller worst gap.
# * **Smaller chunks, later first token.** The long prompt waits through one pass under
#   `prefill_first` and 1024/C under `chunked` (the `passes` column, exact); each extra
#   pass carries the decodes and pays a pass's fixed price. At C=64 (16 passes) the
#   TTFT is clearly later than `prefill_first`'s; at C=256 and C=512 (4 and 2 passes)
#   the medians sit within a few tens of percent of it and of each other, which a loaded
#   machine's spread can cover: the table does not order those three, the pass count
#   does (section 6 counts the work exactly).
# * **Mean TPOT is not where chunking shows.** Each stream waits through all 1024 prompt
#   tokens either way, in one gap under `prefill_first` or spread over 1024/C gaps under
#   `chunked`, so the streams' mean TPOT comes out about the same under both (either a
#   little ahead, depending on the run: the extra passes add their price to the wait,
#   the decodes riding in the chunk steps save some steps; the spreads overlap), and
#   far above `decode_first`'s, whose streams never wait on a prompt. Chunking changes how the wait is cut up, not its sum:
#   section 5 shows why the mean hides that.
# * `decode_first` makes the prompt wait until every stream has finished: its pass count
#   is the streams' remaining steps plus the prefill.
#
# On a CPU a forward pass costs a fixed part plus a part per token (chapter 0 measured
# both), and a 1024-token pass is many times a decode step, so the stall is large. On a
# GPU the tiny model is far too small to keep the chip busy (every step costs about the
# same few kernel launches), so the stall all but disappears there; chapter 7's simulator
# shows it at the scale of an 8B model. What no load can move is the counts and the order
# of the steps that make the times, so that is what we check, on every device: the passes
# and the largest step are the same in every round; `decode_first` serves the prompt
# only after every stream has finished, the other policies while the streams are still
# decoding; and under `decode_first` no step carries prompt tokens while a stream is
# waiting for its next token, so its worst gap is a decode step. On this CPU the worst
# gaps also differ by so much that we check their order: `prefill_first`'s median is
# several times C=64's.

# %% slideshow={"slide_type": "skip"}
def streams_done(name):
    return max(o.metrics.finish_time for o in runs[name][1] if o.tag == "decoder")

for name, (engine, outputs) in runs.items():
    prompt_steps = [r for r in engine.trace if any(rid == 4 and n > 1 for rid, n in r.scheduled)]
    if name == "decode_first":
        assert min(r.start for r in prompt_steps) >= streams_done(name)       # the prompt waited
        streams_decoding = min(o.metrics.first_token_time for o in outputs if o.tag == "decoder")
        assert all(r.num_prefill_tokens == 0 for r in engine.trace
                   if streams_decoding <= r.start < streams_done(name))          # no step stalls a stream
    else:
        assert long_request(outputs).metrics.first_token_time < streams_done(name), name
for name, ms in rounds.items():                     # counts: the same in every round
    assert len({(m["passes"], m["largest_step"]) for m in ms}) == 1, name
    if name.startswith("chunked"):
        c = int(name.split("=")[1])
        assert (ms[0]["passes"], ms[0]["largest_step"]) == (1024 // c, c + 4), name
assert (rounds["prefill_first"][0]["passes"], rounds["prefill_first"][0]["largest_step"]) == (1, 1024)
assert rounds["decode_first"][0]["largest_step"] == 4                  # decodes only
if device.type == "cpu":                            # a 1024-token step against a 68-token one
    assert results["prefill_first"]["itl_max"] > 3 * results["chunked C=64"]["itl_max"]

# %% [markdown]
# ## 5. Mean TPOT is not the stall: look at the ITL
#
# One article says the streams' "TPOT jumps from 5 to 205 ms" during a prefill. In
# benchmark terms that is an **ITL spike**: one gap is 205 ms, the others stay at 5 ms.
# TPOT is a per-request *mean* over its n-1 gaps, so a stall of S seconds adds
# **S/(n-1)** to it: 200 ms over a 1000-token answer adds 0.2 ms, over a 10-token answer
# 22 ms. Our streams make n = 40 tokens; under `prefill_first` one gap of each holds the
# whole 1024-token prefill:

# %% tags=["slides-hide-input"]
# NBVAL_IGNORE_OUTPUT
fig, axes = plt.subplots(1, 2, figsize=(12, 3.4), layout="constrained", sharey=True)
for ax, name in zip(axes, ("prefill_first", "chunked C=128")):
    r = rounds[name][0]                                 # the run drawn: the first round
    plot_token_gaps(runs[name][1], tag="decoder", ax=ax,
                    title=f"{name}: mean TPOT {r['tpot'] * 1e3:.0f} ms, max ITL {r['itl_max'] * 1e3:.0f} ms")
fig.suptitle("The stall is one spike per stream: all of it in max ITL, S/(n-1) of it in mean TPOT")
plt.show()

# %% slideshow={"slide_type": "fragment"}
pf = results["prefill_first"]
spike_ratio = pf["itl_max"] / pf["tpot"]
print(f"prefill_first: max ITL / mean TPOT = {spike_ratio:.1f}; "
      f"median gap {pf['itl_median'] * 1e3:.0f} ms vs max {pf['itl_max'] * 1e3:.0f} ms")
# Each stream has exactly one gap that spans the prefill step: the spike is one gap, not a trend.
for o in (o for o in runs["prefill_first"][1] if o.tag == "decoder"):
    spanning = [i for i, (a, b) in enumerate(zip(o.metrics.token_times, o.metrics.token_times[1:]))
                if a <= stall.start and b >= stall.end]
    assert len(spanning) == 1
if device.type == "cpu":
    assert spike_ratio > 3

# %%
# NBVAL_IGNORE_OUTPUT
# The S/(n-1) rule, per stream: its usual gap (median) plus its one stall spread over n-1 gaps.
for o in (o for o in runs["prefill_first"][1] if o.tag == "decoder"):
    gaps = o.metrics.itl
    usual, spike = sorted(gaps)[len(gaps) // 2], max(gaps)
    predicted = usual + (spike - usual) / len(gaps)
    print(f"stream {o.request_id}: n = {len(gaps) + 1}, usual gap {usual * 1e3:5.1f} ms, "
          f"stall {spike * 1e3:4.0f} ms -> predicted TPOT {predicted * 1e3:5.1f} ms, "
          f"measured {o.metrics.tpot * 1e3:5.1f} ms")
    # Exact whatever the load: TPOT is the mean gap, and the longest gap holds the whole stall step.
    assert abs(o.metrics.tpot - sum(gaps) / len(gaps)) < 1e-9 and spike >= stall.duration

# %% [markdown]
# The rule explains the table of section 4: with 40 tokens per stream the stall is
# diluted over 39 gaps, yet it still raises `prefill_first`'s mean TPOT well above
# `decode_first`'s. In long answers (hundreds of tokens) the same stall all but vanishes
# from the mean, in short ones it dominates it; the max ITL shows it either way. A
# benchmark that reports only mean TPOT cannot tell one frozen moment from every token
# being slower. That is why serving benchmarks (vLLM's
# `vllm bench serve`, formerly `benchmark_serving.py`, for one) print ITL percentiles next to TPOT, and why the goal of
# chunked prefill is stated in p99 and max ITL (or "tail TPOT"), not in mean TPOT.
#
# The same article models the jitter as "TPOT jitter ∝ C/N × FLOP_GEMM/FLOP_GEMV".
# Neither factor holds. Every stream in the step waits through the whole step, so more
# decoding streams N do not divide a chunk's delay: they add their N tokens to it (the
# step is `C + N` tokens). And a decode's GEMV is priced by the bytes it reads (every
# weight), not by its FLOPs (chapter 5), so a FLOP ratio is not a time ratio. What the
# table of section 4 shows is simpler: the worst gap is the time of the largest step,
# `C + N` tokens, and it grows with C.
#
# ## 6. Chunking does not lower the long prompt's own TTFT
#
# One article lists "TTFT can drop significantly" among chunked prefill's benefits. For
# the long prompt itself it cannot, compared with running the prompt whole: its first
# token needs all 1024 of its tokens computed either way (the same FLOPs, chapter 5),
# chunking spreads them over more forward passes, and each of those passes also computes
# the streams' decodes. Count the work between the prompt's arrival and its first token:

# %% slideshow={"slide_type": "subslide"}
def work_before_first_token(name):
    engine, outputs = runs[name]
    m = long_request(outputs).metrics
    steps = [r for r in engine.trace if r.start >= m.arrival_time and r.end <= m.first_token_time]
    return len(steps), sum(r.num_prefill_tokens + r.num_decode_tokens for r in steps)

for name in ["prefill_first"] + [f"chunked C={c}" for c in CHUNK_SIZES]:
    num_steps, num_tokens = work_before_first_token(name)
    print(f"{name:16s} {num_steps:2d} forward passes, {num_tokens} tokens computed before the first token")
    if name != "prefill_first":
        assert num_steps == math.ceil(1024 / int(name.split("=")[1])) and num_tokens > 1024
assert work_before_first_token("prefill_first") == (1, 1024)

# %% [markdown]
# More passes and more tokens: chunking can only make the long prompt's first token
# later than `prefill_first`'s. How much later depends on each pass's fixed cost
# (chapter 0 measures it on this CPU) and on how much less efficient a small pass is;
# small chunks pay the most passes.
#
# Against `decode_first` the count goes the other way round, and it decides who wins.
# Under `decode_first` the prompt waits for every stream's remaining steps and then runs
# whole; under `chunked` it waits for its 1024/C passes, each also carrying the decodes.
# Both compute the same 1024 prompt tokens, so what differs is the rest: the streams'
# remaining decode steps against the passes' extra price (the decodes they carry and the
# fixed price of each pass, about a decode step each here). **Chunking gives the
# newcomer its first token sooner than `decode_first` when the running streams have
# more steps left than the prompt needs passes**, and later when they are about to
# finish. We measure both cases: four streams with 4 or 96 steps left when the
# 1024-token prompt arrives, each configuration three times in rotating order, medians
# and their spread:

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
# NBVAL_IGNORE_OUTPUT
stream_prompts = [[(11 * i + k) % 256 for k in range(16)] for i in range(4)]
long_prompt = workload.prompt_ids(4, model.cfg.vocab_size)

def long_prompt_ttft(policy, chunk_size=None, steps_left=96):
    """(TTFT, passes waited) of the long prompt arriving while four streams have steps_left tokens to go."""
    sched = SchedulerConfig(policy=policy, chunk_size=chunk_size or 512, max_num_seqs=8)
    engine = minillm.LLMEngine(model, sched, block_size=16, num_blocks=128)
    for prompt in stream_prompts:
        engine.add_request(prompt, SamplingParams(max_tokens=1 + steps_left, ignore_eos=True))
    while not all(r.output_token_ids for r in engine.requests.values()):
        engine.step()                                # the four streams are decoding
    rid = engine.add_request(long_prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    passes = 0
    while not engine.requests[rid].output_token_ids:
        engine.step()
        passes += 1
    return engine.requests[rid].metrics.ttft, passes

TTFT_CONFIGS = [("decode_first", None, 4), ("chunked", 64, 4),
                ("prefill_first", None, 96), ("chunked", 256, 96), ("chunked", 64, 96), ("decode_first", None, 96)]
ttft_rounds = {cfg: [] for cfg in TTFT_CONFIGS}
for r in range(ROUNDS):
    for cfg in TTFT_CONFIGS[r:] + TTFT_CONFIGS[:r]:                       # rotate the order
        ttft_rounds[cfg].append(long_prompt_ttft(*cfg))

def ttft_ms(cfg):
    return [t * 1e3 for t, _ in ttft_rounds[cfg]]

def ratio_to(cfg, other):
    """Per-round ratio of two configurations' TTFTs (load hits both alike within a round)."""
    return [a / b for a, b in zip(ttft_ms(cfg), ttft_ms(other))]

for left in (4, 96):
    print(f"streams with {left} steps left   passes  long TTFT, ms: median [min-max]   "
          f"÷ decode_first's, per round: median [min-max]")
    df = ("decode_first", None, left)
    for cfg in (c for c in TTFT_CONFIGS if c[2] == left):
        t, q = ttft_ms(cfg), ratio_to(cfg, df)
        print(f"  {label(*cfg[:2]):27s} {ttft_rounds[cfg][0][1]:6d}  {statistics.median(t):10.0f} "
              f"[{min(t):.0f}-{max(t):.0f}]{'':14s}{statistics.median(q):5.2f} [{min(q):.2f}-{max(q):.2f}]")

# %% slideshow={"slide_type": "skip"}
# The passes are counts: the same in every round. decode_first waits for the streams' last
# step and then one whole prefill; chunked waits for 1024 / C passes whatever the streams do.
for (policy, c, left), measured in ttft_rounds.items():
    expected = {"prefill_first": 1, "decode_first": left + 1}.get(policy) or 1024 // (c or 1)
    assert {p for _, p in measured} == {expected}, (policy, c, left, measured)
assert 4 + 1 < 1024 // 64 < 96 + 1             # the rule's two cases: fewer steps left than passes, and more

# %% [markdown]
# Read the pass counts first, they are exact: `prefill_first` 1, C=256 4, C=64 16,
# `decode_first` the streams' steps left plus one. Then the medians (of three rounds:
# a shared machine's noise is in the printed spread). Against
# `prefill_first`, every chunk size comes later, clearly at C=64; C=256's 4 passes cost
# little more than one, and its median sits close to `prefill_first`'s, within what a
# loaded machine's spread can cover. Against `decode_first`, the rule decides: with 4
# steps left (5 waits against C=64's 16 passes) chunking gains nothing, `decode_first`
# serves the prompt as soon or sooner (the ratio of C=64 to it at or above 1, by a margin
# that moves with the machine); with 96 steps left (97 waits) every chunk size is well
# ahead and the ratio is far below 1. The printed spreads show how far the noise
# reaches; the pass counts are what the asserts hold.
#
# Why is a small chunk's pass more than its share of the prefill? Besides each pass's
# fixed price, the CPU's matrix library runs a product of 64 rows slower per row than
# one of 1024: same FLOPs, slower pace. `python -m minillm bench chunk-cost` times both.
# On a GPU, where each pass also has a fixed price and a 1024-token pass is no less
# efficient than a small one, chunked TTFT is above `prefill_first`'s as well (chapter
# 7's simulator shows it at the scale of an 8B model). The articles' own numbers say the
# same: a 2048-token prompt in 512-token chunks takes 4 passes instead of 1, each also
# carrying the decodes.
#
# So what chunking lowers is the TTFT of requests that would otherwise queue behind
# running streams (when those have more steps left than the prompt needs passes), and,
# under a stream of arrivals, of short prompts that no longer wait behind a long
# prefill. That is continuous batching plus a bounded step, not a faster prefill.
#
# Nor does it raise **offline throughput**, the tokens per second of a batch run flat
# out, although one article puts the gain at 1.5-3x. The same tokens are computed either
# way, in more passes. A vLLM maintainer says so in the project's tracker: chunked
# prefill "does not improve offline throughput"; its goal is throughput under a latency
# target (Kuntai Du, vllm-project/vllm#7604, August 2024). The simulator of chapter 7
# (deterministic: an H100's cost model on a virtual clock) serves 64 requests that all
# arrive at once (prompts 512-2048 tokens, answers 64-256) to Llama-3-8B, whole and in
# chunks:

# %% slideshow={"slide_type": "fragment"}
offline = workloads.poisson_mix(64, rate_per_s=float("inf"), prompt_len=(512, 2048), output_len=(64, 256), seed=1)
offline_tok_s = {name: minillm.simulate(offline, sched, model="llama-3-8b", hardware="H100-SXM")
                 .summary()["throughput_tok_s"]
                 for name, sched in [("prefill_first", SchedulerConfig(policy="prefill_first")),
                                     ("chunked C=2048", SchedulerConfig(policy="chunked", chunk_size=2048)),
                                     ("chunked C=512", SchedulerConfig(policy="chunked", chunk_size=512))]}
for name, tok_s in offline_tok_s.items():
    print(f"{name:15s} {tok_s:6.0f} output tokens/s (simulated H100)")
assert max(offline_tok_s.values()) == offline_tok_s["prefill_first"]      # chunking raised nothing

# %% [markdown]
# No chunk size beats running prompts whole when nobody waits for a first token: the
# chunked runs spread the same prompts over more passes, each paying its fixed price,
# and the smaller chunk pays the most. The articles' 1.5-3x is not a property of
# chunking; a gain of that kind comes from comparing against a scheduler that batched
# worse (request-level batching, section 1), or from serving more requests within a
# latency target.
#
# ## 7. Equal tokens are not equal work: the last chunk is the worst gap
#
# Every chunk of the C = 128 run holds 128 tokens, but they do not cost the same. A
# chunk's matmuls cost the same wherever it sits; its attention does not: the chunk that
# starts at token s attends to s cached keys besides its own. The streams wait through
# every chunk step, so the gap they feel is set by the slowest one, and that is the
# *last* chunk, which attends to the whole prompt before it. The chunk steps of the run
# of section 3, as timed:

# %% slideshow={"slide_type": "subslide"}
# NBVAL_IGNORE_OUTPUT
def chunk_steps(run):
    """(prefill tokens, cached tokens before the chunk, seconds) of the long prompt's steps."""
    engine, outputs = run
    rid = long_request(outputs).request_id
    steps, cached = [], 0
    for record in engine.trace:
        n = dict(record.scheduled).get(rid, 0)
        if n > 1:
            steps.append((n, cached, record.duration))
            cached += n
    return steps

for n, cached, seconds in chunk_steps(runs["chunked C=128"]):
    print(f"chunk of {n} tokens after {cached:4d} cached: {seconds * 1e3:5.1f} ms")

# %% [markdown]
# How much more should the last chunk cost? Count a token's work in one unit: its
# matmuls are worth `break_even` query-key pairs, where `break_even` is the cached
# length at which a token's attention FLOPs equal its matmul FLOPs
# (`ModelConfig.attention_break_even_len`: 2 FLOPs per weight against 4 per query head
# dimension and key). Then the tokens [s, s+n) cost n(break_even + s) + n(n+1)/2, exactly
# (`minillm.chunk_sizing.prefill_work`):

# %% slideshow={"slide_type": "subslide"}
show_source(prefill_work)
K = model.cfg.attention_break_even_len
fixed_work = [prefill_work(128 * i, 128, K) for i in range(8)]
print(f"break-even length of '{model.cfg.name}': {K} cached tokens")
print(f"work of the 8 fixed chunks, relative to the first: "
      + ", ".join(f"{w / fixed_work[0]:.2f}" for w in fixed_work))
assert fixed_work == sorted(fixed_work) and sum(fixed_work) == prefill_work(0, 1024, K)

# %% [markdown]
# The fix follows: keep the number of chunks (so the long prompt pays the same number of
# steps, each with its fixed price), but put the boundaries where the *work* is split
# evenly: early chunks longer than C, late ones shorter. That is
# `SchedulerConfig(chunk_sizing="equal_work")`. The scheduler plans a prompt's chunks when
# its prefill starts and, for chunks of 8 KV blocks or more, rounds each boundary to a block:

# %% slideshow={"slide_type": "subslide"}
planned = equal_work_chunks(1024, 128, K, align=16)
starts = [sum(planned[:i]) for i in range(len(planned))]
print("equal-work chunks:", planned)
print("their work, relative to the first:",
      ", ".join(f"{prefill_work(s, n, K) / prefill_work(0, planned[0], K):.2f}" for s, n in zip(starts, planned)))
runs["chunked C=128, equal work"] = serve("chunked", 128, chunk_sizing="equal_work")
equal_steps = chunk_steps(runs["chunked C=128, equal work"])
assert [n for n, _, _ in equal_steps] == planned and len(planned) == 1024 // 128

# %% [markdown]
# Here the last fixed chunk does only 30% more work than the first, and boundaries on
# 16-token blocks leave the equal-work chunks within 11% of each other (0.97-1.08 of the
# first chunk's work, printed above), so the timed steps
# would differ by less than a shared CPU's noise. Double the prompt (2048 tokens in chunks
# of 256, the README's race, where the last fixed chunk does 58% more work than the first),
# race the two sizings three times, interleaved, and keep each chunk step's fastest time
# (the one least disturbed by other processes):

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
longer = workloads.long_prompt_interference(prompt_len=2048, num_decoders=4, decoder_output_len=24,
                                            long_output_len=2)

def race(sizing):
    sched = SchedulerConfig(policy="chunked", chunk_size=256, max_num_seqs=8, chunk_sizing=sizing)
    engine = minillm.LLMEngine(model, sched, block_size=16, num_blocks=256)
    return engine, engine.run_workload(longer)

fastest = {"fixed": None, "equal_work": None}
for _ in range(3):
    for sizing in fastest:
        seconds = [t for _, _, t in chunk_steps(race(sizing))]
        fastest[sizing] = seconds if fastest[sizing] is None else list(map(min, fastest[sizing], seconds))
last_over_first = prefill_work(1792, 256, K) / prefill_work(0, 256, K)
print(f"work of the last 256-token chunk against the first: x{last_over_first:.2f}")
assert round(last_over_first - 1, 2) == 0.58                                  # quoted above
for sizing, seconds in fastest.items():
    print(f"{sizing:10s} chunk steps (ms): " + " ".join(f"{t * 1e3:5.1f}" for t in seconds)
          + f"   slowest {max(seconds) * 1e3:5.1f}, all {sum(seconds) * 1e3:4.0f}")

# %% [markdown]
# Same number of steps, and flatter ones: the fixed chunks' steps climb with the prefix,
# the equal-work ones stay level, so the slowest step, the streams' worst gap, moves
# toward the average while the total work stays the same (the timed totals differ by
# the race's noise). The gain grows with the prompt
# against the break-even length. One sitting on a shared CPU is still one sample:
# `python -m minillm bench interference` races both sizings over rounds (`docs/chunk-cost.md`
# has its runs: the slowest of eight steps 11-17% lower on three shapes).
#
# Is the FLOP count the right weight on a CPU? Time one 256-token chunk with nothing cached
# and one after 1,792 cached tokens, and a one-token step for the fixed part: the two chunks
# then give the break-even length this CPU shows (`bench_break_even`, which `python -m
# minillm bench chunk-cost` prints for three shapes):

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
from minillm.book.bench import bench_break_even

break_even = bench_break_even(model, chunk=256, num_cached=1792)
measured_over_flops = break_even["measured"] / break_even["flops"]
print(f"break-even length of '{model.cfg.name}' on this machine: {break_even['measured']:.0f} cached tokens "
      f"(by the FLOPs: {break_even['flops']}), x{measured_over_flops:.2f}")
print("above the FLOP count: in this run attention cost less per FLOP than the matmuls" if measured_over_flops > 1
      else "below the FLOP count: in this run attention cost more per FLOP than the matmuls")

# %% [markdown]
# Read the direction off the two printed lines. A measured break-even *above* the FLOP
# count means that it takes more cached keys than the FLOPs say before a token's attention
# costs as much time as its matmuls: attention ran faster per FLOP than the matmuls; *below*
# means the opposite. The result moves with the machine and the run, by tens of percent
# either way: one earlier build of this chapter printed 3,213 against 2,944 cached tokens
# (9% above), the runs of `docs/chunk-cost.md` (2026-12-01) came out 10-16% below on
# three shapes. The FLOP count sits inside that spread, which is why the engine keeps
# it as the default; `break_even_len=` sets a measured one.
#
# Real engines: Sarathi-Serve's scheduler has a dynamic chunking schedule
# (`enable_dynamic_chunking_schedule` in `sarathi/core/scheduler/sarathi_scheduler.py`:
# chunk sizes step down from `high_chunk_size` to `low_chunk_size` as the prompt's
# processed tokens grow; off by default, and its benchmark README calls it experimental); SGLang's `--enable-dynamic-chunking` (off by default, for
# pipeline parallelism, where unequal chunks leave pipeline stages idle) sizes chunks "based
# on fitted function to maintain consistent execution time across chunks" (its help text in
# `python/sglang/srt/arg_groups/fields/schedule.py`; `server_args.py` before 0.5.20). vLLM's scheduler budgets tokens
# (`max_num_batched_tokens`), as `chunk_sizing="fixed"` does.
#
# Where attention dominates, the gain is large: a small model over a long context. The
# simulator (chapter 7) runs the same scheduler with step times from a cost model of an
# H100, on a virtual clock, so this comparison is exact and repeatable: Qwen3-0.6B, a
# 32,000-token prompt arriving among 8 decoding streams, in chunks of 2048 tokens.

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
# NBVAL_IGNORE_OUTPUT
qwen = ModelConfig.preset("qwen3-0.6b")
long_context = workloads.long_prompt_interference(prompt_len=32_000, num_decoders=8)
simulated = {sizing: minillm.simulate(long_context, SchedulerConfig(chunk_size=2048, chunk_sizing=sizing),
                                      model=qwen, hardware="H100-SXM")
             for sizing in ("fixed", "equal_work")}

def simulated_chunk_steps(result):
    rid = long_request(result.outputs).request_id
    return [r.duration for r in result.trace if dict(r.scheduled).get(rid, 0) > 1]

fig, ax = plt.subplots(figsize=(8, 3.2), layout="constrained")
for sizing, result in simulated.items():
    steps_ms = [t * 1e3 for t in simulated_chunk_steps(result)]
    ax.plot(range(1, len(steps_ms) + 1), steps_ms, "o-", label=f"{sizing}: slowest {max(steps_ms):.1f} ms")
    print(f"{sizing:10s} {len(steps_ms)} chunk steps, {min(steps_ms):5.1f}-{max(steps_ms):5.1f} ms; "
          f"long TTFT {long_request(result.outputs).metrics.ttft * 1e3:4.0f} ms")
ax.set(xlabel="chunk of the 32,000-token prompt", ylabel="step time (ms, simulated H100)",
       title=f"Qwen3-0.6B (break-even length {qwen.attention_break_even_len}): "
             "equal tokens climb, equal work stays flat")
ax.legend()
plt.show()

# %% slideshow={"slide_type": "skip"}
fixed_sim, equal_sim = (simulated_chunk_steps(simulated[s]) for s in ("fixed", "equal_work"))
assert len(fixed_sim) == len(equal_sim) == math.ceil(32_000 / 2048)     # the same number of steps
assert max(equal_sim) < 0.8 * max(fixed_sim)                            # the slowest one much faster
assert max(equal_sim) / min(equal_sim) < 1.2 < max(fixed_sim) / min(fixed_sim)
ttft = {s: long_request(r.outputs).metrics.ttft for s, r in simulated.items()}
assert abs(ttft["equal_work"] / ttft["fixed"] - 1) < 0.05                # and the same TTFT

# %% slideshow={"slide_type": "fragment"}
llama_prompt = workloads.long_prompt_interference(prompt_len=8000, num_decoders=8)
slowest = {sizing: max(simulated_chunk_steps(minillm.simulate(
               llama_prompt, SchedulerConfig(chunk_size=1024, chunk_sizing=sizing),
               model="llama-3-8b", hardware="H100-SXM")))
           for sizing in ("fixed", "equal_work")}
gain = {"Qwen3-0.6B, 32,000 tokens": 1 - max(equal_sim) / max(fixed_sim),
        "Llama-3-8B, 8,000 tokens": 1 - slowest["equal_work"] / slowest["fixed"]}
for name, g in gain.items():
    print(f"{name}: equal work makes the slowest chunk step {g:.0%} faster")
assert 0 < gain["Llama-3-8B, 8,000 tokens"] < gain["Qwen3-0.6B, 32,000 tokens"]
# the numbers the next paragraph quotes
assert 3 < max(fixed_sim) / min(fixed_sim) < 8 and 0.25 < gain["Qwen3-0.6B, 32,000 tokens"] < 0.45
assert ModelConfig.preset("llama-3-8b").attention_break_even_len == 26_624

# %% [markdown]
# Sixteen steps either way and the same TTFT; the fixed chunks' steps climb several-fold
# as the prefix grows (the printed range), the equal-work ones stay flat, and the slowest
# step, which sets the streams' worst gap, drops by a third or more. On Llama-3-8B, whose break-even length (26,624) is far above an
# 8,000-token prompt, the same comparison moves the slowest step by much less: equal work
# matters where attention is a large part of the work.
#
# ## 8. Same tokens under every policy
#
# The policy decides *when* tokens are computed, never *what* they are: chunked prefill
# builds the same KV cache as a whole prefill (chapter 4). With greedy sampling every
# run must produce the same tokens for every request:

# %% slideshow={"slide_type": "fragment"}
reference = {o.request_id: o.output_token_ids for o in runs["prefill_first"][1]}
for name, (engine, outputs) in runs.items():
    assert {o.request_id: o.output_token_ids for o in outputs} == reference, name
print(f"{len(runs)} runs, {len(reference)} requests each: identical greedy outputs")

# %% [markdown]
# ## 9. Preemption: out of KV blocks, recompute later
#
# Each running request holds KV blocks that grow with every token. When the pool runs
# dry, the scheduler preempts the newest running request not yet in this step: it frees
# its blocks, resets `num_computed_tokens` to 0 and puts it back at the head of the queue;
# later it recomputes its prompt *and* the tokens it already produced, then carries on
# (vLLM V1 does the same, by recomputation). The code:

# %% slideshow={"slide_type": "subslide"}
show_source(Scheduler._preempt)

# %% [markdown]
# Four requests of 40 + 24 tokens need 4 blocks of 16 each, 16 in all; give the engine
# 10. Each one fits alone (the engine refuses a request that could never fit), but not
# all four at once:

# %% slideshow={"slide_type": "subslide"}
prompts = [[(7 * i + 3 * k) % 256 for k in range(40)] for i in range(4)]
params = SamplingParams(max_tokens=24, ignore_eos=True)
sched = SchedulerConfig(policy="chunked", chunk_size=64, max_num_seqs=4)
tight = minillm.LLMEngine(model, sched, block_size=16, num_blocks=10)
roomy = minillm.LLMEngine(model, sched, block_size=16, num_blocks=64)
tight_outputs, roomy_outputs = tight.generate(prompts, params), roomy.generate(prompts, params)
preempted = [(step, rid) for step, r in enumerate(tight.trace) for rid in r.preempted]
print(f"tight pool: {len(tight.trace)} steps, {len(preempted)} preemptions of requests "
      f"{sorted({rid for _, rid in preempted})}, the first at step {preempted[0][0]}")
print(f"roomy pool: {len(roomy.trace)} steps, preemptions: {sum(len(r.preempted) for r in roomy.trace)}")
assert preempted and not any(r.preempted for r in roomy.trace)
assert [o.output_token_ids for o in tight_outputs] == [o.output_token_ids for o in roomy_outputs]
assert tight.block_manager.num_free_blocks == 10

# %% [markdown]
# The tight engine took more steps and produced exactly the same tokens, and every block
# came back to the pool. Where do the extra steps come from? Two effects are mixed: a
# small pool runs **fewer requests at once** (10 blocks hold two of these requests at
# full length, not four), and preempted requests **recompute** tokens they had already
# computed. To separate them, run a roomy pool limited to the same concurrency
# (`max_num_seqs=2`, no preemption possible), and count the recomputed tokens: every
# prefill token the tight engine computed beyond the four prompts.

# %%
two_at_a_time = minillm.LLMEngine(model, SchedulerConfig(policy="chunked", chunk_size=64, max_num_seqs=2),
                                  block_size=16, num_blocks=64)
two_outputs = two_at_a_time.generate(prompts, params)
recomputed_tokens = sum(r.num_prefill_tokens for r in tight.trace) - sum(len(p) for p in prompts)
mean_running = {name: sum(len(r.scheduled) for r in e.trace) / len(e.trace)
                for name, e in [("roomy", roomy), ("max 2 at a time", two_at_a_time), ("tight", tight)]}
steps = {"roomy": len(roomy.trace), "max 2 at a time": len(two_at_a_time.trace), "tight": len(tight.trace)}
for name in steps:
    print(f"{name:16s} {steps[name]:3d} steps, {mean_running[name]:.1f} requests per step on average")
print(f"of the tight pool's {steps['tight'] - steps['roomy']} extra steps, "
      f"{steps['max 2 at a time'] - steps['roomy']} come from running fewer requests at once and "
      f"{steps['tight'] - steps['max 2 at a time']} from preemption; it recomputed {recomputed_tokens} tokens")
assert [o.output_token_ids for o in two_outputs] == [o.output_token_ids for o in roomy_outputs]
assert steps["roomy"] < steps["max 2 at a time"] and recomputed_tokens > 0
assert steps["max 2 at a time"] - steps["roomy"] > steps["tight"] - steps["max 2 at a time"]

# %% [markdown]
# Most of the extra steps, here all of them, come from concurrency: with room for two
# requests, the four run two by two. Recomputation costs the tokens printed above, and
# they ride along in steps that run anyway (a chunk of recomputed prompt next to the
# other request's decode), so they add few steps or none. Preemption costs time, never
# correctness, which is why engines size the KV pool first and tune the rest after.
#
# ## 10. The same knobs in real engines
#
# | minillm | what it bounds | vLLM | SGLang | TensorRT-LLM |
# |---|---|---|---|---|
# | `policy="chunked"` | stall-free batching on/off | `enable_chunked_prefill`, on by default in V1 (decodes first, chunks fill the budget) | prompts are chunked by default (`--chunked-prefill-size`, -1 turns it off), but a step mixes a chunk with decodes only with `--enable-mixed-chunk`, **off** by default: its default steps are prefill-only or decode-only | `enable_chunked_prefill` in its LLM API (`enable_chunked_context` in the C++ executor), **off** by default |
# | `token_budget` (`C + N <= budget`) | all tokens of a step | `max_num_batched_tokens` | (`--max-prefill-tokens` caps a prefill batch) | `max_num_tokens`, default 8192 |
# | `chunk_size` (`C <= chunk_size`) | prefill tokens of a step | (the budget minus the decodes); `long_prefill_token_threshold` caps one request's chunk | `--chunked-prefill-size` | (the budget) |
# | `max_num_seqs` | requests in a step | `max_num_seqs` | `--max-running-requests` | `max_batch_size` |
#
# The ideas came in steps, each paper adding one:
#
# * **Orca** (Yu et al., OSDI 2022): *iteration-level scheduling*, a fresh batch every
#   step (section 1), with "selective batching" to run requests of different lengths in
#   one pass. A prompt still ran whole in one iteration.
# * **SARATHI** (Agrawal et al., arXiv 2308.16369, 2023): *chunked prefills*, a prompt
#   split into equal chunks, and *decode-maximal batching*, decodes piggybacked on each
#   chunk's step so that they ride on the weight read the chunk pays for (chapter 5).
# * **DeepSpeed-FastGen** (Microsoft, Nov 2023; blog in microsoft/DeepSpeed PR #4607,
#   paper arXiv 2401.08671): *Dynamic SplitFuse*, long prompts split and short ones
#   composed so that every forward pass holds about the same number of tokens, in a
#   product; vLLM's issue #1562 asked for the same.
# * **Sarathi-Serve** (Agrawal et al., *Taming Throughput-Latency Tradeoff in LLM
#   Inference with Sarathi-Serve*, OSDI 2024): *stall-free batching*, decodes first, then
#   chunks, under a per-step **token budget** chosen from the latency target (the paper
#   reports up to 2.6x serving capacity for Mistral-7B on one A100 against vLLM).
#
# The table implements the last two ideas. In vLLM the budget is the
# chunk bound: decodes take their tokens from `max_num_batched_tokens` first and prefill
# fills the rest, so one knob bounds `C + N`, like our `token_budget`; minillm keeps a
# separate `chunk_size` to make `C` visible.
#
# **The articles' "default chunk size" table is wrong.** It lists vLLM 512, SGLang 512,
# TensorRT-LLM 1024. What the engines did:
#
# * **vLLM**: 512 was the default `max_num_batched_tokens` with chunked prefill only in
#   the V0 days (the chunked-prefill docs PR, vllm-project/vllm#4580, May 2024, picked 512
#   for the best ITL on an A100); it was raised to 2048 (vllm-project/vllm#10544, Nov 2024:
#   which found 512 too conservative, above all on an H100), and V1, where chunked prefill is
#   on by default, picks 2048 to 16384 depending on the GPU and the entry point (offline
#   `LLM` or the OpenAI server): `EngineArgs.get_batch_defaults` in
#   `vllm/engine/arg_utils.py`.
# * **SGLang**: `--chunked-prefill-size` defaults from the GPU's memory: 2048 below 20 GB,
#   4096 below 60 GB, 8192 below 160 GB (A100-80GB, H100, H200), 16384 above
#   (`handle_gpu_memory_settings` in `python/sglang/srt/arg_groups/memory_hook.py`,
#   SGLang 0.5.20 and later; earlier releases gave 2048 up to 35 GB, in `server_args.py`),
#   not 512. That size bounds the prefill tokens of a step, but by default SGLang
#   does not put decodes in the same step: `enable_mixed_chunk` defaults to `False` in the
#   same file. Out of the box it is therefore chunked, prefill-first scheduling with
#   steps of bounded size, not stall-free batching.
# * **TensorRT-LLM**: chunked context is off unless enabled; the step bound
#   `max_num_tokens` defaults to 8192 (TensorRT-LLM docs, *Long Sequences* and *Tuning
#   Max Batch Size and Max Num Tokens*); there is no 1024 default.
#
# Defaults move between releases; read them off the version you run
# (`vllm serve --help`, `python -m sglang.launch_server --help`). Why thousands, when
# chapter 5's cost model shows that once a step already carries the decodes, a chunk past
# a few dozen tokens adds its tokens on an A100 or H100 at no lower cost each? Because
# the default is a throughput choice:
# fewer, larger steps pay the fixed per-step overhead (scheduling, kernel launches, host
# work) less often and give a long prompt fewer passes, at the price of a longer worst
# inter-token gap for the streams. Chapter 7 lets you move along that trade-off.

# %% [markdown]
# ## 11. Real requests, real words
#
# Everything above ran the tiny model on random prompts. The same engine serves a
# trained model, SmolLM2-135M-Instruct (chapter 2 loads it), with its tokenizer, so each
# output carries its decoded `text`. Four users write in (three short questions, one
# passage to sum up); once each has 4 tokens, a fifth pastes a 256-token document. The same requests under each
# policy: three rounds in rotating order for `prefill_first` and `chunked 64`, whose worst
# gaps the cell compares (a step of this model takes tens of milliseconds on a CPU, so a
# busy machine moves every time), and one round for `decode_first`, whose lesson is in
# its counts. The table prints medians and spreads, and the counts that do not move: the
# forward passes before the document's first token and the most tokens in a step that a
# stream waits through:

# %%
# NBVAL_IGNORE_OUTPUT
from minillm.book.chats import chat_requests, long_document, serve_with_late_arrival

real_model, tok = minillm.pretrained("smollm2-135m-instruct", device=device)
questions = [tok.apply_chat_template([{"role": "user", "content": q}]) for q in chat_requests(4)]
document = tok.decode(tok.encode(long_document())[:256])
late = tok.apply_chat_template([{"role": "user", "content": document + "\n\nWhat is this about? One sentence."}])
real_policies = {"prefill_first": SchedulerConfig(policy="prefill_first"),
                 "decode_first": SchedulerConfig(policy="decode_first"),
                 "chunked 64": SchedulerConfig(policy="chunked", chunk_size=64)}
REAL_ROUNDS = 3
ONE_ROUND = {"decode_first"}          # its counts teach; its milliseconds are compared with nothing

def serve_real(name):
    engine = minillm.LLMEngine(real_model, real_policies[name], tokenizer=tok)
    outs, _ = serve_with_late_arrival(engine, questions, late, SamplingParams(max_tokens=10),
                                      SamplingParams(max_tokens=4), after_tokens=4)
    doc = outs[-1].metrics
    streams = [o for o in outs[:-1] if len(o.output_token_ids) > 1]
    streams_done = max(o.metrics.finish_time for o in streams)
    return outs, dict(ttft=doc.ttft, tpot=statistics.mean(o.metrics.tpot for o in streams),
                      itl_max=max(max(o.metrics.itl) for o in streams),
                      passes=sum(doc.arrival_time <= r.start and r.end <= doc.first_token_time
                                 for r in engine.trace),
                      largest_step=max(r.num_prefill_tokens + r.num_decode_tokens for r in engine.trace
                                       if doc.arrival_time <= r.start and r.end <= streams_done))

real_runs, real_rounds = {}, {name: [] for name in real_policies}
for r in range(REAL_ROUNDS):
    order = list(real_policies)[r:] + list(real_policies)[:r]          # rotate the order
    for name in order:
        if r > 0 and name in ONE_ROUND:
            continue
        real_runs[name], measures = serve_real(name)
        real_rounds[name].append(measures)

def real_median(name, key):
    values = [m[key] for m in real_rounds[name]]
    return statistics.median(values), min(values), max(values)

print(f"{'medians of rounds [min-max]':30s} passes  largest step  {'document TTFT, s':>17s}  "
      f"{'streams mean TPOT, ms':>21s}  {'streams max ITL, ms':>19s}")
for name, ms in real_rounds.items():
    ttft, tpot, itl = (real_median(name, k) for k in ("ttft", "tpot", "itl_max"))
    print(f"{name:30s} {ms[0]['passes']:6d} {ms[0]['largest_step']:13d}  "
          f"{'{:.2f} [{:.2f}-{:.2f}]'.format(*ttft):>17s}  "
          f"{'{:.0f} [{:.0f}-{:.0f}]'.format(*(v * 1e3 for v in tpot)):>21s}  "
          f"{'{:.0f} [{:.0f}-{:.0f}]'.format(*(v * 1e3 for v in itl)):>19s}")

# %%
for i, q in enumerate(chat_requests(4)[:3]):
    print(f"Q: {q}\nA: {real_runs['chunked 64'][i].text!r}\n")
texts = {name: [o.text for o in outs] for name, outs in real_runs.items()}
assert texts["prefill_first"] == texts["decode_first"] == texts["chunked 64"]
print(f"{len(texts)} policies, {len(questions) + 1} requests: identical text")
document_len = len(late)
for name, ms in real_rounds.items():                 # counts: the same in every round
    assert len({(m["passes"], m["largest_step"]) for m in ms}) == 1, name
pf, df, ch = (real_rounds[n][0] for n in ("prefill_first", "decode_first", "chunked 64"))
assert pf["passes"] == 1 and ch["passes"] == math.ceil(document_len / 64) and df["passes"] > 1
assert pf["largest_step"] == document_len and ch["largest_step"] <= 64 + len(questions)
assert df["largest_step"] <= len(questions)                            # decodes only
if device.type == "cpu":                             # a whole document's step against a 64-token piece
    assert real_median("prefill_first", "itl_max")[0] > 2 * real_median("chunked 64", "itl_max")[0]

# %% [markdown]
# The text is identical under every policy; the timings are not, and the table separates
# what holds in every round from what the machine's load decides. The counts hold:
# `prefill_first` gives the document one pass and makes every stream wait through a step
# of the whole document; `chunked 64` gives it one pass per 64-token piece, each step a
# stream waits through at most a piece plus the decodes; under `decode_first` the
# streams wait only through decode steps and the document waits for them. So does the
# worst gap's order, by a wide margin: `prefill_first`'s max ITL is several times
# `chunked 64`'s, and `decode_first`'s is a decode step. The document's first token is
# soonest under `prefill_first`. Between `chunked 64` and `decode_first` the document's
# TTFT comes out within a small margin, and which one leads can change with the machine:
# the streams have 6 tokens left when it arrives (fewer if an answer ends early), so
# `decode_first` makes it wait about as many steps as it needs 64-token passes (the
# `passes` column), section 6's rule near its break-even. With longer answers
# `decode_first`'s wait grows; chunked's does not. The streams' mean TPOT comes out
# about the same under `prefill_first` and `chunked 64`, for the reason of section 4 (the
# streams wait through the whole document either way, at once or in pieces), and lowest
# under `decode_first`.

# %% [markdown]
# ## Takeaways
#
# * The engine schedules per **iteration**: each step is a fresh plan of
#   `(request, num_new_tokens)`, prefill chunks and decodes packed into one forward pass,
#   and every token is timestamped at the end of its step.
# * `prefill_first` gives the newcomer the best TTFT and every stream a stall as long as
#   the whole prefill; `decode_first` never stalls a stream and makes the newcomer wait
#   for them all; `chunked` bounds every step to `C + N` tokens, and `C` slides the
#   trade-off.
# * A stall is **one long gap**: a stall S adds S/(n-1) to the mean TPOT of a stream of
#   n tokens (diluted in long answers, not in short ones) and all of S to its max ITL.
#   Report both.
# * Chunked prefill does **not** lower the long prompt's own TTFT: the same tokens take
#   more passes that also carry decodes. It lowers the *streams'* worst gap, not their
#   mean TPOT, and it beats `decode_first` on the newcomer's TTFT when the streams have
#   more steps left than the prompt needs passes. Nor does it raise offline throughput.
# * On a shared machine one run is one sample: run rounds, print medians with their
#   spread, and assert on what load cannot move (pass counts, step sizes, the order of
#   the steps).
# * Policies, chunk sizes and preemption change when tokens come out, never which
#   tokens: greedy outputs are identical across all of them.
#
# **Exercises** (`exercises/06_the_scheduler.ipynb`): repair a colleague's chunked step;
# TTFT, TPOT and ITL from timestamps; count the passes a newcomer waits under each policy
# while streams finish; design chunks for a per-step work budget; write the `decode_first`
# step; predict the stall a prompt causes under `prefill_first`, then let the simulator
# measure it.
#
# **Next:** the tiny model on one CPU shows the mechanism; chapter 7 simulates the same
# scheduler on real models and GPUs, where you choose the chunk size.
