"""Chunked prefill on every GPU, or prefill and decode on separate GPUs?

Two ways to serve one workload with N GPUs (one model replica per GPU):

  aggregated      N replicas, each running the engine's stall-free chunked
                  scheduler: prefill chunks and decodes share every step.
  disaggregated   num_prefill replicas only run prompts (their step makes the
                  first token), num_decode replicas only decode; a request's
                  KV moves from one to the other over an interconnect of
                  `interconnect_bytes_s`, which takes prompt KV bytes / bandwidth
                  (DistServe, OSDI'24; Splitwise; Mooncake).

Both run the engine's own scheduler and cost model (simulate()); requests go
to replicas round robin. A decode replica receives a request as a prompt whose
K and V are already in its cache: one new token (the first output token)
over prompt_len cached ones, exactly what a decode step costs.

TTFT is the prefill replica's first token minus arrival; TPOT counts every
later token, so the KV transfer and any wait for a decode slot show in it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..validation import check_int, check_real
from ..engine import EngineCore, VirtualClock
from ..metrics import summarize
from ..prefix_cache import make_block_manager
from ..request import RequestMetrics, RequestOutput, SamplingParams
from ..scheduler import SchedulerConfig
from .simulator import (CostModelExecutor, DUMMY_TOKEN, default_sim_num_blocks, resolve_hardware,
                        resolve_model, simulate)
from .workloads import Workload
from .accounting import dtype_bytes_on

__all__ = ["ServingRun", "simulate_aggregated", "simulate_disaggregated", "kv_transfer_s",
           "goodput_rate", "highest_rate_meeting",
           "DEFAULT_INTERCONNECT_BYTES_S"]

# One 200 Gb/s network port (InfiniBand HDR / 200 GbE RoCE): 25 GB/s. Between
# two GPUs of one NVLink node it would be ~10x more; across a 25 GbE link, 8x less.
DEFAULT_INTERCONNECT_BYTES_S = 25e9


@dataclass
class ServingRun:
    """A served workload: outputs in the workload's order, and how many GPUs served it."""
    label: str
    outputs: list[RequestOutput]
    num_gpus: int

    def summary(self, ttft_slo_s: float | None = None, tpot_slo_s: float | None = None) -> dict:
        out = summarize(self.outputs, ttft_slo_s, tpot_slo_s)
        out["throughput_tok_s_per_gpu"] = out["throughput_tok_s"] / self.num_gpus
        return out


def _split(workload: Workload, num_replicas: int) -> list[list[int]]:
    """Round robin in arrival order: request indices per replica."""
    order = sorted(range(len(workload.requests)), key=lambda i: workload.requests[i].arrival_time)
    return [order[k::num_replicas] for k in range(num_replicas)]


def _sub_workload(workload: Workload, indices: list[int], **changes) -> Workload:
    requests = tuple(workload.requests[i] for i in indices)
    if changes:
        from dataclasses import replace
        requests = tuple(replace(r, **changes) for r in requests)
    return Workload(requests, seed=workload.seed, description=workload.description)


def simulate_aggregated(workload: Workload, num_gpus: int, sched: SchedulerConfig | None = None,
                        model="llama-3-8b", hardware="A100-80GB", dtype_bytes: int | None = None) -> ServingRun:
    """num_gpus replicas, each serving its share with the chunked scheduler.
    dtype_bytes: None counts the hardware profile's own dtype (as simulate)."""
    num_gpus = check_int("num_gpus", num_gpus, 1)
    sched = sched if sched is not None else SchedulerConfig(policy="chunked", chunk_size=512)
    outputs: list[RequestOutput | None] = [None] * len(workload.requests)
    for indices in _split(workload, num_gpus):
        if not indices:
            continue
        res = simulate(_sub_workload(workload, indices), sched, model=model, hardware=hardware,
                       dtype_bytes=dtype_bytes)
        for i, out in zip(indices, res.outputs):
            outputs[i] = out
    return ServingRun(f"aggregated x{num_gpus}", outputs, num_gpus)


def kv_transfer_s(cfg, prompt_len: int, interconnect_bytes_s: float, dtype_bytes: int = 2) -> float:
    """Seconds to move one prompt's K and V (all layers) over the interconnect."""
    return cfg.kv_bytes_per_token(dtype_bytes) * prompt_len / interconnect_bytes_s


def simulate_disaggregated(workload: Workload, num_prefill: int, num_decode: int, model="llama-3-8b",
                           hardware="A100-80GB", interconnect_bytes_s: float = DEFAULT_INTERCONNECT_BYTES_S,
                           prefill_chunk_size: int = 8192, max_num_seqs: int = 64,
                           dtype_bytes: int | None = None) -> ServingRun:
    """num_prefill prompt-only replicas hand each request's KV to one of num_decode
    decode-only replicas, over interconnect_bytes_s bytes/s. dtype_bytes: None
    counts the hardware profile's own dtype (as simulate)."""
    num_prefill = check_int("num_prefill", num_prefill, 1)
    num_decode = check_int("num_decode", num_decode, 1)
    interconnect_bytes_s = check_real("interconnect_bytes_s", interconnect_bytes_s, 0, exclusive_minimum=True,
                                      hint=f"bytes per second, e.g. {DEFAULT_INTERCONNECT_BYTES_S:.0e} for a "
                                           "200 Gb/s link")
    cfg, hw = resolve_model(model), resolve_hardware(hardware)
    dtype_bytes = dtype_bytes_on(hw, dtype_bytes)
    # 1. Prefill replicas: every request stops at its first token.
    first_token: dict[int, RequestOutput] = {}
    prefill_sched = SchedulerConfig(policy="chunked", chunk_size=prefill_chunk_size, max_num_seqs=max_num_seqs)
    for indices in _split(workload, num_prefill):
        if indices:
            res = simulate(_sub_workload(workload, indices, max_tokens=1), prefill_sched, model=cfg,
                           hardware=hw, dtype_bytes=dtype_bytes)
            first_token.update(zip(indices, res.outputs))
    # 2. The KV arrives at a decode replica (round robin in order of arrival).
    arrivals = sorted((first_token[i].metrics.first_token_time
                       + kv_transfer_s(cfg, r.prompt_len, interconnect_bytes_s, dtype_bytes), i)
                      for i, r in enumerate(workload.requests) if r.max_tokens > 1)
    decode_sched = SchedulerConfig(policy="chunked", chunk_size=max_num_seqs, max_num_seqs=max_num_seqs)
    later_tokens: dict[int, list[float]] = {}
    for k in range(num_decode):
        mine = arrivals[k::num_decode]
        if mine:
            later_tokens.update(_serve_decodes(workload, mine, decode_sched, cfg, hw, dtype_bytes))
    # 3. One output per request: the first token from prefill, the rest from decode.
    outputs = []
    for i, spec in enumerate(workload.requests):
        first = first_token[i].metrics
        times = [first.first_token_time] + later_tokens.get(i, [])
        metrics = RequestMetrics(arrival_time=first.arrival_time, first_token_time=times[0],
                                 token_times=times, finish_time=times[-1])
        outputs.append(RequestOutput(request_id=i, prompt_token_ids=None, prompt_len=spec.prompt_len,
                                     output_token_ids=[DUMMY_TOKEN] * len(times), finished=True,
                                     metrics=metrics, finish_reason="length", tag=spec.tag))
    return ServingRun(f"disaggregated {num_prefill}P+{num_decode}D", outputs, num_prefill + num_decode)


def _serve_decodes(workload, arrivals, sched, cfg, hw, dtype_bytes) -> dict[int, list[float]]:
    """One decode replica: each request joins when its KV has arrived, as a
    prompt of prompt_len + 1 tokens with its first prompt_len already cached."""
    core = EngineCore(sched, make_block_manager(default_sim_num_blocks(cfg, hw, sched, 16, dtype_bytes), 16),
                      CostModelExecutor(cfg, hw, dtype_bytes), VirtualClock(),
                      eos_token_ids=(), max_model_len=cfg.max_position)
    pending = list(arrivals)                   # (kv arrival time, workload index), sorted
    index_of: dict[int, int] = {}
    while pending or core.has_unfinished_requests():
        while pending and pending[0][0] <= core.clock.now():
            t, i = pending.pop(0)
            spec = workload.requests[i]
            rid = core.add_request(None, SamplingParams(max_tokens=spec.max_tokens - 1, ignore_eos=True),
                                   arrival_time=t, prompt_len=spec.prompt_len + 1)
            core.requests[rid].num_computed_tokens = spec.prompt_len    # the KV came with it
            index_of[rid] = i
        if not core.has_unfinished_requests():
            core.clock.skip_to(pending[0][0])
            continue
        core.step()
    return {i: list(core.requests[rid].metrics.token_times) for rid, i in index_of.items()}


def goodput_rate(runs_by_rate: dict[float, ServingRun], ttft_slo_s: float | None, tpot_slo_s: float | None,
                 attainment: float = 0.9) -> float:
    """DistServe's goodput: the highest request rate (req/s) at which at least
    `attainment` of the requests meet both SLOs (see highest_rate_meeting)."""
    return highest_rate_meeting({rate: run.summary(ttft_slo_s, tpot_slo_s)["slo_attainment"]
                                 for rate, run in runs_by_rate.items()}, attainment)


def highest_rate_meeting(attainment_by_rate: dict[float, float], attainment: float = 0.9) -> float:
    """Scanning rates upward, the last one whose SLO attainment is at least
    `attainment`, stopping at the first that falls short (a rate that passes
    again above it is luck, not capacity). 0.0 if even the lowest fails."""
    if not 0 < attainment <= 1:
        raise ValueError(f"attainment={attainment!r}: must be in (0, 1]")
    best = 0.0
    for rate in sorted(attainment_by_rate):
        if attainment_by_rate[rate] < attainment:
            break
        best = rate
    return best
