"""cost_model.py: predictions against measured GPU operator times, and sanity."""
import pytest

from minillm.sim import cost_model
from minillm.sim.accounting import OPS
from minillm.config import ModelConfig
from minillm.sim.cost_model import linear_op_errors, load_gpu_op_profile, predict_step

PROFILE_FILES = sorted(cost_model.PROFILE_DIR.glob("*.csv"))
LLAMA3 = ModelConfig.preset("llama-3-8b")


def _percentile(values, q):
    values = sorted(values)
    i = q * (len(values) - 1)
    lo = int(i)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (i - lo)


def test_profile_files_are_found():
    assert len(PROFILE_FILES) == 7, cost_model.PROFILE_DIR


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.name)
def test_linear_ops_match_the_measured_gpu_profile(path):
    """Median |error| <= 8% and p90 <= 20% over qkv, o, gate_up, down and the whole MLP."""
    errors = linear_op_errors(path)
    abs_errors = [abs(e) for rows in errors.values() for *_, e in rows]
    median, p90 = _percentile(abs_errors, 0.5), _percentile(abs_errors, 0.9)
    assert median <= 0.08, f"{path.name}: median |error| {median:.3f}"
    assert p90 <= 0.20, f"{path.name}: p90 |error| {p90:.3f}"


def test_profile_loader_reads_the_shape():
    prof = load_gpu_op_profile(cost_model.PROFILE_DIR / "a100_Meta-Llama-3-8B.csv")
    assert prof.hardware == "A100-80GB"
    assert (prof.cfg.hidden_size, prof.cfg.num_kv_heads, prof.cfg.intermediate_size) == (4096, 8, 14336)
    assert max(prof.num_tokens) == 32768


def test_predict_step_has_the_accounting_keys_and_adds_up():
    t = predict_step(LLAMA3, [(512, 0), (1, 1000)], hardware="A100-80GB")
    assert set(t.by_op) == set(OPS)
    assert t.total == pytest.approx(sum(t.by_op.values()) + t.overhead_s)


def test_decode_costs_about_the_weight_read_and_a_chunk_costs_more():
    hw = cost_model.get_hardware("A100-80GB")
    decode = predict_step(LLAMA3, [(1, 512)], hardware=hw)
    weights_s = LLAMA3.num_parameters() * 2 / hw.mem_bandwidth_bytes_s
    assert weights_s < decode.total < 2 * weights_s + hw.step_overhead_s
    chunk = predict_step(LLAMA3, [(512, 0)], hardware=hw)
    assert chunk.total > decode.total


def test_faster_gpu_predicts_faster_steps():
    shape = [(2048, 0)]
    assert predict_step(LLAMA3, shape, "H100-SXM").total < predict_step(LLAMA3, shape, "A100-80GB").total


@pytest.mark.parametrize("bad, match", [
    (dict(hardware="TPU"), "hardware='TPU'"),
    (dict(dtype_bytes=16), "dtype_bytes=16"),
    (dict(requests=[(-5, 0)]), "num_new_tokens"),
    (dict(cfg="gpt-5"), "preset='gpt-5'"),
])
def test_bad_input_names_the_argument(bad, match):
    kwargs = dict(cfg=LLAMA3, requests=[(8, 0)], hardware="H100-SXM", dtype_bytes=2) | bad
    with pytest.raises(ValueError, match=match):
        predict_step(**kwargs)
