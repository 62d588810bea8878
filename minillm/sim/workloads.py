"""Workloads: who arrives when, with how long a prompt and how many tokens.

A Workload is plain data, served the same way by the real engine
(LLMEngine.run_workload) and by the simulator.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from ..validation import check_instance, check_int, check_real


@dataclass(frozen=True)
class WorkloadRequest:
    prompt_len: int
    max_tokens: int
    arrival_time: float = 0.0                   # seconds after the start
    after: tuple[str, int] | None = None        # or: once every request tagged
                                                # after[0] has after[1] output tokens
    tag: str = ""

    def __post_init__(self):
        # Checked here, not when served: a zero-length prompt or a NaN arrival
        # used to make run_workload spin forever.
        object.__setattr__(self, "prompt_len", check_int("prompt_len", self.prompt_len, 1, hint="64"))
        object.__setattr__(self, "max_tokens", check_int("max_tokens", self.max_tokens, 1, hint="16"))
        object.__setattr__(self, "arrival_time", check_real("arrival_time", self.arrival_time, 0,
                                                            hint="0.0, seconds after the start"))
        check_instance("tag", self.tag, str, "a string")
        if self.after is not None:
            if not isinstance(self.after, (tuple, list)) or len(self.after) != 2 \
                    or not isinstance(self.after[0], str):
                raise ValueError(f"after={self.after!r}: must be None or (tag, num_output_tokens) "
                                 "(try ('decoder', 8))")
            object.__setattr__(self, "after", (self.after[0], check_int("after[1]", self.after[1], 0)))

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

    def __post_init__(self):
        requests = tuple(self.requests)
        for i, spec in enumerate(requests):
            check_instance(f"requests[{i}]", spec, WorkloadRequest, "a WorkloadRequest")
            # `after` must name a tag of an EARLIER request: an unknown tag or a
            # cycle would wait forever, and the request would produce no output.
            if spec.after is not None and not any(r.tag == spec.after[0] for r in requests[:i]):
                known = sorted({r.tag for r in requests[:i]})
                raise ValueError(f"requests[{i}].after={spec.after!r}: no earlier request is tagged "
                                 f"{spec.after[0]!r} (earlier tags: {known})")
        object.__setattr__(self, "requests", requests)
        object.__setattr__(self, "seed", check_int("seed", self.seed))

    def prompt_ids(self, index: int, vocab_size: int | None) -> list[int] | None:
        """Seeded random prompt tokens (None when no vocabulary: simulation)."""
        if vocab_size is None:
            return None
        rng = random.Random(self.seed * 1_000_003 + index)
        return [rng.randrange(vocab_size) for _ in range(self.requests[index].prompt_len)]


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
    prompt_len = check_int("prompt_len", prompt_len, 1)
    num_decoders = check_int("num_decoders", num_decoders, minimum=0)
    decoder_prompt_len = check_int("decoder_prompt_len", decoder_prompt_len, 1)
    warmup_tokens = check_int("warmup_tokens", warmup_tokens, 1)
    long_output_len = check_int("long_output_len", long_output_len, 1)
    if decoder_output_len is None:
        decoder_output_len = warmup_tokens + prompt_len // 16 + 2 * long_output_len
    decoder_output_len = check_int("decoder_output_len", decoder_output_len, minimum=warmup_tokens + 1)
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
    num_requests = check_int("num_requests", num_requests, 1)
    rate_per_s = check_real("rate_per_s", rate_per_s, 0, exclusive_minimum=True, allow_inf=True,
                            hint="4.0, or float('inf') for all at once")
    for name, bounds in (("prompt_len", prompt_len), ("output_len", output_len)):
        if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
            raise ValueError(f"{name}={bounds!r}: must be a (low, high) pair (try (32, 512))")
        low, high = (check_int(f"{name}[{j}]", v, 1) for j, v in enumerate(bounds))
        if low > high:
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
