"""Operator times measured on real GPUs, and the cost model's factors fitted to them.

`data/gpu-op-profiles` holds Vidur's per-layer times of qkv_proj, o_proj,
gate_up and down for num_tokens = 1..4096 (or 32768), one CSV per model shape
and GPU (seven files: four on an A100, three on an H100). This module reads
them, compares `cost_model.layer_linear_times_s` with them, and fits the
kernel factors of a `Hardware` (efficiencies, tiles, overlap, launch, floor).

How the shipped A100 and H100 factors were found, once per GPU over ALL the
files of that GPU: a coarse seeded random search (3000 draws over the factor
ranges) gave a starting point, then `fit_hardware_factors(paths, gpu,
trials=300, seed=0)` refined it. Errors on the files the factors were fitted
to are in-sample; `held_out_errors` refits with each file left out and tests
on it, which is what a new model shape on the same GPU would see.

The data directory is found on first use, not at import:
$MINILLM_PROFILE_DIR, else the first of repo/data, repo/shared/data and
../shared/data that exists.
"""
from __future__ import annotations

import csv
import math
import os
import random
from dataclasses import dataclass, replace
from pathlib import Path

from ..metrics import percentile
from ..config import ModelConfig
from .cost_model import layer_linear_times_s
from .profiles import Hardware, gpu_profile

__all__ = [
    "GpuOpProfile", "profile_dir", "profile_paths", "load_gpu_op_profile", "linear_op_errors",
    "error_summary", "fit_hardware_factors", "held_out_errors", "PROFILE_HARDWARE", "LINEAR_OPS",
    "FITTED_OPS",
]

PROFILE_HARDWARE = {"a100": "A100-80GB", "h100": "H100-SXM"}   # file prefix -> profile name
# The per-layer operators we predict and compare (column names of the files).
LINEAR_OPS = ("qkv_proj", "o_proj", "mlp_gate_up_proj", "mlp_down_proj", "mlp")
FITTED_OPS = ("qkv_proj", "o_proj", "mlp_gate_up_proj", "mlp_down_proj")   # the fit's loss


def profile_dir() -> Path:
    """Where the CSVs live, resolved now (so the environment variable can change)."""
    repo = Path(__file__).resolve().parents[2]
    override = os.environ.get("MINILLM_PROFILE_DIR")
    candidates = [Path(override)] if override else []
    candidates += [repo / "data" / "gpu-op-profiles", repo / "shared" / "data" / "gpu-op-profiles",
                   repo.parent / "shared" / "data" / "gpu-op-profiles"]
    return next((c for c in candidates if c.is_dir()), candidates[0])


@dataclass(frozen=True)
class GpuOpProfile:
    """One file of data/gpu-op-profiles: a model shape on one GPU."""
    path: Path
    gpu: str                      # "a100" or "h100"
    hardware: str                 # the matching profile name, e.g. "A100-80GB"
    cfg: ModelConfig              # the shape, one layer
    num_tokens: list              # per row
    times_s: dict                 # column (without _ms) -> list of seconds per row

    def every(self, stride: int) -> "GpuOpProfile":
        """Every stride-th row: a cheaper profile for fitting."""
        keep = range(0, len(self.num_tokens), stride)
        return replace(self, num_tokens=[self.num_tokens[i] for i in keep],
                       times_s={op: [t[i] for i in keep] for op, t in self.times_s.items()})


def profile_paths(directory: str | Path | None = None) -> list[Path]:
    directory = Path(directory) if directory is not None else profile_dir()
    paths = sorted(directory.glob("*.csv"))
    if not paths:
        raise ValueError(f"directory={str(directory)!r}: holds no gpu-op-profile CSV files "
                         "(set MINILLM_PROFILE_DIR to the folder that has them)")
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


def _as_profile(profile) -> GpuOpProfile:
    return profile if isinstance(profile, GpuOpProfile) else load_gpu_op_profile(profile)


def linear_op_errors(profile, hardware=None, ops=LINEAR_OPS, dtype_bytes: int = 2) -> dict:
    """Predicted vs measured per operator: op -> list of (num_tokens, measured_s, predicted_s, rel_error).

    profile: a GpuOpProfile or a path to one; hardware: defaults to the
    profile's GPU. rel_error = (predicted - measured) / measured.
    """
    profile = _as_profile(profile)
    hw = gpu_profile(hardware if hardware is not None else profile.hardware)
    predicted = [layer_linear_times_s(profile.cfg, m, hw, dtype_bytes) for m in profile.num_tokens]
    out = {}
    for op in ops:
        if op not in profile.times_s:
            raise ValueError(f"ops contains {op!r}: not a column of {profile.path.name}; "
                             f"choose from {sorted(profile.times_s)}")
        out[op] = [(m, t, p[op], (p[op] - t) / t)
                   for m, t, p in zip(profile.num_tokens, profile.times_s[op], predicted)]
    return out


def error_summary(errors: dict) -> tuple[float, float]:
    """Median and 90th percentile of |relative error| over all ops and rows of linear_op_errors."""
    abs_errors = [abs(e) for rows in errors.values() for *_, e in rows]
    return percentile(abs_errors, 50), percentile(abs_errors, 90)


def fit_hardware_factors(paths, hardware, trials: int = 300, seed: int = 0) -> Hardware:
    """Refine the kernel factors of `hardware` on measured files of ONE GPU.

    A seeded stochastic hill-climb: each trial perturbs the current best
    gemm_efficiency, bandwidth_efficiency, overlap_exponent, launch and floor
    times by up to +-10% (tiles: a neighbouring power of two) and keeps the
    candidate if the loss drops. Loss: the worst file's max(median |error|,
    p90 |error| / 2.5) over FITTED_OPS. The datasheet peak and bandwidth never
    change. paths: CSV paths or GpuOpProfiles. Returns the best Hardware found.
    """
    base = gpu_profile(hardware)
    profiles = [_as_profile(p) for p in paths]
    if not profiles:
        raise ValueError("paths=[]: need at least one measured profile to fit to")
    rng = random.Random(seed)

    def loss(hw):
        worst = 0.0
        for prof in profiles:
            median, p90 = error_summary(linear_op_errors(prof, hw, FITTED_OPS))
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


# A start that knows nothing about any file: typical fractions of a datasheet,
# a 64x64 tile, a soft overlap, microsecond launches.
NEUTRAL_START = dict(gemm_efficiency=0.7, bandwidth_efficiency=0.85, gemm_tile_m=64, gemm_tile_n=64,
                     overlap_exponent=2.0, kernel_launch_s=5e-6, kernel_floor_s=1e-6)


def held_out_errors(paths=None, trials: int = 150, seed: int = 0, row_stride: int = 3) -> dict:
    """Leave one file out: file name -> {"in_sample": (median, p90), "held_out": (median, p90)}.

    For each file, refit its GPU's factors from NEUTRAL_START on the OTHER
    files of that GPU (the other GPU's files cannot inform them; every
    row_stride-th row, to keep it a few seconds) and measure the errors on the
    left-out file over LINEAR_OPS. in_sample: the shipped factors, fitted on
    all files of the GPU, the left-out one included.
    """
    profiles = [_as_profile(p) for p in (paths if paths is not None else profile_paths())]
    out = {}
    for prof in profiles:
        others = [p.every(row_stride) for p in profiles if p.gpu == prof.gpu and p.path != prof.path]
        if not others:
            raise ValueError(f"paths: {prof.path.name} is the only {prof.gpu} file; "
                             "a held-out fit needs at least one other file of the same GPU")
        start = gpu_profile(prof.hardware).replace(**NEUTRAL_START)
        refit = fit_hardware_factors(others, start, trials=trials, seed=seed)
        out[prof.path.name] = {"in_sample": error_summary(linear_op_errors(prof)),
                               "held_out": error_summary(linear_op_errors(prof, refit)),
                               "fitted_on": [p.path.name for p in others]}
    return out
