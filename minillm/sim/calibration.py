"""This machine as the cost model sees it: measure real engine steps, fit, predict.

`hardware.calibrate()` returns the profile fitted here, so that
`predict_step` and `simulate` on it predict the real engine's steps on this
device. The recipe:

1. time steps of the built-in model over a sweep of shapes (a prefill chunk
   of C tokens over c cached ones, plus N decodes over c cached tokens each),
   the fastest of a few round-robin repeats, each step built by
   `prefill.prepare_step`;
2. fit effective FLOP/s, bandwidth, per-kernel, per-step and per-sequence
   overheads by least squares on the relative error. With an additive blend
   (overlap_exponent = 1) and no tiles or floors, predict_step's time is
   LINEAR in (1/FLOP/s, 1/bandwidth, launch cost, step overhead, per-sequence
   overhead), so the fit is exact linear algebra over predict_step itself;
3. judge it on shapes the fit did not see (evaluation_shapes): the book
   (fidelity.py) and the tests report the median |relative error|.
"""
from __future__ import annotations

import statistics
import time

from .cost_model import predict_step
from .hardware import Hardware

__all__ = ["step_shape", "calibration_shapes", "evaluation_shapes", "measure_step_times",
           "predict_step_times", "fit_step_model", "relative_errors", "basis_hardware"]

_HUGE = 1e30             # a peak so high that its term vanishes: the fit dropped that factor


def step_shape(chunk: int, num_decodes: int, num_cached: int) -> list[tuple[int, int]]:
    """One step: a prefill chunk of `chunk` tokens over `num_cached` cached ones
    (none if chunk == 0), plus num_decodes decodes over num_cached tokens each."""
    for name, value in (("chunk", chunk), ("num_decodes", num_decodes), ("num_cached", num_cached)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}={value!r}: must be an integer >= 0")
    if chunk == 0 and num_decodes == 0:
        raise ValueError("chunk=0 and num_decodes=0: a step needs at least one token")
    return ([(chunk, num_cached)] if chunk else []) + [(1, num_cached)] * num_decodes


def calibration_shapes() -> list[tuple[int, int, int]]:
    """(chunk, num_decodes, num_cached) for fitting: corners and middles of the space."""
    return [(c, n, k) for c in (0, 32, 128, 384) for n in (1, 6) for k in (32, 384)
            if c or n]


def evaluation_shapes() -> list[tuple[int, int, int]]:
    """A different sweep (no shape in common with calibration_shapes) to judge the fit:
    decode-only, prefill-heavy and mixed steps."""
    return [(c, n, k) for c in (0, 16, 64, 256, 512) for n in (2, 4) for k in (64, 256)
            if c or n]


def measure_step_times(model, shapes, repeats: int = 5, seed: int = 0, progress: bool = False,
                       statistic: str = "min") -> list[float]:
    """Seconds of one real engine step for each (chunk, num_decodes, num_cached).

    Every step is built first (prefill.prepare_step), then the sweep is
    timed round-robin `repeats` times, so a burst of load from another process
    hits different shapes, not all repeats of one. statistic="min" (default:
    other processes only ever ADD time, so the fastest run is the step's own
    cost) or "median".
    """
    import torch
    from tqdm.auto import tqdm

    from ..device import synchronize
    from ..prefill import prepare_step

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r}: must be a positive integer")
    if statistic not in ("min", "median"):
        raise ValueError(f"statistic={statistic!r}: choose 'min' or 'median'")
    shapes = list(shapes)
    samples = [[] for _ in shapes]
    with torch.inference_mode():
        runs = [prepare_step(model, step_shape(*shape), seed=seed) for shape in shapes]
        for run in runs:                            # warm-up
            run()
        synchronize(model.device)
        for _ in tqdm(range(repeats), desc="timing steps", disable=not progress, leave=False):
            for run, times in zip(runs, samples):
                t0 = time.perf_counter()
                run()
                synchronize(model.device)
                times.append(time.perf_counter() - t0)
    pick = min if statistic == "min" else statistics.median
    return [pick(times) for times in samples]


def predict_step_times(cfg, shapes, hardware, dtype_bytes: int = 4) -> list[float]:
    """predict_step's seconds for each (chunk, num_decodes, num_cached)."""
    return [predict_step(cfg, step_shape(*s), hardware, dtype_bytes).total for s in shapes]


def basis_hardware(flops_inv: float, bytes_inv: float, launch_s: float, overhead_s: float,
                   per_seq_s: float = 0.0, name: str = "basis") -> Hardware:
    """A Hardware on which predict_step is additive and linear in its five factors
    (seconds per FLOP, per byte, per kernel, per step, per sequence)."""
    return Hardware(name, peak_flops_s=1 / flops_inv if flops_inv else _HUGE,
                    mem_bandwidth_bytes_s=1 / bytes_inv if bytes_inv else _HUGE,
                    overlap_exponent=1.0, kernel_launch_s=launch_s, step_overhead_s=overhead_s,
                    per_seq_overhead_s=per_seq_s, dtype="float32")


def _design_row(cfg, shape, dtype_bytes) -> list[float]:
    """Coefficients of the five factors in the predicted time of one step."""
    steps = step_shape(*shape)
    basis = [basis_hardware(1.0, 0, 0, 0), basis_hardware(0, 1.0, 0, 0), basis_hardware(0, 0, 1.0, 0),
             basis_hardware(0, 0, 0, 1.0), basis_hardware(0, 0, 0, 0, 1.0)]
    # the huge-peak basis leaves ~1e-30-scaled residues in the other terms: negligible
    return [predict_step(cfg, steps, hw, dtype_bytes).total for hw in basis]


def fit_step_model(cfg, shapes, measured_s, dtype_bytes: int = 4,
                   name: str = "this cpu (fitted)") -> Hardware:
    """Least squares on relative error over measured steps; factors kept >= 0."""
    import numpy as np

    if len(shapes) != len(measured_s) or len(shapes) < 5:
        raise ValueError(f"need as many measurements as shapes, at least 5 (got {len(shapes)} shapes, "
                         f"{len(measured_s)} times)")
    a = np.array([_design_row(cfg, s, dtype_bytes) for s in shapes], dtype=np.float64)
    y = np.asarray(measured_s, dtype=np.float64)
    a_rel, ones = a / y[:, None], np.ones_like(y)           # minimise sum ((pred - y) / y)^2
    active = list(range(a.shape[1]))
    while True:                                             # drop factors that come out negative
        coef, *_ = np.linalg.lstsq(a_rel[:, active], ones, rcond=None)
        if (coef >= 0).all() or len(active) == 1:
            break
        active.pop(int(np.argmin(coef)))
    x = np.zeros(a.shape[1])
    x[active] = np.clip(coef, 0, None)
    hw = basis_hardware(*(float(v) for v in x), name=name)
    return hw.replace(source="calibration.fit_step_model: least squares over measured engine steps")


def relative_errors(measured_s, predicted_s) -> list[float]:
    """(predicted - measured) / measured for each pair."""
    return [(p - m) / m for m, p in zip(measured_s, predicted_s)]
