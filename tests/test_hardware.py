"""hardware.py: profiles, lookup errors, calibration (tiny and cached)."""
import pytest

from minillm.sim import hardware
from minillm.sim.hardware import PROFILES, Hardware, get_hardware


def test_profiles_carry_the_datasheet_peaks():
    assert PROFILES["A100-80GB"].peak_flops_s == 312e12
    assert PROFILES["A100-40GB"].mem_bandwidth_bytes_s == 1555e9
    assert PROFILES["A100-80GB"].mem_bandwidth_bytes_s == 2039e9
    assert PROFILES["H100-SXM"].peak_flops_s == 989e12
    assert PROFILES["H100-SXM"].mem_bandwidth_bytes_s == 3.35e12
    assert PROFILES["H200"].mem_bandwidth_bytes_s == 4.8e12


def test_ridge_point_is_peak_over_bandwidth():
    a100 = get_hardware("A100-80GB")
    assert a100.ridge_point == pytest.approx(312e12 / 2039e9)
    assert a100.attainable_flops_s(1.0) == 2039e9
    assert a100.attainable_flops_s(1e6) == 312e12


def test_get_hardware_passes_objects_through():
    hw = Hardware("mine", 1e12, 1e11)
    assert get_hardware(hw) is hw


def test_unknown_hardware_is_a_value_error_naming_it_and_the_choices():
    with pytest.raises(ValueError, match=r"hardware='B200'.*A100-80GB"):
        get_hardware("B200")


def test_a_dtype_the_widths_do_not_know_is_refused_by_name():
    assert Hardware("x", 1e12, 1e11, dtype="float32").dtype_bytes == 4
    with pytest.raises(ValueError, match="dtype='torch.float32'"):
        Hardware("x", 1e12, 1e11, dtype="torch.float32")


def test_bad_efficiency_is_named():
    with pytest.raises(ValueError, match="gemm_efficiency=1.5"):
        Hardware("x", 1e12, 1e11, gemm_efficiency=1.5)
