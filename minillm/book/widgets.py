"""The chapter-7 lab: ipywidgets controls wired to the pure functions of plots.py.

Nothing is computed here. Each control sets one field of plots.LabSettings;
`interactive_output` calls `_render(**values)`, which draws plots.lab_figure
and plots.lab_verdict for those settings. A bad setting becomes a readable
line in the lab, not a traceback (and ipywidgets would swallow the traceback
anyway: the tests call the plot functions directly).
"""
from __future__ import annotations

import html

from . import figures as plots
from ..sim.hardware import PROFILES

__all__ = ["lab", "lab_controls"]

CHUNK_OPTIONS = [(str(c), c) for c in plots.CHUNK_SIZES] + [("off (prefill_first)", plots.OFF)]
MODEL_OPTIONS = ("llama-3-8b", "llama-2-7b", "mistral-7b", "qwen3-0.6b")


def lab_controls(settings: plots.LabSettings | None = None) -> dict:
    """The widgets, one per LabSettings field, set to `settings` (defaults if None)."""
    import ipywidgets as w

    s = settings if settings is not None else plots.LabSettings()
    style = {"description_width": "150px"}
    layout = w.Layout(width="480px")
    return {
        "chunk_size": w.SelectionSlider(options=CHUNK_OPTIONS, value=s.chunk_size,
                                        description="chunk size (tokens)", style=style, layout=layout,
                                        continuous_update=False),
        "num_decoders": w.IntSlider(value=s.num_decoders, min=1, max=64, description="decoding streams",
                                    style=style, layout=layout, continuous_update=False),
        "prompt_len": w.IntSlider(value=s.prompt_len, min=128, max=4000, step=64,
                                  description="long prompt (tokens)", style=style, layout=layout,
                                  continuous_update=False),
        "model": w.Dropdown(options=MODEL_OPTIONS, value=s.model, description="model (simulate)",
                            style=style, layout=layout),
        "hardware": w.Dropdown(options=sorted(PROFILES), value=s.hardware, description="hardware (simulate)",
                               style=style, layout=layout),
        "mode": w.ToggleButtons(options=[("simulate", "simulate"), ("measure on this device", "measure")],
                                value=s.mode, description="mode", style=style),
        "itl_slo_ms": w.FloatLogSlider(value=s.itl_slo_ms, base=10, min=0, max=3, step=0.05,
                                       description="ITL SLO (ms)", style=style, layout=layout,
                                       continuous_update=False),
    }


def verdict_html(**values):
    """(settings or None, the verdict line as HTML) for these control values.

    Cheap once the setting's simulation is cached: the lab shows this line
    first, so a slider move is answered before the figure is redrawn.
    """
    try:
        settings = plots.LabSettings(**values).check()
        verdict = plots.lab_verdict(settings)
    except (ValueError, TypeError) as e:
        return None, f"<b style='color:#b00'>Cannot run this setting:</b> {html.escape(str(e))}"
    color = "#070" if verdict.startswith("MEETS") else "#b00"
    return settings, f"<b style='color:{color}'>{html.escape(verdict)}</b>"


def render(**values):
    """Draw the lab for these control values: (figure or None, verdict HTML).

    Pure apart from the caches of plots.lab_run; a bad setting gives
    (None, the error message as HTML) instead of raising.
    """
    settings, message = verdict_html(**values)
    if settings is None:
        return None, message
    return plots.lab_figure(settings, progress=settings.mode == "measure"), message


def lab(settings: plots.LabSettings | None = None, **overrides):
    """The TTFT/TPOT lab as an ipywidgets.Widget (a VBox of controls, verdict, figure)."""
    import ipywidgets as w
    from IPython.display import display

    problem = None
    try:
        settings = plots._as_settings(settings, **overrides)
    except (ValueError, TypeError) as e:       # start from the defaults and say why
        problem = f"<b style='color:#b00'>Cannot start with this setting:</b> {html.escape(str(e))}; " \
                  "showing the defaults instead"
        settings = plots.LabSettings()
    controls = lab_controls(settings)
    verdict = w.HTML()

    def show(**values):
        nonlocal problem
        settings, message = verdict_html(**values)     # the answer first ...
        verdict.value = message if problem is None else problem + "<br>" + message
        problem = None
        if settings is not None:                         # ... then the picture
            display(plots.lab_figure(settings, progress=settings.mode == "measure"))

    out = w.interactive_output(show, controls)
    left = w.VBox([controls[k] for k in ("chunk_size", "num_decoders", "prompt_len", "itl_slo_ms")])
    right = w.VBox([controls[k] for k in ("model", "hardware", "mode")])
    return w.VBox([w.HBox([left, right]), verdict, out])
