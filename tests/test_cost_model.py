"""cost_model.py: predicted step times, their structure and sanity.

Fidelity against measured GPU operator times is in test_op_profiles.py."""
import pytest

from minillm.sim import cost_model
from minillm.sim.accounting import OPS
from minillm.config import ModelConfig
from minillm.sim.cost_model import predict_step

LLAMA3 = ModelConfig.preset("llama-3-8b")


def test_predict_step_has_the_accounting_keys_and_adds_up():
    t = predict_step(LLAMA3, [(512, 0), (1, 1000)], hardware="A100-80GB")
    assert set(t.by_op) == set(OPS)
    assert t.total == pytest.approx(sum(t.by_op.values()) + t.overhead_s)


def test_decode_costs_about_the_weight_read_and_a_chunk_costs_more():
    hw = cost_model.gpu_profile("A100-80GB")
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


def test_importing_the_cost_model_reads_no_profile_files(tmp_path):
    """The data directory is resolved on first use, not at import (issue 9)."""
    import subprocess
    import sys
    code = ("import sys, minillm.sim.cost_model as c; "
            "assert 'minillm.sim.op_profiles' not in sys.modules, 'op_profiles imported eagerly'; "
            "from minillm.sim.op_profiles import profile_paths; "
            "assert len(profile_paths()) == 7")
    subprocess.run([sys.executable, "-c", code], check=True)
