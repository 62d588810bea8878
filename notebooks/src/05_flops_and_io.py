# %% [markdown]
# # Chapter 5: FLOPs, bytes and the roofline
#
# **The question.** Before running a step, can we say how long it will take, and why a
# prefill chunk keeps a GPU's arithmetic units busy while a decode leaves them idle?
#
# **What you build.** You will count the work of one engine step (FLOPs) and the memory
# traffic it causes (bytes), per operation, with `minillm.accounting`; place steps on
# a roofline with `minillm.hardware`; and turn the counts into a predicted step time
# with `minillm.cost_model`, checked against operator times measured on A100 and H100
# GPUs. Along the way we recompute the numbers the source articles quote and see which
# hold. The payoff: a prefill chunk is compute-bound, a decode is memory-bound, and in a
# step that mixes them the decodes ride on the weight read the chunk pays for anyway:
# the step's linear layers are one compute-bound GEMM over the chunk's rows and the
# decodes' together.

# %% slideshow={"slide_type": "skip"}
import math

import matplotlib.pyplot as plt
import numpy as np
import torch

import minillm
from minillm.book import figures
from minillm.sim import accounting
from minillm.sim import cost_model
from minillm.sim import hardware
from minillm.sim import op_profiles
from minillm.sim.accounting import prefill_cost, prefill_flops, step_cost
from minillm.config import ModelConfig
from minillm.book.show import show_source

torch.manual_seed(0)
llama3 = ModelConfig.preset("llama-3-8b")
llama2 = ModelConfig.preset("llama-2-7b")
a100 = hardware.get_hardware("A100-80GB")

# %% [markdown]
# ## 1. Counting one step
#
# A step is a list of requests `(num_new_tokens, num_cached_tokens)`, or
# `(num_new_tokens, num_cached_tokens, samples)`: `samples=False` marks a middle chunk of a
# prompt, which only fills the cache and skips the LM head (a decode or a prompt's last
# chunk samples, the default). Two rules give all the FLOPs: a matmul `[M, K] x [K, N]`
# costs `2*M*N*K` (a multiply and an add per term), and attention costs, per causal
# (query, key) pair and per head, a dot product for the score and a multiply-add per
# dimension for the weighted sum of values: `4 * head_dim` FLOPs. A chunk of
# `n` new tokens over `c` cached ones has `n*c + n(n+1)/2` such pairs. Here is a
# ten-line sketch for one layer:

# %% slideshow={"slide_type": "fragment"}
def layer_flops_sketch(cfg, n, c):
    d, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    gemms = 2 * n * d * (q + 2 * kv) + 2 * n * q * d + 2 * n * d * 2 * inter + 2 * n * inter * d
    pairs = n * c + n * (n + 1) // 2
    attention = 2 * 2 * pairs * cfg.head_dim * cfg.num_heads   # scores and values
    return gemms + attention

engine = step_cost(llama3, [(512, 1024, False)])
engine_per_layer = (engine.flops - engine.by_op["lm_head"][0]) // llama3.num_layers
assert layer_flops_sketch(llama3, 512, 1024) == engine_per_layer
print(f"one layer of a 512-token chunk over 1024 cached tokens: {engine_per_layer / 1e9:.1f} GFLOP")

# %% [markdown]
# The engine's `step_cost` does the same per operation and adds the bytes: every weight
# read once per step, each request's cached K and V read once, the new K and V written,
# and each operation's input and output activations. Its core:

# %% slideshow={"slide_type": "subslide"}
show_source(step_cost, start="# Per layer.", end="by_op[\"lm_head\"]")

# %% [markdown]
# ## 2. The articles' numbers, recomputed
#
# **KV written per 512-token chunk of Llama-3-8B in bf16.** The article multiplies
# 512 x 2 (K and V) x 32 layers x 8 KV heads x 128 dims x 2 bytes.

# %% slideshow={"slide_type": "fragment"}
kv_write_bytes = step_cost(llama3, [(512, 0, False)], dtype_bytes=2).bytes_kv_write
assert kv_write_bytes == 67_108_864
for label, bandwidth_bytes_s in [("the article's 2 TB/s", 2e12),
                                 ("A100-80GB datasheet, 2,039 GB/s", a100.mem_bandwidth_bytes_s),
                                 ("A100 achieved (x bandwidth_efficiency)",
                                  a100.mem_bandwidth_bytes_s * a100.bandwidth_efficiency)]:
    print(f"{kv_write_bytes:,} bytes at {label}: {kv_write_bytes / bandwidth_bytes_s * 1e6:.1f} us")

# %% [markdown]
# The byte count holds exactly if "64 MB" means 64 MiB (67.1 MB). The article's
# "32 us" divides 64e6 by 2e12; with the exact bytes it is 33.6 us at 2 TB/s. Either
# way it is well under 1% of a step that takes tens of milliseconds (the mixed steps
# predicted later in this chapter): the claim that the KV
# *write* is negligible holds. What the article leaves out is the KV *re-read*
# (section 3).
#
# **A 2048-token prefill of a 7B model on an A100: "about 200 ms".**

# %% slideshow={"slide_type": "subslide"}
flops_2048 = prefill_flops(llama2, 2048)
at_peak_s = flops_2048 / a100.peak_flops_s
at_mfu_s = {mfu: flops_2048 / (a100.peak_flops_s * mfu) for mfu in (0.5, 0.7)}
predicted_s = cost_model.predict_step(llama2, [(2048, 0)], hardware=a100).total
print(f"Llama-2-7B, 2048-token prefill: {flops_2048 / 1e12:.1f} TFLOP")
print(f"  at the 312 TFLOP/s peak:        {at_peak_s * 1e3:.0f} ms")
for mfu, seconds in at_mfu_s.items():
    print(f"  at {mfu:.0%} MFU:                  {seconds * 1e3:.0f} ms")
print(f"  cost model (fitted to A100):    {predicted_s * 1e3:.0f} ms")
quoted_s = 200e-3
print(f"  the quoted ~200 ms means an MFU of {flops_2048 / quoted_s / a100.peak_flops_s:.0%}")
assert 40e-3 < predicted_s < quoted_s
# the numbers the next paragraph quotes
assert round(flops_2048 / 1e12) == 28 and round(at_peak_s * 1e3) == 89
assert [round(at_mfu_s[m] * 1e3) for m in (0.7, 0.5)] == [126, 177]
assert round(flops_2048 / quoted_s / a100.peak_flops_s, 2) == 0.44
assert at_mfu_s[0.7] < predicted_s < at_mfu_s[0.5]

# %% [markdown]
# The quoted ~200 ms holds as an order of magnitude but is on the slow side: 28 TFLOP
# (about 2 x 7B parameters x 2048 tokens, plus attention) take 89 ms even at the peak,
# 126-177 ms at a realistic 50-70% MFU, and 200 ms means an MFU of about 44%. The cost
# model, fitted to measured A100 GEMMs, lands in between.
#
# **A 7B decode step: "about 5 ms".** A decode must read every weight once. That is a
# floor no kernel can beat:

# %% slideshow={"slide_type": "subslide"}
# What a decode streams: every layer's weights and the LM head. The input embedding is
# not streamed: a step gathers one row of it per token (accounting.step_cost counts so).
weights_bytes = step_cost(llama2, [(1, 0)], dtype_bytes=2).bytes_weights
embedding_bytes = llama2.vocab_size * llama2.hidden_size * 2
ratios = {}
for name in ("A100-40GB", "A100-80GB", "H100-SXM", "H200"):
    hw = hardware.get_hardware(name)
    floor_s = weights_bytes / hw.mem_bandwidth_bytes_s
    step = cost_model.predict_step(llama2, [(1, 512)], hardware=hw)
    sync_s = cost_model.predict_step(llama2, [(1, 512)], hardware=hw, async_scheduling=False).total
    ratios[name] = step.total / floor_s
    print(f"{name:10s} weight-read floor {floor_s * 1e3:4.1f} ms, cost model {step.total * 1e3:4.1f} ms "
          f"({step.graph} graph; synchronous host: {sync_s * 1e3:4.1f} ms)")
a100_floor_s = weights_bytes / a100.mem_bandwidth_bytes_s
assert a100_floor_s > 5e-3
# the numbers the next paragraph quotes
assert all(1.4 < r < 1.9 for r in ratios.values())                          # "1.5-1.9x the floor"
assert round(weights_bytes / 1e9, 1) == 13.2 and round(a100_floor_s * 1e3, 1) == 6.5
assert round((weights_bytes + embedding_bytes) / 1e9, 1) == 13.5
assert round(weights_bytes / hardware.get_hardware("A100-40GB").mem_bandwidth_bytes_s * 1e3, 1) == 8.5

# %% [markdown]
# On any A100, the 13.2 GB of bf16 weights a decode streams (13.5 GB with the input
# embedding, which a step only gathers a row of per token) take at least 6.5 ms (80GB) or
# 8.5 ms (40GB) to read, so "~5 ms" per decode step does not hold there. On an H100 or
# H200 the floor is below 5 ms, so there the figure is possible. The cost model's step is
# 1.5-1.9x the floor (the most on the H200, whose faster memory leaves the fixed costs a
# bigger share): real kernels stream the weights at 83-91% of the datasheet bandwidth
# (fitted in section 5), and each of a layer's ~10 kernels takes a few
# microseconds however small its work (the measured per-operator times of section 5
# show it: a one-token norm takes 5 us). The host costs nothing on top: a decode-only
# step replays one CUDA graph (its ~400 kernels cost no launches: chapter 7, section 7),
# and the 2 ms of host work we assume per step hides behind the GPU's with async
# scheduling (vLLM's default since v0.14); synchronous, it adds its 2 ms (printed above).
#
# **"A chunk of L tokens costs 4Ld² projection FLOPs per layer."** One article counts the
# four attention projections as `L*d*d` each. It misses three things: a multiply-add is
# 2 FLOPs; with GQA the K and V projections are `d x kv_size`, not `d x d` (Llama-3-8B:
# 1024 instead of 4096); and the MLP, three `d x intermediate` matrices, is most of the
# work. The engine's count per layer and per token, in units of `d²`:

# %%
d = llama3.hidden_size
per_token = step_cost(llama3, [(1, 0, False)]).by_op
projections = (per_token["qkv_proj"][0] + per_token["o_proj"][0]) / llama3.num_layers / d**2
mlp = per_token["mlp"][0] / llama3.num_layers / d**2
print(f"Llama-3-8B, per layer and token: attention projections {projections:.1f} d², "
      f"MLP {mlp:.1f} d², all linear layers {projections + mlp:.1f} d² (the article: 4 d²)")
assert projections == 2 * (1 + 2 * 0.25 + 1) and mlp == 2 * 3 * 3.5     # 5 d² and 21 d²

# %% [markdown]
# So a Llama-3-8B layer does **26·L·d²** linear FLOPs for a chunk of L tokens, 6.5x the
# article's 4·L·d² (5·L·d² for the projections alone: 2 FLOPs per multiply-add, K and V
# four times narrower than Q). With the attention pairs on top, this is section 1's count.
#
# ## 3. Chunking keeps the FLOPs and adds KV re-reads
#
# Summed over the chunks of one prompt, the causal pairs are always L(L+1)/2, and only
# the last chunk runs the LM head, so the FLOPs cannot depend on the chunk size. The
# bytes do: every chunk re-reads the prefix cached so far, and every step re-reads all
# weights unless decodes share that step.

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
prompt_tokens = 8192
chunk_sizes = [256, 512, 1024, 2048, 4096, 8192]
costs = {c: prefill_cost(llama3, prompt_tokens, c, dtype_bytes=2) for c in chunk_sizes}
assert len({cost.flops for cost in costs.values()}) == 1
kv_read_gb = [costs[c].bytes_kv_read / 1e9 for c in chunk_sizes]
weights_gb = [costs[c].bytes_weights / 1e9 for c in chunk_sizes]
fig, ax = plt.subplots(figsize=(6.5, 3.6))
ax.plot(chunk_sizes, kv_read_gb, "o-", label="KV re-read")
ax.plot(chunk_sizes, weights_gb, "s-", label="weights re-read (prefill alone)")
ax.set_xscale("log", base=2)
ax.set_xlabel("chunk size (tokens)")
ax.set_ylabel("bytes read over the whole prefill (GB)")
ax.set_title(f"Same {costs[512].flops / 1e12:.0f} TFLOP for every chunk size; "
             f"512-token chunks re-read {kv_read_gb[1]:.0f} GB of KV")
ax.legend()
plt.show()
kv_read_s = costs[512].bytes_kv_read / a100.mem_bandwidth_bytes_s
compute_s = costs[512].flops / (a100.peak_flops_s * a100.gemm_efficiency)
print(f"512-token chunks: KV re-read {costs[512].bytes_kv_read / 1e9:.1f} GB = {kv_read_s * 1e3:.1f} ms "
      f"on an A100-80GB, next to {compute_s * 1e3:.0f} ms of compute ({kv_read_s / compute_s:.1%})")
assert kv_read_s < 0.05 * compute_s

# %% [markdown]
# The KV re-read of small chunks is small next to the compute, but it is not the zero the
# articles suggest, and it grows with the square of the prompt length (and with 1/chunk).
#
# **Same FLOPs, not the same pace.** A matmul call reads its whole weight however few
# rows it multiplies (and a CPU's matrix library also repacks it for its kernel), so
# fewer rows per call means less work per byte moved. Here are the tiny model's
# matmuls on this machine: one layer's seven `Linear`s on 1024 rows at once, and on the
# same rows 256 and 64 at a time (time per row, against the 1024-row calls):

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
from minillm.book.bench import bench_matmul_rows

pace = bench_matmul_rows(minillm.build_model("tiny", seed=0, dtype=torch.float32), 1024, (256, 64))
for name, ratio in pace["chunked_over_whole"].items():
    print(f"rows in chunks of {name[2:]:>3}: x{ratio:.2f} the time per row of 1024-row calls")

# %% [markdown]
# Here (printed above) the 256-row calls take about a tenth more time per row than the
# 1024-row ones, and the 64-row calls about a third more or worse; `docs/chunk-cost.md`
# has the runs of other shapes. That pace, with each step's fixed cost, is what a
# chunked prefill costs beyond a whole one there: `python -m minillm bench chunk-cost`
# measures both, adds them up and compares with the chunk steps it times
# (`docs/chunk-cost.md`). On a GPU the same effect shows as tiles and SMs left idle by small
# matmuls, which the cost model below counts.
#
# ## 4. Arithmetic intensity and the roofline
#
# Intensity = FLOPs / bytes. Above a GPU's ridge point (peak FLOP/s / bandwidth) a step
# is compute-bound; below it, memory-bound. Compare a prefill chunk, a decode batch,
# and the two mixed in one step:

# %% slideshow={"slide_type": "subslide"}
steps = {
    "decode x32 (ctx 1024)": [(1, 1024)] * 32,
    "prefill chunk 512": [(512, 1024, False)],
    "mixed: chunk 512 + 32 decodes": [(512, 1024, False)] + [(1, 1024)] * 32,
    "prefill chunk 2048": [(2048, 2048, False)],
}
intensity = {name: step_cost(llama3, shape).intensity for name, shape in steps.items()}
for name, value in intensity.items():
    print(f"{name:32s} {value:7.1f} FLOP/byte")
print(f"ridge points: " + ", ".join(f"{n} {h.ridge_point:.0f}" for n, h in hardware.PROFILES.items()))
assert intensity["decode x32 (ctx 1024)"] < a100.ridge_point < intensity["prefill chunk 512"]
assert 20 < intensity["decode x32 (ctx 1024)"] < 30 and 140 < a100.ridge_point < 160   # quoted below
assert all(intensity["prefill chunk 512"] > h.ridge_point for h in hardware.PROFILES.values())

# %% [markdown]
# Now this machine. `calibrate()` times real steps of the built-in model over a sweep of
# shapes and fits this machine's effective FLOP/s and bandwidth to them (chapter 7, section
# 10, shows the fit and how well it predicts steps it never saw). The result is cached on
# disk, so only the first run pays, about 20 seconds on two cores:

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
this_cpu = hardware.calibrate(max_spread=None)   # on a busy machine: kept, with a warning naming the spread
print(f"{this_cpu.name}: {this_cpu.peak_flops_s / 1e9:.0f} GFLOP/s, "
      f"{this_cpu.mem_bandwidth_bytes_s / 1e9:.1f} GB/s, ridge {this_cpu.ridge_point:.1f} FLOP/byte")

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
# Each device's line in its own style (the A100-40GB's ridge, 200, sits on the H200's, 206):
# figures.plot_rooflines draws them so that none hides another.
figures.plot_rooflines(list(hardware.PROFILES.values()) + [this_cpu], intensity,
                       title="Decodes sit far left of every GPU ridge; a 512-token chunk is past it")

# %% [markdown]
# A decode batch does ~25 FLOPs per byte: an A100 (ridge ~150) runs it at a sixth of its
# peak at best, waiting on memory. A 512-token chunk is past every GPU ridge. (One article
# says the GPU idles during a long prefill; it is the other way round: a long prefill
# keeps the arithmetic units busy, compute-bound. What waits is the decodes.) Putting the
# decodes in the chunk's step adds their tokens almost for free: the weights are read once
# for all of them. This machine's ridge, fitted to its real steps, is far lower (printed
# above: a few hundred GFLOP/s against a few tens of GB/s, a ridge of some 15-20 FLOPs per
# byte, the fit folding each step's fixed costs into the bandwidth). A float32 step does about T/2 FLOPs per byte of weights read for its T
# tokens, so here a step turns compute-bound after a few dozen tokens: the reason the CPU
# chapters see a chunk's time grow with nearly every token, while a decode step costs
# about what streaming the weights once does.
#
# **Where the free ride ends: the measured knee.** A step's linear layers are GEMMs with
# M = every token of the step: the chunk's rows plus one per decode. While M is small the
# GEMM waits on its weight read and extra rows ride free. Measured, not modelled:
# Llama-3-8B's four linear operators of one layer on an A100 (the Vidur files of
# section 5), around the knee:

# %% slideshow={"slide_type": "subslide"}
l3_a100 = op_profiles.profile_dir() / "a100_Meta-Llama-3-8B.csv"
knee_rows = (64, 96, 112, 128, 136, 144, 160, 192, 256, 384, 512)
knee_ms = {m: op_profiles.measured_layer_s(l3_a100, m) * 1e3 for m in knee_rows}
a100_model = {m: sum(cost_model.layer_linear_times_s(llama3, m, a100)[op] for op in op_profiles.FITTED_OPS) * 1e3
              for m in knee_rows}
print(f"{'rows M':>7s} {'measured ms':>12s} {'us per row':>11s} {'cost model ms':>14s}")
for m in knee_rows:
    print(f"{m:7d} {knee_ms[m]:12.3f} {knee_ms[m] / m * 1e3:11.2f} {a100_model[m]:14.3f}")
assert round(knee_ms[128], 3) == 0.377 and 0.505 < knee_ms[160] < 0.515         # quoted below
assert knee_ms[128] < 1.2 * knee_ms[64] and knee_ms[160] > 1.3 * knee_ms[128]
assert max(knee_ms[m] for m in (136, 144, 160, 192)) < 1.05 * knee_ms[256]      # 129-256 cost ~ 256
assert abs(a100_model[128] / knee_ms[128] - 1) < 0.06 and a100_model[160] > 1.2 * a100_model[128]   # quoted below

# %% [markdown]
# Up to 128 rows the step rides on the weight read: 1 to 64 rows cost within 20% of each other, 128 only
# 16% more. Past 128 the time jumps (0.377 ms at 128 rows, 0.51 ms at 160: +35% time
# for +25% rows), and any M from 129 to 256 costs about what 256 does. That is the GEMM's
# tiles: the library cuts M into tiles of 128 rows (and the output columns into tiles
# too, run in waves over the A100's 108 SMs), and a partial tile costs a whole one. The
# cost model's tiles and waves (fitted in section 5) put the knee in the same place
# (+41% from 128 to 160 rows against +35% measured), its level at 128 rows 5% low.
#
# **The tile rule.** What must be a whole number of tiles is the step's M, the chunk
# PLUS the decodes, so choose the step's token budget (vLLM's `max_num_batched_tokens`),
# not the chunk size, as a multiple of the tile. With 32 decodes running and a budget of
# 128, the chunk takes 96 rows and the step stays at one tile, riding on the weight read;
# a budget of 160 (a 128-token chunk + 32 decodes) buys 32 more prompt tokens for +35%
# step time. Past a few tiles (about 512 rows here) every row costs the same ~2 us: the
# step is compute-bound and a bigger chunk makes no token cheaper, it only makes every
# decode's gap longer.

# **"TPOT ≈ compute(C+N) / compute(N) × Δt."** One article scales the decode step time Δt
# by the FLOPs of the mixed step over those of the decodes alone. That treats a decode
# step as compute-bound. It is not: a step of 32 decodes costs the weight read (section
# 2), and the chunk's FLOPs are added to that, not multiplied by it:

# %%
decodes = [(1, 1024)] * 32
decode_step_s = cost_model.predict_step(llama3, decodes, "A100-80GB").total
overstated = []
for chunk in (128, 512, 2048):
    mixed_s = cost_model.predict_step(llama3, [(chunk, 1024, False)] + decodes, "A100-80GB").total
    flops_ratio = step_cost(llama3, [(chunk, 1024, False)] + decodes).flops / step_cost(llama3, decodes).flops
    print(f"C={chunk:4d}, N=32: the article's formula x{flops_ratio:5.1f} -> {flops_ratio * decode_step_s * 1e3:6.0f} ms; "
          f"cost model x{mixed_s / decode_step_s:4.1f} -> {mixed_s * 1e3:4.0f} ms")
    assert mixed_s < 0.5 * flops_ratio * decode_step_s
    overstated.append(flops_ratio * decode_step_s / mixed_s)
assert 2.9 < min(overstated) and max(overstated) < 7                 # "3 to 7 times", quoted below

# %% [markdown]
# The formula overstates a mixed step 3 to 7 times here: the decodes' step is not a unit
# of compute but a weight read, which the chunk shares. Another article's "TPOT jitter ∝
# C/N x FLOP_GEMM/FLOP_GEMV" makes the same mistake: a decode's step is a weight read, not
# FLOPs at a GEMV's pace, and a chunk adds its own FLOPs to it rather than multiplying it. A better rule of thumb
# on a GPU is `step(C+N) ≈ max(weight read, FLOPs(C+N) / sustained FLOP/s)` plus
# overheads, which is what the cost model refines.
#
# ## 5. Is the cost model right? Operator times measured on GPUs
#
# `cost_model` turns these counts into seconds with factors fitted once per GPU to
# operator times measured by the Vidur project on an A100-80GB (four model shapes) and an
# H100 SXM (three); `op_profiles` loads those files and fits the factors. For each file we
# compare the prediction of qkv_proj, o_proj, gate_up, down and the whole MLP, twice:
#
# - **in-sample**: with the shipped factors, which were fitted on every file of that GPU,
#   this one included;
# - **held out**: refit the GPU's factors from a neutral start on its *other* files only
#   (the other GPU's files cannot inform them), then predict this one. That is what a
#   new model shape on the same GPU would see. (The refit uses every third row and 900
#   steps of a Nelder-Mead search, a few seconds a file.)
#
# The kernels being fitted: three GEMM tile shapes (64x64, 128x128, 128x256 output
# elements), each at its own fraction of peak; the tiles of a GEMM run in waves over the
# SMs (108 on the A100, 132 on the H100), a partial last wave charged part of a whole one
# (each tile's own wave quantization). The kernel is chosen by shape, as a GEMM library's
# heuristic does: the largest tile once it makes enough tiles to fill the SMs
# (`gemm_fill_waves` waves, fitted), else the fastest. The loss is robust: a row the
# library runs with a poor kernel (40% slower than both its neighbours) pulls the fit
# little. The errors are over rows 1-4096. The target (issue 28): median |error| at most
# 5% and 90th percentile at most 12% held out.

# %% slideshow={"slide_type": "subslide"}
# NBVAL_IGNORE_OUTPUT
validation = op_profiles.held_out_errors()
print(f"{'file':36s} {'in-sample median, p90':>22s} {'held out median, p90':>22s}  fitted on")
for name, r in validation.items():
    (in_med, in_p90), (ho_med, ho_p90) = r["in_sample"], r["held_out"]
    print(f"{name:36s} {in_med:10.1%} {in_p90:6.1%}     {ho_med:10.1%} {ho_p90:6.1%}     "
          f"{len(r['fitted_on'])} other file(s)")

# %% slideshow={"slide_type": "skip"}
worst = {}
for gpu in ("a100", "h100"):
    rows = [r["held_out"] for name, r in validation.items() if name.startswith(gpu)]
    worst[gpu] = (max(m for m, _ in rows), max(p for _, p in rows))
    print(f"{gpu}: worst file held out: median {worst[gpu][0]:.1%}, p90 {worst[gpu][1]:.1%} "
          f"(target 5%, 12%: {'met' if worst[gpu][0] <= 0.05 and worst[gpu][1] <= 0.12 else 'NOT met'})")
for name, r in validation.items():
    assert r["in_sample"][0] <= 0.08 and r["in_sample"][1] <= 0.20, name
assert worst["a100"][0] <= 0.05 and worst["a100"][1] <= 0.12                        # met, quoted below
assert 0.05 < worst["h100"][0] <= 0.08 and 0.12 < worst["h100"][1] <= 0.18          # not met, quoted below
assert all(r["held_out"][0] - r["in_sample"][0] <= 0.035 for r in validation.values())

# %% [markdown]
# Held out, the errors stay close to the in-sample ones (the median within 3.5 points on
# every file): the factors describe the GPU's kernels, not one model's shape. On the A100
# the target is met on every file (worst: median under 5%, 90th percentile just under
# 12%); on the H100 it is not: medians up to ~7.5% (Llama-2-7B, predicted from the two
# 8192-wide models) and a 90th percentile of 14-17%. The H100's measured times
# between 256 and 1024 rows jump with the GEMM library's choice of kernel (1024 rows of
# CodeLlama-34B's o_proj run at 540 TFLOP/s, 512 rows at 690, 536 rows at 320), and the
# choice-by-fill rule follows only some of those jumps. These files hold no attention kernels and no whole steps, so the
# attention efficiency (0.5) and the 2 ms of host work per step are assumptions, not fits
# (chapter 7 lists them).
#
# One comparison decides chapter 7's account of chunking's price: a 2048-token prompt
# as four steps of 512 rows against one of 2048. Measured and predicted, Llama-2-7B's
# linear layers, one layer:

# %%
for gpu in ("a100", "h100"):
    r = op_profiles.chunked_vs_whole(op_profiles.profile_dir() / f"{gpu}_Llama-2-7b-hf.csv", 512, 2048)
    measured = r["chunked"]["linear_ms"] / r["whole"]["linear_ms"]
    model = r["chunked"]["model_linear_ms"] / r["whole"]["model_linear_ms"]
    print(f"{gpu}: measured 4 x 512 = {r['chunked']['linear_ms']:.3f} ms vs 1 x 2048 = {r['whole']['linear_ms']:.3f} ms "
          f"(x{measured:.3f}); cost model {r['chunked']['model_linear_ms']:.3f} vs {r['whole']['model_linear_ms']:.3f} "
          f"(x{model:.3f})")
    if gpu == "a100":
        assert 0.99 < measured < 1.0 and 1.03 < model < 1.07             # quoted below
    else:
        assert 1.2 < measured < 1.23 and 1.12 < model < 1.17

# %% [markdown]
# The model puts a penalty on 512-row steps on both GPUs, larger on the H100, as measured;
# but on the A100 the measured steps show none (x0.997) where the model says x1.05, and on
# the H100 it says x1.14 where the GPU shows x1.21. Within 2% (issue 28's target) it is
# not: its 2048-row times are 4% low on the A100, 11% high on the H100. Chapter 7
# therefore reads chunking's price from the measured sums first, and shows the model's
# terms beside them.

# %% [markdown]
# ### How close can a model of tiles and waves come?
#
# Misses of 5-17% invite a question: is the model too crude, or is there a limit that
# no model predicting a GEMM from its shape can go under? Four measurements bound it.
#
# 1. **The same shape, measured twice.** Llama-2-7B's and Llama-3-8B's o_proj are the
#    same GEMM ([M, 4096] x [4096, 4096]), and so are CodeLlama-34B's and Qwen-72B's
#    ([M, 8192] x [8192, 8192]). A model that prices a GEMM by its shape must give each
#    pair one time, so where the two files disagree it misses one of them.
# 2. **Each file fitted alone.** Fit the factors on one H100 file and test on that same
#    file, twice: with the robust loss of the fits above, and with a search that
#    minimises the 90th percentile itself (the robust loss, log(1 + (e/10%)^2), discounts
#    exactly the large errors a p90 counts). Each is the best fit a search *found*, so
#    an upper bound on what this model's form can reach there, not a floor under it.
# 3. **The slow rows, learned from the other files.** If the GEMM library ran slow at the
#    same row counts whatever the shape, a held-out file's misses could be learned from
#    the other files: correct each prediction by their median miss at that row count.
# 4. **The ratio at neighbouring chunk sizes.** How much does the measured 4 x chunk vs
#    1 x (4 chunk) ratio move when the chunk moves by 8 rows?

# %% slideshow={"slide_type": "subslide"}
# NBVAL_IGNORE_OUTPUT
for pair in op_profiles.same_shape_spread():
    print(f"{pair['gpu']}: [M, {pair['shape'][0]}] x {list(pair['shape'])}, {pair['a'][0]} vs "
          f"{pair['b'][0]}: {pair['rows']} rows, median |difference| {pair['median']:.1%}, "
          f"p90 {pair['p90']:.1%}")
# the H100's files, where the target is missed (three fits of a few seconds each)
h100_files = [p for p in op_profiles.profile_paths() if p.name.startswith("h100")]
alone = op_profiles.per_file_fit_errors(h100_files)
alone_p90 = op_profiles.per_file_p90_fit_errors(h100_files)    # a few seconds a file
print(f"\n{'file':36s} {'fitted alone: median, p90':>26s} {'fitted to its p90':>18s} {'held out: p90':>14s}")
for name, (med, p90) in alone.items():
    print(f"{name:36s} {med:13.1%} {p90:8.1%} {alone_p90[name][1]:15.1%} {validation[name]['held_out'][1]:13.1%}")

# %% slideshow={"slide_type": "subslide"}
# NBVAL_IGNORE_OUTPUT
# the same held-out fits as above (kept in this process), the four GEMMs of each file
transfer = op_profiles.row_band_transfer([p for p in op_profiles.profile_paths() if p.name.startswith("h100")])
print(f"{'file':36s} {'held out: median, p90':>22s} {'corrected by row count':>24s}")
for name, r in transfer.items():
    print(f"{name:36s} {r['held_out'][0]:11.1%} {r['held_out'][1]:6.1%} "
          f"{r['row_corrected'][0]:15.1%} {r['row_corrected'][1]:6.1%}")

# %% slideshow={"slide_type": "skip"}
spread = op_profiles.same_shape_spread()
assert len(spread) == 2 and all(p["median"] < 0.03 and p["p90"] < 0.07 for p in spread)   # quoted below
h100_alone_p90 = sorted(p90 for _, p90 in alone.values())
assert h100_alone_p90[-1] > 0.12 and h100_alone_p90[-2] > 0.12                          # two of three
h100_p90_fit = sorted(p90 for _, p90 in alone_p90.values())
assert h100_p90_fit[-1] > 0.12 and h100_p90_fit[-2] > 0.12                              # still two of three
assert all(alone_p90[name][1] <= alone[name][1] + 1e-9 for name in alone)               # it starts there
assert all(alone[name][1] <= validation[name]["held_out"][1] + 0.01 for name in alone)
assert all(r["row_corrected"][1] > 0.12 for r in transfer.values())                    # quoted below
l2 = transfer["h100_Llama-2-7b-hf.csv"]
assert l2["row_corrected"][1] > l2["held_out"][1] + 0.03                                   # worse

# %% [markdown]
# The two measurements of one shape agree closely (median difference about 2%, 90th
# percentile about 5%): the GPU is not noisy. The misses are the GEMM library's: it picks
# its kernel by shape from a table, and a shape's slow bands repeat from file to file
# (on the H100 at [M, 8192] x [8192, 8192], rows 392-416, 536-640 and 904-1024 run 20-35%
# slow in both files). A model of tiles and waves cannot derive such a table, and fitted
# to each file alone, even by a search on the 90th percentile itself, the best fit we
# found still leaves it above 12% on two of the three H100 files. Those are upper bounds
# (a better search could find lower), but they say where the effort went: issue 28's
# held-out target for the H100 asks this form for more than it gave each file alone. Nor can
# the bands be learned from the other files by row count: corrected so, the 90th
# percentile stays above 12% on every H100 file (the four GEMMs: 16-24%), and on
# Llama-2-7B, the one 4096-wide model, it gets worse. Where the library switches kernels
# depends on the whole shape (K and N too), not on the rows alone.
#
# And the 512-row comparison itself moves with the chunk. The measured ratio, and the
# model's, for chunks of 384 to 696 rows:

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
sweeps = {}
for ax, gpu in zip(axes, ("a100", "h100")):
    sweeps[gpu] = op_profiles.chunked_vs_whole_sweep(op_profiles.profile_dir() / f"{gpu}_Llama-2-7b-hf.csv",
                                                     range(384, 704, 8))
    chunks, measured, model = zip(*sweeps[gpu])
    ax.plot(chunks, measured, ".-", ms=3, lw=0.8, label="measured")
    ax.plot(chunks, model, "-", lw=1.2, label="cost model")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.axvline(512, color="grey", lw=0.5, ls=":")
    ax.set_title(f"{gpu.upper()}, Llama-2-7B: 4 x chunk vs 1 x (4 chunk)", fontsize=9)
    ax.set_xlabel("chunk (rows)")
axes[0].set_ylabel("time ratio, linear ops")
axes[0].legend(fontsize=7)
plt.show()
neighbours = {}
for gpu, sweep in sweeps.items():
    measured = [m for _, m, _ in sweep]
    at = {chunk: m for chunk, m, _ in sweep}
    neighbours[gpu] = at[520] / at[504] - 1
    print(f"{gpu}: measured ratio {min(measured):.2f}-{max(measured):.2f} over chunks 384-696; "
          f"chunks of 520 rows against 504: {neighbours[gpu]:+.1%}")

# %% slideshow={"slide_type": "skip"}
a100_range = [m for _, m, _ in sweeps["a100"]]
h100_range = [m for _, m, _ in sweeps["h100"]]
assert min(a100_range) < 0.97 and max(a100_range) > 1.15           # quoted below
assert min(h100_range) > 1.1 and max(h100_range) > 1.4
assert round(neighbours["a100"], 2) == 0.05 and round(neighbours["h100"], 2) == 0.11   # 504 vs 520, quoted below

# %% [markdown]
# On the A100 the measured ratio runs from below 1 to about 1.2 as the chunk moves, on
# the H100 from about 1.2 to nearly 1.5; 504 and 520 rows already differ by 5% (A100) and 11% (H100). The
# model's steps fall at the same chunk sizes (where a new row of tiles starts a partial
# wave), but its level is off by several percent on each GPU. So a 2% match at 512 alone
# would sit inside the ratio's own steps; what carries over is the shape of the curve:
# **chunking's GEMM price on a GPU depends on where the step's rows fall against the tile
# and the waves, and it is larger on the H100**, whose 132 SMs need more rows to fill.

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
errors = op_profiles.linear_op_errors(op_profiles.profile_dir() / "a100_Meta-Llama-3-8B.csv")
fig, ax = plt.subplots(figsize=(6.5, 3.6))
for op in ("qkv_proj", "mlp_gate_up_proj"):
    tokens, measured_s, predicted_s, _ = zip(*errors[op])
    ax.plot(tokens, np.array(measured_s) * 1e3, ".", ms=3, label=f"{op} measured")
    ax.plot(tokens, np.array(predicted_s) * 1e3, "-", lw=1, label=f"{op} predicted")
ax.set_xscale("log", base=2); ax.set_yscale("log")
ax.set_xlabel("tokens in the batch")
ax.set_ylabel("time per layer (ms)")
ax.set_title("A100, Llama-3-8B: flat while weights stream, linear once compute-bound")
ax.legend(fontsize=7)
plt.show()

# %% [markdown]
# The flat part on the left is the weight read: one token or 64 cost the same. The knee
# sits near the effective ridge and the right part grows with the FLOPs. A single-factor
# roofline misses the knee's shape and the tile steps; chapter 7 looks at the residuals.
#
# ## 6. Peak activation memory: chunked vs full prefill
#
# Every activation of a step scales with its new tokens, so a chunk caps the peak. We
# measure it with the profiler's memory events (or the CUDA allocator's peak on a GPU)
# on the tiny model, a 1024-token prompt whole and as its last 256-token chunk:

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
# NBVAL_IGNORE_OUTPUT
import os

from minillm.prefill import prepare_step

os.environ["KINETO_LOG_LEVEL"] = "6"     # the profiler's own "USDT: profiler_start" lines: off

tiny = minillm.build_model("tiny", seed=0, dtype=torch.float32, device="cpu")
shapes = {"full 1024": [(1024, 0)], "chunk 256 over 768": [(256, 768)]}
runs = {name: prepare_step(tiny, shape, seed=0) for name, shape in shapes.items()}
measured_peak_bytes = {}
with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                             profile_memory=True) as prof:
    for name, run in runs.items():
        with torch.profiler.record_function(name):
            run()
events = list(prof.profiler.kineto_results.events())
memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
for name in runs:
    window = next(e for e in events if e.name() == name)
    live = peak = 0
    for t_ns, nbytes in memory:               # allocations +, frees -, in time order
        if window.start_ns() <= t_ns <= window.end_ns():
            live += nbytes
            peak = max(peak, live)
    measured_peak_bytes[name] = peak
for name, (n, c) in [(k, v[0]) for k, v in shapes.items()]:
    computed = accounting.activation_peak_bytes(tiny.cfg, n, c, dtype_bytes=4, logits_rows=1,
                                                materialized_scores=False)
    print(f"{name:20s} measured {measured_peak_bytes[name] / 2**20:6.1f} MiB, "
          f"computed {computed / 2**20:6.1f} MiB")
assert measured_peak_bytes["chunk 256 over 768"] < measured_peak_bytes["full 1024"]

# %% [markdown]
# The chunk's peak is a fraction of the full prefill's. The formula assumes a fused
# attention kernel that never stores the score matrix and counts the MLP's intermediates,
# the largest tensors alive; both measurements sit about a tenth above it (the kernel's
# scratch and small temporaries). Had the sdpa backend given SDPA the chunk's explicit
# bottom-right mask (booleans `[group x n, m]`, the GQA group folded into the rows, which
# SDPA turns into an additive float mask of the same shape), the chunk's peak would nearly
# double. Instead it splits the chunk's attention (chapter 1, section 5: no mask over the
# cached prefix, `is_causal` on the chunk's own square) and builds no mask at all, so the
# chunk's estimate is as good as the full prefill's. What the mask would have added:

# %%
# NBVAL_IGNORE_OUTPUT
n, c = 256, 768
group = tiny.cfg.num_heads // tiny.cfg.num_kv_heads
mask_bytes = group * n * (c + n) * (1 + 4)          # a bool mask + SDPA's float copy of it
measured_over_estimate = {
    name: measured_peak_bytes[name] / accounting.activation_peak_bytes(
        tiny.cfg, shape[0][0], shape[0][1], dtype_bytes=4, logits_rows=1, materialized_scores=False)
    for name, shape in shapes.items()}
for name, ratio in measured_over_estimate.items():
    print(f"{name:20s} measured / estimate = {ratio:.2f}")
print(f"an explicit mask for the chunk would add {mask_bytes / 2**20:.1f} MiB "
      f"({mask_bytes / measured_peak_bytes['chunk 256 over 768']:.0%} of its measured peak)")
assert abs(measured_over_estimate["chunk 256 over 768"] - measured_over_estimate["full 1024"]) < 0.15
assert all(0.9 < r < 1.3 for r in measured_over_estimate.values())

# %% [markdown]
# A mask is a cost of an attention kernel that cannot align causality bottom-right, not of
# chunking: FlashAttention (bottom-right causality built in) and the split above need none.
# On a GPU the same activation gap decides how long a prompt fits next to the KV cache.
#
# What chunking does *not* change is the prompt's KV footprint. One article says that
# without chunking "the memory peak explodes: all KV allocated at once". Every one of the
# prompt's K and V rows is resident before its first token either way (section 2: 64 MiB
# per 512 tokens of Llama-3-8B, whatever the chunk), and a paged engine allocates the
# blocks as the tokens are computed in both cases. Chunking caps the *activation* peak,
# measured above: the per-step temporaries, which scale with the step's new tokens.
#
# ## 7. Checking the FLOPs against PyTorch's own counter
#
# `torch.utils.flop_counter.FlopCounterMode` counts the FLOPs of every matmul the
# forward pass really runs. We run one step of each kind on the tiny model:

# %% slideshow={"slide_type": "subslide"} tags=["slides-hide-input"]
from torch.utils.flop_counter import FlopCounterMode

checks = {"prefill": [(128, 0)], "chunk over cache": [(64, 192, False)],
          "decode batch": [(1, 100), (1, 40), (1, 250)]}
for backend in ("reference", "sdpa"):
    for name, shape in checks.items():
        run = prepare_step(tiny, shape, seed=0, backend=backend)
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            run()
        counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
        linear = counts.get("aten.mm", 0) + counts.get("aten.addmm", 0)
        attention = counts.get("aten.bmm", 0)
        cost = step_cost(tiny.cfg, shape, dtype_bytes=4)
        ours_attention = cost.by_op["attn_scores"][0] + cost.by_op["attn_values"][0]
        square = sum(2 * 2 * n * (n + c) * tiny.cfg.head_dim * tiny.cfg.num_heads
                     for n, c, *_ in shape) * tiny.cfg.num_layers
        print(f"{backend:9s} {name:16s} linear {linear:>12,} vs ours {cost.linear_flops:>12,}; "
              f"attention counted {attention:>10,}, ours {ours_attention:>10,}")
        assert abs(linear - cost.linear_flops) <= 0.01 * cost.linear_flops
        if backend == "reference":
            assert attention == square     # the reference backend computes the whole masked square

# %% [markdown]
# The linear layers agree exactly. Attention differs for two honest reasons: the
# reference backend multiplies the whole `n x (c+n)` rectangle and masks half of it
# afterwards, so it does up to 2x the causal work for a fresh prefill (and exactly our
# count for a decode, which has no masked part); and `scaled_dot_product_attention` runs
# a fused kernel that `FlopCounterMode` does not see on the CPU. Our accounting counts
# the useful causal pairs, which is what FlashAttention-style kernels compute.
#
# ## Takeaways
#
# 1. A step's FLOPs are `2*M*N*K` per GEMM plus `4 * head_dim` per causal pair and head; chunking
#    never changes their sum (same integer for every chunk size).
# 2. A decode batch does few FLOPs per byte (~25 for 32 decodes, section 4) and is bound
#    by reading the weights (a 7B model's decode streams 13.2 GB and takes at least 6.5 ms
#    on an A100-80GB, not 5); a 512-token chunk is past every GPU's ridge point and is
#    bound by compute (a long prefill keeps the GPU busy, not idle).
# 3. Mixing them in one step lets the decodes ride on the weight read the chunk pays for:
#    the step's linear layers are one GEMM over M = chunk + decodes rows. Measured on an
#    A100, M rides free up to one 128-row tile and jumps past it (0.377 ms at 128 rows,
#    0.51 at 160): choose the token budget, not the chunk, as a multiple of the tile.
# 4. The articles' "64 MB" KV write per 512-token chunk is 64 MiB (67.1 MB) and
#    negligible; the KV *re-read* of small chunks is the real (still modest) IO cost.
#    Chunking leaves a prompt's KV footprint as it is and caps the activation peak.
# 5. A roofline needs real-kernel factors to predict: fitted once per GPU (tiles, waves,
#    bandwidth), the cost model matches measured linear-layer times with a median error
#    of 3-5% on the A100 and 3-8% on the H100, held out by model (section 5); the 90th
#    percentile is 7-12% on the A100 and 14-17% on the H100. Attention and host work
#    are assumed, not fitted.
# 6. Two of the articles' formulas are off: a layer's linear FLOPs are 26·L·d² for
#    Llama-3-8B, not 4·L·d²; and a mixed step is a weight read plus the chunk's FLOPs,
#    not the decode step scaled by a FLOP ratio.
#
# **Exercises:** `exercises/05_flops_and_io.ipynb`: the FLOPs of one layer with a sliding
# window (the chapter's layer has none), how many decodes a step needs to reach a GPU's
# ridge point (predicted, then measured with `step_cost`: at long contexts no number does),
# and the chunk to schedule beside a step's decodes when its GEMMs run in tiles, graded
# against the measured A100 operator times.
#
# **Next:** we can now say what a step costs; chapter 6 decides which requests share a step.
