"""Workloads: who arrives when, with how long a prompt and how many tokens.

A Workload is plain data, served the same way by the real engine
(LLMEngine.run_workload) and by the simulator.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from numbers import Integral


@dataclass(frozen=True)
class WorkloadRequest:
    prompt_len: int
    max_tokens: int
    arrival_time: float = 0.0                   # seconds after the start
    after: tuple[str, int] | None = None        # or: once every request tagged
                                                # after[0] has after[1] output tokens
    tag: str = ""

    def is_due(self, now: float, requests) -> bool:
        if self.after is None:
            return self.arrival_time <= now
        tag, num_tokens = self.after
        tagged = [r for r in requests if r.tag == tag]
        return bool(tagged) and all(len(r.output_token_ids) >= num_tokens or r.is_finished for r in tagged)


@dataclass(frozen=True)
class Workload:
    requests: tuple[WorkloadRequest, ...]
    seed: int = 0
    description: str = ""
    params: dict = field(default_factory=dict, compare=False)

    def prompt_ids(self, index: int, vocab_size: int | None) -> list[int] | None:
        """Seeded random prompt tokens (None when no vocabulary: simulation)."""
        if vocab_size is None:
            return None
        rng = random.Random(self.seed * 1_000_003 + index)
        return [rng.randrange(vocab_size) for _ in range(self.requests[index].prompt_len)]


def _check_count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{name}={value!r}: must be an integer >= {minimum}")
    return int(value)


def long_prompt_interference(prompt_len: int = 2048, num_decoders: int = 4,
                             decoder_prompt_len: int = 64, warmup_tokens: int = 8,
                             decoder_output_len: int | None = None,
                             long_output_len: int = 16, seed: int = 0) -> Workload:
    """num_decoders streams are decoding when one long prompt arrives.

    The long prompt arrives once every stream has produced warmup_tokens
    tokens, whatever the policy; the streams then keep decoding well past its
    first token (by default long enough to outlast a prefill chunked into
    16-token pieces), so their token gaps show any stall it causes.
    """
    prompt_len = _check_count("prompt_len", prompt_len)
    num_decoders = _check_count("num_decoders", num_decoders, minimum=0)
    decoder_prompt_len = _check_count("decoder_prompt_len", decoder_prompt_len)
    warmup_tokens = _check_count("warmup_tokens", warmup_tokens)
    long_output_len = _check_count("long_output_len", long_output_len)
    if decoder_output_len is None:
        decoder_output_len = warmup_tokens + prompt_len // 16 + 2 * long_output_len
    decoder_output_len = _check_count("decoder_output_len", decoder_output_len, minimum=warmup_tokens + 1)
    decoders = tuple(WorkloadRequest(decoder_prompt_len, decoder_output_len, tag="decoder")
                     for _ in range(num_decoders))
    after = ("decoder", warmup_tokens) if num_decoders else None
    long = WorkloadRequest(prompt_len, long_output_len, after=after, tag="long")
    return Workload(decoders + (long,), seed=seed,
                    description=f"{num_decoders} streams decoding, then one {prompt_len}-token prompt",
                    params=dict(prompt_len=prompt_len, num_decoders=num_decoders,
                                decoder_prompt_len=decoder_prompt_len, warmup_tokens=warmup_tokens,
                                decoder_output_len=decoder_output_len, long_output_len=long_output_len))


def poisson_mix(num_requests: int = 32, rate_per_s: float = 4.0, prompt_len=(32, 512),
                output_len=(16, 128), seed: int = 0) -> Workload:
    """Requests arriving as a Poisson process (exponential gaps at rate_per_s;
    rate_per_s=inf: all at t=0), prompt and output lengths uniform in ranges."""
    num_requests = _check_count("num_requests", num_requests)
    if not rate_per_s > 0:
        raise ValueError(f"rate_per_s={rate_per_s!r}: must be > 0 (float('inf') for all at once)")
    for name, (low, high) in (("prompt_len", prompt_len), ("output_len", output_len)):
        if not 1 <= low <= high:
            raise ValueError(f"{name}=({low}, {high}): need 1 <= low <= high")
    rng = random.Random(seed)
    t, requests = 0.0, []
    for _ in range(num_requests):
        requests.append(WorkloadRequest(rng.randint(*prompt_len), rng.randint(*output_len),
                                        arrival_time=t, tag="poisson"))
        if rate_per_s != float("inf"):
            t += rng.expovariate(rate_per_s)
    return Workload(tuple(requests), seed=seed,
                    description=f"{num_requests} requests, Poisson at {rate_per_s}/s",
                    params=dict(num_requests=num_requests, rate_per_s=rate_per_s,
                                prompt_len=prompt_len, output_len=output_len))
