"""Figures: pure functions of their inputs, each returning a matplotlib Figure.

Nothing here keeps state, runs a simulation or leaves a figure open in
pyplot: the data comes in (a trace, outputs, sweep rows), a Figure goes out.
A notebook cell that returns the Figure shows it once, a test counts its
artists, and the chapter-7 lab (book/lab.py) computes its rows and passes
them here. The lab's names that used to live here resolve through lab.py.
"""
from __future__ import annotations

from ..validation import check_choice, check_real

import matplotlib.pyplot as plt
import matplotlib.ticker

from ..metrics import percentile
from ..sim.simulator import resolve_hardware, resolve_model

PREFILL_COLOR = "#d62728"    # red: prompt tokens
DECODE_COLOR = "#1f77b4"     # blue: decode tokens
# Readable from the back of a room: a lecture deck shows a figure in a box of 1280x520
# pixels of a 1280x720 slide (tools/slides.py), and every text of a figure this module
# makes is at least MIN_TEXT_PX pixels tall there (a figure shown bigger reads bigger).
SLIDE_BOX_PX = (1280, 520)
MIN_TEXT_PX = 16.0


def _new_axes(ax=None, figsize=(7.0, 3.2)):
    """(figure, axes): a fresh closed figure, or the figure that owns ax."""
    if ax is not None:
        return ax.figure, ax
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    plt.close(fig)             # the caller displays it; pyplot keeps nothing
    return fig, ax


def min_font_points(fig) -> float:
    """The smallest font (points) that stays MIN_TEXT_PX tall when the figure is fitted
    into a slide's figure box."""
    width_in, height_in = fig.get_size_inches()
    px_per_inch = min(SLIDE_BOX_PX[0] / width_in, SLIDE_BOX_PX[1] / height_in)
    return MIN_TEXT_PX * 72.0 / px_per_inch


def _wrap(text, width_pt: float) -> None:
    """Let a title wrap at words when drawn (matplotlib's wrap: the text itself is not
    changed), and note how many lines it will take in about `width_pt` points."""
    import math
    text.set_wrap(True)
    chars = max(20, int(width_pt / (0.55 * text.get_fontsize())))
    text._minillm_lines = sum(max(1, math.ceil(len(line) / chars)) for line in text.get_text().split("\n"))


def readable(fig):
    """Raise every text of the figure (tick labels, axis labels, titles, legends,
    annotations) to min_font_points(fig), and wrap the titles to their width; returns the
    figure. Used on the figures this module creates, never on a caller's axes."""
    points = min_font_points(fig)
    grow = lambda text: text.set_fontsize(max(text.get_fontsize(), points))
    width_pt = fig.get_size_inches()[0] * 72
    for ax in fig.axes:
        ax.tick_params(which="both", labelsize=max(points, plt.rcParams["font.size"]))
        for text in (ax.xaxis.label, ax.yaxis.label, ax.title, *ax.texts):
            grow(text)
        _wrap(ax.title, ax.get_position().width * width_pt)
        legend = ax.get_legend()
        if legend is not None:
            for text in legend.get_texts():
                grow(text)
    for text in fig.texts:
        grow(text)
        _wrap(text, 0.96 * width_pt)
    if fig.get_layout_engine() is None:
        _make_room_for_titles(fig)
    return fig


def _lines_pt(text) -> float:
    """Height (points) of a text's lines, estimated without drawing (the lab redraws often)."""
    lines = getattr(text, "_minillm_lines", text.get_text().count("\n") + 1)
    return lines * 1.25 * text.get_fontsize() if text.get_text() else 0.0


def _make_room_for_titles(fig) -> None:
    """In a figure laid out by hand (the lab's), lower the top of its grid so that the
    suptitle and the top row's titles fit above it, however many lines they wrapped to."""
    height_pt = fig.get_size_inches()[1] * 72
    above = sum(_lines_pt(text) for text in fig.texts) + 8
    for gridspec in {ax.get_subplotspec().get_gridspec() for ax in fig.axes if ax.get_subplotspec()}:
        top_row = [ax for ax in fig.axes if ax.get_subplotspec() and ax.get_subplotspec().get_gridspec() is gridspec
                   and ax.get_subplotspec().rowspan.start == 0]
        titles = max((_lines_pt(ax.title) for ax in top_row), default=0.0)
        gridspec.update(top=min(gridspec.top or 0.9, 1 - (above + titles + 6) / height_pt))
        for ax in fig.axes:                   # update() moves only pyplot's figures' axes
            if ax.get_subplotspec() and ax.get_subplotspec().get_gridspec() is gridspec:
                ax.set_position(ax.get_subplotspec().get_position(fig))


# ---------------------------------------------------------------------------
# One run: the steps and the token gaps
# ---------------------------------------------------------------------------
def plot_step_timeline(trace, ax=None, title=None, x: str = "step"):
    """Per step, prefill tokens (red) stacked on decode tokens (blue).

    trace: the engine's (or simulator's) list of StepRecord.
    x="step": one bar per step index; x="time": each step spans its start to
    end time in milliseconds, so a long step is a wide bar.
    Drawn as two filled staircases (ax.stairs), one artist each: fast to
    redraw in the lab, whatever the number of steps.
    """
    check_choice("x", x, ("step", "time"))
    trace = list(trace)
    created = ax is None
    fig, ax = _new_axes(ax)
    decode, prefill, edges = [], [], []
    if x == "step":
        decode = [r.num_decode_tokens for r in trace]
        prefill = [r.num_prefill_tokens for r in trace]
        edges = [i - 0.5 for i in range(len(trace) + 1)]
        ax.set_xlabel("step")
    else:
        for r in trace:
            if edges and r.start * 1e3 > edges[-1]:        # idle gap: an empty segment
                decode.append(0)
                prefill.append(0)
                edges.append(r.start * 1e3)
            elif not edges:
                edges.append(r.start * 1e3)
            decode.append(r.num_decode_tokens)
            prefill.append(r.num_prefill_tokens)
            edges.append(max(r.end * 1e3, edges[-1]))
        ax.set_xlabel("time (ms)")
    if trace:
        top = [d + p for d, p in zip(decode, prefill)]
        ax.stairs(decode, edges, baseline=0, fill=True, color=DECODE_COLOR, label="decode tokens")
        ax.stairs(top, edges, baseline=decode, fill=True, color=PREFILL_COLOR, label="prefill tokens")
        ax.vlines(edges[1:-1], 0, [max(a, b) for a, b in zip(top, top[1:])], colors="white",
                  linewidth=0.6)             # step boundaries: one LineCollection
        ax.legend(loc="best", fontsize="small")
    ax.set_ylabel("tokens in the step")
    if title is None:
        biggest = max((r.num_prefill_tokens for r in trace), default=0)
        title = f"{len(trace)} steps; the largest holds {biggest} prefill tokens"
    ax.set_title(title)
    return readable(fig) if created else fig


def plot_token_gaps(outputs, tag=None, ax=None, title=None, legend: bool = True):
    """Each stream's inter-token gaps (ms) against the time the token came out (s).

    A stall shows as a spike: one gap far above the stream's usual TPOT.
    tag: plot only the outputs with this tag (e.g. "decoder"); None: all that
    have at least two tokens.
    """
    outputs = [o for o in outputs if (tag is None or o.tag == tag) and len(o.metrics.token_times) >= 2]
    created = ax is None
    fig, ax = _new_axes(ax)
    worst = 0.0
    # Streams whose gaps are the same (the usual case: every stream waits through the same
    # steps) would be drawn on one line, the last one hiding the others: such a group is
    # drawn as stripes, the first stream widest, each next one narrower on top of it.
    groups: dict = {}
    for o in outputs:
        key = (tuple(round(t, 9) for t in o.metrics.token_times), tuple(round(g, 9) for g in o.metrics.itl))
        groups.setdefault(key, []).append(o)
    for o in outputs:
        times = o.metrics.token_times
        gaps_ms = [g * 1e3 for g in o.metrics.itl]
        worst = max(worst, max(gaps_ms))
        same = next(g for g in groups.values() if o in g)
        layer = same.index(o)
        label = f"request {o.request_id}"
        if len(same) > 1:
            label = (f"requests {same[0].request_id}-{same[-1].request_id}: the same gaps" if layer == 0
                     else "_nolegend_")
        # steps-pre: each gap is drawn over the interval it lasted, so a stall
        # is a plateau, not a slope.
        ax.plot(times[1:], gaps_ms, marker="." if layer == len(same) - 1 else None, markersize=3,
                linewidth=1.2 + 1.3 * (len(same) - 1 - layer), drawstyle="steps-pre", label=label)
    ax.set_xlabel("time the token came out (s)")
    ax.set_ylabel("inter-token gap (ms)")
    if legend and 0 < len(outputs) <= 8:
        ax.legend(loc="best", fontsize="small")
    if title is None:
        title = (f"{len(outputs)} streams; the longest gap is {worst:.1f} ms" if outputs
                 else "no stream with two tokens to compare")
    ax.set_title(title)
    return readable(fig) if created else fig


# ---------------------------------------------------------------------------
# The lab: settings -> runs -> figures. Every view is a function of the settings.
# ---------------------------------------------------------------------------
def plot_chunk_sweep(rows, current=None, ax=None, itl_slo_ms=None, title=None):
    """TTFT of the long prompt and the decoders' mean TPOT, p99 and max ITL (ms)
    against chunk size (log axis); "off" (no chunking) as dotted lines; the
    current chunk size marked."""
    created = ax is None
    fig, ax = _new_axes(ax)
    chunked = sorted((r for r in rows if r["chunk_size"] != "off"), key=lambda r: r["chunk_size"])
    off = next((r for r in rows if r["chunk_size"] == "off"), None)
    series = (("long_ttft_s", "long prompt TTFT", "#d62728", "o"),
              ("tpot_mean_s", "decoders' mean TPOT", "#1f77b4", "s"),
              ("itl_p99_s", "decoders' p99 ITL", "#9467bd", "^"),
              ("itl_max_s", "decoders' max ITL", "#2ca02c", "v"))
    for key, label, color, marker in series:
        if chunked:
            ax.plot([r["chunk_size"] for r in chunked], [r[key] * 1e3 for r in chunked],
                    marker=marker, color=color, label=label, linewidth=1.2, markersize=4)
        if off is not None:
            ax.axhline(off[key] * 1e3, color=color, linestyle=":", linewidth=1)
    if itl_slo_ms is not None:
        ax.axhline(itl_slo_ms, color="black", linestyle="--", linewidth=1, label=f"ITL SLO {itl_slo_ms:g} ms")
    if current is not None and current != "off":
        ax.axvline(current, color="gray", linewidth=6, alpha=0.3, label=f"current: {current}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = [r["chunk_size"] for r in chunked]
    ax.set_xticks(ticks, [str(c) for c in ticks])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("chunk size (tokens); dotted: no chunking")
    ax.set_ylabel("ms")
    ax.legend(loc="best", fontsize="x-small")
    if title is None:
        title = "Chunk size trades the long prompt's TTFT for the streams' worst gap"
    ax.set_title(title, fontsize="medium")
    return readable(fig) if created else fig


def pick_chunk_size(rows, itl_slo_ms: float):
    """Among sweep rows whose worst decoder gap (itl_max_s) is <= itl_slo_ms, the
    chunk_size with the lowest long-prompt TTFT (ties: the smaller chunk); None if none."""
    check_real("itl_slo_ms", itl_slo_ms, 0, exclusive_minimum=True, hint="50 milliseconds")
    meeting = [r for r in rows if r["itl_max_s"] * 1e3 <= itl_slo_ms]
    if not meeting:
        return None
    order = lambda r: (r["long_ttft_s"], float("inf") if r["chunk_size"] == "off" else r["chunk_size"])
    return min(meeting, key=order)["chunk_size"]


# ---------------------------------------------------------------------------
# How far a roofline goes: the roofline, GPU operators, this machine's steps
# ---------------------------------------------------------------------------
def roofline_points(model="llama-3-8b", hardware="A100-80GB", dtype_bytes: int | None = None,
                    num_cached: int = 1024):
    """Example steps as (label, intensity FLOPs/byte, predicted FLOP/s): decodes of
    growing batches over num_cached tokens, and prefill chunks of growing size."""
    from ..sim.accounting import step_cost
    from ..sim.cost_model import predict_step
    from ..sim.accounting import dtype_bytes_on
    cfg, hw = resolve_model(model), resolve_hardware(hardware)
    dtype_bytes = dtype_bytes_on(hw, dtype_bytes)
    shapes = [(f"decode x{n}", [(1, num_cached)] * n) for n in (1, 8, 64)]
    shapes += [(f"chunk {c}", [(c, 0)]) for c in (16, 128, 512, 2048)]
    points = []
    for label, shape in shapes:
        cost = step_cost(cfg, shape, dtype_bytes)
        seconds = predict_step(cfg, shape, hw, dtype_bytes).total
        points.append((label, cost.intensity, cost.flops / seconds))
    return points


def plot_roofline(model="llama-3-8b", hardware="A100-80GB", dtype_bytes: int | None = None, ax=None,
                  title=None):
    """The hardware's roofline (datasheet and sustained) with example steps placed on it
    at their FLOPs/byte and the FLOP/s the cost model predicts for them."""
    import numpy as np
    cfg, hw = resolve_model(model), resolve_hardware(hardware)
    created = ax is None
    fig, ax = _new_axes(ax, figsize=(7.0, 4.2))
    intensity = np.logspace(-1, 4, 200)
    ax.plot(intensity, np.minimum(hw.peak_flops_s, hw.mem_bandwidth_bytes_s * intensity) / 1e12,
            color="black", label="datasheet roofline")
    sustained = np.minimum(hw.peak_flops_s * hw.gemm_efficiency,
                           hw.mem_bandwidth_bytes_s * hw.bandwidth_efficiency * intensity)
    ax.plot(intensity, sustained / 1e12, color="gray", linestyle="--", label="sustained (fitted factors)")
    ax.axvline(hw.ridge_point, color="black", linestyle=":", linewidth=1)
    points = roofline_points(cfg, hw, dtype_bytes)
    for label, x, y in points:
        color = DECODE_COLOR if label.startswith("decode") else PREFILL_COLOR
        ax.scatter([x], [y / 1e12], color=color, zorder=3, s=24)
        # decodes labelled above-left of their point, chunks below-right: the two kinds
        # alternate along the line, and the big chunks sit on the flat roof side by side
        above = label.startswith("decode")
        ax.annotate(label, (x, y / 1e12), textcoords="offset points", xytext=(-6, 8) if above else (6, -6),
                    ha="right" if above else "left", va="bottom" if above else "top", color=color)
    _log_log_axes(ax, "arithmetic intensity (FLOPs per byte)", "TFLOP/s (predicted for the step)",
                  legend_loc="lower right", legend_size="small")
    if title is None:
        title = (f"{cfg.name} on {hw.name}: decodes sit far left of the ridge ({hw.ridge_point:.0f} FLOPs/B),\n"
                 "chunks of a few hundred tokens reach it")
    ax.set_title(title, fontsize="small")
    if created:
        readable(fig)
    spread_labels(ax)
    return fig


def spread_labels(ax, pad_px: float = 2.0, rounds: int = 200) -> None:
    """Move the axes' annotations (those placed in offset points) apart until no two
    overlap, one pair at a time, the upper one of the pair just clear of the lower one:
    labels placed by hand collide once the fonts grow. Draws once; a move is a translation."""
    from matplotlib.text import Annotation
    fig = ax.figure
    texts = [t for t in ax.texts if isinstance(t, Annotation) and t.anncoords == "offset points"]
    if len(texts) < 2:
        return
    fig.draw_without_rendering()
    boxes = [t.get_window_extent() for t in texts]
    for _ in range(rounds):
        pair = next(((i, j) for i in range(len(texts)) for j in range(i + 1, len(texts))
                     if boxes[i].x0 < boxes[j].x1 + pad_px and boxes[j].x0 < boxes[i].x1 + pad_px
                     and boxes[i].y0 < boxes[j].y1 + pad_px and boxes[j].y0 < boxes[i].y1 + pad_px), None)
        if pair is None:
            return
        low, up = sorted(pair, key=lambda k: (boxes[k].y0, k))
        lift_px = max(boxes[low].y1 + pad_px - boxes[up].y0, 1.0)
        texts[up].xyann = (texts[up].xyann[0], texts[up].xyann[1] + lift_px * 72.0 / fig.dpi)
        boxes[up] = boxes[up].translated(0, lift_px)


def overlapping_texts(fig) -> list[tuple[str, str]]:
    """Pairs of visible texts in one axes whose boxes overlap (for tests and for checking a figure)."""
    fig.draw_without_rendering()
    pairs = []
    for ax in fig.axes:
        texts = [t for t in ax.texts if t.get_visible() and t.get_text().strip()]
        boxes = [t.get_window_extent() for t in texts]
        pairs += [(texts[i].get_text(), texts[j].get_text()) for i in range(len(texts))
                  for j in range(i + 1, len(texts)) if boxes[i].overlaps(boxes[j])]
    return pairs


LINE_STYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (3, 1)))


def plot_rooflines(profiles, points, title=None):
    """Several devices' rooflines, each as the fraction of its own peak FLOP/s it can reach
    against arithmetic intensity, and named steps (name -> FLOPs per byte) as vertical lines.

    Lines that coincide stay visible (the A100-40GB's ridge, 200, sits on the H200's, 206):
    each device has its own line style, the first drawn widest, and a dot on its ridge;
    the steps' labels are stacked so that none overlaps another."""
    import numpy as np
    profiles = list(profiles)
    if not profiles:
        raise ValueError("profiles=[]: give at least one Hardware (e.g. list(minillm.hardware.PROFILES.values()))")
    fig, ax = _new_axes(None, figsize=(8.0, 4.6))
    x = np.logspace(-0.5, 4, 400)
    widest = 1.2 + 0.9 * (len(profiles) - 1)
    for i, hw in enumerate(profiles):
        y = np.minimum(hw.peak_flops_s, hw.mem_bandwidth_bytes_s * x) / hw.peak_flops_s
        line, = ax.plot(x, y, linestyle=LINE_STYLES[i % len(LINE_STYLES)], linewidth=widest - 0.9 * i,
                        label=f"{hw.name.split(' (')[0]} (ridge {hw.ridge_point:.0f})", zorder=2 + i)
        ax.plot([hw.ridge_point], [1.0], marker="o", markersize=6, color=line.get_color(), zorder=10)
    for k, (name, value) in enumerate(sorted(points.items(), key=lambda item: item[1])):
        ax.axvline(value, color="black", linewidth=0.7, zorder=1)
        ax.annotate(name, (value, 1e-3), textcoords="offset points", xytext=(4, 6), ha="left", va="bottom",
                    fontsize="small", bbox=dict(facecolor="white", edgecolor="none", pad=1.0, alpha=0.85))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(1e-3, 2)
    ax.set_xlabel("arithmetic intensity (FLOP per byte)")
    ax.set_ylabel("attainable fraction of peak FLOP/s")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
    ax.set_title(title or "Where each device's ridge sits, and the steps", fontsize="medium")
    readable(fig)
    spread_labels(ax)
    return fig


def _log_log_axes(ax, xlabel: str, ylabel: str, x_base: int = 10, legend_loc: str = "upper left",
                  legend_size: str = "x-small") -> None:
    ax.set_xscale("log", base=x_base)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(loc=legend_loc, fontsize=legend_size)


def plot_op_fidelity(profile, ops=("qkv_proj", "mlp_down_proj"), hardware=None, ax=None, title=None):
    """Measured GPU operator times (points) vs the cost model (lines) against num_tokens,
    for one file of shared/data/gpu-op-profiles (a path or a GpuOpProfile)."""
    from ..sim.op_profiles import linear_op_errors, load_gpu_op_profile
    if not hasattr(profile, "times_s"):
        profile = load_gpu_op_profile(profile)
    errors = linear_op_errors(profile, hardware, ops)
    created = ax is None
    fig, ax = _new_axes(ax)
    worst = []
    for op, color in zip(ops, ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")):
        rows = sorted(errors[op])
        tokens = [r[0] for r in rows]
        ax.scatter(tokens, [r[1] * 1e6 for r in rows], s=6, color=color, label=f"{op} measured")
        ax.plot(tokens, [r[2] * 1e6 for r in rows], color=color, linewidth=1, label=f"{op} predicted")
        worst.append(percentile([abs(r[3]) for r in rows], 50))
    _log_log_axes(ax, "tokens in the step (GEMM rows)", "time per layer (us)", x_base=2)
    if title is None:
        title = (f"{profile.cfg.name} on {profile.hardware}: median |error| "
                 + ", ".join(f"{op} {w:.0%}" for op, w in zip(ops, worst)))
    ax.set_title(title, fontsize="small")
    return readable(fig) if created else fig


def plot_step_fidelity(rows, ax=None, title=None):
    """Measured vs predicted step times (ms) on this machine: fidelity.run_cpu_fidelity's rows
    (chunk, decodes, cached, measured_s, predicted_s); the diagonal is a perfect prediction."""
    rows = list(rows)
    if not rows:
        raise ValueError("rows=[]: nothing to plot; pass run_cpu_fidelity(...)['rows']")
    created = ax is None
    fig, ax = _new_axes(ax, figsize=(4.8, 4.2))
    measured = [r[3] * 1e3 for r in rows]
    predicted = [r[4] * 1e3 for r in rows]
    colors = [PREFILL_COLOR if r[0] else DECODE_COLOR for r in rows]
    ax.scatter(measured, predicted, c=colors, s=14)
    low, high = min(measured + predicted) * 0.8, max(measured + predicted) * 1.25
    ax.plot([low, high], [low, high], color="black", linewidth=1, label="predicted = measured")
    ax.fill_between([low, high], [low * 0.9, high * 0.9], [low * 1.1, high * 1.1], color="gray",
                    alpha=0.2, label="within 10%")
    _log_log_axes(ax, "measured step time (ms)", "predicted step time (ms)")
    if title is None:
        errors = [abs(p - m) / m for m, p in zip(measured, predicted)]
        title = f"{len(rows)} steps: median |error| {percentile(errors, 50):.0%}"
    ax.set_title(title, fontsize="small")
    return readable(fig) if created else fig




# ---------------------------------------------------------------------------
# The lab's figures (book/lab.py computes the data, these draw it)
# ---------------------------------------------------------------------------
def _pin_titles(fig):
    """Fix every axes title's height: matplotlib otherwise measures the tick labels
    to place it on each draw, most of a lab redraw's time."""
    for ax in fig.axes:
        ax.set_title(ax.get_title(), y=1.0, fontsize=ax.title.get_fontsize())


def _lab_canvas(fig, figsize, mosaic, **gridspec):
    """(figure, axes by name): `fig` cleared and re-laid (the lab redraws one figure
    in place), or a new closed figure. A fixed layout (no constrained layout):
    text layout is most of a redraw's time."""
    if fig is None:
        fig = plt.figure(figsize=figsize)
        plt.close(fig)
    else:
        fig.clear()
    return fig, fig.subplot_mosaic(mosaic, gridspec_kw=gridspec)


def plot_interference_lab(trace, outputs, rows, current_chunk, itl_slo_ms, probe, num_streams,
                          stream_tag, worst_gap_s, title, fig=None):
    """Step timeline and the streams' token gaps zoomed on the probe prompt's life
    (probe = (arrival, first token) in s), and the chunk sweep below."""
    fig, axes = _lab_canvas(fig, (10.5, 6.4), [["timeline", "gaps"], ["sweep", "sweep"]],
                            left=0.08, right=0.98, bottom=0.09, top=0.8, hspace=0.75, wspace=0.22)
    what = "no chunking" if current_chunk == "off" else f"chunk {current_chunk}"
    plot_step_timeline(trace, ax=axes["timeline"], x="time",
                       title=f"Steps ({what}): longest {max(r.duration for r in trace) * 1e3:.0f} ms")
    plot_token_gaps(outputs, tag=stream_tag, ax=axes["gaps"], legend=False,
                    title=f"{num_streams} streams' gaps: worst {worst_gap_s * 1e3:.1f} ms")
    t0, t1 = probe
    pad = max(t1 - t0, 1e-6)
    axes["timeline"].set_xlim((t0 - 0.25 * pad) * 1e3, (t1 + 0.5 * pad) * 1e3)
    axes["gaps"].set_xlim(t0 - 0.25 * pad, t1 + 0.5 * pad)
    plot_chunk_sweep(rows, current=current_chunk, ax=axes["sweep"], itl_slo_ms=itl_slo_ms)
    fig.suptitle(title, fontsize="medium")
    _pin_titles(fig)
    return readable(fig)


def plot_stall_pair(runs, stream_tag, probe_tag, title):
    """runs: [(label, trace, outputs, summary)] -> one row each: the step timeline
    and the streams' gaps, zoomed on the probe prompt."""
    fig, axes = plt.subplots(len(runs), 2, figsize=(11, 3 * len(runs)), layout="constrained", squeeze=False)
    plt.close(fig)
    for row, (what, trace, outputs, summary) in zip(axes, runs):
        plot_step_timeline(trace, ax=row[0], x="time",
                           title=f"{what}: longest step {max(r.duration for r in trace) * 1e3:.0f} ms")
        plot_token_gaps(outputs, tag=stream_tag, ax=row[1],
                        title=f"{what}: worst gap {summary['decoder_itl_max_s'] * 1e3:.0f} ms, "
                              f"long TTFT {summary['long_ttft_s'] * 1e3:.0f} ms")
        probe = next(o for o in outputs if o.tag == probe_tag)
        t0, t1 = probe.metrics.arrival_time, probe.metrics.first_token_time
        pad = max(t1 - t0, 1e-6)
        row[0].set_xlim((t0 - 0.25 * pad) * 1e3, (t1 + 0.5 * pad) * 1e3)
        row[1].set_xlim(t0 - 0.25 * pad, t1 + 0.5 * pad)
    fig.suptitle(title)
    return readable(fig)


_POLICY_STYLE = {"chunked": ("#1f77b4", "o", "-"), "chunked_prefill_first": ("#ff7f0e", "s", "-"),
                 "prefill_first": ("#d62728", None, "--"), "decode_first": ("#7f7f7f", None, ":")}


def plot_load_lab(rows, capacity_rows, current_chunk, current_policy, rate_per_s, itl_slo_ms, ttft_slo_ms,
                  title, fig=None, policy_labels=None):
    """Under load, two views against chunk size (log axis):

    left: median and P99 TTFT, mean TPOT and P99 ITL (ms) at rate_per_s (rows:
    lab.chunk_sweep, "off" as dotted lines), the SLOs dashed;
    right: capacity (req/s meeting both SLOs) per policy (capacity_rows:
    lab.capacity_rows; unchunked policies as horizontal lines).
    The current setting is marked on both."""
    policy_labels = policy_labels or {}
    fig, axes = _lab_canvas(fig, (12, 4.6), [["latency", "capacity"]],
                            left=0.08, right=0.98, bottom=0.13, top=0.74, wspace=0.2)
    ax = axes["latency"]
    chunked = sorted((r for r in rows if r["chunk_size"] != "off"), key=lambda r: r["chunk_size"])
    off = next((r for r in rows if r["chunk_size"] == "off"), None)
    xs = [r["chunk_size"] for r in chunked]
    for key, label, color, marker in (("ttft_p50_s", "median TTFT", "#d62728", "o"),
                                      ("ttft_p99_s", "P99 TTFT", "#ff9896", "o"),
                                      ("tpot_mean_s", "mean TPOT", "#1f77b4", "s"),
                                      ("itl_p99_s", "P99 ITL", "#9467bd", "^")):
        ax.plot(xs, [r[key] * 1e3 for r in chunked], marker=marker, color=color, label=label,
                linewidth=1.2, markersize=4)
        if off is not None:
            ax.axhline(off[key] * 1e3, color=color, linestyle=":", linewidth=1)
    ax.axhline(itl_slo_ms, color="#9467bd", linestyle="--", linewidth=1, label=f"ITL SLO {itl_slo_ms:g} ms")
    ax.axhline(ttft_slo_ms, color="#d62728", linestyle="--", linewidth=1, label=f"TTFT SLO {ttft_slo_ms:g} ms")
    _chunk_axis(ax, xs)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_ylabel("ms")
    ax.legend(loc="best", fontsize="x-small", ncol=2)
    name = policy_labels.get(current_policy, current_policy)
    if len(chunked) >= 2:
        first, last = chunked[0], chunked[-1]
        ax.set_title(f"At {rate_per_s:g} req/s ({name}):\nchunk {first['chunk_size']}->{last['chunk_size']} moves "
                     f"mean TPOT {first['tpot_mean_s'] * 1e3:.0f}->{last['tpot_mean_s'] * 1e3:.0f} ms, "
                     f"median TTFT {first['ttft_p50_s'] * 1e3:.0f}->{last['ttft_p50_s'] * 1e3:.0f} ms",
                     fontsize="small")
    ax = axes["capacity"]
    best = max((r["capacity_req_s"] for r in capacity_rows), default=0.0)
    for policy, (color, marker, style) in _POLICY_STYLE.items():
        mine = [r for r in capacity_rows if r["policy"] == policy]
        if not mine:
            continue
        label = policy_labels.get(policy, policy)
        if mine[0]["chunk_size"] is None:
            ax.axhline(mine[0]["capacity_req_s"], color=color, linestyle=style, linewidth=1.5, label=label)
        else:
            mine.sort(key=lambda r: r["chunk_size"])
            ax.plot([r["chunk_size"] for r in mine], [r["capacity_req_s"] for r in mine], color=color,
                    marker=marker, linestyle=style, label=label, linewidth=1.4, markersize=5)
    _chunk_axis(ax, sorted({r["chunk_size"] for r in capacity_rows if r["chunk_size"] is not None}))
    ax.set_ylim(0, max(best * 1.15, 0.5))
    ax.set_ylabel("capacity (req/s meeting both SLOs)")
    ax.legend(loc="best", fontsize="x-small")
    top = max(capacity_rows, key=lambda r: r["capacity_req_s"]) if capacity_rows else None
    if top is not None:
        where = "" if top["chunk_size"] is None else f" at chunk {top['chunk_size']}"
        ax.set_title(f"Most capacity: {policy_labels.get(top['policy'], top['policy'])}{where}, "
                     f"{top['capacity_req_s']:.2f} req/s", fontsize="small")
    _pin_titles(fig)
    mark_load_lab_setting(fig, capacity_rows, current_chunk, current_policy, title)
    return readable(fig)


CURRENT_SETTING = "lab-current-setting"     # gid of the artists that move with the setting


def mark_load_lab_setting(fig, capacity_rows, current_chunk, current_policy, title) -> list:
    """Mark the current chunk size and policy on plot_load_lab's figure and set its
    title (the verdict); the previous marks go. Returns the artists that changed,
    so the lab can redraw only them over the rest of the figure (widgets.LabView)."""
    latency, capacity_ax = fig.axes[:2]
    for ax in (latency, capacity_ax):
        for artist in [*ax.lines, *ax.collections]:
            if artist.get_gid() == CURRENT_SETTING:
                artist.remove()
    marks = []
    if current_chunk != "off" and current_policy in ("chunked", "chunked_prefill_first"):
        marks.append(latency.axvline(current_chunk, color="gray", linewidth=6, alpha=0.3))
    here = next((r for r in capacity_rows if r["policy"] == current_policy
                 and r["chunk_size"] in (None, current_chunk)), None)
    if here is not None and here["chunk_size"] is not None:
        marks.append(capacity_ax.scatter([current_chunk], [here["capacity_req_s"]], s=160, facecolors="none",
                                         edgecolors="black", linewidths=2, zorder=4))
    elif here is not None:
        marks.append(capacity_ax.axhline(here["capacity_req_s"], color="black", linewidth=3, alpha=0.25))
    suptitle = fig.suptitle(title, fontsize=max(min_font_points(fig), 8.0))
    _wrap(suptitle, 0.96 * fig.get_size_inches()[0] * 72)
    marks.append(suptitle)
    for artist in marks:
        artist.set_gid(CURRENT_SETTING)
    return marks


def current_setting_artists(fig) -> list:
    """What mark_load_lab_setting drew last: the marks and the title."""
    artists = [*fig.texts] + [a for ax in fig.axes[:2] for a in [*ax.lines, *ax.collections]]
    return [a for a in artists if a.get_gid() == CURRENT_SETTING]


def _chunk_axis(ax, chunk_sizes):
    ax.set_xscale("log", base=2)
    ticks = list(chunk_sizes)
    if ticks:
        ax.set_xticks(ticks, [str(c) for c in ticks])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("chunk size (tokens)")
