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
    "FITTED_OPS", "MAX_ROWS", "NEUTRAL_START", "NON_ATTENTION_OPS", "measured_layer_s",
    "chunked_vs_whole",
]

PROFILE_HARDWARE = {"a100": "A100-80GB", "h100": "H100-SXM"}   # file prefix -> profile name
# The per-layer operators we predict and compare (column names of the files).
LINEAR_OPS = ("qkv_proj", "o_proj", "mlp_gate_up_proj", "mlp_down_proj", "mlp")
FITTED_OPS = ("qkv_proj", "o_proj", "mlp_gate_up_proj", "mlp_down_proj")   # the fit's loss
MAX_ROWS = 4096       # rows compared: 1..4096 (every file has them; Llama-3-8B's go to 32768)


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


def linear_op_errors(profile, hardware=None, ops=LINEAR_OPS, dtype_bytes: int = 2,
                     max_rows: int | None = MAX_ROWS) -> dict:
    """Predicted vs measured per operator: op -> list of (num_tokens, measured_s, predicted_s, rel_error).

    Rows up to max_rows tokens (None: all).
    profile: a GpuOpProfile or a path to one; hardware: defaults to the
    profile's GPU. rel_error = (predicted - measured) / measured.
    """
    profile = _as_profile(profile)
    hw = gpu_profile(hardware if hardware is not None else profile.hardware)
    keep = [i for i, m in enumerate(profile.num_tokens) if max_rows is None or m <= max_rows]
    rows = [profile.num_tokens[i] for i in keep]
    predicted = [layer_linear_times_s(profile.cfg, m, hw, dtype_bytes) for m in rows]
    out = {}
    for op in ops:
        if op not in profile.times_s:
            raise ValueError(f"ops contains {op!r}: not a column of {profile.path.name}; "
                             f"choose from {sorted(profile.times_s)}")
        measured = [profile.times_s[op][i] for i in keep]
        out[op] = [(m, t, p[op], (p[op] - t) / t) for m, t, p in zip(rows, measured, predicted)]
    return out


def error_summary(errors: dict) -> tuple[float, float]:
    """Median and 90th percentile of |relative error| over all ops and rows of linear_op_errors."""
    abs_errors = [abs(e) for rows in errors.values() for *_, e in rows]
    return percentile(abs_errors, 50), percentile(abs_errors, 90)


def fit_hardware_factors(paths, hardware, trials: int = 300, seed: int = 0) -> Hardware:
    """Refine the kernel factors of `hardware` on measured files of ONE GPU.

    A seeded stochastic hill-climb: each trial perturbs the current best tile
    kernels' efficiencies (the tile shapes and the SM count stay), the wave
    quantization, bandwidth_efficiency, overlap_exponent, launch and floor times
    by a few percent and keeps the candidate if the loss drops. Loss: the worst
    file's max(median |error|, p90 |error| / 2.5) over FITTED_OPS on rows up to
    MAX_ROWS. The datasheet peak, bandwidth and SM count never change. paths:
    CSV paths or GpuOpProfiles. Returns the best Hardware found.
    """
    base = gpu_profile(hardware)
    base = base.replace(gemm_tiles=base.tiles)
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

    def nudge(value, low, high, spread=0.1):
        return min(high, max(low, value * rng.uniform(1 - spread, 1 + spread)))

    best, best_loss = base, loss(base)
    for _ in range(trials):
        candidate = best.replace(
            gemm_tiles=tuple((tm, tn, round(nudge(eff, 0.2, 1.0, 0.07), 3)) for tm, tn, eff in best.gemm_tiles),
            wave_quantization=round(min(1.0, max(0.0, best.wave_quantization + rng.uniform(-0.15, 0.15))), 3),
            bandwidth_efficiency=round(nudge(best.bandwidth_efficiency, 0.3, 1.0, 0.05), 3),
            overlap_exponent=round(nudge(best.overlap_exponent, 1.0, 20.0, 0.15), 2),
            kernel_launch_s=round(nudge(best.kernel_launch_s or 1e-6, 0, 2e-5, 0.2), 8),
            kernel_floor_s=round(nudge(best.kernel_floor_s or 1e-6, 0, 3e-5, 0.2), 8))
        candidate_loss = loss(candidate)
        if candidate_loss < best_loss:
            best, best_loss = candidate, candidate_loss
    return best


NEUTRAL_START = dict(gemm_tiles=((64, 64, 0.7), (128, 128, 0.7), (128, 256, 0.7)), wave_quantization=0.5,
                     bandwidth_efficiency=0.85, overlap_exponent=2.0, kernel_launch_s=5e-6, kernel_floor_s=1e-6)
# A start that knows nothing about any file: the tile kernels a GEMM library offers
# (64x64, 128x128, 128x256) at a typical fraction of peak, half-charged partial waves,
# a soft overlap, microsecond launches.


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


# Every measured operator of a layer except attention (the files hold none) and the
# embedding (once per model, not per layer).
NON_ATTENTION_OPS = ("input_rmsnorm", "qkv_proj", "rope", "o_proj", "post_attn_rmsnorm",
                     "mlp_gate_up_proj", "mlp_act", "mlp_down_proj", "residual_add")
MEASURED_LINEAR_OPS = FITTED_OPS


def measured_layer_s(profile, num_tokens: int, ops=MEASURED_LINEAR_OPS) -> float:
    """Measured seconds of one layer's `ops` at num_tokens rows (the mean where a
    file holds the row twice). ValueError if the file has no such row."""
    profile = _as_profile(profile)
    at = [i for i, m in enumerate(profile.num_tokens) if m == num_tokens]
    if not at:
        raise ValueError(f"num_tokens={num_tokens!r}: {profile.path.name} has no such row; it has "
                         f"{profile.num_tokens[:4]}...{profile.num_tokens[-2:]}")
    missing = [op for op in ops if op not in profile.times_s]
    if missing:
        raise ValueError(f"ops contains {missing}: not columns of {profile.path.name}")
    return sum(sum(profile.times_s[op][i] for i in at) / len(at) for op in ops)


def chunked_vs_whole(profile, chunk: int, total: int, hardware=None) -> dict:
    """A prompt of `total` rows in chunks of `chunk` against one step, one layer, in ms:
    measured linear ops, measured non-attention ops, and the cost model's linear ops
    (on `hardware`, default the file's GPU). Keys: "chunked" and "whole", each a dict."""
    profile = _as_profile(profile)
    if total % chunk:
        raise ValueError(f"total={total}, chunk={chunk}: the chunks must divide the prompt")
    hw = gpu_profile(hardware if hardware is not None else profile.hardware)
    out = {}
    for name, rows, count in (("chunked", chunk, total // chunk), ("whole", total, 1)):
        model = layer_linear_times_s(profile.cfg, rows, hw)
        out[name] = {"steps": count, "rows": rows,
                     "linear_ms": count * measured_layer_s(profile, rows) * 1e3,
                     "non_attention_ms": count * measured_layer_s(profile, rows, NON_ATTENTION_OPS) * 1e3,
                     "model_linear_ms": count * sum(model[op] for op in MEASURED_LINEAR_OPS) * 1e3}
    return out
