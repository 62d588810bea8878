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


# ---- the step's type decides its fixed cost (issue 28) --------------------------

def test_default_capture_sizes_follow_vllms_rule():
    sizes = cost_model.default_capture_sizes()
    assert sizes[:5] == (1, 2, 4, 8, 16) and sizes[-1] == 512
    assert 248 in sizes and 252 not in sizes and 272 in sizes and 264 not in sizes
    assert cost_model.default_capture_sizes(max_num_seqs=64)[-1] == 128
    assert cost_model.default_capture_sizes(max_num_seqs=256, max_num_batched_tokens=96)[-1] == 96
    # a budget off the stride is captured too, as the largest size (vLLM appends it)
    assert cost_model.default_capture_sizes(max_num_seqs=256, max_num_batched_tokens=300)[-2:] == (288, 300)
    assert cost_model.default_capture_sizes(max_num_seqs=256, max_num_batched_tokens=100)[-2:] == (96, 100)


def test_decode_mixed_and_oversized_steps_are_priced_differently_with_the_reason():
    decode = predict_step(LLAMA3, [(1, 1000)] * 37, "A100-80GB")
    mixed = predict_step(LLAMA3, [(200, 0)] + [(1, 1000)] * 37, "A100-80GB")
    oversized = predict_step(LLAMA3, [(600, 0)] + [(1, 1000)] * 37, "A100-80GB")
    assert (decode.kind, decode.graph, decode.rows) == ("decode", "full", 40)
    assert (mixed.kind, mixed.graph, mixed.rows) == ("mixed", "piecewise", 240)
    assert (oversized.kind, oversized.graph, oversized.rows) == ("mixed", "none", 637)
    assert "full graph at capture size 40 (3 padded rows)" in decode.reason
    assert "attention eager" in mixed.reason and "> largest capture size 512: eager" in oversized.reason
    # host launches: one graph replay < a graph per layer + eager attention < every kernel eager
    assert decode.launch_s < mixed.launch_s < oversized.launch_s


def test_padded_rows_cost_and_capture_sizes_are_settable():
    hw = cost_model.gpu_profile("H100-SXM")
    padded = predict_step(LLAMA3, [(100, 0)], hw, capture_sizes=(8, 512), async_scheduling=False)
    exact = predict_step(LLAMA3, [(100, 0)], hw, capture_sizes=(8, 100), async_scheduling=False)
    assert padded.rows == 512 and exact.rows == 100 and padded.device_s > exact.device_s
    eager = predict_step(LLAMA3, [(100, 0)], hw, graph_mode="none", async_scheduling=False)
    assert eager.graph == "none" and eager.rows == 100 and eager.launch_s > exact.launch_s


def test_async_scheduling_hides_host_time_behind_the_gpus():
    shape = [(512, 0)] + [(1, 1000)] * 8
    sync = predict_step(LLAMA3, shape, "A100-80GB", async_scheduling=False)
    over = predict_step(LLAMA3, shape, "A100-80GB", async_scheduling=True)
    assert sync.total == pytest.approx(sync.host_s + max(sync.launch_s, sync.device_s))
    assert over.total == pytest.approx(max(over.host_s + over.launch_s, over.device_s))
    assert over.total == pytest.approx(over.device_s)           # a big step: the host hides
    assert sync.total - over.total == pytest.approx(sync.host_s)


def test_a_cpu_profile_has_no_graphs_and_keeps_the_additive_step():
    cpu = cost_model.gpu_profile("A100-80GB").replace(num_sms=0, name="a cpu")
    t = predict_step(LLAMA3, [(1, 100)] * 4, cpu)
    assert t.graph == "none" and "no CUDA graphs" in t.reason
    assert t.total == pytest.approx(t.device_s + t.host_s)


@pytest.mark.parametrize("bad, match", [
    (dict(graph_mode="full"), "graph_mode='full'"),
    (dict(capture_sizes=(0, 8)), "capture_sizes"),
    (dict(async_scheduling="yes"), "async_scheduling='yes'"),
])
def test_bad_step_options_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        predict_step(LLAMA3, [(8, 0)], "H100-SXM", **bad)


def test_gemm_tiling_counts_tiles_and_waves():
    t = cost_model.gemm_tiling(2112, 4096, 28672, "H100-SXM")
    assert t.row_tiles == -(-2112 // t.tile_m) and t.col_tiles == -(-28672 // t.tile_n)
    assert t.waves == pytest.approx(t.tiles / 132)
    assert "waves on 132 SMs" in t.describe()
    with pytest.raises(ValueError, match="m=0"):
        cost_model.gemm_tiling(0, 4096, 4096, "H100-SXM")


def test_one_row_count_and_an_array_of_them_cost_the_same():
    """layer_linear_times_s takes one M or a numpy array of them (the fit's fast path):
    the same formula, the same seconds, 0 rows cost nothing."""
    import numpy as np
    rows = np.array([0, 1, 64, 128, 129, 520, 2112, 4096])
    for name in ("A100-80GB", "H100-SXM"):
        hw = cost_model.gpu_profile(name)
        many = cost_model.layer_linear_times_s(LLAMA3, rows, hw)
        for i, m in enumerate(rows):
            one = cost_model.layer_linear_times_s(LLAMA3, int(m), hw)
            assert all(one[op] == pytest.approx(float(many[op][i]), rel=1e-12, abs=0) for op in one), (name, m)
    assert cost_model.layer_linear_times_s(LLAMA3, 0, hw)["mlp"] == 0.0


def test_the_largest_tile_is_taken_once_it_fills_the_gpu():
    """gemm_tiling's rule: the largest tile once it makes gemm_fill_waves waves, even when
    its partial wave costs more than a smaller tile; with fewer tiles, the fastest."""
    hw = cost_model.gpu_profile("H100-SXM").replace(
        gemm_tiles=((64, 64, 0.7, 0.0), (128, 256, 0.7, 1.0)), gemm_fill_waves=1.0)
    # [M, 8192] x [8192, 8192]: 32 column tiles of 256, so 128x256 fills 132 SMs from 5 row tiles
    assert cost_model.gemm_tiling(512, 8192, 8192, hw).tile_m == 64          # 128 big tiles: < 132
    past = cost_model.gemm_tiling(520, 8192, 8192, hw)
    assert (past.tile_m, past.tile_n, past.tiles) == (128, 256, 160)
    # the big tile's second wave is nearly empty: taking it costs more than the small tile
    small = hw.replace(gemm_tiles=((64, 64, 0.7, 0.0),))
    assert cost_model.gemm_time_s(520, 8192, 8192, hw) > cost_model.gemm_time_s(520, 8192, 8192, small)
    never = hw.replace(gemm_fill_waves=100.0)                                 # then always the fastest
    assert cost_model.gemm_tiling(520, 8192, 8192, never).tile_m == 64
