"""Device profiles: the datasheet GPUs (profiles.py) and this machine, by measurement.

`get_hardware(name_or_profile)` is what the simulator resolves a `hardware=`
argument with: a GPU's name, a `Hardware` object, or "cpu" for this machine,
whose profile `calibrate()` fits to the real engine's timed steps
(calibration.py) and caches. The records themselves live in profiles.py, at the
bottom of the simulator, so the cost model never imports the calibration that
uses it.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..pretrained_models import cache_root as cache_dir      # calibrations live beside the model cache
from .calibration import (FACTORS, UNUSABLE_SPREAD, CalibratedHardware, NoisyCalibrationError,
                          NoisyCalibrationWarning, calibration_shapes, check_max_spread, check_noise, fit_profile,
                          measure_step_samples)
from .profiles import DTYPE_WIDTHS, PROFILES, THIS_MACHINE_NAMES, Hardware, gpu_profile

__all__ = ["Hardware", "PROFILES", "DTYPE_WIDTHS", "get_hardware", "calibrate", "is_calibrated", "cache_dir",
           "CalibratedHardware", "NoisyCalibrationWarning", "NoisyCalibrationError"]


def get_hardware(hardware) -> Hardware:
    """A profile name ("A100-80GB", ...), a Hardware object (returned as is), or
    "cpu": this machine, measured by calibrate().

    The simulator and the lab keep a noisy fit (max_spread=None): calibrate()
    warns with the spread of its repeats and does not save it, so a busy minute
    costs a warning and a re-measure next session, not a refused chapter."""
    if isinstance(hardware, str) and hardware.lower() in THIS_MACHINE_NAMES:
        return calibrate(max_spread=None)
    return gpu_profile(hardware)


# ---- this machine ------------------------------------------------------------

# (key, cache file) -> profile. The file is part of the key: a calibration kept
# elsewhere (a test's quick one in a temporary file) is not this machine's default.
_CALIBRATED: dict[tuple, Hardware] = {}


def _calibration_key(device, dtype, shapes, statistic, cache_path):
    """Check calibrate()'s arguments; (device, dtype, shapes, cache key, cache file)."""
    import torch

    from ..device import resolve_device

    dev = resolve_device(device)
    if dtype is None:
        dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    if isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"dtype={dtype!r}: not a torch dtype; try 'float32' or 'bfloat16'")
        dtype = getattr(torch, dtype)
    shapes = [tuple(s) for s in (shapes if shapes is not None else calibration_shapes())]
    if len(shapes) < len(FACTORS):
        raise ValueError(f"shapes: {len(shapes)} given; the fit has {len(FACTORS)} factors, "
                         f"give at least {len(FACTORS)}")
    if statistic not in ("min", "median"):
        raise ValueError(f"statistic={statistic!r}: choose 'median' or 'min'")
    dtype_name = str(dtype).removeprefix("torch.")
    from .. import attention
    # A decode costs what its kernel costs: a fit made while decodes gathered
    # their cache does not describe the paged kernel, and the other way round;
    # nor does a fit of another build of the kernel (named after its source).
    from .. import kernels
    decodes = f"paged kernel {kernels.library_path().stem}" \
        if attention.uses_paged_decode_kernel(torch.empty(0, dtype=dtype, device=dev)) else "gather"
    from .. import host_memory
    # A CPU step's time depends on how many threads torch runs it with: `make test` runs
    # with one per worker, the lab with all of them; one's profile is not the other's.
    threads = f"{torch.get_num_threads()} threads" if dev.type == "cpu" else "device"
    key = (str(dev), dtype_name, torch.__version__, "tiny", repr(shapes), f"{len(FACTORS)} factors", statistic,
           threads,
           "timing spread recorded",
           f"decodes: {decodes}", f"freed host memory kept: {host_memory.keep_freed_memory()}")
    path = Path(cache_path) if cache_path is not None else \
        cache_dir() / (f"steps-{dev.type}{dev.index or ''}-{dtype_name}-torch{torch.__version__}"
                       + (f"-{torch.get_num_threads()}threads" if dev.type == "cpu" else "") + ".json")
    return dev, dtype, shapes, key, path


def _tuples(value):
    """JSON's lists back to the tuples a Hardware holds (gemm_tiles: tuples of tuples)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _cached_calibration(key, path: Path) -> Hardware | None:
    """The profile calibrate() would return without measuring: this process's, or the file's."""
    if (key, str(path)) in _CALIBRATED:
        return _CALIBRATED[key, str(path)]
    try:
        saved = json.loads(path.read_text())
        if tuple(saved.pop("_key")) == key:
            _CALIBRATED[key, str(path)] = CalibratedHardware(**{k: _tuples(v) for k, v in saved.items()})
            return _CALIBRATED[key, str(path)]
    except (OSError, ValueError, TypeError, KeyError):
        pass                                      # no or stale cache
    return None


def is_calibrated(device=None, dtype=None, cache_path: str | Path | None = None) -> bool:
    """True if calibrate() with these arguments returns at once (nothing to measure):
    the lab says "calibrating this machine" before the ~20 s it otherwise takes."""
    return _cached_calibration(*_calibration_key(device, dtype, None, "median", cache_path)[3:]) is not None


def calibrate(device=None, dtype=None, force: bool = False, repeats: int = 5, progress: bool = True,
              cache_path: str | Path | None = None, shapes=None, statistic: str = "median",
              max_spread: float | None = UNUSABLE_SPREAD, timer=None) -> CalibratedHardware:
    """This machine's profile, fitted to measured steps of the real engine; cached.

    Times the built-in "tiny" model's steps over calibration.calibration_shapes()
    (or `shapes`: (chunk, num_decodes, num_cached) triples), the median
    (statistic="median") or fastest ("min") of `repeats` round-robin runs each,
    and fits effective FLOP/s, bandwidth,
    per-kernel, per-step and per-sequence overheads, and attention's own FLOP/s
    and K/V read bandwidth (calibration.fit_step_model).
    So predict_step and simulate on the result predict the real engine on this
    device, for shapes the fit did not see too (tests/test_calibration.py).
    The median, because the engine's steps run at the machine's typical speed,
    not its best: on a shared 2-core machine the fastest of five runs is
    5-15% quicker than the typical one, and a profile fitted to it simulates
    the engine that much too fast.
    Cached in this process and on disk (cache_dir(), keyed by device, dtype,
    torch version, the shapes and, on a CPU, torch's thread count); force=True
    measures again.

    A busy machine: the profile records how spread the repeats of each step
    were (`timing_spread`: the typical run over the fastest, minus one) and
    the fit's own error; `noise_note()` says it in words. Above
    calibration.NOISY_SPREAD (0.25) the fit is returned with a
    NoisyCalibrationWarning and kept in this process only, never on disk, so a
    busy minute does not become this machine's profile for later sessions.
    Above max_spread (default 1.0: a step's typical run took twice its
    fastest) calibrate() refuses with NoisyCalibrationError and caches
    nothing; max_spread=None keeps any fit. timer: the clock the steps are
    timed with (time.perf_counter; tests inject a busy machine's times).
    """
    import torch

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r}: must be a positive integer")
    dev, dtype, shapes, key, path = _calibration_key(device, dtype, shapes, statistic, cache_path)
    check_max_spread(max_spread)                 # before the measuring, not after
    dtype_name = key[1]
    if not force:
        hw = _cached_calibration(key, path)
        if hw is not None:
            return hw

    from ..loader import build_model
    model = build_model("tiny", seed=0, dtype=dtype, device=dev)
    samples = measure_step_samples(model, shapes, repeats=repeats, progress=progress,
                                   **({} if timer is None else {"timer": timer}))
    label = torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type
    hw = fit_profile(model.cfg, shapes, samples, dtype_bytes=model.dtype.itemsize, statistic=statistic,
                     name=f"this {label} ({dtype_name}, fitted to engine steps)")
    memory_bytes = float(torch.cuda.get_device_properties(dev).total_memory) if dev.type == "cuda" else 0.0
    hw = hw.replace(memory_bytes=memory_bytes, dtype=dtype_name,
                    source=f"calibrate(): {len(shapes)} tiny-model steps timed ({statistic} of {repeats}) "
                           f"and fitted, torch {torch.__version__}")
    check_noise(hw, max_spread)                  # refuses, or warns that hw is noisy
    _CALIBRATED[key, str(path)] = hw
    if hw.noisy:
        return hw                                 # this process only: the next session measures again
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**hw.to_dict(), "_key": list(key)}, indent=1))
    except OSError:
        pass                                      # a read-only home only costs a re-measure
    return hw
