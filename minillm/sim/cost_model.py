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

How the A100 and H100 factors were fitted, once per GPU, over ALL the
operator files of that GPU in shared/data/gpu-op-profiles (Vidur's
measurements of qkv_proj, o_proj, gate_up and down for num_tokens = 1..4096
or 32768): a coarse seeded random search (3000 draws over the factor ranges)
gave a starting point, then `fit_hardware_factors(paths, gpu, trials=300,
seed=0)` refined it, minimising the worst file's max(median |error|,
p90 |error| / 2.5). The datasheet
peak and bandwidth stay fixed; only the factors above are fitted. The same
factors then serve every model shape on that GPU (the test checks each file).
Attention efficiency (0.5, FlashAttention-2's forward reaches 50-70% of peak
on an A100 by its paper) and the per-step overhead (2 ms of host work:
scheduling, sampling, Python) are NOT validated by those files, which hold no
attention kernels and no whole steps; chapter 7 compares whole steps on this
machine instead.
"""
from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from .accounting import OPS, _check_cfg, _check_dtype_bytes, normalize_step, step_cost
from ..config import ModelConfig
from ..metrics import percentile
from .hardware import Hardware, get_hardware

__all__ = [
    "StepTime", "predict_step", "gemm_time_s", "elementwise_time_s", "layer_linear_times_s",
    "GpuOpProfile", "load_gpu_op_profile", "linear_op_errors", "profile_paths",
    "fit_hardware_factors", "PROFILE_DIR", "PROFILE_HARDWARE", "LINEAR_OPS",
]

# Where the measured operator times live, and the profile of each file prefix.
def _find_profile_dir() -> Path:
    """$MINILLM_PROFILE_DIR, else the first of repo/data, repo/shared/data, ../shared/data."""
    import os
    repo = Path(__file__).resolve().parents[2]
    candidates = [Path(os.environ["MINILLM_PROFILE_DIR"])] if os.environ.get("MINILLM_PROFILE_DIR") else []
    candidates += [repo / "data" / "gpu-op-profiles", repo / "shared" / "data" / "gpu-op-profiles",
                   repo.parent / "shared" / "data" / "gpu-op-profiles"]
    return next((c for c in candidates if c.is_dir()), candidates[-1])


PROFILE_DIR = _find_profile_dir()
PROFILE_HARDWARE = {"a100": "A100-80GB", "h100": "H100-SXM"}
# The per-layer operators we predict and compare (column names of the files).
LINEAR_OPS = ("qkv_proj", "o_proj", "mlp_gate_up_proj", "mlp_down_proj", "mlp")


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

def predict_step(cfg, requests, hardware="H100-SXM", dtype_bytes: int = 2) -> StepTime:
    """Predicted seconds of one step of a packed batch on `hardware`.

    requests: [(num_new_tokens, num_cached_tokens[, samples]), ...] as in
    accounting.step_cost. hardware: a profile name or a Hardware object (such
    as hardware.calibrate()). Each operation takes the blended max of its
    compute and memory times (see the module docstring); by_op sums over layers.
    """
    cfg = _check_cfg(cfg)
    hw = get_hardware(hardware)
    b = _check_dtype_bytes(dtype_bytes)
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
                    attn_bytes / (hw.mem_bandwidth_bytes_s * hw.bandwidth_efficiency),
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


# ---- fidelity against measured GPU operator times -----------------------------

@dataclass(frozen=True)
class GpuOpProfile:
    """One file of shared/data/gpu-op-profiles: a model shape on one GPU."""
    path: Path
    gpu: str                      # "a100" or "h100"
    hardware: str                 # the matching profile name, e.g. "A100-80GB"
    cfg: ModelConfig              # the shape, one layer
    num_tokens: list              # per row
    times_s: dict                 # column (without _ms) -> list of seconds per row


def profile_paths(directory: str | Path | None = None) -> list[Path]:
    directory = Path(directory) if directory is not None else PROFILE_DIR
    paths = sorted(directory.glob("*.csv"))
    if not paths:
        raise ValueError(f"directory={str(directory)!r}: holds no gpu-op-profile CSV files")
    return paths


def load_gpu_op_profile(path: str | Path) -> GpuOpProfile:
    """Read one CSV: the model shape, num_tokens and each operator's times in seconds."""
    path = Path(path)
    gpu = path.name.split("_")[0]
    if gpu not in PROFILE_HARDWARE:
        raise ValueError(f"path={str(path)!r}: file name must start with one of "
                         f"{sorted(PROFILE_HARDWARE)} followed by '_'")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    first = rows[0]
    cfg = ModelConfig(name=path.stem.split("_", 1)[1], vocab_size=int(first["vocab_size"]),
                      hidden_size=int(first["n_embd"]), intermediate_size=int(first["n_expanded_embd"]),
                      num_layers=1, num_heads=int(first["n_head"]), num_kv_heads=int(first["n_kv_head"]))
    times_s = {col[:-3]: [float(r[col]) * 1e-3 for r in rows] for col in first if col.endswith("_ms")}
    times_s["mlp"] = [g + a + dn for g, a, dn in zip(times_s["mlp_gate_up_proj"],
                                                   times_s["mlp_act"], times_s["mlp_down_proj"])]
    return GpuOpProfile(path, gpu, PROFILE_HARDWARE[gpu], cfg,
                        [int(r["num_tokens"]) for r in rows], times_s)


def linear_op_errors(profile, hardware=None, ops=LINEAR_OPS, dtype_bytes: int = 2) -> dict:
    """Predicted vs measured per operator: op -> list of (num_tokens, measured_s, predicted_s, rel_error).

    profile: a GpuOpProfile or a path to one; hardware: defaults to the
    profile's GPU. rel_error = (predicted - measured) / measured.
    """
    if not isinstance(profile, GpuOpProfile):
        profile = load_gpu_op_profile(profile)
    hw = get_hardware(hardware if hardware is not None else profile.hardware)
    predicted = [layer_linear_times_s(profile.cfg, m, hw, dtype_bytes) for m in profile.num_tokens]
    out = {}
    for op in ops:
        if op not in profile.times_s:
            raise ValueError(f"ops contains {op!r}: not a column of {profile.path.name}; "
                             f"choose from {sorted(profile.times_s)}")
        out[op] = [(m, t, p[op], (p[op] - t) / t)
                   for m, t, p in zip(profile.num_tokens, profile.times_s[op], predicted)]
    return out


def _error_summary(errors: dict) -> tuple[float, float]:
    """Median and 90th percentile of |relative error| over all ops and rows."""
    abs_errors = [abs(e) for rows in errors.values() for *_, e in rows]
    return percentile(abs_errors, 50), percentile(abs_errors, 90)


def fit_hardware_factors(paths, hardware, trials: int = 300, seed: int = 0) -> Hardware:
    """Refine the kernel factors of `hardware` on measured files of ONE GPU. Slow: run offline.

    A seeded stochastic hill-climb: each trial perturbs the current best
    gemm_efficiency, bandwidth_efficiency, overlap_exponent, launch and floor
    times by up to +-10% (tiles: a neighbouring power of two) and keeps the
    candidate if the loss drops. Loss: the worst file's max(median |error|,
    p90 |error| / 2.5) over qkv_proj, o_proj, gate_up and down. The datasheet
    peak and bandwidth never change. Returns the best Hardware found.
    """
    base = get_hardware(hardware)
    profiles = [p if isinstance(p, GpuOpProfile) else load_gpu_op_profile(p) for p in paths]
    ops = ("qkv_proj", "o_proj", "mlp_gate_up_proj", "mlp_down_proj")
    rng = random.Random(seed)

    def loss(hw):
        worst = 0.0
        for prof in profiles:
            median, p90 = _error_summary(linear_op_errors(prof, hw, ops))
            worst = max(worst, median, p90 / 2.5)
        return worst

    def nudge(value, low, high):
        return min(high, max(low, value * rng.uniform(0.9, 1.1)))

    best, best_loss = base, loss(base)
    for _ in range(trials):
        candidate = best.replace(
            gemm_efficiency=round(nudge(best.gemm_efficiency, 0.3, 1.0), 3),
            bandwidth_efficiency=round(nudge(best.bandwidth_efficiency, 0.3, 1.0), 3),
            gemm_tile_m=rng.choice([best.gemm_tile_m, max(16, best.gemm_tile_m // 2),
                                    min(256, best.gemm_tile_m * 2)]),
            gemm_tile_n=rng.choice([best.gemm_tile_n, max(16, best.gemm_tile_n // 2),
                                    min(256, best.gemm_tile_n * 2)]),
            overlap_exponent=round(nudge(best.overlap_exponent, 1.0, 20.0), 2),
            kernel_launch_s=round(nudge(best.kernel_launch_s or 1e-6, 0, 2e-5), 8),
            kernel_floor_s=round(nudge(best.kernel_floor_s or 1e-6, 0, 3e-5), 8))
        candidate_loss = loss(candidate)
        if candidate_loss < best_loss:
            best, best_loss = candidate, candidate_loss
    return best
