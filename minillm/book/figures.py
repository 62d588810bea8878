"""Figures: pure functions of their inputs, each returning a matplotlib Figure.

Nothing here keeps state or leaves a figure open in pyplot: a notebook cell
that returns the Figure shows it once, a test counts its artists, and the
chapter-7 widget only wires sliders to these functions.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from numbers import Integral, Real

import matplotlib.pyplot as plt
import matplotlib.ticker

from ..scheduler import SchedulerConfig
from ..sim.simulator import resolve_hardware, resolve_model
from ..sim.workloads import Workload, long_prompt_interference

PREFILL_COLOR = "#d62728"    # red: prompt tokens
DECODE_COLOR = "#1f77b4"     # blue: decode tokens


def _new_axes(ax=None, figsize=(7.0, 3.2)):
    """(figure, axes): a fresh closed figure, or the figure that owns ax."""
    if ax is not None:
        return ax.figure, ax
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    plt.close(fig)             # the caller displays it; pyplot keeps nothing
    return fig, ax


def _check_choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: choose one of {tuple(allowed)}")


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
    _check_choice("x", x, ("step", "time"))
    trace = list(trace)
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
        ax.legend(loc="upper right", fontsize="small")
    ax.set_ylabel("tokens in the step")
    if title is None:
        biggest = max((r.num_prefill_tokens for r in trace), default=0)
        title = f"{len(trace)} steps; the largest holds {biggest} prefill tokens"
    ax.set_title(title)
    return fig


def plot_token_gaps(outputs, tag=None, ax=None, title=None, legend: bool = True):
    """Each stream's inter-token gaps (ms) against the time the token came out (s).

    A stall shows as a spike: one gap far above the stream's usual TPOT.
    tag: plot only the outputs with this tag (e.g. "decoder"); None: all that
    have at least two tokens.
    """
    outputs = [o for o in outputs if (tag is None or o.tag == tag) and len(o.metrics.token_times) >= 2]
    fig, ax = _new_axes(ax)
    worst = 0.0
    for o in outputs:
        times = o.metrics.token_times
        gaps_ms = [g * 1e3 for g in o.metrics.itl]
        worst = max(worst, max(gaps_ms))
        # steps-pre: each gap is drawn over the interval it lasted, so a stall
        # is a plateau, not a slope.
        ax.plot(times[1:], gaps_ms, marker=".", markersize=3, linewidth=1, drawstyle="steps-pre",
                label=f"request {o.request_id}")
    ax.set_xlabel("time the token came out (s)")
    ax.set_ylabel("gap since previous token (ms)")
    if legend and 0 < len(outputs) <= 8:
        ax.legend(loc="upper right", fontsize="small")
    if title is None:
        title = (f"{len(outputs)} streams; the longest gap is {worst:.1f} ms" if outputs
                 else "no stream with two tokens to compare")
    ax.set_title(title)
    return fig


# ---------------------------------------------------------------------------
# The lab: settings -> runs -> figures. Every view is a function of the settings.
# ---------------------------------------------------------------------------
CHUNK_SIZES = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
OFF = "off"                  # no chunking: the prefill_first policy
MODES = ("simulate", "measure")


@dataclass(frozen=True)
class LabSettings:
    """What the lab's controls set. chunk_size: tokens, or "off" (prefill_first)."""
    chunk_size: int | str = 512
    num_decoders: int = 4
    prompt_len: int = 2048
    model: str = "llama-3-8b"
    hardware: str = "A100-80GB"
    mode: str = "simulate"           # or "measure": the real tiny engine on this device
    itl_slo_ms: float = 50.0         # every decoder gap must stay under this

    def check(self) -> "LabSettings":
        """Raise ValueError naming the first bad setting; return self."""
        c = self.chunk_size
        if c != OFF and (isinstance(c, bool) or not isinstance(c, Integral) or c < 1):
            raise ValueError(f"chunk_size={c!r}: must be a positive number of tokens "
                             f"(e.g. 512) or {OFF!r} for no chunking")
        if isinstance(self.num_decoders, bool) or not isinstance(self.num_decoders, Integral) \
                or self.num_decoders < 1:
            raise ValueError(f"num_decoders={self.num_decoders!r}: must be an integer >= 1")
        if isinstance(self.prompt_len, bool) or not isinstance(self.prompt_len, Integral) \
                or self.prompt_len < 1:
            raise ValueError(f"prompt_len={self.prompt_len!r}: must be a positive number of tokens")
        _check_choice("mode", self.mode, MODES)
        if not (isinstance(self.itl_slo_ms, Real) and self.itl_slo_ms > 0):
            raise ValueError(f"itl_slo_ms={self.itl_slo_ms!r}: must be a positive number of milliseconds")
        if self.mode == "simulate":
            cfg = resolve_model(self.model)
            resolve_hardware(self.hardware)
            if self.prompt_len >= cfg.max_position:
                raise ValueError(f"prompt_len={self.prompt_len}: {cfg.name} accepts at most "
                                 f"{cfg.max_position - 1} prompt tokens")
        elif self.prompt_len >= 4096:
            raise ValueError(f"prompt_len={self.prompt_len}: the built-in model accepts at most 4095")
        return self

    def sched(self) -> SchedulerConfig:
        if self.chunk_size == OFF:
            return SchedulerConfig(policy="prefill_first")
        return SchedulerConfig(policy="chunked", chunk_size=int(self.chunk_size))

    def workload(self) -> Workload:
        return long_prompt_interference(prompt_len=self.prompt_len, num_decoders=self.num_decoders)


@dataclass
class LabRun:
    """One run of the interference scenario: what the views need."""
    settings: LabSettings
    outputs: list
    trace: list
    summary: dict
    device: str                      # what produced it: "A100-80GB (simulated)", "cpu (measured)"


def _as_settings(settings=None, **overrides) -> LabSettings:
    if settings is None:
        settings = LabSettings()
    if isinstance(settings, dict):
        settings = LabSettings(**settings)
    if not isinstance(settings, LabSettings):
        raise ValueError(f"settings={settings!r}: give a LabSettings or a dict of its fields")
    if overrides:
        settings = replace(settings, **overrides)
    return settings.check()


def _summary_row(summary: dict) -> dict:
    return {"long_ttft_s": summary["long_ttft_s"], "tpot_mean_s": summary["decoder_tpot_mean_s"],
            "itl_p99_s": summary["decoder_itl_p99_s"], "itl_max_s": summary["decoder_itl_max_s"],
            "throughput_tok_s": summary["throughput_tok_s"], "duration_s": summary["duration_s"],
            "num_steps": summary["num_steps"]}


@lru_cache(maxsize=256)
def _simulated_run(settings: LabSettings) -> LabRun:
    from ..sim.simulator import simulate
    res = simulate(settings.workload(), settings.sched(), model=settings.model, hardware=settings.hardware)
    name = settings.hardware if isinstance(settings.hardware, str) else settings.hardware.name
    return LabRun(settings, res.outputs, res.trace, res.summary(), f"{name} (simulated)")


_MEASURED: dict[LabSettings, LabRun] = {}


@lru_cache(maxsize=2)
def _tiny_model(device: str):
    import torch

    from ..loader import build_model
    return build_model("tiny", seed=0, dtype=torch.float32, device=device)


def _measured_run(settings: LabSettings, progress: bool = False) -> LabRun:
    """The real engine with the built-in tiny model on this device (memoized per settings)."""
    key = replace(settings, model="tiny", hardware="this device", itl_slo_ms=1.0)
    if key not in _MEASURED:
        from ..device import default_device
        from ..engine import LLMEngine
        from ..sim.simulator import SimResult
        device = default_device()
        model = _tiny_model(str(device))
        sched = settings.sched()
        workload = settings.workload()
        num_blocks = sum(-(-(r.prompt_len + r.max_tokens) // 16) for r in workload.requests)
        engine = LLMEngine(model, sched, block_size=16, num_blocks=num_blocks)
        outputs = engine.run_workload(workload, progress=progress)
        summary = SimResult(outputs, engine.trace, model.cfg, None, sched).summary()
        _MEASURED[key] = LabRun(key, outputs, engine.trace, summary, f"{device.type} (measured, tiny model)")
    return _MEASURED[key]


def lab_run(settings=None, progress: bool = False, **overrides) -> LabRun:
    """Run the settings' scenario: simulated (cached) or measured on this device."""
    settings = _as_settings(settings, **overrides)
    if settings.mode == "simulate":
        return _simulated_run(replace(settings, itl_slo_ms=1.0))  # the SLO does not change the run
    return _measured_run(settings, progress=progress)


def chunk_sweep(settings=None, chunk_sizes=CHUNK_SIZES, **overrides) -> list[dict]:
    """One row per chunk size (and "off"): long TTFT, decoders' TPOT, p99 and max ITL.

    Simulate mode runs every chunk size (each run cached). Measure mode only
    reports the chunk sizes already measured for this scenario: measuring is
    slow, so the curve fills in as the learner moves the slider.
    """
    settings = _as_settings(settings, **overrides)
    rows = []
    for chunk in (*chunk_sizes, OFF):
        point = replace(settings, chunk_size=chunk)
        if settings.mode == "measure":
            key = replace(point, model="tiny", hardware="this device", itl_slo_ms=1.0)
            if key not in _MEASURED:
                continue
            run = _MEASURED[key]
        else:
            run = lab_run(point)
        rows.append({"chunk_size": chunk, **_summary_row(run.summary)})
    return rows


def plot_chunk_sweep(rows, current=None, ax=None, itl_slo_ms=None, title=None):
    """TTFT of the long prompt and the decoders' mean TPOT, p99 and max ITL (ms)
    against chunk size (log axis); "off" (no chunking) as dotted lines; the
    current chunk size marked."""
    fig, ax = _new_axes(ax)
    chunked = sorted((r for r in rows if r["chunk_size"] != OFF), key=lambda r: r["chunk_size"])
    off = next((r for r in rows if r["chunk_size"] == OFF), None)
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
    if current is not None and current != OFF:
        ax.axvline(current, color="gray", linewidth=6, alpha=0.3, label=f"current: {current}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = [c for c in CHUNK_SIZES if chunked and chunked[0]["chunk_size"] <= c <= chunked[-1]["chunk_size"]]
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
    return fig


def lab_verdict(settings=None, **overrides) -> str:
    """One line: does this setting meet the ITL SLO, and at what TTFT?"""
    settings = _as_settings(settings, **overrides)
    s = lab_run(settings).summary
    worst_ms, ttft_ms = s["decoder_itl_max_s"] * 1e3, s["long_ttft_s"] * 1e3
    tpot_ms = s["decoder_tpot_mean_s"] * 1e3
    what = "no chunking" if settings.chunk_size == OFF else f"chunk {settings.chunk_size}"
    ok = worst_ms <= settings.itl_slo_ms
    return (f"{'MEETS' if ok else 'MISSES'} the {settings.itl_slo_ms:g} ms ITL SLO with {what}: "
            f"worst decoder gap {worst_ms:.1f} ms (mean TPOT {tpot_ms:.1f} ms), "
            f"long prompt TTFT {ttft_ms:.0f} ms")


def pick_chunk_size(rows, itl_slo_ms: float):
    """Among sweep rows whose worst decoder gap (itl_max_s) is <= itl_slo_ms, the
    chunk_size with the lowest long-prompt TTFT (ties: the smaller chunk); None if none."""
    if not (isinstance(itl_slo_ms, Real) and itl_slo_ms > 0):
        raise ValueError(f"itl_slo_ms={itl_slo_ms!r}: must be a positive number of milliseconds")
    meeting = [r for r in rows if r["itl_max_s"] * 1e3 <= itl_slo_ms]
    if not meeting:
        return None
    order = lambda r: (r["long_ttft_s"], float("inf") if r["chunk_size"] == OFF else r["chunk_size"])
    return min(meeting, key=order)["chunk_size"]


def best_chunk_size(settings=None, chunk_sizes=CHUNK_SIZES, **overrides):
    """The chunk size (or "off") with the lowest long-prompt TTFT among those
    whose worst decoder gap meets settings.itl_slo_ms; None if none does."""
    settings = _as_settings(settings, **overrides)
    return pick_chunk_size(chunk_sweep(settings, chunk_sizes), settings.itl_slo_ms)


def lab_figure(settings=None, progress: bool = False, **overrides):
    """The lab's four views of one setting: step timeline, token gaps, the sweep, and
    the verdict as the figure's title."""
    settings = _as_settings(settings, **overrides)
    run = lab_run(settings, progress=progress)
    # a fixed layout (no constrained layout, no mathtext ticks): the lab redraws
    # this on every slider move, and text layout is most of the drawing time
    fig = plt.figure(figsize=(12, 7))
    plt.close(fig)
    axes = fig.subplot_mosaic([["timeline", "gaps"], ["sweep", "sweep"]],
                              gridspec_kw=dict(left=0.06, right=0.98, bottom=0.08, top=0.9,
                                               hspace=0.4, wspace=0.18))
    what = "no chunking" if settings.chunk_size == OFF else f"chunk {settings.chunk_size}"
    plot_step_timeline(run.trace, ax=axes["timeline"], x="time",
                       title=f"Steps over time ({what}): the longest takes "
                             f"{max(r.duration for r in run.trace) * 1e3:.0f} ms")
    plot_token_gaps(run.outputs, tag="decoder", ax=axes["gaps"], legend=False,
                    title=f"{settings.num_decoders} streams' token gaps around the long prompt: worst "
                          f"{run.summary['decoder_itl_max_s'] * 1e3:.1f} ms")
    # zoom both top views on the long prompt's life: arrival to a little past its first token
    long = next(o for o in run.outputs if o.tag == "long")
    t0, t1 = long.metrics.arrival_time, long.metrics.first_token_time
    pad = max(t1 - t0, 1e-6)
    axes["timeline"].set_xlim((t0 - 0.25 * pad) * 1e3, (t1 + 0.5 * pad) * 1e3)
    axes["gaps"].set_xlim(t0 - 0.25 * pad, t1 + 0.5 * pad)
    plot_chunk_sweep(chunk_sweep(settings), current=settings.chunk_size, ax=axes["sweep"],
                     itl_slo_ms=settings.itl_slo_ms)
    model = "tiny" if settings.mode == "measure" else (
        settings.model if isinstance(settings.model, str) else settings.model.name)
    fig.suptitle(f"{model} on {run.device}: {lab_verdict(settings)}", fontsize="medium")
    return fig


# ---------------------------------------------------------------------------
# How far a roofline goes: the roofline, GPU operators, this machine's steps
# ---------------------------------------------------------------------------
def roofline_points(model="llama-3-8b", hardware="A100-80GB", dtype_bytes: int = 2,
                    num_cached: int = 1024):
    """Example steps as (label, intensity FLOPs/byte, predicted FLOP/s): decodes of
    growing batches over num_cached tokens, and prefill chunks of growing size."""
    from ..sim.accounting import step_cost
    from ..sim.cost_model import predict_step
    cfg, hw = resolve_model(model), resolve_hardware(hardware)
    shapes = [(f"decode x{n}", [(1, num_cached)] * n) for n in (1, 8, 64)]
    shapes += [(f"chunk {c}", [(c, 0)]) for c in (16, 128, 512, 2048)]
    points = []
    for label, shape in shapes:
        cost = step_cost(cfg, shape, dtype_bytes)
        seconds = predict_step(cfg, shape, hw, dtype_bytes).total
        points.append((label, cost.intensity, cost.flops / seconds))
    return points


def plot_roofline(model="llama-3-8b", hardware="A100-80GB", dtype_bytes: int = 2, ax=None, title=None):
    """The hardware's roofline (datasheet and sustained) with example steps placed on it
    at their FLOPs/byte and the FLOP/s the cost model predicts for them."""
    import numpy as np
    cfg, hw = resolve_model(model), resolve_hardware(hardware)
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
        ax.scatter([x], [y / 1e12], color=color, zorder=3, s=18)
        ax.annotate(label, (x, y / 1e12), textcoords="offset points", xytext=(4, -10), fontsize="x-small")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte)")
    ax.set_ylabel("TFLOP/s (predicted for the step)")
    ax.legend(loc="lower right", fontsize="small")
    if title is None:
        title = (f"{cfg.name} on {hw.name}: decodes sit far left of the ridge ({hw.ridge_point:.0f} FLOPs/B),\n"
                 "chunks of a few hundred tokens reach it")
    ax.set_title(title, fontsize="small")
    return fig


def plot_op_fidelity(profile, ops=("qkv_proj", "mlp_down_proj"), hardware=None, ax=None, title=None):
    """Measured GPU operator times (points) vs the cost model (lines) against num_tokens,
    for one file of shared/data/gpu-op-profiles (a path or a GpuOpProfile)."""
    from ..sim.op_profiles import linear_op_errors, load_gpu_op_profile
    if not hasattr(profile, "times_s"):
        profile = load_gpu_op_profile(profile)
    errors = linear_op_errors(profile, hardware, ops)
    fig, ax = _new_axes(ax)
    worst = []
    for op, color in zip(ops, ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")):
        rows = sorted(errors[op])
        tokens = [r[0] for r in rows]
        ax.scatter(tokens, [r[1] * 1e6 for r in rows], s=6, color=color, label=f"{op} measured")
        ax.plot(tokens, [r[2] * 1e6 for r in rows], color=color, linewidth=1, label=f"{op} predicted")
        worst.append(sorted(abs(r[3]) for r in rows)[len(rows) // 2])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens in the step (GEMM rows)")
    ax.set_ylabel("time per layer (us)")
    ax.legend(loc="upper left", fontsize="x-small")
    if title is None:
        title = (f"{profile.cfg.name} on {profile.hardware}: median |error| "
                 + ", ".join(f"{op} {w:.0%}" for op, w in zip(ops, worst)))
    ax.set_title(title, fontsize="small")
    return fig


def plot_step_fidelity(rows, ax=None, title=None):
    """Measured vs predicted step times (ms) on this machine: fidelity.run_cpu_fidelity's rows
    (chunk, decodes, cached, measured_s, predicted_s); the diagonal is a perfect prediction."""
    rows = list(rows)
    if not rows:
        raise ValueError("rows=[]: nothing to plot; pass run_cpu_fidelity(...)['rows']")
    fig, ax = _new_axes(ax, figsize=(4.8, 4.2))
    measured = [r[3] * 1e3 for r in rows]
    predicted = [r[4] * 1e3 for r in rows]
    colors = [PREFILL_COLOR if r[0] else DECODE_COLOR for r in rows]
    ax.scatter(measured, predicted, c=colors, s=14)
    low, high = min(measured + predicted) * 0.8, max(measured + predicted) * 1.25
    ax.plot([low, high], [low, high], color="black", linewidth=1, label="predicted = measured")
    ax.fill_between([low, high], [low * 0.9, high * 0.9], [low * 1.1, high * 1.1], color="gray",
                    alpha=0.2, label="within 10%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    ax.legend(loc="upper left", fontsize="x-small")
    if title is None:
        errors = sorted(abs(p - m) / m for m, p in zip(measured, predicted))
        title = f"{len(rows)} steps: median |error| {errors[len(errors) // 2]:.0%}"
    ax.set_title(title, fontsize="small")
    return fig


def plot_stall(settings=None, chunk_size=512, **overrides):
    """Two rows: the step timeline and the streams' gaps without chunking (top)
    and with chunk_size (bottom), zoomed on the long prompt."""
    settings = _as_settings(settings, **overrides)
    fig, axes = plt.subplots(2, 2, figsize=(11, 6), layout="constrained")
    plt.close(fig)
    for row, chunk in zip(axes, (OFF, chunk_size)):
        run = lab_run(replace(settings, chunk_size=chunk))
        what = "no chunking" if chunk == OFF else f"chunk {chunk}"
        plot_step_timeline(run.trace, ax=row[0], x="time",
                           title=f"{what}: longest step {max(r.duration for r in run.trace) * 1e3:.0f} ms")
        plot_token_gaps(run.outputs, tag="decoder", ax=row[1],
                        title=f"{what}: worst gap {run.summary['decoder_itl_max_s'] * 1e3:.0f} ms, "
                              f"long TTFT {run.summary['long_ttft_s'] * 1e3:.0f} ms")
        long = next(o for o in run.outputs if o.tag == "long")
        t0, t1 = long.metrics.arrival_time, long.metrics.first_token_time
        pad = max(t1 - t0, 1e-6)
        row[0].set_xlim((t0 - 0.25 * pad) * 1e3, (t1 + 0.5 * pad) * 1e3)
        row[1].set_xlim(t0 - 0.25 * pad, t1 + 0.5 * pad)
    name = settings.model if isinstance(settings.model, str) else settings.model.name
    fig.suptitle(f"{name} on {settings.hardware}: a {settings.prompt_len}-token prompt stalls "
                 f"{settings.num_decoders} streams; chunks of {chunk_size} cap the stall")
    return fig


def save_readme_figures(out_dir="figures", dpi: int = 110) -> list:
    """Write stall_timeline.png, ttft_tpot_vs_chunk.png and roofline.png (Llama-3-8B
    on an A100-80GB, simulated: fast and deterministic); return the paths."""
    from pathlib import Path
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    settings = LabSettings(model="llama-3-8b", hardware="A100-80GB", chunk_size=512)
    figures = {
        "stall_timeline.png": plot_stall(settings, chunk_size=512),
        "ttft_tpot_vs_chunk.png": plot_chunk_sweep(chunk_sweep(settings), current=512,
                                                   itl_slo_ms=settings.itl_slo_ms),
        "roofline.png": plot_roofline("llama-3-8b", "A100-80GB"),
    }
    paths = []
    for name, fig in figures.items():
        path = out / name
        fig.savefig(path, dpi=dpi, metadata={"Software": None})
        paths.append(path)
    return paths
