"""Operator times measured on real GPUs, and the cost model's factors fitted to them.

`data/gpu-op-profiles` holds Vidur's per-layer times of qkv_proj, o_proj,
gate_up and down for num_tokens = 1..4096 (or 32768), one CSV per model shape
and GPU (seven files: four on an A100, three on an H100). This module reads
them, compares `cost_model.layer_linear_times_s` with them, and fits the
kernel factors of a `Hardware` (efficiencies, tiles, overlap, launch, floor).

How the shipped A100 and H100 factors were found, once per GPU over ALL the
files of that GPU: `fit_hardware_factors(paths, gpu.replace(**NEUTRAL_START),
trials=1800, seed=0)`, a Nelder-Mead search on a robust loss (see there).
Errors on the files the factors were fitted to are in-sample;
`held_out_errors` refits from NEUTRAL_START with each file left out and tests
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

import numpy as np

from ..metrics import percentile
from ..config import ModelConfig
from .cost_model import gemm_time_s, layer_linear_times_s
from .profiles import Hardware, gpu_profile

__all__ = [
    "GpuOpProfile", "profile_dir", "profile_paths", "load_gpu_op_profile", "linear_op_errors",
    "error_summary", "fit_hardware_factors", "held_out_errors", "PROFILE_HARDWARE", "LINEAR_OPS",
    "FITTED_OPS", "MAX_ROWS", "NEUTRAL_START", "NON_ATTENTION_OPS", "measured_layer_s",
    "chunked_vs_whole", "chunked_vs_whole_sweep", "gemm_shapes", "same_shape_spread", "per_file_fit_errors",
    "row_band_transfer",
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


def _rows_and_times(profile, max_rows, ops):
    """(num_tokens array, {op: measured seconds array}) of the rows up to max_rows."""
    keep = [i for i, m in enumerate(profile.num_tokens) if max_rows is None or m <= max_rows]
    for op in ops:
        if op not in profile.times_s:
            raise ValueError(f"ops contains {op!r}: not a column of {profile.path.name}; "
                             f"choose from {sorted(profile.times_s)}")
    rows = np.array([profile.num_tokens[i] for i in keep])
    return rows, {op: np.array([profile.times_s[op][i] for i in keep]) for op in ops}


def linear_op_errors(profile, hardware=None, ops=LINEAR_OPS, dtype_bytes: int = 2,
                     max_rows: int | None = MAX_ROWS) -> dict:
    """Predicted vs measured per operator: op -> list of (num_tokens, measured_s, predicted_s, rel_error).

    Rows up to max_rows tokens (None: all).
    profile: a GpuOpProfile or a path to one; hardware: defaults to the
    profile's GPU. rel_error = (predicted - measured) / measured.
    """
    profile = _as_profile(profile)
    hw = gpu_profile(hardware if hardware is not None else profile.hardware)
    rows, measured = _rows_and_times(profile, max_rows, ops)
    predicted = layer_linear_times_s(profile.cfg, rows, hw, dtype_bytes)    # every row at once
    return {op: [(int(m), float(t), float(p), float((p - t) / t))
                 for m, t, p in zip(rows, measured[op], predicted[op])] for op in ops}


def error_summary(errors: dict) -> tuple[float, float]:
    """Median and 90th percentile of |relative error| over all ops and rows of linear_op_errors."""
    abs_errors = [abs(e) for rows in errors.values() for *_, e in rows]
    return percentile(abs_errors, 50), percentile(abs_errors, 90)


# ---- the fit -------------------------------------------------------------------
# The factors a fit may change and the range of each. The datasheet peak and
# bandwidth, the SM count and the tile shapes never change: they are the GPU's.
_FACTOR_RANGES = (("gemm_fill_waves", 0.5, 5.0), ("bandwidth_efficiency", 0.3, 1.0), ("overlap_exponent", 1.0, 20.0),
                  ("kernel_launch_s", 0.0, 2e-5), ("kernel_floor_s", 0.0, 3e-5))
_TILE_RANGES = ((0.2, 1.0), (0.0, 1.0))     # each tile kernel's efficiency and wave quantization
# The fit's loss per row is log(1 + (error / ROBUST_SCALE)^2): like a squared error
# for errors of a few percent, growing only slowly beyond. A GEMM library sometimes
# picks a poor kernel for one shape (a row 40% slower than both neighbours); a plain
# squared error would bend every factor to chase those rows, this loss follows the
# bulk. 10% is about the error the issue asks the bulk to stay under.
ROBUST_SCALE = 0.10


def _factors(hw: Hardware) -> tuple[list, list]:
    """The fitted factors of hw as a list, and their (low, high) ranges: each tile
    kernel's efficiency and wave quantization, then the _FACTOR_RANGES fields."""
    values = [v for _, _, eff, quant in hw.tiles for v in (eff, quant)]
    values += [getattr(hw, name) for name, _, _ in _FACTOR_RANGES]
    ranges = list(_TILE_RANGES) * len(hw.tiles) + [(low, high) for _, low, high in _FACTOR_RANGES]
    return values, ranges


def _with_factors(hw: Hardware, values) -> Hardware:
    tiles = tuple((tm, tn, float(values[2 * i]), float(values[2 * i + 1]))
                  for i, (tm, tn, _, _) in enumerate(hw.tiles))
    rest = {name: float(v) for (name, _, _), v in zip(_FACTOR_RANGES, values[2 * len(tiles):])}
    return hw.replace(gemm_tiles=tiles, **rest)


def _to_unbounded(value, low, high):
    """A factor in (low, high) as a number on the whole line (the logit), and back:
    the search then moves freely and never leaves the range."""
    frac = min(max((value - low) / (high - low), 1e-6), 1 - 1e-6)
    return math.log(frac / (1 - frac))


def _to_bounded(u, low, high):
    return low + (high - low) / (1 + math.exp(-max(min(u, 50.0), -50.0)))


def _nelder_mead(loss, start, steps, iterations):
    """Minimise loss(point) from start: the Nelder-Mead simplex search (reflect,
    expand, contract, shrink), iterations steps. Returns (best point, its loss)."""
    simplex = [list(start)] + [[x + (step if i == j else 0.0) for j, x in enumerate(start)]
                               for i, step in enumerate(steps)]
    losses = [loss(p) for p in simplex]
    for _ in range(iterations):
        order = sorted(range(len(simplex)), key=losses.__getitem__)
        simplex, losses = [simplex[i] for i in order], [losses[i] for i in order]
        worst = simplex[-1]
        centre = [sum(xs) / (len(simplex) - 1) for xs in zip(*simplex[:-1])]
        toward = lambda a: [c + a * (c - w) for c, w in zip(centre, worst)]   # noqa: E731
        reflected = toward(1.0)
        loss_r = loss(reflected)
        if loss_r < losses[0]:
            expanded = toward(2.0)
            loss_e = loss(expanded)
            simplex[-1], losses[-1] = (expanded, loss_e) if loss_e < loss_r else (reflected, loss_r)
        elif loss_r < losses[-2]:
            simplex[-1], losses[-1] = reflected, loss_r
        else:
            contracted = toward(-0.5)
            loss_c = loss(contracted)
            if loss_c < losses[-1]:
                simplex[-1], losses[-1] = contracted, loss_c
            else:                      # shrink every point halfway to the best
                simplex = [simplex[0]] + [[b + 0.5 * (x - b) for b, x in zip(simplex[0], p)]
                                          for p in simplex[1:]]
                losses = [losses[0]] + [loss(p) for p in simplex[1:]]
    best = min(range(len(simplex)), key=losses.__getitem__)
    return simplex[best], losses[best]


def fit_hardware_factors(paths, hardware, trials: int = 1200, seed: int = 0) -> Hardware:
    """Fit the kernel factors of `hardware` to measured files of ONE GPU.

    The factors: each tile kernel's fraction of peak and wave quantization (the tile
    shapes stay), bandwidth_efficiency, overlap_exponent, launch and floor times, each
    within its range. The loss: for each file, the mean over FITTED_OPS and rows up to
    MAX_ROWS of log(1 + (error / ROBUST_SCALE)^2); the files weigh alike. The search:
    Nelder-Mead from the factors of `hardware`, trials steps in all, restarted once
    halfway with a fresh simplex around the best point (a simplex can collapse onto a
    ridge); seed draws the signs of the first simplex's steps. The datasheet peak,
    bandwidth and SM count never change. paths: CSV paths or GpuOpProfiles. Returns
    the best Hardware found.
    """
    base = gpu_profile(hardware)
    base = base.replace(gemm_tiles=base.tiles)
    profiles = [_as_profile(p) for p in paths]
    if not profiles:
        raise ValueError("paths=[]: need at least one measured profile to fit to")
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 0:
        raise ValueError(f"trials={trials!r}: a number of search steps >= 0, e.g. 600")
    m, k, n, measured, file_of = _stacked_gemm_rows(profiles)
    rows_per_file = np.bincount(file_of)
    values, ranges = _factors(base)
    rng = random.Random(seed)

    def loss(point):
        hw = _with_factors(base, [_to_bounded(u, lo, hi) for u, (lo, hi) in zip(point, ranges)])
        per_row = np.log1p(((gemm_time_s(m, k, n, hw) - measured) / measured / ROBUST_SCALE) ** 2)
        return float(np.mean(np.bincount(file_of, per_row) / rows_per_file))

    # gemm_fill_waves moves the loss in steps (a tile is taken or not), where a simplex
    # cannot find its way: the search starts from each of FILL_WAVES_STARTS in turn
    # and keeps the best.
    best = None
    fill = [name for name, _, _ in _FACTOR_RANGES].index("gemm_fill_waves") + 2 * len(base.tiles)
    for fill_waves in FILL_WAVES_STARTS:
        start = list(values)
        start[fill] = fill_waves
        point = [_to_unbounded(v, lo, hi) for v, (lo, hi) in zip(start, ranges)]
        per_start = trials // len(FILL_WAVES_STARTS)
        for steps, step in ((per_start - per_start // 2, 0.5), (per_start // 2, 0.2)):
            point, point_loss = _nelder_mead(loss, point, [step * rng.choice((-1, 1)) for _ in point], steps)
        if best is None or point_loss < best[1]:
            best = (point, point_loss)
    return _with_factors(base, [round(_to_bounded(u, lo, hi), 9) for u, (lo, hi) in zip(best[0], ranges)])


FILL_WAVES_STARTS = (1.0, 2.0, 4.0)


def _stacked_gemm_rows(profiles):
    """Every fitted GEMM row of every file as flat arrays (M, K, N, measured seconds, file
    index): the fit prices them all in one call instead of one per file and operator."""
    parts = []
    for i, prof in enumerate(profiles):
        rows, measured = _rows_and_times(prof, MAX_ROWS, FITTED_OPS)
        for op in FITTED_OPS:
            k, n = gemm_shapes(prof.cfg)[op]
            parts.append((rows, np.full(rows.shape, k), np.full(rows.shape, n), measured[op],
                          np.full(rows.shape, i)))
    return tuple(np.concatenate(column) for column in zip(*parts))


NEUTRAL_START = dict(gemm_tiles=((64, 64, 0.7, 0.5), (128, 128, 0.7, 0.5), (128, 256, 0.7, 0.5)),
                     wave_quantization=0.5, bandwidth_efficiency=0.85, overlap_exponent=2.0,
                     kernel_launch_s=5e-6, kernel_floor_s=1e-6)
# A start that knows nothing about any file: the tile kernels a GEMM library offers
# (64x64, 128x128, 128x256) at a typical fraction of peak, half-charged partial waves,
# a soft overlap, microsecond launches.


_REFITS: dict = {}


def _refit(profiles, hardware, trials, seed, row_stride):
    """fit_hardware_factors from NEUTRAL_START on every row_stride-th row of profiles.

    Kept in this process, keyed by the files' contents and the search's settings (a
    search is deterministic): the held-out errors and row_band_transfer make the same
    fits, a few seconds each."""
    key = (tuple((p.cfg, tuple(p.num_tokens), tuple((op, tuple(t)) for op, t in sorted(p.times_s.items())))
                 for p in profiles), str(hardware), trials, seed, row_stride)
    if key not in _REFITS:
        start = gpu_profile(hardware).replace(**NEUTRAL_START)
        _REFITS[key] = fit_hardware_factors([p.every(row_stride) for p in profiles], start, trials=trials,
                                            seed=seed)
    return _REFITS[key]


def held_out_errors(paths=None, trials: int = 900, seed: int = 0, row_stride: int = 3) -> dict:
    """Leave one file out: file name -> {"in_sample": (median, p90), "held_out": (median, p90)}.

    For each file, refit its GPU's factors from NEUTRAL_START on the OTHER
    files of that GPU (the other GPU's files cannot inform them; every
    row_stride-th row, to keep it a few seconds) and measure the errors on the
    left-out file over LINEAR_OPS. in_sample: the shipped factors, fitted on
    all files of the GPU, the left-out one included.
    """
    return {prof.path.name: {"in_sample": error_summary(linear_op_errors(prof)),
                             "held_out": error_summary(linear_op_errors(prof, refit)),
                             "fitted_on": [p.path.name for p in others]}
            for prof, others, refit in _held_out_fits(paths, trials, seed, row_stride)}


def _held_out_fits(paths, trials, seed, row_stride):
    """[(profile, the other files of its GPU, the factors refitted on those)] for each file."""
    profiles = [_as_profile(p) for p in (paths if paths is not None else profile_paths())]
    out = []
    for prof in profiles:
        others = [p for p in profiles if p.gpu == prof.gpu and p.path != prof.path]
        if not others:
            raise ValueError(f"paths: {prof.path.name} is the only {prof.gpu} file; "
                             "a held-out fit needs at least one other file of the same GPU")
        out.append((prof, others, _refit(others, prof.hardware, trials, seed, row_stride)))
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


# ---- how low can the error go? -------------------------------------------------
# Four measurements of how low the cost model's error can go, for the book: the
# same GEMM shape measured in two files (how much a prediction by shape must miss
# one of them by: a floor for any model that prices by shape), each file fitted
# alone (the best fit found: an upper bound on what this model's form can reach on
# it, not a floor, since a search may miss better factors), whether the slow bands
# of rows can be learned from the other files (they cannot), and the chunked/whole
# ratio at neighbouring chunk sizes (how much one ratio moves when the chunk moves
# by a few rows).

def gemm_shapes(cfg: ModelConfig) -> dict:
    """op -> (K, N) of the four GEMMs of a layer, as cost_model.layer_linear_times_s prices them."""
    d, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    return {"qkv_proj": (d, q + 2 * kv), "o_proj": (q, d), "mlp_gate_up_proj": (d, 2 * inter),
            "mlp_down_proj": (inter, d)}


def _row_means(profile, op, max_rows):
    """num_tokens -> mean measured seconds (a file may hold a row twice)."""
    rows = {}
    for m, t in zip(profile.num_tokens, profile.times_s[op]):
        if max_rows is None or m <= max_rows:
            rows.setdefault(m, []).append(t)
    return {m: sum(ts) / len(ts) for m, ts in rows.items()}


def same_shape_spread(paths=None, max_rows: int | None = MAX_ROWS) -> list[dict]:
    """GEMMs of the SAME shape measured in two files of one GPU, and how far apart their times are.

    Two models can share a GEMM: Llama-2-7B's and Llama-3-8B's o_proj are both
    [M, 4096] x [4096, 4096]; CodeLlama-34B's and Qwen-72B's are [M, 8192] x [8192, 8192].
    Any cost model that prices a GEMM by its shape gives both files the same time, so
    where they disagree it misses at least one of them: their spread is a floor under
    its error that no factor can remove. Returns one dict per such pair: gpu, shape
    (K, N), a and b ((file name, op)), rows (compared, up to max_rows), median and p90
    of |t_a / t_b - 1| over those rows, and ratio ({rows: t_a / t_b}).
    """
    profiles = [_as_profile(p) for p in (paths if paths is not None else profile_paths())]
    by_shape = {}
    for prof in profiles:
        for op, shape in gemm_shapes(prof.cfg).items():
            by_shape.setdefault((prof.gpu, shape), []).append((prof, op))
    out = []
    for (gpu, shape), found in sorted(by_shape.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        for i, (prof_a, op_a) in enumerate(found):
            for prof_b, op_b in found[i + 1:]:
                if prof_a.path == prof_b.path:
                    continue          # one model's two ops of one shape: not two measurements
                a, b = _row_means(prof_a, op_a, max_rows), _row_means(prof_b, op_b, max_rows)
                ratio = {m: a[m] / b[m] for m in sorted(set(a) & set(b))}
                spread = [abs(r - 1) for r in ratio.values()]
                out.append({"gpu": gpu, "shape": shape, "a": (prof_a.path.name, op_a),
                            "b": (prof_b.path.name, op_b), "rows": len(spread),
                            "median": percentile(spread, 50), "p90": percentile(spread, 90), "ratio": ratio})
    return out


def per_file_fit_errors(paths=None, trials: int = 900, seed: int = 0, row_stride: int = 3) -> dict:
    """Each file fitted ALONE, then tested on itself: file name -> (median, p90) of |error|.

    The fit is held_out_errors' (NEUTRAL_START, every row_stride-th row, `trials` steps)
    on that one file, the errors over all its rows up to MAX_ROWS and LINEAR_OPS: the
    best fit found, an UPPER bound on what this model's form can reach on the file (a
    search may miss better factors, and the loss, log(1 + (e / 10%)^2), discounts the
    large errors a p90 counts: per_file_p90_fit_errors fits the p90 itself). It lies
    under both the in-sample errors (one set of factors for every file of the GPU) and
    the held-out ones.
    """
    profiles = [_as_profile(p) for p in (paths if paths is not None else profile_paths())]
    return {prof.path.name: error_summary(linear_op_errors(prof, _refit([prof], prof.hardware, trials, seed,
                                                                         row_stride)))
            for prof in profiles}


def per_file_p90_fit_errors(paths=None, trials: int = 900, seed: int = 0, row_stride: int = 3) -> dict:
    """Each file fitted ALONE to its own p90: file name -> (median, p90) of |error|.

    per_file_fit_errors' robust loss discounts exactly the large errors a p90 counts;
    this fit minimises the p90 itself. It starts from that robust fit (same trials,
    seed, row_stride) and runs `trials` more Nelder-Mead steps (three stages of
    shrinking steps) on the 90th percentile of |error| over every row up to MAX_ROWS
    and LINEAR_OPS, the quantity error_summary reports. Still a best fit found: an upper
    bound on the p90 this model's form can reach on the file.
    """
    profiles = [_as_profile(p) for p in (paths if paths is not None else profile_paths())]
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 3:
        raise ValueError(f"trials={trials!r}: a number of search steps >= 3, e.g. 900")
    out = {}
    for prof in profiles:
        start = _refit([prof], prof.hardware, trials, seed, row_stride)
        rows, measured = _rows_and_times(prof, MAX_ROWS, LINEAR_OPS)
        measured_s = np.concatenate([measured[op] for op in LINEAR_OPS])
        values, ranges = _factors(start)

        def at(point):
            return _with_factors(start, [_to_bounded(u, lo, hi) for u, (lo, hi) in zip(point, ranges)])

        def p90_loss(point):
            predicted = layer_linear_times_s(prof.cfg, rows, at(point))
            predicted_s = np.concatenate([predicted[op] for op in LINEAR_OPS])
            return float(np.percentile(np.abs(predicted_s / measured_s - 1), 90))

        rng = random.Random(seed)
        point = [_to_unbounded(v, lo, hi) for v, (lo, hi) in zip(values, ranges)]
        for step in (0.3, 0.1, 0.05):       # a p90 moves in steps: wide moves first, then finer
            point, _ = _nelder_mead(p90_loss, point, [step * rng.choice((-1, 1)) for _ in point], trials // 3)
        out[prof.path.name] = error_summary(linear_op_errors(prof, at(point)))
    return out


def row_band_transfer(paths=None, trials: int = 900, seed: int = 0, row_stride: int = 3) -> dict:
    """Can a file's slow bands of rows be learned from the OTHER files of its GPU?

    For each file: refit from NEUTRAL_START on the other files (as held_out_errors
    does), take that fit's miss at each row count on those files, log(measured /
    predicted), its median over their four GEMMs, and multiply this file's predictions
    by exp(that miss) at the same row count. If the GEMM library ran slow at the same
    row counts whatever the shape, the correction would remove the bands; if its
    choice depends on the shape (K, N), it cannot help. file name -> {"held_out":
    (median, p90), "row_corrected": (median, p90), "fitted_on": [names]}, |error| over
    FITTED_OPS and rows up to MAX_ROWS (the four GEMMs: the correction is learned per
    GEMM, so the mlp sum is left out).
    """
    out = {}
    for prof, others, refit in _held_out_fits(paths, trials, seed, row_stride):
        misses = {}
        for other in others:
            for rows in linear_op_errors(other, refit, ops=FITTED_OPS).values():
                for m, measured_s, predicted_s, _ in rows:
                    misses.setdefault(m, []).append(math.log(measured_s / predicted_s))
        band = {m: math.exp(float(np.median(v))) for m, v in misses.items()}
        errors = linear_op_errors(prof, refit, ops=FITTED_OPS)
        corrected = {op: [(m, t, p * band.get(m, 1.0), p * band.get(m, 1.0) / t - 1) for m, t, p, _ in rows]
                     for op, rows in errors.items()}
        out[prof.path.name] = {"held_out": error_summary(errors), "row_corrected": error_summary(corrected),
                               "fitted_on": [p.path.name for p in others]}
    return out


def chunked_vs_whole_sweep(profile, chunks, steps: int = 4, hardware=None) -> list[tuple[int, float, float]]:
    """chunked_vs_whole's ratio at several chunk sizes: [(chunk, measured, model)], where
    measured and model are `steps` x chunk rows over one step of steps * chunk rows (linear
    ops, one layer). Chunks whose rows (or steps * chunk) the file does not hold are left
    out; ValueError if none is left. How much the measured ratio moves from one chunk size
    to the next says how closely one of them can be reproduced."""
    profile = _as_profile(profile)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps={steps!r}: a whole number of chunks >= 1, e.g. 4")
    hw = gpu_profile(hardware if hardware is not None else profile.hardware)
    held = set(profile.num_tokens)
    out = []
    for chunk in chunks:
        if chunk in held and steps * chunk in held:
            model = [sum(layer_linear_times_s(profile.cfg, m, hw)[op] for op in MEASURED_LINEAR_OPS)
                     for m in (chunk, steps * chunk)]
            out.append((chunk, steps * measured_layer_s(profile, chunk) / measured_layer_s(profile, steps * chunk),
                        steps * model[0] / model[1]))
    if not out:
        raise ValueError(f"chunks={list(chunks)!r}: {profile.path.name} holds none of them together with "
                         f"{steps} times it (its rows: {profile.num_tokens[:4]}...{profile.num_tokens[-2:]})")
    return out
