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
* compute in tiles: M and N are padded up to the tile (`gemm_tile_m`,
  `gemm_tile_n`), so 129 tokens cost what 192 do on a 64-row tile;
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

from .accounting import OPS, _check_cfg, dtype_bytes_on, normalize_step, step_cost
from ..config import ModelConfig
from .profiles import Hardware, gpu_profile

__all__ = ["StepTime", "predict_step", "gemm_time_s", "elementwise_time_s", "layer_linear_times_s"]


@dataclass(frozen=True)
class StepTime:
    """Predicted seconds of one step: by_op summed over layers, plus overhead."""
    total: float
    by_op: dict = field(hash=False)          # same keys as StepCost.by_op, seconds
    overhead_s: float = 0.0                  # step overhead + norms, RoPE, residuals, embedding


# ---- one kernel --------------------------------------------------------------

def _blend(t_compute_s: float, t_memory_s: float, p: float) -> float:
    if p >= 1e6:
        return max(t_compute_s, t_memory_s)
    hi = max(t_compute_s, t_memory_s)
    if hi == 0:
        return 0.0
    # scaled to avoid overflow for large p
    return hi * ((t_compute_s / hi) ** p + (t_memory_s / hi) ** p) ** (1.0 / p)


def gemm_time_s(m: int, k: int, n: int, hw: Hardware, dtype_bytes: int = 2) -> float:
    """[m, k] x [k, n] with an [k, n] weight: seconds on hw."""
    if m == 0:
        return 0.0
    m_padded = math.ceil(m / hw.gemm_tile_m) * hw.gemm_tile_m     # partial tiles cost whole ones
    n_padded = math.ceil(n / hw.gemm_tile_n) * hw.gemm_tile_n
    t_compute_s = 2 * m_padded * n_padded * k / (hw.peak_flops_s * hw.gemm_efficiency)
    bytes_moved = (k * n + m * k + m * n) * dtype_bytes
    t_memory_s = bytes_moved / (hw.mem_bandwidth_bytes_s * hw.bandwidth_efficiency)
    t = _blend(t_compute_s, t_memory_s, hw.overlap_exponent) + hw.kernel_launch_s
    return max(t, hw.kernel_floor_s)


def elementwise_time_s(bytes_moved: int, hw: Hardware) -> float:
    """A memory-bound kernel (activation, norm, residual add): bytes over bandwidth."""
    if bytes_moved == 0:
        return 0.0
    t = bytes_moved / (hw.mem_bandwidth_bytes_s * hw.bandwidth_efficiency) + hw.kernel_launch_s
    return max(t, hw.kernel_floor_s)


def layer_linear_times_s(cfg: ModelConfig, num_tokens: int, hw: Hardware,
                         dtype_bytes: int = 2) -> dict[str, float]:
    """Seconds of ONE layer's linear operators for num_tokens packed tokens.

    Keys match the profile files: qkv_proj, o_proj, mlp_gate_up_proj, mlp_act,
    mlp_down_proj, and mlp = gate_up + act + down.
    """
    d, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    times = {
        "qkv_proj": gemm_time_s(num_tokens, d, q + 2 * kv, hw, dtype_bytes),
        "o_proj": gemm_time_s(num_tokens, q, d, hw, dtype_bytes),
        "mlp_gate_up_proj": gemm_time_s(num_tokens, d, 2 * inter, hw, dtype_bytes),
        # SiLU(gate) * up: read [T, 2I], write [T, I]
        "mlp_act": elementwise_time_s(num_tokens * 3 * inter * dtype_bytes, hw) if num_tokens else 0.0,
        "mlp_down_proj": gemm_time_s(num_tokens, inter, d, hw, dtype_bytes),
    }
    times["mlp"] = times["mlp_gate_up_proj"] + times["mlp_act"] + times["mlp_down_proj"]
    return times


# ---- one step ----------------------------------------------------------------

def predict_step(cfg, requests, hardware="H100-SXM", dtype_bytes: int | None = None) -> StepTime:
    """Predicted seconds of one step of a packed batch on `hardware`.

    requests: [(num_new_tokens, num_cached_tokens[, samples]), ...] as in
    accounting.step_cost. hardware: a profile name or a Hardware object (such
    as hardware.calibrate()). dtype_bytes: bytes per weight and KV element;
    None: the profile's own dtype (2 for the GPUs' bfloat16, 4 for a CPU
    calibrated in float32). Each operation takes the blended max of its
    compute and memory times (see the module docstring); by_op sums over layers.
    """
    cfg = _check_cfg(cfg)
    hw = gpu_profile(hardware)
    b = dtype_bytes_on(hw, dtype_bytes)
    reqs = normalize_step(requests)
    num_tokens = sum(n for n, _, _ in reqs)
    num_sampled = sum(1 for _, _, s in reqs if s)
    layers = cfg.num_layers
    if num_tokens == 0:
        return StepTime(hw.step_overhead_s, {op: 0.0 for op in OPS}, hw.step_overhead_s)

    linear = layer_linear_times_s(cfg, num_tokens, hw, b)
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
    per_layer_misc_s = 5 * elementwise_time_s(2 * num_tokens * cfg.hidden_size * b, hw)
    overhead_s = (hw.step_overhead_s + hw.per_seq_overhead_s * len(reqs) + layers * per_layer_misc_s
                  + elementwise_time_s(num_tokens * cfg.hidden_size * b, hw))
    return StepTime(sum(by_op.values()) + overhead_s, by_op, overhead_s)
