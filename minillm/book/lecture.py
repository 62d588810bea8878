"""Live demos for a lecture: one call each, a few seconds on a laptop CPU.

    from minillm.book import lecture
    lecture.stall_demo()          # chapter 0: the stall, measured live, and its cure

(The lab of chapter 7 is already one call: `minillm.book.widgets.lab()`.)
"""
from __future__ import annotations

from ..validation import check_int

import matplotlib.pyplot as plt
import torch

from ..scheduler import SchedulerConfig
from ..device import default_device
from ..engine import LLMEngine
from ..loader import build_model
from ..request import SamplingParams
from ..sim.workloads import long_prompt_interference
from .figures import plot_token_gaps

WARMUP_TOKENS = 4          # each stream's tokens before the long prompt arrives


def _check_positive(name: str, value, maximum: int | None = None) -> int:
    return check_int(name, value, 1, maximum)


def stall_demo(prompt_len: int = 1024, num_decoders: int = 4, chunk_size: int = 256,
               decode_tokens: int = 16, device=None):
    """Serve one scenario twice on the real engine (the built-in tiny model):
    `num_decoders` streams are decoding when a `prompt_len`-token prompt arrives.

    Left: without chunking (prefill_first), every stream waits out the whole
    prefill in one gap. Right: chunks of `chunk_size` tokens ride along with the
    decodes, and the worst gap shrinks. Returns the figure; the titles carry the
    measured worst gap and the long prompt's TTFT.
    """
    prompt_len = _check_positive("prompt_len", prompt_len, maximum=4000)
    num_decoders = _check_positive("num_decoders", num_decoders, maximum=64)
    chunk_size = _check_positive("chunk_size", chunk_size)
    decode_tokens = _check_positive("decode_tokens", decode_tokens)
    device = torch.device(device) if device is not None else default_device()
    model = build_model("tiny", seed=0, dtype=torch.float32, device=device)
    workload = long_prompt_interference(prompt_len=prompt_len, num_decoders=num_decoders,
                                        warmup_tokens=WARMUP_TOKENS, long_output_len=2,
                                        decoder_output_len=WARMUP_TOKENS + decode_tokens)
    # The first forward passes pay one-off costs (kernels, allocator): not the stall's.
    LLMEngine(model, SchedulerConfig()).generate([[1] * 64], SamplingParams(max_tokens=2, ignore_eos=True))
    cases = [("no chunking", SchedulerConfig(policy="prefill_first")),
             (f"chunks of {chunk_size}", SchedulerConfig(policy="chunked", chunk_size=chunk_size))]
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), sharey=True, layout="constrained")
    plt.close(fig)             # the caller displays it once
    for ax, (label, sched) in zip(axes, cases):
        outputs = LLMEngine(model, sched).run_workload(workload)
        worst_gap_ms = max(max(o.metrics.itl) for o in outputs if o.tag == "decoder") * 1e3
        long_ttft_ms = next(o for o in outputs if o.tag == "long").metrics.ttft * 1e3
        plot_token_gaps(outputs, tag="decoder", ax=ax, legend=False,
                        title=f"{label}: worst gap {worst_gap_ms:.0f} ms, long TTFT {long_ttft_ms:.0f} ms")
    fig.suptitle(f"Measured now on {device.type}: a {prompt_len}-token prompt arrives while "
                 f"{num_decoders} streams decode")
    return fig
