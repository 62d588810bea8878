"""The chapter-7 lab as ipywidgets: controls wired to book/lab.py, nothing computed here.

Each control sets one field of lab.LabSettings. A change runs `LabView.update`,
which writes the verdict line first (cheap once the setting's simulations are
cached), then redraws the lab's ONE figure in place (lab.lab_figure(fig=...))
and renders it into an Image widget: no new figure, no new output area. A
bad setting becomes a readable line in the lab, not a traceback (ipywidgets
would swallow the traceback anyway: the tests call the same LabView).
"""
from __future__ import annotations

import html
import io

from . import lab as lab_state
from ..sim.hardware import PROFILES

__all__ = ["lab", "lab_controls", "LabView", "verdict_html"]

CHUNK_OPTIONS = [(str(c), c) for c in lab_state.CHUNK_SIZES] + [("off (prefill_first)", lab_state.OFF)]
MODEL_OPTIONS = ("llama-3-8b", "llama-2-7b", "mistral-7b", "qwen3-0.6b")
HARDWARE_OPTIONS = [(name, name) for name in sorted(PROFILES)] + [("this machine (calibrated)", "cpu")]
RENDER_DPI = 72


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
        "rate_per_s": w.FloatLogSlider(value=s.rate_per_s, base=2, min=-2, max=6, step=0.5,
                                       description="request rate (req/s)", style=style, layout=layout,
                                       continuous_update=False),
        "itl_slo_ms": w.FloatText(value=s.itl_slo_ms, description="ITL SLO (ms)", style=style, layout=layout),
        "ttft_slo_ms": w.FloatText(value=s.ttft_slo_ms, description="TTFT SLO (ms, median)", style=style,
                                   layout=layout),
        "num_decoders": w.IntSlider(value=s.num_decoders, min=1, max=64, description="decoding streams",
                                    style=style, layout=layout, continuous_update=False),
        "prompt_len": w.IntSlider(value=s.prompt_len, min=128, max=4000, step=64,
                                  description="long prompt (tokens)", style=style, layout=layout,
                                  continuous_update=False),
        "model": w.Dropdown(options=MODEL_OPTIONS, value=s.model, description="model (simulate)",
                            style=style, layout=layout),
        "hardware": w.Dropdown(options=HARDWARE_OPTIONS, value=s.hardware, description="hardware (simulate)",
                               style=style, layout=layout),
        "mode": w.ToggleButtons(options=[("simulate", "simulate"), ("measure on this device", "measure")],
                                value=s.mode, description="mode", style=style),
    }


def verdict_html(**values):
    """(settings or None, the verdict line as HTML) for these control values."""
    try:
        settings = lab_state._as_settings(None, **values)
        verdict = lab_state.lab_verdict(settings)
    except (ValueError, TypeError) as e:
        return None, f"<b class='lab-verdict' style='color:#b00'>Cannot run this setting:</b> {html.escape(str(e))}"
    color = "#070" if verdict.startswith("MEETS") else "#b00"
    return settings, f"<b class='lab-verdict' style='color:{color}'>{html.escape(verdict)}</b>"


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
        self.settings = None
        self.redraws = 0
        left = w.VBox([self.controls[k] for k in ("workload", "policy", "chunk_size", "rate_per_s",
                                                  "itl_slo_ms", "ttft_slo_ms")])
        right = w.VBox([self.controls[k] for k in ("num_decoders", "prompt_len", "model", "hardware", "mode")])
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
        self.update(**self.values())

    def _show_progress(self, rate) -> None:
        self.progress.value = f"<i>simulating {rate:.2f} req/s ...</i>"

    def update(self, **values) -> bool:
        """Verdict first, then the figure redrawn in place; False for a bad setting."""
        settings, message = verdict_html(**values)
        self.verdict.value = message
        if settings is None:
            return False
        if settings.under_load:
            # a new setting runs up to ~100 simulations for the capacity view: say so
            lab_state.capacity_rows(settings, on_point=self._show_progress)
        self.figure = lab_state.lab_figure(settings, progress=settings.mode == "measure", fig=self.figure)
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=RENDER_DPI)
        self.image.value = buffer.getvalue()
        self.progress.value = ""
        self.settings = settings
        self.redraws += 1
        return True


def render(**values):
    """(figure or None, verdict HTML) for these control values, without widgets."""
    settings, message = verdict_html(**values)
    if settings is None:
        return None, message
    return lab_state.lab_figure(settings, progress=settings.mode == "measure"), message


def lab(settings: lab_state.LabSettings | None = None, **overrides):
    """The TTFT/TPOT lab as an ipywidgets.Widget (controls, verdict, progress, figure)."""
    return LabView(settings, **overrides).widget
