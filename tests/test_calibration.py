"""calibrate(): this machine's profile, fitted to the real engine's steps."""
import statistics

import pytest
import torch

from minillm.config import ModelConfig
from minillm.sim import hardware
from minillm.sim.calibration import (basis_hardware, calibration_shapes, evaluation_shapes, fit_step_model,
                                     measure_step_times, predict_step_times, relative_errors, step_shape)
from minillm.sim.cost_model import predict_step


def test_step_shape_is_a_chunk_plus_decodes():
    assert step_shape(64, 2, 10) == [(64, 10), (1, 10), (1, 10)]
    assert step_shape(0, 1, 5) == [(1, 5)]
    with pytest.raises(ValueError, match="num_decodes"):
        step_shape(4, -1, 0)


def test_held_out_shapes_are_new_and_cover_prefill_decode_and_mixed_steps():
    held_out = set(evaluation_shapes())
    assert not held_out & set(calibration_shapes())
    assert any(c == 0 for c, n, _ in held_out)                 # decode-only
    assert any(c >= 256 for c, n, _ in held_out)               # prefill-heavy
    assert any(0 < c < 256 and n for c, n, _ in held_out)      # mixed


def test_fit_recovers_known_factors_from_noise_free_times():
    cfg = ModelConfig.preset("tiny")
    # attention at 2/5 of the GEMMs' FLOP rate, its K/V reads at 1/8 of the weights' bandwidth
    truth = basis_hardware(1 / 5e10, 1 / 8e9, 2e-6, 1e-3, per_seq_s=3e-4,
                           attention_flops_inv=1 / 2e10, attention_bytes_inv=1 / 1e9)
    assert truth.attention_efficiency == pytest.approx(0.4)
    assert truth.attention_bandwidth_efficiency == pytest.approx(0.125)
    shapes = evaluation_shapes()
    times = predict_step_times(cfg, shapes, truth, dtype_bytes=4)
    fitted = fit_step_model(cfg, shapes, times, dtype_bytes=4)
    again = predict_step_times(cfg, shapes, fitted, dtype_bytes=4)
    assert max(abs(a - t) / t for a, t in zip(again, times)) < 1e-6
    # Attention's two rates and the per-sequence cost are identifiable. The GEMM
    # FLOP rate, bandwidth, launch and step costs are not quite: every step of one
    # model runs the same kernels and streams the same weights, so their columns
    # are nearly collinear (any mix that predicts the same steps will do).
    attention_rate = fitted.peak_flops_s * fitted.attention_efficiency
    read_rate = fitted.attention_bandwidth_bytes_s
    assert attention_rate == pytest.approx(2e10, rel=1e-3)
    assert read_rate == pytest.approx(1e9, rel=1e-3)
    assert fitted.per_seq_overhead_s == pytest.approx(3e-4, rel=1e-3)
    assert fitted.peak_flops_s == pytest.approx(5e10, rel=0.05)


def test_attention_reads_default_to_the_weights_bandwidth():
    cfg = ModelConfig.preset("tiny")
    plain = hardware.Hardware("x", 1e12, 1e11, bandwidth_efficiency=0.5)
    assert plain.attention_bandwidth_bytes_s == 5e10
    slow_reads = plain.replace(attention_bandwidth_efficiency=0.05)
    decode = [(1, 3000)] * 4
    assert predict_step(cfg, decode, slow_reads, 4).total > predict_step(cfg, decode, plain, 4).total
    with pytest.raises(ValueError, match="attention_bandwidth_efficiency"):
        plain.replace(attention_bandwidth_efficiency=1.5)


@pytest.fixture(scope="module")
def tiny_model():
    from minillm.loader import build_model
    return build_model("tiny", seed=0, dtype=torch.float32, device="cpu")


def test_measure_step_times_times_real_steps(tiny_model):
    times = measure_step_times(tiny_model, [(0, 1, 8), (16, 1, 8)], repeats=1)
    assert len(times) == 2 and all(t > 0 for t in times)
    with pytest.raises(ValueError, match="repeats"):
        measure_step_times(tiny_model, [(0, 1, 8)], repeats=0)


def test_calibrate_predicts_held_out_engine_steps_within_30_percent(tmp_path, tiny_model):
    # The public path: calibrate() -> predict_step, against real steps of shapes
    # the fit never saw, timed right after (each step's median of 3 here, of 5 by default).
    # Issue 13 asks for 10%. On the reference machine (bench simulator, README section 3):
    # 3.3-5.8% while the machine keeps its speed; 8-17% while the same steps themselves
    # move 9-23% from one minute to the next. 30% is what a shared CI machine can promise.
    hw = hardware.calibrate(device="cpu", repeats=3, progress=False, cache_path=tmp_path / "hw.json",
                            force=True)
    model = tiny_model
    shapes = evaluation_shapes()
    measured = measure_step_times(model, shapes, repeats=3, statistic="median")
    predicted = [predict_step(model.cfg, step_shape(*s), hw, dtype_bytes=4).total for s in shapes]
    errors = [abs(e) for e in relative_errors(measured, predicted)]
    assert statistics.median(errors) < 0.30, f"median |error| {statistics.median(errors):.0%}"


def test_calibrate_measures_once_then_reads_the_cache(tmp_path):
    path = tmp_path / "hw.json"
    shapes = [(0, 1, 8), (0, 3, 8), (8, 1, 8), (16, 2, 0), (32, 1, 16), (4, 4, 4), (0, 2, 64)]
    hw = hardware.calibrate(device="cpu", repeats=1, progress=False, cache_path=path, force=True, shapes=shapes)
    assert hw.peak_flops_s > 0 and hw.mem_bandwidth_bytes_s > 0 and "fitted" in hw.name
    assert path.exists()
    hardware._CALIBRATED.clear()                    # forget the process cache: read the file
    again = hardware.calibrate(device="cpu", repeats=1, progress=False, cache_path=path, shapes=shapes)
    assert again == hw
    assert hardware.calibrate(device="cpu", repeats=1, progress=False, cache_path=path,
                              shapes=shapes) is again      # in-process cache


@pytest.mark.parametrize("kwargs, arg", [(dict(repeats=0), "repeats"), (dict(shapes=[(0, 1, 1)]), "shapes"),
                                         (dict(dtype="float7"), "dtype")])
def test_calibrate_rejects_bad_arguments(tmp_path, kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        hardware.calibrate(device="cpu", cache_path=tmp_path / "x.json", force=True, **kwargs)


def test_the_cost_model_counts_bytes_at_the_hardware_dtype_by_default():
    # A CPU calibrated in float32 streams 4-byte weights; simulating it at 2 bytes a
    # weight once made the lab's "this machine" decode steps ~40% too fast.
    cfg = ModelConfig.preset("tiny")
    fp32 = basis_hardware(1 / 5e10, 1 / 8e9, 2e-6, 1e-3)
    assert fp32.dtype == "float32" and fp32.dtype_bytes == 4
    decode = [(1, 512)] * 4
    assert predict_step(cfg, decode, fp32).total == predict_step(cfg, decode, fp32, 4).total
    assert predict_step(cfg, decode, fp32, 2).total < predict_step(cfg, decode, fp32).total
    assert hardware.get_hardware("A100-80GB").dtype_bytes == 2


def test_simulate_counts_bytes_at_the_hardware_dtype_by_default():
    from minillm.sim import workloads
    from minillm.sim.simulator import simulate
    fp32 = basis_hardware(1 / 5e10, 1 / 8e9, 2e-6, 1e-3).replace(memory_bytes=2e9)
    workload = workloads.long_prompt_interference(prompt_len=256, num_decoders=2)
    default = simulate(workload, model="tiny", hardware=fp32).summary()["duration_s"]
    assert default == simulate(workload, model="tiny", hardware=fp32, dtype_bytes=4).summary()["duration_s"]
    assert simulate(workload, model="tiny", hardware=fp32, dtype_bytes=2).summary()["duration_s"] < default
    from minillm.book.figures import roofline_points
    from minillm.sim.disaggregation import simulate_disaggregated
    assert roofline_points("tiny", fp32) == roofline_points("tiny", fp32, 4)          # every path that
    split = dict(model="tiny", hardware=fp32, num_prefill=1, num_decode=1)             # takes hardware
    assert (simulate_disaggregated(workload, **split).summary()["duration_s"]
            == simulate_disaggregated(workload, dtype_bytes=4, **split).summary()["duration_s"])


def test_is_calibrated_says_whether_calibrate_would_measure(tmp_path, monkeypatch):
    path = tmp_path / "hw.json"
    assert not hardware.is_calibrated(device="cpu", cache_path=path)
    hw = hardware.calibrate(device="cpu", repeats=1, progress=False, cache_path=path, force=True)
    assert hardware.is_calibrated(device="cpu", cache_path=path)
    # ... and only for that file: this quick one-repeat fit once became the process's
    # answer for the default file too, so the lab's "this machine" simulated with it
    monkeypatch.setenv("MINILLM_CACHE_DIR", str(tmp_path / "default"))
    assert not hardware.is_calibrated(device="cpu")
    hardware._CALIBRATED.clear()                    # the file alone is enough
    assert hardware.is_calibrated(device="cpu", cache_path=path)
    assert hardware.calibrate(device="cpu", cache_path=path) == hw


def test_a_fit_of_another_kernel_build_is_not_reused(tmp_path, monkeypatch):
    # Decodes cost what the paged kernel costs: a profile fitted before the kernel
    # got faster would simulate this machine's decodes too slow.
    from pathlib import Path

    from minillm import kernels
    if not kernels.paged_decode_available():
        pytest.skip("the paged kernel is not built: decodes gather, and the fit says so")
    path = tmp_path / "hw.json"
    shapes = [(0, 1, 8), (0, 3, 8), (8, 1, 8), (16, 2, 0), (32, 1, 16), (4, 4, 4), (0, 2, 64)]
    hardware.calibrate(device="cpu", repeats=1, progress=False, cache_path=path, force=True, shapes=shapes)

    def cached():
        return hardware._cached_calibration(*hardware._calibration_key("cpu", None, shapes, "median", path)[3:])

    assert cached() is not None
    hardware._CALIBRATED.clear()                    # the file, not this process, decides
    assert cached() is not None
    monkeypatch.setattr(kernels, "library_path", lambda: Path("minillm_paged_decode_another.so"))
    assert cached() is None


def test_attention_never_comes_out_cheaper_than_the_gemms():
    # Were attention's FLOPs or K/V bytes cheaper than the GEMMs' and weights', the
    # profile's peak would be attention's rate (efficiencies are fractions of the faster
    # rate), and a near-free attention would make that peak absurd: the fit merges such
    # a factor with its base instead (None: charged like the GEMMs and weights).
    cfg = ModelConfig.preset("tiny")
    free_attention = basis_hardware(1 / 5e10, 1 / 8e9, 2e-6, 1e-3, attention_flops_inv=0, attention_bytes_inv=0)
    shapes = evaluation_shapes()
    fitted = fit_step_model(cfg, shapes, predict_step_times(cfg, shapes, free_attention), dtype_bytes=4)
    assert fitted.attention_bandwidth_efficiency in (None, 1.0) and fitted.attention_efficiency == 1.0
    assert fitted.peak_flops_s < 1e13

