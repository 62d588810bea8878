"""How far to trust the simulator: predicted vs measured step times on THIS machine.

The measuring and fitting live in the simulator (minillm/sim/calibration.py,
which `hardware.calibrate()` runs); this module is the book's study of it:
fit on a CALIBRATION sweep, predict a separate EVALUATION sweep, report the
errors. A roofline of datasheet-style peaks (one big matmul, one big copy)
is reported next to it, to show what the fit buys.
"""
from __future__ import annotations

import time

from ..metrics import percentile
from ..sim.calibration import (calibration_shapes, evaluation_shapes, fit_step_model, measure_step_times,
                               predict_step_times, relative_errors, step_shape)

__all__ = ["step_shape", "calibration_shapes", "evaluation_shapes", "measure_step_times",
           "predict_step_times", "fit_step_model", "relative_errors", "run_cpu_fidelity", "run_calibrate_check"]


def _roofline_hardware(model, repeats: int = 3):
    """Datasheet-style peaks of this device: a 1024^3 matmul and a 64 MiB copy."""
    import torch

    from ..device import synchronize
    from ..sim.hardware import Hardware
    n, numel = 1024, 16 * 2**20
    a = torch.randn(n, n, device=model.device, dtype=model.dtype)
    src = torch.empty(numel, device=model.device, dtype=model.dtype).uniform_()
    dst = torch.empty_like(src)

    def best_s(fn):
        fn()
        best = float("inf")
        for _ in range(repeats):
            synchronize(model.device)
            t0 = time.perf_counter()
            fn()
            synchronize(model.device)
            best = min(best, time.perf_counter() - t0)
        return best
    peak = 2 * n ** 3 / best_s(lambda: torch.mm(a, a))
    bandwidth = 2 * numel * model.dtype.itemsize / best_s(lambda: dst.copy_(src))
    return Hardware("this device (matmul and copy peaks)", peak, bandwidth,
                    dtype=str(model.dtype).removeprefix("torch."))


def run_cpu_fidelity(model=None, repeats: int = 5, eval_shapes=None, calib_shapes=None,
                     include_calibrate: bool = True, progress: bool = False, seed: int = 0,
                     statistic: str = "median") -> dict:
    """Measure, fit and evaluate on this machine; returns the numbers (times in seconds).

    model: a built model (default: the built-in "tiny" in float32 on the CPU).
    statistic: each step's "median" (as calibrate() fits) or "min" of `repeats` runs.
    Keys: median_abs_rel_error (fitted factors on the evaluation sweep),
    p90_abs_rel_error, calibrate_median_abs_rel_error (a plain roofline of
    measured matmul and copy peaks, when include_calibrate), hardware (the
    fitted factors as a dict), per_seq_overhead_s, and rows: (chunk, decodes,
    cached, measured_s, predicted_s) for the evaluation sweep. Plain numbers
    and strings only, so the dict prints and serializes as it is.
    """
    import torch

    from ..loader import build_model

    if model is None:
        model = build_model("tiny", seed=seed, dtype=torch.float32, device="cpu")
    cfg = model.cfg
    dtype_bytes = model.dtype.itemsize
    calib_shapes = list(calib_shapes or calibration_shapes())
    eval_shapes = list(eval_shapes or evaluation_shapes())
    t0 = time.perf_counter()
    # one round-robin over both sweeps: the same background load for both
    measured = measure_step_times(model, calib_shapes + eval_shapes, repeats, seed, progress, statistic)
    calib_measured, eval_measured = measured[:len(calib_shapes)], measured[len(calib_shapes):]
    fitted = fit_step_model(cfg, calib_shapes, calib_measured, dtype_bytes)
    predicted = predict_step_times(cfg, eval_shapes, fitted, dtype_bytes)
    errors = [abs(e) for e in relative_errors(eval_measured, predicted)]
    result = {
        "device": str(model.device), "model": cfg.name, "dtype": str(model.dtype).removeprefix("torch."),
        "num_calibration_shapes": len(calib_shapes), "num_evaluation_shapes": len(eval_shapes),
        "median_abs_rel_error": percentile(errors, 50),
        "p90_abs_rel_error": percentile(errors, 90),
        "max_abs_rel_error": max(errors),
        "hardware": fitted.to_dict(),               # Hardware(**...) rebuilds it for simulate()
        "effective_flops_s": fitted.peak_flops_s,
        "effective_bandwidth_bytes_s": fitted.mem_bandwidth_bytes_s,
        "kernel_launch_s": fitted.kernel_launch_s,
        "step_overhead_s": fitted.step_overhead_s,
        "per_seq_overhead_s": fitted.per_seq_overhead_s,
        "rows": [(*s, m, p) for s, m, p in zip(eval_shapes, eval_measured, predicted)],
    }
    if include_calibrate:
        raw = predict_step_times(cfg, eval_shapes, _roofline_hardware(model), dtype_bytes)
        result["calibrate_median_abs_rel_error"] = percentile(
            [abs(e) for e in relative_errors(eval_measured, raw)], 50)
    result["seconds"] = time.perf_counter() - t0
    return result


def run_calibrate_check(rounds: int = 2, repeats: int = 5, progress: bool = False) -> dict:
    """The public path, as a learner meets it: calibrate() (measured afresh into a
    temporary cache), then predict_step against the held-out sweep timed right after.

    Each round calibrates and evaluates once; every round's evaluation is also
    scored against every earlier round's fit, and the evaluation sweeps are
    compared with each other: how much the machine itself moved between rounds
    (median |change| of the same steps), which no fit can predict.
    Keys: errors [(fit round, eval round, median |error|)], drift [(round a,
    round b, median |change|)], calibrate_s, eval_s (per round).
    """
    import tempfile

    import torch

    from ..loader import build_model
    from ..sim.hardware import calibrate

    model = build_model("tiny", seed=0, dtype=torch.float32, device="cpu")
    shapes = evaluation_shapes()
    fits, evals, result = [], [], {"errors": [], "drift": [], "calibrate_s": [], "eval_s": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            t0 = time.perf_counter()
            # max_spread=None: the bench reports a busy machine's drift, it does not refuse it
            fits.append(calibrate(device="cpu", repeats=repeats, progress=progress, force=True,
                                  cache_path=f"{tmp}/round{r}.json", max_spread=None))
            t1 = time.perf_counter()
            evals.append(measure_step_times(model, shapes, repeats, seed=r, statistic="median"))
            result["calibrate_s"].append(t1 - t0)
            result["eval_s"].append(time.perf_counter() - t1)
            for i, fitted in enumerate(fits):
                predicted = predict_step_times(model.cfg, shapes, fitted, model.dtype.itemsize)
                errors = [abs(e) for e in relative_errors(evals[r], predicted)]
                result["errors"].append((i, r, percentile(errors, 50)))
            for i in range(r):
                result["drift"].append((i, r, percentile([abs(e) for e in relative_errors(evals[i], evals[r])], 50)))
    return result
