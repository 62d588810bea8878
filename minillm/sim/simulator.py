"""The engine's scheduler with time from the cost model instead of a GPU.

`simulate()` builds the SAME EngineCore and Scheduler as LLMEngine, on a
VirtualClock, with an executor that runs no model: for each step it asks
`cost_model.predict_step` how long a step of that shape (one
(num_new_tokens, num_cached_tokens) pair per request) would take on the
chosen hardware, advances the clock by that much and hands back dummy
tokens. So every scheduling decision the learner sees here is one the real
engine would make; only the durations are predicted.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, fields

from ..config import ModelConfig
from .cost_model import (DEFAULT_ASYNC_SCHEDULING, DEFAULT_GRAPH_MODE, StepTime, check_capture_sizes,
                         check_graph_mode, predict_step)
from ..engine import EngineCore, Sampled, StepRecord, VirtualClock
from .hardware import Hardware, PROFILES, get_hardware
from ..kv_cache import blocks_for
from ..prefix_cache import make_block_manager
from ..metrics import distribution, summarize
from ..request import RequestOutput
from ..scheduler import SchedulerConfig
from ..speculative import SpeculativeConfig, Speculator, acceptance_stats
from ..validation import check_int, check_real
from .accounting import check_dtype_bytes, dtype_bytes_on
from .workloads import Workload

__all__ = ["simulate", "SimResult", "CostModelExecutor", "predict_step", "StepTime", "SimStepRecord",
           "resolve_model", "resolve_hardware", "default_sim_num_blocks"]

DUMMY_TOKEN = 0          # simulated requests produce this token; EOS is ignored


class SimulatedSpeculator(Speculator):
    """Drafts for requests that carry no text: always k of them (dummies). Whether they
    are accepted is the executor's draw, at the acceptance rate the simulation is given."""

    def propose(self, request, max_num_tokens: int) -> list[int]:
        return [DUMMY_TOKEN] * max(0, max_num_tokens)


def resolve_model(model) -> ModelConfig:
    """A preset name or a ModelConfig -> ModelConfig (ValueError otherwise)."""
    if isinstance(model, ModelConfig):
        return model
    if isinstance(model, str):
        return ModelConfig.preset(model)      # names the unknown preset and the choices
    raise ValueError(f"model={model!r}: give a preset name (e.g. 'llama-3-8b') or a ModelConfig")


def resolve_hardware(hardware) -> Hardware:
    """A profile name or a Hardware object -> Hardware. 'cpu' calibrates this machine."""
    if not isinstance(hardware, (str, Hardware)):
        raise ValueError(f"hardware={hardware!r}: use one of {sorted(PROFILES)} or a Hardware object")
    return get_hardware(hardware)


@dataclass
class SimStepRecord(StepRecord):
    """The engine's StepRecord plus how the cost model priced the step (cost_model.step_graph):
    its kind, the graph it ran as, the rows computed (padding included), device and
    host seconds and the reason in words. Every StepRecord user reads it as before."""
    kind: str = ""
    graph: str = "none"
    rows: int = 0
    device_s: float = 0.0
    host_s: float = 0.0
    reason: str = ""


class CostModelExecutor:
    """An executor for EngineCore: step time from predict_step, tokens are dummies.

    graph_mode, capture_sizes, async_scheduling: as predict_step's. `priced`
    holds the StepTime of every executed step, in order (simulate() joins them
    to the engine's trace)."""

    def __init__(self, cfg: ModelConfig, hardware: Hardware, dtype_bytes: int = 2, *,
                 graph_mode: str = DEFAULT_GRAPH_MODE, capture_sizes=None,
                 async_scheduling: bool = DEFAULT_ASYNC_SCHEDULING,
                 acceptance_rate: float = 0.0, seed: int = 0):
        self.cfg = cfg
        # Speculative decoding: each draft is accepted with this probability, independently,
        # until the first rejection (Leviathan et al.'s model); seeded, so a run repeats.
        self.acceptance_rate = check_real("acceptance_rate", acceptance_rate, 0, 1, hint="0.7")
        self._rng = random.Random(seed)
        self.hardware = hardware
        self.dtype_bytes = dtype_bytes
        self.step_options = dict(graph_mode=check_graph_mode(graph_mode),
                                 capture_sizes=check_capture_sizes(capture_sizes),
                                 async_scheduling=async_scheduling)
        self._cache: dict[tuple, StepTime] = {}     # step shape -> StepTime (workloads repeat shapes)
        self.priced: list[StepTime] = []

    def step_shape(self, plan, emits_token) -> tuple[tuple[int, int, bool], ...]:
        """(num_new_tokens, num_cached_tokens, emits a token) per request: all the cost model sees."""
        return tuple((n, r.num_computed_tokens, e) for (r, n), e in zip(plan.scheduled, emits_token))

    def execute(self, plan, emits_token):
        shape = self.step_shape(plan, emits_token)
        priced = self._cache.get(shape)
        if priced is None:
            priced = predict_step(self.cfg, list(shape), self.hardware, self.dtype_bytes, **self.step_options)
            self._cache[shape] = priced
        self.priced.append(priced)
        tokens = {r.request_id: Sampled([DUMMY_TOKEN] * (1 + self._num_accepted(len(plan.drafts.get(r.request_id, ())))))
                  for (r, _), e in zip(plan.scheduled, emits_token) if e}
        return tokens, priced.total

    def _num_accepted(self, num_drafts: int) -> int:
        accepted = 0
        while accepted < num_drafts and self._rng.random() < self.acceptance_rate:
            accepted += 1
        return accepted

    def release(self, request) -> None:
        pass

    def annotate(self, trace: list[StepRecord]) -> list[SimStepRecord]:
        """The trace's records with each step's pricing (the last len(trace) steps priced)."""
        priced = self.priced[len(self.priced) - len(trace):] if trace else []
        base = [f.name for f in fields(StepRecord)]
        return [SimStepRecord(**{name: getattr(r, name) for name in base}, kind=p.kind, graph=p.graph,
                              rows=p.rows, device_s=p.device_s, host_s=p.host_s, reason=p.reason)
                for r, p in zip(trace, priced)]


def default_sim_num_blocks(cfg: ModelConfig, hardware: Hardware, sched: SchedulerConfig,
                           block_size: int = 16, dtype_bytes: int = 2,
                           memory_fraction: float = 0.9) -> int:
    """KV blocks a real server would have: memory_fraction of the GPU minus the
    weights, over the bytes of one block. Without a memory size (a calibrated
    CPU): enough for max_num_seqs requests of the model's full context."""
    bytes_per_block = cfg.kv_bytes_per_token(dtype_bytes) * block_size
    full_context = sched.max_num_seqs * blocks_for(cfg.max_position, block_size)
    if not hardware.memory_bytes:
        return full_context
    free_bytes = hardware.memory_bytes * memory_fraction - cfg.num_parameters() * dtype_bytes
    if free_bytes < bytes_per_block * blocks_for(cfg.max_position, block_size):
        raise ValueError(f"model {cfg.name!r} ({cfg.num_parameters() / 1e9:.1f} B parameters at "
                         f"{dtype_bytes} bytes) leaves no room for a full-context KV cache on "
                         f"{hardware.name} ({hardware.memory_bytes / 2**30:.0f} GiB)")
    return int(free_bytes // bytes_per_block)


@dataclass
class SimResult:
    outputs: list[RequestOutput]
    trace: list[StepRecord]
    model: ModelConfig
    hardware: Hardware
    sched: SchedulerConfig
    workload: Workload | None = None
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None

    def summary(self, ttft_slo_s: float | None = None, tpot_slo_s: float | None = None,
                slo_ms: dict | None = None) -> dict:
        """metrics.summarize (slo_ms: vLLM's --goodput keys in ms), plus per tag
        (e.g. the long prompt's TTFT and the decoders' ITL) and the step counts.
        Times in seconds."""
        ttft_slo_s = self.ttft_slo_s if ttft_slo_s is None else ttft_slo_s
        tpot_slo_s = self.tpot_slo_s if tpot_slo_s is None else tpot_slo_s
        out = summarize(self.outputs, ttft_slo_s, tpot_slo_s, slo_ms)
        out["num_steps"] = len(self.trace)
        out["max_step_s"] = max((r.duration for r in self.trace), default=0.0)
        if any(r.spec for r in self.trace):
            out["spec"] = acceptance_stats(self.trace)
        tags = sorted({o.tag for o in self.outputs if o.tag})
        for tag in tags:
            tagged = [o for o in self.outputs if o.tag == tag]
            out[tag] = {
                "ttft": distribution(o.metrics.ttft for o in tagged if o.metrics.ttft is not None),
                "tpot": distribution(o.metrics.tpot for o in tagged if o.metrics.tpot is not None),
                "itl": distribution(g for o in tagged for g in o.metrics.itl),
            }
        # The workload names its roles (long_prompt_interference: the probe prompt
        # and the decoding streams); the simulator knows no tag of its own.
        params = self.workload.params if self.workload is not None else {}
        probe, streams = params.get("probe_tag"), params.get("stream_tag")
        if probe in out:
            out["long_ttft_s"] = out[probe]["ttft"]["max"]
        if streams in out:
            itl = out[streams]["itl"]
            out["decoder_itl_p50_s"] = itl["median"]
            out["decoder_itl_p99_s"] = itl["p99"]
            out["decoder_itl_max_s"] = itl["max"]
            out["decoder_tpot_mean_s"] = out[streams]["tpot"]["mean"]
        return out


def simulate(workload: Workload, sched: SchedulerConfig | None = None, model="llama-3-8b",
             hardware="A100-80GB", dtype_bytes: int | None = None, block_size: int = 16,
             num_blocks: int | None = None, ttft_slo_s: float | None = None,
             tpot_slo_s: float | None = None, enable_prefix_caching: bool = False, *,
             graph_mode: str = DEFAULT_GRAPH_MODE, capture_sizes=None,
             async_scheduling: bool = DEFAULT_ASYNC_SCHEDULING,
             speculative: SpeculativeConfig | None = None, acceptance_rate: float = 0.7,
             spec_seed: int = 0) -> SimResult:
    """Serve `workload` with the engine's scheduler; step times from the cost model.

    model: a preset name or ModelConfig. hardware: a profile name
    ("A100-40GB", "A100-80GB", "H100-SXM", "H200") or a Hardware object such as
    hardware.calibrate()'s. dtype_bytes: bytes per weight and KV element;
    None: the hardware profile's dtype (bfloat16 on the GPUs, float32 for a
    calibrated CPU). num_blocks=None: the KV blocks the GPU's memory
    holds next to the weights (default_sim_num_blocks). enable_prefix_caching:
    as LLMEngine's; the requests then carry the workload's token ids, since
    a cache hit is decided by the tokens. graph_mode ("full_and_piecewise",
    vLLM V1's default; "piecewise"; "none"), capture_sizes (None: vLLM's
    default sizes) and async_scheduling (vLLM's default since v0.14: on):
    how each step runs on a GPU (cost_model.predict_step); the trace's
    records (SimStepRecord) say how each step was priced and why.

    speculative: a SpeculativeConfig (chapter 12): every decode drafts
    num_speculative_tokens tokens (fewer near max_tokens or when token_budget runs
    short, as in the engine), each accepted with probability acceptance_rate until the
    first rejection (seeded by spec_seed); a verification is priced as a chunk of
    1 + k tokens (its LM head as one row: the cost model prices one sampled row per
    request). The trace's `spec` field and summary()["spec"] say what was accepted.
    """
    if not isinstance(workload, Workload):
        raise ValueError(f"workload={workload!r}: give a minillm.workloads.Workload "
                         "(e.g. workloads.long_prompt_interference())")
    sched = sched if sched is not None else SchedulerConfig()
    if not isinstance(sched, SchedulerConfig):
        raise ValueError(f"sched={sched!r}: give a SchedulerConfig")
    cfg = resolve_model(model)
    hw = resolve_hardware(hardware)
    block_size = check_int("block_size", block_size, 1, hint="16")
    dtype_bytes = dtype_bytes_on(hw, dtype_bytes)
    if num_blocks is None:
        num_blocks = default_sim_num_blocks(cfg, hw, sched, block_size, dtype_bytes)
    num_blocks = check_int("num_blocks", num_blocks, 1, hint="None for what the GPU holds")
    executor = CostModelExecutor(cfg, hw, dtype_bytes, graph_mode=graph_mode, capture_sizes=capture_sizes,
                                 async_scheduling=async_scheduling, acceptance_rate=acceptance_rate,
                                 seed=check_int("spec_seed", spec_seed))
    core = EngineCore(sched, make_block_manager(num_blocks, block_size, enable_prefix_caching),
                      executor, VirtualClock(),
                      eos_token_ids=(), max_model_len=cfg.max_position,
                      speculator=None if speculative is None else SimulatedSpeculator(speculative))
    if enable_prefix_caching:
        core.vocab_size = cfg.vocab_size       # token ids, so that equal prefixes hash alike
    outputs = core.run_workload(workload)
    return SimResult(outputs=outputs, trace=executor.annotate(core.trace), model=cfg, hardware=hw, sched=sched,
                     workload=workload, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s)
