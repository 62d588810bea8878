"""Does a long-running engine's memory stay flat? (`python -m minillm bench memory`)

Serves many short requests through one LLMEngine, a few at a time as a
server would, and measures the Python heap (tracemalloc) after a warm-up:
the bytes it grew per request served. A bounded engine (finished requests
leave `engine.requests`, the trace keeps its last max_trace_steps steps)
should grow by nothing; the goal is under 100 bytes per request. The same
run with nothing bounded shows what a request used to leave behind.
"""
from __future__ import annotations

import gc
import tracemalloc

import torch

from ..config import ModelConfig
from ..engine import LLMEngine
from ..loader import build_model
from ..request import SamplingParams
from ..scheduler import SchedulerConfig

# A very small model: the benchmark is about bookkeeping, not arithmetic.
MICRO = ModelConfig(name="micro", vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=1,
                    num_heads=2, num_kv_heads=1, max_position=64)


def serve_and_measure(engine: LLMEngine, num_requests: int, warmup_requests: int,
                      in_flight: int = 32, prompt_len: int = 4, max_tokens: int = 2) -> dict:
    """Serve num_requests requests, keeping in_flight queued; heap bytes per
    request between the end of the warm-up and the end of the run."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    prompt = list(range(1, prompt_len + 1))
    added = finished = 0
    heap_at_warmup = None
    tracemalloc.start()
    try:
        while finished < num_requests:
            while added < num_requests and added - finished < in_flight:
                engine.add_request(prompt, params)
                added += 1
            finished += sum(out.finished for out in engine.step())
            if heap_at_warmup is None and finished >= warmup_requests:
                gc.collect()
                heap_at_warmup, measured_from = tracemalloc.get_traced_memory()[0], finished
        gc.collect()
        heap_at_end = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return {"num_requests": num_requests, "warmup_requests": measured_from,
            "heap_growth_bytes": heap_at_end - heap_at_warmup,
            "bytes_per_request": (heap_at_end - heap_at_warmup) / (num_requests - measured_from),
            "requests_held": len(engine.requests), "trace_steps_held": len(engine.trace)}


def bench_memory(num_requests: int = 20_000, warmup_requests: int = 5_000, seed: int = 0) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)          # micro GEMMs only lose from threads; the loop is what we time
    try:
        return _bench_memory(num_requests, warmup_requests, seed)
    finally:
        torch.set_num_threads(threads)


def _bench_memory(num_requests: int, warmup_requests: int, seed: int) -> dict:
    model = build_model(MICRO, seed=seed, dtype=torch.float32, device="cpu")
    sched = SchedulerConfig(max_num_seqs=32)
    # Windows small against the warm-up, so that both are full when measuring starts.
    bounded = LLMEngine(model, sched, block_size=4, num_blocks=128, max_trace_steps=100,
                        max_finished_requests=256)
    unbounded = LLMEngine(model, sched, block_size=4, num_blocks=128, max_trace_steps=None,
                          max_finished_requests=num_requests)
    return {"bounded": serve_and_measure(bounded, num_requests, warmup_requests),
            "unbounded": serve_and_measure(unbounded, num_requests, warmup_requests),
            "goal_bytes_per_request": 100}


def report(result: dict) -> str:
    lines = []
    for name, r in (("bounded (trace of 100 steps, 256 finished requests kept)", result["bounded"]),
                    ("unbounded (every request and step kept)", result["unbounded"])):
        lines.append(f"{name}: {r['bytes_per_request']:.1f} B/request over requests "
                     f"{r['warmup_requests']}..{r['num_requests']} "
                     f"(holds {r['requests_held']} requests, {r['trace_steps_held']} trace steps)")
    ok = result["bounded"]["bytes_per_request"] < result["goal_bytes_per_request"]
    lines.append(f"goal < {result['goal_bytes_per_request']} B/request: {'met' if ok else 'NOT met'}")
    return "\n".join(lines)
