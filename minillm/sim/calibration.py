"""This machine as the cost model sees it: measure real engine steps, fit, predict.

`hardware.calibrate()` returns the profile fitted here, so that
`predict_step` and `simulate` on it predict the real engine's steps on this
device. The recipe:

1. time steps of the built-in model over a sweep of shapes (a prefill chunk
   of C tokens over c cached ones, plus N decodes over c cached tokens each),
   the median (or the fastest) of a few round-robin repeats, each round in a
   new order, each step built by
   `prefill.prepare_step`;
2. fit effective GEMM FLOP/s, bandwidth, per-kernel, per-step and
   per-sequence overheads, and attention's own FLOP/s and K/V read bandwidth
   (a decode over a long context on a CPU costs more than its bytes at the
   weights' bandwidth: the paged kernel, or the gather and torch's fused
   kernel, run well below peak for one query row), by least squares on the
   relative error. With an additive blend (overlap_exponent = 1) and no tiles
   or floors, predict_step's time is LINEAR in these seven (FACTORS), so the
   fit is exact linear algebra over predict_step itself;
3. judge it on shapes the fit did not see (evaluation_shapes): the book
   (fidelity.py) and the tests report the median |relative error|.

A fit is only as good as the times it was fitted to. Other processes only ever
ADD time to a step, so how far a step's typical repeat lies above its fastest
says how busy the machine was while it was timed: `timing_spread`. On a quiet
2-core machine the typical repeat is 5-15% above the fastest; with a busy loop
on every core, or a test suite running beside it, 40-300%, and a fit of such
times can predict the same steps a minute later 3x off. `fit_profile` records
the spread (and the fit's own error on the steps it saw) on the profile it
returns, a `CalibratedHardware`; `check_noise` turns it into a warning
(NoisyCalibrationWarning) above NOISY_SPREAD, or a refusal
(NoisyCalibrationError) above the caller's limit.
"""
from __future__ import annotations

import random
import statistics
import time
import warnings
from dataclasses import dataclass

from .cost_model import predict_step
from .profiles import Hardware

__all__ = ["step_shape", "calibration_shapes", "evaluation_shapes", "measure_step_samples", "measure_step_times",
           "predict_step_times", "fit_step_model", "relative_errors", "basis_hardware", "FACTORS",
           "timing_spread", "fit_profile", "check_noise", "check_max_spread", "CalibratedHardware", "NoisyCalibrationWarning",
           "NoisyCalibrationError", "NOISY_SPREAD", "NOISY_FIT_ERROR", "UNUSABLE_SPREAD"]

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
    """(chunk, num_decodes, num_cached) for fitting: corners and middles of the space,
    chunks from 16 to 768 tokens, contexts up to where attention's K/V reads
    dominate a decode."""
    return [(c, n, k) for c in (0, 16, 64, 256, 768) for n in (1, 6) for k in (32, 384, 2048)]


def evaluation_shapes() -> list[tuple[int, int, int]]:
    """A different sweep (no shape in common with calibration_shapes: other chunk
    sizes, decode counts and contexts) to judge the fit: decode-only,
    prefill-heavy and mixed steps, over short and long contexts."""
    return [(c, n, k) for c in (0, 32, 128, 384, 512) for n in (2, 4) for k in (64, 256, 1024, 3000)]


def measure_step_samples(model, shapes, repeats: int = 5, seed: int = 0, progress: bool = False,
                         timer=time.perf_counter) -> list[list[float]]:
    """Seconds of every repeat of one real engine step, for each (chunk, num_decodes, num_cached).

    Every step is built first (prefill.prepare_step) and run once to warm up,
    then the sweep is timed round-robin `repeats` times, each time in a new
    (seeded) order, so a burst of load from another process, or a slow minute
    of the machine, hits different shapes, not all repeats of one or every
    large shape of the sweep. samples[i][r]: shape i's seconds in round r.
    timer: the clock (seconds, called just before and just after each step);
    a test passes a fake one to inject the times of a busy machine.
    """
    import torch
    from tqdm.auto import tqdm

    from ..device import synchronize
    from ..prefill import prepare_step

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r}: must be a positive integer")
    if not callable(timer):
        raise TypeError(f"timer={timer!r}: must be a callable returning seconds, like time.perf_counter")
    shapes = list(shapes)
    samples = [[] for _ in shapes]
    with torch.inference_mode():
        runs = [prepare_step(model, step_shape(*shape), seed=seed) for shape in shapes]
        for run in runs:                            # warm-up
            run()
        synchronize(model.device)
        order = list(range(len(shapes)))
        shuffle = random.Random(seed).shuffle
        for _ in tqdm(range(repeats), desc="timing steps", disable=not progress, leave=False):
            shuffle(order)
            for i in order:
                t0 = timer()
                runs[i]()
                synchronize(model.device)
                samples[i].append(timer() - t0)
    return samples


_STATISTICS = {"min": min, "median": statistics.median}


def _check_statistic(statistic):
    if statistic not in _STATISTICS:
        raise ValueError(f"statistic={statistic!r}: choose 'min' or 'median'")
    return _STATISTICS[statistic]


def measure_step_times(model, shapes, repeats: int = 5, seed: int = 0, progress: bool = False,
                       statistic: str = "min") -> list[float]:
    """Seconds of one real engine step for each (chunk, num_decodes, num_cached):
    the fastest (statistic="min", default: other processes only ever ADD time,
    so the fastest run is the step's own cost) or the "median" of
    measure_step_samples' round-robin repeats."""
    pick = _check_statistic(statistic)
    return [pick(times) for times in measure_step_samples(model, shapes, repeats, seed, progress)]


def predict_step_times(cfg, shapes, hardware, dtype_bytes: int = 4) -> list[float]:
    """predict_step's seconds for each (chunk, num_decodes, num_cached)."""
    return [predict_step(cfg, step_shape(*s), hardware, dtype_bytes).total for s in shapes]


def _rates(inv_a: float, inv_b: float) -> tuple[float, float, float]:
    """Two costs per unit (seconds per FLOP, or per byte; 0 = free) as the faster
    rate and each one's fraction of it: (peak, efficiency_a, efficiency_b)."""
    rate_a = 1 / inv_a if inv_a else _HUGE
    rate_b = 1 / inv_b if inv_b else _HUGE
    peak = max(rate_a, rate_b)
    return peak, rate_a / peak, rate_b / peak


def basis_hardware(flops_inv: float, bytes_inv: float, launch_s: float, overhead_s: float,
                   per_seq_s: float = 0.0, name: str = "basis", attention_flops_inv: float | None = None,
                   attention_bytes_inv: float | None = None) -> Hardware:
    """A Hardware on which predict_step is additive and linear in its factors:
    seconds per GEMM FLOP, per byte of weights and activations, per kernel, per
    step, per sequence, and per attention FLOP and per byte of K/V attention
    reads (None: as for GEMMs and weights)."""
    attn_flops_inv = flops_inv if attention_flops_inv is None else attention_flops_inv
    attn_bytes_inv = bytes_inv if attention_bytes_inv is None else attention_bytes_inv
    peak, gemm_eff, attn_eff = _rates(flops_inv, attn_flops_inv)
    bandwidth, bw_eff, attn_bw_eff = _rates(bytes_inv, attn_bytes_inv)
    return Hardware(name, peak_flops_s=peak, mem_bandwidth_bytes_s=bandwidth, gemm_efficiency=gemm_eff,
                    attention_efficiency=attn_eff, bandwidth_efficiency=bw_eff,
                    attention_bandwidth_efficiency=attn_bw_eff, overlap_exponent=1.0,
                    kernel_launch_s=launch_s, step_overhead_s=overhead_s, per_seq_overhead_s=per_seq_s,
                    dtype="float32")


# The fit's factors, in basis_hardware's order; the last two are attention's own.
FACTORS = ("flops_inv", "bytes_inv", "launch_s", "overhead_s", "per_seq_s",
           "attention_flops_inv", "attention_bytes_inv")


def _basis(i: int) -> Hardware:
    """The hardware on which only factor i costs anything (one second per unit)."""
    values = dict.fromkeys(FACTORS, 0.0)
    values[FACTORS[i]] = 1.0
    return basis_hardware(**values)


def _design_row(cfg, shape, dtype_bytes) -> list[float]:
    """Coefficients of the factors in the predicted time of one step."""
    steps = step_shape(*shape)
    # the huge-peak basis leaves ~1e-30-scaled residues in the other terms: negligible
    return [predict_step(cfg, steps, _basis(i), dtype_bytes).total for i in range(len(FACTORS))]


# Attention's factor and the one it refines: attention never costs LESS per FLOP or
# per byte than the GEMMs and weights (were it cheaper, the profile's peak would be
# attention's, and a near-free attention would make that peak absurd).
_ATTENTION_OF = {"attention_flops_inv": "flops_inv", "attention_bytes_inv": "bytes_inv"}


def _nonnegative_lstsq(a, y):
    """Least squares with every coefficient >= 0 (the negative ones dropped, one at a time)."""
    import numpy as np

    active = list(range(a.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(a[:, active], y, rcond=None)
        if (coef >= 0).all() or len(active) == 1:
            break
        active.pop(int(np.argmin(coef)))
    x = np.zeros(a.shape[1])
    x[active] = np.clip(coef, 0, None)
    return x


def fit_step_model(cfg, shapes, measured_s, dtype_bytes: int = 4,
                   name: str = "this cpu (fitted)") -> Hardware:
    """Least squares on relative error over measured steps; factors kept >= 0, and
    attention's no cheaper than the GEMMs' and weights' (else merged with them)."""
    import numpy as np

    if len(shapes) != len(measured_s) or len(shapes) < len(FACTORS):
        raise ValueError(f"need as many measurements as shapes, at least {len(FACTORS)} (one per factor; "
                         f"got {len(shapes)} shapes, {len(measured_s)} times)")
    a = np.array([_design_row(cfg, s, dtype_bytes) for s in shapes], dtype=np.float64)
    y = np.asarray(measured_s, dtype=np.float64)
    a_rel, ones = a / y[:, None], np.ones_like(y)           # minimise sum ((pred - y) / y)^2
    merged = set()                                          # attention factors charged as their base
    while True:
        own = [f for f in FACTORS if f not in merged]
        columns = [a_rel[:, FACTORS.index(f)] + sum(a_rel[:, FACTORS.index(m)] for m in merged
                                                    if _ATTENTION_OF[m] == f) for f in own]
        x = dict(zip(own, _nonnegative_lstsq(np.stack(columns, axis=1), ones)))
        cheaper = [f for f, base in _ATTENTION_OF.items() if f in x and x[f] < x[base]]
        if not cheaper:
            break
        merged.add(cheaper[0])
    factors = {f: (None if f in merged else float(x[f])) for f in FACTORS}
    hw = basis_hardware(**factors, name=name)
    return hw.replace(source="calibration.fit_step_model: least squares over measured engine steps")


def relative_errors(measured_s, predicted_s) -> list[float]:
    """(predicted - measured) / measured for each pair."""
    return [(p - m) / m for m, p in zip(measured_s, predicted_s)]


# ---- how busy the machine was: the spread of the repeats ----------------------

# Above this spread a fit is flagged noisy: warned, and not kept on disk as this
# machine's profile. On a quiet shared 2-core machine the typical of five runs is
# 5-15% slower than the fastest (calibrate()'s docstring), and the fit predicts
# steps it never saw within 3-17% (README section 3). With the work of six other
# sessions beside it (load average 15-20 on 2 cores), the spread was 0.43 and the
# held-out error 57% (2 Dec 2026).
NOISY_SPREAD = 0.25
# calibrate()'s default refusal: the typical run of a step took twice its fastest
# or more, so the times fitted are uncertain by 2x or more.
UNUSABLE_SPREAD = 1.0
# A fit that misses the very steps it was fitted to by more than this (median) is
# flagged too: it cannot do better on steps it never saw (quiet: 3-17% on those);
# on the busy machine above it missed its own steps by 43%.
NOISY_FIT_ERROR = 0.20


def timing_spread(samples) -> float | None:
    """How busy the machine was while these steps were timed: over the shapes, the
    median of (a shape's median repeat / its fastest - 1). 0.1: the typical run of
    a step took 10% longer than its fastest. None with fewer than two repeats (one
    run says nothing about its neighbours)."""
    samples = [list(times) for times in samples]
    if not samples or min(len(times) for times in samples) < 2:
        return None
    for times in samples:
        if min(times) <= 0:
            raise ValueError(f"samples: {times!r}: every time must be > 0 seconds")
    return statistics.median(statistics.median(times) / min(times) - 1 for times in samples)


@dataclass(frozen=True)
class CalibratedHardware(Hardware):
    """A Hardware fitted to this machine's measured steps, with how far to trust it.

    timing_spread: timing_spread() of the repeats fitted (None: one repeat each);
    fit_error: the fit's median |relative error| over the steps it was fitted to;
    repeats: timed runs per step.
    """
    timing_spread: float | None = None
    fit_error: float | None = None
    repeats: int = 1

    @property
    def noisy(self) -> bool:
        """True if the fit cannot be trusted closely: the machine was busy while timed
        (the repeats spread beyond NOISY_SPREAD), or the fit misses the steps it saw
        by more than NOISY_FIT_ERROR."""
        return ((self.timing_spread is not None and self.timing_spread > NOISY_SPREAD)
                or (self.fit_error is not None and self.fit_error > NOISY_FIT_ERROR))

    def noise_note(self) -> str:
        """One line for the lab and the chapters: how busy the machine was, what that means."""
        if self.timing_spread is None:
            spread = "timed once per step, so how busy the machine was is unknown"
        else:
            spread = (f"the typical run of a step took {self.timing_spread:.0%} longer than its fastest "
                      f"({self.repeats} runs each)")
        fit = "" if self.fit_error is None else f"; the fit misses the steps it saw by {self.fit_error:.0%} (median)"
        if not self.noisy:
            return f"{spread}{fit}: a quiet machine, a fit to trust"
        return (f"{spread}{fit}: the machine was busy (or the cost model does not describe it), so "
                f"predictions may be off by that much or more; calibrate(force=True) when it is quieter")


class NoisyCalibrationWarning(UserWarning):
    """calibrate() fitted times so spread that its predictions may be far off."""


class NoisyCalibrationError(RuntimeError):
    """calibrate() refused: the repeats of the same steps disagreed too much to fit."""


def fit_profile(cfg, shapes, samples, dtype_bytes: int = 4, statistic: str = "median",
                name: str = "this cpu (fitted)") -> CalibratedHardware:
    """fit_step_model over each shape's `statistic` of its repeats (samples: one list
    of seconds per shape, as measure_step_samples returns), with the spread of
    the repeats and the fit's own error recorded on the profile."""
    pick = _check_statistic(statistic)
    samples = [list(times) for times in samples]
    if len(samples) != len(shapes) or not all(samples):
        raise ValueError(f"samples: need one non-empty list of seconds per shape "
                         f"({len(shapes)} shapes, {len(samples)} lists)")
    measured_s = [pick(times) for times in samples]
    spread = timing_spread(samples)
    hw = fit_step_model(cfg, shapes, measured_s, dtype_bytes=dtype_bytes, name=name)
    fitted = predict_step_times(cfg, shapes, hw, dtype_bytes)
    error = statistics.median(abs(e) for e in relative_errors(measured_s, fitted))
    return CalibratedHardware(**hw.to_dict(), timing_spread=spread, fit_error=error,
                              repeats=min(len(times) for times in samples))


def check_max_spread(max_spread) -> None:
    """A ValueError naming max_spread unless it is a number > 0 or None."""
    if max_spread is not None and (isinstance(max_spread, bool) or not isinstance(max_spread, (int, float))
                                   or not max_spread > 0):
        raise ValueError(f"max_spread={max_spread!r}: must be a number > 0 (e.g. {UNUSABLE_SPREAD}) or None")


def check_noise(hw: CalibratedHardware, max_spread: float | None = UNUSABLE_SPREAD,
                stacklevel: int = 2) -> CalibratedHardware:
    """hw if its times were quiet enough; a NoisyCalibrationWarning if they were
    spread beyond NOISY_SPREAD; NoisyCalibrationError beyond max_spread (None: never)."""
    check_max_spread(max_spread)
    if max_spread is not None and hw.timing_spread is not None and hw.timing_spread > max_spread:
        raise NoisyCalibrationError(
            f"calibrate(): the machine was too busy to fit: {hw.noise_note()}; the limit is "
            f"max_spread={max_spread:g} ({max_spread:.0%} longer). Close what else runs "
            f"(see `top`) and calibrate again, or pass max_spread=None to keep this fit anyway.")
    if hw.noisy:
        warnings.warn(f"calibrate(): {hw.noise_note()}. This fit is not saved to disk.",
                      NoisyCalibrationWarning, stacklevel=stacklevel + 1)
    return hw
