"""Chapter 7's expected values: the simulator's own run, and the lab's rule for a chunk size.

The rule is written out here rather than imported from minillm.book.figures, so
the checker does not depend on the book's internals (and the exercise notebook
never imports the module that holds the answer).
"""
from __future__ import annotations

from ...scheduler import SchedulerConfig
from ...sim.simulator import simulate
from ...sim.workloads import long_prompt_interference

OFF = "off"                  # a sweep row without chunking (the prefill_first policy)


def pick_chunk_size(rows, itl_slo_ms: float):
    """Among rows whose worst gap itl_max_s meets the SLO, the chunk_size with the lowest
    long_ttft_s (ties: the smaller chunk, "off" counting as the largest); None if none."""
    meeting = [r for r in rows if r["itl_max_s"] * 1e3 <= itl_slo_ms]
    if not meeting:
        return None
    order = lambda r: (r["long_ttft_s"], float("inf") if r["chunk_size"] == OFF else r["chunk_size"])
    return min(meeting, key=order)["chunk_size"]


WARMUP_TOKENS = 4


def engine_long_ttft(model, hardware, prompt_len, chunk_size, num_decoders, decoder_context):
    """The long prompt's TTFT when the simulator serves it: num_decoders streams, each with
    decoder_context tokens in its KV cache when the prompt's first chunk runs (their prompts
    must fit in one step together: num_decoders * (decoder_context - 3) <= chunk_size)."""
    workload = long_prompt_interference(
        prompt_len=prompt_len, num_decoders=num_decoders, warmup_tokens=WARMUP_TOKENS,
        decoder_prompt_len=decoder_context - WARMUP_TOKENS + 1, long_output_len=1)
    res = simulate(workload, SchedulerConfig(policy="chunked", chunk_size=chunk_size),
                   model=model, hardware=hardware)
    return next(o for o in res.outputs if o.tag == "long").metrics.ttft


def ttft_steps(prompt_len, chunk_size, num_decoders, decoder_context):
    """The steps the long prompt's prefill takes: its chunk, then one decode per stream."""
    steps, done, k = [], 0, 0
    while done < prompt_len:
        n = min(chunk_size, prompt_len - done)
        steps.append([(n, done, done + n == prompt_len)] + [(1, decoder_context + k, True)] * num_decoders)
        done, k = done + n, k + 1
    return steps


def engine_worst_gap(model, hardware, prompt_len, chunk_size, num_decoders, decoder_context):
    """The worst gap (max ITL) the decoding streams see while the simulator serves the long
    prompt in chunks of chunk_size: the same workload as engine_long_ttft."""
    workload = long_prompt_interference(
        prompt_len=prompt_len, num_decoders=num_decoders, warmup_tokens=WARMUP_TOKENS,
        decoder_prompt_len=decoder_context - WARMUP_TOKENS + 1, long_output_len=1)
    res = simulate(workload, SchedulerConfig(policy="chunked", chunk_size=chunk_size),
                   model=model, hardware=hardware)
    return res.summary()["decoder_itl_max_s"]


def chunk_for_gap_slo(model, hardware, prompt_len, num_decoders, decoder_context, gap_slo_s, candidates):
    """(the largest candidate whose measured worst gap meets gap_slo_s, that gap), or (None, None)."""
    for chunk in sorted(candidates, reverse=True):
        gap = engine_worst_gap(model, hardware, prompt_len, chunk, num_decoders, decoder_context)
        if gap <= gap_slo_s:
            return chunk, gap
    return None, None
