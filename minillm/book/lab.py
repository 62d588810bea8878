"""The chapter-7 lab's state, in one place: its settings, its runs and their caches.

Two kinds of experiment share one set of controls:

* "interference": the book's scenario, a few streams decoding when one long
  prompt arrives (simulated, or measured on this device with the built-in tiny
  model or the real SmolLM2-135M-Instruct: LabSettings.measure_model);
* steady traffic ("fixed", "uniform", "chat", "long_prompt": workloads.LENGTH_MIXES):
  requests arriving at rate_per_s, where the TTFT/TPOT trade-off of the chunk
  size shows, and capacity.capacity finds the highest rate meeting the SLOs,
  per policy and chunk size.

Everything the lab shows is a function of a LabSettings: `lab_verdict`,
`chunk_sweep`, `capacity_rows`, `lab_figure`. The simulations behind them are
cached here (LAB), so a slider move on a setting seen before only redraws.
The figures module draws; widgets.py only wires controls to `LabView`.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from ..validation import check_choice, check_int, check_real

import matplotlib.pyplot as plt

from . import figures
from ..scheduler import CHUNK_SIZINGS, SchedulerConfig
from ..sim.capacity import SIMULATED_DIR, CapacitySLO, capacity, point_key, load_point, load_points
from ..sim.cost_model import (DEFAULT_ASYNC_SCHEDULING, DEFAULT_GRAPH_MODE, GRAPH_MODES, check_graph_mode,
                              gemm_tiling, predict_step)
from ..sim.simulator import resolve_hardware, resolve_model
from ..sim.workloads import LENGTH_MIXES, Workload, long_prompt_interference

CHUNK_SIZES = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
OFF = "off"                  # no chunking: the prefill_first policy
MODES = ("simulate", "measure")
# What "measure" can run on this device: the built-in random-weight model (fast)
# or the real one of pretrained_models.py (30 layers: tens of seconds on a CPU).
MEASURE_MODELS = {"tiny": "tiny model", "smollm2-135m-instruct": "SmolLM2-135M-Instruct"}
# Their context lengths (TINY.max_position; SmolLM2's GGUF says 8192), known
# without loading a model, so a setting is refused before any work.
MEASURE_MAX_POSITION = {"tiny": 4096, "smollm2-135m-instruct": 8192}
WORKLOADS = ("interference",) + tuple(LENGTH_MIXES)
# The policies real engines run by default (see scheduler.py): the chunk size
# applies to the first two; the others do not chunk.
LAB_POLICIES = ("chunked", "chunked_prefill_first", "prefill_first", "decode_first")
POLICY_LABELS = {"chunked": "vLLM V1 (chunked, decodes first)",
                 "chunked_prefill_first": "SGLang default (chunked, no mixing)",
                 "prefill_first": "prefill-first, no chunking (vLLM V0)",
                 "decode_first": "decode-first (request-level batching)"}
# Under load every probe serves LOAD_REQUESTS Poisson arrivals on a coarser rate
# grid than the capacity module's. 128 is the fewest that keep a probe steady traffic
# near the chat mix's capacity (24, as the lab once used, makes every probe a burst
# whose capacities rank the policies wrongly: chapter 7, section 3.2 prints both
# rankings); a new setting then costs about a minute of
# simulation with a progress line. The settings chapter 7 opens with ship in
# data/simulated/ (LAB_POINTS_PATH), so the chapter reads them instead.
LOAD_REQUESTS = 128
LAB_POINTS_PATH = SIMULATED_DIR / "lab_points.json"
CAPACITY_CHUNKS = (64, 512, 4096)
LAB_RATES = tuple(2.0 ** k for k in range(-2, 7))           # 0.25 .. 64 req/s, doubling


@dataclass(frozen=True)
class LabSettings:
    """What the lab's controls set. chunk_size: tokens, or "off" (prefill_first)."""
    chunk_size: int | str = 512
    num_decoders: int = 4            # interference: streams decoding
    prompt_len: int = 2048           # interference: the long prompt
    model: str = "llama-3-8b"
    hardware: str = "A100-80GB"
    mode: str = "simulate"           # or "measure": the real engine on this device
    measure_model: str = "tiny"      # measure: one of MEASURE_MODELS
    itl_slo_ms: float = 50.0         # interference: every gap; under load: the P99 gap
    workload: str = "interference"   # or a steady-traffic length mix
    rate_per_s: float = 4.0          # under load: requests per second
    ttft_slo_ms: float = 2000.0      # under load: the median TTFT
    policy: str = "chunked"          # under load: one of LAB_POLICIES
    chunk_sizing: str = "fixed"      # chunks of equal tokens, or "equal_work" (chapter 6, section 7)
    graph_mode: str = DEFAULT_GRAPH_MODE        # simulate: CUDA graphs by step type (cost_model.GRAPH_MODES)
    async_scheduling: bool = DEFAULT_ASYNC_SCHEDULING   # simulate: host work hides behind the GPU's

    def check(self) -> "LabSettings":
        """Raise ValueError naming the first bad setting; return self."""
        if self.chunk_size != OFF:
            check_int("chunk_size", self.chunk_size, 1, hint=f"512 tokens, or {OFF!r} for no chunking")
        check_int("num_decoders", self.num_decoders, 1)
        check_int("prompt_len", self.prompt_len, 1, hint="2048 tokens")
        check_choice("mode", self.mode, MODES)
        check_choice("measure_model", self.measure_model, tuple(MEASURE_MODELS),
                     hint="'tiny' (random weights, fast) or 'smollm2-135m-instruct' (real, slower)")
        check_choice("workload", self.workload, WORKLOADS)
        check_choice("policy", self.policy, LAB_POLICIES)
        check_choice("chunk_sizing", self.chunk_sizing, CHUNK_SIZINGS)
        check_graph_mode(self.graph_mode)
        if not isinstance(self.async_scheduling, bool):
            raise ValueError(f"async_scheduling={self.async_scheduling!r}: True or False")
        check_real("itl_slo_ms", self.itl_slo_ms, 0, exclusive_minimum=True, hint="milliseconds")
        check_real("ttft_slo_ms", self.ttft_slo_ms, 0, exclusive_minimum=True, hint="milliseconds")
        check_real("rate_per_s", self.rate_per_s, 0, exclusive_minimum=True, hint="4 requests per second")
        if self.mode == "simulate":
            cfg = resolve_model(self.model)
            hw = resolve_hardware(self.hardware)
            if self.workload == "interference" and self.prompt_len >= cfg.max_position:
                raise ValueError(f"prompt_len={self.prompt_len}: {cfg.name} accepts at most "
                                 f"{cfg.max_position - 1} prompt tokens")
            if self.workload != "interference":
                decode_ms = predict_step(cfg, [(1, 512)], hw, graph_mode=self.graph_mode,
                                         async_scheduling=self.async_scheduling).total * 1e3
                if self.itl_slo_ms < decode_ms:
                    raise ValueError(f"itl_slo_ms={self.itl_slo_ms:g}: below one decode step of {cfg.name} "
                                     f"on {hw.name} ({decode_ms:.1f} ms); no setting can meet it")
        elif self.workload != "interference":
            raise ValueError(f"mode='measure' with workload={self.workload!r}: measuring runs the "
                             "interference scenario only (simulate the load, or pick hardware 'cpu' "
                             "to simulate this machine)")
        elif self.prompt_len >= MEASURE_MAX_POSITION[self.measure_model]:
            raise ValueError(f"prompt_len={self.prompt_len}: {MEASURE_MODELS[self.measure_model]} accepts "
                             f"at most {MEASURE_MAX_POSITION[self.measure_model] - 1} prompt tokens")
        return self

    @property
    def under_load(self) -> bool:
        return self.workload != "interference"

    def sched(self) -> SchedulerConfig:
        policy = self.policy if self.under_load else "chunked"
        if self.chunk_size == OFF or policy == "prefill_first":
            return SchedulerConfig(policy="prefill_first")
        if policy == "decode_first":
            return SchedulerConfig(policy="decode_first")
        return SchedulerConfig(policy=policy, chunk_size=int(self.chunk_size), chunk_sizing=self.chunk_sizing)

    def workload_spec(self) -> Workload:
        return long_prompt_interference(prompt_len=self.prompt_len, num_decoders=self.num_decoders)

    def capacity_slo(self) -> CapacitySLO:
        return CapacitySLO(itl_p99_ms=self.itl_slo_ms, ttft_p50_ms=self.ttft_slo_ms)


@dataclass
class LabRun:
    """One run of the interference scenario: what the views need."""
    settings: LabSettings
    outputs: list
    trace: list
    summary: dict
    device: str                      # what produced it: "A100-80GB (simulated)",
                                     # "cpu (measured, SmolLM2-135M-Instruct)"


def _as_settings(settings=None, **overrides) -> LabSettings:
    if settings is None:
        settings = LabSettings()
    if isinstance(settings, dict):
        settings = LabSettings(**settings)
    if not isinstance(settings, LabSettings):
        raise ValueError(f"settings={settings!r}: give a LabSettings or a dict of its fields")
    if overrides:
        unknown = set(overrides) - set(LabSettings.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{sorted(unknown)[0]}: not a lab setting; "
                             f"choose from {tuple(LabSettings.__dataclass_fields__)}")
        settings = replace(settings, **overrides)
    return settings.check()


def _summary_row(summary: dict) -> dict:
    return {"long_ttft_s": summary["long_ttft_s"], "tpot_mean_s": summary["decoder_tpot_mean_s"],
            "itl_p99_s": summary["decoder_itl_p99_s"], "itl_max_s": summary["decoder_itl_max_s"],
            "throughput_tok_s": summary["throughput_tok_s"], "duration_s": summary["duration_s"],
            "num_steps": summary["num_steps"]}


class LabState:
    """Every cache of the lab: interference runs (simulated and measured), load
    points (capacity.load_point rows, keyed by configuration and rate) and the
    models the measured runs use, one per (name, device)."""

    def __init__(self):
        self.simulated: dict[LabSettings, LabRun] = {}
        self.measured: dict[LabSettings, LabRun] = {}
        self._load_points: dict | None = None     # read from LAB_POINTS_PATH on first use
        self._models: dict = {}

    @property
    def load_points(self) -> dict:
        if self._load_points is None:
            self._load_points = load_points(LAB_POINTS_PATH) if LAB_POINTS_PATH.exists() else {}
        return self._load_points

    def clear(self) -> None:
        """Forget every run, the shipped load points too (a benchmark of new settings)."""
        self.simulated.clear()
        self.measured.clear()
        self._load_points = {}

    def model(self, name: str, device: str):
        """The model `name` (a MEASURE_MODELS key) on `device`, loaded once. A missing
        weights package raises pretrained()'s ValueError, which says how to install it."""
        check_choice("measure_model", name, tuple(MEASURE_MODELS))
        if (name, device) not in self._models:
            import torch

            if name == "tiny":
                from ..loader import build_model
                model = build_model("tiny", seed=0, dtype=torch.float32, device=device)
            else:
                from ..pretrained_models import pretrained
                model, _tokenizer = pretrained(name, dtype=torch.float32, device=device)
            self._models[(name, device)] = model
        return self._models[(name, device)]


LAB = LabState()


def _simulated_run(settings: LabSettings) -> LabRun:
    # the SLOs and load-only fields do not change an interference run
    key = replace(settings, itl_slo_ms=1.0, ttft_slo_ms=1.0, rate_per_s=1.0, policy="chunked")
    if key not in LAB.simulated:
        from ..sim.simulator import simulate
        res = simulate(key.workload_spec(), key.sched(), model=key.model, hardware=key.hardware,
                       graph_mode=key.graph_mode, async_scheduling=key.async_scheduling)
        name = key.hardware if isinstance(key.hardware, str) else key.hardware.name
        LAB.simulated[key] = LabRun(key, res.outputs, res.trace, res.summary(), f"{name} (simulated)")
    return LAB.simulated[key]


def _measure_key(settings: LabSettings) -> LabSettings:
    # keyed by the measured model: model= names it, the simulate-only fields are blanked
    return replace(settings, model=settings.measure_model, hardware="this device", itl_slo_ms=1.0,
                   ttft_slo_ms=1.0, rate_per_s=1.0, policy="chunked", graph_mode=DEFAULT_GRAPH_MODE,
                   async_scheduling=DEFAULT_ASYNC_SCHEDULING)


def is_measured(settings=None, **overrides) -> bool:
    """True if this measure-mode setting's run is already cached (lab_run returns at once)."""
    settings = _as_settings(settings, **overrides)
    return settings.mode == "measure" and _measure_key(settings) in LAB.measured


@functools.cache
def _reporting_engine_class():
    from ..engine import LLMEngine   # imported when first measuring: the lab's import stays light

    class ReportingEngine(LLMEngine):
        """LLMEngine calling on_step(steps done) after each step (the lab's progress line)."""
        on_step = None

        def _record(self, record) -> None:
            super()._record(record)
            if self.on_step is not None:
                self.on_step(len(self.trace))       # the whole trace is kept: it counts the steps

    return ReportingEngine


def _measured_run(settings: LabSettings, progress: bool = False, on_step=None) -> LabRun:
    """The real engine with settings.measure_model on this device (memoized per settings).
    on_step(steps_done, steps_total): called before the first step and after each."""
    key = _measure_key(settings)
    if key not in LAB.measured:
        from ..device import default_device
        from ..sim.simulator import SimResult, simulate
        device = default_device()
        model = LAB.model(settings.measure_model, str(device))
        sched = settings.sched()
        workload = settings.workload_spec()
        num_blocks = sum(-(-(r.prompt_len + r.max_tokens) // 16) for r in workload.requests)
        engine = _reporting_engine_class()(model, sched, block_size=16, num_blocks=num_blocks)
        if on_step is not None:
            # The simulator runs the same scheduler on the same workload, so it
            # takes the same steps (section 1 checks it): the progress total, in
            # milliseconds, before the first slow step.
            total = len(simulate(workload, sched, model=model.cfg, num_blocks=num_blocks).trace)
            on_step(0, total)
            engine.on_step = lambda steps_done: on_step(steps_done, max(total, steps_done))
        outputs = engine.run_workload(workload, progress=progress)
        summary = SimResult(outputs, engine.trace, model.cfg, None, sched, workload).summary()
        LAB.measured[key] = LabRun(key, outputs, engine.trace, summary,
                                   f"{device.type} (measured, {MEASURE_MODELS[settings.measure_model]})")
    return LAB.measured[key]


def lab_run(settings=None, progress: bool = False, on_step=None, **overrides) -> LabRun:
    """Run the settings' interference scenario: simulated (cached) or measured on this device.
    Measured: progress=True shows a progress bar of finished requests; on_step(steps_done,
    steps_total) is called as the run goes (the lab's progress line)."""
    settings = _as_settings(settings, **overrides)
    if settings.under_load:
        raise ValueError(f"workload={settings.workload!r}: lab_run runs the interference scenario; "
                         "under load use load_sweep / capacity_rows")
    if settings.mode == "simulate":
        return _simulated_run(settings)
    return _measured_run(settings, progress=progress, on_step=on_step)


def _load_point(settings: LabSettings, sched: SchedulerConfig, rate: float, on_point=None) -> dict:
    if on_point is not None and point_key(sched, settings.workload, settings.model, settings.hardware,
                                           LOAD_REQUESTS, 0, rate, settings.graph_mode,
                                           settings.async_scheduling) not in LAB.load_points:
        on_point(rate)                                 # a simulation is about to run: say so
    return load_point(sched, rate, settings.workload, settings.model, settings.hardware,
                      LOAD_REQUESTS, 0, LAB.load_points, **_step_options(settings))


def _step_options(settings: LabSettings) -> dict:
    return dict(graph_mode=settings.graph_mode, async_scheduling=settings.async_scheduling)


def chunk_sweep(settings=None, chunk_sizes=CHUNK_SIZES, on_point=None, **overrides) -> list[dict]:
    """One row per chunk size (and "off").

    Interference: long TTFT, decoders' TPOT, p99 and max ITL; simulate mode runs
    every chunk size (each run cached), measure mode reports only the chunk
    sizes already measured (the curve fills in as the learner moves the slider).
    Under load: capacity.load_point's percentiles at settings.rate_per_s for
    settings.policy ("off": prefill_first). on_point(rate): called before each
    new simulation under load (a progress hook for the lab).
    """
    settings = _as_settings(settings, **overrides)
    rows = []
    for chunk in (*chunk_sizes, OFF):
        point = replace(settings, chunk_size=chunk)
        if settings.under_load:
            rows.append({"chunk_size": chunk, **_load_point(settings, point.sched(), settings.rate_per_s,
                                                             on_point)})
        elif settings.mode == "measure":
            key = _measure_key(point)
            if key in LAB.measured:
                rows.append({"chunk_size": chunk, **_summary_row(LAB.measured[key].summary)})
        else:
            rows.append({"chunk_size": chunk, **_summary_row(lab_run(point).summary)})
    return rows


def capacity_rows(settings=None, chunk_sizes=None, on_point=None, **overrides) -> list[dict]:
    """Capacity (req/s meeting the P99 ITL and median TTFT SLOs) per policy and chunk size
    (default CAPACITY_CHUNKS): one row per (policy, chunk_size); the unchunked policies
    have chunk_size None. on_point(rate): called before each new simulation."""
    settings = _as_settings(settings, **overrides)
    chunk_sizes = CAPACITY_CHUNKS if chunk_sizes is None else chunk_sizes
    if not settings.under_load:
        raise ValueError("workload='interference': capacity needs steady traffic; pick a length mix "
                         f"from {tuple(LENGTH_MIXES)}")
    rows = []
    for policy in LAB_POLICIES:
        chunks = chunk_sizes if policy in ("chunked", "chunked_prefill_first") else (None,)
        for chunk in chunks:
            s = replace(settings, policy=policy, chunk_size=chunk if chunk is not None else 512)
            res = capacity(s.sched(), settings.capacity_slo(), settings.workload, settings.model,
                           settings.hardware, LOAD_REQUESTS, 0, LAB_RATES, LAB.load_points, on_point,
                           **_step_options(settings))
            rows.append({"policy": policy, "chunk_size": chunk, "capacity_req_s": res.rate_per_s})
    return rows


def _current_capacity(settings: LabSettings) -> float:
    return capacity(settings.sched(), settings.capacity_slo(), settings.workload, settings.model,
                    settings.hardware, LOAD_REQUESTS, 0, LAB_RATES, LAB.load_points,
                    **_step_options(settings)).rate_per_s


def _what(settings: LabSettings) -> str:
    sched = settings.sched()
    if sched.policy in ("prefill_first", "decode_first"):
        return sched.policy.replace("_", "-") + ", no chunking"
    return f"{sched.policy} chunk {sched.chunk_size}" + _sizing_words(sched)


def _sizing_words(sched: SchedulerConfig) -> str:
    return " (equal work)" if sched.chunk_sizing == "equal_work" else ""


def lab_verdict(settings=None, **overrides) -> str:
    """One line: does this setting meet the SLO(s), and at what cost?"""
    settings = _as_settings(settings, **overrides)
    if settings.under_load:
        p = _load_point(settings, settings.sched(), settings.rate_per_s)
        itl_ms, ttft_ms = p["itl_p99_s"] * 1e3, p["ttft_p50_s"] * 1e3
        ok = settings.capacity_slo().met_by(p)
        return (f"{'MEETS' if ok else 'MISSES'} the SLOs at {settings.rate_per_s:g} req/s with "
                f"{_what(settings)}: P99 ITL {itl_ms:.0f} ms (SLO {settings.itl_slo_ms:g}), median TTFT "
                f"{ttft_ms:.0f} ms (SLO {settings.ttft_slo_ms:g}), mean TPOT {p['tpot_mean_s'] * 1e3:.1f} ms; "
                f"capacity {_current_capacity(settings):.2f} req/s")
    s = lab_run(settings).summary
    worst_ms, ttft_ms = s["decoder_itl_max_s"] * 1e3, s["long_ttft_s"] * 1e3
    tpot_ms = s["decoder_tpot_mean_s"] * 1e3
    what = ("no chunking" if settings.chunk_size == OFF
            else f"chunk {settings.chunk_size}" + _sizing_words(settings.sched()))
    ok = worst_ms <= settings.itl_slo_ms
    return (f"{'MEETS' if ok else 'MISSES'} the {settings.itl_slo_ms:g} ms ITL SLO with {what}: "
            f"worst decoder gap {worst_ms:.1f} ms (mean TPOT {tpot_ms:.1f} ms), "
            f"long prompt TTFT {ttft_ms:.0f} ms")


READOUT_CONTEXT = 1024        # the decodes' context in step_readout's priced step


def step_readout(settings=None, **overrides) -> str:
    """The step's M against the GEMM tile and the waves, and how the step runs.

    The step a chunk shares with the decodes: the budget (the chunk size, or the
    whole prompt with no chunking) plus one row per decode is the M of every
    linear layer. Its largest GEMM (gate_up) is cut into tiles, the tiles into
    waves over the SMs; predict_step says which graph the step runs as and why.
    """
    settings = _as_settings(settings, **overrides)
    if settings.mode != "simulate":
        return "measured on this device: no GPU tiles or CUDA graphs to read out"
    cfg, hw = resolve_model(settings.model), resolve_hardware(settings.hardware)
    budget = settings.prompt_len if settings.chunk_size == OFF else int(settings.chunk_size)
    decodes = settings.num_decoders
    shape = [(budget, 0, False)] + [(1, READOUT_CONTEXT)] * decodes
    step = predict_step(cfg, shape, hw, **_step_options(settings))
    text = f"budget {budget} + {decodes} decodes = {budget + decodes} rows"
    if hw.has_cuda_graphs:
        tiling = gemm_tiling(step.rows, cfg.hidden_size, 2 * cfg.intermediate_size, hw)
        whole = (budget + decodes) % tiling.tile_m == 0
        text += (f" (computed as {step.rows})" if step.rows != budget + decodes else "")
        text += (f": gate_up in {tiling.row_tiles} row tiles of {tiling.tile_m}"
                 f"{'' if whole else ' (the last one partly empty)'} x {tiling.col_tiles} column tiles "
                 f"of {tiling.tile_n} = {tiling.tiles} tiles, {tiling.waves:.1f} waves on {hw.num_sms} SMs")
    run_as = "eager (no graph)" if step.graph == "none" else f"{step.graph} graph"
    return f"{text}; {run_as}, step {step.total * 1e3:.1f} ms ({step.reason})"


def best_chunk_size(settings=None, chunk_sizes=CHUNK_SIZES, **overrides):
    """Interference: the chunk size (or "off") with the lowest long-prompt TTFT among
    those whose worst decoder gap meets settings.itl_slo_ms; None if none does."""
    settings = _as_settings(settings, **overrides)
    return figures.pick_chunk_size(chunk_sweep(settings, chunk_sizes), settings.itl_slo_ms)


def lab_figure(settings=None, progress: bool = False, fig=None, **overrides):
    """The lab's views of one setting, drawn into `fig` when given (the lab redraws
    its one figure in place) or a new one. Interference: step timeline, token
    gaps and the chunk sweep. Under load: TTFT/TPOT/ITL percentiles against
    chunk size at the chosen rate, and capacity against chunk size per policy.
    The verdict is the title."""
    settings = _as_settings(settings, **overrides)
    verdict = lab_verdict(settings) if settings.mode == "simulate" or not settings.under_load else ""
    model = settings.model if isinstance(settings.model, str) else settings.model.name
    if settings.under_load:
        rows = chunk_sweep(settings)
        caps = capacity_rows(settings)
        return figures.plot_load_lab(
            rows, caps, current_chunk=settings.chunk_size, current_policy=settings.sched().policy,
            rate_per_s=settings.rate_per_s, itl_slo_ms=settings.itl_slo_ms, ttft_slo_ms=settings.ttft_slo_ms,
            title=_load_title(settings, verdict), fig=fig, policy_labels=POLICY_LABELS)
    run = lab_run(settings, progress=progress)
    where = run.device if settings.mode == "measure" else f"{model} on {run.device}"   # device names the model
    long = next(o for o in run.outputs if o.tag == "long")
    return figures.plot_interference_lab(
        run.trace, run.outputs, chunk_sweep(settings), current_chunk=settings.chunk_size,
        itl_slo_ms=settings.itl_slo_ms, probe=(long.metrics.arrival_time, long.metrics.first_token_time),
        num_streams=settings.num_decoders, stream_tag="decoder",
        worst_gap_s=run.summary["decoder_itl_max_s"],
        title=f"{where}: {verdict}" + (f"\n{step_readout(settings).split(';')[0]}"
                                          if settings.mode == "simulate" else ""), fig=fig)


def _load_title(settings: LabSettings, verdict: str) -> str:
    model = settings.model if isinstance(settings.model, str) else settings.model.name
    return f"{model} on {settings.hardware}, {settings.workload} traffic: {verdict}"


def mark_load_setting(fig, settings=None, **overrides) -> list:
    """Move the current-setting marks and the verdict title of an under-load lab
    figure to `settings`; the rest of the figure must be lab_figure's for a setting
    that differs at most in chunk size (same policy). Returns the artists that
    changed (the lab redraws only those)."""
    settings = _as_settings(settings, **overrides)
    return figures.mark_load_lab_setting(fig, capacity_rows(settings), settings.chunk_size,
                                         settings.sched().policy, _load_title(settings, lab_verdict(settings)))


def plot_stall(settings=None, chunk_size=512, **overrides):
    """Two rows: the step timeline and the streams' gaps without chunking (top)
    and with chunk_size (bottom), zoomed on the long prompt."""
    settings = _as_settings(settings, **overrides)
    runs = [(("no chunking" if chunk == OFF else f"chunk {chunk}"), lab_run(replace(settings, chunk_size=chunk)))
            for chunk in (OFF, chunk_size)]
    name = settings.model if isinstance(settings.model, str) else settings.model.name
    where = runs[0][1].device if settings.mode == "measure" else f"{name} on {settings.hardware}"
    return figures.plot_stall_pair(
        [(what, run.trace, run.outputs, run.summary) for what, run in runs], stream_tag="decoder",
        probe_tag="long",
        title=f"{where}: a {settings.prompt_len}-token prompt stalls "
              f"{settings.num_decoders} streams; chunks of {chunk_size} cap the stall")


def save_readme_figures(out_dir="figures", dpi: int = 110) -> list:
    """Write stall_timeline.png, ttft_tpot_vs_chunk.png, load_lab.png and roofline.png
    (Llama-3-8B on an A100-80GB, simulated: fast and deterministic); return the paths."""
    from pathlib import Path
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    settings = LabSettings(model="llama-3-8b", hardware="A100-80GB", chunk_size=512)
    load = replace(settings, workload="chat", rate_per_s=4.0, itl_slo_ms=100.0)
    figs = {
        "stall_timeline.png": plot_stall(settings, chunk_size=512),
        "ttft_tpot_vs_chunk.png": figures.plot_chunk_sweep(chunk_sweep(settings), current=512,
                                                           itl_slo_ms=settings.itl_slo_ms),
        "load_lab.png": lab_figure(load),
        "roofline.png": figures.plot_roofline("llama-3-8b", "A100-80GB"),
    }
    paths = []
    for name, fig in figs.items():
        path = out / name
        fig.savefig(path, dpi=dpi, metadata={"Software": None})
        paths.append(path)
    return paths
