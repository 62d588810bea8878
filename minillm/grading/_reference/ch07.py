"""Chapter 7's reference answers (teacher only): the solutions of exercises/07_the_lab, used by
the hidden cases (minillm.grading._hidden.ch07) and the tests. The public checkers never import
this module: their expected values come from the accounting module, the lab and the simulator."""
from __future__ import annotations

import math

from ...sim.simulator import predict_step


def decode_floor_s(cfg, hw, dtype_bytes=2):
    """Every layer's matmul weights and the LM head (the embedding is gathered, one row a token)."""
    layers = cfg.num_layers * cfg.matmul_weights_per_layer
    lm_head = cfg.vocab_size * cfg.hidden_size
    return (layers + lm_head) * dtype_bytes / hw.mem_bandwidth_bytes_s


def choose_chunk_size(rows, itl_slo_ms):
    meeting = [r for r in rows if r["itl_max_s"] * 1e3 <= itl_slo_ms]
    if not meeting:
        return None
    size = lambda r: math.inf if r["chunk_size"] == "off" else r["chunk_size"]
    return min(meeting, key=lambda r: (r["long_ttft_s"], size(r)))["chunk_size"]


def goodput(outputs, ttft_slo_s, tpot_slo_s):
    done = [o for o in outputs if o.finished]
    start = min(o.metrics.arrival_time for o in done)
    end = max(o.metrics.finish_time for o in done)
    good = [o for o in done if o.metrics.ttft <= ttft_slo_s
            and (o.metrics.tpot is None or o.metrics.tpot <= tpot_slo_s)]
    return len(good) / max(end - start, 1e-12)


def prefill_steps(prompt_len, chunk_size, num_decoders, decoder_context):
    """The steps of a chunked prefill with streams decoding: the chunk (only the last samples),
    then one decode per stream, each stream's context one token longer every step."""
    steps, done, k = [], 0, 0
    while done < prompt_len:
        n = min(chunk_size, prompt_len - done)
        steps.append([(n, done, done + n == prompt_len)] + [(1, decoder_context + k, True)] * num_decoders)
        done, k = done + n, k + 1
    return steps


def expected_ttft(model, hardware, prompt_len, chunk_size, num_decoders, decoder_context):
    return sum(predict_step(model, step, hardware).total
               for step in prefill_steps(prompt_len, chunk_size, num_decoders, decoder_context))


def chunk_for_gap_slo(model, hardware, prompt_len, num_decoders, decoder_context, gap_slo_s, candidates):
    for chunk in sorted(candidates, reverse=True):
        worst_s = max(predict_step(model, step, hardware).total
                      for step in prefill_steps(prompt_len, chunk, num_decoders, decoder_context))
        if worst_s <= gap_slo_s:
            return chunk, worst_s
    return None, None
