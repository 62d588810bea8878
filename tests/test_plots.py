"""Every figure is a pure function: call it, count its artists, check its errors."""
import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import StepPatch

from minillm.book import figures
from minillm.book import lab
from minillm.engine import EngineCore, StepRecord, VirtualClock
from minillm.kv_cache import BlockManager
from minillm.scheduler import SchedulerConfig
from minillm.sim.workloads import long_prompt_interference


class UnitTimeExecutor:
    def execute(self, plan, samples):
        tokens = {r.request_id: 1 for (r, _), s in zip(plan.scheduled, samples) if s}
        return tokens, 0.001 * (1 + sum(n for _, n in plan.scheduled) / 64)

    def release(self, request):
        pass


@pytest.fixture(scope="module")
def run():
    core = EngineCore(SchedulerConfig(policy="prefill_first"), BlockManager(500, 16), UnitTimeExecutor(),
                      VirtualClock())
    outputs = core.run_workload(long_prompt_interference(prompt_len=256, num_decoders=3))
    return core.trace, outputs


@pytest.fixture(autouse=True)
def no_figure_left_open():
    yield
    assert plt.get_fignums() == []


@pytest.mark.parametrize("x", ["step", "time"])
def test_step_timeline_draws_decode_and_prefill_staircases(run, x):
    trace, _ = run
    fig = figures.plot_step_timeline(trace, x=x)
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    stairs = [p for p in fig.axes[0].patches if isinstance(p, StepPatch)]
    assert len(stairs) == 2
    decode, prefill = (s.get_data() for s in stairs)
    assert sum(decode.values) == sum(r.num_decode_tokens for r in trace)
    assert sum(prefill.values - decode.values) == sum(r.num_prefill_tokens for r in trace)
    assert "256 prefill tokens" in fig.axes[0].get_title()


def test_step_timeline_on_given_axes_and_empty_trace(run):
    fig, (a, b) = plt.subplots(1, 2)
    plt.close(fig)
    assert figures.plot_step_timeline(run[0], ax=b, title="mine") is fig
    assert b.get_title() == "mine" and not a.patches
    assert len(figures.plot_step_timeline([]).axes[0].patches) == 0
    with pytest.raises(ValueError, match="x="):
        figures.plot_step_timeline(run[0], x="tokens")


def test_step_timeline_leaves_idle_time_empty():
    trace = [StepRecord(0.0, 0.01, [(0, 4)], 4, 0), StepRecord(0.05, 0.06, [(0, 1)], 0, 1)]
    decode, top = (p.get_data() for p in figures.plot_step_timeline(trace, x="time").axes[0].patches)
    assert list(top.edges) == pytest.approx([0, 10, 50, 60])
    assert list(top.values) == [4, 0, 1]


@pytest.mark.parametrize("tag, streams", [("decoder", 3), ("long", 1), (None, 4)])
def test_token_gaps_draw_one_line_per_stream(run, tag, streams):
    _, outputs = run
    fig = figures.plot_token_gaps(outputs, tag=tag)
    assert len(fig.axes[0].lines) == streams


def test_token_gaps_show_the_stall_as_the_highest_point(run):
    trace, outputs = run
    fig = figures.plot_token_gaps(outputs, tag="decoder")
    highest = max(max(line.get_ydata()) for line in fig.axes[0].lines)
    assert highest == pytest.approx(max(r.duration for r in trace) * 1e3, rel=0.5)
    assert f"{highest:.1f} ms" in fig.axes[0].get_title()


@pytest.mark.parametrize("settings", [
    dict(),
    dict(chunk_size=16),
    dict(chunk_size="off"),
    dict(chunk_size=4096, hardware="H200", num_decoders=1),
    dict(model="llama-2-7b", hardware="A100-40GB", prompt_len=1000, num_decoders=8, itl_slo_ms=20),
    dict(model="qwen3-0.6b", hardware="H100-SXM", chunk_size=100),
])
def test_lab_figure_has_three_views_and_a_verdict(settings):
    fig = lab.lab_figure(**settings)
    assert len(fig.axes) == 3
    timeline, gaps, sweep = fig.axes
    assert len([p for p in timeline.patches if isinstance(p, StepPatch)]) == 2
    assert len(gaps.lines) == lab.LabSettings(**settings).num_decoders
    assert len([line for line in sweep.lines if len(line.get_xdata()) == len(lab.CHUNK_SIZES)]) == 4
    assert "ITL SLO" in fig._suptitle.get_text()


def test_verdict_and_best_chunk_follow_the_slo():
    assert lab.lab_verdict(chunk_size=16, itl_slo_ms=1000).startswith("MEETS")
    assert lab.lab_verdict(chunk_size="off", itl_slo_ms=1).startswith("MISSES")
    loose = lab.best_chunk_size(itl_slo_ms=1000)
    tight = lab.best_chunk_size(itl_slo_ms=30)
    assert loose in ("off", 4096, 2048)
    assert isinstance(tight, int) and tight < 512
    assert lab.best_chunk_size(itl_slo_ms=0.001) is None


def test_chunk_sweep_ttft_falls_and_worst_gap_rises_with_chunk_size():
    rows = [r for r in lab.chunk_sweep() if r["chunk_size"] != "off"]
    ttft = [r["long_ttft_s"] for r in rows]
    worst = [r["itl_max_s"] for r in rows]
    assert ttft == sorted(ttft, reverse=True)
    assert worst == sorted(worst)


@pytest.mark.parametrize("bad, word", [
    (dict(chunk_size=0), "chunk_size"),
    (dict(chunk_size=-512), "chunk_size"),
    (dict(chunk_size="big"), "chunk_size"),
    (dict(hardware="B200"), "hardware"),
    (dict(model="gpt-5"), "preset"),
    (dict(prompt_len=-1), "prompt_len"),
    (dict(prompt_len=10_000), "prompt_len"),
    (dict(num_decoders=0), "num_decoders"),
    (dict(mode="guess"), "mode"),
    (dict(itl_slo_ms=-3), "itl_slo_ms"),
])
def test_bad_lab_settings_are_value_errors_naming_the_setting(bad, word):
    for fn in (lab.lab_figure, lab.lab_verdict, lab.chunk_sweep):
        with pytest.raises(ValueError, match=word):
            fn(**bad)


def test_roofline_places_decodes_left_and_big_chunks_right_of_the_ridge():
    from minillm.sim.hardware import get_hardware
    fig = figures.plot_roofline("llama-3-8b", "A100-80GB")
    assert len(fig.axes[0].lines) >= 2 and len(fig.axes[0].collections) == 7
    ridge = get_hardware("A100-80GB").ridge_point
    points = dict((label, x) for label, x, _ in figures.roofline_points())
    assert points["decode x1"] < ridge < points["chunk 512"]
    with pytest.raises(ValueError, match="hardware"):
        figures.plot_roofline(hardware="TPU")


def test_op_and_step_fidelity_plots():
    from minillm.sim.op_profiles import profile_paths
    fig = figures.plot_op_fidelity(profile_paths()[0], ops=("qkv_proj", "o_proj"))
    assert len(fig.axes[0].lines) == 2 and len(fig.axes[0].collections) == 2
    rows = [(16, 2, 64, 0.020, 0.022), (0, 4, 64, 0.010, 0.009)]
    fig = figures.plot_step_fidelity(rows)
    assert "median |error|" in fig.axes[0].get_title()
    with pytest.raises(ValueError, match="rows"):
        figures.plot_step_fidelity([])


def test_save_readme_figures_writes_four_pngs(tmp_path):
    paths = lab.save_readme_figures(tmp_path / "figs")
    assert sorted(p.name for p in paths) == ["load_lab.png", "roofline.png", "stall_timeline.png",
                                             "ttft_tpot_vs_chunk.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
