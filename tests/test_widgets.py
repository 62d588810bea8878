"""The lab widget only wires controls to figures.py; bad settings become a message."""
import ipywidgets
import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

from minillm.book import lab
from minillm.book import widgets

GOOD = dict(chunk_size=512, num_decoders=4, prompt_len=2048, model="llama-3-8b", hardware="A100-80GB",
            mode="simulate", itl_slo_ms=50.0)


def test_lab_is_a_widget_with_every_control():
    box = widgets.lab()
    assert isinstance(box, ipywidgets.Widget)
    controls = widgets.lab_controls()
    assert set(controls) == set(lab.LabSettings.__dataclass_fields__)
    values = [v for _, v in controls["chunk_size"].options]
    assert values[0] == 16 and 4096 in values and values[-1] == "off"
    assert controls["mode"].options == ("simulate", "measure") or \
        [v for _, v in controls["mode"].options] == ["simulate", "measure"]
    plt.close("all")


def test_lab_controls_start_at_the_given_settings():
    controls = widgets.lab_controls(lab.LabSettings(chunk_size=64, hardware="H200", num_decoders=8))
    assert controls["chunk_size"].value == 64
    assert controls["hardware"].value == "H200"
    assert controls["num_decoders"].value == 8


def test_render_draws_the_figure_and_the_verdict():
    figure, message = widgets.render(**GOOD)
    assert isinstance(figure, Figure) and len(figure.axes) == 3
    assert "ITL SLO" in message


def test_bad_settings_render_a_readable_line_not_a_traceback():
    for bad, word in ((dict(chunk_size=0), "chunk_size"), (dict(hardware="B200"), "hardware"),
                      (dict(prompt_len=-5), "prompt_len"), (dict(num_decoders=0), "num_decoders")):
        figure, message = widgets.render(**{**GOOD, **bad})
        assert figure is None
        assert "Cannot run this setting" in message and word in message
        assert "Traceback" not in message


def test_lab_started_with_bad_settings_says_why_and_shows_the_defaults():
    box = widgets.lab(chunk_size=0)
    verdict = box.children[1]
    assert "chunk_size=0" in verdict.value and "defaults" in verdict.value
    box = widgets.lab(hardware="B200")
    assert "hardware" in box.children[1].value
    plt.close("all")


def test_measure_mode_offers_the_real_model_and_counts_its_steps(monkeypatch):
    from minillm.book import lab
    monkeypatch.setattr(lab.LAB, "measured", {})              # nothing measured yet: progress shows
    view = widgets.LabView(num_decoders=1, prompt_len=128, chunk_size=64)
    choice = view.controls["measure_model"]
    assert [value for _, value in choice.options] == list(lab.MEASURE_MODELS)
    assert choice.value == "tiny" and choice.disabled          # meaningless while simulating
    lines = []
    view.progress.observe(lambda change: lines.append(change["new"]), names="value")
    view.controls["mode"].value = "measure"
    assert not choice.disabled and "tiny model" in view.figure._suptitle.get_text()
    assert any("measuring tiny model" in line and "step" in line for line in lines)
    monkeypatch.undo()              # the lab's own cache: test_lab may have measured this setting
    choice.value = "smollm2-135m-instruct"                     # else a few seconds on 2 cores
    assert view.settings.measure_model == "smollm2-135m-instruct"
    assert "SmolLM2-135M-Instruct" in view.figure._suptitle.get_text() and view.progress.value == ""
    view.controls["mode"].value = "simulate"
    assert choice.disabled
    plt.close("all")


# one timing per step cannot say how busy the machine was: the quick fit warns so, as it should
@pytest.mark.filterwarnings("ignore::minillm.sim.calibration.NoisyCalibrationWarning")
def test_choosing_this_machine_says_it_is_calibrating_when_nothing_is_cached(monkeypatch, tmp_path):
    # calibrate() times real steps for ~20 s the first time: the lab says so first. What is
    # checked is the message; the calibration behind it is a quick one (7 shapes, one
    # repeat, its own file), and the lab forgets the run it simulated with it.
    from minillm.sim import hardware
    real_calibrate = hardware.calibrate
    quick = [(0, 1, 8), (0, 3, 8), (8, 1, 8), (16, 2, 0), (32, 1, 16), (4, 4, 4), (0, 2, 64)]
    monkeypatch.setattr(hardware, "calibrate", lambda **_: real_calibrate(
        shapes=quick, repeats=1, progress=False, cache_path=tmp_path / "hw.json", max_spread=None))
    monkeypatch.setattr(lab.LAB, "simulated", {})
    monkeypatch.setattr(widgets, "is_calibrated", lambda: False)
    view = widgets.LabView(num_decoders=1, prompt_len=128, chunk_size=64, model="tiny")
    lines = []
    view.progress.observe(lambda change: lines.append(change["new"]), names="value")
    view.controls["hardware"].value = "cpu"
    assert any("calibrating this machine" in line for line in lines)
    assert view.settings.hardware == "cpu" and view.progress.value == ""
    plt.close("all")
