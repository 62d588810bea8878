"""How far to trust the simulator: predicted vs measured step times on THIS machine.

The simulator times a step with `cost_model.predict_step`. For a GPU profile
that model was fitted to measured operator times; here we check the whole
recipe on the machine at hand, where we can run the real engine:

1. measure steps of the built-in model over a sweep of batch shapes
   (a prefill chunk of C tokens over c cached ones, plus N decodes over c
   cached tokens each), median of a few repeats, each step built by
   `prefill.prepare_step`;
2. fit this machine's factors on a CALIBRATION sweep: effective FLOP/s,
   bandwidth, per-kernel and per-step overhead, by least squares on the
   relative error. With an additive blend (overlap_exponent = 1) and no
   tiles or floors, predict_step's time is LINEAR in (1/FLOP/s, 1/bandwidth,
   launch cost, step overhead), so the fit is exact linear algebra over
   predict_step itself. A per-sequence overhead (the CPU attention loops
   over requests) is the one term predict_step lacks; it is fitted too and
   added on top;
3. predict a separate EVALUATION sweep and report the median absolute
   relative error. The datasheet-style `hardware.calibrate()` (a big matmul
   and a copy) is reported next to it, to show what the fit buys.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from ..config import ModelConfig
from ..sim.cost_model import predict_step
from ..sim.hardware import Hardware

__all__ = ["step_shape", "calibration_shapes", "evaluation_shapes", "measure_step_times",
           "predict_step_times", "FittedHardware", "fit_step_model", "relative_errors",
           "run_cpu_fidelity"]


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
    """A different sweep (no shape in common with calibration_shapes) to judge the fit."""
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
    from tqdm.auto import tqdm

    from ..device import synchronize
    from ..prefill import prepare_step

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r}: must be a positive integer")
    if statistic not in ("min", "median"):
        raise ValueError(f"statistic={statistic!r}: choose 'min' or 'median'")
    import torch
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


@dataclass(frozen=True)
class FittedHardware:
    """This machine as the cost model sees it, plus a per-sequence overhead."""
    hardware: Hardware
    per_seq_overhead_s: float = 0.0

    def predict(self, cfg, shape, dtype_bytes: int) -> float:
        steps = step_shape(*shape)
        return predict_step(cfg, steps, self.hardware, dtype_bytes).total + self.per_seq_overhead_s * len(steps)


def predict_step_times(cfg, shapes, hardware, dtype_bytes: int = 4) -> list[float]:
    """predict_step's seconds for each (chunk, num_decodes, num_cached); hardware may be a FittedHardware."""
    if isinstance(hardware, FittedHardware):
        return [hardware.predict(cfg, s, dtype_bytes) for s in shapes]
    return [predict_step(cfg, step_shape(*s), hardware, dtype_bytes).total for s in shapes]


def _basis_hardware(flops_inv: float, bytes_inv: float, launch_s: float, overhead_s: float) -> Hardware:
    """A Hardware on which predict_step is additive and linear in its four factors."""
    huge = 1e30
    return Hardware("basis", peak_flops_s=1 / flops_inv if flops_inv else huge,
                    mem_bandwidth_bytes_s=1 / bytes_inv if bytes_inv else huge,
                    overlap_exponent=1.0, kernel_launch_s=launch_s, step_overhead_s=overhead_s,
                    dtype="float32")


def _design_row(cfg, shape, dtype_bytes) -> list[float]:
    """Coefficients of (1/FLOP/s, 1/bandwidth, launch_s, step_overhead_s, per_seq_s) in the time."""
    steps = step_shape(*shape)
    basis = [_basis_hardware(1.0, 0, 0, 0), _basis_hardware(0, 1.0, 0, 0),
             _basis_hardware(0, 0, 1.0, 0), _basis_hardware(0, 0, 0, 1.0)]
    row = [predict_step(cfg, steps, hw, dtype_bytes).total for hw in basis]
    # the huge-peak basis leaves ~1e-30-scaled residues in the other terms: negligible
    return row + [float(len(steps))]


def fit_step_model(cfg, shapes, measured_s, dtype_bytes: int = 4, name: str = "this cpu (fitted)") -> FittedHardware:
    """Least squares on relative error over the calibration sweep; factors kept >= 0."""
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
    flops_inv, bytes_inv, launch_s, overhead_s, per_seq_s = (float(v) for v in x)
    hw = _basis_hardware(flops_inv, bytes_inv, launch_s, overhead_s).replace(
        name=name, source="fidelity.fit_step_model: least squares over measured engine steps")
    return FittedHardware(hw, per_seq_s)


def relative_errors(measured_s, predicted_s) -> list[float]:
    """(predicted - measured) / measured for each pair."""
    return [(p - m) / m for m, p in zip(measured_s, predicted_s)]


def run_cpu_fidelity(model=None, repeats: int = 5, eval_shapes=None, calib_shapes=None,
                     include_calibrate: bool = True, progress: bool = False, seed: int = 0) -> dict:
    """Measure, fit and evaluate on this machine; returns the numbers (times in seconds).

    model: a built model (default: the built-in "tiny" in float32 on the CPU).
    Keys: median_abs_rel_error (fitted factors on the evaluation sweep),
    p90_abs_rel_error, calibrate_median_abs_rel_error (hardware.calibrate()
    with predict_step, when include_calibrate), hardware (the fitted
    factors as a dict), per_seq_overhead_s, and rows: (chunk, decodes,
    cached, measured_s, predicted_s) for the evaluation sweep. Plain numbers
    and strings only, so the dict prints and serializes as it is.
    """
    import torch

    from ..loader import build_model

    if model is None:
        model = build_model("tiny", seed=seed, dtype=torch.float32, device="cpu")
    cfg: ModelConfig = model.cfg
    dtype_bytes = model.dtype.itemsize
    calib_shapes = list(calib_shapes or calibration_shapes())
    eval_shapes = list(eval_shapes or evaluation_shapes())
    t0 = time.perf_counter()
    # one round-robin over both sweeps: the same background load for both
    measured = measure_step_times(model, calib_shapes + eval_shapes, repeats, seed, progress)
    calib_measured, eval_measured = measured[:len(calib_shapes)], measured[len(calib_shapes):]
    fitted = fit_step_model(cfg, calib_shapes, calib_measured, dtype_bytes)
    predicted = predict_step_times(cfg, eval_shapes, fitted, dtype_bytes)
    errors = sorted(abs(e) for e in relative_errors(eval_measured, predicted))
    result = {
        "device": str(model.device), "model": cfg.name, "dtype": str(model.dtype).removeprefix("torch."),
        "num_calibration_shapes": len(calib_shapes), "num_evaluation_shapes": len(eval_shapes),
        "median_abs_rel_error": statistics.median(errors),
        "p90_abs_rel_error": errors[min(len(errors) - 1, int(0.9 * len(errors)))],
        "max_abs_rel_error": errors[-1],
        "hardware": fitted.hardware.to_dict(),      # Hardware(**...) rebuilds it for simulate()
        "effective_flops_s": fitted.hardware.peak_flops_s,
        "effective_bandwidth_bytes_s": fitted.hardware.mem_bandwidth_bytes_s,
        "kernel_launch_s": fitted.hardware.kernel_launch_s,
        "step_overhead_s": fitted.hardware.step_overhead_s,
        "per_seq_overhead_s": fitted.per_seq_overhead_s,
        "rows": [(*s, m, p) for s, m, p in zip(eval_shapes, eval_measured, predicted)],
    }
    if include_calibrate:
        from ..sim.hardware import calibrate
        hw = calibrate(device=model.device, dtype=model.dtype, progress=False)
        raw = predict_step_times(cfg, eval_shapes, hw, dtype_bytes)
        result["calibrate_median_abs_rel_error"] = statistics.median(
            abs(e) for e in relative_errors(eval_measured, raw))
    result["seconds"] = time.perf_counter() - t0
    return result
