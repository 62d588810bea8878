"""How long a step takes on a GPU, predicted from its FLOPs and bytes.

`predict_step(cfg, [(num_new, num_cached), ...], hardware, dtype_bytes)` walks
the same operations as `accounting.step_cost` and times each one. A plain
roofline, max(FLOPs / peak, bytes / bandwidth), is wrong by 2x and more for
the GEMMs of a serving step, because real kernels:

* stream the weights at a fraction of the datasheet bandwidth when M (tokens)
  is small: that is the whole cost of a decode step
  (`Hardware.bandwidth_efficiency`);
* sustain a fraction of the datasheet peak when M is large
  (`Hardware.gemm_efficiency`);
* compute in tiles: M and N are padded up to the tile, and the tiles run in
  waves over the SMs (a partial last wave costs part of a whole one). The GEMM
  library picks the kernel by shape, from `Hardware.tiles`: the largest tile
  once it fills the GPU (`gemm_fill_waves` waves), else the fastest
  (`gemm_tiling`), so 129 tokens can cost what 256 do;
* overlap compute and memory only partly near the ridge: the two times are
  blended as (t_c^p + t_m^p)^(1/p) (`overlap_exponent` p; p = 1 adds them,
  p -> infinity is the roofline's max);
* pay a fixed launch cost per kernel and never run faster than a floor
  (`kernel_launch_s`, `kernel_floor_s`).

The A100 and H100 factors were fitted to operator times measured on those
GPUs; `minillm.sim.op_profiles` loads those measurements, fits the factors and
reports the errors, in-sample and held out (leave one file out).
Attention efficiency (0.5, FlashAttention-2's forward reaches 50-70% of peak
on an A100 by its paper) and the per-step overhead (2 ms of host work:
scheduling, sampling, Python) are assumed, NOT fitted: the measured files
hold no attention kernels and no whole steps; chapter 7 compares whole steps
on this machine instead. The H200 reuses the H100's factors (same chip).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .accounting import OPS, _check_cfg, dtype_bytes_on, normalize_step, step_cost
from ..config import ModelConfig
from .profiles import Hardware, gpu_profile

__all__ = ["StepTime", "predict_step", "gemm_time_s", "gemm_tiling", "GemmTiling", "elementwise_time_s",
           "layer_linear_times_s", "GRAPH_MODES", "DEFAULT_GRAPH_MODE", "DEFAULT_ASYNC_SCHEDULING",
           "default_capture_sizes", "step_graph", "check_graph_mode", "check_capture_sizes"]


@dataclass(frozen=True)
class StepTime:
    """Predicted seconds of one step: by_op summed over layers, plus overhead."""
    total: float
    by_op: dict = field(hash=False)          # same keys as StepCost.by_op, seconds
    overhead_s: float = 0.0                  # total minus by_op: host time not hidden, small kernels
    kind: str = ""                           # "decode", "mixed" or "prefill" (step_graph)
    graph: str = "none"                      # "full", "piecewise" or "none" (eager)
    rows: int = 0                            # tokens computed, padding to the capture size included
    device_s: float = 0.0                    # the GPU's kernels (by_op + small kernels)
    host_s: float = 0.0                      # scheduling, input preparation, sampling, outputs
    launch_s: float = 0.0                    # host time launching kernels and graph replays
    reason: str = ""                         # why the step costs what it does


# ---- one kernel --------------------------------------------------------------
# The GEMM formulas below take M (tokens) as one number, for a step, or as a numpy
# array of them, for the fit in op_profiles (hundreds of rows per guess): the same
# formula either way, the scalar path in plain Python because a simulation asks it
# once per operator per step.

def _ceil(x):
    return np.ceil(x) if isinstance(x, np.ndarray) else math.ceil(x)


def _maximum(a, b):
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def _minimum(a, b):
    return np.minimum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else min(a, b)


def _blend(t_compute_s, t_memory_s, p: float):
    if p >= 1e6:
        return _maximum(t_compute_s, t_memory_s)
    hi = _maximum(t_compute_s, t_memory_s)
    if not isinstance(hi, np.ndarray) and hi == 0:
        return 0.0
    # scaled to avoid overflow for large p
    return hi * ((t_compute_s / hi) ** p + (t_memory_s / hi) ** p) ** (1.0 / p)


@dataclass(frozen=True)
class GemmTiling:
    """How one GEMM's output [m, n] is cut into tiles and the tiles into waves over the SMs."""
    m: int
    n: int
    tile_m: int
    tile_n: int
    efficiency: float
    row_tiles: int                 # ceil(m / tile_m)
    col_tiles: int                 # ceil(n / tile_n)
    num_sms: int                   # 0: no waves (a CPU)
    compute_s: float               # the tiles' compute time, partial wave included

    @property
    def tiles(self) -> int:
        return self.row_tiles * self.col_tiles

    @property
    def waves(self) -> float:
        """Tiles over SMs: 1.3 means one full wave and a last one 30% full."""
        return self.tiles / self.num_sms if self.num_sms else 0.0

    def describe(self) -> str:
        text = (f"{self.m} rows: {self.row_tiles} tiles of {self.tile_m} rows x {self.col_tiles} of "
                f"{self.tile_n} columns = {self.tiles} tiles")
        if self.num_sms:
            text += f", {self.waves:.1f} waves on {self.num_sms} SMs"
        return text


def _tile_compute_s(m, k, n, tile_m, tile_n, efficiency, wave_quantization, hw):
    """(row tiles, column tiles, seconds) of the tile kernel (tile_m, tile_n) on [m, k] x [k, n]."""
    row_tiles, col_tiles = _ceil(m / tile_m), _ceil(n / tile_n)
    tile_flops = 2 * tile_m * tile_n * k
    if hw.num_sms:
        # Each SM computes one tile at a time: the work is the waves, a partial last
        # wave charged between its share (0) and a whole wave (1).
        waves = row_tiles * col_tiles / hw.num_sms
        waves = waves + wave_quantization * (_ceil(waves) - waves)
        work_flops = waves * hw.num_sms * tile_flops
    else:
        work_flops = row_tiles * col_tiles * tile_flops      # partial tiles cost whole ones
    return row_tiles, col_tiles, work_flops / (hw.peak_flops_s * efficiency)


def _kernels(m, k, n, hw, dtype_bytes):
    """Each tile kernel of hw.tiles on this GEMM, the largest tile first:
    [(tile, row tiles, column tiles, compute s, blended s with the memory time)]."""
    t_memory_s = _gemm_memory_s(m, k, n, hw, dtype_bytes)
    out = []
    for tile in sorted(hw.tiles, key=lambda t: -t[0] * t[1]):
        rows, cols, t_compute_s = _tile_compute_s(m, k, n, *tile, hw)
        out.append((tile, rows, cols, t_compute_s, _blend(t_compute_s, t_memory_s, hw.overlap_exponent)))
    return out


def _fills_the_gpu(rows, cols, hw):
    """Enough tiles for hw.gemm_fill_waves waves over the SMs."""
    return rows * cols >= hw.gemm_fill_waves * hw.num_sms


def _chosen_time_s(kernels, hw):
    """The time of the kernel a GEMM library runs (see gemm_tiling), for one M or an array."""
    if not isinstance(kernels[0][4], np.ndarray):          # one M: the first that fills, else the fastest
        if hw.num_sms:
            for _, rows, cols, _, t in kernels:
                if _fills_the_gpu(rows, cols, hw):
                    return t
        return min(t for *_, t in kernels)
    fastest = kernels[0][4]
    for *_, t in kernels[1:]:
        fastest = np.minimum(fastest, t)
    if not hw.num_sms:
        return fastest
    time_s, decided = fastest.copy(), np.zeros(fastest.shape, dtype=bool)
    for _, rows, cols, _, t in kernels:
        takes = _fills_the_gpu(rows, cols, hw) & ~decided
        time_s[takes] = t[takes]
        decided |= takes
    return time_s


def gemm_tiling(m: int, k: int, n: int, hardware, dtype_bytes: int = 2) -> GemmTiling:
    """The tile kernel an [m, k] x [k, n] GEMM runs with on `hardware`, and its waves.

    The choice, as a GEMM library's heuristic makes it (cuBLAS picks from a table of
    kernels by shape, not by timing each): the LARGEST tile of Hardware.tiles whose
    tiles fill the GPU (at least one wave over the SMs), because a large tile reuses
    each operand load over more outputs; only when no tile fills it (a small M), the
    fastest. So the large tile is taken even when its partial last wave costs more
    than a smaller tile would: the GPU's measured drops in speed, just past a full
    wave, come from that (e.g. 512 -> 520 rows of an [., 8192] x [8192, 8192] GEMM
    on the H100). On a CPU (num_sms 0): the fastest.
    """
    hw = gpu_profile(hardware)
    m, k, n = (_positive(name, v) for name, v in (("m", m), ("k", k), ("n", n)))
    kernels = _kernels(m, k, n, hw, dtype_bytes)
    t = _chosen_time_s(kernels, hw)
    tile, rows, cols, t_compute_s, _ = next(kern for kern in kernels if kern[4] == t)
    return GemmTiling(m, n, tile[0], tile[1], tile[2], rows, cols, hw.num_sms, t_compute_s)


def _positive(name, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r}: a GEMM dimension is a whole number >= 1")
    return value


def _gemm_memory_s(m, k, n, hw, dtype_bytes):
    bytes_moved = (k * n + m * k + m * n) * dtype_bytes
    return bytes_moved / (hw.mem_bandwidth_bytes_s * hw.bandwidth_efficiency)


def gemm_time_s(m, k: int, n: int, hw: Hardware, dtype_bytes: int = 2):
    """[m, k] x [k, n] with an [k, n] weight: seconds on hw.

    Compute: the tiles (M and N padded to the tile) in waves over the SMs, at the
    tile kernel's efficiency; memory: weights, input and output at the streaming
    bandwidth; blended (see _blend); the kernel is the one gemm_tiling chooses.
    m: tokens, one number or a numpy array of them (then an array of seconds; k and
    n may then be arrays of the same length too: many GEMMs priced at once, as the
    fit in op_profiles does).
    """
    if isinstance(m, np.ndarray):
        t = np.maximum(_chosen_time_s(_kernels(m, k, n, hw, dtype_bytes), hw) + hw.kernel_launch_s,
                       hw.kernel_floor_s)
        return np.where(m == 0, 0.0, t)
    if m == 0:
        return 0.0
    memo = hw.gemm_seconds_memo
    key = (m, k, n, dtype_bytes)
    if key not in memo:
        memo[key] = max(_chosen_time_s(_kernels(m, k, n, hw, dtype_bytes), hw) + hw.kernel_launch_s,
                        hw.kernel_floor_s)
    return memo[key]


def elementwise_time_s(bytes_moved, hw: Hardware):
    """A memory-bound kernel (activation, norm, residual add): bytes over bandwidth.

    With hw.elementwise_efficiency set (the GPUs, fitted to their measured norms,
    RoPE, residual adds and activation): bytes over that fraction of bandwidth,
    never under elementwise_floor_s. Else the weight-streaming efficiency plus a
    launch cost (a calibrated CPU). bytes_moved: one number or a numpy array."""
    if not isinstance(bytes_moved, np.ndarray) and bytes_moved == 0:
        return 0.0
    if hw.elementwise_efficiency is not None:
        t = _maximum(bytes_moved / (hw.mem_bandwidth_bytes_s * hw.elementwise_efficiency),
                     hw.elementwise_floor_s)
    else:
        t = _maximum(bytes_moved / (hw.mem_bandwidth_bytes_s * hw.bandwidth_efficiency) + hw.kernel_launch_s,
                     hw.kernel_floor_s)
    return np.where(bytes_moved == 0, 0.0, t) if isinstance(bytes_moved, np.ndarray) else t


def layer_linear_times_s(cfg: ModelConfig, num_tokens, hw: Hardware,
                         dtype_bytes: int = 2) -> dict:
    """Seconds of ONE layer's linear operators for num_tokens packed tokens.

    Keys match the profile files: qkv_proj, o_proj, mlp_gate_up_proj, mlp_act,
    mlp_down_proj, and mlp = gate_up + act + down. num_tokens: one count, or a
    numpy array of counts (each value then an array: op_profiles fits this way).
    """
    d, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    times = {
        "qkv_proj": gemm_time_s(num_tokens, d, q + 2 * kv, hw, dtype_bytes),
        "o_proj": gemm_time_s(num_tokens, q, d, hw, dtype_bytes),
        "mlp_gate_up_proj": gemm_time_s(num_tokens, d, 2 * inter, hw, dtype_bytes),
        # SiLU(gate) * up: read [T, 2I], write [T, I]
        "mlp_act": elementwise_time_s(num_tokens * 3 * inter * dtype_bytes, hw),
        "mlp_down_proj": gemm_time_s(num_tokens, inter, d, hw, dtype_bytes),
    }
    times["mlp"] = times["mlp_gate_up_proj"] + times["mlp_act"] + times["mlp_down_proj"]
    return times


# ---- how a step runs: CUDA graphs by step type, host time ----------------------

GRAPH_MODES = ("none", "piecewise", "full_and_piecewise")
DEFAULT_GRAPH_MODE = "full_and_piecewise"     # vLLM V1's cudagraph_mode default
DEFAULT_ASYNC_SCHEDULING = True               # vLLM's default since v0.14.0
# Kernels one decoder layer launches when run eagerly: 2 norms, qkv, RoPE, the KV-cache
# write, attention, o_proj, 2 residual adds, gate_up, the activation, down.
KERNELS_PER_LAYER = 12
KERNELS_PER_STEP = 4          # embedding, final norm, lm_head, sampling


def default_capture_sizes(max_num_seqs: int = 256, max_num_batched_tokens: int | None = None) -> tuple:
    """The token counts vLLM V1 captures CUDA graphs for, by its default rule.

    vLLM (vllm/config/vllm.py, VllmConfig._set_cudagraph_sizes, read at commit
    000fc94b of vllm-project/vllm; the same rule since v0.11 but for the last line):
    max_cudagraph_capture_size = min(2 * max_num_seqs, 512) (1024 on data-centre
    Blackwell, not modelled), capped at max_num_batched_tokens; sizes [1, 2, 4],
    then every 8 below 256, then every 16 from 256 up to that maximum; and
    max_num_batched_tokens itself when it is the maximum and off that stride. A
    step is padded up to the next size. Speculative decoding's sizes are not modelled.
    """
    max_num_seqs = _positive("max_num_seqs", max_num_seqs)
    largest = min(2 * max_num_seqs, 512)
    if max_num_batched_tokens is not None:
        largest = min(largest, _positive("max_num_batched_tokens", max_num_batched_tokens))
    sizes = [s for s in (1, 2, 4) if s <= largest]
    sizes += list(range(8, min(largest + 1, 256), 8)) + list(range(256, largest + 1, 16))
    if max_num_batched_tokens is not None and max_num_batched_tokens == largest:
        sizes.append(largest)                 # the whole budget is captured even off-stride
    return tuple(sorted(set(sizes)))


def check_capture_sizes(capture_sizes) -> tuple:
    """None -> vLLM's default for 256 sequences; else sorted whole numbers >= 1."""
    if capture_sizes is None:
        return default_capture_sizes()
    try:
        sizes = tuple(sorted(set(capture_sizes)))
    except TypeError:
        sizes = ()
    if not sizes or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in sizes):
        raise ValueError(f"capture_sizes={capture_sizes!r}: give token counts >= 1, e.g. (1, 2, 4, 8, 16), "
                         "or None for vLLM's default")
    return sizes


def check_graph_mode(graph_mode) -> str:
    if graph_mode not in GRAPH_MODES:
        raise ValueError(f"graph_mode={graph_mode!r}: use one of {GRAPH_MODES} (vLLM's cudagraph_mode "
                         "NONE, PIECEWISE, FULL_AND_PIECEWISE)")
    return graph_mode


def step_graph(reqs, graph_mode: str, capture_sizes: tuple) -> tuple[str, str, int, int]:
    """How vLLM V1 runs a step: (kind, graph, rows padded to, reason).

    kind: "decode" (every request one new token: a uniform decode batch), "prefill"
    (no decodes) or "mixed". graph: "full" (the whole forward is one replayed graph),
    "piecewise" (graphs between the attention calls, attention launched eagerly) or
    "none" (every kernel launched eagerly). A graph exists only for a step of at most
    max(capture_sizes) tokens, and runs at the next capture size: the padded rows
    are computed too.
    """
    num_tokens = sum(n for n, _, _ in reqs)
    decodes = sum(1 for n, c, _ in reqs if n == 1 and c > 0)
    kind = "decode" if all(n == 1 for n, _, _ in reqs) else ("mixed" if decodes else "prefill")
    largest = capture_sizes[-1]
    if graph_mode == "none":
        return kind, "none", num_tokens, f"{kind} step of {num_tokens} rows, graph mode none: eager"
    if num_tokens > largest:
        return kind, "none", num_tokens, (f"{kind} step of {num_tokens} rows > largest capture size "
                                          f"{largest}: eager")
    padded = next(s for s in capture_sizes if s >= num_tokens)
    graph = "full" if kind == "decode" and graph_mode == "full_and_piecewise" else "piecewise"
    why = ("uniform decode batch" if graph == "full" else
           f"{kind} step" + (": attention eager" if kind != "decode" else
                             " (graph mode piecewise): attention eager"))
    return kind, graph, padded, (f"{why}, {num_tokens} rows <= {largest}: {graph} graph at capture size "
                                 f"{padded} ({padded - num_tokens} padded rows)")


# ---- one step ----------------------------------------------------------------

def predict_step(cfg, requests, hardware="H100-SXM", dtype_bytes: int | None = None, *,
                 graph_mode: str = DEFAULT_GRAPH_MODE, capture_sizes=None,
                 async_scheduling: bool = DEFAULT_ASYNC_SCHEDULING) -> StepTime:
    """Predicted seconds of one step of a packed batch on `hardware`.

    requests: [(num_new_tokens, num_cached_tokens[, samples]), ...] as in
    accounting.step_cost. hardware: a profile name or a Hardware object (such
    as hardware.calibrate()). dtype_bytes: bytes per weight and KV element;
    None: the profile's own dtype (2 for the GPUs' bfloat16, 4 for a CPU
    calibrated in float32). Each operation takes the blended max of its
    compute and memory times (see the module docstring); by_op sums over layers.

    On a GPU (hardware.num_sms > 0) the step runs as vLLM V1 would run it
    (step_graph): graph_mode "full_and_piecewise" (vLLM's default), "piecewise"
    or "none"; capture_sizes None: vLLM's default sizes (default_capture_sizes);
    padded rows cost. Host work (step_overhead_s: scheduling, input preparation,
    sampling, outputs) and kernel launches (host_launch_s per eager kernel,
    graph_launch_s per graph replay) run on the CPU; the kernels on the GPU.
    async_scheduling=False: the host's work comes before the GPU's (total = host
    + max(launches, device)); True (vLLM's default since v0.14): the host
    prepares this step while the GPU runs the previous one, taken to be alike,
    so a step costs max(host + launches, device). On a CPU (num_sms == 0) there
    are no graphs and nothing overlaps: total = kernels + step_overhead_s.
    """
    cfg = _check_cfg(cfg)
    hw = gpu_profile(hardware)
    b = dtype_bytes_on(hw, dtype_bytes)
    graph_mode = check_graph_mode(graph_mode)
    capture_sizes = check_capture_sizes(capture_sizes)
    if not isinstance(async_scheduling, bool):
        raise ValueError(f"async_scheduling={async_scheduling!r}: True or False")
    reqs = normalize_step(requests)
    num_tokens = sum(n for n, _, _ in reqs)
    num_sampled = sum(1 for _, _, s in reqs if s)
    layers = cfg.num_layers
    if num_tokens == 0:
        return StepTime(hw.step_overhead_s, {op: 0.0 for op in OPS}, hw.step_overhead_s,
                        host_s=hw.step_overhead_s, reason="empty step: host work only")
    if hw.has_cuda_graphs:
        kind, graph, rows, reason = step_graph(reqs, graph_mode, capture_sizes)
    else:
        kind, graph, rows, reason = step_graph(reqs, "none", capture_sizes)
        reason = reason.replace("graph mode none", "no CUDA graphs on this hardware")

    # The GEMMs and small kernels run over every row the graph computes, padding included.
    linear = layer_linear_times_s(cfg, rows, hw, b)
    cost = step_cost(cfg, reqs, b)
    # Attention is one fused kernel per layer (FlashAttention); it is compute-bound
    # for a long chunk and memory-bound (KV reads) for decodes over long contexts.
    attn_flops = (cost.by_op["attn_scores"][0] + cost.by_op["attn_values"][0]) / layers
    attn_bytes = (cost.by_op["attn_scores"][1] + cost.by_op["attn_values"][1]) / layers
    attn_s = _blend(attn_flops / (hw.peak_flops_s * hw.attention_efficiency),
                    attn_bytes / hw.attention_bandwidth_bytes_s,
                    hw.overlap_exponent) + hw.kernel_launch_s
    attn_s = max(attn_s, hw.kernel_floor_s)
    by_op = {
        "qkv_proj": layers * linear["qkv_proj"],
        "attn_scores": layers * attn_s / 2,        # one kernel: split evenly (equal FLOPs)
        "attn_values": layers * attn_s / 2,
        "o_proj": layers * linear["o_proj"],
        "mlp": layers * linear["mlp"],
        "lm_head": gemm_time_s(num_sampled, cfg.hidden_size, cfg.vocab_size, hw, b),
    }
    # Not in by_op: two RMSNorms, RoPE and two residual adds per layer (each
    # reads and writes [T, d]-sized activations), the embedding gather.
    per_layer_misc_s = 5 * elementwise_time_s(2 * rows * cfg.hidden_size * b, hw)
    small_kernels_s = (hw.per_seq_overhead_s * len(reqs) + layers * per_layer_misc_s
                       + elementwise_time_s(rows * cfg.hidden_size * b, hw))
    device_s = sum(by_op.values()) + small_kernels_s
    host_s = hw.step_overhead_s
    if not hw.has_cuda_graphs:
        # A CPU: the "kernels" are the host's own work; nothing overlaps.
        total = device_s + host_s
        return StepTime(total, by_op, total - sum(by_op.values()), kind=kind, graph=graph, rows=rows,
                        device_s=device_s, host_s=host_s, reason=reason)
    if graph == "full":
        launch_s = hw.graph_launch_s
    elif graph == "piecewise":          # a graph between attentions: layers + 1 pieces
        launch_s = (layers + 1) * hw.graph_launch_s + layers * hw.host_launch_s
    else:
        launch_s = (layers * KERNELS_PER_LAYER + KERNELS_PER_STEP) * hw.host_launch_s
    if async_scheduling:
        total = max(host_s + launch_s, device_s)
        reason += "; async scheduling: host work hides behind the GPU's" if device_s >= host_s + launch_s \
            else "; async scheduling: the host is the slower side"
    else:
        total = host_s + max(launch_s, device_s)
        reason += "; synchronous: host work, then the GPU"
    return StepTime(total, by_op, total - sum(by_op.values()), kind=kind, graph=graph, rows=rows,
                    device_s=device_s, host_s=host_s, launch_s=launch_s, reason=reason)
