"""The chapter-7 lab as ipywidgets: controls wired to book/lab.py, nothing computed here.

Each control sets one field of lab.LabSettings. A change runs `LabView.update`,
which writes the verdict line first (cheap once the setting's simulations are
cached), then redraws the lab's ONE figure in place (lab.lab_figure(fig=...))
and renders it into an Image widget: no new figure, no new output area. A
bad setting becomes a readable line in the lab, not a traceback (ipywidgets
would swallow the traceback anyway: the tests call the same LabView).
A measured run not seen before (seconds with the tiny model, tens of seconds
with the real one on a CPU) writes its step count to the progress line as it
goes.
"""
from __future__ import annotations

import html
import io
import time
from collections import OrderedDict
from dataclasses import replace

import numpy as np

from . import figures
from . import lab as lab_state
from ..sim.hardware import PROFILES, is_calibrated

__all__ = ["lab", "lab_controls", "LabView", "verdict_html"]

CHUNK_OPTIONS = [(str(c), c) for c in lab_state.CHUNK_SIZES] + [("off (prefill_first)", lab_state.OFF)]
# "tiny" with "this machine (calibrated)" is the simulated twin of measure mode
MODEL_OPTIONS = ("llama-3-8b", "llama-2-7b", "mistral-7b", "qwen3-0.6b", "tiny")
HARDWARE_OPTIONS = [(name, name) for name in sorted(PROFILES)] + [("this machine (calibrated)", "cpu")]
MEASURE_MODEL_OPTIONS = [("tiny (random weights, fast)", "tiny"),
                         ("SmolLM2-135M-Instruct (real weights, slower)", "smollm2-135m-instruct")]
RENDER_DPI = 72
RENDERED_KEPT = 32           # interference pictures kept (~60 kB each)
PROGRESS_EVERY_S = 0.25      # a GPU's steps take a millisecond: redraw the progress line at most this often


def lab_controls(settings: lab_state.LabSettings | None = None) -> dict:
    """The widgets, one per LabSettings field, set to `settings` (defaults if None)."""
    import ipywidgets as w

    s = settings if settings is not None else lab_state.LabSettings()
    style = {"description_width": "150px"}
    layout = w.Layout(width="460px")
    return {
        "workload": w.Dropdown(options=[("one long prompt among streams", "interference"),
                                        ("steady: uniform 100-1024", "uniform"),
                                        ("steady: chat-like", "chat"),
                                        ("steady: long prompts", "long_prompt"),
                                        ("steady: fixed 512/128", "fixed")],
                               value=s.workload, description="workload", style=style, layout=layout),
        "policy": w.Dropdown(options=[(v, k) for k, v in lab_state.POLICY_LABELS.items()], value=s.policy,
                             description="policy (under load)", style=style, layout=layout),
        "chunk_size": w.SelectionSlider(options=CHUNK_OPTIONS, value=s.chunk_size,
                                        description="chunk size (tokens)", style=style, layout=layout,
                                        continuous_update=False),
        "chunk_sizing": w.ToggleButtons(options=[("equal tokens", "fixed"), ("equal work", "equal_work")],
                                        value=s.chunk_sizing, description="chunks of", style=style),
        "rate_per_s": w.FloatLogSlider(value=s.rate_per_s, base=2, min=-2, max=6, step=0.5,
                                       description="request rate (req/s)", style=style, layout=layout,
                                       continuous_update=False),
        "itl_slo_ms": w.FloatText(value=s.itl_slo_ms, description="ITL SLO (ms)", style=style, layout=layout),
        "ttft_slo_ms": w.FloatText(value=s.ttft_slo_ms, description="TTFT SLO (ms, median)", style=style,
                                   layout=layout),
        "num_decoders": w.IntSlider(value=s.num_decoders, min=1, max=64, description="decoding streams",
                                    style=style, layout=layout, continuous_update=False),
        # up to 32k: a long prompt on a small model (Qwen3-0.6B takes 40,960) is where chunks
        # of equal work matter; the verdict names a model's limit when a prompt exceeds it
        "prompt_len": w.IntSlider(value=s.prompt_len, min=128, max=32768, step=64,
                                  description="long prompt (tokens)", style=style, layout=layout,
                                  continuous_update=False),
        "model": w.Dropdown(options=MODEL_OPTIONS, value=s.model, description="model (simulate)",
                            style=style, layout=layout),
        "hardware": w.Dropdown(options=HARDWARE_OPTIONS, value=s.hardware, description="hardware (simulate)",
                               style=style, layout=layout),
        "mode": w.ToggleButtons(options=[("simulate", "simulate"), ("measure on this device", "measure")],
                                value=s.mode, description="mode", style=style),
        "graph_mode": w.Dropdown(options=[("CUDA graphs: full (decodes) + piecewise (vLLM V1)",
                                            "full_and_piecewise"),
                                           ("CUDA graphs: piecewise only", "piecewise"),
                                           ("no CUDA graphs (eager)", "none")],
                                  value=s.graph_mode, description="graph mode (simulate)", style=style,
                                  layout=layout),
        "async_scheduling": w.ToggleButtons(options=[("async (overlapped)", True), ("synchronous", False)],
                                            value=s.async_scheduling, description="host scheduling",
                                            style=style),
        # what "measure" runs; greyed out while simulating, where it changes nothing
        "measure_model": w.Dropdown(options=MEASURE_MODEL_OPTIONS, value=s.measure_model,
                                    description="model (measure)", style=style, layout=layout,
                                    disabled=s.mode != "measure"),
    }


def verdict_html(on_step=None, **values):
    """(settings or None, the verdict line as HTML) for these control values.
    on_step(steps_done, steps_total): the progress of a measured run not cached yet.
    A bad setting, or a real model whose weights package is missing (pretrained()
    says how to install it), is the line, not an exception."""
    try:
        settings = lab_state._as_settings(None, **values)
        if settings.mode == "measure":
            lab_state.lab_run(settings, on_step=on_step)      # the slow part, cached for what follows
        verdict = lab_state.lab_verdict(settings)
    except (ValueError, TypeError) as e:
        return None, f"<b class='lab-verdict' style='color:#b00'>Cannot run this setting:</b> {html.escape(str(e))}"
    color = "#070" if verdict.startswith("MEETS") else "#b00"
    readout = ""
    if settings.mode == "simulate" and not settings.under_load:
        readout = f"<br><span class='lab-step'>{html.escape(lab_state.step_readout(settings))}</span>"
    return settings, f"<b class='lab-verdict' style='color:{color}'>{html.escape(verdict)}</b>{readout}"


class LabView:
    """The lab's widgets and its one figure. update(**values) is what a slider move runs."""

    def __init__(self, settings: lab_state.LabSettings | None = None, **overrides):
        import ipywidgets as w

        problem = None
        try:
            settings = lab_state._as_settings(settings, **overrides)
        except (ValueError, TypeError) as e:   # start from the defaults and say why
            problem = (f"<b style='color:#b00'>Cannot start with this setting:</b> {html.escape(str(e))}; "
                       "showing the defaults instead<br>")
            settings = lab_state.LabSettings()
        self.controls = lab_controls(settings)
        self.verdict = w.HTML()
        self.verdict.add_class("minillm-verdict")
        self.progress = w.HTML()
        self.image = w.Image(format="png")
        self.figure = None                   # created on the first draw, then redrawn in place
        self._background = self._background_key = None   # the under-load figure without its marks
        self._rendered: OrderedDict = OrderedDict()        # interference pictures by setting
        self.settings = None
        self.redraws = 0
        left = w.VBox([self.controls[k] for k in ("workload", "policy", "chunk_size", "chunk_sizing",
                                                  "rate_per_s", "itl_slo_ms", "ttft_slo_ms")])
        right = w.VBox([self.controls[k] for k in ("num_decoders", "prompt_len", "model", "hardware",
                                                   "graph_mode", "async_scheduling", "mode", "measure_model")])
        self.widget = w.VBox([w.HBox([left, right]), self.verdict, self.progress, self.image])
        self.widget.add_class("minillm-lab")
        for control in self.controls.values():
            control.observe(self._on_change, names="value")
        self.update(**self.values())
        if problem:
            self.verdict.value = problem + self.verdict.value

    def values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def _on_change(self, _change) -> None:
        self.controls["measure_model"].disabled = self.controls["mode"].value != "measure"
        self.update(**self.values())

    def _show_progress(self, rate) -> None:
        self.progress.value = f"<i>simulating {rate:.2f} req/s ...</i>"

    def _measuring(self, settings):
        """The progress line of a measured run: (the line now, on_step for the run)."""
        what = f"measuring {lab_state.MEASURE_MODELS[settings.measure_model]} on this device"
        first_step_at, shown_at = [None], [0.0]      # perf_counter times, set as the run goes

        def on_step(steps_done: int, steps_total: int) -> None:
            now = time.perf_counter()
            if first_step_at[0] is None:             # the model is loaded: steps start now
                first_step_at[0] = now
            if 0 < steps_done < steps_total and now - shown_at[0] < PROGRESS_EVERY_S:
                return
            shown_at[0] = now
            elapsed_s = now - first_step_at[0]
            left = f", about {elapsed_s / steps_done * (steps_total - steps_done):.0f} s left" if steps_done else ""
            self.progress.value = f"<i>{what}: step {steps_done} of {steps_total}{left} ...</i>"

        return f"<i>{what}: loading the model ...</i>", on_step

    def update(self, **values) -> bool:
        """Verdict first, then the figure redrawn in place; False for a bad setting."""
        on_step = None
        try:
            settings = lab_state._as_settings(None, **values)
        except (ValueError, TypeError):
            settings = None                  # verdict_html says what is wrong
        if settings is not None and settings.mode == "measure" and not lab_state.is_measured(settings):
            self.progress.value, on_step = self._measuring(settings)
        elif settings is not None and settings.mode == "simulate" and settings.hardware == "cpu" \
                and not is_calibrated():
            self.progress.value = ("<i>calibrating this machine: timing real engine steps "
                                   "(about 20 s on two cores, once; kept on disk) ...</i>")
        settings, message = verdict_html(on_step, **values)
        self.verdict.value = message
        if settings is None:
            self.progress.value = ""
            return False
        if settings.under_load:
            # a new setting runs up to ~100 simulations for the capacity view: say so
            lab_state.capacity_rows(settings, on_point=self._show_progress)
            lab_state.chunk_sweep(settings, on_point=self._show_progress)
            self.image.value = self._render_load(settings)
        else:
            self.image.value = self._render_interference(settings)
        self.progress.value = ""
        self.settings = settings
        self.redraws += 1
        return True


    def _render_interference(self, settings) -> bytes:
        """PNG of the interference figure. Each chunk size is a different run, so the
        whole figure changes; a setting drawn before is not drawn again (its picture
        is kept, the last RENDERED_KEPT of them)."""
        self._background_key = None
        if settings in self._rendered:
            self._rendered.move_to_end(settings)
            return self._rendered[settings]
        self.figure = lab_state.lab_figure(settings, progress=settings.mode == "measure", fig=self.figure)
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=RENDER_DPI)
        self._rendered[settings] = buffer.getvalue()
        if len(self._rendered) > RENDERED_KEPT:
            self._rendered.popitem(last=False)
        return self._rendered[settings]

    def _render_load(self, settings) -> bytes:
        """PNG of the under-load figure. Moving the chunk size under one policy changes
        only the marks and the verdict title: draw everything else once, keep it
        (copy_from_bbox), and on each move paste it back and draw only what moved;
        drawing the whole figure (ticks, legends, text) is most of a redraw's time."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from PIL import Image

        key = (replace(settings, chunk_size=lab_state.LabSettings.chunk_size), settings.sched().policy)
        if key != self._background_key:
            self.figure = lab_state.lab_figure(settings, fig=self.figure)
            self.figure.set_dpi(RENDER_DPI)
            canvas = FigureCanvasAgg(self.figure)
            moving = figures.current_setting_artists(self.figure)   # lab_figure drew them already
            for artist in moving:
                artist.set_animated(True)          # left out of the full draw below
            canvas.draw()
            self._background, self._background_key = canvas.copy_from_bbox(self.figure.bbox), key
        else:
            moving = lab_state.mark_load_setting(self.figure, settings)
            for artist in moving:
                artist.set_animated(True)
        canvas = self.figure.canvas
        canvas.restore_region(self._background)
        for artist in moving:
            self.figure.draw_artist(artist)
        buffer = io.BytesIO()
        Image.fromarray(np.asarray(canvas.buffer_rgba())).save(buffer, format="png", compress_level=1)
        return buffer.getvalue()


def render(**values):
    """(figure or None, verdict HTML) for these control values, without widgets."""
    settings, message = verdict_html(**values)
    if settings is None:
        return None, message
    return lab_state.lab_figure(settings, progress=settings.mode == "measure"), message


def lab(settings: lab_state.LabSettings | None = None, **overrides):
    """The TTFT/TPOT lab as an ipywidgets.Widget (controls, verdict, progress, figure)."""
    return LabView(settings, **overrides).widget
