"""Chapter 8's benchmarks: `python -m minillm bench prefix-cache | partial-prefills`.

Each runs the same workload on the real engine (tiny model, this device) and
in the simulator (Llama-3-8B on an H100 profile), with the feature off and on.
"""
from __future__ import annotations

import time

import torch

from ..device import default_device
from ..engine import LLMEngine
from ..loader import build_model
from ..metrics import summarize
from ..request import SamplingParams
from ..scheduler import SchedulerConfig
from ..sim.chat_workloads import long_then_short, shared_system_prompt_chat
from ..sim.simulator import simulate

SIM_MODEL, SIM_GPU = "llama-3-8b", "H100-SXM"


def _prefill_tokens(trace) -> int:
    return sum(r.num_prefill_tokens for r in trace)


def _warm(model) -> None:
    LLMEngine(model, SchedulerConfig()).generate([[1] * 64], SamplingParams(max_tokens=2, ignore_eos=True))


def prefix_cache_rows(device=None, num_chats: int = 16, system_prompt_len: int = 512) -> list[dict]:
    """TTFT and prefill tokens computed, prefix cache off and on, engine and simulator."""
    device = device or default_device()
    model = build_model("tiny", seed=0, dtype=torch.float32, device=device)
    _warm(model)
    rows = []
    engine_wl = shared_system_prompt_chat(num_chats, system_prompt_len, user_len=(16, 64), output_len=8)
    for caching in (False, True):
        engine = LLMEngine(model, SchedulerConfig(chunk_size=512), enable_prefix_caching=caching)
        t0 = time.perf_counter()
        outputs = engine.run_workload(engine_wl)
        rows.append(_prefix_row(f"engine, tiny, {device}", caching, outputs, engine.trace,
                                time.perf_counter() - t0))
    sim_wl = shared_system_prompt_chat(64, 2048, user_len=(32, 256), output_len=64, rate_per_s=8)
    for caching in (False, True):
        res = simulate(sim_wl, SchedulerConfig(chunk_size=512), model=SIM_MODEL, hardware=SIM_GPU,
                       enable_prefix_caching=caching)
        rows.append(_prefix_row(f"sim, {SIM_MODEL}, {SIM_GPU}", caching, res.outputs, res.trace, None))
    return rows


def _prefix_row(where, caching, outputs, trace, wall_s) -> dict:
    s = summarize(outputs)
    return {"where": where, "prefix_cache": "on" if caching else "off",
            "ttft_mean_ms": s["ttft"]["mean"] * 1e3, "ttft_p90_ms": s["ttft"]["p90"] * 1e3,
            "prefill_tokens": _prefill_tokens(trace),
            "prompt_tokens": sum(o.prompt_len for o in outputs),
            "wall_s": wall_s if wall_s is not None else float("nan")}


PARTIAL_CONFIGS = {
    "FCFS (chapter 6)": {},
    "long_prefill_token_threshold=128": dict(long_prefill_token_threshold=128),
    "max_num_partial_prefills=4": dict(max_num_partial_prefills=4, long_prefill_token_threshold=256),
}


def partial_prefill_rows(device=None) -> list[dict]:
    """Short prompts queued behind a long one: their TTFT and the long one's, per knob."""
    device = device or default_device()
    model = build_model("tiny", seed=0, dtype=torch.float32, device=device)
    _warm(model)
    rows = []
    for where, wl, chunk in ((f"engine, tiny, {device}", long_then_short(3072, 6, 32, 4), 256),
                             (f"sim, {SIM_MODEL}, {SIM_GPU}", long_then_short(8000, 8, 64, 16), 512)):
        for name, knobs in PARTIAL_CONFIGS.items():
            sched = SchedulerConfig(chunk_size=chunk, **knobs)
            if where.startswith("engine"):
                outputs = LLMEngine(model, sched).run_workload(wl)
            else:
                outputs = simulate(wl, sched, model=SIM_MODEL, hardware=SIM_GPU).outputs
            short = [o.metrics.ttft for o in outputs if o.tag == "short"]
            rows.append({"where": where, "knob": name, "short_ttft_mean_ms": 1e3 * sum(short) / len(short),
                         "short_ttft_max_ms": 1e3 * max(short),
                         "long_ttft_ms": 1e3 * next(o.metrics.ttft for o in outputs if o.tag == "long")})
    return rows


def report(which: str) -> dict:
    """Run and print the chapter-8 benchmarks `which` names ("all": both)."""
    from .bench_common import _table

    results = {}
    if which in ("prefix-cache", "all"):
        rows = results["prefix_cache"] = prefix_cache_rows()
        print("\nPrefix caching: chats sharing a system prompt (TTFT in ms; prefill tokens actually computed)")
        print(_table(rows, [("where", "where", ""), ("prefix_cache", "cache", ""),
                            ("ttft_mean_ms", "TTFT mean", ".1f"), ("ttft_p90_ms", "TTFT p90", ".1f"),
                            ("prefill_tokens", "computed", "d"), ("prompt_tokens", "prompt tok", "d"),
                            ("wall_s", "wall s", ".2f")]))
    if which in ("partial-prefills", "all"):
        rows = results["partial_prefills"] = partial_prefill_rows()
        print("\nShort prompts queued behind a long one (TTFT in ms)")
        print(_table(rows, [("where", "where", ""), ("knob", "knob", ""),
                            ("short_ttft_mean_ms", "short mean", ".1f"), ("short_ttft_max_ms", "short max", ".1f"),
                            ("long_ttft_ms", "long TTFT", ".1f")]))
    return results
